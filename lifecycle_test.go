package pglock_test

// The lease's promise on every path of the API, not only under faults: Close during a
// critical section, an acquisition whose ctx ends while its statement is in flight, and
// a link that goes silent under locks of two ttls. Slow and silent links are a TCP proxy
// in front of the real PostgreSQL (internal/tcpproxy).

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/store"
	"github.com/pgfence/pglock/internal/tcpproxy"
	"github.com/pgfence/pglock/internal/testkit"
	"github.com/pgfence/pglock/pglocktest"
)

// Path 1: Close cancels a WithLock function with ErrClosed, waits for it to return, and
// only then hands the key back.
func TestCloseWaitsForWithLockBeforeHandingTheKeyBack(t *testing.T) {
	t.Parallel()
	store := pglock.NewPostgresStore(pglocktest.Postgres(t))
	a, err := pglock.NewWithStore(store, quiet)
	require.NoError(t, err)
	b := newClient(t, store, quiet)

	inside, cancelled, finish := make(chan struct{}), make(chan error, 1), make(chan struct{})
	result := make(chan error, 1)
	go func() {
		result <- a.WithLock(context.Background(), "invoice:export", func(ctx context.Context) error {
			close(inside)
			<-ctx.Done()
			cancelled <- context.Cause(ctx)
			await(t, finish) // the function finishes its work after its ctx ends
			return nil
		})
	}()
	receive(t, inside)
	closed := make(chan error, 1)
	go func() { closed <- a.Close(context.Background()) }()

	require.ErrorIs(t, receive(t, cancelled), pglock.ErrClosed, "fn's ctx is cancelled with ErrClosed as its cause")
	_, err = b.TryAcquire(t.Context(), "invoice:export")
	require.ErrorIs(t, err, pglock.ErrNotAcquired, "the key changed hands while the function still ran")
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) before the function did", err)
	default:
	}

	close(finish)
	require.NoError(t, receive(t, result))
	require.NoError(t, receive(t, closed))
	l, err := b.TryAcquire(t.Context(), "invoice:export")
	require.NoError(t, err, "handed back once the function returned")
	require.NoError(t, l.Release(t.Context()))
}

// Path 1, when Close's ctx ends first: the key is not handed back, nor renewed any
// more; it expires on the database clock.
func TestCloseThatGivesUpLeavesTheKeyToExpire(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t)
	store := pglock.NewPostgresStore(pool)
	// A's renewals come when the test moves its clock; its lease ends when the test says.
	const ttl = time.Minute
	clock := pglocktest.NewManualClock(time.Now())
	a, err := pglock.NewWithStore(store, quiet, pglock.TTL(ttl), pglock.WithClock(clock))
	require.NoError(t, err)
	b := newClient(t, store, quiet)

	inside, finish := make(chan struct{}), make(chan struct{})
	result := make(chan error, 1)
	go func() {
		result <- a.WithLock(context.Background(), "invoice:export", func(ctx context.Context) error {
			close(inside)
			await(t, finish) // ignores its ctx
			return nil
		})
	}()
	receive(t, inside)
	closeCtx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, a.Close(closeCtx), context.DeadlineExceeded)
	_, err = b.TryAcquire(t.Context(), "invoice:export")
	require.ErrorIs(t, err, pglock.ErrNotAcquired, "Close handed the key back while the function still ran")

	close(finish)
	require.ErrorIs(t, receive(t, result), pglock.ErrClosed, "WithLock says the lock was left to expire")
	_, err = b.TryAcquire(t.Context(), "invoice:export")
	require.ErrorIs(t, err, pglock.ErrNotAcquired, "not handed back after the function returned either")
	expires := expiresAt(t, pool, "invoice:export")
	clock.Advance(ttl) // past every renewal the lock would have had
	require.Equal(t, expires, expiresAt(t, pool, "invoice:export"), "the closed client renewed the lock")
	pglock.EndLease(t, pool, "invoice:export")
	l, err := b.TryAcquire(t.Context(), "invoice:export")
	require.NoError(t, err, "the key is free once its lease ends on the database clock")
	require.NoError(t, l.Release(t.Context()))
}

