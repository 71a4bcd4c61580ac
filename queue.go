package pglock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/pgfence/pglock/internal/store"
)

// The fair queue (Fair): waiters served in the order they arrived, across every client
// of the database. The order and the handovers are kept by the database
// (migrations/000014_queue.up.sql): a fair waiter that finds its key held is queued
// with a ticket, a release hands the key to the live waiter with the smallest ticket in
// the same call (a grant, for store.QueueBound), and that waiter claims it with its next
// poll. A waiter is live while its client polls for it: at least every queueHeartbeat, and at
// once when the listener hears that its key was granted to it (store.Listen).

// queueHeartbeat is how often a fair waiter polls when nothing wakes it: Q/4, so that
// three lost or late polls in a row do not yet make it look dead.
const queueHeartbeat = store.QueueBound / 4

// Fair makes Acquire and WithLock (Semaphore.Acquire and WithPermit) wait in the key's
// (the semaphore's) queue, shared by every client of the database: the waiter that
// arrived first, on any instance, is served first. While a fair waiter is queued,
// TryAcquire and Acquire without Fair fail even on a free key. With a PostgreSQL store in
// a transaction of the caller's, Acquire returns an error wrapping errors.ErrUnsupported.
// See the package doc, # Fair queue.
func Fair() AcquireOption {
	return acquireOpt{name: "Fair", apply: func(s *settings) error {
		s.fair = true
		return nil
	}}
}

// acquireFair is Acquire (Semaphore.Acquire for a permit) with Fair, called at start,
// once its options are applied.
func (c *Client) acquireFair(ctx context.Context, t target, lc settings, start time.Time) (*Lock, error) {
	key := t.key
	if store.InCallerTx(store.Unobserved(c.store)) {
		return nil, fmt.Errorf("pglock: Acquire with Fair: the store runs in a transaction of the caller's, "+
			"which would keep the key's row locked while it waits (the release it waits for would wait for it) "+
			"and make the caller's commit asynchronous: use a store on a pool or a connection: %w", errors.ErrUnsupported)
	}
	var deadline time.Time
	if lc.waitSet {
		deadline = start.Add(lc.wait)
	}
	q := &fairWaiter{c: c, b: c.store, t: t, owner: c.newOwner(), ttl: lc.ttl}
	wake := c.listener.fairWait(q.owner)
	defer c.listener.fairDone(q.owner)
	var failingSince time.Time // of the failed polls in a row, on the real clock
	defer q.unline()
	for {
		if c.isClosed() {
			q.leave()
			return nil, ErrClosed
		}
		if ctx.Err() != nil {
			q.leave()
			return nil, fmt.Errorf("%w: key %q: %w", ErrNotAcquired, key, context.Cause(ctx))
		}
		// The lease of a key taken or claimed counts from when the call had its
		// connection, not from before a wait for a busy pool (see sendMark).
		mark := &store.SendMark{Wait: ctx, Now: c.clock.Now, Sent: c.clock.Now()}
		permit, token, err := q.step(store.WithSendMark(ctx, mark))
		q.reline()
		switch {
		case err == nil && token > 0:
			return c.newLock(t, permit, q.owner, lc.ttl, token, start, mark.Sent)
		case err == nil:
			failingSince = time.Time{}
			if q.ticket == 0 {
				continue // no longer queued (lost in a crash, or a minute without a poll): queue again
			}
		case ctx.Err() != nil:
			q.leave()
			return nil, fmt.Errorf("%w: key %q: %w", ErrNotAcquired, key, context.Cause(ctx))
		case q.ticket == 0 || !outage(err) || !failingSince.IsZero() && time.Since(failingSince) >= lc.ttl:
			// Not queued, or not an outage that a queued waiter rides out, as Acquire's
			// parked waiters do.
			q.leave()
			return nil, err
		case failingSince.IsZero():
			failingSince = time.Now()
		}
		c.listener.fairQueued()
		// Between 3/4 and all of Q/4, so that waiters that queued together (a crowd's
		// start) do not poll together ever after, each burst of polls holding up the
		// claims behind it. While the listener's first connection is under way (a
		// second or more on a loaded machine) no grant can wake the waiter: the first
		// of the client's waiters in the queue polls as a plain waiter's head does then
		// (startingPoll), and so do the few waiters that their queueing or last poll
		// found next in line, the nearer the faster (nearPoll). The head of a lock's
		// queue, which the next grant goes to, is the first of its client's waiters,
		// whatever the clients: one waiter per client polls, as in a plain crowd, and a
		// grant is claimed within startingPollEvery; and the waiter that a grant goes to
		// mostly polls every few milliseconds by then, having been next but one. With
		// the head alone polling fast, the next head would find out at its next
		// heartbeat, up to Q/4 later (BENCHMARKS.md: the fair crowd's start).
		pause := queueHeartbeat - rand.N(queueHeartbeat/4)
		var every time.Duration // the longest pause while the listener starts; 0: the heartbeat's
		if c.listener.isStarting() {
			if every = nearPoll(q.ahead); every == 0 && c.listener.fairFirst(q.line(), q.ticket) {
				every = startingPollEvery
			}
		}
		if lc.waitSet {
			left := deadline.Sub(c.clock.Now())
			if left <= 0 {
				q.leave()
				return nil, fmt.Errorf("%w: key %q is held, and others wait before this caller", ErrNotAcquired, key)
			}
			pause = min(pause, left)
		}
		sleep := c.sleepOrWake
		if every > 0 { // on the real clock, as the listener starts
			sleep = func(ctx context.Context, pause time.Duration, wake <-chan struct{}) error {
				return wakeOrAfter(ctx, min(pause, jitter(every)), wake)
			}
		}
		if err := sleep(ctx, pause, wake); err != nil {
			q.leave()
			return nil, fmt.Errorf("%w: key %q is held: %w", ErrNotAcquired, key, err)
		}
	}
}

