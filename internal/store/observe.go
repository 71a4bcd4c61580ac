package store

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Every store call a Client makes goes through an observed store (Observe), which records its
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

// Calls is what an observed store records for Health: the last answer, the last
// failure, and the calls waiting for an answer, oldest first. It is safe for concurrent
// use.
type Calls struct {
	now       func() time.Time
	afterFunc func(d time.Duration, f func()) (stop func() bool)
	patience  time.Duration // how long a call may wait for an answer before the client is unready
	probe     func(ctx context.Context) error
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
	stop     func() bool  // the armed probe's
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
	elem     *list.Element // in Calls.inFlight; nil for a call that may wait long
}

// Config is what Observe needs of a Client.
type Config struct {
	// Now and AfterFunc are the client's clock's (AfterFunc returns its timer's Stop).
	Now       func() time.Time
	AfterFunc func(d time.Duration, f func()) (stop func() bool)
	// Patience is how long a call may wait for an answer before the client is unready.
	Patience time.Duration
	// Instance is the client's instance name: the probe's owner is Instance+"/health-probe".
	Instance string
	// Back is called, without a lock held, when a call succeeds after a failure.
	Back func()
}

// Observe returns store with every call recorded in the Calls it returns, which feed
// Health; the observed store is a Wanter when store is one. A probe runs at most once a
// second while the last call failed, until one succeeds or Close.
func Observe(store Store, cfg Config) (Store, *Calls) {
	k := &Calls{now: cfg.Now, afterFunc: cfg.AfterFunc, patience: cfg.Patience, back: cfg.Back}
	k.ctx, k.cancel = context.WithCancel(context.Background())
	w := watch(store, k)
	k.probe = func(ctx context.Context) error {
		_, err := store.Renew(ctx, probeKey, cfg.Instance+"/health-probe", time.Second)
		return err
	}
	return w, k
}

// begin records the start of a call named call. A call that may wait long for a good
// reason (a force-release waits for open fenced transactions) is not counted as
// waiting.
func (k *Calls) begin(ctx context.Context, call string, ttl time.Duration, mayWait bool) *flight {
	f := &flight{ctx: ctx, call: call, patience: k.patience}
	if ttl > 0 {
		f.patience = min(f.patience, ttl/2)
	}
	k.mu.Lock()
	f.start = k.now()
	if !mayWait {
		f.elem = k.inFlight.PushBack(f)
	}
	k.mu.Unlock()
	if m := sendMarkOf(ctx); m != nil && m.Abandon != nil {
		m.calls, m.flight = k, f // a call abandoned in flight ends on the goroutine that reads its reply
	}
	return f
}

// end records the outcome of f: *err is the call's error.
func (k *Calls) end(f *flight, err *error) {
	if k.record(f, *err) && k.back != nil {
		k.back()
	}
}

