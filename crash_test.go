package pglock_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
)

// The crash tests need a PostgreSQL server of their own that they may crash: .ci/crash
// starts one and sets these.
const (
	crashURLEnv     = "PGLOCK_CRASH_URL"     // the server's URL
	crashRestartEnv = "PGLOCK_CRASH_RESTART" // a shell command: stop it as a crash would (-m immediate), start it again
)

// crashServer returns the crash server's URL, migrated, and a function that crashes and
// restarts it. The test is skipped without one.
func crashServer(t *testing.T) (url string, crash func()) {
	url, restart := os.Getenv(crashURLEnv), os.Getenv(crashRestartEnv)
	if url == "" || restart == "" {
		t.Skipf("no server to crash: run .ci/crash (it sets %s and %s)", crashURLEnv, crashRestartEnv)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, pglock.Migrate(ctx, url))
	return url, func() {
		t.Helper()
		out, err := exec.Command("sh", "-c", restart).CombinedOutput()
		require.NoError(t, err, "crash and restart: %s", out)
	}
}

// crashClient returns a client on a pool of its own, closed after the test or by the
// returned function, whichever comes first (a crash breaks the pool's connections).
func crashClient(t *testing.T, url, instance string) (*pglock.Client, *pgxpool.Pool, func()) {
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	c, err := pglock.New(pool, pglock.WithoutListener(), pglock.WithInstanceName(instance))
	require.NoError(t, err)
	closed := false
	done := func() {
		if closed {
			return
		}
		closed = true
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Close(ctx) // after a crash, nothing it held is worth an error here
		pool.Close()
	}
	t.Cleanup(done)
	return c, pool, done
}

// TestCrashLosesAReleaseOnlyUntilItsExpiry: a release commits without waiting for its
// flush, so a crash right after it can lose it. The key then comes back held by the
// owner that released it, with its token, until the expiry it had; the next holder gets
// it at that expiry, with a greater token, and never before. The crash must actually
// lose a release for the test to pass: a release that a background flush saved is tried
// again on another key.
func TestCrashLosesAReleaseOnlyUntilItsExpiry(t *testing.T) {
	url, crash := crashServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ttl = 2 * time.Second
	for attempt := 1; attempt <= 5; attempt++ {
		key := fmt.Sprintf("crash/lost-release/%d/%d", time.Now().UnixNano(), attempt)
		a, _, closeA := crashClient(t, url, "crash-a")
		l, err := a.TryAcquire(ctx, key, pglock.TTL(ttl))
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		crash()
		closeA()

		b, pool, _ := crashClient(t, url, "crash-b")
		h, err := pglock.NewPostgresStore(pool).(pglock.HolderReader).Holder(ctx, key)
		require.NoError(t, err)
		if !h.Held {
			t.Logf("attempt %d: the release was flushed before the crash; again", attempt)
			continue
		}
		require.Equal(t, l.Owner(), h.Owner, "a lost release brings back its own holder, nobody else")
		require.Equal(t, l.Token(), h.Token, "and its token")
		require.LessOrEqual(t, h.ExpiresIn, ttl, "until the expiry it had, no later")
		t.Logf("attempt %d: the crash lost the release: %s holds %q again with token %d for %v more",
			attempt, h.Owner, key, h.Token, h.ExpiresIn.Round(time.Millisecond))

		_, err = b.TryAcquire(ctx, key)
		require.ErrorIs(t, err, pglock.ErrNotAcquired, "the key is not free before the expiry")
		start := time.Now()
		l2, err := b.Acquire(ctx, key, pglock.Wait(ttl+5*time.Second))
		require.NoError(t, err)
		waited := time.Since(start)
		require.Greater(t, l2.Token(), l.Token(), "the next holder's token is greater")
		require.LessOrEqual(t, waited, h.ExpiresIn+time.Second, "the next holder waited for the expiry, not longer")
		t.Logf("the next holder took %q with token %d after %v", key, l2.Token(), waited.Round(time.Millisecond))
		require.NoError(t, l2.Release(ctx))
		return
	}
	t.Fatal("no crash lost a release in 5 attempts: the releases are flushed before they return")
}

// TestCrashAfterAReleaseAndAnAcquisitionKeepsBoth: an acquisition that follows a release
// waits for its own flush, and the WAL is one sequence, so the release is flushed with
// it: no crash brings back the released holder once another has the key.
func TestCrashAfterAReleaseAndAnAcquisitionKeepsBoth(t *testing.T) {
	url, crash := crashServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	key := fmt.Sprintf("crash/release-then-acquire/%d", time.Now().UnixNano())
	a, _, closeA := crashClient(t, url, "crash-a")
	b, _, closeB := crashClient(t, url, "crash-b")
	la, err := a.TryAcquire(ctx, key, pglock.TTL(10*time.Second))
	require.NoError(t, err)
	require.NoError(t, la.Release(ctx))
	lb, err := b.TryAcquire(ctx, key, pglock.TTL(10*time.Second))
	require.NoError(t, err)
	crash()

	// Read before the clients close: b's Close would hand the key back.
	_, pool, _ := crashClient(t, url, "crash-c")
	h, err := pglock.NewPostgresStore(pool).(pglock.HolderReader).Holder(ctx, key)
	require.NoError(t, err)
	require.True(t, h.Held, "the acquisition survived the crash")
	require.Equal(t, lb.Owner(), h.Owner, "the acquisition survived the crash, and with it the release before it")
	require.Equal(t, lb.Token(), h.Token)
	require.Greater(t, h.Token, la.Token())
	closeA()
	closeB()
}
