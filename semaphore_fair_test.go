package pglock_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/pglocktest"
)

// semQueue is the key a semaphore's fair waiters are queued under in pglock.waiters.
func semQueue(key string) string { return key + "\x1f" }

// fairPermit starts a fair Acquire of a permit of s and returns its result's channel.
func fairPermit(ctx context.Context, s *pglock.Semaphore) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		l, err := s.Acquire(ctx, pglock.Fair())
		ch <- acquired{l, err, time.Now()}
	}()
	return ch
}

// TestFairSemaphoreServesWaitersInTheOrderTheyArrivedAcrossClients: a semaphore of 2
// permits, both held; 10 fair waiters over 4 clients queue one after another (each
// confirmed queued before the next calls), round robin over the clients; the holders
// release, and each waiter holds its permit a moment and releases it. The tokens, drawn
// when a permit is handed over, must grow in the order of arrival: permits are served
// first come, first served across clients (without Fair, whichever client's attempt
// lands first wins, and this fails).
func TestFairSemaphoreServesWaitersInTheOrderTheyArrivedAcrossClients(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	pool := pglocktest.Postgres(t)
	const key, permits, clients, waiters = "fair-sem/order", 2, 4, 10
	sems := make([]*pglock.Semaphore, clients)
	for i := range sems {
		s, err := newPoolClient(t, pool).Semaphore(key, permits)
		require.NoError(t, err)
		sems[i] = s
	}
	var holders []*pglock.Lock
	for range permits {
		l, err := sems[0].TryAcquire(ctx)
		require.NoError(t, err)
		holders = append(holders, l)
	}
	stale := heartbeats(t, pool, semQueue(key))
	var (
		mu     sync.Mutex
		tokens = make([]int64, waiters)
		inside atomic.Int32
		most   atomic.Int32
		wg     sync.WaitGroup
	)
	for i := range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := sems[i%clients].Acquire(ctx, pglock.Fair())
			if !assert.NoError(t, err) {
				return
			}
			n := inside.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			mu.Lock()
			tokens[i] = l.Token()
			mu.Unlock()
			assert.LessOrEqual(t, l.Permit(), permits)
			time.Sleep(5 * time.Millisecond) // the work under the permit
			inside.Add(-1)
			assert.NoError(t, l.Release(ctx))
		}()
		awaitQueued(t, pool, semQueue(key), i+1)
	}
	for _, l := range holders {
		require.NoError(t, l.Release(ctx))
	}
	wg.Wait()
	if late := stale(); late >= lateHeartbeat && !slices.IsSorted(tokens) {
		t.Logf("tokens %v: a waiter's heartbeat came %v late, so it may have been skipped as dead, as Fair documents", tokens, late)
	} else {
		require.True(t, slices.IsSorted(tokens), "the tokens in the order of arrival: %v (the latest heartbeat came after %v)", tokens, late)
	}
	require.LessOrEqual(t, most.Load(), int32(permits), "holders at once")
	require.Zero(t, queued(t, pool, semQueue(key)))
}

