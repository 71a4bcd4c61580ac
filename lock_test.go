package pglock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/testkit"
	"github.com/pgfence/pglock/pglocktest"
)

func TestPausedHolderLosesLockAfterTTLOnDatabaseClock(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pglocktest.Postgres(t)
	store := pglock.NewPostgresStore(pool)
	clockA := pglocktest.NewManualClock(time.Now())
	var logs testkit.LogBuffer
	// While A holds the lock on the database clock, B tries once: A's ttl of 3 s, which
	// the test waits out, leaves a loaded machine room for that (300 ms did not, nor 1 s
	// for a stall of a second or two). B's lock is acquired and must stay held to the
	// end: 5 s, so that its confirmation and its renewal have seconds to be answered.
	const ttl = 3 * time.Second
	a := newClient(t, store, pglock.TTL(ttl), pglock.WithClock(clockA), pglock.WithLogger(newLogger(&logs)))
	b := newClient(t, store, pglock.TTL(5*time.Second))

	lockA, err := a.TryAcquire(ctx, "inventory:stock-reconciliation")
	require.NoError(t, err)
	_, err = b.TryAcquire(ctx, "inventory:stock-reconciliation")
	require.ErrorIs(t, err, pglock.ErrNotAcquired)

	awaitExpiry(t, pool, "inventory:stock-reconciliation") // A's clock stands still
	lockB, err := b.TryAcquire(ctx, "inventory:stock-reconciliation")
	require.NoError(t, err)
	require.Greater(t, lockB.Token(), lockA.Token())
	require.True(t, lockA.Held(), "a paused holder cannot know it lost the lock: the blind spot fencing covers")

	clockA.Advance(ttl / 3) // A wakes up: its renewal is refused
	require.False(t, lockA.Held())
	var lost *pglock.LockLostError
	require.ErrorAs(t, context.Cause(lockA.Context()), &lost)
	require.Equal(t, pglock.ReasonRefused, lost.Reason)
	require.Equal(t, lockA.Token(), lost.Token)
	require.ErrorIs(t, lockA.Release(ctx), pglock.ErrLockLost)
	require.Contains(t, logs.String(), `level=WARN msg="pglock: lost lock" key=inventory:stock-reconciliation`)
	require.True(t, lockB.Held())
	require.NoError(t, lockB.Release(ctx))
	require.False(t, errors.Is(context.Cause(lockB.Context()), pglock.ErrLockLost))
}
