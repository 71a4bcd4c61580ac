//go:build unix

package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
)

// The crash tests need a PostgreSQL server of their own that they may crash: .ci/crash
// starts one and sets these.
const (
	crashURLEnv     = "PGLOCK_CRASH_URL"     // the server's URL
	crashRestartEnv = "PGLOCK_CRASH_RESTART" // a shell command: stop it as a crash would (-m immediate), start it again
)

// crashServer returns the crash server's URL, migrated, and a function that crashes and
// restarts it. The test is skipped without one.
func crashServer(t *testing.T) (url string, crash func()) {
	url, restart := os.Getenv(crashURLEnv), os.Getenv(crashRestartEnv)
	if url == "" || restart == "" {
		t.Skipf("no server to crash: run .ci/crash (it sets %s and %s)", crashURLEnv, crashRestartEnv)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, pglock.Migrate(ctx, url))
	return url, func() {
		t.Helper()
		out, err := exec.Command("sh", "-c", restart).CombinedOutput()
		require.NoError(t, err, "crash and restart: %s", out)
	}
}

// crashClient returns a client on a pool of its own, closed after the test or by the
// returned function, whichever comes first (a crash breaks the pool's connections).
func crashClient(t *testing.T, url, instance string) (*pglock.Client, *pgxpool.Pool, func()) {
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	c, err := pglock.New(pool, pglock.WithoutListener(), pglock.WithInstanceName(instance))
	require.NoError(t, err)
	closed := false
	done := func() {
		if closed {
			return
		}
		closed = true
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Close(ctx) // after a crash, nothing it held is worth an error here
		pool.Close()
	}
	t.Cleanup(done)
	return c, pool, done
}

// TestCrashLosesAReleaseOnlyUntilItsExpiry: a release commits without waiting for its
// flush, so a crash right after it can lose it. The key then comes back held by the
// owner that released it, with its token, until the expiry it had; the next holder gets
// it at that expiry, with a greater token, and never before. The crash must actually
// lose a release for the test to pass: a release that a background flush saved is tried
// again on another key.
func TestCrashLosesAReleaseOnlyUntilItsExpiry(t *testing.T) {
	url, crash := crashServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Longer than a restart on a loaded machine (2 to 4 s here), which the test waits
	// out: a lease that expires during the restart shows nothing.
	const ttl = 8 * time.Second
	for attempt := 1; attempt <= 5; attempt++ {
		key := fmt.Sprintf("crash/lost-release/%d/%d", time.Now().UnixNano(), attempt)
		a, _, closeA := crashClient(t, url, "crash-a")
		l, err := a.TryAcquire(ctx, key, pglock.TTL(ttl))
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		crash()
		closeA()

		b, pool, _ := crashClient(t, url, "crash-b")
		h, err := storeHolder(ctx, pglock.NewPostgresStore(pool), key)
		require.NoError(t, err)
		if !h.Held {
			// A released row has no owner; a row whose release was lost keeps it after
			// its expiry.
			var owner *string
			require.NoError(t, pool.QueryRow(ctx, `SELECT owner FROM pglock.locks WHERE key = $1`, key).Scan(&owner))
			if owner == nil {
				t.Logf("attempt %d: the release was flushed before the crash; again", attempt)
			} else {
				t.Logf("attempt %d: the crash lost the release, but the restart outlasted the ttl; again", attempt)
			}
			continue
		}
		require.Equal(t, l.Owner(), h.Owner, "a lost release brings back its own holder, nobody else")
		require.Equal(t, l.Token(), h.Token, "and its token")
		require.LessOrEqual(t, h.ExpiresIn, ttl, "until the expiry it had, no later")
		t.Logf("attempt %d: the crash lost the release: %s holds %q again with token %d for %v more",
			attempt, h.Owner, key, h.Token, h.ExpiresIn.Round(time.Millisecond))

		_, err = b.TryAcquire(ctx, key)
		require.ErrorIs(t, err, pglock.ErrNotAcquired, "the key is not free before the expiry")
		start := time.Now()
		l2, err := b.Acquire(ctx, key, pglock.Wait(ttl+5*time.Second))
		require.NoError(t, err)
		waited := time.Since(start)
		require.Greater(t, l2.Token(), l.Token(), "the next holder's token is greater")
		// Its retries back off up to 1 s: a second for them, one for a loaded machine.
		require.LessOrEqual(t, waited, h.ExpiresIn+2*time.Second, "the next holder waited for the expiry, not much longer")
		t.Logf("the next holder took %q with token %d after %v", key, l2.Token(), waited.Round(time.Millisecond))
		require.NoError(t, l2.Release(ctx))
		return
	}
	t.Fatal("no crash lost a release in 5 attempts: the releases are flushed before they return")
}

