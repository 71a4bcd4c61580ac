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
