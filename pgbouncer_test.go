package pglock_test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/devdb"
	"github.com/pgfence/pglock/internal/store/storetest"
	"github.com/pgfence/pglock/pglocktest"
)

// pgBouncerURLEnv names the URL of a PgBouncer in transaction mode in front of the
// server of PGLOCK_TEST_DATABASE_URL, forwarding any database name (.ci/pgbouncer
// starts one). The TestPgBouncer tests are skipped without it.
const pgBouncerURLEnv = "PGLOCK_PGBOUNCER_URL"

// behindPgBouncer creates a fresh migrated database on the server directly and returns
// its URL through PgBouncer and its direct URL.
func behindPgBouncer(t *testing.T) (bouncerURL, directURL string) {
	t.Helper()
	bouncer := os.Getenv(pgBouncerURLEnv)
	if bouncer == "" {
		t.Skipf("%s is not set (.ci/pgbouncer sets it)", pgBouncerURLEnv)
	}
	directURL = pglocktest.PostgresURL(t)
	u, err := url.Parse(directURL)
	require.NoError(t, err)
	bouncerURL, err = devdb.WithDatabase(bouncer, strings.TrimPrefix(u.Path, "/"))
	require.NoError(t, err)
	return bouncerURL, directURL
}

// bouncerPool returns a pool through PgBouncer in pgx's default query mode, the one
// that caches named prepared statements per connection.
func bouncerPool(t *testing.T, bouncerURL string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	pool := pglocktest.Pool(t, bouncerURL, maxConns)
	require.Equal(t, pgx.QueryExecModeCacheStatement, pool.Config().ConnConfig.DefaultQueryExecMode)
	return pool
}

// TestPgBouncerWithLockInDefaultQueryMode: 800 WithLock calls through PgBouncer in
// transaction mode, on a pool in pgx's default query mode, all succeed (before the
// store chose its own exec mode, all 800 failed with SQLSTATE 42P05).
func TestPgBouncerWithLockInDefaultQueryMode(t *testing.T) {
	t.Parallel()
	bouncerURL, _ := behindPgBouncer(t)
	pool := bouncerPool(t, bouncerURL, 8)
	c := newPoolClient(t, pool)

	const calls, goroutines = 800, 16
	var ran atomic.Int64
	err := spread(goroutines, calls, func(g, i int) error {
		return c.WithLock(t.Context(), "proof:"+strconv.Itoa(g), func(ctx context.Context) error {
			ran.Add(1)
			return nil
		})
	})
	require.NoError(t, err)
	require.EqualValues(t, calls, ran.Load())

	// The control: the same pool's own statements in the default mode do break here.
	var failed atomic.Int64
	_ = spread(goroutines, 100, func(_, i int) error {
		var n int
		if err := pool.QueryRow(t.Context(), "SELECT $1::int + 1", i).Scan(&n); err != nil {
			failed.Add(1)
		}
		return nil
	})
	t.Logf("control: %d of 100 default-mode statements of the application's own failed through PgBouncer", failed.Load())
}

func TestPgBouncerStoreContract(t *testing.T) {
	t.Parallel()
	bouncerURL, directURL := behindPgBouncer(t)
	pool := bouncerPool(t, bouncerURL, 20)
	direct := pglocktest.Pool(t, directURL, 2)
	testStore(t, func(*testing.T) *pglock.Store { return pglock.NewPostgresStore(pool) }, storetest.Options{
		Concurrent: true,
		Callers:    32,
		RewindTokens: func(t testing.TB) {
			_, err := direct.Exec(t.Context(), "ALTER SEQUENCE pglock.fencing_token_seq RESTART")
			require.NoError(t, err)
		},
	})
}