// TestFairSemaphoreSkipsAPausedWaiterWithinTheBound: the head of a semaphore's queue
// stops polling (its clock stops, and it has no listener), and a holder releases at
// once, so that the permit is granted to it. The next waiter, on another client, must
// have the permit within the bound Fair documents (Q + Q/4 = 1.25 s, plus the time a
// claim takes on a loaded machine), and not before the grant lapsed.
func TestFairSemaphoreSkipsAPausedWaiterWithinTheBound(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	pool := pglocktest.Postgres(t)
	const key = "fair-sem/skip"
	next, err := newPoolClient(t, pool).Semaphore(key, 1)
	require.NoError(t, err)
	holder, err := next.TryAcquire(ctx)
	require.NoError(t, err)
	clock := pglocktest.NewManualClock(time.Now())
	stuckClient := newClient(t, pglock.NewPostgresStore(pool), pglock.WithClock(clock), pglock.WithoutListener(), quiet)
	stuck, err := stuckClient.Semaphore(key, 1)
	require.NoError(t, err)
	stuckCtx, stopStuck := context.WithCancel(ctx)
	defer stopStuck()
	stuckDone := fairPermit(stuckCtx, stuck)
	awaitQueued(t, pool, semQueue(key), 1)
	nextDone := fairPermit(ctx, next)
	awaitQueued(t, pool, semQueue(key), 2)

	released := time.Now()
	require.NoError(t, holder.Release(ctx)) // granted to the stuck waiter, still live
	got := receive(t, nextDone)
	require.NoError(t, got.err)
	stall := got.at.Sub(released)
	t.Logf("paused head skipped after %v", stall.Round(time.Millisecond))
	require.Less(t, stall, 1250*time.Millisecond+750*time.Millisecond, "the queue stalled past the bound")
	require.GreaterOrEqual(t, stall, 900*time.Millisecond, "the stuck waiter's grant lapsed before Q")
	require.Equal(t, 1, got.l.Permit())
	require.NoError(t, got.l.Release(ctx))
	stopStuck()
	require.ErrorIs(t, receive(t, stuckDone).err, context.Canceled)
}

// TestTrySemaphoreFailsWhileAFairWaiterIsQueued: a semaphore whose one permit expired
// has a free permit, but a live fair waiter is queued for it: TryAcquire must not barge
// past it, and the waiter takes the permit at its poll.
func TestTrySemaphoreFailsWhileAFairWaiterIsQueued(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	pool := pglocktest.Postgres(t)
	const key = "fair-sem/try"
	var ticket int64
	_, err := pool.Exec(ctx, "SELECT * FROM pglock.sem_acquire($1, 'holder', 60000, 1)", key)
	require.NoError(t, err)
	require.NoError(t, pool.QueryRow(ctx, "SELECT ticket FROM pglock.queue_acquire($1, 'waiter', 60000, 1)", key).Scan(&ticket))
	require.Positive(t, ticket)
	pglock.EndLease(t, pool, key+"\x1f1") // the holder is gone
	s, err := newPoolClient(t, pool).Semaphore(key, 1)
	require.NoError(t, err)
	_, err = s.TryAcquire(ctx)
	require.ErrorIs(t, err, pglock.ErrNotAcquired, "TryAcquire barged past a queued waiter")
	var token int64
	var permit int
	require.NoError(t, pool.QueryRow(ctx, "SELECT fencing_token, permit FROM pglock.queue_poll($1, $2)", key, ticket).
		Scan(&token, &permit))
	require.Positive(t, token, "the queued waiter takes the free permit at its poll")
	require.Equal(t, 1, permit)
}

// TestFairAndUnfairPermitHoldersNeverExceedN: fair and plain waiters on 4 clients take
// the permits of a semaphore of 3 in turn; never more than 3 inside at once, and every
// waiter gets its turns. The same on the memory store.
func TestFairAndUnfairPermitHoldersNeverExceedN(t *testing.T) {
	t.Parallel()
	for name, stores := range semaphoreStores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			const key, permits, rounds = "fair-sem/mixed", 3, 6
			store, _ := stores(t)
			var inside, most, done atomic.Int32
			var wg sync.WaitGroup
			for i := range 4 {
				s, err := newClient(t, store, quiet).Semaphore(key, permits)
				require.NoError(t, err)
				for j := range 4 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						var opts []pglock.AcquireOption
						if (i+j)%2 == 0 {
							opts = append(opts, pglock.Fair())
						}
						for range rounds {
							l, err := s.Acquire(ctx, opts...)
							if !assert.NoError(t, err) {
								return
							}
							n := inside.Add(1)
							for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
							}
							time.Sleep(time.Millisecond)
							inside.Add(-1)
							assert.NoError(t, l.Release(ctx))
							done.Add(1)
						}
					}()
				}
			}
			wg.Wait()
			require.Equal(t, int32(4*4*rounds), done.Load())
			require.LessOrEqual(t, most.Load(), int32(permits), "holders at once")
			t.Logf("at most %d inside at once", most.Load())
		})
	}
}
