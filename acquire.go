package pglock

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pglock/internal/renewer"
	"github.com/pgfence/pglock/internal/store"
)

// TryAcquire makes one attempt to take key and returns the *Lock, renewed in the
// background until Release or Close. ctx bounds the store call only; the lock's lifetime
// is Lock.Context. It returns an error matching ErrNotAcquired when a live holder has key
// (or the store's answer came too late to trust), ErrInvalidKey or ErrInvalidArgument for
// bad input, ErrClosed after Close, or the store's error. See the package doc, # Taking a
// lock and # Handing back a failed acquisition.
func (c *Client) TryAcquire(ctx context.Context, key string, opts ...Option) (*Lock, error) {
	start := c.clock.Now()
	lc, err := lockSettings(c, key, "TryAcquire", opts, Option.everyOption)
	if err != nil {
		return nil, c.acquireFailed(key, start, err)
	}
	l, err := c.tryFrom(ctx, target{key: key}, lc.ttl, start, nil)
	if err != nil {
		return nil, c.acquireFailed(key, start, err)
	}
	return l, nil
}

// Acquire takes key, waiting while it is held, until the key is free, until Wait's
// duration has passed or until ctx ends. It returns an error matching ErrNotAcquired when
// the key stayed held or ctx ended (matching ctx's cause too), ErrClosed when Close ends
// the wait, or TryAcquire's errors; an outage is ridden out for up to the lock's ttl. See
// the package doc, # Taking a lock.
func (c *Client) Acquire(ctx context.Context, key string, opts ...AcquireOption) (*Lock, error) {
	start := c.clock.Now()
	lc, err := lockSettings(c, key, "Acquire", opts, AcquireOption.acquireOption)
	if err != nil {
		return nil, c.acquireFailed(key, start, err)
	}
	l, err := c.acquire(ctx, target{key: key}, lc, start)
	if err != nil {
		return nil, c.acquireFailed(key, start, err)
	}
	return l, nil
}

// acquireFailed emits EventAcquireFailed for a call on key that began at start and
// returns err.
func (c *Client) acquireFailed(key string, start time.Time, err error) error {
	return c.targetFailed(target{key: key}, start, err)
}

// targetFailed is acquireFailed for a lock or a semaphore's permit.
func (c *Client) targetFailed(t target, start time.Time, err error) error {
	now := c.clock.Now()
	c.events.emit(Event{Type: EventAcquireFailed, Key: t.key, Permits: t.permits, Err: err, Wait: now.Sub(start), Time: now})
	return err
}

// target is what an acquisition takes: a lock's key, or a permit of a semaphore.
type target struct {
	key     string // the lock's key, or the semaphore's
	permits int    // the semaphore's permits; 0 for a lock
}

// undoKey is the key to hand back for an acquisition of t that answered r, or may have
// been granted without an answer: a permit's row key, or, when the permit's number is
// not known, the semaphore's key followed by U+001F (see handback.Queue).
func (t target) undoKey(r acquireReply) string {
	switch {
	case t.permits == 0:
		return t.key
	case r.permit > 0:
		return store.PermitKey(t.key, r.permit)
	}
	return t.key + store.PermitSeparator
}