// Path 1, a lock the caller holds itself: Close cancels its Context with ErrClosed and
// releases it.
func TestCloseCancelsAndReleasesABareLock(t *testing.T) {
	t.Parallel()
	store := pglock.NewPostgresStore(pglocktest.Postgres(t))
	var released atomic.Int32
	a, err := pglock.NewWithStore(store, quiet, pglock.WithEventHandler(func(e pglock.Event) {
		if e.Type == pglock.EventReleased && e.Key == "k" {
			released.Add(1)
		}
	}))
	require.NoError(t, err)
	b := newClient(t, store, quiet)
	l, err := a.TryAcquire(t.Context(), "k")
	require.NoError(t, err)
	require.NoError(t, a.Close(t.Context()))
	require.ErrorIs(t, context.Cause(l.Context()), pglock.ErrClosed)
	require.False(t, l.Held())
	require.EqualValues(t, 1, released.Load(), "EventReleased is emitted, and delivered before Close returns")
	_, err = b.TryAcquire(t.Context(), "k")
	require.NoError(t, err)
}

// Path 3: an acquisition whose ctx ends while its statement is in flight hands back what
// the server granted, so another instance gets the key within about a round trip rather
// than after the ttl. A permit's number is not known to a caller that gave up before the
// reply: the goroutine that reads the reply hands back whichever permit the owner holds.
func TestAcquireWhoseCtxEndsInFlightHandsTheKeyBack(t *testing.T) {
	t.Parallel()
	type try func(ctx context.Context, c *pglock.Client) (*pglock.Lock, error)
	for _, tc := range []struct {
		name string
		try  try
	}{{"a lock", func(ctx context.Context, c *pglock.Client) (*pglock.Lock, error) {
		return c.TryAcquire(ctx, "order:42")
	}}, {"a semaphore's permit", func(ctx context.Context, c *pglock.Client) (*pglock.Lock, error) {
		s, err := c.Semaphore("printers", 1)
		if err != nil {
			return nil, err
		}
		return s.TryAcquire(ctx)
	}}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			url := pglocktest.PostgresURL(t)
			slow, proxy := proxiedPool(t, url, 1)
			const ttl = 10 * time.Second
			a := newClient(t, pglock.NewPostgresStore(slow), quiet, pglock.TTL(ttl))
			b := newClient(t, pglock.NewPostgresStore(pglocktest.Pool(t, url, 4)), quiet)
			warm, err := tc.try(t.Context(), a) // the connection has the statement prepared
			require.NoError(t, err)
			require.NoError(t, warm.Release(t.Context()))

			proxy.SetDelay(tcpproxy.ToClient, 300*time.Millisecond)
			ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
			defer cancel()
			_, err = tc.try(ctx, a)
			require.ErrorIs(t, err, context.DeadlineExceeded)
			failed := time.Now()

			var l *pglock.Lock
			require.Eventually(t, func() bool {
				l, err = tc.try(t.Context(), b)
				return err == nil
			}, ttl/2, 10*time.Millisecond, "the key stayed held by an owner nobody knows")
			t.Logf("the key was free %v after the failed acquisition returned", time.Since(failed).Round(time.Millisecond))
			require.NoError(t, l.Release(t.Context()))
		})
	}
}

