package pglock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pglock/internal/renewer"
)

// storeTimeout bounds the store calls a Client makes on a context detached from its
// caller's cancellation: releases, and the hand-back of leases at Close.
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
	events   *events
	listener *listener // wakes waiters when their key is released

	mu       sync.Mutex
	closed   bool
	held     map[*Lock]struct{}
	sections map[*section]struct{} // code running under a lock: WithLock functions, job runs
	keys     map[string]string     // registered job and election keys: what each one is
	closers  []func(ctx context.Context) error
	handing  sync.WaitGroup // hand-backs of failed acquisitions, in the background
	handed   bool           // Close no longer waits for them: they run in the caller
	closing  chan struct{}  // closed when Close begins
}

// New returns a Client whose locks live in the PostgreSQL database of pool, which must
// have the pglock schema (see Migrate). The pool stays the caller's: close it after
// Client.Close. Unless WithoutListener is set, waiting also listens for releases on a
// connection of its own, opened from the pool's configuration when first needed.
// Errors wrap ErrInvalidArgument and name the option at fault.
func New(pool *pgxpool.Pool, opts ...Option) (*Client, error) {
	if pool == nil {
		return nil, invalidArg("New: nil pool")
	}
	return NewWithStore(NewPostgresStore(pool), append([]Option{listenOn(pool.Config().ConnConfig)}, opts...)...)
}

// NewWithStore returns a Client on store: NewMemoryStore for one process, or a store of
// your own that passes pglocktest.TestStore. Errors wrap ErrInvalidArgument and name
// the option at fault.
func NewWithStore(store Store, opts ...Option) (*Client, error) {
	if store == nil {
		return nil, invalidArg("NewWithStore: nil store")
	}
	if s, ok := store.(*postgresStore); ok && s.invalid != nil {
		return nil, s.invalid
	}
	cfg := config{ttl: DefaultTTL}
	for _, opt := range opts {
		if opt == nil {
			return nil, invalidArg("nil Option")
		}
		if err := opt(&cfg); err != nil {
			return nil, err
		}
	}
	if cfg.logger == nil {
		cfg.logger = slog.Default()
	}
	if cfg.clock == nil {
		cfg.clock = RealClock{}
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
		closing:  make(chan struct{}),
		keys:     make(map[string]string),
	}
	if cfg.noListen {
		cfg.listen = nil
	}
	c.listener = newListener(cfg.listen, store, cfg.logger)
	c.onClose(c.listener.close)
	c.renewer = renewer.New(renewer.Config{
		Store: store,
		Now:   cfg.clock.Now,
		AfterFunc: func(d time.Duration, f func()) func() bool {
			return cfg.clock.AfterFunc(d, f).Stop
		},
		Logger: cfg.logger,
	})
	return c, nil
}

// TryAcquire makes one attempt to take key. It returns a *Lock, renewed in the
// background until Release or Close, or an error: ErrNotAcquired (errors.Is) when a
// live holder has the key (or when the store's confirmation came back only after the
// lock's ttl, so late that the lock cannot be trusted; it is handed back), ErrInvalidKey or ErrInvalidArgument for bad input,
// ErrClosed after Close, or the store's error. ctx bounds the store call only; the
// lock's own lifetime is Lock.Context.
func (c *Client) TryAcquire(ctx context.Context, key string, opts ...LockOption) (*Lock, error) {
	lc, err := c.lockConfig(key, opts)
	if err != nil {
		return nil, err
	}
	return c.try(ctx, key, lc.ttl)
}

// Acquire takes key, waiting while it is held: it retries with exponential backoff and
// jitter (polling at least every quarter of its ttl, so that a lock whose holder died
// is taken soon after it expires) until the key is free, until Wait(d) has passed on the client's clock (Wait(0)
// is one attempt), or until ctx ends. With a listener (a client of New, see
// WithoutListener), the key's release wakes it at once. Close ends the wait with
// ErrClosed. A key that stays held returns an error matching ErrNotAcquired (and, when
// ctx ended, ctx's cause too). Other errors are TryAcquire's.
func (c *Client) Acquire(ctx context.Context, key string, opts ...LockOption) (*Lock, error) {
	lc, err := c.lockConfig(key, opts)
	if err != nil {
		return nil, err
	}
	var deadline time.Time
	if lc.waitSet {
		deadline = c.clock.Now().Add(lc.wait)
	}
	w := c.listener.waiter(key)
	defer w.stop()
	// A lock that expires (its holder died) wakes no one: poll at least every ttl/4.
	maxBackoff := min(time.Second, max(lc.ttl/4, 5*time.Millisecond))
	backoff := 5 * time.Millisecond
	free := 0 // how many times in a row the key looked free
	for {
		l, err := c.try(ctx, key, lc.ttl)
		if !errors.Is(err, ErrNotAcquired) {
			return l, err
		}
		pause := jitter(backoff)
		if lc.waitSet {
			left := deadline.Sub(c.clock.Now())
			if left <= 0 {
				return nil, err
			}
			pause = min(pause, left)
		}
		backoff = min(backoff*2, maxBackoff)
		if !w.want(ctx) {
			if werr := freeAgain(ctx, &free, pause); werr != nil {
				return nil, fmt.Errorf("%w: %w", err, werr)
			}
			continue
		}
		free = 0
		if werr := c.sleepOrWake(ctx, pause, w.woken()); werr != nil {
			return nil, fmt.Errorf("%w: %w", err, werr)
		}
	}
}

