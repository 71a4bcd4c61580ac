package pglock

import (
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
