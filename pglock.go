package pglock

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pglock/internal/renewer"
)

// storeTimeout bounds the store calls a Client makes on a context detached from its
// caller's cancellation: releases (a lease's at Close too), the hand-backs of failed
// acquisitions, the run history's writes, Health's probes.
const storeTimeout = 5 * time.Second

// Client takes, renews and releases locks for one instance of an application. Create
// it with New (PostgreSQL) or NewWithStore, and Close it at shutdown so that every
// lock it holds is handed back at once rather than left to expire. It is safe for
// concurrent use.
type Client struct {
	store    Store
	clock    Clock
	logger   *slog.Logger
	ttl      time.Duration
	instance string
	renewer  *renewer.Renewer
	renewals *renewals                                                  // the renewer's way to the store
	release  func(ctx context.Context, key, owner string) (bool, error) // a Release's way: the renewals', else the store's
	events   *events
	listener *listener    // wakes waiters when their key is released
	history  *history     // writes job runs and skips; nil when RunHistory is off or the store keeps none
	registry *registry    // writes the jobs and elections registered; nil when the store keeps none
	health   health       // what Health reports
	timeline atomic.Int64 // the latest timeline of the server seen in a token (see laterTimeline)

	mu       sync.Mutex
	closed   bool
	held     map[*Lock]struct{}
	sections map[*section]struct{} // code running under a lock: WithLock functions, job runs
	keys     map[string]string     // registered job and election keys: what each one is
	closers  []func(ctx context.Context) error

	handBacks *handBacks // releases of what failed acquisitions may have been granted
}

// New returns a Client whose locks live in the PostgreSQL database of pool, which must
// have the pglock schema (see Migrate). The pool stays the caller's: close it after
// Client.Close. The client may open a few connections of its own from pool's
// configuration, for renewals and to listen for releases (see the package doc, # Renewals
// and releases and # Waking waiters). Errors wrap ErrInvalidArgument and name the option
// at fault.
func New(pool *pgxpool.Pool, opts ...ClientOption) (*Client, error) {
	if pool == nil {
		return nil, invalidArg("New: nil pool")
	}
	return newClient(NewPostgresStore(pool), "New", append([]ClientOption{listenOn(pool.Config().ConnConfig)}, opts...))
}

// NewWithStore returns a Client on store: one of NewPostgresStore or NewSQLStore, or
// NewMemoryStore for one process (tests). Errors wrap ErrInvalidArgument and name the
// option at fault.
func NewWithStore(store Store, opts ...ClientOption) (*Client, error) {
	if store == nil {
		return nil, invalidArg("NewWithStore: nil store")
	}
	if s, ok := store.(*postgresStore); ok && s.invalid != nil {
		return nil, s.invalid
	}
	return newClient(store, "NewWithStore", opts)
}

func newClient(store Store, callName string, opts []ClientOption) (*Client, error) {
	cfg := settings{ttl: DefaultTTL, runRetention: defaultRunRetention}
	if err := applyOptions(&cfg, callName, opts, ClientOption.clientOption); err != nil {
		return nil, err
	}
	if cfg.logger == nil {
		cfg.logger = slog.Default()
	}
	if cfg.clock == nil {
		cfg.clock = realClock{}
	}
	if cfg.instance == "" {
		cfg.instance = defaultInstanceName()
	}
	c := &Client{
		store:    store,
		clock:    cfg.clock,
		logger:   cfg.logger,
		ttl:      cfg.ttl,
		instance: cfg.instance,
		events:   newEvents(cfg.onEvent, cfg.logger),
		held:     make(map[*Lock]struct{}),
		sections: make(map[*section]struct{}),
		keys:     make(map[string]string),
	}
	raw := store
	store = c.watchStore(store) // every store call below feeds Health
	if cfg.listenOverride != nil {
		cfg.listen = cfg.listenOverride
	}
	if cfg.noListen {
		cfg.listen = nil
	}
	c.renewals = newRenewals(raw)
	c.handBacks = newHandBacks(store, cfg.logger)
	c.release = store.Release
	if c.renewals.active() {
		c.handBacks.many = watchedRenewals{c.renewals, c.health.calls}.releaseMany
		c.release = watchedRenewals{c.renewals, c.health.calls}.Release
	}
	c.listener = newListener(cfg.listen, store, cfg.logger, c.connectionsBack)
	c.history = newHistory(store, cfg.logger, cfg.instance, cfg.runRetention)
	c.registry = newRegistry(store, cfg.logger, cfg.instance)
	c.onClose(c.listener.close)
	c.renewer = renewer.New(renewer.Config{
		Store: c.renewerStore(store),
		Now:   cfg.clock.Now,
		AfterFunc: func(d time.Duration, f func()) func() bool {
			return cfg.clock.AfterFunc(d, f).Stop
		},
		Logger:  cfg.logger,
		Observe: c.observeRenewal,
	})
	return c, nil
}

