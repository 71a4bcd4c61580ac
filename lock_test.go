package pglock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/testkit"
	"github.com/pgfence/pglock/pglocktest"
)

// A paused holder (its clock stands still: it never renews) loses its lock after its
// ttl on the database clock: the test of a lock's expiry that waits in real time.
func TestPausedHolderLosesLockAfterTTLOnDatabaseClock(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t)
	store := pglock.NewPostgresStore(pool)
	// B's lock is acquired and must stay held to the end: 5 s, so that its confirmation
	// and its renewal have seconds to be answered.
	b := newClient(t, store, pglock.TTL(5*time.Second))
	// A's ttl is what the test waits out: 300 ms, or 4 times more while B's first try
	// comes too late to find A's lease live (a loaded machine's stall).
	for ttl := 300 * time.Millisecond; !pausedHolderLosesLock(t, store, pool, b, ttl); ttl *= 4 {
		require.Less(t, ttl, 4*time.Second, "B's first try came after A's expiry, even at a ttl of %v", ttl)
		t.Logf("B's first try came after A's expiry at a ttl of %v: trying %v", ttl, 4*ttl)
	}
}

// pausedHolderLosesLock has A, paused, hold a key of its own for ttl while B tries it,
// then B take it once A's lease expired on the database clock, and A learn of its loss
// when it wakes up. It returns false, having told nothing, when B's first try came
// after A's expiry.
func pausedHolderLosesLock(t *testing.T, store *pglock.Store, pool *pgxpool.Pool, b *pglock.Client, ttl time.Duration) bool {
	t.Helper()
	ctx := t.Context()
	key := "inventory:stock-reconciliation:" + ttl.String()
	clockA := pglocktest.NewManualClock(time.Now())
	var logs testkit.LogBuffer
	a := newClient(t, store, pglock.TTL(ttl), pglock.WithClock(clockA), pglock.WithLogger(newLogger(&logs)))

	lockA, err := a.TryAcquire(ctx, key)
	require.NoError(t, err)
	expires := expiresAt(t, pool, key)
	early, err := b.TryAcquire(ctx, key)
	if err == nil { // taken: only after A's expiry on the database clock, when B tried too late
		var acquired time.Time
		require.NoError(t, pool.QueryRow(ctx, "SELECT acquired_at FROM pglock.locks WHERE key = $1", key).Scan(&acquired))
		require.False(t, acquired.Before(expires), "B took the key %v before A's lease expired", expires.Sub(acquired))
		require.NoError(t, early.Release(ctx))
		clockA.Advance(ttl) // A learns of its loss before its Close
		return false
	}
	require.ErrorIs(t, err, pglock.ErrNotAcquired)

	awaitExpiry(t, pool, key) // A's clock stands still
	lockB, err := b.TryAcquire(ctx, key)
	require.NoError(t, err)
	require.Greater(t, lockB.Token(), lockA.Token())
	require.True(t, lockA.Held(), "a paused holder cannot know it lost the lock: the blind spot fencing covers")

	clockA.Advance(ttl / 3) // A wakes up: its renewal is refused
	require.False(t, lockA.Held())
	var lost *pglock.LockLostError
	require.ErrorAs(t, context.Cause(lockA.Context()), &lost)
	require.Equal(t, pglock.LostRefused, lost.Reason)
	require.Equal(t, lockA.Token(), lost.Token)
	require.ErrorIs(t, lockA.Release(ctx), pglock.ErrLockLost)
	require.Contains(t, logs.String(), `level=WARN msg="pglock: lost lock" key=`+key+" ")
	require.True(t, lockB.Held())
	require.NoError(t, lockB.Release(ctx))
	require.False(t, errors.Is(context.Cause(lockB.Context()), pglock.ErrLockLost))
	return true
}
