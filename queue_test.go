package pglock_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/pglocktest"
)

// queued returns how many fair waiters are queued on key.
func queued(t testing.TB, pool *pgxpool.Pool, key string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM pglock.waiters WHERE key = $1", key).Scan(&n))
	return n
}

// awaitQueued waits until n fair waiters are queued on key.
func awaitQueued(t testing.TB, pool *pgxpool.Pool, key string, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return queued(t, pool, key) == n }, 10*time.Second, 2*time.Millisecond,
		"%d waiters queued on %q", n, key)
}

// heartbeats samples, every 20 ms until the test ends or stop is called, how long ago
// the least recently seen fair waiter still waiting on key (a semaphore's: semQueue)
// polled, and returns stop, which returns the longest seen. A waiter not seen for
// queueBound (Q, 1 s: Fair's doc) is skipped as dead, by design: on a loaded machine
// a live waiter's heartbeat (every Q/4) can come that late, and the order tests
// then have nothing to say about the order.
func heartbeats(t testing.TB, pool *pgxpool.Pool, key string) (stop func() time.Duration) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	var longest atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			var age time.Duration
			if err := pool.QueryRow(ctx, `SELECT coalesce(max(clock_timestamp() - seen_at), '0')
				FROM pglock.waiters WHERE key = $1 AND granted IS NULL`, key).Scan(&age); err == nil && int64(age) > longest.Load() {
				longest.Store(int64(age))
			}
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return func() time.Duration {
		cancel()
		<-done
		return time.Duration(longest.Load())
	}
}

// lateHeartbeat is the staleness from which heartbeats says that a waiter may have been
// skipped as dead: Q less the sampling period and a margin.
const lateHeartbeat = time.Second - 50*time.Millisecond

// fairAcquire starts a fair Acquire of key on c and returns its result's channel.
func fairAcquire(ctx context.Context, c *pglock.Client, key string, opts ...pglock.AcquireOption) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		l, err := c.Acquire(ctx, key, append([]pglock.AcquireOption{pglock.Fair()}, opts...)...)
		ch <- acquired{l, err, time.Now()}
	}()
	return ch
}

type acquired struct {
	l   *pglock.Lock
	err error
	at  time.Time
}

// TestFairServesWaitersInTheOrderTheyArrivedAcrossClients: 12 waiters over 4 clients
// queue one after another (each confirmed queued before the next calls), round robin
// over the clients; the holder releases; each holds the key a moment and releases. The
// order of the acquisitions must be the order of arrival (without Fair, whichever
// client's attempt lands first wins, and this fails).
func TestFairServesWaitersInTheOrderTheyArrivedAcrossClients(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	pool := pglocktest.Postgres(t)
	const key, clients, waiters = "fair/order", 4, 12
	cs := make([]*pglock.Client, clients)
	for i := range cs {
		cs[i] = newPoolClient(t, pool)
	}
	holder, err := cs[0].TryAcquire(ctx, key)
	require.NoError(t, err)
	stale := heartbeats(t, pool, key)
	var (
		mu    sync.Mutex
		order []int
		wg    sync.WaitGroup
	)
	for i := range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := cs[i%clients].Acquire(ctx, key, pglock.Fair())
			if !assert.NoError(t, err) {
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			time.Sleep(5 * time.Millisecond) // the work under the lock
			assert.NoError(t, l.Release(ctx))
		}()
		awaitQueued(t, pool, key, i+1)
	}
	require.NoError(t, holder.Release(ctx))
	wg.Wait()
	want := make([]int, waiters)
	for i := range want {
		want[i] = i
	}
	if late := stale(); late >= lateHeartbeat && !slices.Equal(want, order) {
		t.Logf("served %v: a waiter's heartbeat came %v late, so it may have been skipped as dead, as Fair documents", order, late)
	} else {
		require.Equal(t, want, order, "the order of the acquisitions (the latest heartbeat came after %v)", late)
	}
	require.Zero(t, queued(t, pool, key))
}

