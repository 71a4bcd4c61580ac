package pglock

import (
	"fmt"
	"sync"
	"time"

	"github.com/pgfence/pglock/internal/renewer"
)

// Health is a client's readiness: whether it can reach its store right now, as every
// store call it makes shows it (acquisitions, waits, renewals, releases, campaigns, job
// ticks, history writes), and whether its renewals keep up. See Client.Health.
//
// In Kubernetes, a readiness probe should answer from Ready (503 when false): "do not
// send me work that needs a lock now". A liveness probe should not use Health at all:
// a database outage is not cured by restarting every instance (each restart opens new
// connections against a server that is trying to come back, and a lock held by the
// restarted process is left to expire); let liveness check only that the process
// itself still serves. Show the probe's caller no more than Ready (and, say, FailedCall
// and FailedAt): Err wraps the driver's error, which may name the database's user, host
// and database; log it instead.
type Health struct {
	// Ready is false while the last store call of the client failed (none has succeeded
	// since), while a call has waited for an answer for half the client's ttl (or half
	// its lock's ttl, when shorter) and the store answered no other call meanwhile, while
	// a held lock's renewal is overdue (none confirmed for half its ttl, when one is due
	// every third), and after Close. A lock is given up only at nine tenths of its ttl
	// without a confirmed renewal, so a holder is unready before any lock is lost. It is
	// true again once a store call succeeds and no renewal is overdue.
	//
	// An answer is a success, whatever it says: a key held by another owner, a renewal
	// refused. A failure is an error from the driver or the server; bad input, and a
	// call whose context the caller ended (before it waited as above), are neither.
	// While the last call failed, the client makes a call of its own once a second (a
	// renewal of a key nobody holds, which writes nothing), so that it turns ready
	// again when the store answers even if nothing else calls it.
	Ready bool
	// Held is how many locks the client holds now: its callers', its jobs' and its
	// elections' leases, and its semaphores' permits.
	Held int
	// Permits is how many of Held are permits of semaphores.
	Permits int
	// Leading is how many of the client's elections it leads now.
	Leading int
	// LastRenewal is when the store last answered a renewal call, on the client's clock;
	// zero if none yet.
	LastRenewal time.Time
	// LastAnswer is when the store last answered any call of the client (a success), on
	// the client's clock; zero if none yet.
	LastAnswer time.Time
	// FailedCall names the store call that makes the client unready ("acquire", "want",
	// "renew", "release", "holder", "prune", "list locks", "record run", …): the last
	// call, which failed, or a call still waiting for its answer. Empty when none does.
	FailedCall string
	// FailedAt is when FailedCall failed, or when it was sent if it still waits, on the
	// client's clock; zero when FailedCall is empty.
	FailedAt time.Time
	// EventsDropped is how many events the client dropped since New because its event
	// handlers fell behind (see WithEventHandler). It does not affect Ready.
	EventsDropped int64
	// Err says why the client is not Ready: ErrClosed, or an error saying which store
	// call failed (wrapping the store's error) or waits, or that renewals are overdue.
	// Nil when Ready.
	Err error
}

// Health reports the client's readiness from what the client knows: it makes no store
// call, and is cheap enough for every probe (its cost does not grow with the locks
// held). A client that has made no store call yet is Ready unless closed. It is safe for
// concurrent use.
func (c *Client) Health() Health {
	c.mu.Lock()
	h := Health{Held: len(c.held)}
	for l := range c.held {
		if l.permit > 0 {
			h.Permits++
		}
	}
	closed := c.closed
	c.mu.Unlock()
	h.EventsDropped = c.events.droppedCount()

	c.health.mu.Lock()
	h.Leading, h.LastRenewal = c.health.leading, c.health.lastRenewal
	c.health.mu.Unlock()
	s := c.health.calls.state()
	h.LastAnswer, h.FailedCall, h.FailedAt = s.answered, s.call, s.at

	switch {
	case closed:
		h.Err = ErrClosed
	case s.err != nil:
		h.Err = s.err
	default:
		if n := c.renewer.Overdue(); n > 0 {
			h.Err = fmt.Errorf("pglock: renewal overdue for %d of %d locks held: none confirmed for half the ttl", n, h.Held)
		}
	}
	h.Ready = h.Err == nil
	return h
}

// health is what the renewer, the events and the store calls tell Health.
type health struct {
	calls *calls // every store call's outcome; set by watchStore

	mu          sync.Mutex
	lastRenewal time.Time
	leading     int
}

// observeRenewal is the renewer's report of one renewal call: it feeds Health and
// emits EventRenewal.
func (c *Client) observeRenewal(call renewer.Call) {
	end := call.Sent.Add(call.Duration)
	if call.Err == nil {
		c.health.mu.Lock()
		if end.After(c.health.lastRenewal) {
			c.health.lastRenewal = end
		}
		c.health.mu.Unlock()
	}
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
