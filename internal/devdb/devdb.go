// Package devdb is how pglock's examples, its test kit (pglocktest) and its own tests
// find a PostgreSQL on a laptop, so that `go run ./example/tryit` and `go test ./...`
// work on a fresh machine:
//
//  1. the URL in an environment variable (DATABASE_URL for the examples), when set;
//  2. else the server the libpq defaults reach (PGHOST, PGPORT, PGUSER, PGPASSWORD,
//     the local socket), when one answers within 3 s;
//  3. else an embedded PostgreSQL started for the process, its binaries downloaded
//     once into the user's cache directory (offline, BinariesEnv names local ones).
//
// Then EnsureDatabase gives a program a database of its own on that server.
//
// Programs outside the module (the examples, which users copy) reach it through
// package pglockdev, its small public face; pglocktest and the module's own tests use it
// directly. It is for development only: a deployed program is given its URL.
package devdb

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

// BinariesEnv names the environment variable with a directory of local PostgreSQL
// binaries (bin/, lib/, share/) for the embedded server, for machines that cannot
// download them. Debian's and Ubuntu's /usr/lib/postgresql/<version> (the postgresql
// package, its server not running) works as it is. initdb refuses to run as root.
const BinariesEnv = "PGLOCK_POSTGRES_BINARIES"

// Server is a PostgreSQL server to connect to.
type Server struct {
	// URL is a postgres:// URL of a database on the server that the caller may
	// connect to and create databases from.
	URL string
	// How says where it was found, for a person: "the server in DATABASE_URL", "the
	// server the libpq defaults reach" or "an embedded PostgreSQL on port 54321".
	How string
	// Embedded reports whether Find started the server: Stop stops it.
	Embedded bool
	// Stop stops the server if Find started it, and removes its files; otherwise it
	// does nothing. Call it once, when the process is done with the server.
	Stop func() error
}

// Find returns the server at the URL in the environment variable envVar when it is
// set, else the one the libpq defaults reach when it answers, else an embedded
// PostgreSQL it starts on a free port, with its files in a temporary directory that
// Stop removes. ctx bounds the search, not the embedded server's start (up to a
// minute, more the first time: it downloads the binaries). When none is found, the
// error says what to do: set envVar, start a server, or set BinariesEnv.
func Find(ctx context.Context, envVar string) (*Server, error) {
	noop := func() error { return nil }
	if u := os.Getenv(envVar); u != "" {
		return &Server{URL: u, How: "the server in " + envVar, Stop: noop}, nil
	}
	pingCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, pingErr := pgx.Connect(pingCtx, "")
	if pingErr == nil {
		u := URLOf(&conn.Config().Config)
		_ = conn.Close(pingCtx)
		return &Server{URL: u, How: "the server the libpq defaults reach", Stop: noop}, nil
	}
	return startEmbedded(envVar, pingErr)
}

// URLOf returns a postgres:// URL for the database cfg connects to, with its host (a
// name, an address or a socket directory) and port in the query.
func URLOf(cfg *pgconn.Config) string {
	u := url.URL{Scheme: "postgres", Path: "/" + cfg.Database}
	if cfg.Password != "" {
		u.User = url.UserPassword(cfg.User, cfg.Password)
	} else {
		u.User = url.User(cfg.User)
	}
	q := url.Values{}
	q.Set("host", cfg.Host)
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

// EnsureDatabase creates the database name on the server serverURL points at, unless
// it exists, and returns its URL: each example works in a database of its own, and
// never creates or drops anything in another. ctx bounds the connection and the
// statement.
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

// binaryRepositoryURL, when set, replaces the repository embedded-postgres downloads
// the binaries from: a test points it at an address that refuses connections.
var binaryRepositoryURL string

// startEmbedded starts an embedded PostgreSQL. pingErr says why the libpq defaults
// reached no server; an error says what the person can do instead.
func startEmbedded(envVar string, pingErr error) (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	cache = filepath.Join(cache, "pglock", "embedded-postgres")
	runtime, err := os.MkdirTemp("", "pglock-postgres-")
	if err != nil {
		return nil, err
	}
	cfg := embeddedpostgres.DefaultConfig().
		Port(uint32(port)).
		RuntimePath(runtime).
		CachePath(cache).
		Logger(io.Discard).
		StartTimeout(time.Minute)
	bin := os.Getenv(BinariesEnv)
	if bin != "" {
		cfg = cfg.BinariesPath(bin)
	}
	if binaryRepositoryURL != "" {
		cfg = cfg.BinaryRepositoryURL(binaryRepositoryURL)
	}
	db := embeddedpostgres.NewDatabase(cfg)
	if err := db.Start(); err != nil {
		_ = os.RemoveAll(runtime)
		return nil, fmt.Errorf("%s. Tried: %s is not set, the libpq defaults reach no server (%v), and an embedded PostgreSQL did not start: %w",
			advice(envVar, bin, cache), envVar, pingErr, err)
	}
	return &Server{
		URL:      fmt.Sprintf("postgres://postgres:postgres@127.0.0.1:%d/postgres?sslmode=disable", port),
		How:      "an embedded PostgreSQL on port " + strconv.Itoa(port),
		Embedded: true,
		Stop: func() error {
			return errors.Join(db.Stop(), os.RemoveAll(runtime))
		},
	}, nil
}

// advice says what to do when no server was found and an embedded one, with the
// binaries in bin ("": downloaded ones, cached in cache), did not start.
func advice(envVar, bin, cache string) string {
	say := fmt.Sprintf("no PostgreSQL server. Set %s to a server's URL (postgres://user:password@host:5432/dbname), "+
		"or start a PostgreSQL server that the libpq defaults reach (PGHOST, PGPORT, PGUSER, PGPASSWORD; "+
		"by default the local socket and port 5432)", envVar)
	_, err := os.Stat(filepath.Join(bin, "bin", "pg_ctl"))
	local := bin != "" && err == nil
	downloaded, _ := filepath.Glob(filepath.Join(cache, "embedded-postgres-binaries-*"))
	switch {
	case local:
		say += fmt.Sprintf(", or check the PostgreSQL binaries in %s (%s)", BinariesEnv, bin)
	case len(downloaded) > 0:
	case bin == "":
		say += fmt.Sprintf(", or set %s to a directory of PostgreSQL binaries with bin/, lib/ and share/ "+
			"(on Debian and Ubuntu, /usr/lib/postgresql/<version> of the postgresql package): "+
			"the binaries for an embedded PostgreSQL could not be downloaded", BinariesEnv)
	default:
		say += fmt.Sprintf(", or point %s at a directory with bin/pg_ctl (%s has none, "+
			"and the binaries for an embedded PostgreSQL could not be downloaded into it)", BinariesEnv, bin)
	}
	if os.Geteuid() == 0 {
		say += ". An embedded PostgreSQL does not start as root (initdb refuses root): run this as another user"
	}
	return say
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