// acquire is Acquire (Semaphore.Acquire for a permit), called at start, once its
// options are applied.
func (c *Client) acquire(ctx context.Context, t target, lc settings, start time.Time) (*Lock, error) {
	key := t.key
	if lc.fair {
		return c.acquireFair(ctx, t, lc, start)
	}
	var deadline time.Time
	if lc.waitSet {
		deadline = start.Add(lc.wait)
	}
	w := c.listener.waiter(t)
	defer w.stop()
	// A lock that expires (its holder died) wakes no one: poll at least every ttl/4.
	maxBackoff := min(time.Second, max(lc.ttl/4, 5*time.Millisecond))
	backoff := 5 * time.Millisecond
	free := 0 // how many times in a row the key looked free
	// Behind waiters of this client, leave the attempts to the first in line and wait
	// for a turn; a waiter woken only to mark the key (takeBaton) tries only if the key
	// is free. See waitqueue.go. Wait(0) is one attempt: it makes it, queue or not.
	queued := (!lc.waitSet || lc.wait > 0) && w.join()
	var err error     // the last attempt's, nil until one is made
	answered := false // the store answered an attempt: the waiter is parked
	// A parked waiter rides out an outage, a failover for one, as its client's locks
	// do: while its attempts fail for want of the store (outage), for up to its ttl
	// from the first failure, it tries again, soon at first (its first calls may meet
	// pooled connections to a server that is gone), on the real clock: it waits for the
	// network, not for a lease.
	var failingSince time.Time // zero while the attempts are answered
	var retry time.Duration
	for {
		if !queued || lc.waitSet && err == nil && !deadline.After(c.clock.Now()) {
			var l *Lock
			l, err = c.tryFrom(ctx, t, lc.ttl, start, w)
			if err != nil && ctx.Err() != nil && !errors.Is(err, ErrClosed) {
				// ctx ended during the attempt (or just before it): the caller gave up
				// waiting, as when it ends during a pause.
				return nil, fmt.Errorf("%w: key %q: %w", ErrNotAcquired, key, context.Cause(ctx))
			}
			switch {
			case errors.Is(err, ErrNotAcquired):
				answered, failingSince = true, time.Time{}
			case err == nil || !answered || !outage(err) || !failingSince.IsZero() && time.Since(failingSince) >= lc.ttl:
				return l, err
			case failingSince.IsZero():
				failingSince, retry = time.Now(), 5*time.Millisecond
			}
		}
		pause := jitter(backoff)
		if !failingSince.IsZero() {
			pause = jitter(retry)
		}
		if lc.waitSet {
			left := deadline.Sub(c.clock.Now())
			if left <= 0 && err != nil {
				return nil, err // a queued waiter's deadline made it try once, above
			}
			pause = min(pause, max(left, 0))
		}
		var werr error
		if failingSince.IsZero() {
			backoff = min(backoff*2, maxBackoff)
			werr = c.waitTurn(ctx, w, pause, &free)
		} else {
			retry = min(retry*2, maxBackoff)
			werr = wakeOrAfter(ctx, pause, w.woken()) // the listener coming back wakes it
		}
		if werr != nil {
			switch {
			case err == nil:
				err = fmt.Errorf("%w: key %q is held", ErrNotAcquired, key)
			case !errors.Is(err, ErrNotAcquired):
				err = fmt.Errorf("%w: key %q: the last attempt failed: %w", ErrNotAcquired, key, err)
			}
			return nil, fmt.Errorf("%w: %w", err, werr)
		}
		queued = w.takeBaton() || w.behind()
	}
}

// WithLock takes key as Acquire does, runs fn under the lock and releases it when fn
// returns or panics. fn's ctx ends with ctx, when the lock is lost (its cause a
// *LockLostError) or when Close begins (ErrClosed; Close waits for fn); FromContext(ctx)
// returns the lock. It returns Acquire's error, fn's error, ErrClosed when Close began
// before fn or left the key to expire, a *LockLostError when fn returned nil but the lock
// was lost, or the release's error.
func (c *Client) WithLock(ctx context.Context, key string, fn func(ctx context.Context) error,
	opts ...AcquireOption) (err error) {
	start := c.clock.Now()
	if fn == nil {
		return c.acquireFailed(key, start, invalidArg("WithLock: nil fn"))
	}
	lc, err := lockSettings(c, key, "WithLock", opts, AcquireOption.acquireOption)
	if err != nil {
		return c.acquireFailed(key, start, err)
	}
	return c.withLock(ctx, target{key: key}, lc, start, fn)
}