// An acquisition whose ctx ends in flight returns at once and keeps its connection: its
// statement runs on to its reply, and what it was granted is handed back on an open
// connection. Were the connection closed, as pgx does to a statement whose ctx ends, the
// hand-back (and every call after it, the renewals of the client's other locks included)
// would wait for a new one, which a loaded machine takes up to seconds to open: the
// torture test saw keys left to ghosts until they expired, and locks lost, that way. The
// same holds for a connection's first acquisition, which prepares its statement in the
// same message: the statement stays prepared on the connection for the next calls.
func TestAcquireWhoseCtxEndsInFlightKeepsItsConnection(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		runs int // the acquisitions made on the connection, the abandoned one and one after it included
	}{{"the statement prepared", 3}, {"the connection's first acquisition", 2}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			url := pglocktest.PostgresURL(t)
			slow, proxy := proxiedPool(t, url, 1)
			a := newClient(t, pglock.NewPostgresStore(slow), quiet, pglock.TTL(10*time.Second))
			b := newClient(t, pglock.NewPostgresStore(pglocktest.Pool(t, url, 4)), quiet)
			if tc.runs == 3 {
				warm, err := a.TryAcquire(t.Context(), "warm")
				require.NoError(t, err)
				require.NoError(t, warm.Release(t.Context()))
			} else {
				_, err := slow.Exec(t.Context(), "SELECT 1") // the connection is open, no acquisition made on it yet
				require.NoError(t, err)
			}
			accepted := proxy.Accepted()

			const delay = 300 * time.Millisecond
			proxy.SetDelay(tcpproxy.ToClient, delay)
			ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
			defer cancel()
			start := time.Now()
			_, err := a.TryAcquire(ctx, "order:43")
			require.ErrorIs(t, err, context.DeadlineExceeded)
			require.Less(t, time.Since(start), delay-50*time.Millisecond, "TryAcquire waited for the reply after its ctx ended")
			var l *pglock.Lock
			require.Eventually(t, func() bool {
				l, err = b.TryAcquire(t.Context(), "order:43")
				return err == nil
			}, 5*time.Second, 10*time.Millisecond, "the key stayed held by an owner nobody knows")
			require.NoError(t, l.Release(t.Context()))
			require.Equal(t, accepted, proxy.Accepted(), "the abandoned acquisition cost a connection: the hand-back had to open another")

			proxy.SetDelay(tcpproxy.ToClient, 0)
			require.Eventually(t, func() bool { return slow.Stat().IdleConns() == 1 }, 5*time.Second, 10*time.Millisecond,
				"the hand-back's reply never came")
			l, err = a.TryAcquire(t.Context(), "order:44")
			require.NoError(t, err)
			require.NoError(t, l.Release(t.Context()))
			var runs int
			require.NoError(t, slow.QueryRow(t.Context(), `SELECT coalesce(sum(generic_plans + custom_plans), 0)
				FROM pg_prepared_statements WHERE statement LIKE 'SELECT pglock.lock_acquire(%'`).Scan(&runs))
			require.Equal(t, tc.runs, runs, "the acquisitions ran one statement, prepared once on the connection")
		})
	}
}

// Path 4: a link that goes silent under locks of two ttls. Each lock's context is
// cancelled at its own deadline, before the database could give the key away, whatever
// the renewal call of the other lock is doing. The schedule is arranged so that the
// long lock's renewal comes first, alone, and hangs: the short lock, taken later, is
// due only after that call has started.
func TestSilentLinkCancelsEachLockAtItsOwnDeadline(t *testing.T) {
	t.Parallel()
	url := pglocktest.PostgresURL(t)
	silent, proxy := proxiedPool(t, url, 3)
	direct := pglocktest.Pool(t, url, 2)
	a := newClient(t, pglock.NewPostgresStore(silent), quiet)
	stalls := watchStalls(t)

	start := time.Now()
	long, err := a.TryAcquire(t.Context(), "long", pglock.TTL(6*time.Second)) // renewed at +2 s
	require.NoError(t, err)
	time.Sleep(time.Until(start.Add(1700 * time.Millisecond)))                  // real time: the renewal schedule
	short, err := a.TryAcquire(t.Context(), "short", pglock.TTL(3*time.Second)) // renewed at +2.7 s
	require.NoError(t, err)
	cancelledAt := make(chan time.Time, 1)
	context.AfterFunc(short.Context(), func() { cancelledAt <- time.Now() })
	var expiresAt time.Time
	require.NoError(t, direct.QueryRow(t.Context(),
		"SELECT expires_at FROM pglock.locks WHERE key = 'short'").Scan(&expiresAt))
	time.Sleep(time.Until(start.Add(1850 * time.Millisecond)))
	proxy.Blackhole() // from now on nothing answers, nothing refuses
	defer proxy.Restore()

	stalls.requireCancelledBefore(t, "the short lock", 3*time.Second, receive(t, cancelledAt), expiresAt)
	var lost *pglock.LockLostError
	require.ErrorAs(t, context.Cause(short.Context()), &lost)
	require.Equal(t, pglock.LostExpired, lost.Reason)
	require.True(t, long.Held(), "the long lock's deadline has not come")
}

