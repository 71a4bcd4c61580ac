// Package renewer is the heartbeat of a pglock Client: one schedule for every lock the
// client holds, renewing each every ttl/3, batched into one store call per ttl where the
// store can, and counting each lock's deadline.
//
// # Deadlines
//
// A lock's deadline is ttl from the moment the last renewal that the store confirmed was
// sent (the send time, not the reply time, because the store started its ttl somewhere
// between the two), less a tenth of ttl: timers and the scheduler are late by a few
// milliseconds on a busy machine, and the holder must give up before the store expires
// the lock, not just after. A running holder therefore learns it lost the lock before
// any other holder can have the key. A refused renewal loses the lock at once; failed renewals are retried until the
// deadline, which then loses it. A renewal never re-creates a lock.
//
// # Time
//
// The renewer knows time only through Now and AfterFunc. A clock that calls f
// synchronously when it is moved (a test's manual clock) gets every round, store call
// included, done before the move returns.
package renewer

import (
	"container/heap"
	"context"
	"log/slog"
	"sync"
	"time"
)

// Store renews one lock.
type Store interface {
	Renew(ctx context.Context, key, owner string, ttl time.Duration) (bool, error)
}

// BatchStore renews many locks of one ttl in one call; keys are distinct.
type BatchStore interface {
	RenewMany(ctx context.Context, keys, owners []string, ttl time.Duration) ([]string, error)
}

// Reason says why a lock was lost.
type Reason int

const (
	// Refused: the store refused a renewal.
	Refused Reason = iota + 1
	// Expired: the deadline passed without a confirmed renewal.
	Expired
)

// Entry is one held lock. The caller owns the memory (it can embed an Entry) and sets
// the exported fields before Add; the renewer owns the rest until Remove.
type Entry struct {
	Key   string
	Owner string
	TTL   time.Duration
	// Lost is called once, without the renewer's lock held, when the lock is lost. It
	// must not block: it runs on the renewer's schedule.
	Lost func(Reason)

	next     time.Time // when to renew (or, after failures, retry)
	deadline time.Time
	index    int  // in the heap; -1 when not in it
	inFlight bool // in a store call right now
	removed  bool // removed while in flight: the call's result is ignored
	lost     bool
	reason   Reason // why, once lost
}

// Deadline returns when a lock that the store confirmed for ttl, in a call sent at
// sentAt, is to be given up: before the store's own expiry by a tenth of ttl.
func Deadline(sentAt time.Time, ttl time.Duration) time.Time {
	return sentAt.Add(ttl - ttl/10)
}

// Config is what a Renewer runs on.
type Config struct {
	Store     Store
	Now       func() time.Time
	AfterFunc func(d time.Duration, f func()) (stop func() bool)
	Logger    *slog.Logger
}

// Renewer renews the entries added to it until they are removed or lost. It is safe
// for concurrent use.
type Renewer struct {
	cfg    Config
	batch  BatchStore // nil when the store has no batch call
	ctx    context.Context
	cancel context.CancelFunc

	mu        sync.Mutex
	queue     queue
	timerStop func() bool
	timerAt   time.Time
	timerSet  bool
	running   bool // a round is under way; it schedules the next when it ends
	closed    bool
	rounds    sync.WaitGroup
}

// New returns a Renewer. Close stops it.
func New(cfg Config) *Renewer {
	ctx, cancel := context.WithCancel(context.Background())
	r := &Renewer{cfg: cfg, ctx: ctx, cancel: cancel}
	r.batch, _ = cfg.Store.(BatchStore)
	return r
}

// Add starts renewing e, whose lock the store confirmed for e.TTL from sentAt (when
// the acquiring call was sent).
func (r *Renewer) Add(e *Entry, sentAt time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e.deadline = Deadline(sentAt, e.TTL)
	e.next = sentAt.Add(e.TTL / 3)
	e.inFlight, e.removed, e.lost, e.reason = false, false, false, 0
	heap.Push(&r.queue, e)
	r.schedule()
}

// Remove stops renewing e and reports whether it was still held. When it was lost
// (its Lost has been or is being called), reason says why; when it was never added or
// is already removed, reason is zero.
func (r *Renewer) Remove(e *Entry) (held bool, reason Reason) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case e.lost:
		return false, e.reason
	case e.removed:
		return false, 0
	case e.index >= 0 && e.index < len(r.queue) && r.queue[e.index] == e:
		heap.Remove(&r.queue, e.index)
		r.schedule()
	case e.inFlight:
		e.removed = true
	default:
		return false, 0
	}
	e.removed = true
	return true, 0
}

// Live reports whether e is added, not lost, and before its deadline on the clock. It
// does not wait for the schedule: a round that runs late (a starved process, a store
// call hanging while the server restarts) must not let a holder act past its deadline.
func (r *Renewer) Live(e *Entry) bool {
	now := r.cfg.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	return !e.lost && !e.removed && now.Before(e.deadline)
}

// Close stops the schedule, cancels a round's store calls and waits for the round to
// end. Entries still added are dropped without a call to Lost.
func (r *Renewer) Close() {
	r.mu.Lock()
	r.closed = true
	r.stopTimer()
	r.mu.Unlock()
	r.cancel()
	r.rounds.Wait()
}