// withLock is WithLock (Semaphore.WithPermit for a permit) once its arguments are
// checked.
func (c *Client) withLock(ctx context.Context, t target, lc settings, start time.Time,
	fn func(ctx context.Context) error) (err error) {
	l, err := c.acquire(ctx, t, lc, start)
	if err != nil {
		return c.targetFailed(t, start, err)
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

// lockSettings checks key and applies opts, given to callName, over c's defaults; get
// is applyOptions'.
func lockSettings[O any](c *Client, key, callName string, opts []O, get func(O) option) (settings, error) {
	s := settings{ttl: c.ttl}
	if err := store.CheckKey(key); err != nil {
		return s, err
	}
	return s, applyOptions(&s, callName, opts, get)
}

// try makes one attempt to take key for ttl.
func (c *Client) try(ctx context.Context, key string, ttl time.Duration) (*Lock, error) {
	return c.tryFrom(ctx, target{key: key}, ttl, c.clock.Now(), nil)
}

// tryFrom is try for a call that began at start: EventAcquired's Wait counts from it.
// w is the caller's waiter, nil for a single attempt: once it listens (see
// waiter.marking), an attempt that finds the key held marks it wanted in the same call.
func (c *Client) tryFrom(ctx context.Context, t target, ttl time.Duration, start time.Time,
	w *waiter) (*Lock, error) {
	key := t.key
	if c.isClosed() {
		return nil, ErrClosed
	}
	if ctx.Err() != nil { // nothing to send, and nothing to hand back
		return nil, fmt.Errorf("pglock: acquire %q: %w", key, context.Cause(ctx))
	}
	owner := c.newOwner()
	mark := &store.SendMark{Now: c.clock.Now, Sent: c.clock.Now()}
	marker, wakes, marking := w.marking()
	r, abandoned := c.acquireCall(ctx, t, owner, ttl, mark, func(ctx context.Context) (r acquireReply) {
		if t.permits > 0 {
			r.permit, r.token, r.ok, r.err = c.store.SemAcquire(ctx, key, owner, ttl, t.permits)
		} else if marking {
			r.token, r.ok, r.wanted, r.err = marker.AcquireOrWant(ctx, key, owner, ttl)
		} else {
			r.token, r.ok, r.err = c.store.Acquire(ctx, key, owner, ttl)
		}
		return r
	})
	if abandoned {
		return nil, fmt.Errorf("pglock: acquire %q: %w", key, context.Cause(ctx))
	}
	token, ok, err := r.token, r.ok, r.err
	if r.wanted {
		w.marked(wakes)
	}
	switch {
	case err != nil:
		if mayHaveReached(err) {
			// The statement may have been granted after ctx ended or the link failed:
			// never leave the key held by an owner nobody knows for a whole ttl.
			c.handBacks.Add(t.undoKey(r), owner, ttl)
		}
		return nil, err
	case !ok && t.permits > 0:
		return nil, fmt.Errorf("%w: the %d permits of %q are held", ErrNotAcquired, t.permits, key)
	case !ok:
		return nil, fmt.Errorf("%w: key %q is held", ErrNotAcquired, key)
	}
	return c.newLock(t, r.permit, owner, ttl, token, start, mark.Sent)
}

// newOwner draws a new owner id: the client's instance name and a random suffix.
func (c *Client) newOwner() string {
	return c.instance + "/" + strconv.FormatUint(rand.Uint64(), 36)
}

// newLock makes the Lock of t (permit permit of a semaphore) that the store granted
// owner for ttl with token, in reply to a call sent at sentAt, for an acquisition that
// began at start: renewed from sentAt on, since the lease counts from no later than
// that. A bad token, or a reply that came after the lease's renewal deadline, is handed
// back.
func (c *Client) newLock(t target, permit int, owner string, ttl time.Duration, token int64, start, sentAt time.Time) (*Lock, error) {
	key, undo := t.key, t.undoKey(acquireReply{permit: permit})
	repliedAt := c.clock.Now()
	switch {
	case token <= 0:
		// Hand it back rather than hold a lock that cannot fence anything.
		c.handBacks.Add(undo, owner, ttl)
		return nil, fmt.Errorf("%w: %d for key %q", ErrInvalidToken, token, key)
	case !repliedAt.Before(renewer.Deadline(sentAt, ttl)):
		// The reply came so late (a partition, a stalled process) that the lock may
		// already be someone else's: it cannot be trusted for a moment.
		c.handBacks.Add(undo, owner, ttl)
		return nil, fmt.Errorf("%w: key %q: the store's confirmation came after the lock's ttl",
			ErrNotAcquired, key)
	}
	l := &Lock{c: c, token: token, key: key, permit: permit,
		entry: renewer.Entry{Key: undo, Owner: owner, TTL: ttl}}
	l.entry.Lost = l.lose
	l.ctx, l.cancel = context.WithCancelCause(context.WithValue(context.Background(), lockContextKey{}, l))

	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		c.handBacks.Add(l.entry.Key, owner, ttl)
		l.cancel(ErrClosed)
		return nil, ErrClosed
	}
	c.held[l] = struct{}{}
	// Before Close can see the lock held (lock order: c.mu, then the renewer's).
	c.renewer.Add(&l.entry, sentAt)
	c.mu.Unlock()
	if c.laterTimeline(token) {
		c.reconfirm(sentAt)
	}
	c.renewals.WarmSoon(ttl)
	if c.logger.Enabled(context.Background(), slog.LevelDebug) { // its attributes cost allocations
		c.logger.LogAttrs(context.Background(), slog.LevelDebug, "pglock: acquired lock", slog.String("key", key),
			slog.Int("permit", permit), slog.String("owner", owner), slog.Int64("token", token), slog.Duration("ttl", ttl))
	}
	c.events.emit(Event{Type: EventAcquired, Key: key, Permit: permit, Permits: t.permits, Owner: owner, Token: token,
		Wait: repliedAt.Sub(start), Duration: repliedAt.Sub(sentAt), Time: repliedAt})
	return l, nil
}

// mayHaveReached reports whether a store call that failed with err may have reached the
// server: not bad input, not an error pgx marks as from before anything was sent
// (SafeToRetry), and not a connection that could not be made (pgx's
// *pgconn.ConnectError, or a failed dial from another driver), which is what an
// unreachable database gives every call.
func mayHaveReached(err error) bool {
	var connect *pgconn.ConnectError
	var op *net.OpError
	return !errors.Is(err, ErrInvalidKey) && !errors.Is(err, ErrInvalidArgument) &&
		!pgconn.SafeToRetry(err) && !errors.As(err, &connect) && !(errors.As(err, &op) && op.Op == "dial")
}

// outage reports whether err says that the store could not be reached, or that the
// connection to it was lost or reached a server that cannot take writes (yet): an
// outage, or a failover under way, which a parked waiter rides out. Not bad input, nor
// an error the server gave on a working connection (a missing schema, a privilege).
func outage(err error) bool {
	var connect *pgconn.ConnectError
	var netErr net.Error
	switch {
	case errors.Is(err, ErrInvalidKey), errors.Is(err, ErrInvalidArgument), errors.Is(err, ErrClosed):
		return false
	case errors.As(err, &connect), errors.As(err, &netErr), pgconn.SafeToRetry(err),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, driver.ErrBadConn):
		return true
	}
	code := store.SQLState(err)
	// 08: connection exception; 57P01-03: the server shuts down, crashed, or cannot
	// take connections yet; 25006: a read-only transaction, on a standby.
	return strings.HasPrefix(code, "08") || code == "57P01" || code == "57P02" || code == "57P03" || code == "25006"
}

