package pglock

import (
	"context"
	"fmt"
	"time"
)

// The calls of the stores that only a Client makes, for the tests of package
// pglock_test.

// StoreRenewMany renews many locks of one ttl in one call of s (see backend.renewMany).
func StoreRenewMany(ctx context.Context, s Store, keys, owners []string, ttl time.Duration) ([]string, error) {
	b, ok := s.(backend)
	if !ok {
		return nil, fmt.Errorf("%T has no renewMany", s)
	}
	return b.renewMany(ctx, keys, owners, ttl)
}

// StoreHolder reads key's live lease from s (see backend.holder), as Election.Leader
// does.
func StoreHolder(ctx context.Context, s Store, key string) (LockInfo, error) {
	b, ok := s.(backend)
	if !ok {
		return LockInfo{}, fmt.Errorf("%T has no holder", s)
	}
	return b.holder(ctx, key)
}

// StoreSemAcquire takes a permit of the semaphore key from s (see backend.semAcquire).
func StoreSemAcquire(ctx context.Context, s Store, key, owner string, ttl time.Duration, permits int) (int, int64, bool, error) {
	b, ok := s.(backend)
	if !ok {
		return 0, 0, false, fmt.Errorf("%T has no semAcquire", s)
	}
	return b.semAcquire(ctx, key, owner, ttl, permits)
}

// StoreReleaseMany releases keys[i] for owners[i] in one call of s, as the client's
// hand-backs do (see backend.releaseMany), and returns the indexes of those released.
func StoreReleaseMany(ctx context.Context, s Store, keys, owners []string) ([]int, error) {
	b, ok := s.(backend)
	if !ok {
		return nil, fmt.Errorf("%T has no releaseMany", s)
	}
	return b.releaseMany(ctx, keys, owners)
}

// OwnIdleConns returns how many connections of c's own pool for renewals and releases
// are idle: 0 before the pool is made.
func OwnIdleConns(c *Client) int32 {
	c.renewals.mu.Lock()
	own := c.renewals.own
	c.renewals.mu.Unlock()
	if own == nil {
		return 0
	}
	return own.Stat().IdleConns()
}

// UndoAcquire hands key back for owner, as c does for an acquisition abandoned in flight.
func UndoAcquire(c *Client, key, owner string, ttl time.Duration) { c.undoAcquire(key, owner, ttl) }
