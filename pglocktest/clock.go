package pglocktest

import (
	"sync"
	"time"

	"github.com/pgfence/pglock"
)

// ManualClock is a pglock.Clock that moves only when told to. A Client on it renews,
// waits and counts deadlines only when the test calls Advance; a Client whose clock
// never moves behaves like a paused process: it never renews, and the store expires
// its locks after their ttl on its own clock.
//
// It is safe for concurrent use.
type ManualClock struct {
	advancing sync.Mutex // one Advance at a time, so that calls fire in time order

	mu     sync.Mutex
	now    time.Time
	seq    uint64
	timers []*manualTimer
}

// NewManualClock returns a ManualClock that reads start until it is advanced.
func NewManualClock(start time.Time) *ManualClock {
	return &ManualClock{now: start}
}

// Now returns the clock's time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc arranges for f to be called by the Advance that moves the clock to d from
// now or past it. f runs on Advance's goroutine, and Advance waits for it.
func (c *ManualClock) AfterFunc(d time.Duration, f func()) pglock.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	t := &manualTimer{clock: c, at: c.now.Add(max(d, 0)), seq: c.seq, f: f}
	c.timers = append(c.timers, t)
	return t
}

// Advance moves the clock forward by d, calling every AfterFunc that falls due on the
// way, in time order, with the clock set to each one's time, and waits for each to
// return. A Client's renewal rounds run inside those calls, so every renewal due on
// the way has reached the store when Advance returns. Advance(0) runs what is due now.
func (c *ManualClock) Advance(d time.Duration) {
	c.advancing.Lock()
	defer c.advancing.Unlock()
	c.mu.Lock()
	target := c.now.Add(max(d, 0))
	c.mu.Unlock()
	for {
		c.mu.Lock()
		next := -1
		for i, t := range c.timers {
			if !t.at.After(target) && (next < 0 || t.before(c.timers[next])) {
				next = i
			}
		}
		if next < 0 {
			c.now = target
			c.mu.Unlock()
			return
		}
		t := c.timers[next]
		c.timers = append(c.timers[:next], c.timers[next+1:]...)
		if t.at.After(c.now) {
			c.now = t.at
		}
		c.mu.Unlock()
		t.f()
	}
}

type manualTimer struct {
	clock *ManualClock
	at    time.Time
	seq   uint64
	f     func()
}

func (t *manualTimer) before(u *manualTimer) bool {
	return t.at.Before(u.at) || (t.at.Equal(u.at) && t.seq < u.seq)
}

// Stop prevents the call if Advance has not started it, and reports whether it did.
func (t *manualTimer) Stop() bool {
	c := t.clock
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, u := range c.timers {
		if u == t {
			c.timers = append(c.timers[:i], c.timers[i+1:]...)
			return true
		}
	}
	return false
}
