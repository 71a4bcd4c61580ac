package pglock

import (
	"context"
	"fmt"
	"log/slog"
	"time"
	"unicode/utf8"

	"github.com/pgfence/pglock/internal/store"
)

// LockInfo is one lock as the store sees it, on the store's clock (the database's, for
// the PostgreSQL store): what Client.Locks lists, Client.ForceRelease broke and
// Election.Leader reads.
type LockInfo struct {
	// Key is the lock's key; for a permit, its semaphore's key.
	Key string
	// Permit is the permit's number (1 to the semaphore's permits) for a permit of a
	// semaphore, 0 for a lock.
	Permit int
	// Owner is the owner id of the last acquisition ("<instance>/<suffix>"), kept
	// after the lease expired; "" once released (or force-released).
	Owner string
	// Instance is the instance-name part of Owner (see WithInstanceName): Owner up to
	// its last "/", or all of it when it has none.
	Instance string
	// Token is the fencing token of the last acquisition.
	Token int64
	// Held says a live holder has the key now: not released, not expired.
	Held bool
	// AcquiredAt is when the last acquisition, the one that drew Token, happened, on the
	// store's clock; renewals do not move it. Zero when unknown: an old row, and from
	// ForceRelease and Election.Leader.
	AcquiredAt time.Time
	// TTL is the lease's ttl as that acquisition set it, a few milliseconds short: a live
	// lease with under a third of it left missed its renewals. Zero when AcquiredAt is.
	TTL time.Duration
	// ExpiresAt is when the lease ends (or ended: its expiry or its release), on the
	// store's clock.
	ExpiresAt time.Time
	// ExpiresIn is ExpiresAt less the store's now, read in the same statement;
	// positive while Held, <= 0 once the lease ended.
	ExpiresIn time.Duration
	// Waiting says a waiter has marked the held key wanted, so that its release notifies;
	// the mark may outlive a waiter that gave up. Always false when not Held, on the
	// memory store, and from ForceRelease and Election.Leader.
	Waiting bool
}

// Locks lists the locks whose key starts with prefix ("" lists all; "%" and "_" are no
// wildcards), held or not, sorted by key byte by byte, then by permit, never nil. It
// takes no row lock but reads every row under prefix: poll it every second or so. ctx
// bounds the query. A prefix that is not valid UTF-8, contains a NUL byte or is longer
// than MaxKeyLength characters is ErrInvalidArgument. Store errors are "pglock: list
// locks"-prefixed and wrap the driver's. See the package doc, # Listing, forcing a release
// and pruning.
func (c *Client) Locks(ctx context.Context, prefix string) ([]LockInfo, error) {
	if !store.ValidText(prefix) {
		return nil, invalidArg("Locks: prefix %q is not valid UTF-8 or contains a NUL byte", prefix)
	}
	if n := utf8.RuneCountInString(prefix); n > MaxKeyLength {
		return nil, invalidArg("Locks: prefix has %d characters, the most a key has is %d", n, MaxKeyLength)
	}
	locks, err := c.store.ListLocks(ctx, prefix)
	if err != nil {
		return nil, err
	}
	return lockInfos(locks), nil
}

// ForceRelease breaks the lock on key whoever holds it, on any instance, and returns what
// it broke: an operator's tool for a stuck holder, which learns of it at its next
// renewal; only a fence stops a write it makes before. ctx bounds the call, a wait for an
// open fenced transaction included; when it ends first, the error matches ctx.Err() and
// nothing is broken. It returns ErrNotHeld when no live holder has key, ErrInvalidKey for
// a bad key, or the store's error, "pglock: force release"-prefixed. See the package doc, # Listing,
// forcing a release and pruning.
func (c *Client) ForceRelease(ctx context.Context, key string) (LockInfo, error) {
	if err := store.CheckKey(key); err != nil {
		return LockInfo{}, err
	}
	return c.forceRelease(ctx, key)
}

// forceRelease is ForceRelease on a lock's key or a permit's row key.
func (c *Client) forceRelease(ctx context.Context, rowKey string) (LockInfo, error) {
	key, permit := store.SplitPermitKey(rowKey)
	broken, err := c.store.ForceRelease(ctx, rowKey)
	if err != nil {
		return LockInfo{}, err
	}
	info := lockInfo(broken)
	if !info.Held && permit > 0 {
		return LockInfo{}, fmt.Errorf("%w: permit %d of %q has no live holder", ErrNotHeld, permit, key)
	}
	if !info.Held {
		return LockInfo{}, fmt.Errorf("%w: %q has no live holder", ErrNotHeld, key)
	}
	info.Key, info.Permit = key, permit
	c.logger.LogAttrs(ctx, slog.LevelWarn, "pglock: lock force-released", slog.String("key", key),
		slog.Int("permit", permit), slog.String("owner", info.Owner), slog.Int64("token", info.Token))
	return info, nil
}

// lockInfo returns the store's l as a LockInfo.
func lockInfo(l store.LockInfo) LockInfo {
	return LockInfo{Key: l.Key, Permit: l.Permit, Owner: l.Owner, Instance: l.Instance, Token: l.Token, Held: l.Held,
		AcquiredAt: l.AcquiredAt, TTL: l.TTL, ExpiresAt: l.ExpiresAt, ExpiresIn: l.ExpiresIn, Waiting: l.Waiting}
}

// lockInfos returns the store's locks as LockInfos.
func lockInfos(locks []store.LockInfo) []LockInfo {
	out := make([]LockInfo, len(locks))
	for i, l := range locks {
		out[i] = lockInfo(l)
	}
	return out
}
