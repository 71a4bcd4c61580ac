// Package testdb makes the databases of the module's tests, on one PostgreSQL server
// per process: each a copy of a template that is migrated once per server and schema
// version. When its test ends, a database whose catalog is still the template's is
// emptied and kept for the process's next test (see reuse.go); any other is dropped
// in the background.
// pglocktest.PostgresURL is its face for users; the root package's internal tests,
// which cannot import pglocktest (it imports the root package), call it directly.
package testdb

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pglock/internal/devdb"
)

// DatabaseURLEnv names the environment variable with the URL of the server that URL
// creates its databases on.
const DatabaseURLEnv = "PGLOCK_TEST_DATABASE_URL"

// Schema is what a test's database holds: what migrates a database to it, and the
// migrations, whose digest names the template.
type Schema struct {
	Migrate    func(ctx context.Context, databaseURL string) error
	Migrations fs.FS
}

// URL returns the URL of a fresh database with schema s, dropped once the test has
// ended (see pglocktest.PostgresURL). The server is the one in DatabaseURLEnv, else
// the one the libpq defaults reach if it answers, else an embedded PostgreSQL shared
// by the tests of the process. With no server at all the test is skipped, saying why,
// except when the CI environment variable is set: then it fails.
func URL(t testing.TB, s Schema) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := server.acquire(ctx)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("pglocktest: no PostgreSQL server (CI is set, so this fails rather than skips): %v", err)
		}
		t.Skipf("pglocktest: no PostgreSQL server: %v", err)
	}
	t.Cleanup(func() { server.release(t) })

	name, ok := server.take() // a database an earlier test left, emptied: no copy, no admin session
	if !ok {
		if name, err = server.create(ctx, s); err != nil {
			t.Fatalf("pglocktest: %v", err)
		}
	}
	dbURL, err := devdb.WithDatabase(srv.URL, name)
	if err != nil {
		t.Fatalf("pglocktest: %v", err)
	}
	if err := server.learn(ctx, dbURL); err != nil {
		t.Fatalf("pglocktest: %v", err)
	}
	t.Cleanup(func() {
		if !server.giveBack(dbURL, name) {
			server.drop(name, t.Name())
		}
	})
	return dbURL
}

// create copies the template of schema s on the server into a new database and returns
// its name.
func (s *sharedServer) create(ctx context.Context, schema Schema) (string, error) {
	s.mu.Lock()
	srv, pool := s.srv, s.admin
	s.mu.Unlock()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return "", fmt.Errorf("connect to %s: %w", srv.How, err)
	}
	defer conn.Release()
	admin := conn.Conn()
	template, err := s.template(ctx, admin, srv.URL, schema)
	if err != nil {
		return "", err
	}
	name := "pglock_test_" + randomHex(6)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name+" TEMPLATE "+template); err != nil {
		return "", fmt.Errorf("create database: %w", err)
	}
	return name, nil
}

// server is the process's PostgreSQL server, found once; an embedded one is stopped
// when the last test using it ends.
var server sharedServer

type sharedServer struct {
	mu    sync.Mutex
	srv   *devdb.Server
	admin *pgxpool.Pool // on srv's own database: copies and drops, without a connection each
	users int
	tpl   string   // the template database on srv, once known
	fresh *state   // the catalog and rows of a copy of tpl, once known
	free  []string // databases emptied by giveBack, for the next tests

	drops    sync.WaitGroup // the drops under way
	dropping chan struct{}  // a token per drop running: dropConns at most
	dropMu   sync.Mutex
	dropErrs []error // of the drops since the last user left
}

// dropConns is how many databases are dropped at once, each on a connection of its
// own, as many as the tests that run at once: drops made together share a checkpoint,
// and the tests count their connections against the server's max_connections.
const dropConns = 8

// adminConns bounds the admin pool: the drops and a few copies at once. Its idle
// connections close after adminIdle. A connection per copy and per drop was a
// tenth of the connections a run of the root package made, each a backend forked and
// set up (a third of the server's CPU in that run went to starting and ending backends).
const (
	adminConns = dropConns + 4
	adminIdle  = time.Second
)

func (s *sharedServer) acquire(ctx context.Context) (*devdb.Server, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv == nil {
		srv, err := devdb.Find(ctx, DatabaseURLEnv)
		if err != nil {
			return nil, err
		}
		cfg, err := pgxpool.ParseConfig(srv.URL)
		if err != nil {
			_ = srv.Stop()
			return nil, err
		}
		cfg.MaxConns, cfg.MaxConnIdleTime = adminConns, adminIdle
		admin, err := pgxpool.NewWithConfig(context.WithoutCancel(ctx), cfg)
		if err != nil {
			_ = srv.Stop()
			return nil, err
		}
		s.srv, s.admin = srv, admin
	}
	s.users++
	return s.srv, nil
}