// connectionsBack is called when the client's connections come back after they were
// cut: a store call succeeds after a failure, or the listener reconnects. They may have
// come back to another server, a standby promoted in a failover, which may have lost
// the last commits of the old primary, and with them locks this client holds (with
// asynchronous replication). So the client confirms every lock it holds at once (see
// reconfirm).
func (c *Client) connectionsBack() { c.reconfirm(c.clock.Now()) }

// reconfirm renews at once, in one round, every lock held whose last renewal was sent
// before before, instead of at its next renewal (up to a third of its ttl later): a lock
// the store lost is then found lost within a round trip, and its holder stops. And the
// listener, if it is down, reconnects now rather than after its backoff. It is called
// when the store may have lost locks: when the client's connections come back
// (connectionsBack), and when a lock is granted on a later timeline of the server than
// any before (laterTimeline). A refused renewal does the same within the renewer.
func (c *Client) reconfirm(before time.Time) {
	c.renewer.Confirm(before)
	c.listener.retryNow()
}

// timelineShift is where a token carries the timeline of the server that issued it: a
// token issued on timeline t is at least (t-1) << timelineShift
// (migrations/000012_timeline_tokens.up.sql).
const timelineShift = 40

// laterTimeline records the timeline of the server that issued token, and reports
// whether it is later than every timeline seen before: the server was promoted since
// (a failover, or a restore to a point in time), and locks granted before may be lost.
func (c *Client) laterTimeline(token int64) bool {
	tl := token >> timelineShift
	for {
		seen := c.timeline.Load()
		if tl <= seen {
			return false
		}
		if c.timeline.CompareAndSwap(seen, tl) {
			return true
		}
	}
}

// section is code that runs under a lock: a WithLock function or a job's run. Close
// cancels its ctx with ErrClosed and waits for it to return before handing any lock
// back, so that a key never changes hands while the code holding it still runs.
type section struct {
	cancel context.CancelCauseFunc
	done   chan struct{}
}

// enter starts a section on a child of ctx, or returns ErrClosed once Close has begun.
func (c *Client) enter(ctx context.Context) (context.Context, *section, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	s := &section{cancel: cancel, done: make(chan struct{})}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		cancel(ErrClosed)
		return nil, nil, ErrClosed
	}
	c.sections[s] = struct{}{}
	return ctx, s, nil
}

// leave ends a section that enter started.
func (c *Client) leave(s *section) {
	c.mu.Lock()
	delete(c.sections, s)
	c.mu.Unlock()
	s.cancel(context.Canceled)
	close(s.done)
}

// waitSections waits for every section of ss to return, or for ctx to end.
func waitSections(ctx context.Context, ss []*section) error {
	for _, s := range ss {
		if err := waitDone(ctx, s.done); err != nil {
			return err
		}
	}
	return nil
}

