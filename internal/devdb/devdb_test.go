package devdb_test

import (
	"context"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgfence/pglock/internal/devdb"
)

func TestFindTakesTheVariableFirst(t *testing.T) {
	t.Setenv("DEVDB_TEST_URL", "postgres://nowhere.invalid/shop")
	srv, err := devdb.Find(t.Context(), "DEVDB_TEST_URL")
	require.NoError(t, err)
	require.Equal(t, &devdb.Server{URL: "postgres://nowhere.invalid/shop", How: "the server in DEVDB_TEST_URL"},
		&devdb.Server{URL: srv.URL, How: srv.How, Embedded: srv.Embedded})
	require.NoError(t, srv.Stop())
}

// TestFindWithoutServerOrBinariesSaysWhatToDo is a laptop without PostgreSQL, offline:
// the error says what to do, not only that the download failed. No network: the
// downloads go to a local port that refuses connections.
func TestFindWithoutServerOrBinariesSaysWhatToDo(t *testing.T) {
	for _, c := range []struct{ name, binaries, want string }{
		{"no binaries", "", "set PGLOCK_POSTGRES_BINARIES to a directory of PostgreSQL binaries with bin/, lib/ and share/"},
		{"a directory without binaries", "empty", "point PGLOCK_POSTGRES_BINARIES at a directory with bin/pg_ctl"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("DEVDB_TEST_URL", "")
			os.Unsetenv("DEVDB_TEST_URL")
			t.Setenv("PGHOST", t.TempDir()) // no socket there: the libpq defaults reach nothing
			t.Setenv("PGPORT", strconv.Itoa(closedPort(t)))
			t.Setenv("XDG_CACHE_HOME", t.TempDir()) // no cached binaries
			t.Setenv("HOME", t.TempDir())
			binaries := ""
			if c.binaries != "" {
				binaries = t.TempDir()
			}
			t.Setenv(devdb.BinariesEnv, binaries)
			defer devdb.SetBinaryRepositoryURL("http://127.0.0.1:" + strconv.Itoa(closedPort(t)))()

			start := time.Now()
			srv, err := devdb.Find(t.Context(), "DEVDB_TEST_URL")
			if srv != nil {
				_ = srv.Stop()
			}
			require.Error(t, err)
			require.Less(t, time.Since(start), 10*time.Second)
			msg := err.Error()
			require.Contains(t, msg, "no PostgreSQL server. Set DEVDB_TEST_URL to a server's URL")
			require.Contains(t, msg, "start a PostgreSQL server that the libpq defaults reach")
			require.Contains(t, msg, c.want)
			require.Contains(t, msg, "could not be downloaded")
			require.Contains(t, msg, "unable to connect to http://127.0.0.1:", "embedded-postgres's error is kept")
			t.Log(msg)
		})
	}
}

// TestFindStartsAnEmbeddedServer runs when PGLOCK_TEST_EMBEDDED is set, as .ci/embedded
// sets it: with no server reachable, Find must start an embedded PostgreSQL that works.
func TestFindStartsAnEmbeddedServer(t *testing.T) {
	if os.Getenv("PGLOCK_TEST_EMBEDDED") == "" {
		t.Skip("PGLOCK_TEST_EMBEDDED is not set: .ci/embedded runs this with no server reachable")
	}
	start := time.Now()
	srv, err := devdb.Find(t.Context(), "DEVDB_TEST_UNSET_URL")
	require.NoError(t, err)
	defer func() { require.NoError(t, srv.Stop()) }()
	require.True(t, srv.Embedded, srv.How)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	url, err := devdb.EnsureDatabase(ctx, srv.URL, "devdb_embedded")
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(context.WithoutCancel(ctx))
	var version string
	require.NoError(t, conn.QueryRow(ctx, "SELECT version()").Scan(&version))
	t.Logf("%s, started in %v: %s", srv.How, time.Since(start).Round(time.Millisecond), version)
}

// closedPort returns a local TCP port that nothing listens on.
func closedPort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
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

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