// acquireReply is the reply to an acquisition's store call.
type acquireReply struct {
	permit     int // a permit's number; 0 for a lock
	token      int64
	ok, wanted bool
	err        error
}

// acquireCall makes an acquisition's store call on a context of its own, detached from
// ctx. When ctx ends first, acquireCall returns at once with abandoned true, and the call
// goes on to its reply, store.Timeout at most: a grant, or a failure after the call may
// have reached the server, is then handed back (handback.Queue), and Close waits for
// that. The reply comes on the call's own connection, which stays open: pgx closes the
// connection of a statement whose ctx ends, and the release would then wait for a new
// one, on a loaded machine past the grant's expiry. But a call still waiting for a
// connection of a *pgxpool.Pool when ctx ends is never sent (see store.SendMark), and
// mark.Sent is when the call had its connection. The pgx store on a pool makes the call
// on the caller's goroutine (store.SendMark.Abandon); another store, on a goroutine of
// its own.
func (c *Client) acquireCall(ctx context.Context, t target, owner string, ttl time.Duration,
	mark *store.SendMark, call func(context.Context) acquireReply) (r acquireReply, abandoned bool) {
	if ctx.Done() == nil {
		return call(store.WithSendMark(ctx, mark)), false
	}
	h := c.handBacks
	mark.Wait = ctx
	cctx, cancel := context.WithCancel(store.WithSendMark(context.WithoutCancel(ctx), mark))
	if c.abandons {
		// The call is made here and waits for its reply until ctx ends (store.SendMark.Abandon).
		var timeout *time.Timer
		mark.Abandon = func() (context.Context, func(bool, error), bool) {
			timeout = time.AfterFunc(store.Timeout, cancel)
			if !h.Await() { // Close is handing back already: the reply is read here
				return nil, nil, false
			}
			unclose := h.AfterGiveUp(cancel) // Close gave up waiting
			return cctx, func(granted bool, err error) {
				timeout.Stop()
				unclose()
				cancel()
				if granted || err != nil && mayHaveReached(err) {
					h.Add(t.undoKey(acquireReply{}), owner, ttl)
				}
				h.Done()
			}, true
		}
		r = call(cctx)
		if errors.Is(r.err, store.ErrAbandoned) {
			return r, true
		}
		if timeout != nil {
			timeout.Stop()
		}
		cancel()
		return r, false
	}
	replies := make(chan acquireReply, 1)
	var (
		taken atomic.Bool // by the first of: the reply for the caller, the caller giving up
		stop  func()      // the abandoned call's bounds; set before the caller takes
	)
	go func() {
		defer cancel()
		r := call(cctx)
		if taken.CompareAndSwap(false, true) {
			replies <- r
			return
		}
		stop()
		if (r.err == nil && r.ok) || (r.err != nil && mayHaveReached(r.err)) {
			h.Add(t.undoKey(r), owner, ttl)
		}
		h.Done()
	}()
	select {
	case r = <-replies:
		return r, false
	case <-ctx.Done():
	}
	timeout := time.AfterFunc(store.Timeout, cancel)
	if h.Await() {
		unclose := h.AfterGiveUp(cancel) // Close gave up waiting
		stop = func() { timeout.Stop(); unclose() }
		if taken.CompareAndSwap(false, true) {
			return r, true
		}
		stop()
		h.Done()
	}
	// The reply is in, or Close is handing back already: wait for it here.
	r = <-replies
	timeout.Stop()
	return r, false
}

// jitter returns a duration between d/2 and d, so that callers that failed together
// retry apart.
func jitter(d time.Duration) time.Duration {
	return d/2 + rand.N(d/2+1)
}
