package pglock

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/pgfence/pglock/internal/renewer"
)

// Lock is a held lock: a lease on a key, renewed in the background, with the fencing
// token of this acquisition. Its methods are safe for concurrent use.
type Lock struct {
	c      *Client
	token  int64
	key    string        // the lock's key, or the permit's semaphore's
	permit int           // the permit's number; 0 for a lock
	entry  renewer.Entry // Key (the row key: a permit's is store.PermitKey), Owner, TTL; the renewer's bookkeeping
	ctx    context.Context
	cancel context.CancelCauseFunc

	mu     sync.Mutex
	ending chan struct{} // made when the lock starts to end (Release, loss, Close); closed once err is set
	err    error         // what Release returns once ended
}

// Key returns the lock's key; for a permit of a semaphore, the semaphore's key.
func (l *Lock) Key() string { return l.key }

// Permit returns the permit's number, 1 to the semaphore's permits, for a permit of a
// semaphore (Semaphore.Acquire), and 0 for a lock.
func (l *Lock) Permit() int { return l.permit }

// Owner returns the owner id this acquisition drew: the client's instance name and a
// random suffix.
func (l *Lock) Owner() string { return l.entry.Owner }

// Token returns the fencing token: positive, and greater than the token of every earlier
// acquisition of the key (of the permit, for a permit). Write it with what the lock
// protects (see FenceUpdate) so that a paused former holder's late write is refused.
func (l *Lock) Token() int64 { return l.token }

// TTL returns the lock's ttl.
func (l *Lock) TTL() time.Duration { return l.entry.TTL }

// Context returns a context that is cancelled when the lock is released or lost; on a
// loss, context.Cause is a *LockLostError. FromContext on it returns l.
func (l *Lock) Context() context.Context { return l.ctx }

// Held reports whether the lock is neither released nor lost and its deadline has not
// passed on the client's clock, even if the renewer has not yet run to say so. A paused
// process cannot know (see the package doc on fencing).
func (l *Lock) Held() bool { return l.ctx.Err() == nil && l.c.renewer.Live(&l.entry) }

// fresh reports whether the lock is Held and its renewal not overdue: the store's
// expiry is more than half a ttl away.
func (l *Lock) fresh() bool { return l.ctx.Err() == nil && l.c.renewer.Fresh(&l.entry) }

// Release gives the lock back. It is safe to call more than once and concurrently: every
// call returns what the first returned, once the first has finished. A cancelled ctx
// still releases (the call runs detached, with a timeout). It returns nil, a
// *LockLostError when the lock was lost before, ErrClosed when Close left it to expire,
// or the store's error (the lock then expires after its ttl). A crash right after a
// release can bring the lock back until its expiry: write nothing fenced with its token
// after Release (see the package doc, # Renewals and releases).
func (l *Lock) Release(ctx context.Context) error {
	return l.releaseVia(ctx, l.c.releaseDetached)
}

// releaseVia is Release, its store call made by release: the client's own
// (releaseDetached), or one that records more in the same statement (a slot's end).
func (l *Lock) releaseVia(ctx context.Context, release func(ctx context.Context, key, owner string) (released, unsure bool, err error)) error {
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
	// Past its deadline (a holder paused, its renewer not yet run), a release that finds
	// nothing means the lock was lost before, not that an earlier call released it.
	live := c.renewer.Live(&l.entry)
	held, reason := c.renewer.Remove(&l.entry)
	var err error
	if !held { // the renewer found it lost a moment ago
		err = l.lostError(reason)
		l.cancel(err)
	} else {
		l.cancel(context.Canceled)
		ok, unsure, serr := release(ctx, l.entry.Key, l.entry.Owner)
		switch {
		case serr != nil:
			err = serr
		case !ok && (!unsure || !live):
			err = &LockLostError{Key: l.key, Permit: l.permit, Owner: l.entry.Owner, Token: l.token, Reason: LostReleaseRefused}
		default:
			if c.logger.Enabled(context.Background(), slog.LevelDebug) { // its attributes cost allocations
				c.logger.LogAttrs(context.Background(), slog.LevelDebug, "pglock: released lock", slog.String("key", l.key),
					slog.Int("permit", l.permit), slog.String("owner", l.entry.Owner), slog.Int64("token", l.token))
			}
			c.emit(Event{Type: EventReleased, Key: l.key}, l)
		}
	}
	l.mu.Lock()
	l.err = err
	close(l.ending)
	l.mu.Unlock()
	return err
}

func (l *Lock) lostError(r renewer.Reason) *LockLostError {
	reason := LostExpired
	if r == renewer.Refused {
		reason = LostRefused
	}
	return &LockLostError{Key: l.key, Permit: l.permit, Owner: l.entry.Owner, Token: l.token, Reason: reason}
}

// abandon ends a lock that Close could not release in time.
func (l *Lock) abandon() { l.end(ErrClosed) }

// lose is the renewer's report that the lock is lost.
func (l *Lock) lose(r renewer.Reason) {
	err := l.lostError(r)
	l.end(err)
	l.c.logger.Warn("pglock: lost lock", slog.String("key", l.key), slog.Int("permit", l.permit),
		slog.String("owner", l.entry.Owner), slog.Int64("token", l.token), slog.Any("err", err))
	l.c.emit(Event{Type: EventLost, Key: l.key, LostReason: err.Reason, Err: err}, l)
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
