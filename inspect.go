package pglock

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"
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
	// AcquiredAt is when the last acquisition (the one that drew Token) happened, on
	// the store's clock: how long the holder has held the key, while Held. Renewals do
	// not move it. Zero when unknown: a row last acquired before migration 15, and
	// from ForceRelease and Election.Leader.
	AcquiredAt time.Time
	// TTL is the lease's ttl as that acquisition set it (renewals keep it): a live
	// lease with under a third of it left missed its renewals. With PostgreSQL it is
	// the new expiry less the clock a trigger read just after the acquisition, so a
	// few milliseconds short. Zero when AcquiredAt is.
	TTL time.Duration
	// ExpiresAt is when the lease ends (or ended: its expiry or its release), on the
	// store's clock.
	ExpiresAt time.Time
	// ExpiresIn is ExpiresAt less the store's now, read in the same statement;
	// positive while Held, <= 0 once the lease ended.
	ExpiresIn time.Duration
	// Waiting says a waiter has marked the held key wanted, so that its release
	// notifies (PostgreSQL store: the row's wanted_at). The mark stays until the next
	// release, so it may outlive a waiter that gave up. Always false when not Held,
	// on the memory store, and from ForceRelease and Election.Leader.
	Waiting bool
}

// Locks lists the locks whose key starts with prefix ("" lists all), sorted by key
// byte by byte (as Go compares strings), then by permit (a semaphore's permits are
// listed under its key, one LockInfo each, Permit set), held or not: a key's row stays after its
// release, with an empty Owner, and after its expiry, with Held false, until Prune
// deletes it. Every lock is read in one statement, on one reading of the store's
// clock. prefix is matched as it is: "%" and "_" are no wildcards. It reads only and
// takes no row lock, so it waits for nobody and nobody waits for it; each call reads
// every row under prefix (with the PostgreSQL store, it scans the table), so poll it
// every second or so, not in a tight loop. The result is never nil.
//
// ctx bounds the query; when it ends first the error matches ctx.Err(). A prefix that
// is not valid UTF-8, contains a NUL byte or is longer than MaxKeyLength characters is
// ErrInvalidArgument. Store errors are "pglock: list locks"-prefixed and wrap the
// driver's (a missing schema, or one older than this library, says to run Migrate; a
// role without EXECUTE, what to grant). On a type that embeds a Store it returns an
// error wrapping errors.ErrUnsupported.
func (c *Client) Locks(ctx context.Context, prefix string) ([]LockInfo, error) {
	if !validText(prefix) {
		return nil, invalidArg("Locks: prefix %q is not valid UTF-8 or contains a NUL byte", prefix)
	}
	if n := utf8.RuneCountInString(prefix); n > MaxKeyLength {
		return nil, invalidArg("Locks: prefix has %d characters, the most a key has is %d", n, MaxKeyLength)
	}
	b, err := c.backend("list locks", "cannot list its locks")
	if err != nil {
		return nil, err
	}
	return b.listLocks(ctx, prefix)
}

// ForceRelease breaks the lock on key whoever holds it, on any instance, and returns
// what it broke (Held true, with the holder's Owner and Token and the lease's
// ExpiresAt before the break). It is the operator's tool for a holder that is stuck:
// a healthy holder is better stopped, or left to Release.
//
// What follows, on the store's clock: the key is free at once, so the next acquisition
// (a waiter is woken as by a release) gets a token greater than the broken one; the
// holder's next renewal is refused, at which the holder's lock is lost
// (ReasonRefused) and the ctx of the code under it is cancelled, within ttl/3 of the
// break; a FenceHeld write that runs after the break writes nothing, at once, and a
// FenceUpdate write with the broken token writes nothing once the new holder wrote
// its greater token. Until its next renewal the holder still believes it holds the
// key: only a fence stops a write it makes in between.
//
// With the PostgreSQL store the break row-locks the key's row first, so it waits for
// an acquisition, renewal or release in flight and for an open fenced transaction
// (FenceHeld) of the holder: such a transaction commits before the break, as the old
// holder's legitimate write, or it runs after it and writes nothing.
//
// ctx bounds the call, the wait for that row lock included; when it ends first the
// error matches ctx.Err() and nothing is broken. ErrNotHeld (the LockInfo zero) when no
// live holder has key: free, released, expired or never used. An invalid key is
// ErrInvalidKey. Store errors are "pglock: force release"-prefixed and wrap the
// driver's; on a type that embeds a Store it returns an error wrapping
// errors.ErrUnsupported. The break is logged at Warn (key, owner, token).
func (c *Client) ForceRelease(ctx context.Context, key string) (LockInfo, error) {
	if err := checkKey(key); err != nil {
		return LockInfo{}, err
	}
	return c.forceRelease(ctx, key)
}

// forceRelease is ForceRelease on a lock's key or a permit's row key.
func (c *Client) forceRelease(ctx context.Context, rowKey string) (LockInfo, error) {
	key, permit := splitPermitKey(rowKey)
	b, err := c.backend("force release", "cannot break a lock")
	if err != nil {
		return LockInfo{}, err
	}
	info, err := b.forceRelease(ctx, rowKey)
	if err != nil {
		return LockInfo{}, err
	}
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

// instanceOf returns the instance-name part of an owner id: up to its last "/" (an
// instance name may itself hold one, as the default "hostname/pid" does).
func instanceOf(owner string) string {
	if i := strings.LastIndexByte(owner, '/'); i >= 0 {
		return owner[:i]
	}
	return owner
}
