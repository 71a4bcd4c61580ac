package pglock

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/pgfence/pglock/internal/renewer"
)

// Every store call a Client makes goes through a watched store, which records its
// outcome for Health in one place: acquisitions, waits' marks, renewals, releases and
// hand-backs, campaigns, job ticks, history writes, reads. The store answered (a lock
// granted or not, a renewal confirmed or refused) is a success; an error is a failure,
// except bad input (refused before the database is asked) and a call that its context
// ended: that is the caller giving up, not the database failing, unless the call had
// already waited patience for an answer and no other call was answered meanwhile.

// probeEvery is how often, while the last store call failed, the client makes a call
// of its own to find out whether the store answers again: a client that makes no call
// while it is not ready (its caller waits for readiness) would otherwise stay unready.
const probeEvery = time.Second

// probeKey is the key of the probe: a Renew of a lock nobody holds, for an owner that
// holds nothing, so the store answers false and writes nothing.
const probeKey = "pglock/health-probe"

// calls is what the watched store records: the last answer, the last failure, and the
// calls waiting for an answer, oldest first.
type calls struct {
	clock    Clock
	patience time.Duration // how long a call may wait for an answer before the client is unready
	probe    func(ctx context.Context) error
	// back is called, without mu held, when a call succeeds after a failure: the
	// client's connections came back, maybe to another server (a failover).
	back   func()
	ctx    context.Context // the probes'; cancelled at Close
	cancel context.CancelFunc

	mu       sync.Mutex
	answered time.Time    // when the store last answered a call
	failure  *callFailure // the last call's failure; nil once a call succeeds after it
	inFlight list.List    // of *flight, by start
	probing  bool         // a probe is armed or running
	timer    Timer
	closed   bool
	probes   sync.WaitGroup
}

// callFailure is a store call that failed.
type callFailure struct {
	call string
	at   time.Time
	err  error
}

// flight is a store call waiting for its answer.
type flight struct {
	ctx   context.Context
	call  string
	start time.Time
	// patience is how long it may wait for an answer: the client's, or half the ttl
	// of the lock it is about when shorter.
	patience time.Duration
	elem     *list.Element // in calls.inFlight; nil for a call that may wait long
}

// watchStore makes every call of the client to store go through a watched store that
// feeds Health, and returns it for the client's parts to use. A probe runs at most once
// a second while the last call failed, until one succeeds or Close.
func (c *Client) watchStore(store Store) Store {
	k := &calls{clock: c.clock, patience: c.ttl / 2, back: c.connectionsBack}
	k.ctx, k.cancel = context.WithCancel(context.Background())
	w := watch(store, k)
	k.probe = func(ctx context.Context) error {
		_, err := store.Renew(ctx, probeKey, c.instance+"/health-probe", time.Second)
		return err
	}
	c.store, c.health.calls = w, k
	c.onClose(k.close)
	return w
}

// begin records the start of a call named call. A call that may wait long for a good
// reason (a force-release waits for open fenced transactions) is not counted as
// waiting.
func (k *calls) begin(ctx context.Context, call string, ttl time.Duration, mayWait bool) *flight {
	f := &flight{ctx: ctx, call: call, patience: k.patience}
	if ttl > 0 {
		f.patience = min(f.patience, ttl/2)
	}
	k.mu.Lock()
	f.start = k.clock.Now()
	if !mayWait {
		f.elem = k.inFlight.PushBack(f)
	}
	k.mu.Unlock()
	return f
}

// end records the outcome of f: *err is the call's error.
func (k *calls) end(f *flight, err *error) {
	if k.record(f, *err) && k.back != nil {
		k.back()
	}
}

// record records the outcome of f, and reports whether it is a success after a failure.
func (k *calls) record(f *flight, e error) (back bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	now := k.clock.Now()
	if f.elem != nil {
		k.inFlight.Remove(f.elem)
	}
	switch {
	case e == nil:
		return k.succeeded(now)
	case errors.Is(e, ErrInvalidKey) || errors.Is(e, ErrInvalidArgument):
		return false // bad input, refused before the database was asked
	case f.ctx.Err() != nil:
		if now.Sub(f.start) < f.patience || k.answered.After(f.start.Add(f.patience)) {
			// The caller gave up; or the store answered other calls after this one had
			// waited its patience. An answer before that (a call answered just as an
			// outage began) says nothing of the outage: counting it hid a black-holed
			// link from Health once the lease it took was lost.
			return false
		}
		k.failure = &callFailure{call: f.call, at: now, err: fmt.Errorf("no answer for %v: %w", now.Sub(f.start).Round(time.Millisecond), e)}
	default:
		k.failure = &callFailure{call: f.call, at: now, err: e}
	}
	k.armProbe()
	return false
}