// nearPoll is the longest pause, while the listener starts, of a fair waiter with ahead
// live waiters before it that wait for a grant: 5 ms for the head, then 10 and 20; 0
// (none of its own) for a waiter further back or whose place is unknown. Only these
// poll this fast, a few per key: the next grant goes to the head, and the one after to
// the waiter behind it, which should poll fast by the time it becomes the head (two
// handovers, one of which is a claim and a hold of a few milliseconds).
func nearPoll(ahead int) time.Duration {
	if ahead < 0 || ahead > 2 {
		return 0
	}
	return startingPollEvery >> (3 - ahead)
}

// fairWaiter is one fair Acquire's place in the queue of its key (of its semaphore).
type fairWaiter struct {
	c      *Client
	b      store.Store
	t      target
	owner  string
	ttl    time.Duration
	ticket int64 // 0 while not queued
	lined  int64 // the ticket under which the client's line of the queue has it, 0: none
	unsure bool  // the last queue_acquire failed after it may have reached the server
	ahead  int   // live waiters ahead of it that wait for a grant, by its queueing or last poll; -1: unknown
}

// line names the waiter's queue among the client's lines: a semaphore's is apart from
// the queue of a lock of the same key.
func (q *fairWaiter) line() string {
	if q.t.permits > 0 {
		return q.t.key + "\x1f"
	}
	return q.t.key
}

// reline keeps the client's line of the waiter's queue up to date with its ticket.
func (q *fairWaiter) reline() {
	if q.lined != q.ticket {
		q.c.listener.fairLine(q.line(), q.lined, q.ticket, q.owner)
		q.lined = q.ticket
	}
}

// unline takes the waiter out of its client's line, as it stops waiting.
func (q *fairWaiter) unline() {
	if q.lined != 0 {
		q.c.listener.fairLine(q.line(), q.lined, 0, q.owner)
		q.lined = 0
	}
}

// step queues the waiter when it is not queued (and takes the key, or a permit, at once
// when it is free and no one waits), else polls: it returns the permit (0 for a lock)
// and token of what it took or claimed, a 0 token while waiting.
func (q *fairWaiter) step(ctx context.Context) (int, int64, error) {
	if q.ticket == 0 {
		permit, token, ticket, ahead, err := q.b.QueueAcquire(ctx, store.Target{Key: q.t.key, Permits: q.t.permits}, q.owner, q.ttl)
		q.unsure = err != nil && mayHaveReached(err)
		q.ticket, q.ahead = ticket, ahead
		if err != nil {
			q.ahead = -1
		}
		return permit, token, err
	}
	permit, token, queued, ahead, err := q.b.QueuePoll(ctx, q.t.key, q.ticket)
	if err == nil {
		q.ahead = ahead
		if !queued {
			q.ticket = 0
		}
	}
	return permit, token, err
}

// leave takes the waiter out of the queue on a detached context, passing on a grant it
// had; Close waits for it. A poll or a queue_acquire whose reply was lost may have
// given it the key: that is handed back (handback.Queue).
func (q *fairWaiter) leave() {
	// What a lost reply may have given it: its key, or a permit whose number it does
	// not know (handed back by owner).
	undo := q.t.undoKey(acquireReply{})
	if q.ticket == 0 {
		if q.unsure {
			q.c.handBacks.Add(undo, q.owner, q.ttl)
		}
		return
	}
	if h := q.c.handBacks; h.Await() {
		defer h.Done()
	}
	ctx, cancel := detached(context.Background())
	defer cancel()
	left, err := q.b.QueueLeave(ctx, q.t.key, q.ticket)
	q.ticket = 0
	if err != nil || !left {
		q.c.handBacks.Add(undo, q.owner, q.ttl)
	}
}
