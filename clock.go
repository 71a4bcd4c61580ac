package pglock

import (
	"context"
	"time"
)

// Clock is the time a Client renews, waits and counts deadlines on; its renewal calls are
// bounded on it too. Expiry itself is measured by the store. WithClock's nil means the
// real clock; tests use pglocktest.ManualClock. Implementations must be safe for
// concurrent use.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// AfterFunc calls f once, in its own goroutine or synchronously from whatever
	// moves the clock, after d has passed. Stop on the result prevents the call if it
	// has not started.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc call. *time.Timer implements it.
type Timer interface {
	// Stop prevents the call and reports whether it did; false means it already ran
	// or was stopped.
	Stop() bool
}

// realClock is the wall clock, what a nil Clock means.
type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// sleep waits d on the client's clock, or until ctx ends (returning its cause).
func (c *Client) sleep(ctx context.Context, d time.Duration) error {
	return c.sleepOrWake(ctx, d, nil)
}

// sleepOrWake is sleep that also returns, with nil, when wake fires (nil never does).
func (c *Client) sleepOrWake(ctx context.Context, d time.Duration, wake <-chan struct{}) error {
	done := make(chan struct{})
	t := c.clock.AfterFunc(d, func() { close(done) })
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-wake:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