// TestCrashAfterAReleaseAndAnAcquisitionKeepsBoth: an acquisition that follows a release
// waits for its own flush, and the WAL is one sequence, so the release is flushed with
// it: no crash brings back the released holder once another has the key.
func TestCrashAfterAReleaseAndAnAcquisitionKeepsBoth(t *testing.T) {
	url, crash := crashServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	key := fmt.Sprintf("crash/release-then-acquire/%d", time.Now().UnixNano())
	a, _, closeA := crashClient(t, url, "crash-a")
	b, _, closeB := crashClient(t, url, "crash-b")
	la, err := a.TryAcquire(ctx, key, pglock.TTL(10*time.Second))
	require.NoError(t, err)
	require.NoError(t, la.Release(ctx))
	lb, err := b.TryAcquire(ctx, key, pglock.TTL(10*time.Second))
	require.NoError(t, err)
	crash()

	// Read before the clients close: b's Close would hand the key back.
	_, pool, _ := crashClient(t, url, "crash-c")
	h, err := storeHolder(ctx, pglock.NewPostgresStore(pool), key)
	require.NoError(t, err)
	require.True(t, h.Held, "the acquisition survived the crash")
	require.Equal(t, lb.Owner(), h.Owner, "the acquisition survived the crash, and with it the release before it")
	require.Equal(t, lb.Token(), h.Token)
	require.Greater(t, h.Token, la.Token())
	closeA()
	closeB()
}

// syncOff is one place synchronous_commit = off can come from: the statements run on a
// connection to url, after setup (nil when the setting is already there at connect).
type syncOff struct {
	source string
	url    string
	setup  string
}

// durableStatement is one of the statements that must survive a crash whatever
// synchronous_commit says: it runs on the connection where the setting is off, right
// before the crash, and check reads what survived on a connection that is fine.
type durableStatement struct {
	name string
	// held lists the keys a holder must have durably before the statement runs;
	// released the keys that must have a released row.
	held, released []string
	run            func(ctx context.Context, c *pgx.Conn, key func(string) string) (any, error)
	check          func(ctx context.Context, c *pgx.Conn, key func(string) string, result any) error
}

const crashHour = int64(time.Hour / time.Millisecond)

