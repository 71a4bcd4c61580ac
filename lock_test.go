package pglock_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/pglocktest"
)

// logBuffer is a slog handler's output that tests read back, safe for concurrent use.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func newLogger(b *logBuffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// newClient returns a Client on pool, closed when the test ends.
func newClient(t testing.TB, store pglock.Store, opts ...pglock.ClientOption) *pglock.Client {
	t.Helper()
	c, err := pglock.NewWithStore(store, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close(context.Background())) })
	return c
}

func TestPausedHolderLosesLockAfterTTLOnDatabaseClock(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pglocktest.Postgres(t)
	store := pglock.NewPostgresStore(pool)
	clockA := pglocktest.NewManualClock(time.Now())
	var logs logBuffer
	a := newClient(t, store, pglock.TTL(time.Second), pglock.WithClock(clockA), pglock.WithLogger(newLogger(&logs)))
	b := newClient(t, store, pglock.TTL(time.Second))

	lockA, err := a.TryAcquire(ctx, "inventory:stock-reconciliation")
	require.NoError(t, err)
	_, err = b.TryAcquire(ctx, "inventory:stock-reconciliation")
	require.ErrorIs(t, err, pglock.ErrNotAcquired)

	time.Sleep(1200 * time.Millisecond) // database time: A's lease expires, A's clock stands still
	lockB, err := b.TryAcquire(ctx, "inventory:stock-reconciliation")
	require.NoError(t, err)
	require.Greater(t, lockB.Token(), lockA.Token())
	require.True(t, lockA.Held(), "a paused holder cannot know it lost the lock: the blind spot fencing covers")

	clockA.Advance(time.Second / 3) // A wakes up: its renewal is refused
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
