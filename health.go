package pglock

import (
	"fmt"
	"sync"
	"time"

	"github.com/pgfence/pglock/internal/renewer"
	"github.com/pgfence/pglock/internal/store"
)

// Health is a client's readiness: whether it can reach its store right now, as every
// store call it makes shows it, and whether its renewals keep up. See Client.Health, and
// the package doc, # Health, for probes.
type Health struct {
	// Ready is false while the last store call failed, while a call has waited for an
	// answer for half the ttl, while a held lock's renewal is overdue, and after Close,
	// so a holder turns unready before it loses a lock. It is true again once a store
	// call succeeds and no renewal is overdue.
	Ready bool
	// LocksHeld is how many locks the client holds now: its callers', its jobs' and its
	// elections' leases, and its semaphores' permits.
	LocksHeld int
	// PermitsHeld is how many of LocksHeld are permits of semaphores.
	PermitsHeld int
	// ElectionsLed is how many of the client's elections it leads now.
	ElectionsLed int
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

// Health reports the client's readiness from what it knows, without a store call, cheaply
// enough for every probe. A client that has made no store call yet is Ready unless
// closed. It is safe for concurrent use.
func (c *Client) Health() Health {
	c.mu.Lock()
	h := Health{LocksHeld: len(c.held)}
	for l := range c.held {
		if l.permit > 0 {
			h.PermitsHeld++
		}
	}
	closed := c.closed
	c.mu.Unlock()
	h.EventsDropped = c.events.droppedCount()

	c.health.mu.Lock()
	h.ElectionsLed, h.LastRenewal = c.health.led, c.health.lastRenewal
	c.health.mu.Unlock()
	s := c.health.calls.State()
	h.LastAnswer, h.FailedCall, h.FailedAt = s.Answered, s.Call, s.At

	switch {
	case closed:
		h.Err = ErrClosed
	case s.Err != nil:
		h.Err = s.Err
	default:
		if n := c.renewer.Overdue(); n > 0 {
			h.Err = fmt.Errorf("pglock: renewal overdue for %d of %d locks held: none confirmed for half the ttl", n, h.LocksHeld)
		}
	}
	h.Ready = h.Err == nil
	return h
}

// health is what the renewer, the events and the store calls tell Health.
type health struct {
	calls *store.Calls // every store call's outcome; set by watchStore

	mu          sync.Mutex
	lastRenewal time.Time
	led         int // elections led now
}

// watchStore makes every call of the client to s go through an observed store that
// feeds Health (store.Observe), and returns it for the client's parts to use.
func (c *Client) watchStore(s store.Store) store.Store {
	w, k := store.Observe(s, store.Config{
		Now:       c.clock.Now,
		AfterFunc: func(d time.Duration, f func()) func() bool { return c.clock.AfterFunc(d, f).Stop },
		Patience:  c.ttl / 2,
		Instance:  c.instance,
		Back:      c.connectionsBack,
	})
	c.store, c.health.calls = w, k
	c.onClose(k.Close)
	return w
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
		h.led++
		h.mu.Unlock()
	case EventLeadershipLost:
		h.mu.Lock()
		h.led--
		h.mu.Unlock()
	}
}