// durableStatements: an acquisition (a new key, a released key), an acquisition by a
// waiter's call, a semaphore's permit, a renewal, a batched renewal and a force-release.
var durableStatements = []durableStatement{
	{
		name: "lock_acquire of a new key",
		run: func(ctx context.Context, c *pgx.Conn, key func(string) string) (any, error) {
			return scanToken(c.QueryRow(ctx, `SELECT pglock.lock_acquire($1, 'A', $2)`, key("k"), crashHour))
		},
		check: checkStillHeldByA,
	},
	{
		name:     "lock_acquire of a released key",
		released: []string{"k"},
		run: func(ctx context.Context, c *pgx.Conn, key func(string) string) (any, error) {
			return scanToken(c.QueryRow(ctx, `SELECT pglock.lock_acquire($1, 'A', $2)`, key("k"), crashHour))
		},
		check: checkStillHeldByA,
	},
	{
		name: "lock_acquire_or_want that acquires",
		run: func(ctx context.Context, c *pgx.Conn, key func(string) string) (any, error) {
			return scanToken(c.QueryRow(ctx, `SELECT pglock.lock_acquire_or_want($1, 'A', $2)`, key("k"), crashHour))
		},
		check: checkStillHeldByA,
	},
	{
		name: "sem_acquire of a permit",
		run: func(ctx context.Context, c *pgx.Conn, key func(string) string) (any, error) {
			return scanToken(c.QueryRow(ctx, `SELECT fencing_token FROM pglock.sem_acquire($1, 'A', $2, 1)`, key("s"), crashHour))
		},
		check: func(ctx context.Context, c *pgx.Conn, key func(string) string, result any) error {
			// A permit's row is not a lock's key (lock_holder refuses U+001F): list it.
			var owner *string
			var token *int64
			if err := c.QueryRow(ctx, `SELECT owner, fencing_token FROM pglock.lock_list($1) WHERE key = $1 AND held`,
				key("s")+"\x1f1").Scan(&owner, &token); err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
			if owner == nil || *owner != "A" || token == nil || *token != result.(int64) {
				return fmt.Errorf("A took permit 1 with token %d, after the crash its holder is %q with token %d", result, deref(owner), deref(token))
			}
			var b *int64
			if err := c.QueryRow(ctx, `SELECT fencing_token FROM pglock.sem_acquire($1, 'B', 1000, 1)`, key("s")).Scan(&b); err != nil {
				return err
			}
			if b != nil {
				return fmt.Errorf("B took a permit too, with token %d", *b)
			}
			return nil
		},
	},
	{
		name: "lock_renew",
		held: []string{"k"},
		run: func(ctx context.Context, c *pgx.Conn, key func(string) string) (any, error) {
			var ok bool
			err := c.QueryRow(ctx, `SELECT pglock.lock_renew($1, 'holder', $2)`, key("k"), crashHour).Scan(&ok)
			if err == nil && !ok {
				err = errors.New("not renewed")
			}
			return nil, err
		},
		check: func(ctx context.Context, c *pgx.Conn, key func(string) string, _ any) error {
			return checkRenewed(ctx, c, key("k"))
		},
	},
	{
		name: "lock_renew_many",
		held: []string{"k1", "k2"},
		run: func(ctx context.Context, c *pgx.Conn, key func(string) string) (any, error) {
			rows, err := c.Query(ctx, `SELECT pglock.lock_renew_many($1, $2, $3)`,
				[]string{key("k2"), key("k1")}, []string{"holder", "holder"}, crashHour)
			if err != nil {
				return nil, err
			}
			renewed, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err == nil && len(renewed) != 2 {
				err = fmt.Errorf("renewed %q", renewed)
			}
			return nil, err
		},
		check: func(ctx context.Context, c *pgx.Conn, key func(string) string, _ any) error {
			return errors.Join(checkRenewed(ctx, c, key("k1")), checkRenewed(ctx, c, key("k2")))
		},
	},
	{
		name: "lock_force_release",
		held: []string{"k"},
		run: func(ctx context.Context, c *pgx.Conn, key func(string) string) (any, error) {
			var owner *string
			err := c.QueryRow(ctx, `SELECT owner FROM pglock.lock_force_release($1)`, key("k")).Scan(&owner)
			if err == nil && (owner == nil || *owner != "holder") {
				err = fmt.Errorf("broke %v", owner)
			}
			return nil, err
		},
		check: func(ctx context.Context, c *pgx.Conn, key func(string) string, _ any) error {
			var owner *string
			if err := c.QueryRow(ctx, `SELECT owner FROM pglock.lock_holder($1)`, key("k")).Scan(&owner); err != nil {
				return err
			}
			if owner != nil {
				return fmt.Errorf("the force-release was lost: %s holds the key again", *owner)
			}
			return nil
		},
	},
}

func scanToken(row pgx.Row) (any, error) {
	var token *int64
	if err := row.Scan(&token); err != nil {
		return nil, err
	}
	if token == nil || *token <= 0 {
		return nil, fmt.Errorf("not acquired: %v", token)
	}
	return *token, nil
}

// checkStillHeldByA: A's acquisition survived with its token, and B is refused.
func checkStillHeldByA(ctx context.Context, c *pgx.Conn, key func(string) string, result any) error {
	var owner *string
	var token *int64
	if err := c.QueryRow(ctx, `SELECT owner, fencing_token FROM pglock.lock_holder($1)`, key("k")).Scan(&owner, &token); err != nil {
		return err
	}
	if owner == nil || *owner != "A" || token == nil || *token != result.(int64) {
		return fmt.Errorf("A acquired with token %d, after the crash the holder is %q with token %d", result, deref(owner), deref(token))
	}
	var b *int64
	if err := c.QueryRow(ctx, `SELECT pglock.lock_acquire($1, 'B', 1000)`, key("k")).Scan(&b); err != nil {
		return err
	}
	if b != nil {
		return fmt.Errorf("B acquired it too, with token %d", *b)
	}
	return nil
}

