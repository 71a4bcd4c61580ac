package pglock

import (
	"context"
	"time"
)

// Store keeps the locks that every instance shares. Each method is atomic and measures
// expiry on the store's own clock: of any number of concurrent callers of Acquire for
// one key, exactly one wins. An expired lock does not exist for any method.
//
// pglocktest.TestStore checks an implementation against this contract.
type Store interface {
	// Acquire takes key for owner for ttl if no live lock holds it, and returns its
	// fencing token: positive, and greater than every token the key had before.
	// acquired is false, with a nil error, when a live holder has the key.
	Acquire(ctx context.Context, key, owner string, ttl time.Duration) (token int64, acquired bool, err error)
	// Renew moves the expiry of key to ttl from now if owner still holds it live,
	// and reports whether it did. It never re-creates a lock.
	Renew(ctx context.Context, key, owner string, ttl time.Duration) (bool, error)
	// Release gives key back if owner still holds it live, and reports whether it did.
	Release(ctx context.Context, key, owner string) (bool, error)
}

// BatchRenewer is an optional Store capability: renewing many locks in one call. The
// Client's renewer uses it when the store has it. keys and owners have the same
// length, and keys has no duplicates; renewed lists the keys whose (key, owner) was
// still held live and was renewed.
type BatchRenewer interface {
	RenewMany(ctx context.Context, keys, owners []string, ttl time.Duration) (renewed []string, err error)
}
