package pglock_test

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/pglocktest"
)

// A waiter on a REPEATABLE READ pool marks the key wanted while the holder's renewal
// changes the row: its lock_want fails with 40001 and the store sends it again in a READ
// COMMITTED transaction. The link goes silent right after that retry's statement is
// sent. The server must not be left waiting on the silent client with the row locked:
// the holder, on another client, keeps renewing and keeps its lock. (When the retry was
// BEGIN, the statement and COMMIT in three round trips, the retry's transaction stayed
// open holding the row, the holder's renewals queued behind it, and the lock was lost
// at its deadline.)
func TestStoreRetryNeverLeavesTheServerWaitingOnTheClient(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := pglocktest.PostgresURL(t)
	direct := pglocktest.Pool(t, url, 4)
	// The holder renews when the test moves its clock, two ttls' worth once the
	// waiter's link is silent; the database keeps its lease however slow the machine.
	const ttl = time.Minute
	clock := pglocktest.NewManualClock(time.Now())
	holder := newClient(t, pglock.NewPostgresStore(direct), quiet, pglock.WithClock(clock))
	l, err := holder.TryAcquire(ctx, "retry:k", pglock.TTL(ttl))
	require.NoError(t, err)

	waiterPool, proxy := proxiedPool(t, url+"&default_transaction_isolation=repeatable%20read&application_name=retry_waiter", 2)
	waiter, err := pglock.New(waiterPool, quiet)
	require.NoError(t, err)
	t.Cleanup(func() {
		proxy.Restore()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, waiter.Close(ctx))
	})

	// A renewal of the holder's, in flight: its transaction has changed the row and not
	// committed yet, so the waiter's lock_want waits for it, then fails with 40001.
	renewal, err := direct.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = renewal.Rollback(context.WithoutCancel(ctx)) }()
	var renewed bool
	require.NoError(t, renewal.QueryRow(ctx, "SELECT pglock.lock_renew($1, $2, $3)", "retry:k", l.Owner(), ttl.Milliseconds()).Scan(&renewed))
	require.True(t, renewed)

	acquireCtx, stopAcquire := context.WithTimeout(ctx, 30*time.Second)
	defer stopAcquire()
	acquired := make(chan error, 1)
	go func() {
		_, err := waiter.Acquire(acquireCtx, "retry:k", pglock.TTL(3*time.Second))
		acquired <- err
	}()
	require.Eventually(t, func() bool {
		var waiting bool
		require.NoError(t, direct.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE application_name = 'retry_waiter' AND wait_event_type = 'Lock' AND query LIKE '%_want(%')`).Scan(&waiting))
		return waiting
	}, 10*time.Second, 2*time.Millisecond, "the waiter's mark never waited for the renewal's row lock")
	silent := proxy.BlackholeAfter(func(chunk []byte) bool { return bytes.Contains(chunk, []byte("_want(")) })
	require.NoError(t, renewal.Commit(ctx))
	select {
	case <-silent:
	case err := <-acquired:
		t.Fatalf("the waiter's Acquire returned before its retry was sent: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter never sent its retry")
	}

	// Two ttls of the holder's renewals must go through once the server has run the
	// retry: one that queued behind a transaction of the waiter's holds the clock's
	// Advance up.
	require.Eventually(t, func() bool {
		var active bool
		require.NoError(t, direct.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE application_name = 'retry_waiter' AND state = 'active')`).Scan(&active))
		return !active
	}, 10*time.Second, 2*time.Millisecond, "the server never ran the waiter's retry")
	expires := expiresAt(t, direct, "retry:k")
	renewals := make(chan struct{})
	go func() { defer close(renewals); clock.Advance(2 * ttl) }()
	receive(t, renewals, "the holder's renewals, which waited on the waiter's silent link")
	require.NoError(t, context.Cause(l.Context()), "the holder lost its lock after the waiter's link went silent")
	require.True(t, expiresAt(t, direct, "retry:k").After(expires), "the holder's renewals reached the database")
	var idleInTx int
	require.NoError(t, direct.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE application_name = 'retry_waiter' AND state LIKE 'idle in transaction%'`).Scan(&idleInTx))
	require.Zero(t, idleInTx, "a transaction of the waiter's waits on its silent link")
	require.True(t, l.Held())
	stopAcquire()
	err = <-acquired
	require.Error(t, err)
	require.False(t, errors.Is(err, pglock.ErrInvalidArgument), "%v", err)
}

// The retry's statement fails inside its READ COMMITTED transaction (here: it waits for
// a row lock past lock_timeout), which leaves the transaction block aborted: the store
// ends it, and the connection it used serves the next call, whether the store has a
// lone *pgx.Conn (which would otherwise fail every later statement with 25P02) or a
// pool (which would otherwise destroy the connection and open another).
func TestStoreRetryThatFailsLeavesTheConnectionReady(t *testing.T) {
	t.Parallel()
	url := pglocktest.PostgresURL(t)
	const lockTimeout = 2 * time.Second
	params := "&default_transaction_isolation=repeatable%20read&lock_timeout=" + lockTimeout.String() + "&application_name=retry_fails"
	direct := pglocktest.Pool(t, url, 4)
	for _, tc := range []struct {
		name  string
		store func(t *testing.T) (store *pglock.Store, ready func() bool, reconnects func() int64)
	}{
		{"on a *pgx.Conn", func(t *testing.T) (*pglock.Store, func() bool, func() int64) {
			conn, err := pgx.Connect(t.Context(), url+params)
			require.NoError(t, err)
			t.Cleanup(func() { _ = conn.Close(context.Background()) })
			return pglock.NewPostgresStore(conn), func() bool { return conn.PgConn().TxStatus() == 'I' }, func() int64 { return 0 }
		}},
		{"on a pool of one connection", func(t *testing.T) (*pglock.Store, func() bool, func() int64) {
			cfg, err := pgxpool.ParseConfig(url + params)
			require.NoError(t, err)
			cfg.MaxConns = 1
			pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			return pglock.NewPostgresStore(pool), func() bool { return true }, func() int64 { return pool.Stat().NewConnsCount() }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			store, ready, reconnects := tc.store(t)
			key := "retry:fails:" + tc.name
			_, ok, err := pglock.InternalStore(store).Acquire(ctx, key, "holder", time.Minute)
			require.NoError(t, err)
			require.True(t, ok)
			opened := reconnects()

			// A renewal in flight has changed the row; another transaction waits to lock
			// the row, and behind it the store's own renewal.
			renewal, err := direct.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = renewal.Rollback(context.WithoutCancel(ctx)) }()
			_, err = renewal.Exec(ctx, "SELECT pglock.lock_renew($1, 'holder', 60000)", key)
			require.NoError(t, err)
			waiting := func(n int) func() bool {
				return func() bool {
					var waiters int
					err := direct.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
						WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiters)
					return err == nil && waiters >= n
				}
			}
			next, err := direct.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = next.Rollback(context.WithoutCancel(ctx)) }()
			locked := make(chan error, 1)
			go func() {
				_, err := next.Exec(ctx, "SELECT FROM pglock.locks WHERE key = $1 FOR NO KEY UPDATE", key)
				locked <- err
			}()
			require.Eventually(t, waiting(1), 4*time.Second, 2*time.Millisecond)
			renewed := make(chan error, 1)
			go func() {
				_, err := pglock.InternalStore(store).Renew(ctx, key, "holder", time.Minute)
				renewed <- err
			}()
			require.Eventually(t, waiting(2), lockTimeout/2, 2*time.Millisecond, "within the store's lock_timeout")

			// The renewal commits: next, first in line, locks the row's new version (its
			// backend running on from the wake-up, before the store hears of anything);
			// the store's renewal fails with 40001, and its retry waits behind next's row
			// lock until lock_timeout. (With the store first in line, next had to be
			// scheduled again to lock the row, and a loaded machine let the retry in
			// before it.)
			require.NoError(t, renewal.Commit(ctx))
			require.NoError(t, receive(t, locked))
			require.Eventually(t, func() bool {
				var retrying bool
				err := direct.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
					WHERE application_name = 'retry_fails' AND wait_event_type = 'Lock'
					  AND query LIKE 'BEGIN ISOLATION LEVEL READ COMMITTED;%')`).Scan(&retrying)
				return err == nil && retrying
			}, lockTimeout/2, 2*time.Millisecond, "the store's retry waits behind next")
			err = receive(t, renewed)
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr)
			require.Equal(t, "55P03", pgErr.Code, "the retry's lock_timeout: %v", err)
			require.NoError(t, next.Rollback(ctx))

			require.True(t, ready(), "the connection is left in a transaction")
			ok, err = pglock.InternalStore(store).Renew(ctx, key, "holder", time.Minute)
			require.NoError(t, err)
			require.True(t, ok)
			require.Equal(t, opened, reconnects(), "the pool's connection was destroyed")
		})
	}
}