// freeAgain is a waiter's step when marking its key found it free (released in
// between): try again now, not after the pause. A key can look free and still refuse
// the acquisition (an expired row that a fenced transaction keeps locked), so each
// further time in a row waits twice as long, from 1 ms up to limit, on the real clock:
// it must not spin, and a test's stopped clock must not park a waiter whose key is free.
func freeAgain(ctx context.Context, times *int, limit time.Duration) error {
	defer func() { *times++ }()
	if *times == 0 {
		return nil
	}
	t := time.NewTimer(min(time.Millisecond<<min(*times-1, 20), limit))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
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

// WithLock takes key as Acquire does, runs fn under the lock, and releases the lock when
// fn returns or panics. fn's ctx is cancelled when the caller's ctx ends, when the lock
// is lost (context.Cause is then a *LockLostError), or when Close begins (the cause is
// ErrClosed: Close waits for fn to return before it hands the key back, and when
// Close's own ctx ends first the key is not handed back but left to expire). Inside fn,
// pglock.FromContext(ctx) returns the lock, whose Token fences fn's writes. It returns
// Acquire's error, ErrClosed when Close began before fn could start, fn's error, or,
// when fn returned nil, a *LockLostError if the lock was lost before its release,
// ErrClosed if Close left it to expire, or the release's error.
func (c *Client) WithLock(ctx context.Context, key string, fn func(ctx context.Context) error, opts ...LockOption) (err error) {
	if fn == nil {
		return invalidArg("WithLock: nil fn")
	}
	l, err := c.Acquire(ctx, key, opts...)
	if err != nil {
		return err
	}
	lctx, stop := withLockContext(ctx, l)
	defer func() {
		stop()
		if rerr := l.Release(ctx); err == nil {
			err = rerr
		}
	}()
	fctx, s, err := c.enter(lctx)
	if err != nil {
		return err
	}
	defer c.leave(s)
	return fn(fctx)
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
		select {
		case <-s.done:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	return nil
}

func (c *Client) lockConfig(key string, opts []LockOption) (lockConfig, error) {
	if err := checkKey(key); err != nil {
		return lockConfig{ttl: c.ttl}, err
	}
	return c.lockOptions(opts)
}

// lockOptions applies opts over the client's defaults.
func (c *Client) lockOptions(opts []LockOption) (lockConfig, error) {
	lc := lockConfig{ttl: c.ttl}
	for _, opt := range opts {
		if opt == nil {
			return lc, invalidArg("nil LockOption")
		}
		if err := opt(&lc); err != nil {
			return lc, err
		}
	}
	return lc, nil
}

func (c *Client) try(ctx context.Context, key string, ttl time.Duration) (*Lock, error) {
	if c.isClosed() {
		return nil, ErrClosed
	}
	owner := c.instance + "/" + strconv.FormatUint(rand.Uint64(), 36)
	sentAt := c.clock.Now()
	token, ok, err := c.store.Acquire(ctx, key, owner, ttl)
	switch {
	case err != nil:
		if !errors.Is(err, ErrInvalidKey) && !errors.Is(err, ErrInvalidArgument) {
			// The statement may have been granted after ctx ended or the link failed:
			// never leave the key held by an owner nobody knows for a whole ttl.
			c.handBack(ctx, key, owner)
		}
		return nil, err
	case !ok:
		return nil, fmt.Errorf("%w: key %q is held", ErrNotAcquired, key)
	case token <= 0:
		// Hand it back rather than hold a lock that cannot fence anything.
		c.handBack(ctx, key, owner)
		return nil, fmt.Errorf("%w: %d for key %q", ErrInvalidToken, token, key)
	case !c.clock.Now().Before(renewer.Deadline(sentAt, ttl)):
		// The reply came so late (a partition, a stalled process) that the lock may
		// already be someone else's: it cannot be trusted for a moment.
		c.handBack(ctx, key, owner)
		return nil, fmt.Errorf("%w: key %q: the store's confirmation came after the lock's ttl", ErrNotAcquired, key)
	}
	l := &Lock{c: c, token: token, entry: renewer.Entry{Key: key, Owner: owner, TTL: ttl}}
	l.entry.Lost = l.lose
	l.ctx, l.cancel = context.WithCancelCause(context.WithValue(context.Background(), lockContextKey{}, l))

	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		c.handBack(ctx, key, owner)
		l.cancel(ErrClosed)
		return nil, ErrClosed
	}
	c.held[l] = struct{}{}
	c.mu.Unlock()
	c.renewer.Add(&l.entry, sentAt)
	c.logger.Debug("pglock: acquired lock", slog.String("key", key), slog.String("owner", owner),
		slog.Int64("token", token), slog.Duration("ttl", ttl))
	c.emit(EventAcquired, l, "")
	return l, nil
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

func (c *Client) emit(t EventType, l *Lock, reason string) {
	c.events.emit(Event{Type: t, Key: l.entry.Key, Owner: l.entry.Owner, Token: l.token, Reason: reason, Time: c.clock.Now()})
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

// Close shuts the client down. It refuses new acquisitions, runs and campaigns; cancels,
// with ErrClosed as the cause, every WithLock function, job run and leader's OnAcquired
// in progress, and waits for each to return; only then hands its lock back (a job's
// lease is kept for the rest of the second after its last run started: see Job).
// Locks the caller took with TryAcquire or Acquire and still holds have their Context
// cancelled with ErrClosed and are released. Then it stops its renewer and delivers the
// events still queued.
//
// Store calls run on a context detached from ctx's cancellation, with a timeout. ctx
// bounds the whole: when it ends first, Close stops waiting and returns ctx's cause,
// and every lock not yet handed back is no longer renewed and expires on the database
// clock after its ttl: a key is never handed back while code that holds it may still
// run. Calling Close again returns nil.
func (c *Client) Close(ctx context.Context) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.closing)
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
	errs = append(errs, c.waitHandBacks(ctx), c.renewer.Close(ctx), c.events.close(ctx))
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return errors.Join(errs...)
}

// handBack releases key for owner, an acquisition that failed after its call may have
// reached the store, in the background (Close waits for it) so that the caller, whose
// ctx may have ended, does not wait for it. The acquisition may reach the server, or
// commit, only after the first release has found nothing to release, so a release
// that finds nothing is tried again after handBackRetries, until Close begins (then
// once more at once). Best effort: an acquisition that commits later still expires
// after its ttl.
func (c *Client) handBack(ctx context.Context, key, owner string) {
	c.mu.Lock()
	if c.handed {
		c.mu.Unlock()
		_, _ = c.releaseDetached(ctx, key, owner)
		return
	}
	c.handing.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.handing.Done()
		for i := 0; ; i++ {
			if ok, _ := c.releaseDetached(ctx, key, owner); ok || i == len(handBackRetries) {
				return
			}
			t := time.NewTimer(handBackRetries[i])
			select {
			case <-t.C:
			case <-c.closing:
				t.Stop()
				_, _ = c.releaseDetached(ctx, key, owner)
				return
			}
		}
	}()
}

