package pglocktest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/testdb"
)

// DatabaseURLEnv names the environment variable with the URL of the server that
// Postgres and PostgresURL create their databases on.
const DatabaseURLEnv = testdb.DatabaseURLEnv

// PostgresURL returns the URL of a database of the test's own with the pglock schema
// and no rows: a copy of a template database that the first call migrates and that
// stays on the server, named pglock_template_ and a digest of the schema (a new schema
// version gets a template of its own; old ones may be dropped by hand), or one a test
// of the process left as its copy was and that was emptied (see the package doc). The
// server is the one in PGLOCK_TEST_DATABASE_URL, else the one the libpq defaults reach
// if it answers, else an embedded PostgreSQL shared by the tests of the process (its
// binaries from PGLOCK_POSTGRES_BINARIES when set). With no server at all the test is
// skipped, saying why, except when the CI environment variable is set: then it fails.
func PostgresURL(t testing.TB) string {
	t.Helper()
	return testdb.URL(t, testdb.Schema{Migrate: pglock.Migrate, Migrations: pglock.Migrations()})
}

// Postgres returns a pool of up to 20 connections on a database of the test's own with
// the pglock schema and no rows (see PostgresURL), closed when the test ends.
func Postgres(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return Pool(t, PostgresURL(t), 20)
}

// Pool returns a pool of up to maxConns connections on databaseURL, closed when the
// test ends: for a second instance on the same database.
func Pool(t testing.TB, databaseURL string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		t.Fatalf("pglocktest: %v", err)
	}
	cfg.MaxConns = maxConns
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("pglocktest: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}
