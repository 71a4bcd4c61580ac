package pglocktest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/example/devdb"
)

// DatabaseURLEnv names the environment variable with the URL of the server that
// Postgres and PostgresURL create their databases on.
const DatabaseURLEnv = "PGLOCK_TEST_DATABASE_URL"

// PostgresURL returns the URL of a fresh database with the pglock schema, dropped when
// the test ends. The server is the one in PGLOCK_TEST_DATABASE_URL, else the one the
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
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
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
	if err := pglock.Migrate(ctx, dbURL); err != nil {
		t.Fatalf("pglocktest: %v", err)
	}
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
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