// TestFairSkipsADeadOrPausedWaiterWithinTheBound: the head of the queue stops polling
// (its client's link goes silent, or its clock stops and it has no listener), and the
// holder releases at once, so that the key is granted to it. The next waiter, on
// another client, must have the key within the bound Fair documents (Q + Q/4 = 1.25 s,
// plus the time a claim takes on a loaded machine).
func TestFairSkipsADeadOrPausedWaiterWithinTheBound(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"dead", "paused"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			url := pglocktest.PostgresURL(t)
			pool := pglocktest.Pool(t, url, 8)
			key := "fair/skip/" + how
			next := newPoolClient(t, pool)
			holder, err := next.TryAcquire(ctx, key)
			require.NoError(t, err)

			var stuck *pglock.Client
			var cut, restore func()
			switch how {
			case "dead":
				proxied, proxy := proxiedPool(t, url+"&application_name=fair_dead", 2)
				stuck = newPoolClient(t, proxied)
				// Silent, and with no poll of its left in the server: a heartbeat sent
				// just before the silence and run just after the release would claim
				// the grant, and the key would be the dead client's for its whole ttl,
				// as any acquisition whose reply a partition swallows.
				cut = func() {
					proxy.Blackhole()
					require.Eventually(t, func() bool {
						var active bool
						err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
							WHERE application_name = 'fair_dead' AND state = 'active')`).Scan(&active)
						return err == nil && !active
					}, 10*time.Second, time.Millisecond, "the dead client's last poll")
				}
				t.Cleanup(proxy.Restore) // before the client's Close
				restore = proxy.Restore
			case "paused":
				clock := pglocktest.NewManualClock(time.Now())
				stuck = newClient(t, pglock.NewPostgresStore(pool), pglock.WithClock(clock), quiet)
				cut = func() {} // its clock never moves: it never polls after its first call
			}
			stuckCtx, stopStuck := context.WithCancel(ctx)
			defer stopStuck()
			stuckDone := fairAcquire(stuckCtx, stuck, key)
			awaitQueued(t, pool, key, 1)
			nextDone := fairAcquire(ctx, next, key)
			awaitQueued(t, pool, key, 2)
			cut()
			released := time.Now()
			require.NoError(t, holder.Release(ctx)) // granted to the stuck waiter, still live
			got := receive(t, nextDone)
			require.NoError(t, got.err)
			stall := got.at.Sub(released)
			t.Logf("%s head skipped after %v", how, stall.Round(time.Millisecond))
			require.Less(t, stall, 1250*time.Millisecond+750*time.Millisecond, "the queue stalled past the bound")
			require.GreaterOrEqual(t, stall, 900*time.Millisecond, "the stuck waiter's grant lapsed before Q")
			require.NoError(t, got.l.Release(ctx))
			stopStuck()
			if how == "dead" {
				// Its cancelled Acquire returns once its statement on the silent link is
				// answered, or 5 s later.
				restore()
				t.Cleanup(func() { <-stuckDone })
			} else {
				require.ErrorIs(t, receive(t, stuckDone).err, context.Canceled)
			}
		})
	}
}

// TestFairWaiterThatGivesUpLeavesTheQueue: a fair waiter whose ctx ends, or whose Wait
// passes, leaves the queue at once: its row is gone, and the next release goes to the
// waiter behind it with no stall.
func TestFairWaiterThatGivesUpLeavesTheQueue(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	pool := pglocktest.Postgres(t)
	const key = "fair/give-up"
	a, b, c := newPoolClient(t, pool), newPoolClient(t, pool), newPoolClient(t, pool)
	holder, err := a.TryAcquire(ctx, key)
	require.NoError(t, err)

	gaveUpCtx, giveUp := context.WithCancelCause(ctx)
	gaveUp := fairAcquire(gaveUpCtx, b, key)
	awaitQueued(t, pool, key, 1)
	// Its Wait must outlast the next waiter's queueing, a second or more under load:
	// the queue must hold 2 when the third comes.
	waited := fairAcquire(ctx, b, key, pglock.Wait(2*time.Second))
	awaitQueued(t, pool, key, 2)
	next := fairAcquire(ctx, c, key)
	awaitQueued(t, pool, key, 3)

	giveUp(os.ErrDeadlineExceeded)
	got := receive(t, gaveUp)
	require.ErrorIs(t, got.err, pglock.ErrNotAcquired)
	require.ErrorIs(t, got.err, os.ErrDeadlineExceeded)
	got = receive(t, waited)
	require.ErrorIs(t, got.err, pglock.ErrNotAcquired)
	awaitQueued(t, pool, key, 1)

	released := time.Now()
	require.NoError(t, holder.Release(ctx))
	got = receive(t, next)
	require.NoError(t, got.err)
	require.Less(t, got.at.Sub(released), 500*time.Millisecond, "the release went to a waiter that had left")
	require.NoError(t, got.l.Release(ctx))
}

// TestFairWaiterLeavesAtClose: Close ends a fair wait with ErrClosed, and the waiter
// leaves the queue.
func TestFairWaiterLeavesAtClose(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	pool := pglocktest.Postgres(t)
	const key = "fair/close"
	a := newPoolClient(t, pool)
	_, err := a.TryAcquire(ctx, key)
	require.NoError(t, err)
	b, err := pglock.New(pool, quiet)
	require.NoError(t, err)
	done := fairAcquire(ctx, b, key)
	awaitQueued(t, pool, key, 1)
	require.NoError(t, b.Close(ctx))
	require.ErrorIs(t, receive(t, done).err, pglock.ErrClosed)
	require.Zero(t, queued(t, pool, key), "the closed client's waiter left the queue")
}

// TestTryAcquireFailsWhileAFairWaiterIsQueued: a key whose holder expired is free, but a
// live fair waiter is queued for it (it takes it at its next poll): TryAcquire, and
// Acquire with Wait(0), must not barge past it.
func TestTryAcquireFailsWhileAFairWaiterIsQueued(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	pool := pglocktest.Postgres(t)
	const key = "fair/try"
	var ticket int64
	_, err := pool.Exec(ctx, "SELECT pglock.lock_acquire($1, 'holder', 60000)", key)
	require.NoError(t, err)
	require.NoError(t, pool.QueryRow(ctx, "SELECT ticket FROM pglock.queue_acquire($1, 'waiter', 60000, 0)", key).Scan(&ticket))
	require.Positive(t, ticket)
	pglock.EndLease(t, pool, key) // the holder is gone
	c := newPoolClient(t, pool)
	_, err = c.TryAcquire(ctx, key)
	require.ErrorIs(t, err, pglock.ErrNotAcquired, "TryAcquire barged past a queued waiter")
	_, err = c.Acquire(ctx, key, pglock.Wait(0))
	require.ErrorIs(t, err, pglock.ErrNotAcquired, "Acquire barged past a queued waiter")
	var token int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT fencing_token FROM pglock.queue_poll($1, $2)", key, ticket).Scan(&token))
	require.Positive(t, token, "the queued waiter takes the free key at its poll")
}

// TestFairAndUnfairWaitersNeverBothHoldTheKey: fair and plain waiters on 4 clients take
// one key in turn; never two inside at once, and every waiter gets its turns.
func TestFairAndUnfairWaitersNeverBothHoldTheKey(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	pool := pglocktest.Postgres(t)
	const key, rounds = "fair/mixed", 6
	var inside, done atomic.Int32
	var wg sync.WaitGroup
	for i := range 4 {
		c := newPoolClient(t, pool)
		for j := range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var opts []pglock.AcquireOption
				if (i+j)%2 == 0 {
					opts = append(opts, pglock.Fair())
				}
				for range rounds {
					l, err := c.Acquire(ctx, key, opts...)
					if !assert.NoError(t, err) {
						return
					}
					assert.Equal(t, int32(1), inside.Add(1), "two holders at once")
					time.Sleep(time.Millisecond)
					inside.Add(-1)
					assert.NoError(t, l.Release(ctx))
					done.Add(1)
				}
			}()
		}
	}
	wg.Wait()
	require.Equal(t, int32(4*3*rounds), done.Load())
}

// TestQueueFunctionsRefuseBadInput: the queue's SQL functions refuse what the Go API
// never sends (22023), and change nothing.
func TestQueueFunctionsRefuseBadInput(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pglocktest.Postgres(t)
	long := strings.Repeat("k", 501)
	for _, tc := range []struct{ name, sql string }{
		{"acquire: empty key", `SELECT * FROM pglock.queue_acquire('', 'o', 1000, 0)`},
		{"acquire: key too long", `SELECT * FROM pglock.queue_acquire('` + long + `', 'o', 1000, 0)`},
		{"acquire: empty owner", `SELECT * FROM pglock.queue_acquire('k', '', 1000, 0)`},
		{"acquire: ttl 0", `SELECT * FROM pglock.queue_acquire('k', 'o', 0, 0)`},
		{"acquire: ttl past a year", `SELECT * FROM pglock.queue_acquire('k', 'o', 31536000001, 0)`},
		{"acquire: permits -1", `SELECT * FROM pglock.queue_acquire('k', 'o', 1000, -1)`},
		{"acquire: permits past 1000", `SELECT * FROM pglock.queue_acquire('k', 'o', 1000, 1001)`},
		{"acquire: semaphore key with U+001F", `SELECT * FROM pglock.queue_acquire('k' || chr(31) || '1', 'o', 1000, 2)`},
		{"acquire: semaphore key too long", `SELECT * FROM pglock.queue_acquire('` + long[:496] + `', 'o', 1000, 2)`},
		{"poll: ticket 0", `SELECT * FROM pglock.queue_poll('k', 0)`},
		{"poll: empty key", `SELECT * FROM pglock.queue_poll('', 1)`},
		{"leave: ticket -1", `SELECT pglock.queue_leave('k', -1)`},
		{"leave: key too long", `SELECT pglock.queue_leave('` + long + `', 1)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := pool.Exec(ctx, tc.sql)
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr)
			require.Equal(t, "22023", pgErr.Code)
		})
	}
	require.Zero(t, queued(t, pool, "k"))
	require.Empty(t, lockKeys(t, pool))
}