// succeeded records a call answered at now, and reports whether the last call had
// failed. Called with mu held.
func (k *calls) succeeded(now time.Time) (back bool) {
	back = k.failure != nil
	k.answered, k.failure = now, nil
	return back
}

// armProbe arms a probe unless one is armed or running. Called with mu held.
func (k *calls) armProbe() {
	if k.probing || k.closed {
		return
	}
	k.probing = true
	k.probes.Add(1)
	k.timer = k.clock.AfterFunc(probeEvery, k.runProbe)
}

// runProbe makes one probe call, unless a call succeeded since the failure, and arms
// the next while calls keep failing. Its failure is not recorded: the failure that
// armed it says more.
func (k *calls) runProbe() {
	defer k.probes.Done()
	k.mu.Lock()
	if k.closed || k.failure == nil {
		k.probing = false
		k.mu.Unlock()
		return
	}
	k.mu.Unlock()
	ctx, cancel := context.WithTimeout(k.ctx, storeTimeout)
	err := k.probe(ctx)
	cancel()
	if k.probed(err) && k.back != nil {
		k.back()
	}
}

// probed records a probe's outcome, arms the next while calls keep failing, and
// reports whether the probe is a success after a failure.
func (k *calls) probed(err error) (back bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.probing = false
	if err == nil {
		return k.succeeded(k.clock.Now())
	}
	if k.failure != nil {
		k.armProbe()
	}
	return false
}

// close stops the probes, cancels a probe in progress and waits for it.
func (k *calls) close(context.Context) error {
	k.mu.Lock()
	k.closed = true
	if k.probing && k.timer.Stop() {
		k.probing = false
		k.probes.Done()
	}
	k.mu.Unlock()
	k.cancel()
	k.probes.Wait()
	return nil
}

// callState is what Health reads from calls.
type callState struct {
	answered time.Time
	call     string    // the call that failed or waits, empty when neither
	at       time.Time // when it failed, or when it was sent
	err      error
}

// state returns the calls' state now: the last call's failure, or else the oldest call
// that waited patience for an answer while the store answered nothing.
func (k *calls) state() callState {
	k.mu.Lock()
	defer k.mu.Unlock()
	s := callState{answered: k.answered}
	if f := k.failure; f != nil {
		s.call, s.at = f.call, f.at
		s.err = fmt.Errorf("pglock: store call %s failed: %w", f.call, f.err)
		return s
	}
	if e := k.inFlight.Front(); e != nil {
		f := e.Value.(*flight)
		if waited := k.clock.Now().Sub(f.start); waited >= f.patience && !k.answered.After(f.start.Add(f.patience)) {
			s.call, s.at = f.call, f.start
			s.err = fmt.Errorf("pglock: store call %s has had no answer for %v", f.call, waited.Round(time.Millisecond))
		}
	}
	return s
}

// watch returns a Store that records each call of store in k, with what store has
// beyond Store (a backend, a wantMarker): the parts of a client find them by type
// assertion, so the watched store has them exactly when store does
// (TestWatchedStoreKeepsTheCapabilities). The PostgreSQL stores have both, the memory
// store a backend, a type that embeds a Store neither.
func watch(store Store, k *calls) Store {
	w := watched{s: store, k: k}
	b, ok := store.(backend)
	if !ok {
		return &w
	}
	wb := watchedBackend{watched: w, b: b}
	if m, ok := store.(wantMarker); ok {
		return &watchedMarker{watchedBackend: wb, m: m}
	}
	return &wb
}

// unwatched returns the store that s watches, or s: for messages that name its type.
func unwatched(s Store) Store {
	if w, ok := s.(interface{ watchedStore() Store }); ok {
		return w.watchedStore()
	}
	return s
}