func (r *Renewer) stopTimer() {
	if r.timerSet && r.timerStop() {
		r.rounds.Done() // the round that timer would have run
	}
	r.timerSet = false
}

// schedule sets the timer for the earliest entry. Called with mu held.
func (r *Renewer) schedule() {
	if r.running || r.closed {
		return
	}
	if len(r.queue) == 0 {
		r.stopTimer()
		return
	}
	at := r.queue[0].next
	if r.timerSet && !r.timerAt.After(at) {
		return // an earlier round comes first and schedules again after itself
	}
	r.stopTimer()
	r.timerAt, r.timerSet = at, true
	r.rounds.Add(1)
	r.timerStop = r.cfg.AfterFunc(max(at.Sub(r.cfg.Now()), 0), r.round)
}

// round renews every entry that is due, or due within a sixth of its ttl, so that
// locks taken at different times fall into common batches.
func (r *Renewer) round() {
	defer r.rounds.Done()
	r.mu.Lock()
	r.timerSet = false
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.running = true
	now := r.cfg.Now()
	var due, expired []*Entry
	for len(r.queue) > 0 {
		e := r.queue[0]
		if e.next.After(now.Add(e.TTL / 6)) {
			break
		}
		heap.Pop(&r.queue)
		if !now.Before(e.deadline) {
			e.lost, e.reason = true, Expired
			expired = append(expired, e)
			continue
		}
		e.inFlight = true
		due = append(due, e)
	}
	r.mu.Unlock()

	for _, e := range expired {
		e.Lost(Expired)
	}
	for len(due) > 0 {
		// One call per ttl; a key held twice (an old owner not yet found lost) goes alone.
		group, rest := split(due)
		r.renew(group)
		due = rest
	}

	r.mu.Lock()
	r.running = false
	r.schedule()
	r.mu.Unlock()
}

// split returns the first entry's ttl group with distinct keys, and the rest.
func split(due []*Entry) (group, rest []*Entry) {
	ttl := due[0].TTL
	seen := make(map[string]bool, len(due))
	for _, e := range due {
		if e.TTL == ttl && !seen[e.Key] {
			seen[e.Key] = true
			group = append(group, e)
		} else {
			rest = append(rest, e)
		}
	}
	return group, rest
}

func (r *Renewer) renew(group []*Entry) {
	ttl := group[0].TTL
	sentAt := r.cfg.Now()
	earliest := group[0].deadline
	for _, e := range group {
		if e.deadline.Before(earliest) {
			earliest = e.deadline
		}
	}
	// A call that outlives the earliest deadline is useless: by then that lock is lost.
	ctx, cancel := context.WithTimeout(r.ctx, max(earliest.Sub(sentAt), time.Millisecond))
	renewed := make([]bool, len(group))
	var err error
	if r.batch != nil && len(group) > 1 {
		keys, owners := make([]string, len(group)), make([]string, len(group))
		for i, e := range group {
			keys[i], owners[i] = e.Key, e.Owner
		}
		var got []string
		got, err = r.batch.RenewMany(ctx, keys, owners, ttl)
		ok := make(map[string]bool, len(got))
		for _, k := range got {
			ok[k] = true
		}
		for i, e := range group {
			renewed[i] = ok[e.Key]
		}
	} else {
		for i, e := range group {
			var ok bool
			if ok, err = r.cfg.Store.Renew(ctx, e.Key, e.Owner, ttl); err != nil {
				break
			}
			renewed[i] = ok
		}
	}
	cancel()
	if err != nil && r.ctx.Err() == nil {
		r.cfg.Logger.Warn("pglock: renewal failed; retrying until the deadline",
			slog.Int("locks", len(group)), slog.Duration("ttl", ttl), slog.Any("err", err))
	}

	now := r.cfg.Now()
	var lost []*Entry
	r.mu.Lock()
	for i, e := range group {
		e.inFlight = false
		switch {
		case e.removed:
		case renewed[i]:
			e.deadline = Deadline(sentAt, ttl)
			e.next = sentAt.Add(ttl / 3)
			heap.Push(&r.queue, e)
		case err == nil:
			e.lost, e.reason = true, Refused
			lost = append(lost, e)
		case !now.Before(e.deadline):
			e.lost, e.reason = true, Expired
			lost = append(lost, e)
		default:
			// Retry soon, and be back at the deadline at the latest to call it lost.
			e.next = minTime(now.Add(max(ttl/10, time.Millisecond)), e.deadline)
			heap.Push(&r.queue, e)
		}
	}
	r.mu.Unlock()
	for _, e := range lost {
		e.Lost(e.reason)
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// queue is a min-heap of entries by next.
type queue []*Entry

func (q queue) Len() int           { return len(q) }
func (q queue) Less(i, j int) bool { return q[i].next.Before(q[j].next) }
func (q queue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = i, j
}
func (q *queue) Push(x any) {
	e := x.(*Entry)
	e.index = len(*q)
	*q = append(*q, e)
}
func (q *queue) Pop() any {
	old := *q
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	e.index = -1
	return e
}