// A second Release while the first is in flight returns what the first returns, once it
// has finished: the key is free when it returns.
func TestConcurrentReleaseWaitsForTheFirst(t *testing.T) {
	t.Parallel()
	url := pglocktest.PostgresURL(t)
	silent, proxy := proxiedPool(t, url, 2)
	a := newClient(t, pglock.NewPostgresStore(silent), quiet)
	b := newClient(t, pglock.NewPostgresStore(pglocktest.Pool(t, url, 2)), quiet)
	l, err := a.TryAcquire(t.Context(), "k")
	require.NoError(t, err)

	proxy.Blackhole()
	first, second := make(chan error, 1), make(chan error, 1)
	go func() { first <- l.Release(t.Context()) }()
	<-l.Context().Done() // the first Release has begun: it cancels the lock's ctx before its store call
	go func() { second <- l.Release(t.Context()) }()
	select {
	case err := <-second:
		t.Fatalf("the second Release returned (%v) while the first was in flight", err)
	case <-time.After(300 * time.Millisecond):
	}
	proxy.Restore()
	require.NoError(t, receive(t, second))
	require.NoError(t, receive(t, first))
	_, err = b.TryAcquire(t.Context(), "k")
	require.NoError(t, err)
}

// statements counts the statements a pool sends that contain a word.
type statements struct {
	word string
	n    atomic.Int64
}

func (s *statements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.Contains(data.SQL, s.word) {
		s.n.Add(1)
	}
	return ctx
}

