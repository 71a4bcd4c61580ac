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
// any other holder can have the key. A refused renewal loses the lock at once; failed
// renewals are retried until the deadline, which then loses it. A renewal never
// re-creates a lock.
//
// # Scheduling
//
// Every added entry sits in one heap, keyed by when it next needs attention: its next
// renewal while it is idle, its deadline while a renewal of it is in flight. One timer
// targets the heap's minimum. When it fires, a round takes what is due (and what falls
// due within a sixth of its ttl, so that locks taken at different times share calls),
// marks it in flight, and re-arms the timer before it makes any store call. So a store
// call that hangs (a silent network) delays nothing else: the next round starts on its
// own timer, an entry added meanwhile is scheduled at once, and an entry whose own call
// hangs is lost at its deadline, the call's late result ignored. Rounds may overlap.
// Within a round, each ttl group (and each key held twice) has its own call, and the
// calls run side by side; the round returns when all of them have.
//
// # Confirming at once
//
// Confirm brings forward the renewal of every entry not in flight to now: the client
// calls it when the store may have lost locks it holds (its connections came back after
// they were cut; a lock was granted on a later timeline of the server), so that a lock
// lost in a failover is found lost a round trip after the client reaches the new
// server, not at its next renewal. A refused renewal confirms the other entries too.
//
// # Time
//
// The renewer knows time only through Now and AfterFunc, a store call's bound (its
// earliest deadline) included. A clock that calls f synchronously when it is moved (a
// test's manual clock) gets every round, store calls included, done before the move
// returns, and a call slow on the wire is answered however long it takes for real: only
// moving the clock to its bound, from elsewhere, ends it.
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

// confirmRetry is the first pause before a failed call of entries that Confirm wants
// confirmed is retried: a pool replaces a connection that died with its server at once.
const confirmRetry = 10 * time.Millisecond

// warnEvery is how often, at most, a ttl's failing renewals are logged at Warn.
const warnEvery = 10 * time.Second

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
	// oindex is the entry's index in the renewer's pending heap, -1 when not in it;
	// overdue, whether Overdue counted it (then it is not in that heap).
	oindex  int
	overdue bool
	call    uint64 // which call: a result for an earlier one is ignored
	removed bool
	lost    bool
	reason  Reason // why, once lost
	// confirming is set by Confirm until the store answers a renewal of the entry;
	// failed counts the failed calls since, which are retried sooner (confirmRetry).
	confirming bool
	failed     int
}

// at is the entry's heap key: when it next needs attention.
func (e *Entry) at() time.Time {
	if e.inFlight {
		return e.deadline
	}
	return e.next
}

// overdueAt is when e's renewal is overdue: half its ttl after the last confirmed
// renewal was sent, its deadline being that send plus nine tenths of its ttl.
func (e *Entry) overdueAt() time.Time {
	return e.deadline.Add(-e.TTL * 2 / 5)
}

// Deadline returns when a lock that the store confirmed for ttl, in a call sent at
// sentAt, is to be given up: before the store's own expiry by a tenth of ttl.
func Deadline(sentAt time.Time, ttl time.Duration) time.Time {
	return sentAt.Add(ttl - ttl/10)
}

// Config is what a Renewer runs on. A nil Logger means slog.Default().
type Config struct {
	Store     Store
	Now       func() time.Time
	AfterFunc func(d time.Duration, f func()) (stop func() bool)
	Logger    *slog.Logger
	// Observe, when set, is called after each renewal call (a group's batch call, or
	// its run of single calls) with what it did, before the locks it lost are reported.
	// It must not block: it runs on the renewer's schedule. It is not called for a call
	// that Close cut short.
	Observe func(Call)
}

// Call is one renewal call, as Config.Observe sees it.
type Call struct {
	TTL      time.Duration
	Locks    int           // how many locks it renewed or tried to
	Sent     time.Time     // when it was sent
	Duration time.Duration // how long it took, on the clock
	Err      error         // the store's error; nil when the store answered, even to refuse
}

// Renewer renews the entries added to it until they are removed or lost. It is safe
// for concurrent use.
type Renewer struct {
	cfg    Config
	batch  BatchStore // nil when the store has no batch call
	ctx    context.Context
	cancel context.CancelFunc

	mu    sync.Mutex
	queue queue
	// pending holds the live entries not yet overdue, by when they will be; overdue
	// counts the others. Overdue moves what fell due from one to the other, so that a
	// probe costs O(log n) per entry that became overdue, not a walk of every entry.
	pending   pendingQueue
	overdue   int
	timerStop func() bool // nil when no timer is armed
	timerAt   time.Time
	timerID   uint64 // which arming; a round from an earlier one leaves the current timer be
	rounds    int    // armed timers and rounds under way
	closed    bool
	idle      chan struct{} // closed once closed and rounds is zero
	idleDone  bool
	// warned holds, per ttl whose last call failed, when its failure was last logged at
	// Warn. Per ttl because that is the unit of batching: an outage fails every call of
	// a ttl alike, so one line per ttl says all there is, however many locks or rounds;
	// the first failure after a success warns at once, so that an outage is seen when it
	// starts, and a success clears the entry.
	warned map[time.Duration]time.Time
}

