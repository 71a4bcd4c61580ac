package pglock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/pglocktest"
)

// What a statement leaves synchronous_commit at for its transaction's commit: an
// acquisition, a renewal and a force-release raise off and local to on and keep a
// stronger setting; the release and a waiter's losing attempt stay asynchronous. The
// crash test (crash_test.go, .ci/crash) proves that the commit then waits for its flush.

// TestSQLDurableStatementsRaiseSynchronousCommit runs each statement in a transaction
// whose synchronous_commit is each setting, and reads the setting its commit would use.
func TestSQLDurableStatementsRaiseSynchronousCommit(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pglocktest.Postgres(t)
	// Keys held by "holder" for the statements that need one, and a released key.
	for _, key := range []string{"held", "many1", "many2", "force", "released"} {
		var token int64
		require.NoError(t, pool.QueryRow(ctx, "SELECT pglock.lock_acquire($1, 'holder', 60000)", key).Scan(&token))
	}
	var token int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT fencing_token FROM pglock.sem_acquire('full', 'holder', 60000, 1)").Scan(&token))
	var ok bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT pglock.lock_release('released', 'holder')").Scan(&ok))
	require.True(t, ok)

	statements := []struct {
		name, sql string
		durable   bool // raises off and local to on; else leaves off (async) or the setting (writes nothing)
		async     bool // sets off whatever the setting
	}{
		{"an acquisition of a new key", "SELECT pglock.lock_acquire('new', 'A', 60000)", true, false},
		{"an acquisition of a released key", "SELECT pglock.lock_acquire('released', 'A', 60000)", true, false},
		{"a waiter's acquisition", "SELECT pglock.lock_acquire_or_want('new', 'A', 60000)", true, false},
		{"a permit's acquisition", "SELECT pglock.sem_acquire('sem', 'A', 60000, 2)", true, false},
		{"a renewal", "SELECT pglock.lock_renew('held', 'holder', 60000)", true, false},
		{"a batched renewal", "SELECT pglock.lock_renew_many('{many1,many2}', '{holder,holder}', 60000)", true, false},
		{"a force-release", "SELECT pglock.lock_force_release('force')", true, false},
		{"a release", "SELECT pglock.lock_release_async('held', 'holder')", false, true},
		{"a waiter's losing attempt, which marks the key", "SELECT pglock.lock_acquire_or_want('held', 'A', 60000)", false, true},
		{"a losing acquisition, which writes nothing", "SELECT pglock.lock_acquire('held', 'A', 60000)", false, false},
		{"a losing permit's acquisition, which grants nothing", "SELECT pglock.sem_acquire('full', 'A', 60000, 1)", false, false},
		{"a refused renewal, which writes nothing", "SELECT pglock.lock_renew('held', 'not the holder', 60000)", false, false},
		{"a fair acquisition of a free key", "SELECT * FROM pglock.queue_acquire('fair', 'A', 60000, 0)", true, false},
		{"a fair acquisition of a free permit", "SELECT * FROM pglock.queue_acquire('fairsem', 'A', 60000, 2)", true, false},
		{"a fair waiter's queueing, which takes nothing", "SELECT * FROM pglock.queue_acquire('held', 'A', 60000, 0)", false, true},
		{"a fair permit waiter's queueing", "SELECT * FROM pglock.queue_acquire('full', 'A', 60000, 1)", false, true},
	}
	for _, setting := range []string{"off", "local", "remote_write", "remote_apply", "on"} {
		for _, s := range statements {
			want := setting
			switch {
			case s.async:
				want = "off"
			case s.durable && (setting == "off" || setting == "local"):
				want = "on"
			}
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, "SET LOCAL synchronous_commit = "+setting); err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, s.sql); err != nil {
					return err
				}
				var got string
				if err := tx.QueryRow(ctx, "SHOW synchronous_commit").Scan(&got); err != nil {
					return err
				}
				require.Equal(t, want, got, "%s under synchronous_commit %s", s.name, setting)
				return errRollback
			})
			require.ErrorIs(t, err, errRollback, "%s under synchronous_commit %s", s.name, setting)
		}
	}
}

// errRollback ends a pgx.BeginFunc with a rollback.
var errRollback = errors.New("roll back")

// TestSQLDurableStatementsSetNothingForTheSession: the raise lasts until the end of the
// statement's transaction, no longer: the session's own setting is what it was.
func TestSQLDurableStatementsSetNothingForTheSession(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	conn := pglocktest.Pool(t, pglocktest.PostgresURL(t), 1)
	c, err := conn.Acquire(ctx)
	require.NoError(t, err)
	defer c.Release()
	_, err = c.Exec(ctx, "SET synchronous_commit = off")
	require.NoError(t, err)
	var token int64
	require.NoError(t, c.QueryRow(ctx, "SELECT pglock.lock_acquire('k', 'A', 60000)").Scan(&token))
	var got string
	require.NoError(t, c.QueryRow(ctx, "SHOW synchronous_commit").Scan(&got))
	require.Equal(t, "off", got)
	_, err = c.Exec(ctx, "RESET synchronous_commit")
	require.NoError(t, err)
}