// TestPgBouncerJobOnThreeClients: three instances, each on its own pool through
// PgBouncer, tick the same job together; one runs each tick, and when it closes
// another takes over.
func TestPgBouncerJobOnThreeClients(t *testing.T) {
	t.Parallel()
	bouncerURL, _ := behindPgBouncer(t)
	var running atomic.Int32
	var mu sync.Mutex
	runs := make(map[int]int)
	clients := make([]*pglock.Client, 3)
	jobs := make([]*pglock.Job, 3)
	for i := range clients {
		c, err := pglock.New(bouncerPool(t, bouncerURL, 4), quiet, pglock.TTL(3*time.Second))
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		clients[i] = c
		jobs[i], err = c.Job("report:nightly", func(ctx context.Context) error {
			if running.Add(1) != 1 {
				t.Errorf("instance %d runs while another does", i)
			}
			defer running.Add(-1)
			mu.Lock()
			runs[i]++
			mu.Unlock()
			return nil
		}, pglock.OnOneInstance(), pglock.WithoutOverlapping())
		require.NoError(t, err)
	}
	tick := func(instances []int) {
		var wg sync.WaitGroup
		for _, i := range instances {
			wg.Go(func() {
				if err := jobs[i].Run(t.Context()); err != nil {
					t.Errorf("instance %d: %v", i, err)
				}
			})
		}
		wg.Wait()
	}
	for range 10 {
		tick([]int{0, 1, 2})
	}
	mu.Lock()
	require.Len(t, runs, 1, "one instance keeps the job: %v", runs)
	require.Equal(t, 10, sum(runs), "every tick ran once: %v", runs)
	var owner int
	for i := range runs {
		owner = i
	}
	clear(runs)
	mu.Unlock()

	require.NoError(t, clients[owner].Close(t.Context()))
	time.Sleep(1100 * time.Millisecond) // the lease is kept for the rest of its last run's second
	var rest []int
	for i := range clients {
		if i != owner {
			rest = append(rest, i)
		}
	}
	for range 5 {
		tick(rest)
	}
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, runs, 1, "another instance took the job over: %v", runs)
	require.Equal(t, 5, sum(runs), "%v", runs)
	require.NotContains(t, runs, owner)
}

func sum(m map[int]int) (n int) {
	for _, v := range m {
		n += v
	}
	return n
}

// TestPgBouncerElectionHandsOver: a leader's Resign hands the leadership over through
// PgBouncer, polling (with WithoutListener, or a listener through PgBouncer that hears
// nothing) within about ttl/3, and at once with a listener on the server directly
// (WithListenerConnString): that follower's clock is stopped, so only a notification
// can wake it.
func TestPgBouncerElectionHandsOver(t *testing.T) {
	t.Parallel()
	bouncerURL, directURL := behindPgBouncer(t)
	const ttl = 900 * time.Millisecond
	direct := pglocktest.Pool(t, directURL, 2)
	for _, c := range []struct {
		name string
		wake bool // a notification, not a poll, hands over
		opts []pglock.ClientOption
	}{
		{"PollingWithoutListener", false, []pglock.ClientOption{pglock.WithoutListener()}},
		{"PollingWithListenerThroughPgBouncer", false, nil},
		{"WakingWithDirectListener", true, []pglock.ClientOption{
			pglock.WithListenerConnString(directURL),
			pglock.WithClock(pglocktest.NewManualClock(time.Now())),
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newFeed(t, 2)
			// The leader must lead until its Resign, not lose its lease to a renewal
			// answered late on a loaded machine: a ttl of 5 s. The follower's ttl sets
			// how often it polls.
			leader := newPoolClient(t, bouncerPool(t, bouncerURL, 4), pglock.TTL(5*time.Second), pglock.WithoutListener())
			follower := newPoolClient(t, bouncerPool(t, bouncerURL, 4), append([]pglock.ClientOption{pglock.TTL(ttl)}, c.opts...)...)
			key := "feed:" + c.name
			first, err := leader.Elect(key, f.leader(0))
			require.NoError(t, err)
			require.Equal(t, 0, receive(t, f.acquired, "leader").who)
			_, err = follower.Elect(key, f.leader(1))
			require.NoError(t, err)
			time.Sleep(ttl / 2) // the follower has lost a campaign
			if c.wake {
				require.Eventually(t, func() bool { return wanted(direct, key) }, 5*time.Second, 5*time.Millisecond,
					"the follower marks the key")
			}

			start := time.Now()
			require.NoError(t, first.Resign(t.Context()))
			require.Equal(t, 1, receive(t, f.acquired, "the follower leading after the leader's release").who)
			t.Logf("resign to handover: %v", time.Since(start))
		})
	}
}

