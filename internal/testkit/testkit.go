// Package testkit holds what the module's tests share across packages that cannot
// import one another: a clock that moves only when told to (pglocktest.ManualClock
// for users, and the renewer's own tests, which pglocktest's import of pglock keeps
// from importing it), a log buffer safe for concurrent use, and the build flags of the
// programs tests build (RaceFlags).
package testkit

import (
	"bytes"
	"context"
	"sync"
	"time"
)

// Clock moves only when told to. Advance calls the callbacks due on the way in time
// order, synchronously, without its lock held: a callback (a store call inside a
// renewal round) may move the clock, and another goroutine may Advance while a
// callback blocks. It is safe for concurrent use.
type Clock struct {
	mu     sync.Mutex
	now    time.Time
	seq    uint64
	timers []*timer
}

type timer struct {
	at  time.Time
	seq uint64
	f   func()
}

func (t *timer) before(u *timer) bool {
	return t.at.Before(u.at) || (t.at.Equal(u.at) && t.seq < u.seq)
}

// NewClock returns a Clock that reads start until it is moved.
func NewClock(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc arranges for f to be called by the Advance that moves the clock to d from
// now or past it. The returned stop prevents the call if Advance has not started it,
// and reports whether it did.
func (c *Clock) AfterFunc(d time.Duration, f func()) (stop func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	t := &timer{at: c.now.Add(max(d, 0)), seq: c.seq, f: f}
	c.timers = append(c.timers, t)
	return func() bool {
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
}

// Move moves the clock by d without calling anything, as time passing inside a call.
func (c *Clock) Move(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Advance moves the clock forward by d, calling what falls due on the way.
func (c *Clock) Advance(d time.Duration) { c.AdvanceTo(c.Now().Add(max(d, 0))) }

// AdvanceTo moves the clock to target (never back), calling every AfterFunc that falls
// due on the way, in time order, with the clock set to each one's time, and waiting
// for each to return.
func (c *Clock) AdvanceTo(target time.Time) {
	for {
		c.mu.Lock()
		next := -1
		for i, t := range c.timers {
			if !t.at.After(target) && (next < 0 || t.before(c.timers[next])) {
				next = i
			}
		}
		if next < 0 {
			if target.After(c.now) {
				c.now = target
			}
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

// LogBuffer is a log's output that tests read back, safe for concurrent use.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p to the buffer.
func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// StallPeriod is how often a stall watch's timer is due; StallMin is how late it must
// run to count as a stall.
const (
	StallPeriod = 10 * time.Millisecond
	StallMin    = 30 * time.Millisecond
)

// WatchStalls arms a timer every StallPeriod and calls stalled with its due time and
// the time it ran whenever it ran StallMin late or more, until ctx ends: the time the
// process (or its Go scheduler) did not run, which every timer of it suffered too. A
// SIGSTOP shows as one long stall; a loaded machine (go test -race on 2 cores) stalls a
// process for hundreds of milliseconds now and then.
func WatchStalls(ctx context.Context, stalled func(due, ran time.Time)) {
	t := time.NewTimer(StallPeriod)
	defer t.Stop()
	due := time.Now().Add(StallPeriod)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ran := time.Now()
		if ran.Sub(due) >= StallMin {
			stalled(due, ran)
		}
		due = ran.Add(StallPeriod)
		t.Reset(StallPeriod)
	}
}
