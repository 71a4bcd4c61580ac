package pglock

import (
	"fmt"
	"sync"
	"time"

	"github.com/pgfence/pglock/internal/renewer"
)

// Health is a client's readiness, as its renewals show it: a Kubernetes-style readiness
// signal ("do not send me work that needs a lock now"), not a liveness one. See
// Client.Health.
type Health struct {
	// Ready is false once a renewal call fails while the client holds locks, or a held
	// lock's renewal is overdue (none confirmed for half its ttl, when one is due every
	// third), and after Close. Both come before any lock is lost: a lock is given up only
	// at nine tenths of its ttl without a confirmed renewal. It is true again once a
	// renewal call succeeds and none is overdue.
	Ready bool
	// Held is how many locks the client holds now: its callers', its jobs' and its
	// elections' leases.
	Held int
	// Leading is how many of the client's elections it leads now.
	Leading int
	// LastRenewal is when the store last answered a renewal call, on the client's clock;
	// zero if none yet.
	LastRenewal time.Time
	// Err says why the client is not Ready: ErrClosed, or an error saying that renewals
	// fail (wrapping the store's error) or are overdue. Nil when Ready.
	Err error
}

// Health reports the client's readiness as its renewals show it, from what the client
// knows: it makes no store call, and is cheap enough for every probe. A client that
// holds no lock is Ready unless closed. It is safe for concurrent use.
func (c *Client) Health() Health {
	c.mu.Lock()
	h := Health{Held: len(c.held)}
	closed := c.closed
	c.mu.Unlock()

	c.health.mu.Lock()
	h.Leading, h.LastRenewal = c.health.leading, c.health.lastRenewal
	failed := c.health.failed
	c.health.mu.Unlock()

	switch {
	case closed:
		h.Err = ErrClosed
	case failed != nil && h.Held > 0:
		h.Err = fmt.Errorf("pglock: renewal failed: %w", failed)
	default:
		if n := c.renewer.Overdue(); n > 0 {
			h.Err = fmt.Errorf("pglock: renewal overdue for %d of %d locks held: none confirmed for half the ttl", n, h.Held)
		}
	}
	h.Ready = h.Err == nil
	return h
}

// health is what the renewer and the events tell Health.
type health struct {
	mu          sync.Mutex
	lastRenewal time.Time
	failed      error // the last renewal call's error; nil once one succeeds
	leading     int
}

// observeRenewal is the renewer's report of one renewal call: it feeds Health and
// emits EventRenewal.
func (c *Client) observeRenewal(call renewer.Call) {
	end := call.Sent.Add(call.Duration)
	c.health.mu.Lock()
	c.health.failed = call.Err
	if call.Err == nil && end.After(c.health.lastRenewal) {
		c.health.lastRenewal = end
	}
	c.health.mu.Unlock()
	c.events.emit(Event{Type: EventRenewal, Duration: call.Duration, Err: call.Err, Time: end})
}

// count keeps the number of elections led from their events.
func (h *health) count(t EventType) {
	switch t {
	case EventLeadershipAcquired:
		h.mu.Lock()
		h.leading++
		h.mu.Unlock()
	case EventLeadershipLost:
		h.mu.Lock()
		h.leading--
		h.mu.Unlock()
	}
}
