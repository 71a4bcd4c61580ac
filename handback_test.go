package pglock_test

// Hand-backs: what a failed acquisition may have been granted is released in the
// background, bounded for the whole client, and not at all when the attempt never
// reached a server.

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/store"
	"github.com/pgfence/pglock/internal/tcpproxy"
	"github.com/pgfence/pglock/pglocktest"
)

// releaseCounter is a real store that counts its release calls (Release and
// ReleaseMany), and the most of them in flight at once.
type releaseCounter struct {
	store.Store
	calls, inFlight, most atomic.Int64
}

// count counts a release call until the func it returns is called.
func (s *releaseCounter) count() func() {
	s.calls.Add(1)
	n := s.inFlight.Add(1)
	for m := s.most.Load(); n > m && !s.most.CompareAndSwap(m, n); m = s.most.Load() {
	}
	return func() { s.inFlight.Add(-1) }
}

func (s *releaseCounter) Release(ctx context.Context, key, owner string) (bool, error) {
	defer s.count()()
	return s.Store.Release(ctx, key, owner)
}

func (s *releaseCounter) ReleaseMany(ctx context.Context, keys, owners []string) ([]int, error) {
	defer s.count()()
	return s.Store.ReleaseMany(ctx, keys, owners)
}

// closedPort returns a 127.0.0.1 address where nothing listens.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// An acquisition whose connection could not even be made reached no server: there is
// nothing to hand back, and no connection attempt is made for it later. With pgx, and
// with lib/pq through database/sql. Not parallel: it counts the process's goroutines.
func TestHandBackNothingForAnAttemptThatNeverReachedAServer(t *testing.T) {
	host, port, err := net.SplitHostPort(closedPort(t))
	require.NoError(t, err)
	url := "postgres://postgres@" + host + ":" + port + "/postgres?sslmode=disable&connect_timeout=2"
	for _, tc := range []struct {
		name  string
		store func(t *testing.T) *pglock.Store
	}{
		{"Pgx", func(t *testing.T) *pglock.Store {
			pool, err := pgxpool.New(t.Context(), url)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			return pglock.NewPostgresStore(pool)
		}},
		{"LibPQ", func(t *testing.T) *pglock.Store {
			db, err := sql.Open("postgres", url)
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, db.Close()) })
			return pglock.NewSQLStore(db)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := &releaseCounter{Store: pglock.InternalStore(tc.store(t))}
			c, err := pglock.NewWithStore(pglock.WrapStore(store), quiet)
			require.NoError(t, err)
			before := runtime.NumGoroutine()

			for i := range 20 {
				_, err := c.TryAcquire(t.Context(), "k"+strconv.Itoa(i))
				require.Error(t, err)
				require.NotErrorIs(t, err, pglock.ErrNotAcquired)
			}
			after := runtime.NumGoroutine()
			require.NoError(t, c.Close(t.Context()))
			require.Zero(t, store.calls.Load(), "releases for acquisitions that never reached a server")
			require.LessOrEqual(t, after-before, 2, "goroutines left behind by 20 failed attempts")
		})
	}
}