// waitDone waits until done is closed, or until ctx ends (returning its cause); done
// wins when both are.
func waitDone(ctx context.Context, done <-chan struct{}) error {
	select {
	case <-done:
		return nil
	default:
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func (c *Client) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

func (c *Client) forget(l *Lock) {
	c.mu.Lock()
	delete(c.held, l)
	c.mu.Unlock()
}

// emit queues an event about key: a lock's key, or a job's. l is the lock it is about
// or ran under, nil for a skipped tick.
func (c *Client) emit(t EventType, key string, l *Lock, reason Reason, err error) {
	ev := Event{Type: t, Key: key, Reason: reason, Err: err, Time: c.clock.Now()}
	if l != nil {
		ev.Permit, ev.Owner, ev.Token = l.permit, l.entry.Owner, l.token
	}
	c.health.count(t)
	c.events.emit(ev)
}

// register reserves keys for a job or an election (what describes it in errors), so
// that two of them can never exclude each other silently. It fails, naming both, when
// one of keys is taken.
func (c *Client) register(what string, keys ...string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	for _, k := range keys {
		if other, ok := c.keys[k]; ok {
			return invalidArg("%s: key %q is already used by %s", what, k, other)
		}
	}
	for _, k := range keys {
		c.keys[k] = what
	}
	return nil
}

// unregister frees keys that register reserved, for a job or an election that ended.
func (c *Client) unregister(keys ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range keys {
		delete(c.keys, k)
	}
}

// onClose adds a step to Close, run beside the other steps and before the client's
// remaining locks are released.
func (c *Client) onClose(f func(ctx context.Context) error) {
	c.mu.Lock()
	c.closers = append(c.closers, f)
	c.mu.Unlock()
}

// Close shuts the client down. It refuses new work, cancels every WithLock function, job
// run and leader's OnAcquired with ErrClosed as the cause, waits for each to return, and
// only then hands the locks back; locks taken with TryAcquire or Acquire have their
// Context cancelled with ErrClosed and are released. ctx bounds the whole: when it ends
// first, Close returns ctx's cause and the locks not yet handed back expire after their
// ttl. Calling Close again returns nil. See the package doc, # Shutdown.
func (c *Client) Close(ctx context.Context) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	closers := c.closers
	sections := make([]*section, 0, len(c.sections))
	for s := range c.sections {
		sections = append(sections, s)
	}
	c.mu.Unlock()
	for _, s := range sections {
		s.cancel(ErrClosed)
	}

	// Jobs, elections and sections shut down side by side: a leader's step-down must
	// not wait behind a job lease kept for the rest of its second.
	errs := make([]error, len(closers)+1)
	var wg sync.WaitGroup
	for i, f := range closers {
		wg.Go(func() { errs[i] = f(ctx) })
	}
	wg.Go(func() { errs[len(closers)] = waitSections(ctx, sections) })
	wg.Wait()
	c.mu.Lock()
	locks := make([]*Lock, 0, len(c.held))
	for l := range c.held {
		locks = append(locks, l)
	}
	c.mu.Unlock()
	for _, l := range locks {
		if ctx.Err() != nil {
			l.abandon() // no longer renewed: it expires in the store after its ttl
			continue
		}
		l.cancel(ErrClosed)
		if err := l.Release(ctx); err != nil && !errors.Is(err, ErrLockLost) && !errors.Is(err, ErrClosed) {
			errs = append(errs, err)
		}
	}
	errs = append(errs, c.handBacks.close(ctx), c.history.close(ctx), c.registry.close(ctx), c.renewer.Close(ctx), c.renewals.close(ctx), c.events.close(ctx))
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return errors.Join(errs...)
}

// maxHandBacks caps the hand-backs a Client keeps pending. Past it, what a failed
// acquisition may have been granted is left to expire after its ttl (logged at Warn):
// a flood of failures (an outage, a crowd whose ctxs end) must not become a flood of
// releases.
const maxHandBacks = 1024

// handBackRetries are the pauses, on the real clock, between the releases of a failed
// acquisition that found nothing to release: about the time a statement can take to
// reach the server and commit there, when the link or the server is slow. A call that
// fails counts as a try too.
var handBackRetries = []time.Duration{20 * time.Millisecond, 100 * time.Millisecond, 500 * time.Millisecond, 2 * time.Second}

// maxHandBackPause bounds the pause of every pending hand-back after a release call
// failed: while the store is away, a Client makes at most one release call per pause.
const maxHandBackPause = 2 * time.Second

// handBacks releases, in the background, what failed acquisitions may have been granted
// (see undoAcquire). They are bounded for the whole Client: one goroutine, running while
// any is pending, makes one release call at a time, which hands back every one that is
// due (up to maxReleaseMany: over a slow link, one call per hand-back in a row made
// the last ones later than their ttl); each (key, owner) is pending once,
// at most maxHandBacks of them, each released up to 1+len(handBackRetries) times while
// nothing is found; a failed call pauses them all (doubling up to maxHandBackPause),
// so that an unreachable store sees about one connection attempt per pause. On a
// *pgxpool.Pool, the calls go as renewals do (renewals.releaseMany), never behind the
// application's use of the pool. Close gives
// each one last release at once and waits (a failed call then drops the rest, which
// expire after their ttl); when Close's ctx ends first, the call in flight is cancelled.
type handBacks struct {
	store  Store
	many   func(ctx context.Context, keys, owners []string) ([]int, error) // else the store's releaseMany
	logger *slog.Logger
	ctx    context.Context // the release calls'; cancelled when Close stops waiting
	cancel context.CancelFunc

	mu      sync.Mutex
	pending map[handBackID]*handBack
	wake    chan struct{} // a new hand-back or Close, for the worker
	idle    chan struct{} // closed when the running worker ends; nil when none runs
	closing bool          // Close began: one last release each; none waits once the worker ends

	awaiting sync.WaitGroup // abandoned acquisitions waiting for their replies (undoAbandoned)
}

type handBackID struct{ key, owner string }

type handBack struct {
	tries int       // release calls made
	next  time.Time // when the next is due, on the real clock
}

func newHandBacks(store Store, logger *slog.Logger) *handBacks {
	ctx, cancel := context.WithCancel(context.Background())
	return &handBacks{store: store, logger: logger, ctx: ctx, cancel: cancel,
		pending: make(map[handBackID]*handBack), wake: make(chan struct{}, 1)}
}

// undoAcquire releases key for owner, drawn by an acquisition that failed after its
// call may have reached the store (or whose grant came too late, or was bad), so that
// the key is not left to an owner nobody knows for a whole ttl. The acquisition may
// reach the server, or commit, only after a release has found nothing, so a release
// that finds nothing is tried again (see handBacks). Best effort: an acquisition that
// commits later still expires after its ttl. It does not wait, except once Close has
// stopped the hand-backs: then it makes one release call itself.
func (c *Client) undoAcquire(key, owner string, ttl time.Duration) {
	h := c.handBacks
	id := handBackID{key, owner}
	h.mu.Lock()
	switch {
	case h.closing && h.idle == nil:
		h.mu.Unlock()
		ctx, cancel := detached(context.Background())
		defer cancel()
		_, _ = h.release(ctx, []handBackID{id})
		return
	case h.pending[id] != nil:
		h.mu.Unlock()
		return
	case len(h.pending) >= maxHandBacks:
		h.mu.Unlock()
		h.logger.Warn("pglock: too many hand-backs pending; the lock may stay held until its ttl",
			slog.String("key", key), slog.String("owner", owner), slog.Duration("ttl", ttl))
		return
	}
	h.pending[id] = &handBack{next: time.Now()}
	if h.idle == nil {
		h.idle = make(chan struct{})
		go h.run(h.idle)
	}
	h.mu.Unlock()
	h.poke()
}

// release hands ids back in one call (a backend's releaseMany; a Store that embeds
// another has no semaphores, and releases one key after another) and returns those it
// released.
func (h *handBacks) release(ctx context.Context, ids []handBackID) (map[handBackID]bool, error) {
	released := make(map[handBackID]bool, len(ids))
	many := h.many
	if b, ok := h.store.(backend); ok && many == nil {
		many = b.releaseMany
	}
	if many != nil {
		keys, owners := make([]string, len(ids)), make([]string, len(ids))
		for i, id := range ids {
			keys[i], owners[i] = id.key, id.owner
		}
		is, err := many(ctx, keys, owners)
		for _, i := range is {
			released[ids[i]] = true
		}
		return released, err
	}
	for _, id := range ids {
		ok, err := h.store.Release(ctx, id.key, id.owner)
		if err != nil {
			return released, err
		}
		released[id] = ok
	}
	return released, nil
}

func (h *handBacks) poke() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// run is the worker: it releases what is due, in one call, until nothing is pending,
// then closes idle.
func (h *handBacks) run(idle chan struct{}) {
	var pause time.Duration // after a failed call; zero after a good one
	var notBefore time.Time // no call before, after a failed one
	for {
		h.mu.Lock()
		if len(h.pending) == 0 || h.ctx.Err() != nil {
			clear(h.pending)
			h.idle = nil
			close(idle)
			h.mu.Unlock()
			return
		}
		closing := h.closing
		due := h.firstDue()
		if closing {
			due = time.Time{} // one last release each, at once
		} else if notBefore.After(due) {
			due = notBefore
		}
		if wait := time.Until(due); wait > 0 {
			h.mu.Unlock()
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-h.wake: // something new, maybe due earlier, or Close
			case <-h.ctx.Done():
			}
			t.Stop()
			continue
		}
		ids := h.due(closing)
		h.mu.Unlock()

		ctx, cancel := context.WithTimeout(h.ctx, storeTimeout)
		released, err := h.release(ctx, ids)
		cancel()
		now := time.Now()
		if err != nil {
			pause = min(max(2*pause, handBackRetries[0]), maxHandBackPause)
			notBefore = now.Add(pause)
		} else {
			pause = 0
		}

		h.mu.Lock()
		if closing && err != nil {
			h.logger.Debug("pglock: store unreachable at Close; failed acquisitions left to expire",
				slog.Int("locks", len(h.pending)), slog.Any("err", err))
			clear(h.pending)
		}
		for _, id := range ids {
			hb := h.pending[id]
			if hb == nil {
				continue
			}
			hb.tries++
			if released[id] || closing || hb.tries > len(handBackRetries) {
				delete(h.pending, id)
			} else {
				hb.next = now.Add(handBackRetries[hb.tries-1])
			}
		}
		h.mu.Unlock()
	}
}