// TestLockHeldUnderRepeatableReadAndSerializableCostsNoLock: a fenced transaction under
// REPEATABLE READ or SERIALIZABLE stays open past the ttl. Its row lock must not hold up
// the client's batched renewal, which would cost the client every lock of that ttl (the
// fenced one too); it still keeps every takeover out until it ends.
func TestLockHeldUnderRepeatableReadAndSerializableCostsNoLock(t *testing.T) {
	t.Parallel()
	for _, iso := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
		t.Run(string(iso), func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			pool := fencedTxDB(t)
			store := pglock.NewPostgresStore(pool)
			// The client renews when the test moves its clock; the database keeps its
			// leases however slow the machine.
			const ttl = time.Minute
			clock := pglocktest.NewManualClock(time.Now())
			c := newClient(t, store, pglock.TTL(ttl), pglock.WithClock(clock))
			other := newClient(t, store, pglock.TTL(ttl))
			a, err := c.TryAcquire(ctx, "fenced:a")
			require.NoError(t, err)
			b, err := c.TryAcquire(ctx, "fenced:b")
			require.NoError(t, err)

			tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
			written, err := fencedWrite(ctx, tx, a.Key(), a.Token(), 5)
			require.NoError(t, err)
			require.EqualValues(t, 1, written)

			// A renewal of both keys does not wait for tx: under a lock_timeout it would
			// fail (55P03), whatever the machine's load.
			err = pgx.BeginFunc(ctx, pool, func(renewal pgx.Tx) error {
				if _, err := renewal.Exec(ctx, "SET LOCAL lock_timeout = '500ms'"); err != nil {
					return err
				}
				rows, err := renewal.Query(ctx, "SELECT * FROM pglock.lock_renew_many($1::text[], $2::text[], 5000)",
					[]string{a.Key(), b.Key()}, []string{a.Owner(), b.Owner()})
				if err != nil {
					return err
				}
				renewed, err := pgx.CollectRows(rows, pgx.RowTo[string])
				require.NoError(t, err)
				require.ElementsMatch(t, []string{a.Key(), b.Key()}, renewed)
				return nil
			})
			require.NoError(t, err, "the batched renewal waited for the fenced tx")

			// The client's renewals fall due while tx is open, past the first ttl, and
			// another client tries before and after.
			_, err = other.TryAcquire(ctx, a.Key())
			require.ErrorIs(t, err, pglock.ErrNotAcquired)
			requireRenewedThrough(t, pool, clock, ttl, a, b)
			_, err = other.TryAcquire(ctx, a.Key())
			require.ErrorIs(t, err, pglock.ErrNotAcquired)
			require.Equal(t, []string{"fenced:a", "fenced:b"}, liveKeys(t, pool), "both renewed while the fenced tx was open")
			for _, l := range []*pglock.Lock{a, b} {
				require.True(t, l.Held(), l.Key())
				require.NoError(t, l.Context().Err(), l.Key())
			}
			requireForceReleaseWaits(t, pool, a.Key())
			require.NoError(t, tx.Commit(ctx))
			require.Equal(t, 5, stockValue(t, pool))
			require.NoError(t, a.Release(ctx))
			require.NoError(t, b.Release(ctx))
		})
	}
}

// requireRenewedThrough moves clock, the locks' client's, past the locks' first ttl,
// and requires that every renewal on the way (the batch of both) went through and moved
// their expiry in the database: a renewal that waited for a fenced transaction holds up
// the clock's Advance.
func requireRenewedThrough(t *testing.T, pool *pgxpool.Pool, clock *pglocktest.ManualClock, ttl time.Duration, locks ...*pglock.Lock) {
	t.Helper()
	var expires []time.Time
	for _, l := range locks {
		expires = append(expires, expiresAt(t, pool, l.Key()))
	}
	renewed := make(chan struct{})
	go func() { defer close(renewed); clock.Advance(ttl + ttl/3) }()
	receive(t, renewed, "the renewals, which waited for the fenced transaction")
	for i, l := range locks {
		require.True(t, l.Held(), l.Key())
		require.NoError(t, l.Context().Err(), l.Key())
		require.True(t, expiresAt(t, pool, l.Key()).After(expires[i]), "%s was not renewed in the database", l.Key())
	}
}

// requireForceReleaseWaits: a takeover of key (FOR UPDATE) waits for the open fenced
// transaction; lock_timeout says it would.
func requireForceReleaseWaits(t *testing.T, pool *pgxpool.Pool, key string) {
	t.Helper()
	err := pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(t.Context(), "SET LOCAL lock_timeout = '100ms'"); err != nil {
			return err
		}
		_, err := tx.Exec(t.Context(), "SELECT pglock.lock_force_release($1)", key)
		return err
	})
	requireSQLState(t, err, "55P03") // lock_not_available
}
