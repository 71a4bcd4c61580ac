package pglock

// The helpers the package's internal tests share.

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock/internal/testdb"
	"github.com/pgfence/pglock/internal/testkit"
)

// TestClock is a testkit.Clock as a Clock, for the tests (external ones too) that must
// do what a ManualClock will not: move the clock (Move, or Advance on another
// goroutine) while a call that an Advance started, a renewal round, still waits.
type TestClock struct{ *testkit.Clock }

// AfterFunc is testkit.Clock's, as a Clock's.
func (c TestClock) AfterFunc(d time.Duration, f func()) Timer {
	return testTimer(c.Clock.AfterFunc(d, f))
}

type testTimer func() bool

func (t testTimer) Stop() bool { return t() }

// EndLease ends key's live lease on the database clock now, as the schema's owner may,
// and fails the test if key had none. key is a lock's key, or a permit's row key: its
// semaphore's key, U+001F and the permit's number. It is for the tests whose subject is
// what comes after a lease ended (another instance takes the key, with the next token;
// a job moves; a renewal is refused; a fence refuses the old token), not the expiry,
// which one test per path waits for in real time. The holder is not told: use it on a
// holder that cannot tell either, one whose clock stands still (a ManualClock it
// has not reached its deadline on, as a paused process), or one that is gone.
func EndLease(t testing.TB, pool *pgxpool.Pool, key string) {
	t.Helper()
	tag, err := pool.Exec(t.Context(), `UPDATE pglock.locks SET expires_at = clock_timestamp()
		WHERE key = $1 AND owner IS NOT NULL AND expires_at > clock_timestamp()`, key)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected(), "no live lease of %q to end", key)
}

// fenceTestDB returns a pool on a fresh database with the pglock schema (every
// migration, as users run them, copied from testdb's template) and the scratch tables
// the cases write to, closed when the test ends, and dropped. (pglocktest.Postgres
// imports this package, so its tests cannot use it.) Without a server it skips the
// test, or fails it when CI is set.
func fenceTestDB(t testing.TB) *pgxpool.Pool {
	t.Helper()
	ctx := t.Context()
	url := testdb.URL(t, testdb.Schema{Migrate: Migrate, Migrations: Migrations()})
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = pool.Exec(ctx, `
		CREATE TABLE products (
			id bigint PRIMARY KEY, in_stock int, name text, note text, flag boolean,
			stock_fencing_token bigint NOT NULL DEFAULT 0,
			"Fence ""Token""" bigint NOT NULL DEFAULT 0);
		CREATE TABLE suppliers (id bigint PRIMARY KEY, product_id bigint, stock int, "from" text)`)
	require.NoError(t, err)
	return pool
}
