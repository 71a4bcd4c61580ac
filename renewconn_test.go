package pglock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/pglocktest"
)

// The application fills the pool it shares with pglock for longer than the lock's ttl
// (a burst of requests, a slow report): every connection runs pg_sleep. The database is
// healthy, so the lock is not lost: renewals never wait for the application's pool.
// Close then leaves no connection of pglock's open.
func TestRenewalsNeverWaitBehindTheApplicationsPool(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		client func(pool *pgxpool.Pool, clock pglock.Clock) (*pglock.Client, error)
	}{
		{"New", func(pool *pgxpool.Pool, clock pglock.Clock) (*pglock.Client, error) {
			return pglock.New(pool, quiet, pglock.WithoutListener(), pglock.WithClock(clock))
		}},
		{"NewWithStore", func(pool *pgxpool.Pool, clock pglock.Clock) (*pglock.Client, error) {
			return pglock.NewWithStore(pglock.NewPostgresStore(pool), quiet, pglock.WithClock(clock))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			url := pglocktest.PostgresURL(t)
			pool := pglocktest.Pool(t, url, 4)
			// The renewals come when the test moves the clock, every one of two ttls
			// while the application fills the pool; the database keeps the leases
			// however slow the machine.
			clock := pglocktest.NewManualClock(time.Now())
			c, err := tc.client(pool, clock)
			require.NoError(t, err)
			closed := false
			t.Cleanup(func() {
				if !closed {
					_ = c.Close(context.Background())
				}
			})
			// Its own connections for renewals are made half-way to its first lock's first
			// renewal, on the real clock: 100 ms after a first lock of 600 ms.
			warm, err := c.TryAcquire(ctx, "warm", pglock.TTL(600*time.Millisecond))
			require.NoError(t, err)
			require.NoError(t, warm.Release(ctx))
			const ttl = time.Minute
			l, err := c.TryAcquire(ctx, "job", pglock.TTL(ttl))
			require.NoError(t, err)
			job, err := c.TryAcquire(ctx, "job:other", pglock.TTL(2*ttl)) // a second ttl group
			require.NoError(t, err)

			direct := pglocktest.Pool(t, url, 1)
			backends := func() (n int32) {
				require.NoError(t, direct.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
					WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&n))
				return n
			}

			// The client's own connections for renewals are up before the application
			// fills its pool.
			require.Eventually(t, func() bool { return pglock.OwnIdleConns(c) == 2 }, 10*time.Second, 5*time.Millisecond)

			app, stop := context.WithCancel(ctx)
			var slow sync.WaitGroup
			defer slow.Wait()
			defer stop()
			for range 4 {
				slow.Go(func() { _, _ = pool.Exec(app, "SELECT pg_sleep(60)") })
			}
			require.Eventually(t, func() bool { return pool.Stat().AcquiredConns() == 4 }, 5*time.Second, time.Millisecond)
			expires := []time.Time{expiresAt(t, direct, l.Key()), expiresAt(t, direct, job.Key())}
			renewed := make(chan struct{})
			go func() { defer close(renewed); clock.Advance(2 * ttl) }()
			receive(t, renewed, "the renewals of two ttls, which waited for the application's pool")
			require.NoError(t, context.Cause(l.Context()))
			require.NoError(t, context.Cause(job.Context()))
			require.True(t, l.Held())
			require.True(t, job.Held())
			require.True(t, expiresAt(t, direct, l.Key()).After(expires[0]), "renewed in the database")
			require.True(t, expiresAt(t, direct, job.Key()).After(expires[1]), "renewed in the database")
			require.Equal(t, int32(4), pool.Stat().AcquiredConns(), "the application still fills the pool")
			require.Greater(t, backends(), pool.Stat().TotalConns(), "pglock's own connection for renewals, kept")
			stop()
			slow.Wait()

			require.NoError(t, c.Close(ctx))
			closed = true
			require.Eventually(t, func() bool { return backends() == pool.Stat().TotalConns() },
				5*time.Second, 5*time.Millisecond, "a connection of pglock's is still open after Close")
		})
	}
}

// A hand-back (of what an acquisition abandoned in flight was granted) does not queue for
// the application's pool: with every connection of the pool busy (here for 30 s), it
// hands the key back on pglock's own connection, and another client takes the key while
// the application's queries still run. Renewals are stopped (a manual clock), so the own
// connections are idle; the test waits for pglock's pool to hold them idle, not only for
// their backends to exist.
func TestHandBacksNeverWaitBehindTheApplicationsPool(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := pglocktest.PostgresURL(t)
	pool := pglocktest.Pool(t, url, 2)
	c, err := pglock.New(pool, quiet, pglock.WithoutListener(), pglock.WithClock(pglocktest.NewManualClock(time.Now())))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	_, err = c.TryAcquire(ctx, "warm", pglock.TTL(3*time.Second)) // the own pool is made half a second later
	require.NoError(t, err)
	direct := pglocktest.Pool(t, url, 1)
	var token *int64
	require.NoError(t, direct.QueryRow(ctx, `SELECT pglock.lock_acquire('job', 'nobody', 60000)`).Scan(&token))
	require.NotNil(t, token, "granted to an owner nobody knows")
	require.Eventually(t, func() bool { return pglock.OwnIdleConns(c) == 2 }, 10*time.Second, 5*time.Millisecond,
		"pglock's own connections, opened half-way to the first lock's first renewal")

	app, stop := context.WithCancel(ctx)
	var slow sync.WaitGroup
	for range 2 {
		slow.Go(func() { _, _ = pool.Exec(app, "SELECT pg_sleep(30)") })
	}
	defer slow.Wait()
	defer stop()
	sleeping := func() (n int32) {
		require.NoError(t, direct.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND state = 'active' AND query = 'SELECT pg_sleep(30)'`).Scan(&n))
		return n
	}
	// Both running, not only their connections taken: a loaded machine may send a
	// query long after its connection was acquired.
	require.Eventually(t, func() bool { return sleeping() == 2 }, 10*time.Second, time.Millisecond)

	pglock.UndoAcquire(c, "job", "nobody", time.Minute)
	other, err := pglock.New(direct, quiet, pglock.WithoutListener())
	require.NoError(t, err)
	defer other.Close(context.Background())
	require.Eventually(t, func() bool {
		l, err := other.TryAcquire(ctx, "job")
		return err == nil && l.Release(ctx) == nil
	}, 5*time.Second, 10*time.Millisecond, "the key is not free")
	require.Equal(t, int32(2), sleeping(), "the key was handed back after a query of the application's ended")
}