// TestQueuePollTellsThePlace: queueing (000026) and each poll tell a queued waiter how
// many live waiters ahead of it wait for a grant (up to 8), and a poll whether the next grant is its (head: none):
// the head of the live waiters; the one behind it once the head stops polling for Q
// (dead) or has a grant to claim; never a waiter whose poll claimed or took the key.
func TestQueuePollTellsThePlace(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pglocktest.Postgres(t)
	var token int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT pglock.lock_acquire('k', 'holder', 60000)").Scan(&token))
	tickets := make([]int64, 11)
	for i := range tickets {
		var ahead int
		require.NoError(t, pool.QueryRow(ctx, "SELECT ticket, ahead FROM pglock.queue_acquire('k', $1, 60000, 0)", fmt.Sprint("w", i)).
			Scan(&tickets[i], &ahead))
		require.Equal(t, min(i, 8), ahead, "queueing, waiter %d", i)
	}
	poll := func(ticket int64) (queued, head bool, ahead int) {
		t.Helper()
		var tok *int64
		require.NoError(t, pool.QueryRow(ctx, "SELECT fencing_token, queued, coalesce(head, false), coalesce(ahead, -1) FROM pglock.queue_poll('k', $1)", ticket).
			Scan(&tok, &queued, &head, &ahead))
		return queued, head, ahead
	}
	for i, want := range []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 8, 8} {
		queued, head, ahead := poll(tickets[i])
		require.True(t, queued)
		require.Equal(t, want, ahead, "waiter %d", i)
		require.Equal(t, want == 0, head, "waiter %d", i)
	}
	// The head silent for over Q: the next is the head.
	_, err := pool.Exec(ctx, "UPDATE pglock.waiters SET seen_at = clock_timestamp() - interval '2 seconds' WHERE ticket = $1", tickets[0])
	require.NoError(t, err)
	_, head, ahead := poll(tickets[1])
	require.True(t, head, "behind a dead head")
	require.Zero(t, ahead, "behind a dead head")
	_, _, ahead = poll(tickets[3])
	require.Equal(t, 2, ahead, "behind a dead waiter and two live ones")
	// A release grants the key to waiter 1 (the live head); waiter 2 is next.
	var released bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT pglock.lock_release('k', 'holder')").Scan(&released))
	require.True(t, released)
	_, head, ahead = poll(tickets[2])
	require.True(t, head, "behind a waiter with a grant to claim")
	require.Zero(t, ahead, "behind a waiter with a grant to claim")
	queued, head, ahead := poll(tickets[1])
	require.False(t, queued, "the claim")
	require.False(t, head)
	require.Equal(t, -1, ahead, "the claim")
}