// New returns a Renewer. Close stops it.
func New(cfg Config) *Renewer {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Renewer{cfg: cfg, ctx: ctx, cancel: cancel, idle: make(chan struct{}),
		warned: make(map[time.Duration]time.Time)}
	r.batch, _ = cfg.Store.(BatchStore)
	return r
}

// Add starts renewing e, whose lock the store confirmed for e.TTL from sentAt (when
// the acquiring call was sent). e must not be added again before Remove.
func (r *Renewer) Add(e *Entry, sentAt time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e.deadline = Deadline(sentAt, e.TTL)
	e.next = sentAt.Add(e.TTL / 3)
	e.inFlight, e.removed, e.lost, e.reason = false, false, false, 0
	e.confirming, e.failed = false, 0
	heap.Push(&r.queue, e)
	r.track(e)
	r.arm()
}

// Remove stops renewing e and reports whether it was still held. When it was lost
// (its Lost has been or is being called), reason says why; when it was never added or
// is already removed, reason is zero. The result of a renewal of e in flight is
// ignored.
func (r *Renewer) Remove(e *Entry) (held bool, reason Reason) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case e.lost:
		return false, e.reason
	case e.removed || e.index < 0 || e.index >= len(r.queue) || r.queue[e.index] != e:
		return false, 0
	}
	heap.Remove(&r.queue, e.index)
	r.untrack(e)
	e.removed, e.inFlight = true, false
	r.arm()
	return true, 0
}

// Confirm renews at once, in one round (one call per ttl, as any round), every entry
// whose last confirmed renewal was sent before before and that has no renewal in flight,
// rather than at its next renewal: for when the store may have lost them since, as
// when its server was replaced by a standby that missed the last commits, so that a
// lock lost with the old server is found lost within a round trip. Until the store
// answers, failed calls of these entries (the first may meet a connection to the old
// server) are retried after confirmRetry, doubling up to the usual tenth of the ttl. A
// refused renewal confirms the other entries too (see renew).
func (r *Renewer) Confirm(before time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.confirm(before)
}

// confirm is Confirm, called with mu held.
func (r *Renewer) confirm(before time.Time) {
	if r.closed {
		return
	}
	now := r.cfg.Now()
	moved := false
	for _, e := range r.queue {
		if !e.deadline.Before(Deadline(before, e.TTL)) {
			continue
		}
		e.confirming = true
		if !e.inFlight && e.next.After(now) {
			e.next, moved = now, true
		}
	}
	if moved {
		heap.Init(&r.queue)
		r.arm()
	}
}

// Live reports whether e is added, not lost, and before its deadline on the clock. It
// does not wait for the schedule: a round that runs late (a starved process) must not
// let a holder act past its deadline.
func (r *Renewer) Live(e *Entry) bool {
	now := r.cfg.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	return !e.lost && !e.removed && now.Before(e.deadline)
}

// Fresh reports whether e is Live and its renewal is not overdue on the clock: the
// last confirmed renewal was sent less than half its ttl ago, so the store's own
// expiry is more than half a ttl away.
func (r *Renewer) Fresh(e *Entry) bool {
	now := r.cfg.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	return !e.lost && !e.removed && now.Before(e.overdueAt())
}

// Overdue counts the entries added, not lost, whose last confirmed renewal was sent
// more than half their ttl ago on the clock: one renewal, due at a third of the ttl,
// has not been confirmed in time, and the lock is lost at nine tenths unless one is.
//
// It costs O(log n) for each entry that became overdue since the last call, and O(1)
// otherwise: cheap enough for every probe, whatever the number of entries.
func (r *Renewer) Overdue() int {
	now := r.cfg.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for len(r.pending) > 0 && !now.Before(r.pending[0].overdueAt()) {
		e := heap.Pop(&r.pending).(*Entry)
		e.overdue = true
		r.overdue++
	}
	return r.overdue
}

// track counts e, just added or renewed, as not overdue until its overdueAt. Called
// with mu held.
func (r *Renewer) track(e *Entry) {
	e.overdue = false
	heap.Push(&r.pending, e)
}

// renewed moves e, whose deadline moved, to its place in the pending heap. Called with
// mu held.
func (r *Renewer) renewed(e *Entry) {
	if e.overdue {
		e.overdue = false
		r.overdue--
		heap.Push(&r.pending, e)
		return
	}
	heap.Fix(&r.pending, e.oindex)
}

