package pglock

import (
	"context"

	"github.com/pgfence/pglock/internal/store"
)

// Semaphore is a semaphore of a Client: at most Permits holders at once, across every
// instance that asks for the same number, each holding one permit, numbered 1 to Permits.
// A permit, once taken, is a *Lock like any other, with Lock.Key the semaphore's key and
// Lock.Permit the permit's number. It holds no state of its own: make Semaphores at will.
// Its methods are safe for concurrent use. See the package doc, # Semaphores.
type Semaphore struct {
	c       *Client
	key     string
	permits int
}

// Semaphore returns the semaphore of key with permits permits, 1 to MaxPermits
// (ErrInvalidArgument), without a store call. key is checked as a lock's key
// (ErrInvalidKey) and has at most MaxKeyLength-5 characters; a lock of the same key is
// another thing.
func (c *Client) Semaphore(key string, permits int) (*Semaphore, error) {
	if err := store.CheckSemaphore(key, permits); err != nil {
		return nil, err
	}
	return &Semaphore{c: c, key: key, permits: permits}, nil
}

// Key returns the semaphore's key.
func (s *Semaphore) Key() string { return s.key }

// Permits returns how many permits the semaphore has.
func (s *Semaphore) Permits() int { return s.permits }

// TryAcquire makes one attempt to take a permit, the lowest free one. It returns an error
// matching ErrNotAcquired when the semaphore has Permits live holders or more; its other
// errors, and what ctx bounds, are Client.TryAcquire's.
func (s *Semaphore) TryAcquire(ctx context.Context, opts ...Option) (*Lock, error) {
	c := s.c
	start := c.clock.Now()
	lc := settings{ttl: c.ttl}
	if err := applyOptions(&lc, "Semaphore.TryAcquire", opts, Option.everyOption); err != nil {
		return nil, c.targetFailed(s.target(), start, err)
	}
	l, err := c.tryFrom(ctx, s.target(), lc.ttl, start, nil)
	if err != nil {
		return nil, c.targetFailed(s.target(), start, err)
	}
	return l, nil
}

// Acquire takes a permit, waiting while all are held, as Client.Acquire waits for a key;
// its errors are Client.Acquire's.
func (s *Semaphore) Acquire(ctx context.Context, opts ...AcquireOption) (*Lock, error) {
	c := s.c
	start := c.clock.Now()
	lc := settings{ttl: c.ttl}
	if err := applyOptions(&lc, "Semaphore.Acquire", opts, AcquireOption.acquireOption); err != nil {
		return nil, c.targetFailed(s.target(), start, err)
	}
	l, err := c.acquire(ctx, s.target(), lc, start)
	if err != nil {
		return nil, c.targetFailed(s.target(), start, err)
	}
	return l, nil
}

// WithPermit takes a permit as Acquire does, runs fn under it and releases it when fn
// returns or panics, as Client.WithLock does (fn's ctx, FromContext, Close and the errors
// are WithLock's). A nil fn is ErrInvalidArgument.
func (s *Semaphore) WithPermit(ctx context.Context, fn func(ctx context.Context) error, opts ...AcquireOption) error {
	c := s.c
	start := c.clock.Now()
	if fn == nil {
		return c.targetFailed(s.target(), start, invalidArg("Semaphore.WithPermit: nil fn"))
	}
	lc := settings{ttl: c.ttl}
	if err := applyOptions(&lc, "Semaphore.WithPermit", opts, AcquireOption.acquireOption); err != nil {
		return c.targetFailed(s.target(), start, err)
	}
	return c.withLock(ctx, s.target(), lc, start, fn)
}

// ForceRelease ends the lease of permit's live holder, as Client.ForceRelease does for a
// key, and returns the permit as it was. It returns ErrNotHeld when no live holder has
// the permit, and ErrInvalidArgument for a permit out of 1 to MaxPermits; what ctx bounds
// and the other errors are Client.ForceRelease's.
func (s *Semaphore) ForceRelease(ctx context.Context, permit int) (LockInfo, error) {
	if permit < 1 || permit > MaxPermits {
		return LockInfo{}, invalidArg("Semaphore.ForceRelease: permit %d: want 1 to %d", permit, MaxPermits)
	}
	return s.c.forceRelease(ctx, store.PermitKey(s.key, permit))
}

func (s *Semaphore) target() target { return target{key: s.key, permits: s.permits} }