// creatingNewKey begins a transaction that takes the new key "new" for "creator" and
// leaves it open (rolled back when the test ends), and returns it with its token.
func creatingNewKey(ctx context.Context, t *testing.T, pool *pgxpool.Pool) (pgx.Tx, int64) {
	t.Helper()
	creating, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = creating.Rollback(context.Background()) })
	var token int64
	require.NoError(t, creating.QueryRow(ctx, "SELECT pglock.lock_acquire('new', 'creator', 60000)").Scan(&token))
	return creating, token
}

// TestTakingANewKeyDoesNotWaitForAnotherCreatingIt: while a transaction creates a new
// key's row (its first acquisition, uncommitted), another acquisition of that key is
// refused at once, plain or fair (the fair one is queued), instead of waiting for that
// transaction's end under the queue's shared lock (000023), which the first holder's
// release then waited for (the start of a crowd on a new key: 000024). lock_timeout
// tells waiting from not. Once the creation commits, its owner holds the key, with the
// first token.
func TestTakingANewKeyDoesNotWaitForAnotherCreatingIt(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	pool := pglocktest.Postgres(t)
	creating, token := creatingNewKey(ctx, t, pool)

	withLockTimeout := func(sql string, dest ...any) error {
		return scanWithLockTimeout(ctx, pool, "500ms", sql, dest...)
	}
	var plain *int64
	require.NoError(t, withLockTimeout("SELECT pglock.lock_acquire('new', 'plain', 60000)", &plain), "a plain acquisition waited for the creation")
	require.Nil(t, plain, "a key being created is held")
	var fairToken, ticket *int64
	require.NoError(t, withLockTimeout("SELECT fencing_token, ticket FROM pglock.queue_acquire('new', 'fair', 60000, 0)", &fairToken, &ticket),
		"a fair acquisition waited for the creation")
	require.Nil(t, fairToken, "a key being created is held")
	require.NotNil(t, ticket, "the fair waiter is queued")

	require.NoError(t, creating.Commit(ctx))
	var owner string
	var held int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT owner, fencing_token FROM pglock.locks WHERE key = 'new'").Scan(&owner, &held))
	require.Equal(t, "creator", owner)
	require.Equal(t, token, held)
}