// handBackRetries are the pauses, on the real clock, between the releases of a failed
// acquisition that found nothing to release: about the time a statement can take to
// reach the server and commit there, when the link or the server is slow.
var handBackRetries = []time.Duration{20 * time.Millisecond, 100 * time.Millisecond, 500 * time.Millisecond, 2 * time.Second}

// waitHandBacks waits for the hand-backs in the background, or for ctx to end.
func (c *Client) waitHandBacks(ctx context.Context) error {
	c.mu.Lock()
	c.handed = true
	c.mu.Unlock()
	done := make(chan struct{})
	go func() {
		c.handing.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// detached returns ctx without its cancellation, with storeTimeout: for the calls that
// must reach the store even when the caller has given up (gocron hands tasks a ctx that
// is already cancelled at its shutdown).
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), storeTimeout)
}

// releaseDetached hands key back for owner on a detached context. A failed call is
// tried once more: a pooled connection whose backend was terminated fails its next
// statement, and a lock left to expire would hold up the next holder for a whole ttl.
func (c *Client) releaseDetached(ctx context.Context, key, owner string) (bool, error) {
	ctx, cancel := detached(ctx)
	defer cancel()
	ok, err := c.store.Release(ctx, key, owner)
	if err == nil || ctx.Err() != nil {
		return ok, err
	}
	if _, err := c.store.Release(ctx, key, owner); err != nil {
		return false, err
	}
	// The first call may have released it before failing; either way it is not ours now.
	return true, nil
}

// Lock is a held lock: a lease on a key, renewed in the background, with the fencing
// token of this acquisition. Its methods are safe for concurrent use.
type Lock struct {
	c      *Client
	token  int64
	entry  renewer.Entry // Key, Owner, TTL; the renewer's bookkeeping
	ctx    context.Context
	cancel context.CancelCauseFunc

	mu     sync.Mutex
	ending chan struct{} // made when the lock starts to end (Release, loss, Close); closed once err is set
	err    error         // what Release returns once ended
}

