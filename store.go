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

// Holder is the live holder of a key, as a store sees it. The zero Holder means
// nobody holds the key.
type Holder struct {
	Held      bool          // whether a live holder has the key; when not, the other fields are zero
	Owner     string        // the holder's owner id: its instance name and a random suffix
	Token     int64         // the fencing token of its acquisition
	ExpiresIn time.Duration // how long the lock lives without another renewal, on the store's clock
}

// HolderReader is an optional Store capability: reading who holds a key, which
// Election.Leader needs. The PostgreSQL and memory stores have it. Holder returns the
// zero Holder when the key is free, released or expired.
type HolderReader interface {
	Holder(ctx context.Context, key string) (Holder, error)
}

// wantMarker is the PostgreSQL store's capability of marking a key wanted by a waiter,
// so that its release notifies the listeners (see listener.go). wanted is true when a
// live holder has the key and the mark is set; false means "try to acquire it now".
type wantMarker interface {
	markWanted(ctx context.Context, key string) (wanted bool, err error)
	// acquireOrWant is Store.Acquire that, when the key is held, marks it wanted in
	// the same call: wanted reports that it did (the key's release will notify), so
	// that the waiter parks without a markWanted round trip; acquired and wanted both
	// false mean "try again now".
	acquireOrWant(ctx context.Context, key, owner string, ttl time.Duration) (token int64, acquired, wanted bool, err error)
}