// TestPgBouncerWaiterGetsTheKey: an Acquire waiting through PgBouncer, with its
// listener through PgBouncer too (LISTEN there hears nothing), gets the key once it
// is released, by polling: it never hangs.
func TestPgBouncerWaiterGetsTheKey(t *testing.T) {
	t.Parallel()
	bouncerURL, _ := behindPgBouncer(t)
	pool := bouncerPool(t, bouncerURL, 8)
	holder := newPoolClient(t, pool)
	waiter := newPoolClient(t, pool)
	held, err := holder.TryAcquire(t.Context(), "k")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		l, err := waiter.Acquire(ctx, "k")
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	time.Sleep(300 * time.Millisecond)
	require.NoError(t, held.Release(t.Context()))
	require.NoError(t, receive(t, got, "acquisition after the release"))
}

// TestPgBouncerFencedWrites: ExecFenced and FenceHeld through PgBouncer on a pool in
// the default query mode (the write passes its own mode, as any statement of the
// application's must there), and under the simple protocol with dollar-quoted text.
func TestPgBouncerFencedWrites(t *testing.T) {
	t.Parallel()
	bouncerURL, directURL := behindPgBouncer(t)
	direct := pglocktest.Pool(t, directURL, 2)
	_, err := direct.Exec(t.Context(), `CREATE TABLE products (id int PRIMARY KEY, in_stock int NOT NULL, note text NOT NULL DEFAULT '',
		stock_fencing_token bigint NOT NULL DEFAULT 0); INSERT INTO products (id, in_stock) VALUES (1, 0)`)
	require.NoError(t, err)
	pool := bouncerPool(t, bouncerURL, 8)
	c := newPoolClient(t, pool)
	ctx := t.Context()
	const update = "UPDATE products SET in_stock = $1 WHERE id = $2"

	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			old, err := c.TryAcquire(ctx, "stock:"+mode.String())
			require.NoError(t, err)
			require.NoError(t, old.Release(ctx))
			l, err := c.TryAcquire(ctx, "stock:"+mode.String())
			require.NoError(t, err)
			defer func() { require.NoError(t, l.Release(ctx)) }()

			n, err := pglock.ExecFenced(ctx, pool, update, "stock_fencing_token", l.Token(), mode, 5, 1)
			require.NoError(t, err)
			require.EqualValues(t, 1, n)
			n, err = pglock.ExecFenced(ctx, pool, update, "stock_fencing_token", old.Token(), mode, 6, 1)
			require.NoError(t, err)
			require.Zero(t, n, "the stale token writes nothing")

			// $1 inside the dollar quotes is text: PostgreSQL's reading and pgx's agree.
			n, err = pglock.ExecFenced(ctx, pool, "UPDATE products SET note = $$costs $1$$ || $tag$ $$ $2 $tag$ || $1 WHERE id = $2",
				"stock_fencing_token", l.Token(), mode, "!", 1)
			require.NoError(t, err)
			require.EqualValues(t, 1, n)
			var note string
			require.NoError(t, direct.QueryRow(ctx, "SELECT note FROM products WHERE id = 1").Scan(&note))
			require.Equal(t, "costs $1 $$ $2 !", note)

			q, args, err := pglock.FenceHeld("UPDATE products SET note = $$held $1$$ WHERE id = $1", l.Key(), l.Token(), 1)
			require.NoError(t, err)
			tag, err := pool.Exec(ctx, q, append([]any{mode}, args...)...)
			require.NoError(t, err)
			require.EqualValues(t, 1, tag.RowsAffected())
			q, args, err = pglock.FenceHeld(update, l.Key(), old.Token(), 7, 1)
			require.NoError(t, err)
			tag, err = pool.Exec(ctx, q, append([]any{mode}, args...)...)
			require.NoError(t, err)
			require.Zero(t, tag.RowsAffected(), "the stale token writes nothing")
		})
	}
}