// record records the outcome of f, and reports whether it is a success after a failure.
func (k *Calls) record(f *flight, e error) (back bool) {
	if errors.Is(e, ErrAbandoned) {
		// The caller gave up; the call stays in flight until the goroutine that reads
		// its reply ends it with its outcome (SendMark), which may have come already.
		return false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	now := k.now()
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
func (k *Calls) succeeded(now time.Time) (back bool) {
	back = k.failure != nil
	k.answered, k.failure = now, nil
	return back
}

// armProbe arms a probe unless one is armed or running. Called with mu held.
func (k *Calls) armProbe() {
	if k.probing || k.closed {
		return
	}
	k.probing = true
	k.probes.Add(1)
	k.stop = k.afterFunc(probeEvery, k.runProbe)
}

// runProbe makes one probe call, unless a call succeeded since the failure, and arms
// the next while calls keep failing. Its failure is not recorded: the failure that
// armed it says more.
func (k *Calls) runProbe() {
	defer k.probes.Done()
	k.mu.Lock()
	if k.closed || k.failure == nil {
		k.probing = false
		k.mu.Unlock()
		return
	}
	k.mu.Unlock()
	ctx, cancel := context.WithTimeout(k.ctx, Timeout)
	err := k.probe(ctx)
	cancel()
	if k.probed(err) && k.back != nil {
		k.back()
	}
}

// probed records a probe's outcome, arms the next while calls keep failing, and
// reports whether the probe is a success after a failure.
func (k *Calls) probed(err error) (back bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.probing = false
	if err == nil {
		return k.succeeded(k.now())
	}
	if k.failure != nil {
		k.armProbe()
	}
	return false
}

// Close stops the probes, cancels a probe in progress and waits for it.
func (k *Calls) Close(context.Context) error {
	k.mu.Lock()
	k.closed = true
	if k.probing && k.stop() {
		k.probing = false
		k.probes.Done()
	}
	k.mu.Unlock()
	k.cancel()
	k.probes.Wait()
	return nil
}

// CallState is what Health reads from Calls.
type CallState struct {
	Answered time.Time
	Call     string    // the call that failed or waits, empty when neither
	At       time.Time // when it failed, or when it was sent
	Err      error
}

// State returns the calls' state now: the last call's failure, or else the oldest call
// that waited patience for an answer while the store answered nothing.
func (k *Calls) State() CallState {
	k.mu.Lock()
	defer k.mu.Unlock()
	s := CallState{Answered: k.answered}
	if f := k.failure; f != nil {
		s.Call, s.At = f.call, f.at
		s.Err = fmt.Errorf("pglock: store call %s failed: %w", f.call, f.err)
		return s
	}
	if e := k.inFlight.Front(); e != nil {
		f := e.Value.(*flight)
		if waited := k.now().Sub(f.start); waited >= f.patience && !k.answered.After(f.start.Add(f.patience)) {
			s.Call, s.At = f.call, f.start
			s.Err = fmt.Errorf("pglock: store call %s has had no answer for %v", f.call, waited.Round(time.Millisecond))
		}
	}
	return s
}

// watch returns a Store that records each call of store in k, a Wanter when store is
// one: the parts of a client find it by type assertion, so the watched store has it
// exactly when store does (TestObserveForwardsEveryCall). The PostgreSQL stores have it,
// the memory store not.
func watch(store Store, k *Calls) Store {
	w := watched{s: store, k: k}
	if m, ok := store.(Wanter); ok {
		return &watchedMarker{watched: w, m: m}
	}
	return &w
}

// Unobserved returns the store that s observes, or s: for its optional capabilities
// (Slots) and its type.
func Unobserved(s Store) Store {
	if w, ok := s.(interface{ watchedStore() Store }); ok {
		return w.watchedStore()
	}
	return s
}

type watched struct {
	s Store
	k *Calls
}

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

func (w watched) RenewMany(ctx context.Context, keys, owners []string, ttl time.Duration) (_ []string, err error) {
	defer w.k.end(w.k.begin(ctx, "renew", ttl, false), &err)
	return w.s.RenewMany(ctx, keys, owners, ttl)
}

func (w watched) Holder(ctx context.Context, key string) (_ LockInfo, err error) {
	defer w.k.end(w.k.begin(ctx, "holder", 0, false), &err)
	return w.s.Holder(ctx, key)
}

func (w watched) ListLocks(ctx context.Context, prefix string) (_ []LockInfo, err error) {
	defer w.k.end(w.k.begin(ctx, "list locks", 0, false), &err)
	return w.s.ListLocks(ctx, prefix)
}

func (w watched) SemAcquire(ctx context.Context, key, owner string, ttl time.Duration, permits int) (_ int, _ int64, _ bool, err error) {
	defer w.k.end(w.k.begin(ctx, "acquire", ttl, false), &err)
	return w.s.SemAcquire(ctx, key, owner, ttl, permits)
}

func (w watched) ReleaseMany(ctx context.Context, keys, owners []string) (_ []int, err error) {
	defer w.k.end(w.k.begin(ctx, "release", 0, false), &err)
	return w.s.ReleaseMany(ctx, keys, owners)
}

func (w watched) ForceRelease(ctx context.Context, key string) (_ LockInfo, err error) {
	defer w.k.end(w.k.begin(ctx, "force release", 0, true), &err) // waits for open fenced transactions
	return w.s.ForceRelease(ctx, key)
}

func (w watched) Prune(ctx context.Context, olderThan time.Duration, limit int) (_ int64, err error) {
	defer w.k.end(w.k.begin(ctx, "prune", 0, false), &err)
	return w.s.Prune(ctx, olderThan, limit)
}

func (w watched) RecordRun(ctx context.Context, r RunRecord, retention time.Duration) (err error) {
	defer w.k.end(w.k.begin(ctx, "record run", 0, false), &err)
	return w.s.RecordRun(ctx, r, retention)
}

func (w watched) RecordSkips(ctx context.Context, instance string, skips []SkipCount, retention time.Duration) (err error) {
	defer w.k.end(w.k.begin(ctx, "record skips", 0, false), &err)
	return w.s.RecordSkips(ctx, instance, skips, retention)
}

func (w watched) JobRuns(ctx context.Context, job string, limit int) (_ []JobRun, err error) {
	defer w.k.end(w.k.begin(ctx, "job runs", 0, false), &err)
	return w.s.JobRuns(ctx, job, limit)
}

func (w watched) JobStatuses(ctx context.Context) (_ []JobStatus, err error) {
	defer w.k.end(w.k.begin(ctx, "job statuses", 0, false), &err)
	return w.s.JobStatuses(ctx)
}

func (w watched) QueueAcquire(ctx context.Context, t Target, owner string, ttl time.Duration) (_ int, _, _ int64, _ int, err error) {
	defer w.k.end(w.k.begin(ctx, "acquire", ttl, false), &err)
	return w.s.QueueAcquire(ctx, t, owner, ttl)
}

func (w watched) QueuePoll(ctx context.Context, key string, ticket int64) (_ int, _ int64, _ bool, _ int, err error) {
	defer w.k.end(w.k.begin(ctx, "queue poll", 0, false), &err)
	return w.s.QueuePoll(ctx, key, ticket)
}

func (w watched) QueueLeave(ctx context.Context, key string, ticket int64) (_ bool, err error) {
	defer w.k.end(w.k.begin(ctx, "queue leave", 0, false), &err)
	return w.s.QueueLeave(ctx, key, ticket)
}

func (w watched) RegistryTouch(ctx context.Context, kind string, keys []string, instance string, registering bool) (err error) {
	defer w.k.end(w.k.begin(ctx, "register", 0, false), &err)
	return w.s.RegistryTouch(ctx, kind, keys, instance, registering)
}

func (w watched) RegistryClose(ctx context.Context, kind string, keys []string, instance string) (err error) {
	defer w.k.end(w.k.begin(ctx, "unregister", 0, false), &err)
	return w.s.RegistryClose(ctx, kind, keys, instance)
}

func (w watched) Registrations(ctx context.Context, kind string) (_ []RegistryRow, err error) {
	defer w.k.end(w.k.begin(ctx, "registrations", 0, false), &err)
	return w.s.Registrations(ctx, kind)
}

func (w watched) Elections(ctx context.Context) (_ []LockInfo, err error) {
	defer w.k.end(w.k.begin(ctx, "elections", 0, false), &err)
	return w.s.Elections(ctx)
}

// watchedMarker is a watched store that marks keys wanted: a PostgreSQL store's.
type watchedMarker struct {
	watched
	m Wanter
}

func (w watchedMarker) MarkWanted(ctx context.Context, key string) (_ bool, err error) {
	defer w.k.end(w.k.begin(ctx, "want", 0, false), &err)
	return w.m.MarkWanted(ctx, key)
}

func (w watchedMarker) AcquireOrWant(ctx context.Context, key, owner string, ttl time.Duration) (_ int64, _, _ bool, err error) {
	defer w.k.end(w.k.begin(ctx, "acquire", ttl, false), &err)
	return w.m.AcquireOrWant(ctx, key, owner, ttl)
}

func (w watchedMarker) SemWant(ctx context.Context, key string, permits int) (_ bool, err error) {
	defer w.k.end(w.k.begin(ctx, "want", 0, false), &err)
	return w.m.SemWant(ctx, key, permits)
}

// ObserveRenewals returns r with every call recorded in k, as Observe's store.
func ObserveRenewals(r *Renewals, k *Calls) ObservedRenewals { return ObservedRenewals{r, k} }

// ObservedRenewals is the way of a Client's renewer, releases and hand-backs to the
// store when its renewals have connections of their own (Renewals.Active), observed.
type ObservedRenewals struct {
	r *Renewals
	k *Calls
}

// Renew renews through the renewals, recorded.
func (w ObservedRenewals) Renew(ctx context.Context, key, owner string, ttl time.Duration) (_ bool, err error) {
	defer w.k.end(w.k.begin(ctx, "renew", ttl, false), &err)
	return w.r.Renew(ctx, key, owner, ttl)
}

// Release releases through the renewals, recorded.
func (w ObservedRenewals) Release(ctx context.Context, key, owner string) (_ bool, err error) {
	defer w.k.end(w.k.begin(ctx, "release", 0, false), &err)
	return w.r.Release(ctx, key, owner)
}

// ReleaseMany releases many keys through the renewals, recorded.
func (w ObservedRenewals) ReleaseMany(ctx context.Context, keys, owners []string) (_ []int, err error) {
	defer w.k.end(w.k.begin(ctx, "release", 0, false), &err)
	return w.r.ReleaseMany(ctx, keys, owners)
}

// RenewMany renews many locks through the renewals, recorded.
func (w ObservedRenewals) RenewMany(ctx context.Context, keys, owners []string, ttl time.Duration) (_ []string, err error) {
	defer w.k.end(w.k.begin(ctx, "renew", ttl, false), &err)
	return w.r.RenewMany(ctx, keys, owners, ttl)
}
