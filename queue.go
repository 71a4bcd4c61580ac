package pglock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"
)

// The fair queue (Fair): waiters served in the order they arrived, across every client
// of the database. The order and the handovers are kept by the database
// (migrations/000014_queue.up.sql): a fair waiter that finds its key held is queued
// with a ticket, a release hands the key to the live waiter with the smallest ticket in
// the same call (a grant, for queueBound), and that waiter claims it with its next
// poll. A waiter is live while its client polls for it: at least every queueHeartbeat, and at
// once when the listener hears that its key was granted to it (grantedChannel).

// queueBound is Q, how long a fair waiter stays live after its last poll and how long
// a grant waits for its claim: the database's "interval '1 second'" in 000014.
const queueBound = time.Second

// queueHeartbeat is how often a fair waiter polls when nothing wakes it: Q/4, so that
// three lost or late polls in a row do not yet make it look dead.
const queueHeartbeat = queueBound / 4

// Fair makes Acquire and WithLock wait in the key's queue, shared by every client of
// the database: the waiter that arrived first, on any instance, is served first, and a
// release hands the key straight to it in the same statement (one acquisition
// statement per handover, not a race). It is an AcquireOption.
//
// Semaphore.Acquire and WithPermit with Fair wait in the semaphore's queue (apart from
// the queue of a lock of the same key): a permit's release hands that permit to the
// head of the queue when the head's number of permits allows it (fewer live holders
// than it, and the permit's number within it); a waiter whose turn came without a
// release (a holder expired, the number grew) takes the lowest free permit at its next
// poll, when fewer live waiters are ahead of it than it has free permits.
//
// The bound: a fair waiter that dies, is paused or gives up without leaving stalls the
// queue for at most about Q + Q/4, Q = 1 s on the database clock: it is skipped once Q
// has passed since its last poll (a live waiter polls at least every Q/4), and a key granted to
// it that it does not claim within Q goes to the next live waiter at that waiter's next
// poll. A waiter paused longer than Q keeps its place and is served when it polls again
// (not polled for a minute, it queues again at the back). A waiter whose ctx ends, whose
// Wait passes or whose Client closes leaves the queue, passing on a grant it had. A
// waiter that dies after its poll claimed the key (the reply lost, say, to a partition)
// holds it as any holder does: until its ttl passes.
//
// What it costs: a row per waiter and a poll (an unflushed write) every Q/4 per waiter,
// and, for the waiter served, one round trip more than a plain acquisition (the claim).
// While a client's listener starts (its first second or so after New), no grant can
// wake its waiters: the one served finds out at its next poll, every few milliseconds
// for the few next in line, so the slowest handovers of a crowd that starts with its
// clients are about twice a plain crowd's (p99 13-33 ms against 7 on 2 cores,
// BENCHMARKS.md), where its median and its p99 once listening are better.
// So it is a choice, not the default: jobs and elections never wait, and callers that
// do not ask for it keep today's behaviour.
//
// While a live fair waiter is queued on a key (a semaphore), the key is the queue's:
// TryAcquire, and Acquire without Fair, fail even when the key (a permit) is free at that moment (a grant not
// claimed yet, a holder that just expired), since an attempt from outside the queue
// that could take a free key would starve the waiters queued for it. Fair waiters need
// the listener (New's default) to be woken when the key is theirs; without one, they
// find out at their next poll, Q/4 later at most. A Store that embeds another has no
// queue, nor does a PostgreSQL store inside a transaction of the caller's (a pgx.Tx, or
// a connection with one open), whose wait would hold the key's row locked: Acquire with
// Fair returns an error wrapping errors.ErrUnsupported.
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
	b, err := c.backend("Acquire with Fair", "has no fair queue")
	if err != nil {
		return nil, err
	}
	if s, ok := unwatched(c.store).(*postgresStore); ok && s.inTx != nil && s.inTx() {
		return nil, fmt.Errorf("pglock: Acquire with Fair: the store runs in a transaction of the caller's, "+
			"which would keep the key's row locked while it waits (the release it waits for would wait for it) "+
			"and make the caller's commit asynchronous: use a store on a pool or a connection: %w", errors.ErrUnsupported)
	}
	var deadline time.Time
	if lc.waitSet {
		deadline = start.Add(lc.wait)
	}
	q := &fairWaiter{c: c, b: b, t: t, owner: c.newOwner(), ttl: lc.ttl}
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
		mark := &sendMark{wait: ctx, now: c.clock.Now, sent: c.clock.Now()}
		permit, token, err := q.step(withSendMark(ctx, mark))
		q.reline()
		switch {
		case err == nil && token > 0:
			return c.newLock(t, permit, q.owner, lc.ttl, token, start, mark.sent)
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
		// mostly polls every few milliseconds by then, having been next but one. (Only
		// the head polling, the next head found out at its next heartbeat, up to Q/4
		// later: the start of a crowd of 100 fair waiters over 20 clients had a handover
		// p99 of 117-208 ms, against 54-94 ms plain; with the firsts polling but not the
		// next in line, 104-142 ms. Until queueing told the place (000026), the first
		// grant of a crowd went to a waiter that had not polled yet, at the firsts' pace.)
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

// maxAhead is how far queue_poll (000024) and queue_acquire (000026) count the waiters
// ahead of the caller.
const maxAhead = 8

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
	b      backend
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
		permit, token, ticket, ahead, err := q.b.queueAcquire(ctx, q.t, q.owner, q.ttl)
		q.unsure = err != nil && mayHaveReached(err)
		q.ticket, q.ahead = ticket, ahead
		if err != nil {
			q.ahead = -1
		}
		return permit, token, err
	}
	permit, token, queued, ahead, err := q.b.queuePoll(ctx, q.t.key, q.ticket)
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
// given it the key: that is handed back (undoAcquire).
func (q *fairWaiter) leave() {
	// What a lost reply may have given it: its key, or a permit whose number it does
	// not know (handed back by owner).
	undo := q.t.undoKey(acquireReply{})
	if q.ticket == 0 {
		if q.unsure {
			q.c.undoAcquire(undo, q.owner, q.ttl)
		}
		return
	}
	if h := q.c.handBacks; h.await() {
		defer h.awaiting.Done()
	}
	ctx, cancel := detached(context.Background())
	defer cancel()
	left, err := q.b.queueLeave(ctx, q.t.key, q.ticket)
	q.ticket = 0
	if err != nil || !left {
		q.c.undoAcquire(undo, q.owner, q.ttl)
	}
}