// TestExecFencedRefusesWhatTheSimpleProtocolWouldMisread: pgx's simple protocol would
// substitute the $1 of an unquoted identifier x$1, which PostgreSQL reads as one name;
// ExecFenced refuses it under that protocol, whether the call or the pool's
// configuration chooses it, and runs it under the others. Quoted, FenceUpdate's output
// runs under the simple protocol too.
func TestExecFencedRefusesWhatTheSimpleProtocolWouldMisread(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := pglocktest.PostgresURL(t)
	pool := pglocktest.Pool(t, url, 2)
	_, err := pool.Exec(ctx, `CREATE TABLE t (id int PRIMARY KEY, x$1 int NOT NULL DEFAULT 0, fence bigint NOT NULL DEFAULT 0);
		INSERT INTO t (id) VALUES (1)`)
	require.NoError(t, err)
	const q = "UPDATE t SET x$1 = $1 WHERE id = $2"

	_, err = pglock.ExecFenced(ctx, pool, q, "fence", 1, pgx.QueryExecModeSimpleProtocol, 5, 1)
	require.ErrorIs(t, err, pglock.ErrUnsafeQuery)
	require.ErrorContains(t, err, "simple protocol")

	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	simple, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(simple.Close)
	_, err = pglock.ExecFenced(ctx, simple, q, "fence", 1, 5, 1)
	require.ErrorIs(t, err, pglock.ErrUnsafeQuery)
	tx, err := simple.Begin(ctx)
	require.NoError(t, err)
	_, err = pglock.ExecFenced(ctx, tx, q, "fence", 1, 5, 1)
	require.ErrorIs(t, err, pglock.ErrUnsafeQuery)
	require.NoError(t, tx.Rollback(ctx))

	for _, mode := range []any{pgx.QueryExecModeExec, pgx.QueryExecModeCacheStatement} {
		n, err := pglock.ExecFenced(ctx, pool, q, "fence", 1, mode, 5, 1)
		require.NoError(t, err, fmt.Sprint(mode))
		require.EqualValues(t, 1, n)
	}
	q2, args, err := pglock.FenceUpdate(`UPDATE t SET "x$1" = $1 WHERE id = $2`, "fence", 1, 6, 1)
	require.NoError(t, err)
	tag, err := simple.Exec(ctx, q2, args...)
	require.NoError(t, err, "quoted, the identifier is safe from pgx's substitution")
	require.EqualValues(t, 1, tag.RowsAffected())
}

func TestWithListenerConnStringRefusesWhatPgxCannotParse(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(t.Context(), "postgres://127.0.0.1:1/none") // connects lazily: never here
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	for _, s := range []string{"", "postgres://127.0.0.1:notaport/x", "host=127.0.0.1 port=5432 sslmode=nosuchmode"} {
		_, err := pglock.New(pool, pglock.WithListenerConnString(s))
		require.ErrorIs(t, err, pglock.ErrInvalidArgument, "%q", s)
		require.ErrorContains(t, err, "WithListenerConnString", "%q", s)
	}
	c, err := pglock.New(pool, pglock.WithListenerConnString("postgres://postgres@127.0.0.1:5432/db?sslmode=disable"))
	require.NoError(t, err)
	require.NoError(t, c.Close(t.Context()))
}