func (s *statements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A key can look free to lock_want (its row expired) and still refuse lock_acquire (a
// fenced transaction keeps the expired row locked). Acquire must not spin on it.
func TestAcquireDoesNotSpinOnAnExpiredRowThatAFencedWriteLocks(t *testing.T) {
	t.Parallel()
	url := pglocktest.PostgresURL(t)
	pool := pglocktest.Pool(t, url, 4)
	_, err := pool.Exec(t.Context(), "CREATE TABLE docs (id int PRIMARY KEY, body text)")
	require.NoError(t, err)
	_, err = pool.Exec(t.Context(), "INSERT INTO docs VALUES (1, '')")
	require.NoError(t, err)
	// Its write must come while it holds, on the database clock, however slow the
	// machine: a ttl of a minute, its lease ended by the test after the write.
	paused := newClient(t, pglock.NewPostgresStore(pool), quiet, pglock.TTL(time.Minute),
		pglock.WithClock(pglocktest.NewManualClock(time.Now()))) // never renews
	l, err := paused.TryAcquire(t.Context(), "doc:1")
	require.NoError(t, err)
	tx, err := pool.Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	q, args, err := pglock.FenceHeld("UPDATE docs SET body = 'x' WHERE id = $1", "doc:1", l.Token(), 1)
	require.NoError(t, err)
	tag, err := tx.Exec(t.Context(), q, args...)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected(), "the write came after the lease's end: it locks no row")
	pglock.EndLease(t, pool, "doc:1") // its row stays locked

	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	counted := &statements{word: "lock_acquire"}
	cfg.ConnConfig.Tracer = counted
	waiterPool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	defer waiterPool.Close()
	waiter := newPoolClient(t, waiterPool)
	_, err = waiter.Acquire(t.Context(), "doc:1", pglock.Wait(500*time.Millisecond))
	require.ErrorIs(t, err, pglock.ErrNotAcquired)
	t.Logf("%d attempts in 500 ms", counted.n.Load())
	require.Positive(t, counted.n.Load(), "the pool's tracer saw no acquisition")
	require.Less(t, counted.n.Load(), int64(40), "the wait spun")
}

// Close is bounded by its ctx even when the event handler does not return.
func TestCloseIsBoundedByItsCtxWhileTheEventHandlerBlocks(t *testing.T) {
	t.Parallel()
	store := pglock.NewPostgresStore(pglocktest.Postgres(t))
	unblock := make(chan struct{})
	c, err := pglock.NewWithStore(store, quiet, pglock.WithEventHandler(func(pglock.Event) { <-unblock }))
	require.NoError(t, err)
	defer close(unblock)
	_, err = c.TryAcquire(t.Context(), "k")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	closed := make(chan error, 1)
	go func() { closed <- c.Close(ctx) }()
	select {
	case err := <-closed:
		require.ErrorIs(t, err, context.DeadlineExceeded)
	case <-time.After(2 * time.Second):
		t.Fatal("Close waited for the event handler past its ctx")
	}
}

// A panicking event handler is logged; the events after it are still delivered.
func TestPanickingEventHandlerIsLoggedAndDeliveryGoesOn(t *testing.T) {
	t.Parallel()
	store := pglock.NewPostgresStore(pglocktest.Postgres(t))
	var logs testkit.LogBuffer
	var got []pglock.EventType
	c, err := pglock.NewWithStore(store, pglock.WithLogger(newLogger(&logs)), pglock.WithEventHandler(func(e pglock.Event) {
		got = append(got, e.Type)
		if e.Type == pglock.EventAcquired {
			panic("handler bug")
		}
	}))
	require.NoError(t, err)
	l, err := c.TryAcquire(t.Context(), "k")
	require.NoError(t, err)
	require.NoError(t, l.Release(t.Context()))
	require.NoError(t, c.Close(t.Context())) // delivers what is queued
	require.Equal(t, []pglock.EventType{pglock.EventAcquired, pglock.EventReleased}, got)
	require.Contains(t, logs.String(), `level=ERROR msg="pglock: event handler panicked" key=k err="handler bug"`)
}

// clockMovingStore is a real store whose Acquire takes d on a manual clock: a reply that
// comes late.
type clockMovingStore struct {
	store.Store
	clock *pglocktest.ManualClock
	d     time.Duration
}

func (s *clockMovingStore) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (int64, bool, error) {
	token, ok, err := s.Store.Acquire(ctx, key, owner, ttl)
	s.clock.Advance(s.d)
	return token, ok, err
}

// An acquisition confirmed only after its own deadline cannot be trusted: it is refused
// and handed back.
func TestAcquisitionConfirmedAfterItsTTLIsRefusedAndHandedBack(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t)
	clock := pglocktest.NewManualClock(time.Now())
	// The database keeps an unreturned grant for the whole ttl: at 10 s, only the
	// hand-back frees the key within the 5 s B is given (at 1 s, the expiry did as well).
	const ttl = 10 * time.Second
	late := &clockMovingStore{Store: pglock.InternalStore(pglock.NewPostgresStore(pool)), clock: clock, d: ttl - ttl/10}
	a := newClient(t, pglock.WrapStore(late), quiet, pglock.TTL(ttl), pglock.WithClock(clock))
	b := newClient(t, pglock.NewPostgresStore(pool), quiet)
	_, err := a.TryAcquire(t.Context(), "k")
	require.ErrorIs(t, err, pglock.ErrNotAcquired)
	require.ErrorContains(t, err, "confirmation came after the lock's ttl")
	require.Eventually(t, func() bool {
		l, err := b.TryAcquire(t.Context(), "k")
		return err == nil && l.Release(t.Context()) == nil
	}, 5*time.Second, 10*time.Millisecond, "handed back")

	late.d = ttl - ttl/10 - time.Millisecond // just in time: kept
	l, err := a.TryAcquire(t.Context(), "k")
	require.NoError(t, err)
	require.True(t, l.Held())
}