// untrack stops counting e, which was tracked: it is renewed, removed or lost. Called
// with mu held.
func (r *Renewer) untrack(e *Entry) {
	if e.overdue {
		e.overdue = false
		r.overdue--
		return
	}
	heap.Remove(&r.pending, e.oindex)
}

// Close stops the schedule, cancels the store calls in flight and waits for the rounds
// under way to end, or for ctx to end: then it returns context.Cause(ctx), and the
// rounds end on their own when their store calls return. Entries still added are
// dropped without a call to Lost. When Close returns nil, nothing of the renewer runs.
// Calling Close again waits again.
func (r *Renewer) Close(ctx context.Context) error {
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		r.stopTimer()
		r.checkIdle()
	}
	r.mu.Unlock()
	r.cancel()
	select {
	case <-r.idle:
		return nil
	default:
	}
	select {
	case <-r.idle:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// stopTimer disarms the timer. Called with mu held.
func (r *Renewer) stopTimer() {
	if r.timerStop != nil && r.timerStop() {
		r.roundDone() // the round that timer would have run
	}
	r.timerStop = nil
}

// roundDone counts a round (or an armed timer) out. Called with mu held.
func (r *Renewer) roundDone() {
	r.rounds--
	r.checkIdle()
}

func (r *Renewer) checkIdle() {
	if r.closed && r.rounds == 0 && !r.idleDone {
		r.idleDone = true
		close(r.idle)
	}
}

// arm points the timer at the heap's minimum. Called with mu held.
func (r *Renewer) arm() {
	if r.closed {
		return
	}
	if len(r.queue) == 0 {
		r.stopTimer()
		return
	}
	at := r.queue[0].at()
	if r.timerStop != nil && !r.timerAt.After(at) {
		return // it fires first, and its round arms again
	}
	r.stopTimer()
	r.timerID++
	id := r.timerID
	r.timerAt = at
	r.rounds++
	r.timerStop = r.cfg.AfterFunc(max(at.Sub(r.cfg.Now()), 0), func() { r.round(id) })
}

// flight is an entry in a store call, with what the round knew of it when it sent it.
type flight struct {
	e        *Entry
	call     uint64
	deadline time.Time
}

// round loses what has passed its deadline and renews every idle entry that is due, or
// due within a sixth of its ttl.
func (r *Renewer) round(id uint64) {
	r.mu.Lock()
	defer func() {
		r.mu.Lock()
		r.roundDone()
		r.mu.Unlock()
	}()
	if r.timerID == id {
		r.timerStop = nil
	}
	if r.closed {
		r.mu.Unlock()
		return
	}
	now := r.cfg.Now()
	var due []flight
	var expired []*Entry
	for len(r.queue) > 0 {
		e := r.queue[0]
		if e.inFlight && now.Before(e.deadline) || !e.inFlight && e.next.After(now.Add(e.TTL/6)) {
			break
		}
		heap.Pop(&r.queue)
		if !now.Before(e.deadline) {
			// In flight or not: whatever its call says later comes too late.
			e.lost, e.reason, e.inFlight = true, Expired, false
			r.untrack(e)
			expired = append(expired, e)
			continue
		}
		e.inFlight = true
		e.call++
		due = append(due, flight{e: e, call: e.call, deadline: e.deadline})
	}
	for _, f := range due {
		heap.Push(&r.queue, f.e) // back in, keyed by its deadline
	}
	r.arm()
	r.mu.Unlock()

	for _, e := range expired {
		e.Lost(Expired)
	}
	// One call per ttl; a key held twice (an old owner not yet found lost) goes alone.
	var groups [][]flight
	for len(due) > 0 {
		var group []flight
		group, due = split(due)
		groups = append(groups, group)
	}
	if len(groups) == 1 {
		r.renew(groups[0])
		return
	}
	// Side by side: a call that hangs must not hold back another ttl's renewal.
	var wg sync.WaitGroup
	for _, group := range groups {
		wg.Go(func() { r.renew(group) })
	}
	wg.Wait()
}

// split returns the first entry's ttl group with distinct keys, and the rest.
func split(due []flight) (group, rest []flight) {
	ttl := due[0].e.TTL
	seen := make(map[string]bool, len(due))
	for _, f := range due {
		if f.e.TTL == ttl && !seen[f.e.Key] {
			seen[f.e.Key] = true
			group = append(group, f)
		} else {
			rest = append(rest, f)
		}
	}
	return group, rest
}

func (r *Renewer) renew(group []flight) {
	ttl := group[0].e.TTL
	sentAt := r.cfg.Now()
	earliest := group[0].deadline
	for _, f := range group {
		if f.deadline.Before(earliest) {
			earliest = f.deadline
		}
	}
	// A call that outlives the earliest deadline is useless: by then that lock is lost.
	ctx, cancel := r.bound(max(earliest.Sub(sentAt), time.Millisecond))
	renewed := make([]bool, len(group))
	var err error
	if r.batch != nil && len(group) > 1 {
		keys, owners := make([]string, len(group)), make([]string, len(group))
		for i, f := range group {
			keys[i], owners[i] = f.e.Key, f.e.Owner
		}
		var got []string
		got, err = r.batch.RenewMany(ctx, keys, owners, ttl)
		ok := make(map[string]bool, len(got))
		for _, k := range got {
			ok[k] = true
		}
		for i, f := range group {
			renewed[i] = ok[f.e.Key]
		}
	} else {
		for i, f := range group {
			var ok bool
			if ok, err = r.cfg.Store.Renew(ctx, f.e.Key, f.e.Owner, ttl); err != nil {
				break
			}
			renewed[i] = ok
		}
	}
	cancel()

	now := r.cfg.Now()
	var lost []*Entry
	refused := false
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return // dropped: Close cancelled the call, and nobody waits for its news
	}
	level := slog.LevelDebug
	if err == nil {
		delete(r.warned, ttl)
	} else if last, failing := r.warned[ttl]; !failing || now.Sub(last) >= warnEvery {
		r.warned[ttl] = now
		level = slog.LevelWarn
	}
	for i, f := range group {
		e := f.e
		if !e.inFlight || e.call != f.call {
			continue // lost at its deadline, or removed, while the call ran
		}
		heap.Remove(&r.queue, e.index)
		e.inFlight = false
		switch {
		case renewed[i]:
			e.confirming, e.failed = false, 0
			e.deadline = Deadline(sentAt, ttl)
			e.next = sentAt.Add(ttl / 3)
			heap.Push(&r.queue, e)
			r.renewed(e)
		case err == nil:
			e.lost, e.reason = true, Refused
			r.untrack(e)
			lost = append(lost, e)
			refused = true
		case !now.Before(e.deadline):
			e.lost, e.reason = true, Expired
			r.untrack(e)
			lost = append(lost, e)
		default:
			// Retry soon, and be back at the deadline at the latest to call it lost.
			retry := max(ttl/10, time.Millisecond)
			if e.confirming {
				e.failed++
				retry = min(retry, confirmRetry<<min(e.failed-1, 20))
			}
			e.next = minTime(now.Add(retry), e.deadline)
			heap.Push(&r.queue, e)
		}
	}
	if refused {
		// The store did not have a lock this client thought it held: a failover that
		// lost commits, a force-release, or a clock that ran slow. Whatever it was may
		// have taken the others too.
		r.confirm(sentAt)
	}
	r.arm()
	r.mu.Unlock()

	if r.cfg.Observe != nil {
		r.cfg.Observe(Call{TTL: ttl, Locks: len(group), Sent: sentAt, Duration: now.Sub(sentAt), Err: err})
	}
	if err != nil {
		r.cfg.Logger.LogAttrs(context.Background(), level, "pglock: renewal failed; retrying until the deadline",
			slog.Duration("ttl", ttl), slog.Int("locks", len(group)), slog.Any("err", err))
	}
	for _, e := range lost {
		e.Lost(e.reason)
	}
}