// Hand-backs are bounded for the whole client: one release call at a time, however many
// acquisitions failed in flight, and about one call per pause while the store is away;
// Close stops them. It counts its own goroutines (ownGoroutines), so it runs beside
// the other tests.
func TestHandBacksAreBoundedForTheWholeClient(t *testing.T) {
	t.Parallel()
	goroutines := testGoroutines(t)
	url := pglocktest.PostgresURL(t)
	slow, proxy := proxiedPool(t, url, 4)
	store := &releaseCounter{Store: pglock.InternalStore(pglock.NewPostgresStore(slow))}
	c, err := pglock.NewWithStore(pglock.WrapStore(store), quiet, pglock.TTL(10*time.Second))
	require.NoError(t, err)
	before := goroutines()

	// 20 acquisitions whose ctx ends with their statement on the wire (or while they wait
	// for one of the pool's 4 connections): each may have been granted.
	proxy.SetDelay(tcpproxy.ToClient, 300*time.Millisecond)
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
			defer cancel()
			_, err := c.TryAcquire(ctx, "k"+strconv.Itoa(i))
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("TryAcquire: %v, want a ctx deadline", err)
			}
		})
	}
	wg.Wait()
	proxy.Close() // the database goes away: every release call fails, and every new connection
	start, calls := time.Now(), store.calls.Load()
	time.Sleep(3 * time.Second) // a measurement window: longer than the retries of one hand-back
	during := store.calls.Load() - calls
	// Counted after the window, as the issue did: the abandoned calls' own goroutines
	// (one each, until their reply or failure) have ended by then; what is left is the
	// hand-backs'.
	more := goroutines() - before

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	require.NoError(t, c.Close(ctx))
	closed := store.calls.Load()
	t.Logf("%d goroutines more after the failures; %d release calls in %v of outage; %d in all; %d at most at once",
		more, during, time.Since(start).Round(time.Millisecond), closed, store.most.Load())
	require.LessOrEqual(t, store.most.Load(), int64(1), "release calls in flight at once")
	require.LessOrEqual(t, during, int64(15), "release calls against an unreachable store")
	require.Less(t, more, 10, "goroutines for 20 hand-backs")
	require.Eventually(t, func() bool { return store.inFlight.Load() == 0 && goroutines() <= before+2 },
		5*time.Second, 10*time.Millisecond, "hand-backs still running after Close")
	require.Equal(t, closed, store.calls.Load(), "a release call after Close returned")
}

// testGoroutines labels t's goroutine with t's name, and so every goroutine it starts
// and theirs, and returns a count of the goroutines that carry the label: the test's
// own, not those of the tests running beside it. (A goroutine that a timer starts,
// time.AfterFunc's, carries none.)
func testGoroutines(t *testing.T) (count func() int) {
	t.Helper()
	pprof.SetGoroutineLabels(pprof.WithLabels(context.Background(), pprof.Labels("test", t.Name())))
	label := fmt.Sprintf(`# labels: {"test":%q}`, t.Name())
	return func() int {
		var profile strings.Builder
		require.NoError(t, pprof.Lookup("goroutine").WriteTo(&profile, 1))
		_, groups, _ := strings.Cut(profile.String(), "\n") // after "goroutine profile: total N"
		n := 0
		for _, group := range strings.Split(groups, "\n\n") {
			var size int
			if _, err := fmt.Sscanf(group, "%d @", &size); err == nil && strings.Contains(group, label) {
				n += size
			}
		}
		return n
	}
}

// What acquisitions abandoned in flight were granted is handed back before it expires,
// however many there are, over a slow link: one release call for all that are due,
// not one after another (five hand-backs in a row, each 150 to 300 ms over a slow
// link, leave the last key to expire). 15 locks and a semaphore's permit, granted to acquisitions whose ctx ended
// while their statements were on the wire, a ttl of 2 s and a link of 100 ms each way
// (one release after another takes over 3 s for them):
// every one is released, on the database clock, well before its expiry.
func TestHandBacksBeatTheirTTLOverASlowLink(t *testing.T) {
	t.Parallel()
	const n = 15
	url := pglocktest.PostgresURL(t)
	pool, proxy := proxiedPool(t, url, n+1)
	ttl := 2 * time.Second
	c := newPoolClient(t, pool, pglock.TTL(ttl))
	sem, err := c.Semaphore("hb-sem", 2)
	require.NoError(t, err)

	proxy.SetDelay(tcpproxy.ToServer, 100*time.Millisecond)
	proxy.SetDelay(tcpproxy.ToClient, 100*time.Millisecond)
	keys := []string{"hb-sem\x1f1"}
	var wg sync.WaitGroup
	try := func(acquire func(context.Context) (*pglock.Lock, error)) {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
			defer cancel()
			if _, err := acquire(ctx); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("an acquisition returned %v, want a ctx deadline", err)
			}
		})
	}
	for i := range n {
		key := "hb-" + strconv.Itoa(i)
		keys = append(keys, key)
		try(func(ctx context.Context) (*pglock.Lock, error) { return c.TryAcquire(ctx, key) })
	}
	try(func(ctx context.Context) (*pglock.Lock, error) { return sem.TryAcquire(ctx) })
	wg.Wait()

	direct := openSQL(t, "pgx", url)
	type lease struct {
		key  string
		held time.Duration // from its grant to its release or expiry
	}
	var leases []lease
	require.Eventually(t, func() bool {
		leases = leases[:0]
		rows, err := direct.QueryContext(t.Context(), `
			SELECT key, extract(epoch FROM expires_at - acquired_at) * 1e6
			FROM pglock.locks WHERE key = ANY($1) AND expires_at < clock_timestamp() ORDER BY key`, keys)
		require.NoError(t, err)
		defer rows.Close()
		for rows.Next() {
			var l lease
			var us float64
			require.NoError(t, rows.Scan(&l.key, &us))
			l.held = time.Duration(us) * time.Microsecond
			leases = append(leases, l)
		}
		require.NoError(t, rows.Err())
		return len(leases) == len(keys)
	}, 5*time.Second, 20*time.Millisecond, "every acquisition granted, and its lease over")
	for _, l := range leases {
		require.Less(t, l.held, ttl-200*time.Millisecond, "%q held %v of its %v ttl: not handed back in time", l.key, l.held, ttl)
	}
}