// Key returns the lock's key.
func (l *Lock) Key() string { return l.entry.Key }

// Owner returns the owner id this acquisition drew: the client's instance name and a
// random suffix.
func (l *Lock) Owner() string { return l.entry.Owner }

// Token returns the fencing token: positive, and greater than the token of every
// earlier acquisition of the key. Write it with what the lock protects (see
// FenceUpdate) so that a paused former holder's late write is refused.
func (l *Lock) Token() int64 { return l.token }

// TTL returns the lock's ttl.
func (l *Lock) TTL() time.Duration { return l.entry.TTL }

// Context returns a context that is cancelled when the lock is released or lost; on a
// loss, context.Cause is a *LockLostError. FromContext on it returns l.
func (l *Lock) Context() context.Context { return l.ctx }

// Held reports whether the lock is neither released nor lost, and its deadline (see the
// package doc) has not passed on the client's clock, even if the renewer has not yet
// run to say so. A paused process cannot know: see the package doc on fencing.
func (l *Lock) Held() bool { return l.ctx.Err() == nil && l.c.renewer.Live(&l.entry) }

// Release gives the lock back. It is idempotent and safe to call concurrently: every
// call returns what the first returned, once the first has finished. The store call
// runs on ctx detached from its cancellation, with a timeout, so a cancelled ctx still
// releases. It returns nil, a *LockLostError (ErrLockLost) when the lock was lost
// before, ErrClosed when Close left it to expire, or the store's error (the lock then
// expires after its ttl).
func (l *Lock) Release(ctx context.Context) error {
	l.mu.Lock()
	if l.ending != nil {
		ending := l.ending
		l.mu.Unlock()
		<-ending
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.err
	}
	l.ending = make(chan struct{})
	l.mu.Unlock()

	c := l.c
	c.forget(l)
	held, reason := c.renewer.Remove(&l.entry)
	var err error
	if !held { // the renewer found it lost a moment ago
		err = l.lostError(reason)
		l.cancel(err)
	} else {
		l.cancel(context.Canceled)
		ok, serr := c.releaseDetached(ctx, l.entry.Key, l.entry.Owner)
		switch {
		case serr != nil:
			err = serr
		case !ok:
			err = &LockLostError{Key: l.entry.Key, Owner: l.entry.Owner, Token: l.token, Reason: ReasonReleaseRefused}
		default:
			c.logger.Debug("pglock: released lock", slog.String("key", l.entry.Key),
				slog.String("owner", l.entry.Owner), slog.Int64("token", l.token))
			c.emit(EventReleased, l, "")
		}
	}
	l.mu.Lock()
	l.err = err
	close(l.ending)
	l.mu.Unlock()
	return err
}

func (l *Lock) lostError(r renewer.Reason) *LockLostError {
	reason := ReasonExpired
	if r == renewer.Refused {
		reason = ReasonRefused
	}
	return &LockLostError{Key: l.entry.Key, Owner: l.entry.Owner, Token: l.token, Reason: reason}
}

// abandon ends a lock that Close could not release in time.
func (l *Lock) abandon() { l.end(ErrClosed) }

// lose is the renewer's report that the lock is lost.
func (l *Lock) lose(r renewer.Reason) {
	err := l.lostError(r)
	l.end(err)
	l.c.logger.Warn("pglock: lost lock", slog.String("key", l.entry.Key), slog.String("owner", l.entry.Owner),
		slog.Int64("token", l.token), slog.Any("err", err))
	l.c.emit(EventLost, l, err.Reason)
}

// end records why the lock ended, unless Release got there first, and cancels its
// context with that cause.
func (l *Lock) end(err error) {
	l.mu.Lock()
	if l.ending == nil {
		l.ending, l.err = make(chan struct{}), err
		close(l.ending)
	}
	l.mu.Unlock()
	l.c.forget(l)
	l.cancel(err)
}

type lockContextKey struct{}

// withLockContext returns ctx carrying l for FromContext, cancelled with l's cause when
// l is lost or released; stop cancels it and lets go of l.
func withLockContext(ctx context.Context, l *Lock) (_ context.Context, stop func()) {
	lctx, cancel := context.WithCancelCause(context.WithValue(ctx, lockContextKey{}, l))
	unwatch := context.AfterFunc(l.ctx, func() { cancel(context.Cause(l.ctx)) })
	return lctx, func() {
		unwatch()
		cancel(context.Canceled)
	}
}

// FromContext returns the lock ctx runs under: inside WithLock's fn, a job's run, or a
// leader's OnAcquired, and from Lock.Context.
func FromContext(ctx context.Context) (*Lock, bool) {
	l, ok := ctx.Value(lockContextKey{}).(*Lock)
	return l, ok
}
