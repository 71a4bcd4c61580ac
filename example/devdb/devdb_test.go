package devdb_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgfence/pglock/example/devdb"
	"github.com/pgfence/pglock/pglocktest"
)

func TestFindTakesTheVariableFirst(t *testing.T) {
	t.Setenv("DEVDB_TEST_URL", "postgres://nowhere.invalid/shop")
	srv, err := devdb.Find(t.Context(), "DEVDB_TEST_URL")
	require.NoError(t, err)
	require.Equal(t, &devdb.Server{URL: "postgres://nowhere.invalid/shop", How: "the server in DEVDB_TEST_URL"},
		&devdb.Server{URL: srv.URL, How: srv.How, Embedded: srv.Embedded})
	require.NoError(t, srv.Stop())
}

func TestURLsKeepTheServerAndNameTheDatabase(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, url, database, want string }{
		{"a socket directory", "postgres://me@/postgres?host=/var/run/postgresql&port=5432&sslmode=disable", "shop",
			"postgres://me@/shop?host=%2Fvar%2Frun%2Fpostgresql&port=5432&sslmode=disable"},
		{"a password", "postgres://me:pw@127.0.0.1:5433/postgres?sslmode=disable", "shop",
			"postgres://me:pw@/shop?host=127.0.0.1&port=5433&sslmode=disable"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := pgconn.ParseConfig(c.url)
			require.NoError(t, err)
			got, err := devdb.WithDatabase(devdb.URLOf(cfg), c.database)
			require.NoError(t, err)
			require.Equal(t, c.want, got)
			back, err := pgconn.ParseConfig(got)
			require.NoError(t, err)
			require.Equal(t, []any{cfg.Host, cfg.Port, cfg.User, cfg.Password, c.database},
				[]any{back.Host, back.Port, back.User, back.Password, back.Database})
		})
	}
}

func TestEnsureDatabaseCreatesItOnce(t *testing.T) {
	t.Parallel()
	serverURL := pglocktest.PostgresURL(t) // any database on the tests' server
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "devdb_test_" + hex.EncodeToString(b)
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), serverURL)
		require.NoError(t, err)
		defer conn.Close(context.Background())
		_, err = conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		require.NoError(t, err)
	})
	first, err := devdb.EnsureDatabase(ctx, serverURL, name)
	require.NoError(t, err)
	again, err := devdb.EnsureDatabase(ctx, serverURL, name)
	require.NoError(t, err, "it exists: not an error")
	require.Equal(t, first, again)
	conn, err := pgx.Connect(ctx, first)
	require.NoError(t, err)
	defer conn.Close(context.WithoutCancel(ctx))
	var current string
	require.NoError(t, conn.QueryRow(ctx, "SELECT current_database()").Scan(&current))
	require.Equal(t, name, current)
}

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
