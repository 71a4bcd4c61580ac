// Package pgserver finds a PostgreSQL server for pglock's tests and examples: the URL
// in an environment variable, else the libpq defaults when a server answers there,
// else an embedded PostgreSQL started for the process.
package pgserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	embeddedpostgres "github.com/fergusstrange/embedded-postgres"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// BinariesEnv names local PostgreSQL binaries (a directory with bin/, lib/, share/)
// for the embedded server, for machines that cannot download them.
const BinariesEnv = "PGLOCK_POSTGRES_BINARIES"

// Server is a PostgreSQL server to connect to.
type Server struct {
	// URL is a postgres:// URL of a database on the server that the caller may
	// connect to and create databases from.
	URL string
	// How says how it was found, for a log line.
	How string
	// Stop stops the server if this process started it; otherwise it does nothing.
	Stop func() error
}

// Find returns the server at the URL in the environment variable envVar (when set),
// else the one the libpq defaults reach (PGHOST, PGPORT, PGUSER, the local socket)
// when it answers, else an embedded PostgreSQL it starts, with its files under the
// user's cache directory.
func Find(ctx context.Context, envVar string) (*Server, error) {
	noop := func() error { return nil }
	if u := os.Getenv(envVar); u != "" {
		return &Server{URL: u, How: "the server in " + envVar, Stop: noop}, nil
	}
	pingCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if conn, err := pgx.Connect(pingCtx, ""); err == nil {
		u := URLOf(&conn.Config().Config)
		_ = conn.Close(pingCtx)
		return &Server{URL: u, How: "the server the libpq defaults reach", Stop: noop}, nil
	}
	return startEmbedded()
}

// URLOf returns a postgres:// URL for the database cfg connects to.
func URLOf(cfg *pgconn.Config) string {
	u := url.URL{Scheme: "postgres", Path: "/" + cfg.Database}
	if cfg.Password != "" {
		u.User = url.UserPassword(cfg.User, cfg.Password)
	} else {
		u.User = url.User(cfg.User)
	}
	q := url.Values{}
	q.Set("host", cfg.Host) // a host name or a socket directory
	q.Set("port", strconv.Itoa(int(cfg.Port)))
	if cfg.TLSConfig == nil {
		q.Set("sslmode", "disable")
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// WithDatabase returns serverURL with its database replaced by name.
func WithDatabase(serverURL, name string) (string, error) {
	u, err := url.Parse(serverURL)
	if err != nil {
		return "", err
	}
	u.Path = "/" + name
	return u.String(), nil
}

func startEmbedded() (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	runtime, err := os.MkdirTemp("", "pglock-postgres-")
	if err != nil {
		return nil, err
	}
	cfg := embeddedpostgres.DefaultConfig().
		Port(uint32(port)).
		RuntimePath(runtime).
		CachePath(filepath.Join(cache, "pglock", "embedded-postgres")).
		Logger(io.Discard).
		StartTimeout(time.Minute)
	if bin := os.Getenv(BinariesEnv); bin != "" {
		cfg = cfg.BinariesPath(bin)
	}
	db := embeddedpostgres.NewDatabase(cfg)
	if err := db.Start(); err != nil {
		_ = os.RemoveAll(runtime)
		return nil, fmt.Errorf("no PostgreSQL server answers, and an embedded one did not start: %w", err)
	}
	return &Server{
		URL: fmt.Sprintf("postgres://postgres:postgres@127.0.0.1:%d/postgres?sslmode=disable", port),
		How: "an embedded PostgreSQL on port " + strconv.Itoa(port),
		Stop: func() error {
			return errors.Join(db.Stop(), os.RemoveAll(runtime))
		},
	}, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// EnsureDatabase creates the database name on the server serverURL points at, unless
// it exists, and returns its URL: the examples work in databases of their own.
func EnsureDatabase(ctx context.Context, serverURL, name string) (string, error) {
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return "", fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	var pgErr *pgconn.PgError
	if err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "42P04") { // duplicate_database
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	return WithDatabase(serverURL, name)
}
