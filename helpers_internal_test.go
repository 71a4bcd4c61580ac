package pglock

// The helpers the package's internal tests share.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock/internal/devdb"
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

// fenceTestDB returns a pool on a new database with a random name, which the test's
// cleanup drops, holding the pglock schema (Migrate) and the scratch tables the cases
// write to. (pglocktest.Postgres imports this package, so its tests cannot use it.) Without a server it skips the test, or fails it when CI is set.
func fenceTestDB(t testing.TB) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := os.Getenv("PGLOCK_TEST_DATABASE_URL")
	admin, err := pgxpool.New(ctx, url)
	if err == nil {
		err = admin.Ping(ctx)
		if err != nil {
			admin.Close()
		}
	}
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("no PostgreSQL server answers (PGLOCK_TEST_DATABASE_URL=%q): %v", url, err)
		}
		t.Skipf("no PostgreSQL server answers (set PGLOCK_TEST_DATABASE_URL): %v", err)
	}
	name := fmt.Sprintf("pglock_fence_test_%016x", rand.Uint64())
	_, err = admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	if err != nil {
		admin.Close()
		t.Fatalf("create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		defer admin.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.ConnConfig.Database = name
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close) // before the drop: cleanups run last-in first-out
	// Every migration, as users run them: lock_held meets the shipped lock_acquire.
	require.NoError(t, Migrate(ctx, devdb.URLOf(&cfg.ConnConfig.Config)))
	_, err = pool.Exec(ctx, `
		CREATE TABLE products (
			id bigint PRIMARY KEY, in_stock int, name text, note text, flag boolean,
			stock_fencing_token bigint NOT NULL DEFAULT 0,
			"Fence ""Token""" bigint NOT NULL DEFAULT 0);
		CREATE TABLE suppliers (id bigint PRIMARY KEY, product_id bigint, stock int, "from" text)`)
	require.NoError(t, err)
	return pool
}