// An acquisition whose ctx ends while it waits for a connection of a busy pool is never
// sent: nothing is granted, so there is nothing to hand back. (Sent once a connection
// was free, it would be granted a lease nobody knew of until its hand-back landed; over
// a slow link, after its expiry.)
func TestAcquisitionGivenUpWhileThePoolIsBusyIsNeverSent(t *testing.T) {
	t.Parallel()
	url := pglocktest.PostgresURL(t)
	pool := pglocktest.Pool(t, url, 1)
	c, err := pglock.New(pool, quiet)
	require.NoError(t, err)
	busy, err := pool.Acquire(t.Context())
	require.NoError(t, err)

	for _, acquire := range []func(context.Context) (*pglock.Lock, error){
		func(ctx context.Context) (*pglock.Lock, error) { return c.TryAcquire(ctx, "given-up:lock") },
		func(ctx context.Context) (*pglock.Lock, error) {
			return c.Acquire(ctx, "given-up:lock", pglock.Wait(time.Minute))
		},
		func(ctx context.Context) (*pglock.Lock, error) {
			sem, err := c.Semaphore("given-up:sem", 2)
			require.NoError(t, err)
			return sem.TryAcquire(ctx)
		},
	} {
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		_, err := acquire(ctx)
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded)
	}
	busy.Release()
	require.NoError(t, c.Close(t.Context())) // waits for the calls it abandoned

	var rows int
	require.NoError(t, pglocktest.Pool(t, url, 1).QueryRow(t.Context(),
		"SELECT count(*) FROM pglock.locks WHERE key LIKE 'given-up:%'").Scan(&rows))
	require.Zero(t, rows, "an acquisition given up before it had a connection was granted")
}

// A grant whose call waited for a connection of a busy pool longer than its ttl is
// kept: the lease counts from when the call had its connection, not from before the
// wait. (Counted from before, the client refused the grant as too late to trust, and
// handed back a lock it could have held.) The same for a fair waiter's take, whose
// call is the queue's.
func TestAGrantAfterAWaitForThePoolCountsFromItsSend(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		acquire func(c *pglock.Client, key string) (*pglock.Lock, error)
	}{
		{"TryAcquire", func(c *pglock.Client, key string) (*pglock.Lock, error) {
			return c.TryAcquire(context.Background(), key)
		}},
		{"Fair", func(c *pglock.Client, key string) (*pglock.Lock, error) {
			return c.Acquire(context.Background(), key, pglock.Fair())
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			key := "busy:late:" + tc.name
			pool, nextAcquire := watchedPool(t, pglocktest.PostgresURL(t))
			clock := pglocktest.NewManualClock(time.Now())
			const ttl = 10 * time.Second
			c := newPoolClient(t, pool, pglock.WithClock(clock), pglock.TTL(ttl))
			busy, err := pool.Acquire(t.Context())
			require.NoError(t, err)

			waiting := nextAcquire()
			acquired := make(chan error, 1)
			var l *pglock.Lock
			go func() {
				var err error
				l, err = tc.acquire(c, key)
				acquired <- err
			}()
			receive(t, waiting, "the acquisition's wait for a connection")
			clock.Advance(ttl) // the whole ttl spent waiting for the pool
			busy.Release()
			require.NoError(t, receive(t, acquired, "the acquisition"))
			require.True(t, l.Held())
			holder, err := c.Locks(t.Context(), key)
			require.NoError(t, err)
			require.Len(t, holder, 1)
			require.Equal(t, l.Token(), holder[0].Token, "the key is held by the lock the client kept")
			require.NoError(t, l.Release(t.Context()))
		})
	}
}