type watched struct {
	s Store
	k *calls
}

func (w watched) pglockStore() {}

func (w watched) watchedStore() Store { return w.s }

func (w watched) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (_ int64, _ bool, err error) {
	defer w.k.end(w.k.begin(ctx, "acquire", ttl, false), &err)
	return w.s.Acquire(ctx, key, owner, ttl)
}

func (w watched) Renew(ctx context.Context, key, owner string, ttl time.Duration) (_ bool, err error) {
	defer w.k.end(w.k.begin(ctx, "renew", ttl, false), &err)
	return w.s.Renew(ctx, key, owner, ttl)
}

func (w watched) Release(ctx context.Context, key, owner string) (_ bool, err error) {
	defer w.k.end(w.k.begin(ctx, "release", 0, false), &err)
	return w.s.Release(ctx, key, owner)
}

// watchedBackend is a watched backend.
type watchedBackend struct {
	watched
	b backend
}

func (w watchedBackend) renewMany(ctx context.Context, keys, owners []string, ttl time.Duration) (_ []string, err error) {
	defer w.k.end(w.k.begin(ctx, "renew", ttl, false), &err)
	return w.b.renewMany(ctx, keys, owners, ttl)
}

func (w watchedBackend) holder(ctx context.Context, key string) (_ LockInfo, err error) {
	defer w.k.end(w.k.begin(ctx, "holder", 0, false), &err)
	return w.b.holder(ctx, key)
}

func (w watchedBackend) listLocks(ctx context.Context, prefix string) (_ []LockInfo, err error) {
	defer w.k.end(w.k.begin(ctx, "list locks", 0, false), &err)
	return w.b.listLocks(ctx, prefix)
}

func (w watchedBackend) semAcquire(ctx context.Context, key, owner string, ttl time.Duration, permits int) (_ int, _ int64, _ bool, err error) {
	defer w.k.end(w.k.begin(ctx, "acquire", ttl, false), &err)
	return w.b.semAcquire(ctx, key, owner, ttl, permits)
}

func (w watchedBackend) releaseMany(ctx context.Context, keys, owners []string) (_ []int, err error) {
	defer w.k.end(w.k.begin(ctx, "release", 0, false), &err)
	return w.b.releaseMany(ctx, keys, owners)
}

func (w watchedBackend) forceRelease(ctx context.Context, key string) (_ LockInfo, err error) {
	defer w.k.end(w.k.begin(ctx, "force release", 0, true), &err) // waits for open fenced transactions
	return w.b.forceRelease(ctx, key)
}

func (w watchedBackend) prune(ctx context.Context, olderThan time.Duration, limit int) (_ int64, err error) {
	defer w.k.end(w.k.begin(ctx, "prune", 0, false), &err)
	return w.b.prune(ctx, olderThan, limit)
}

func (w watchedBackend) recordRun(ctx context.Context, r runRecord, retention time.Duration) (err error) {
	defer w.k.end(w.k.begin(ctx, "record run", 0, false), &err)
	return w.b.recordRun(ctx, r, retention)
}

func (w watchedBackend) recordSkips(ctx context.Context, instance string, skips []skipCount, retention time.Duration) (err error) {
	defer w.k.end(w.k.begin(ctx, "record skips", 0, false), &err)
	return w.b.recordSkips(ctx, instance, skips, retention)
}

func (w watchedBackend) jobRuns(ctx context.Context, job string, limit int) (_ []JobRun, err error) {
	defer w.k.end(w.k.begin(ctx, "job runs", 0, false), &err)
	return w.b.jobRuns(ctx, job, limit)
}

func (w watchedBackend) jobStatuses(ctx context.Context) (_ []JobStatus, err error) {
	defer w.k.end(w.k.begin(ctx, "job statuses", 0, false), &err)
	return w.b.jobStatuses(ctx)
}

func (w watchedBackend) queueAcquire(ctx context.Context, t target, owner string, ttl time.Duration) (_ int, _, _ int64, _ int, err error) {
	defer w.k.end(w.k.begin(ctx, "acquire", ttl, false), &err)
	return w.b.queueAcquire(ctx, t, owner, ttl)
}

