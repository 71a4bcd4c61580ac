package pglock_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/devdb"
	"github.com/pgfence/pglock/internal/testkit"
	"github.com/pgfence/pglock/pglocktest"
)

// TestMain checks that nothing leaves a goroutine behind, runs defaultParallel tests at
// once, and gives the examples what a user's environment would give them: DATABASE_URL,
// here naming a fresh database with the pglock schema.
func TestMain(m *testing.M) {
	testkit.NoExitSleep() // README's programs, built with -race when the tests are
	goleak.VerifyTestMain(withExampleDatabase{m})
}

// withExampleDatabase runs the tests with DATABASE_URL set to a database of their own,
// dropped afterwards, before goleak looks for leaks. Without a PostgreSQL server the
// examples are skipped, as pglocktest skips the tests, except when CI is set.
type withExampleDatabase struct{ m *testing.M }

func (w withExampleDatabase) Run() int {
	drop, err := createExampleDatabase()
	parallelByDefault() // once the server is known
	if err != nil {
		if os.Getenv("CI") != "" {
			fmt.Fprintf(os.Stderr, "pglock: no database for the examples (CI is set, so this fails rather than skips): %v\n", err)
			return 1
		}
		fmt.Fprintf(os.Stderr, "pglock: examples skipped: no database for them: %v\n", err)
		if err := skipExamples(); err != nil {
			fmt.Fprintln(os.Stderr, "pglock:", err)
			return 1
		}
		return w.m.Run()
	}
	defer drop()
	return w.m.Run()
}

// createExampleDatabase creates a database with the pglock schema on the server that
// pglocktest uses, sets DATABASE_URL to it, and returns a function that drops it.
func createExampleDatabase() (drop func(), err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := devdb.Find(ctx, pglocktest.DatabaseURLEnv)
	if err != nil {
		return nil, err
	}
	if os.Getenv(pglocktest.DatabaseURLEnv) == "" {
		// pglocktest's databases go to the same server: an embedded one is started once.
		os.Setenv(pglocktest.DatabaseURLEnv, srv.URL)
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "pglock_example_" + hex.EncodeToString(b)
	url, err := devdb.EnsureDatabase(ctx, srv.URL, name)
	if err == nil {
		err = pglock.Migrate(ctx, url)
	}
	drop = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if conn, err := pgx.Connect(ctx, srv.URL); err != nil {
			fmt.Fprintf(os.Stderr, "pglock: drop database %s: %v\n", name, err)
		} else {
			if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
				fmt.Fprintf(os.Stderr, "pglock: drop database %s: %v\n", name, err)
			}
			_ = conn.Close(ctx)
		}
		_ = srv.Stop()
	}
	if err != nil {
		drop()
		return nil, err
	}
	os.Setenv("DATABASE_URL", url)
	return drop, nil
}

// defaultParallel is how many tests run at once unless -parallel says otherwise. Go's
// default, GOMAXPROCS, suits tests that keep a CPU busy; these mostly wait (for the
// database clock to pass a ttl, a silent link, a round trip), with PostgreSQL doing
// much of the work: two at a time on a 2-core machine left it idle most of the run.
// Each test has a database of its own; the tests that count the process's goroutines
// or its heap do not call t.Parallel, so they run alone, before the others.
const defaultParallel = 8

// parallelByDefault sets -test.parallel, unless the command line set it, to
// defaultParallel, or fewer when the server's max_connections would not take them,
// never fewer than Go's default, GOMAXPROCS.
func parallelByDefault() {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if given {
		return
	}
	n := defaultParallel
	if conns := serverMaxConnections(); conns > 0 {
		n = min(n, (conns-pglock.ConnsBeside)/pglock.ConnsPerTest)
	}
	_ = flag.Set("test.parallel", strconv.Itoa(max(runtime.GOMAXPROCS(0), n)))
}

// serverMaxConnections returns the max_connections of the tests' server, or 0 when it
// cannot tell.
func serverMaxConnections() int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, os.Getenv(pglocktest.DatabaseURLEnv))
	if err != nil {
		return 0
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var n int
	if err := conn.QueryRow(ctx, "SELECT current_setting('max_connections')::int").Scan(&n); err != nil {
		return 0
	}
	return n
}

// skipExamples adds the examples to -test.skip.
func skipExamples() error {
	flag.Parse()
	skip := flag.Lookup("test.skip")
	if skip == nil {
		return errors.New("no -test.skip flag to skip the examples with")
	}
	pattern := "^Example"
	if s := skip.Value.String(); s != "" {
		pattern = s + "|" + pattern
	}
	return skip.Value.Set(pattern)
}

// TestPglocktestExample runs the test that Example_pglocktest shows: go doc shows a
// file as one example only when it declares no Test function, so it is run from here.
func TestPglocktestExample(t *testing.T) {
	t.Parallel()
	testPausedInstanceWriteIsRefused(t)
}