// A lock's first deadline counts from when its acquisition was sent, not from when the
// reply came: the database started the ttl somewhere between the two. A reply that took
// half the ttl leaves the holder the other part of it, less a tenth, not a whole ttl
// more.
func TestFirstDeadlineCountsFromTheAcquisitionsSend(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t)
	clock := pglocktest.NewManualClock(time.Now())
	const ttl = time.Minute
	store := &failingStore{Store: &clockMovingStore{Store: pglock.InternalStore(pglock.NewPostgresStore(pool)), clock: clock, d: ttl / 2}}
	store.failing.Store(true) // no renewal is ever confirmed: the first deadline is the only one
	c := newClient(t, pglock.WrapStore(store), quiet, pglock.TTL(ttl), pglock.WithClock(clock))
	sent := clock.Now()
	l, err := c.TryAcquire(t.Context(), "k") // replied to at sent + ttl/2
	require.NoError(t, err)

	deadline := sent.Add(ttl - ttl/10)
	clock.Advance(deadline.Sub(clock.Now()) - time.Millisecond)
	require.True(t, l.Held(), "lost before its deadline")
	clock.Advance(time.Millisecond)
	require.False(t, l.Held(), "still held at the send + ttl less a tenth: its deadline counted from the reply")
	var lost *pglock.LockLostError
	require.ErrorAs(t, context.Cause(l.Context()), &lost)
	require.Equal(t, pglock.LostExpired, lost.Reason)
}

// A holder paused past its lease is told, when WithLock's release finds the lock gone,
// that it lost it, even when the release's first call failed (its pooled connection's
// backend was terminated) and the second found nothing.
func TestWithLockOfAHolderPausedPastItsLeaseReturnsLockLost(t *testing.T) {
	t.Parallel()
	url := pglocktest.PostgresURL(t)
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.MaxConns = 1 // the release goes out on the connection fn's pause broke
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, pool.Ping(t.Context())) // its one connection is up before the acquisition
	direct := pglocktest.Pool(t, url, 2)
	const ttl = time.Minute
	// Its timers do not fire: a paused holder, whose clock the pause moves.
	clock := pglock.TestClock{Clock: testkit.NewClock(time.Now())}
	c := newClient(t, pglock.NewPostgresStore(pool), quiet, pglock.TTL(ttl), pglock.WithClock(clock))
	ran := false
	err = c.WithLock(t.Context(), "k", func(ctx context.Context) error { // Wait(0): no pause on a stalled clock
		ran = true
		var pid int
		if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			return err
		}
		if _, err := direct.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
			return err
		}
		pglock.EndLease(t, direct, "k") // the holder is paused past its lease
		clock.Move(ttl + ttl/5)
		return nil
	}, pglock.Wait(0))
	require.True(t, ran, "not acquired: %v", err)
	var lost *pglock.LockLostError
	require.ErrorAs(t, err, &lost)
}

// tryAcquireFree takes key, which no other owner holds, with c's TryAcquire. A refusal
// can then only mean that the store's confirmation came after nine tenths of the ttl
// (a loaded machine, a short ttl): the client rightly refused a lock it could not
// trust, and handed it back. Acquire then waits for that hand-back and tries again.
func tryAcquireFree(t *testing.T, c *pglock.Client, key string, opts ...pglock.Option) *pglock.Lock {
	t.Helper()
	l, err := c.TryAcquire(t.Context(), key, opts...)
	if errors.Is(err, pglock.ErrNotAcquired) {
		t.Logf("the free key %q was refused: %v", key, err)
		l, err = c.Acquire(t.Context(), key, append(optionsOf[pglock.AcquireOption](opts), pglock.Wait(20*time.Second))...)
	}
	require.NoError(t, err)
	return l
}