func (w watchedBackend) queuePoll(ctx context.Context, key string, ticket int64) (_ int, _ int64, _ bool, _ int, err error) {
	defer w.k.end(w.k.begin(ctx, "queue poll", 0, false), &err)
	return w.b.queuePoll(ctx, key, ticket)
}

func (w watchedBackend) queueLeave(ctx context.Context, key string, ticket int64) (_ bool, err error) {
	defer w.k.end(w.k.begin(ctx, "queue leave", 0, false), &err)
	return w.b.queueLeave(ctx, key, ticket)
}

func (w watchedBackend) registryTouch(ctx context.Context, kind string, keys []string, instance string, registering bool) (err error) {
	defer w.k.end(w.k.begin(ctx, "register", 0, false), &err)
	return w.b.registryTouch(ctx, kind, keys, instance, registering)
}

func (w watchedBackend) registryClose(ctx context.Context, kind string, keys []string, instance string) (err error) {
	defer w.k.end(w.k.begin(ctx, "unregister", 0, false), &err)
	return w.b.registryClose(ctx, kind, keys, instance)
}

func (w watchedBackend) registrations(ctx context.Context, kind string) (_ []registryRow, err error) {
	defer w.k.end(w.k.begin(ctx, "registrations", 0, false), &err)
	return w.b.registrations(ctx, kind)
}

func (w watchedBackend) elections(ctx context.Context) (_ []LockInfo, err error) {
	defer w.k.end(w.k.begin(ctx, "elections", 0, false), &err)
	return w.b.elections(ctx)
}

// watchedMarker is a watched backend that marks keys wanted: a PostgreSQL store's.
type watchedMarker struct {
	watchedBackend
	m wantMarker
}

func (w watchedMarker) markWanted(ctx context.Context, key string) (_ bool, err error) {
	defer w.k.end(w.k.begin(ctx, "want", 0, false), &err)
	return w.m.markWanted(ctx, key)
}

func (w watchedMarker) acquireOrWant(ctx context.Context, key, owner string, ttl time.Duration) (_ int64, _, _ bool, err error) {
	defer w.k.end(w.k.begin(ctx, "acquire", ttl, false), &err)
	return w.m.acquireOrWant(ctx, key, owner, ttl)
}

func (w watchedMarker) semWant(ctx context.Context, key string, permits int) (_ bool, err error) {
	defer w.k.end(w.k.begin(ctx, "want", 0, false), &err)
	return w.m.semWant(ctx, key, permits)
}

// renewerStore is the renewer's way to the store: the watched store, or, when the
// renewals have connections of their own, those, watched too.
func (c *Client) renewerStore(store Store) renewer.Store {
	if c.renewals.active() {
		return watchedRenewals{c.renewals, c.health.calls}
	}
	if b, ok := store.(backend); ok {
		return batchRenewals{b}
	}
	return store
}

// batchRenewals is a backend as the renewer takes it: a renewer.BatchStore.
type batchRenewals struct{ backend }

func (b batchRenewals) RenewMany(ctx context.Context, keys, owners []string, ttl time.Duration) ([]string, error) {
	return b.renewMany(ctx, keys, owners, ttl)
}

type watchedRenewals struct {
	r *renewals
	k *calls
}

func (w watchedRenewals) Renew(ctx context.Context, key, owner string, ttl time.Duration) (_ bool, err error) {
	defer w.k.end(w.k.begin(ctx, "renew", ttl, false), &err)
	return w.r.Renew(ctx, key, owner, ttl)
}

func (w watchedRenewals) Release(ctx context.Context, key, owner string) (_ bool, err error) {
	defer w.k.end(w.k.begin(ctx, "release", 0, false), &err)
	return w.r.Release(ctx, key, owner)
}

func (w watchedRenewals) releaseMany(ctx context.Context, keys, owners []string) (_ []int, err error) {
	defer w.k.end(w.k.begin(ctx, "release", 0, false), &err)
	return w.r.releaseMany(ctx, keys, owners)
}

func (w watchedRenewals) RenewMany(ctx context.Context, keys, owners []string, ttl time.Duration) (_ []string, err error) {
	defer w.k.end(w.k.begin(ctx, "renew", ttl, false), &err)
	return w.r.RenewMany(ctx, keys, owners, ttl)
}
