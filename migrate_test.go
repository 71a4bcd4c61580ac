package pglock_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/schema"
	"github.com/pgfence/pglock/pglocktest"
)

func TestMigrateFromThreeInstancesAtOnce(t *testing.T) {
	t.Parallel()
	url := pglocktest.PostgresURL(t) // migrated once already: drop it all and race three
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, "DROP SCHEMA pglock CASCADE")
	require.NoError(t, err)

	errs := make(chan error, 3)
	for range 3 {
		go func() { errs <- pglock.Migrate(ctx, url) }()
	}
	for range 3 {
		require.NoError(t, <-errs)
	}
	var version int
	var dirty bool
	require.NoError(t, conn.QueryRow(ctx, "SELECT version, dirty FROM pglock.schema_migrations").Scan(&version, &dirty))
	require.False(t, dirty)
	names, err := schema.Versions(pglock.Migrations())
	require.NoError(t, err)
	require.Equal(t, names[len(names)-1], version)
	require.NoError(t, pglock.Migrate(ctx, url), "migrating an up-to-date schema is a no-op")
}

func TestMigrateRejectsBadURL(t *testing.T) {
	t.Parallel()
	for _, url := range []string{"mysql://localhost/db", "::not a url", "postgres://localhost:notaport/db"} {
		err := pglock.Migrate(t.Context(), url)
		require.ErrorContains(t, err, "pglock: migrate", url)
	}
}

// Empty means the libpq defaults, as Migrate's doc says: Migrate(ctx,
// os.Getenv("DATABASE_URL")) works without the variable, and so does a key=value string.
func TestMigrateTakesTheLibpqDefaultsAndKeyValueStrings(t *testing.T) {
	url := pglocktest.PostgresURL(t)
	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	dropSchema := func() {
		conn, err := pgx.Connect(t.Context(), url)
		require.NoError(t, err)
		defer conn.Close(context.Background())
		_, err = conn.Exec(t.Context(), "DROP SCHEMA pglock CASCADE")
		require.NoError(t, err)
	}
	migrated := func() bool {
		conn, err := pgx.Connect(t.Context(), url)
		require.NoError(t, err)
		defer conn.Close(context.Background())
		var n int
		require.NoError(t, conn.QueryRow(t.Context(), "SELECT count(*) FROM pglock.schema_migrations WHERE NOT dirty").Scan(&n))
		return n == 1
	}

	dropSchema()
	t.Setenv("PGHOST", cfg.Host)
	t.Setenv("PGPORT", strconv.Itoa(int(cfg.Port)))
	t.Setenv("PGUSER", cfg.User)
	t.Setenv("PGPASSWORD", cfg.Password)
	t.Setenv("PGDATABASE", cfg.Database)
	t.Setenv("PGSSLMODE", "disable")
	require.NoError(t, pglock.Migrate(t.Context(), ""))
	require.True(t, migrated())

	dropSchema()
	require.NoError(t, pglock.Migrate(t.Context(), fmt.Sprintf("host=%s port=%d dbname=%s sslmode=disable", cfg.Host, cfg.Port, cfg.Database)))
	require.True(t, migrated())
}