// The other side of the same line: the time a statement spends on the wire and in the
// server counts against the lease. A grant whose reply comes a whole ttl after its
// statement left (the link silent meanwhile) is refused and handed back, however soon
// the call had its connection.
func TestAGrantRepliedATTLAfterItsSendIsRefused(t *testing.T) {
	t.Parallel()
	url := pglocktest.PostgresURL(t)
	pool, proxy := proxiedPool(t, url, 1)
	clock := pglocktest.NewManualClock(time.Now())
	const ttl = 10 * time.Second
	c := newPoolClient(t, pool, pglock.WithClock(clock), pglock.TTL(ttl))

	sent := proxy.BlackholeAfter(func(chunk []byte) bool { return bytes.Contains(chunk, []byte("lock_acquire(")) })
	acquired := make(chan error, 1)
	go func() {
		_, err := c.TryAcquire(context.Background(), "busy:wire")
		acquired <- err
	}()
	receive(t, sent, "the acquisition's statement")
	clock.Advance(ttl) // the whole ttl on the wire
	proxy.Restore()
	err := receive(t, acquired, "the acquisition")
	require.ErrorIs(t, err, pglock.ErrNotAcquired)
	require.ErrorContains(t, err, "confirmation came after the lock's ttl")
	other := newPoolClient(t, pglocktest.Pool(t, url, 1))
	require.Eventually(t, func() bool {
		l, err := other.TryAcquire(t.Context(), "busy:wire")
		return err == nil && l.Release(t.Context()) == nil
	}, 5*time.Second, 10*time.Millisecond, "handed back")
}

// watchedPool returns a pool of one connection on url, closed when the test ends, and
// nextAcquire, whose channel receives when the pool's next Acquire begins.
func watchedPool(t *testing.T, url string) (pool *pgxpool.Pool, nextAcquire func() <-chan struct{}) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.MaxConns = 1
	var next atomic.Pointer[chan struct{}]
	cfg.ConnConfig.Tracer = acquireStarts(func() {
		if ch := next.Swap(nil); ch != nil {
			close(*ch)
		}
	})
	pool, err = pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, func() <-chan struct{} {
		ch := make(chan struct{})
		next.Store(&ch)
		return ch
	}
}

// acquireStarts is a pgx tracer that calls started when a pool's Acquire begins.
type acquireStarts func()

func (f acquireStarts) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	f()
	return ctx
}

func (acquireStarts) TraceAcquireEnd(context.Context, *pgxpool.Pool, pgxpool.TraceAcquireEndData) {}

func (acquireStarts) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (acquireStarts) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Close gives a pending hand-back its last release at once and returns after it: a
// grant that committed after the hand-back's releases found nothing (the acquisition's
// statement was slow to reach the server) is free when Close returns, not when the
// next retry would have come, nor after its ttl.
func TestCloseGivesAPendingHandBackItsLastRelease(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pglocktest.Postgres(t)
	counted := &releaseCounter{Store: pglock.InternalStore(pglock.NewPostgresStore(pool))}
	c, err := pglock.NewWithStore(pglock.WrapStore(counted), quiet, pglock.TTL(time.Minute))
	require.NoError(t, err)

	pglock.UndoAcquire(c, "late", "late-owner", time.Minute)
	// Three releases find nothing (at once, then 20 ms and 100 ms later); the next is
	// half a second away.
	require.Eventually(t, func() bool { return counted.calls.Load() >= 3 }, 10*time.Second, time.Millisecond)
	_, ok, err := counted.Store.Acquire(ctx, "late", "late-owner", time.Minute) // the grant commits now
	require.NoError(t, err)
	require.True(t, ok)

	require.NoError(t, c.Close(ctx))
	var held bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pglock.locks
		WHERE key = 'late' AND owner IS NOT NULL AND expires_at > clock_timestamp())`).Scan(&held))
	require.False(t, held, "the late grant is still held after Close")
}