// release ends a test's use of the server. The last user waits for the drops under
// way, fails t if one failed, and stops an embedded server.
func (s *sharedServer) release(t testing.TB) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.users--; s.users > 0 {
		return
	}
	for _, name := range s.free {
		s.dropOn(s.admin, name, "the tests before it")
	}
	s.free = nil
	s.drops.Wait()
	s.dropMu.Lock()
	for _, err := range s.dropErrs {
		t.Errorf("pglocktest: %v", err)
	}
	s.dropErrs = nil
	s.dropMu.Unlock()
	s.admin.Close()
	_ = s.srv.Stop()
	s.srv, s.admin = nil, nil
	s.tpl = ""
	s.fresh = nil
}

// drop drops the database name of test on a goroutine of its own, at once: a DROP
// DATABASE waits for a checkpoint, which the test need not wait for, and the sooner
// a database goes, the fewer of its pages a checkpoint writes. (Drops kept for later
// and made together left a checkpoint tens of seconds of fsyncs to do.)
func (s *sharedServer) drop(name, test string) {
	s.mu.Lock()
	admin := s.admin
	s.mu.Unlock()
	s.dropOn(admin, name, test)
}

// dropOn is drop, on the admin pool given (release holds mu).
func (s *sharedServer) dropOn(admin *pgxpool.Pool, name, test string) {
	s.dropMu.Lock()
	if s.dropping == nil {
		s.dropping = make(chan struct{}, dropConns)
	}
	dropping := s.dropping
	s.dropMu.Unlock()
	s.drops.Go(func() {
		dropping <- struct{}{}
		defer func() { <-dropping }()
		if err := dropDatabase(admin, name); err != nil {
			s.dropMu.Lock()
			s.dropErrs = append(s.dropErrs, fmt.Errorf("drop database %s of %s: %w", name, test, err))
			s.dropMu.Unlock()
		}
	})
}

func dropDatabase(admin *pgxpool.Pool, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	return err
}

// template returns the name of the database that each test's database is copied from:
// one per server and schema version, migrated once and kept on the server, so a test
// pays for a copy (tens of milliseconds) rather than for every migration. Processes
// that start at once may each build one; the first to rename its build wins and the
// others drop theirs, so the name only ever holds a complete schema. It is marked
// IS_TEMPLATE (any role that may create databases can copy it) and takes no
// connections (one would block the copies).
func (s *sharedServer) template(ctx context.Context, admin *pgx.Conn, serverURL string, schema Schema) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tpl != "" {
		return s.tpl, nil
	}
	name := "pglock_template_" + schemaVersion(schema.Migrations)
	var exists bool
	err := admin.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)", name).Scan(&exists)
	if err != nil {
		return "", fmt.Errorf("look for the template database: %w", err)
	}
	if !exists {
		if err := buildTemplate(ctx, admin, serverURL, name, schema.Migrate); err != nil {
			return "", err
		}
	}
	s.tpl = name
	return name, nil
}

// buildTemplate migrates a new database and renames it to name, unless another process
// got there first.
func buildTemplate(ctx context.Context, admin *pgx.Conn, serverURL, name string, migrate func(context.Context, string) error) error {
	build := "pglock_template_build_" + randomHex(6)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+build); err != nil {
		return fmt.Errorf("create the template database: %w", err)
	}
	url, err := devdb.WithDatabase(serverURL, build)
	if err == nil {
		err = migrate(ctx, url)
	}
	if err == nil {
		_, err = admin.Exec(ctx, "ALTER DATABASE "+build+" WITH IS_TEMPLATE true ALLOW_CONNECTIONS false")
	}
	if err == nil {
		_, err = admin.Exec(ctx, "ALTER DATABASE "+build+" RENAME TO "+name)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // duplicate_database: another process won
			err = nil
		} else if err == nil {
			return nil
		}
	}
	_, _ = admin.Exec(ctx, "ALTER DATABASE "+build+" WITH IS_TEMPLATE false")
	if _, dropErr := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+build+" WITH (FORCE)"); err == nil && dropErr != nil {
		err = dropErr
	}
	if err != nil {
		return fmt.Errorf("build the template database: %w", err)
	}
	return nil
}

// schemaVersion names the schema of migrations: their digest.
func schemaVersion(migrations fs.FS) string {
	h := sha256.New()
	_ = fs.WalkDir(migrations, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(migrations, path)
		fmt.Fprintf(h, "%s %d\n", path, len(b))
		h.Write(b)
		return err
	})
	return hex.EncodeToString(h.Sum(nil))[:16]
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