// checkRenewed: the renewal to an hour survived (the key was held for a minute before).
func checkRenewed(ctx context.Context, c *pgx.Conn, key string) error {
	var owner *string
	var expiresInUS *int64
	if err := c.QueryRow(ctx, `SELECT owner, expires_in_us FROM pglock.lock_holder($1)`, key).Scan(&owner, &expiresInUS); err != nil {
		return err
	}
	if owner == nil || *owner != "holder" || *expiresInUS < int64(30*time.Minute/time.Microsecond) {
		return fmt.Errorf("the renewal of %q to an hour was lost: holder %v, expires in %v", key, deref(owner),
			time.Duration(deref(expiresInUS))*time.Microsecond)
	}
	return nil
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// crashConn connects to url, with synchronous_commit set to sync for the session when
// sync is not empty.
func crashConn(t *testing.T, ctx context.Context, url, sync string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	if sync != "" {
		cfg.RuntimeParams["synchronous_commit"] = sync
	}
	c, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// crashAfterDurableStatements runs every durable statement on a connection of each
// case, where synchronous_commit is off, crashes the server right after the last one,
// and returns those it lost. The setup (locks held before the statements) is
// flushed before any statement runs.
//
// The WAL writer is stopped (SIGSTOP) from the first statement to the crash: else it
// writes the WAL of every full page to the kernel, whose page cache outlives an
// immediate shutdown, and only the statements of the last page could be lost; this test
// could not fail for the others. It is killed (SIGKILL) to begin the crash. A statement
// that does not wait for its own flush is then surely lost, as the last statement before
// the crash is: an asynchronous release, which must be lost for the test to pass.
func crashAfterDurableStatements(t *testing.T, ctx context.Context, serverURL string, crash func(), cases []syncOff) (lost []string) {
	t.Helper()
	type prepared struct {
		syncOff
		conn    *pgx.Conn
		results []any
	}
	run := time.Now().UnixNano()
	keyOf := func(source string, i int) func(string) string {
		return func(name string) string { return fmt.Sprintf("crash/sync-off/%d/%s/%d/%s", run, source, i, name) }
	}
	control := func(source string) string { return fmt.Sprintf("crash/sync-off/%d/%s/control", run, source) }
	var ps []*prepared
	for _, c := range cases {
		admin := crashConn(t, ctx, c.url, "on")
		for i, s := range durableStatements {
			for _, k := range append(append([]string{}, s.held...), s.released...) {
				var token *int64
				require.NoError(t, admin.QueryRow(ctx, `SELECT pglock.lock_acquire($1, 'holder', 60000)`, keyOf(c.source, i)(k)).Scan(&token))
				require.NotNil(t, token)
			}
			for _, k := range s.released {
				var ok bool
				require.NoError(t, admin.QueryRow(ctx, `SELECT pglock.lock_release($1, 'holder')`, keyOf(c.source, i)(k)).Scan(&ok))
				require.True(t, ok)
			}
		}
		var token *int64
		require.NoError(t, admin.QueryRow(ctx, `SELECT pglock.lock_acquire($1, 'holder', 60000)`, control(c.source)).Scan(&token))
		require.NotNil(t, token)
		conn := crashConn(t, ctx, c.url, "")
		if c.setup != "" {
			_, err := conn.Exec(ctx, c.setup)
			require.NoError(t, err)
		}
		var setting string
		require.NoError(t, conn.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&setting))
		require.Equal(t, "off", setting, "synchronous_commit from the %s", c.source)
		ps = append(ps, &prepared{syncOff: c, conn: conn})
	}
	// Nothing durable from here to the crash but the statements under test.
	killWALWriter := stopWALWriter(t, ctx, serverURL)
	for _, p := range ps {
		for i, s := range durableStatements {
			r, err := s.run(ctx, p.conn, keyOf(p.source, i))
			require.NoError(t, err, "%s, synchronous_commit off from the %s", s.name, p.source)
			p.results = append(p.results, r)
		}
	}
	for _, p := range ps {
		var ok bool
		require.NoError(t, p.conn.QueryRow(ctx, `SELECT pglock.lock_release_async($1, 'holder')`, control(p.source)).Scan(&ok))
		require.True(t, ok)
	}
	start := time.Now()
	killWALWriter()
	crash()
	t.Logf("crash and restart: %v", time.Since(start).Round(time.Millisecond))

	for _, p := range ps {
		admin := crashConn(t, ctx, p.url, "on")
		for i, s := range durableStatements {
			if err := s.check(ctx, admin, keyOf(p.source, i), p.results[i]); err != nil {
				lost = append(lost, fmt.Sprintf("%s, synchronous_commit off from the %s: %v", s.name, p.source, err))
			}
		}
		var owner *string
		require.NoError(t, admin.QueryRow(ctx, `SELECT owner FROM pglock.lock_holder($1)`, control(p.source)).Scan(&owner))
		require.NotNil(t, owner, "the crash lost nothing: the asynchronous release after the statements survived")
	}
	return lost
}

// TestCrashKeepsAcquisitionsRenewalsAndForceReleasesWhateverSynchronousCommitSays:
// synchronous_commit off, from the database, the role, the session or the server, does
// not make an acquisition, a renewal or a force-release asynchronous: a crash right
// after each loses none of them. Two crashes: one for the database, the role and the
// session at once, one for the server's setting.
func TestCrashKeepsAcquisitionsRenewalsAndForceReleasesWhateverSynchronousCommitSays(t *testing.T) {
	serverURL, crash := crashServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := crashConn(t, ctx, serverURL, "on")
	name := fmt.Sprintf("crash_sync_off_%d", time.Now().UnixNano())

	_, err := admin.Exec(ctx, "CREATE DATABASE "+name)
	require.NoError(t, err)
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), serverURL)
		if err == nil {
			_, _ = c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
			_, _ = c.Exec(context.Background(), "DROP OWNED BY "+name)
			_, _ = c.Exec(context.Background(), "DROP ROLE IF EXISTS "+name)
			_ = c.Close(context.Background())
		}
	})
	_, err = admin.Exec(ctx, "ALTER DATABASE "+name+" SET synchronous_commit = off")
	require.NoError(t, err)
	u, err := url.Parse(serverURL)
	require.NoError(t, err)
	u.Path = "/" + name
	dbURL := u.String()
	require.NoError(t, pglock.Migrate(ctx, dbURL))

	for _, stmt := range append([]string{"CREATE ROLE " + name + " LOGIN", "ALTER ROLE " + name + " SET synchronous_commit = off"},
		appGrants...) {
		_, err = admin.Exec(ctx, fmtRole(stmt, name))
		require.NoError(t, err)
	}
	u, err = url.Parse(serverURL)
	require.NoError(t, err)
	u.User = url.User(name)
	roleURL := u.String()

	lost := crashAfterDurableStatements(t, ctx, serverURL, crash, []syncOff{
		{source: "database", url: dbURL},
		{source: "role", url: roleURL},
		{source: "session", url: serverURL, setup: "SET synchronous_commit = off"},
	})

	// The server's own setting, as postgresql.conf would set it (ALTER SYSTEM writes
	// postgresql.auto.conf), for the new connections once the server reloaded it.
	admin = crashConn(t, ctx, serverURL, "on")
	_, err = admin.Exec(ctx, "ALTER SYSTEM SET synchronous_commit = off")
	require.NoError(t, err)
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), serverURL)
		require.NoError(t, err)
		defer c.Close(context.Background())
		_, err = c.Exec(context.Background(), "ALTER SYSTEM RESET synchronous_commit")
		require.NoError(t, err)
		_, err = c.Exec(context.Background(), "SELECT pg_reload_conf()")
		require.NoError(t, err)
	})
	_, err = admin.Exec(ctx, "SELECT pg_reload_conf()")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		c, err := pgx.Connect(ctx, serverURL)
		require.NoError(t, err)
		defer c.Close(ctx)
		var setting string
		require.NoError(t, c.QueryRow(ctx, "SHOW synchronous_commit").Scan(&setting))
		return setting == "off"
	}, 10*time.Second, 10*time.Millisecond, "the server reloads its configuration")
	lost = append(lost, crashAfterDurableStatements(t, ctx, serverURL, crash, []syncOff{{source: "server", url: serverURL}})...)
	require.Empty(t, lost, "the crash lost %d of %d statements:\n%s", len(lost), 4*len(durableStatements), strings.Join(lost, "\n"))
}

// stopWALWriter stops the crash server's WAL writer (SIGSTOP) and returns a function
// that kills it (SIGKILL), which begins a crash. The test runs as root or as the
// server's user (.ci/crash). A test that fails before the kill resumes it.
func stopWALWriter(t *testing.T, ctx context.Context, serverURL string) (kill func()) {
	t.Helper()
	admin := crashConn(t, ctx, serverURL, "on")
	var pid int
	require.NoError(t, admin.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'`).Scan(&pid))
	require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP), "stop the WAL writer (pid %d): run as root or as the server's user", pid)
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	})
	return func() {
		killed = true
		require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	}
}