// Behind PgBouncer in transaction mode, in pgx's default query mode, a statement rolled
// back with 40001 (the database's default isolation is repeatable read) is sent again
// and goes through: the retry's one message prepares nothing and runs in one server
// transaction.
func TestPgBouncerRetryOfARolledBackStatement(t *testing.T) {
	t.Parallel()
	bouncerURL, directURL := behindPgBouncer(t)
	ctx := t.Context()
	direct := pglocktest.Pool(t, directURL, 4)
	_, err := direct.Exec(ctx, "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET default_transaction_isolation = ''repeatable read''', current_database()); END $$")
	require.NoError(t, err)
	store := pglock.NewPostgresStore(bouncerPool(t, bouncerURL, 2))
	var iso string
	require.NoError(t, bouncerPool(t, bouncerURL, 1).QueryRow(ctx, "SHOW transaction_isolation").Scan(&iso))
	require.Equal(t, "repeatable read", iso)
	for i := range 3 {
		_, ok, err := pglock.InternalStore(store).Acquire(ctx, "bouncer:retry", "holder", time.Minute)
		require.NoError(t, err)
		require.Equal(t, i == 0, ok)

		renewal, err := direct.Begin(ctx)
		require.NoError(t, err)
		_, err = renewal.Exec(ctx, "SELECT pglock.lock_renew('bouncer:retry', 'holder', 60000)")
		require.NoError(t, err)
		renewed := make(chan error, 1)
		go func() {
			ok, err := pglock.InternalStore(store).Renew(ctx, "bouncer:retry", "holder", time.Minute)
			if err == nil && !ok {
				err = errors.New("not renewed")
			}
			renewed <- err
		}()
		require.Eventually(t, func() bool {
			var waiters int
			require.NoError(t, direct.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiters))
			return waiters > 0
		}, 10*time.Second, 2*time.Millisecond)
		require.NoError(t, renewal.Commit(ctx))
		require.NoError(t, receive(t, renewed), "the renewal that met 40001, sent again")
	}
}

