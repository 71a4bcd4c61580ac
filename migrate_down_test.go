package pglock_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/golang-migrate/migrate/v4"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/schema"
	"github.com/pgfence/pglock/pglocktest"
)

// Every down migration undoes its up migration on the server under test: from the
// latest version, step down one migration at a time to nothing, then up one at a time
// and down to nothing once more, then Up all the way, as a user's golang-migrate would
// with pglock.Migrations(). At each step the schema must not be dirty; at zero, the
// pglock schema holds nothing but golang-migrate's table; at the top, locks work.
func TestMigrationsDownToZeroAndUpAgain(t *testing.T) {
	t.Parallel()
	url := pglocktest.PostgresURL(t) // migrated to the latest version
	ctx := t.Context()
	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	db := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { _ = db.Close() })
	m := newMigrate(t, db)
	versions, err := schema.Versions(pglock.Migrations())
	require.NoError(t, err)
	latest := versions[len(versions)-1]

	requireVersion := func(want int) {
		t.Helper()
		v, dirty, err := m.Version()
		if want == 0 {
			require.ErrorIs(t, err, migrate.ErrNilVersion)
			return
		}
		require.NoError(t, err)
		require.False(t, dirty)
		require.EqualValues(t, want, v)
	}
	requireEmpty := func() {
		t.Helper()
		var objects []string
		rows, err := db.QueryContext(ctx, `
			SELECT 'relation ' || c.relname FROM pg_class c
			WHERE c.relnamespace = 'pglock'::regnamespace AND c.relname NOT LIKE 'schema_migrations%'
			UNION ALL
			SELECT 'function ' || p.oid::regprocedure::text FROM pg_proc p
			WHERE p.pronamespace = 'pglock'::regnamespace
			UNION ALL
			SELECT 'type ' || t.typname FROM pg_type t
			WHERE t.typnamespace = 'pglock'::regnamespace AND t.typrelid = 0 AND t.typelem = 0`)
		require.NoError(t, err)
		defer rows.Close()
		for rows.Next() {
			var o string
			require.NoError(t, rows.Scan(&o))
			objects = append(objects, o)
		}
		require.NoError(t, rows.Err())
		require.Empty(t, objects, "the down migrations leave these behind")
	}
	requireLocksWork := func() {
		t.Helper()
		var token int64
		require.NoError(t, db.QueryRowContext(ctx, `SELECT pglock.lock_acquire('migrate-down', 'me', 60000)`).Scan(&token))
		require.Positive(t, token)
		var released bool
		require.NoError(t, db.QueryRowContext(ctx, `SELECT pglock.lock_release('migrate-down', 'me')`).Scan(&released))
		require.True(t, released)
	}

	requireVersion(latest)
	requireLocksWork()
	for i := len(versions) - 1; i >= 0; i-- {
		require.NoError(t, m.Steps(-1), "down from %d", versions[i])
		if i > 0 {
			requireVersion(versions[i-1])
		}
	}
	requireVersion(0)
	requireEmpty()
	for _, v := range versions {
		require.NoError(t, m.Steps(1), "up to %d", v)
		requireVersion(v)
	}
	requireLocksWork()
	require.NoError(t, m.Down())
	requireVersion(0)
	requireEmpty()
	require.NoError(t, m.Up())
	requireVersion(latest)
	requireLocksWork()
	require.NoError(t, pglock.Migrate(ctx, url), "pglock.Migrate agrees the schema is up to date")

	// A client works on the schema built back up.
	client, err := pglock.New(pglocktest.Pool(t, url, 4))
	require.NoError(t, err)
	defer client.Close(context.Background())
	lock, err := client.TryAcquire(ctx, "after-migrations")
	require.NoError(t, err)
	require.NotNil(t, lock)
	require.NoError(t, lock.Release(ctx))
}

func newMigrate(t *testing.T, db *sql.DB) *migrate.Migrate {
	t.Helper()
	driver, err := migratepgx.WithInstance(db, &migratepgx.Config{
		MigrationsTable:       `"pglock"."schema_migrations"`,
		MigrationsTableQuoted: true,
	})
	require.NoError(t, err)
	src, err := iofs.New(pglock.Migrations(), ".")
	require.NoError(t, err)
	m, err := migrate.NewWithInstance("iofs", src, "pgx5", driver)
	require.NoError(t, err)
	t.Cleanup(func() {
		if _, err := m.Close(); err != nil && !errors.Is(err, sql.ErrConnDone) {
			t.Logf("migrate close: %v", err)
		}
	})
	return m
}