// firstDue returns when the pending hand-back due first is due. Called with mu held,
// pending not empty.
func (h *handBacks) firstDue() time.Time {
	var first time.Time
	for _, hb := range h.pending {
		if first.IsZero() || hb.next.Before(first) {
			first = hb.next
		}
	}
	return first
}

// due returns the pending hand-backs that are due (all of them when closing), at most
// maxReleaseMany, those due first first. Called with mu held.
func (h *handBacks) due(closing bool) []handBackID {
	now := time.Now()
	var ids []handBackID
	for id, hb := range h.pending {
		if closing || !hb.next.After(now) {
			ids = append(ids, id)
		}
	}
	slices.SortFunc(ids, func(a, b handBackID) int { return h.pending[a].next.Compare(h.pending[b].next) })
	return ids[:min(len(ids), maxReleaseMany)]
}

// await counts an abandoned acquisition that Close must wait for, unless Close is
// handing back already (false).
func (h *handBacks) await() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closing {
		return false
	}
	h.awaiting.Add(1)
	return true
}

// close waits for the abandoned acquisitions' replies, then gives every pending
// hand-back its last release and waits for the worker, or for ctx to end: then it
// cancels the calls in flight, drops the rest and returns ctx's cause. Hand-backs that
// come later make their one release call in their caller.
func (h *handBacks) close(ctx context.Context) error {
	h.mu.Lock()
	h.closing = true
	h.mu.Unlock()
	replied := make(chan struct{})
	go func() {
		h.awaiting.Wait()
		close(replied)
	}()
	if err := waitDone(ctx, replied); err != nil {
		h.cancel() // their calls end, and so does the goroutine above
		return err
	}
	h.mu.Lock()
	idle := h.idle
	h.mu.Unlock()
	if idle == nil {
		return nil
	}
	h.poke()
	if err := waitDone(ctx, idle); err != nil {
		h.cancel()
		return err
	}
	return nil
}

// detached returns ctx without its cancellation, with storeTimeout: for the calls that
// must reach the store even when the caller has given up (gocron hands tasks a ctx that
// is already cancelled at its shutdown).
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), storeTimeout)
}

// releaseDetached hands key back for owner on a detached context, as a renewal is made
// (renewals.Release): a lock being released is no longer renewed, so a release queued
// behind the application's use of a busy pool (a service shutting down, its requests
// still running) would land after the expiry, and the next holder would wait for it.
// A failed call is tried once more: a pooled connection whose backend was terminated
// fails its next statement, and a lock left to expire would hold up the next holder for
// a whole ttl.
// released reports whether a call found the lock held by owner and released it; unsure,
// that the first call failed and the second found nothing: the first may have released
// it before failing, or the lock was gone already.
func (c *Client) releaseDetached(ctx context.Context, key, owner string) (released, unsure bool, err error) {
	ctx, cancel := detached(ctx)
	defer cancel()
	ok, err := c.release(ctx, key, owner)
	if err == nil || ctx.Err() != nil {
		return ok, false, err
	}
	if ok, err = c.release(ctx, key, owner); err != nil {
		return false, false, err
	}
	return ok, !ok, nil
}