// Each write of the pgx store that changes a held lock's row, on a REPEATABLE READ
// pool, meets the row changed by a renewal that committed after its snapshot: it is
// rolled back with 40001, sent again, and does what it was asked (ReleaseMany, the
// client's hand-back of abandoned grants, too: it reads its rows, and must retry).
func TestStoreRetriesEveryWriteRolledBackBy40001(t *testing.T) {
	t.Parallel()
	url := pglocktest.PostgresURL(t)
	direct := pglocktest.Pool(t, url, 4)
	store := pglock.NewPostgresStore(pglocktest.Pool(t, url+"&default_transaction_isolation=repeatable%20read&application_name=retry_writes", 2))
	for _, tc := range []struct {
		name  string
		write func(ctx context.Context, key string) error
		free  bool // whether the key is free after the write
	}{
		{"Renew", func(ctx context.Context, key string) error {
			ok, err := pglock.InternalStore(store).Renew(ctx, key, "holder", time.Minute)
			return want(ok, err, "renewed")
		}, false},
		{"Release", func(ctx context.Context, key string) error {
			ok, err := pglock.InternalStore(store).Release(ctx, key, "holder")
			return want(ok, err, "released")
		}, true},
		{"RenewMany", func(ctx context.Context, key string) error {
			renewed, err := storeRenewMany(ctx, store, []string{key}, []string{"holder"}, time.Minute)
			return want(slices.Equal(renewed, []string{key}), err, "renewed")
		}, false},
		{"ReleaseMany", func(ctx context.Context, key string) error {
			released, err := storeReleaseMany(ctx, store, []string{"retry:never", key}, []string{"holder", "holder"})
			return want(slices.Equal(released, []int{1}), err, "released")
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			key := "retry:write:" + tc.name
			_, ok, err := pglock.InternalStore(store).Acquire(ctx, key, "holder", time.Minute)
			require.NoError(t, err)
			require.True(t, ok)

			// A renewal in flight: the row changed, not committed yet, so the write waits
			// for it, then finds the row changed since its snapshot.
			renewal, err := direct.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = renewal.Rollback(context.WithoutCancel(ctx)) }()
			_, err = renewal.Exec(ctx, "SELECT pglock.lock_renew($1, 'holder', 60000)", key)
			require.NoError(t, err)
			wrote := make(chan error, 1)
			go func() { wrote <- tc.write(ctx, key) }()
			require.Eventually(t, func() bool {
				var waiting bool
				require.NoError(t, direct.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
					WHERE application_name = 'retry_writes' AND wait_event_type = 'Lock')`).Scan(&waiting))
				return waiting
			}, 10*time.Second, 2*time.Millisecond, "the write never waited for the renewal's row lock")
			require.NoError(t, renewal.Commit(ctx))
			require.NoError(t, receive(t, wrote), "the write that met 40001, sent again")
			_, ok, err = pglock.InternalStore(store).Acquire(ctx, key, "other", time.Minute)
			require.NoError(t, err)
			require.Equal(t, tc.free, ok, "free after the write")
		})
	}
}

// want is err, or an error saying what did not happen when ok is false.
func want(ok bool, err error, what string) error {
	if err == nil && !ok {
		err = errors.New("not " + what)
	}
	return err
}
