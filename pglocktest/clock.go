package pglocktest

import (
	"sync"
	"time"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/testkit"
)

// ManualClock is a pglock.Clock that moves only when told to. A Client on it renews,
// waits and counts deadlines only when the test calls Advance; a Client whose clock
// never moves behaves like a paused process: it never renews, and the store expires
// its locks after their ttl on its own clock.
//
// It is safe for concurrent use.
type ManualClock struct {
	advancing sync.Mutex // one Advance at a time, so that calls fire in time order
	clock     *testkit.Clock
}

// NewManualClock returns a ManualClock that reads start until it is advanced.
func NewManualClock(start time.Time) *ManualClock {
	return &ManualClock{clock: testkit.NewClock(start)}
}

// Now returns the clock's time.
func (c *ManualClock) Now() time.Time { return c.clock.Now() }

// AfterFunc arranges for f to be called by the Advance that moves the clock to d from
// now or past it. f runs on Advance's goroutine, and Advance waits for it.
func (c *ManualClock) AfterFunc(d time.Duration, f func()) pglock.Timer {
	return stopper(c.clock.AfterFunc(d, f))
}

// Advance moves the clock forward by d, calling every AfterFunc that falls due on the
// way, in time order, with the clock set to each one's time, and waits for each to
// return. A Client's renewal rounds run inside those calls, so every renewal due on
// the way has reached the store when Advance returns. Advance(0) runs what is due now.
func (c *ManualClock) Advance(d time.Duration) {
	c.advancing.Lock()
	defer c.advancing.Unlock()
	c.clock.Advance(d)
}

// stopper is a pglock.Timer: Stop prevents the call if Advance has not started it, and
// reports whether it did.
type stopper func() bool

func (s stopper) Stop() bool { return s() }
