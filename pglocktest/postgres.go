package pglocktest

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

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/devdb"
)

// DatabaseURLEnv names the environment variable with the URL of the server that
// Postgres and PostgresURL create their databases on.
const DatabaseURLEnv = "PGLOCK_TEST_DATABASE_URL"

// PostgresURL returns the URL of a fresh database with the pglock schema, dropped when
// the test ends. The database is a copy of a template database that the first call
// migrates and that stays on the server, named pglock_template_ and a digest of the
// schema: a new schema version gets a template of its own, and old ones may be dropped
// by hand. The server is the one in PGLOCK_TEST_DATABASE_URL, else the one the
// libpq defaults reach if it answers, else an embedded PostgreSQL shared by the tests
// of the process (its binaries from PGLOCK_POSTGRES_BINARIES when set). With no server
// at all the test is skipped, saying why, except when the CI environment variable is
// set: then it fails.
func PostgresURL(t testing.TB) string {
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
	t.Cleanup(server.release)

	name := "pglock_test_" + randomHex(6)
	admin, err := pgx.Connect(ctx, srv.URL)
	if err != nil {
		t.Fatalf("pglocktest: connect to %s: %v", srv.How, err)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	template, err := server.template(ctx, admin, srv.URL)
	if err != nil {
		t.Fatalf("pglocktest: %v", err)
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name+" TEMPLATE "+template); err != nil {
		t.Fatalf("pglocktest: create database: %v", err)
	}
	dbURL, err := devdb.WithDatabase(srv.URL, name)
	if err != nil {
		t.Fatalf("pglocktest: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, srv.URL)
		if err != nil {
			t.Errorf("pglocktest: drop database %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("pglocktest: drop database %s: %v", name, err)
		}
	})
	return dbURL
}

// Postgres returns a pool of up to 20 connections on a fresh database with the pglock
// schema (see PostgresURL), closed and dropped when the test ends.
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

// server is the process's PostgreSQL server, found once; an embedded one is stopped
// when the last test using it ends.
var server sharedServer

type sharedServer struct {
	mu    sync.Mutex
	srv   *devdb.Server
	users int
	tpl   string // the template database on srv, once known
}

func (s *sharedServer) acquire(ctx context.Context) (*devdb.Server, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv == nil {
		srv, err := devdb.Find(ctx, DatabaseURLEnv)
		if err != nil {
			return nil, err
		}
		s.srv = srv
	}
	s.users++
	return s.srv, nil
}

func (s *sharedServer) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.users--; s.users == 0 {
		_ = s.srv.Stop()
		s.srv = nil
		s.tpl = ""
	}
}

// template returns the name of the database that each test's database is copied from:
// one per server and schema version, migrated once and kept on the server, so a test
// pays for a copy (tens of milliseconds) rather than for every migration. Processes
// that start at once may each build one; the first to rename its build wins and the
// others drop theirs, so the name only ever holds a complete schema. It is marked
// IS_TEMPLATE (any role that may create databases can copy it) and takes no
// connections (one would block the copies).
func (s *sharedServer) template(ctx context.Context, admin *pgx.Conn, serverURL string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tpl != "" {
		return s.tpl, nil
	}
	name := "pglock_template_" + schemaVersion()
	var exists bool
	err := admin.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)", name).Scan(&exists)
	if err != nil {
		return "", fmt.Errorf("look for the template database: %w", err)
	}
	if !exists {
		if err := buildTemplate(ctx, admin, serverURL, name); err != nil {
			return "", err
		}
	}
	s.tpl = name
	return name, nil
}

// buildTemplate migrates a new database and renames it to name, unless another process
// got there first.
func buildTemplate(ctx context.Context, admin *pgx.Conn, serverURL, name string) error {
	build := "pglock_template_build_" + randomHex(6)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+build); err != nil {
		return fmt.Errorf("create the template database: %w", err)
	}
	url, err := devdb.WithDatabase(serverURL, build)
	if err == nil {
		err = pglock.Migrate(ctx, url)
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

// schemaVersion names the schema of this build: a digest of pglock's migrations.
func schemaVersion() string {
	h := sha256.New()
	_ = fs.WalkDir(pglock.Migrations(), ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(pglock.Migrations(), path)
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