// fairWait registers the fair waiter of owner and returns the channel the grant of its
// key, and Close, signal.
func (l *listener) fairWait(owner string) <-chan struct{} {
	ch := make(chan struct{}, 1)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		ch <- struct{}{}
		return ch
	}
	l.fair[owner] = ch
	return ch
}

// fairQueued starts the listener's connection, for a fair waiter that is queued.
func (l *listener) fairQueued() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.start()
}

// fairEntry is a queued fair waiter of the client: its ticket, and the owner by which its
// wake-up is registered.
type fairEntry struct {
	ticket int64
	owner  string
}

// fairLine moves owner's waiter in the client's line of queue line from ticket from to
// ticket to (0: out of the line). When the first of the line leaves while the listener
// starts, the new first is woken, to poll from now on as the first does.
func (l *listener) fairLine(line string, from, to int64, owner string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	es := l.lines[line]
	if i := slices.IndexFunc(es, func(e fairEntry) bool { return e.ticket == from }); from != 0 && i >= 0 {
		es = slices.Delete(es, i, i+1)
		if i == 0 && len(es) > 0 && l.starting {
			signal(l.fair[es[0].owner])
		}
	}
	if to != 0 {
		i, _ := slices.BinarySearchFunc(es, to, func(e fairEntry, t int64) int { return cmp.Compare(e.ticket, t) })
		es = slices.Insert(es, i, fairEntry{ticket: to, owner: owner})
	}
	if len(es) == 0 {
		delete(l.lines, line)
	} else {
		l.lines[line] = es
	}
}

// fairFirst reports whether ticket is the first of the client's line of queue line.
func (l *listener) fairFirst(line string, ticket int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	es := l.lines[line]
	return len(es) > 0 && es[0].ticket == ticket
}

// fairDone unregisters the fair waiter of owner.
func (l *listener) fairDone(owner string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.fair, owner)
}
