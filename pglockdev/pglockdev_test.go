package pglockdev_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/devdb"
	"github.com/pgfence/pglock/pglockdev"
	"github.com/pgfence/pglock/pglocktest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// The embedded server reads the variable this package names.
func TestBinariesEnvIsTheOneTheEmbeddedServerReads(t *testing.T) {
	t.Parallel()
	require.Equal(t, devdb.BinariesEnv, pglockdev.BinariesEnv)
}

func TestFindTakesTheVariableFirst(t *testing.T) {
	t.Setenv("PGLOCKDEV_TEST_URL", "postgres://nowhere.invalid/shop")
	srv, err := pglockdev.Find(t.Context(), "PGLOCKDEV_TEST_URL")
	require.NoError(t, err)
	require.Equal(t, "postgres://nowhere.invalid/shop", srv.URL)
	require.Equal(t, "the server in PGLOCKDEV_TEST_URL", srv.How)
	require.NoError(t, srv.Stop(), "it did not start the server: nothing to stop")
	require.NoError(t, srv.Stop(), "twice")
}

// Bad input is ErrInvalidArgument, naming what is wrong, and creates nothing.
func TestFindAndDatabaseRefuseBadInput(t *testing.T) {
	t.Parallel()
	serverURL := pglocktest.PostgresURL(t) // any database on the tests' server
	srv := &pglockdev.Server{URL: serverURL}
	before := databases(t, serverURL)

	_, err := pglockdev.Find(t.Context(), "")
	require.ErrorIs(t, err, pglock.ErrInvalidArgument)
	require.EqualError(t, err, "pglock: invalid argument: pglockdev.Find: envVar is empty: name the variable with the URL, such as DATABASE_URL")

	for _, tc := range []struct{ name, db string }{
		{"empty", ""},
		{"over 63 bytes", "pglockdev_" + strings.Repeat("é", 27)}, // 64 bytes, 37 characters
		{"not UTF-8", "pglockdev_\xff"},
		{"a NUL", "pglockdev_\x00"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, err := srv.Database(t.Context(), tc.db)
			require.ErrorIs(t, err, pglock.ErrInvalidArgument)
			require.ErrorContains(t, err, "pglockdev.Database: name ")
			require.ErrorContains(t, err, ": want 1 to 63 bytes of UTF-8 without NUL")
			require.Empty(t, url)
		})
	}
	require.Equal(t, before, databases(t, serverURL), "nothing created")
}

func TestDatabaseCreatesItOnce(t *testing.T) {
	t.Parallel()
	serverURL := pglocktest.PostgresURL(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "pglockdev_test_" + hex.EncodeToString(b)
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), serverURL)
		require.NoError(t, err)
		defer conn.Close(context.Background())
		_, err = conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		require.NoError(t, err)
	})
	srv := &pglockdev.Server{URL: serverURL}
	first, err := srv.Database(ctx, name)
	require.NoError(t, err)
	again, err := srv.Database(ctx, name)
	require.NoError(t, err, "it exists: not an error")
	require.Equal(t, first, again)
	conn, err := pgx.Connect(ctx, first)
	require.NoError(t, err)
	defer conn.Close(context.WithoutCancel(ctx))
	var current string
	require.NoError(t, conn.QueryRow(ctx, "SELECT current_database()").Scan(&current))
	require.Equal(t, name, current)
}

// databases lists the server's databases that a bad name could have made (not
// TestDatabaseCreatesItOnce's, made meanwhile).
func databases(t *testing.T, serverURL string) []string {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), serverURL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	rows, err := conn.Query(t.Context(), `SELECT datname FROM pg_database
		WHERE datname LIKE 'pglockdev%' AND datname NOT LIKE 'pglockdev\_test\_%' ORDER BY 1`)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}