// bound returns the context of a store call that Close ends, or the clock after d: it
// is on the clock, as the deadlines are. On the real clock that is a timeout; on a
// test's manual clock, a call slow on the wire (a loaded machine) is still answered
// while the clock stands still, instead of failing and waiting for a retry that the
// clock never brings.
func (r *Renewer) bound(d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(r.ctx)
	stop := r.cfg.AfterFunc(d, func() { cancel(context.DeadlineExceeded) })
	return boundCtx{ctx}, func() {
		stop()
		cancel(context.Canceled)
	}
}

// boundCtx is a context whose Err is its cause, as for a timeout: the store's error says
// "deadline exceeded" when the bound ended the call, not "canceled".
type boundCtx struct{ context.Context }

func (c boundCtx) Err() error {
	if c.Context.Err() == nil {
		return nil
	}
	return context.Cause(c.Context)
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// queue is a min-heap of entries by when they next need attention.
type queue []*Entry

func (q queue) Len() int           { return len(q) }
func (q queue) Less(i, j int) bool { return q[i].at().Before(q[j].at()) }
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

// pendingQueue is a min-heap of entries by when their renewal is overdue.
type pendingQueue []*Entry

func (q pendingQueue) Len() int           { return len(q) }
func (q pendingQueue) Less(i, j int) bool { return q[i].overdueAt().Before(q[j].overdueAt()) }
func (q pendingQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].oindex, q[j].oindex = i, j
}
func (q *pendingQueue) Push(x any) {
	e := x.(*Entry)
	e.oindex = len(*q)
	*q = append(*q, e)
}
func (q *pendingQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	e.oindex = -1
	return e
}