// TestAWaitersAttemptMarksANewKeyOnceItsCreationEnds: a waiter's attempt
// (lock_acquire_or_want) that loses a new key to another transaction creating its row
// waits for that transaction, then marks the key, so that its release notifies; before
// 000025 it found no row to mark and said the key was free (-1), and each client's
// waiter tried again every few milliseconds until the creation committed. When the
// creation rolls back, the key is free.
func TestAWaitersAttemptMarksANewKeyOnceItsCreationEnds(t *testing.T) {
	t.Parallel()
	for _, commit := range []bool{true, false} {
		t.Run(map[bool]string{true: "Committed", false: "RolledBack"}[commit], func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			pool := pglocktest.Postgres(t)
			creating, _ := creatingNewKey(ctx, t, pool)

			got := make(chan int64, 1)
			go func() {
				var r int64
				assert.NoError(t, pool.QueryRow(ctx, "SELECT pglock.lock_acquire_or_want('new', 'waiter', 60000)").Scan(&r))
				got <- r
			}()
			waiting := func() bool {
				var n int
				require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
					WHERE datname = current_database() AND wait_event = 'advisory' AND query LIKE '%lock_acquire_or_want%'`).Scan(&n))
				return n == 1
			}
			for !waiting() {
				select {
				case r := <-got:
					t.Fatalf("the attempt returned %d while the key's creation was still open", r)
				case <-time.After(time.Millisecond):
				}
			}
			if !commit {
				require.NoError(t, creating.Rollback(ctx))
				require.Equal(t, int64(-1), receive(t, got, "the attempt's answer"), "the creation rolled back: the key is free")
				return
			}
			require.NoError(t, creating.Commit(ctx))
			require.Equal(t, int64(0), receive(t, got, "the attempt's answer"), "lost, and marked")
			require.True(t, wanted(pool, "new"), "the creator's release will notify")
		})
	}
}

// TestQueueingWaitersDoNotWaitForEachOtherAndAReleaseWaitsForThem: fair waiters that
// queue on a held key at once do not wait for each other's commits (000020 had each
// hold the key's row until its commit: the waiters of a crowd queued one behind the
// other, and the holder's release behind all of them), and a release still waits for a
// waiter queueing while it runs, and grants it the key, instead of missing it and
// leaving the key free with a waiter queued (which, on a stopped clock, nothing would
// ever serve). lock_timeout tells waiting from not.
func TestQueueingWaitersDoNotWaitForEachOtherAndAReleaseWaitsForThem(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	pool := pglocktest.Postgres(t)
	var token int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT pglock.lock_acquire('k', 'holder', 60000)").Scan(&token))

	// A waiter queueing, its transaction still open.
	first, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = first.Rollback(context.WithoutCancel(ctx)) }()
	var firstTicket int64
	require.NoError(t, first.QueryRow(ctx, "SELECT ticket FROM pglock.queue_acquire('k', 'first', 60000, 0)").Scan(&firstTicket))

	withLockTimeout := func(sql string, dest ...any) error {
		return scanWithLockTimeout(ctx, pool, "200ms", sql, dest...)
	}
	var secondTicket int64
	require.NoError(t, withLockTimeout("SELECT ticket FROM pglock.queue_acquire('k', 'second', 60000, 0)", &secondTicket),
		"a waiter queueing waited for another")
	require.Greater(t, secondTicket, firstTicket)

	var released bool
	requireSQLState(t, withLockTimeout("SELECT pglock.lock_release('k', 'holder')", &released), "55P03") // lock_not_available
	require.NoError(t, first.Commit(ctx))
	// first is alive: it polls, as a live waiter does every second at most. Unpolled, a
	// loaded machine's second since it queued made the release skip it as dead.
	_, err = pool.Exec(ctx, "SELECT FROM pglock.queue_poll('k', $1)", firstTicket)
	require.NoError(t, err)
	require.NoError(t, withLockTimeout("SELECT pglock.lock_release('k', 'holder')", &released))
	require.True(t, released)
	var owner string
	require.NoError(t, pool.QueryRow(ctx, "SELECT owner FROM pglock.locks WHERE key = 'k'").Scan(&owner))
	require.Equal(t, "first", owner, "the release grants the key to the head, the waiter that queued first")

	// Every other handover waits for a waiter queueing too: a force-release,
	third, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = third.Rollback(context.WithoutCancel(ctx)) }()
	var ticket int64
	require.NoError(t, third.QueryRow(ctx, "SELECT ticket FROM pglock.queue_acquire('k', 'third', 60000, 0)").Scan(&ticket))
	var forced *string
	requireSQLState(t, withLockTimeout("SELECT owner FROM pglock.lock_force_release('k')", &forced), "55P03")
	require.NoError(t, third.Commit(ctx))
	require.NoError(t, withLockTimeout("SELECT owner FROM pglock.lock_force_release('k')", &forced))
	require.Equal(t, "first", *forced)

	// and the head's take of a key that expired, which must see every waiter ahead of it.
	require.NoError(t, pool.QueryRow(ctx, "SELECT pglock.lock_acquire('k2', 'holder', 60000)").Scan(&token))
	var head int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT ticket FROM pglock.queue_acquire('k2', 'head', 60000, 0)").Scan(&head))
	pglock.EndLease(t, pool, "k2") // the holder is gone
	fourth, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = fourth.Rollback(context.WithoutCancel(ctx)) }()
	require.NoError(t, fourth.QueryRow(ctx, "SELECT ticket FROM pglock.queue_acquire('k2', 'fourth', 60000, 0)").Scan(&ticket))
	var took *int64
	requireSQLState(t, withLockTimeout(fmt.Sprintf("SELECT fencing_token FROM pglock.queue_poll('k2', %d)", head), &took), "55P03")
	require.NoError(t, fourth.Commit(ctx))
	require.NoError(t, withLockTimeout(fmt.Sprintf("SELECT fencing_token FROM pglock.queue_poll('k2', %d)", head), &took))
	require.NotNil(t, took, "the head takes the free key")

	// and a waiter that leaves with a grant it had, which hands the key on.
	require.NoError(t, pool.QueryRow(ctx, "SELECT pglock.lock_acquire('k3', 'holder', 60000)").Scan(&token))
	var granted int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT ticket FROM pglock.queue_acquire('k3', 'granted', 60000, 0)").Scan(&granted))
	require.NoError(t, pool.QueryRow(ctx, "SELECT pglock.lock_release('k3', 'holder')").Scan(&released))
	fifth, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = fifth.Rollback(context.WithoutCancel(ctx)) }()
	require.NoError(t, fifth.QueryRow(ctx, "SELECT ticket FROM pglock.queue_acquire('k3', 'fifth', 60000, 0)").Scan(&ticket))
	var left bool
	requireSQLState(t, withLockTimeout(fmt.Sprintf("SELECT pglock.queue_leave('k3', %d)", granted), &left), "55P03")
	require.NoError(t, fifth.Commit(ctx))
	require.NoError(t, withLockTimeout(fmt.Sprintf("SELECT pglock.queue_leave('k3', %d)", granted), &left))
	require.True(t, left)
	require.NoError(t, pool.QueryRow(ctx, "SELECT owner FROM pglock.locks WHERE key = 'k3'").Scan(&owner))
	require.Equal(t, "fifth", owner, "the grant left goes to the waiter that queued meanwhile")
}

// scanWithLockTimeout runs a query in a transaction of its own whose lock_timeout is
// timeout and scans its row into dest: a statement that waits on a lock fails with
// 55P03 (lock_not_available) instead.
func scanWithLockTimeout(ctx context.Context, pool *pgxpool.Pool, timeout, sql string, dest ...any) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+timeout+"'"); err != nil {
			return err
		}
		return tx.QueryRow(ctx, sql).Scan(dest...)
	})
}