// Close, while it waits for a WithLock function that ignores its ctx, still loses each
// of the client's other locks at its own deadline when their renewals hang, before the
// database could give the key away.
func TestCloseWaitingForASectionStillLosesOtherLocksAtTheirDeadline(t *testing.T) {
	t.Parallel()
	url := pglocktest.PostgresURL(t)
	silent, proxy := proxiedPool(t, url, 3)
	direct := pglocktest.Pool(t, url, 2)
	a, err := pglock.NewWithStore(pglock.NewPostgresStore(silent), quiet, pglock.TTL(30*time.Second))
	require.NoError(t, err)
	stalls := watchStalls(t)

	// Its ctx must end at its deadline, a tenth of the ttl before the database's expiry:
	// a ttl of 3 s leaves a loaded machine 300 ms to run the cancellation, and a stall of
	// the process longer than that is excused (requireCancelledBefore); the test waits
	// the deadline out.
	short := tryAcquireFree(t, a, "short", pglock.TTL(3*time.Second))
	cancelledAt := make(chan time.Time, 1)
	context.AfterFunc(short.Context(), func() { cancelledAt <- time.Now() })
	inside, finish := make(chan struct{}), make(chan struct{})
	result := make(chan error, 1)
	go func() {
		result <- a.WithLock(context.Background(), "section", func(ctx context.Context) error {
			close(inside)
			await(t, finish) // ignores its ctx
			return nil
		})
	}()
	receive(t, inside)
	closed := make(chan error, 1)
	go func() { closed <- a.Close(context.Background()) }()

	proxy.Blackhole() // from now on nothing answers: the short lock's renewals hang
	defer proxy.Restore()
	// The expiry read once the link is silent: a renewal answered between an earlier
	// read and the silence would have moved it, and the deadline with it.
	var expiresAt time.Time
	require.NoError(t, direct.QueryRow(t.Context(),
		"SELECT expires_at FROM pglock.locks WHERE key = 'short'").Scan(&expiresAt))

	stalls.requireCancelledBefore(t, "the short lock", 3*time.Second, receive(t, cancelledAt), expiresAt)
	var lost *pglock.LockLostError
	require.ErrorAs(t, context.Cause(short.Context()), &lost)
	require.Equal(t, pglock.LostExpired, lost.Reason)
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) before the function did", err)
	default:
	}
	proxy.Restore()
	close(finish)
	require.NoError(t, receive(t, result))
	require.NoError(t, receive(t, closed))
}

// Close on a silent link, once its section has returned, releases the client's bare
// locks one after the other, each release hanging until its timeout: every lock's ctx
// is still cancelled before the database expires it, by Close (ErrClosed) or, for those
// it has not reached yet, by its own deadline (a *LockLostError).
func TestCloseOnASilentLinkCancelsEveryBareLockBeforeItsExpiry(t *testing.T) {
	t.Parallel()
	url := pglocktest.PostgresURL(t)
	silent, proxy := proxiedPool(t, url, 4)
	direct := pglocktest.Pool(t, url, 2)
	// A lock that Close has not reached yet must end at its own deadline, a tenth of the
	// ttl before the database's expiry: a ttl of 3 s leaves a loaded machine 300 ms to
	// run the cancellation, and a stall of the process longer than that is excused
	// (requireCancelledBefore); the test waits the deadlines out.
	a, err := pglock.NewWithStore(pglock.NewPostgresStore(silent), quiet, pglock.TTL(3*time.Second))
	require.NoError(t, err)
	stalls := watchStalls(t)
	type watched struct {
		key       string
		cancelled chan time.Time
		expires   time.Time
		l         *pglock.Lock
	}
	var locks []watched
	for _, key := range []string{"a", "b", "c"} {
		l := tryAcquireFree(t, a, key)
		w := watched{key: key, cancelled: make(chan time.Time, 1), l: l}
		context.AfterFunc(l.Context(), func() { w.cancelled <- time.Now() })
		locks = append(locks, w)
	}
	proxy.Blackhole()
	defer proxy.Restore()
	// The expiries read once the link is silent: a renewal answered between an earlier
	// read and the silence would have moved one, and its deadline with it.
	for i := range locks {
		require.NoError(t, direct.QueryRow(t.Context(),
			"SELECT expires_at FROM pglock.locks WHERE key = $1", locks[i].key).Scan(&locks[i].expires))
	}
	closed := make(chan error, 1)
	go func() { closed <- a.Close(context.Background()) }()
	for _, w := range locks {
		at := receive(t, w.cancelled)
		stalls.requireCancelledBefore(t, fmt.Sprintf("%q (cause %v)", w.key, context.Cause(w.l.Context())), 3*time.Second, at, w.expires)
		t.Logf("%q cancelled %v before its expiry: %v", w.key, w.expires.Sub(at).Round(time.Millisecond),
			context.Cause(w.l.Context())) // negative: after it, through a stall
	}
	proxy.Restore()
	receive(t, closed) // its releases' errors: the link was silent
}
