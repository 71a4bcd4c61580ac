package pglock

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pglock/internal/handback"
	"github.com/pgfence/pglock/internal/renewer"
	"github.com/pgfence/pglock/internal/store"
)

// Client takes, renews and releases locks for one instance of an application. Create
// it with New (PostgreSQL) or NewWithStore, and Close it at shutdown so that every
// lock it holds is handed back at once rather than left to expire. It is safe for
// concurrent use.
type Client struct {
	store    store.Store // observed: every call feeds Health
	clock    Clock
	logger   *slog.Logger
	ttl      time.Duration
	instance string
	renewer  *renewer.Renewer
	renewals *store.Renewals                                            // the renewer's way to the store
	release  func(ctx context.Context, key, owner string) (bool, error) // a Release's way: the renewals', else the store's
	events   *events
	listener *listener       // wakes waiters when their key is released
	history  *store.History  // writes job runs and skips; nil when RunHistory is off
	registry *store.Registry // writes the jobs and elections registered
	health   health          // what Health reports
	timeline atomic.Int64    // the latest timeline of the server seen in a token (see laterTimeline)
	abandons bool            // the store makes acquisitions as store.SendMark.Abandon says (see acquireCall)

	mu       sync.Mutex
	closed   bool
	held     map[*Lock]struct{}
	sections map[*section]struct{} // code running under a lock: WithLock functions, job runs
	keys     map[string]string     // registered job and election keys: what each one is
	closers  []func(ctx context.Context) error

	handBacks *handback.Queue // releases of what failed acquisitions may have been granted
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
func NewWithStore(s *Store, opts ...ClientOption) (*Client, error) {
	if s == nil || s.s == nil {
		return nil, invalidArg("NewWithStore: nil store")
	}
	if err := store.Invalid(s.s); err != nil {
		return nil, err
	}
	return newClient(s, "NewWithStore", opts)
}

func newClient(s *Store, callName string, opts []ClientOption) (*Client, error) {
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
		clock:    cfg.clock,
		logger:   cfg.logger,
		ttl:      cfg.ttl,
		instance: cfg.instance,
		events:   newEvents(cfg.onEvent, cfg.logger),
		held:     make(map[*Lock]struct{}),
		sections: make(map[*section]struct{}),
		keys:     make(map[string]string),
	}
	st := c.watchStore(s.s) // every store call below feeds Health
	if cfg.listenOverride != nil {
		cfg.listen = cfg.listenOverride
	}
	if cfg.noListen {
		cfg.listen = nil
	}
	c.renewals = store.NewRenewals(s.s)
	c.abandons = store.CanAbandon(s.s)
	releaseMany, renewals := st.ReleaseMany, renewer.Store(st)
	c.release = st.Release
	if c.renewals.Active() {
		own := store.ObserveRenewals(c.renewals, c.health.calls)
		releaseMany, c.release, renewals = own.ReleaseMany, own.Release, own
	}
	c.handBacks = handback.New(handback.Config{ReleaseMany: releaseMany, Logger: cfg.logger})
	c.listener = newListener(cfg.listen, st, cfg.logger, c.connectionsBack)
	c.history = store.NewHistory(st, cfg.logger, cfg.instance, cfg.runRetention)
	c.registry = store.NewRegistry(st, cfg.logger, cfg.instance)
	c.onClose(c.listener.close)
	c.renewer = renewer.New(renewer.Config{
		Store: renewals,
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
		if err := store.WaitDone(ctx, s.done); err != nil {
			return err
		}
	}
	return nil
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

// emit queues ev, stamped with the time and, unless l is nil, the lock it is about.
func (c *Client) emit(ev Event, l *Lock) {
	ev.Time = c.clock.Now()
	if l != nil {
		ev.Permit, ev.Owner, ev.Token = l.permit, l.entry.Owner, l.token
	}
	c.health.count(ev.Type)
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
	errs = append(errs, c.handBacks.Close(ctx), c.history.Close(ctx), c.registry.Close(ctx), c.renewer.Close(ctx), c.renewals.Close(ctx), c.events.close(ctx))
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return errors.Join(errs...)
}

// detached returns ctx without its cancellation, with store.Timeout: for the calls that
// must reach the store even when the caller has given up (gocron hands tasks a ctx that
// is already cancelled at its shutdown).
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), store.Timeout)
}

// sleep waits d on the client's clock, or until ctx ends (returning its cause).
func (c *Client) sleep(ctx context.Context, d time.Duration) error {
	return c.sleepOrWake(ctx, d, nil)
}

// sleepOrWake is sleep that also returns, with nil, when wake fires (nil never does).
func (c *Client) sleepOrWake(ctx context.Context, d time.Duration, wake <-chan struct{}) error {
	done := make(chan struct{})
	t := c.clock.AfterFunc(d, func() { close(done) })
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-wake:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
