package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/pglocktest"
)

// semaphoreStores are the stores a semaphore test runs on: the PostgreSQL store (its
// pool, for reading the table on the database clock) and the memory store (no pool).
func semaphoreStores(t *testing.T) map[string]func(t *testing.T) (*pglock.Store, *pgxpool.Pool) {
	t.Helper()
	return map[string]func(t *testing.T) (*pglock.Store, *pgxpool.Pool){
		"Postgres": func(t *testing.T) (*pglock.Store, *pgxpool.Pool) {
			pool := pglocktest.Postgres(t)
			return pglock.NewPostgresStore(pool), pool
		},
		"Memory": func(*testing.T) (*pglock.Store, *pgxpool.Pool) { return pglock.NewMemoryStore(nil), nil },
	}
}

// liveHolders counts the live permits of the semaphore key on the database clock.
func liveHolders(t testing.TB, pool *pgxpool.Pool, key string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM pglock.locks
		WHERE key LIKE $1 || chr(31) || '%' AND owner IS NOT NULL AND expires_at > clock_timestamp()`, key).Scan(&n))
	return n
}

// TestSemaphoreNeverMoreThanNHolders: 32 racers over 4 clients take and give back the
// permits of one semaphore for many rounds; at every acquisition the holders, counted
// in the process and on the database clock, are at most N, and each permit's tokens
// only grow.
func TestSemaphoreNeverMoreThanNHolders(t *testing.T) {
	t.Parallel()
	const permits, racers, rounds, clients = 3, 32, 15, 4
	for name, newStore := range semaphoreStores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			store, pool := newStore(t)
			var cs []*pglock.Client
			for range clients {
				if pool != nil {
					cs = append(cs, newPoolClient(t, pool, pglock.TTL(10*time.Second)))
				} else {
					cs = append(cs, newClient(t, store, quiet, pglock.TTL(10*time.Second)))
				}
			}
			var (
				holders, most atomic.Int32
				mu            sync.Mutex
				tokens        = map[int][]int64{} // per permit, in the order of acquisition
				wg            sync.WaitGroup
				full          = make(chan struct{}) // closed when permits holders held at once
				fullOnce      sync.Once
			)
			errs := make(chan error, racers)
			for r := range racers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					sem, err := cs[r%clients].Semaphore("exports", permits)
					if err != nil {
						errs <- err
						return
					}
					for range rounds {
						l, err := sem.Acquire(t.Context(), pglock.Wait(30*time.Second))
						if err != nil {
							errs <- err
							return
						}
						n := holders.Add(1)
						for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
						}
						if n == permits {
							fullOnce.Do(func() { close(full) })
						}
						// Until the permits have all been held at once, a holder keeps
						// its permit until they are: N holders must be granted together.
						select {
						case <-full:
						case <-time.After(10 * time.Second):
						}
						mu.Lock()
						tokens[l.Permit()] = append(tokens[l.Permit()], l.Token())
						mu.Unlock()
						if pool != nil {
							if live := liveHolders(t, pool, "exports"); live > permits {
								errs <- fmt.Errorf("%d live holders on the database clock", live)
							}
						}
						if l.Permit() < 1 || l.Permit() > permits || l.Key() != "exports" {
							errs <- fmt.Errorf("permit %d of %q", l.Permit(), l.Key())
						}
						holders.Add(-1)
						if err := l.Release(t.Context()); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			require.LessOrEqual(t, most.Load(), int32(permits))
			require.Equal(t, int32(permits), most.Load(), "the permits were never all held at once")
			total := 0
			for permit, ts := range tokens {
				total += len(ts)
				for i := 1; i < len(ts); i++ {
					require.Greater(t, ts[i], ts[i-1], "permit %d's tokens", permit)
				}
			}
			require.Equal(t, racers*rounds, total)
		})
	}
}

// TestSemaphoreChangingPermits: a smaller N grants no permit above N and none while
// the live holders are N or more; the holders of permits above N keep them.
func TestSemaphoreChangingPermits(t *testing.T) {
	t.Parallel()
	for name, newStore := range semaphoreStores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			store, _ := newStore(t)
			c := newClient(t, store, quiet)
			ctx := t.Context()
			three, err := c.Semaphore("reports", 3)
			require.NoError(t, err)
			two, err := c.Semaphore("reports", 2)
			require.NoError(t, err)
			var held []*pglock.Lock
			for want := 1; want <= 3; want++ {
				l, err := three.TryAcquire(ctx)
				require.NoError(t, err)
				require.Equal(t, want, l.Permit())
				held = append(held, l)
			}
			_, err = two.TryAcquire(ctx)
			require.ErrorIs(t, err, pglock.ErrNotAcquired, "3 live holders, 2 permits")
			require.NoError(t, held[0].Release(ctx))
			_, err = two.TryAcquire(ctx)
			require.ErrorIs(t, err, pglock.ErrNotAcquired, "2 live holders, 2 permits")
			require.NoError(t, held[1].Release(ctx))
			l, err := two.TryAcquire(ctx)
			require.NoError(t, err, "1 live holder, 2 permits")
			require.Equal(t, 1, l.Permit())
			_, err = two.TryAcquire(ctx)
			require.ErrorIs(t, err, pglock.ErrNotAcquired, "permit 3 is held, and 2 is above nothing: 2 live holders")
			require.True(t, held[2].Held(), "the holder of permit 3 keeps it")
			require.NoError(t, held[2].Release(ctx))
			l2, err := two.TryAcquire(ctx)
			require.NoError(t, err)
			require.Equal(t, 2, l2.Permit(), "never permit 3 with 2 permits")
			l3, err := three.TryAcquire(ctx)
			require.NoError(t, err)
			require.Equal(t, 3, l3.Permit())
			require.Greater(t, l3.Token(), held[2].Token(), "permit 3's token grew")

			locks, err := c.Locks(ctx, "reports")
			require.NoError(t, err)
			var listed []string
			for _, info := range locks {
				listed = append(listed, fmt.Sprintf("%s/%d held=%v", info.Key, info.Permit, info.Held))
			}
			require.Equal(t, []string{"reports/1 held=true", "reports/2 held=true", "reports/3 held=true"}, listed)
		})
	}
}

// TestSemaphorePausedHolderLateWriteIsRefused: a permit holder paused past its lease
// (its client's clock stopped, so it never renews) writes late through FenceHeld with
// the semaphore's key and its token, and through FenceUpdate on its own slot's row:
// the new holder of its permit has written, and both late writes are refused.
func TestSemaphorePausedHolderLateWriteIsRefused(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t)
	ctx := t.Context()
	_, err := pool.Exec(ctx, `CREATE TABLE export_slots (slot int PRIMARY KEY, batch text NOT NULL, fencing_token bigint NOT NULL DEFAULT 0);
		INSERT INTO export_slots (slot, batch) VALUES (1, 'none'), (2, 'none')`)
	require.NoError(t, err)
	store := pglock.NewPostgresStore(pool)
	paused := newClient(t, store, quiet, pglock.TTL(200*time.Millisecond), pglock.WithClock(pglocktest.NewManualClock(time.Now())))
	other := newClient(t, store, quiet, pglock.TTL(10*time.Second))
	semA, err := paused.Semaphore("exports", 1)
	require.NoError(t, err)
	semB, err := other.Semaphore("exports", 1)
	require.NoError(t, err)

	a, err := semA.TryAcquire(ctx)
	require.NoError(t, err)
	awaitExpiry(t, pool, "exports\x1f1") // a's lease ends while it is paused
	b, err := semB.TryAcquire(ctx)
	require.NoError(t, err)
	require.Equal(t, a.Permit(), b.Permit())
	require.Greater(t, b.Token(), a.Token())

	fenceHeld := func(l *pglock.Lock, batch string) int64 {
		q, args, err := pglock.FenceHeld("UPDATE export_slots SET batch = $1 WHERE slot = $2", l.Key(), l.Token(), batch, l.Permit())
		require.NoError(t, err)
		tag, err := pool.Exec(ctx, q, args...)
		require.NoError(t, err)
		return tag.RowsAffected()
	}
	fenceUpdate := func(l *pglock.Lock, batch string) int64 {
		n, err := pglock.ExecFenced(ctx, pool, "UPDATE export_slots SET batch = $1 WHERE slot = $2", "fencing_token", l.Token(), batch, l.Permit())
		require.NoError(t, err)
		return n
	}
	require.EqualValues(t, 1, fenceHeld(b, "b-held"))
	require.EqualValues(t, 1, fenceUpdate(b, "b-token"))
	require.EqualValues(t, 0, fenceHeld(a, "a-late"), "the paused holder's FenceHeld write")
	require.EqualValues(t, 0, fenceUpdate(a, "a-late"), "the paused holder's FenceUpdate write")
	var batch string
	require.NoError(t, pool.QueryRow(ctx, "SELECT batch FROM export_slots WHERE slot = 1").Scan(&batch))
	require.Equal(t, "b-token", batch)
}

// TestSemaphoreCloseHandsPermitsBack: Close releases the permits a client holds, and
// another client takes them at once.
func TestSemaphoreCloseHandsPermitsBack(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t)
	ctx := t.Context()
	c, err := pglock.New(pool, quiet, pglock.TTL(time.Minute))
	require.NoError(t, err)
	sem, err := c.Semaphore("feed", 2)
	require.NoError(t, err)
	l1, err := sem.TryAcquire(ctx)
	require.NoError(t, err)
	_, err = sem.TryAcquire(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, liveHolders(t, pool, "feed"))
	require.NoError(t, c.Close(ctx))
	require.Equal(t, 0, liveHolders(t, pool, "feed"))
	require.ErrorIs(t, context.Cause(l1.Context()), pglock.ErrClosed)

	other := newPoolClient(t, pool)
	sem2, err := other.Semaphore("feed", 2)
	require.NoError(t, err)
	_, err = sem2.TryAcquire(ctx)
	require.NoError(t, err)
}

// TestSemaphoreReleaseWakesAWaiter: a waiter parked on a full semaphore is woken by
// the release of a permit (through the listener), long before its poll would come,
// and a cancelled Acquire leaves no permit behind.
func TestSemaphoreReleaseWakesAWaiter(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t)
	ctx := t.Context()
	holder := newPoolClient(t, pool, pglock.TTL(time.Minute))
	waiter := newPoolClient(t, pool, pglock.TTL(time.Minute))
	semH, err := holder.Semaphore("warehouse", 2)
	require.NoError(t, err)
	semW, err := waiter.Semaphore("warehouse", 2)
	require.NoError(t, err)
	l1, err := semH.TryAcquire(ctx)
	require.NoError(t, err)
	_, err = semH.TryAcquire(ctx)
	require.NoError(t, err)

	// Cancelled while waiting: nothing held by the waiter afterwards.
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = semW.Acquire(cctx)
	cancel()
	require.ErrorIs(t, err, pglock.ErrNotAcquired)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, 2, liveHolders(t, pool, "warehouse"))

	got := make(chan *pglock.Lock, 1)
	go func() {
		l, err := semW.Acquire(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	require.Eventually(t, func() bool { return wanted(pool, "warehouse\x1f1") && wanted(pool, "warehouse\x1f2") },
		10*time.Second, 5*time.Millisecond, "the waiter marks both permits")
	released := time.Now()
	require.NoError(t, l1.Release(ctx))
	l := receive(t, got, "the woken waiter's permit")
	requirePrompt(t, time.Since(released), 5*time.Second, 15*time.Second, "the waiter, woken by the release")
	require.Equal(t, l1.Permit(), l.Permit())
	require.Greater(t, l.Token(), l1.Token())
}

// TestSemaphoreBadInput: every bad argument is a clear error that changes nothing.
func TestSemaphoreBadInput(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t)
	ctx := t.Context()
	c := newPoolClient(t, pool)
	for _, tc := range []struct {
		name    string
		key     string
		permits int
		want    error
	}{
		{"no permits", "k", 0, pglock.ErrInvalidArgument},
		{"negative permits", "k", -1, pglock.ErrInvalidArgument},
		{"more than MaxPermits", "k", pglock.MaxPermits + 1, pglock.ErrInvalidArgument},
		{"empty key", "", 1, pglock.ErrInvalidKey},
		{"key with U+001F", "a\x1f1", 1, pglock.ErrInvalidKey},
		{"key too long for a semaphore", strings.Repeat("k", pglock.MaxKeyLength-4), 1, pglock.ErrInvalidKey},
		{"key with NUL", "a\x00", 1, pglock.ErrInvalidKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sem, err := c.Semaphore(tc.key, tc.permits)
			require.ErrorIs(t, err, tc.want)
			require.Nil(t, sem)
		})
	}
	sem, err := c.Semaphore(strings.Repeat("k", pglock.MaxKeyLength-5), pglock.MaxPermits)
	require.NoError(t, err, "the longest key and the most permits")
	l, err := sem.TryAcquire(ctx)
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))

	sem, err = c.Semaphore("bad", 2)
	require.NoError(t, err)
	for _, permit := range []int{0, -1, pglock.MaxPermits + 1} {
		_, err := sem.ForceRelease(ctx, permit)
		require.ErrorIs(t, err, pglock.ErrInvalidArgument, "ForceRelease(%d)", permit)
	}
	require.ErrorIs(t, sem.WithPermit(ctx, nil), pglock.ErrInvalidArgument)
	_, err = sem.TryAcquire(ctx, pglock.TTL(0))
	require.ErrorIs(t, err, pglock.ErrInvalidArgument)
	_, err = sem.Acquire(ctx, pglock.Wait(-time.Second))
	require.ErrorIs(t, err, pglock.ErrInvalidArgument)
	for _, key := range []string{"a\x1f1", "a\x1f"} {
		_, err = c.TryAcquire(ctx, key)
		require.ErrorIs(t, err, pglock.ErrInvalidKey, "a lock's key %q", key)
	}
	require.Empty(t, lockKeys(t, pool)[1:], "nothing but the longest key's permit was written")

	// The SQL functions refuse what the Go API refuses.
	for _, q := range []string{
		`SELECT pglock.sem_acquire('k', 'o', 1000, 0)`,
		`SELECT pglock.sem_acquire('k', 'o', 1000, 1001)`,
		`SELECT pglock.sem_acquire('k' || chr(31), 'o', 1000, 1)`,
		`SELECT pglock.sem_acquire(repeat('k', 496), 'o', 1000, 1)`,
		`SELECT pglock.sem_acquire('k', '', 1000, 1)`,
		`SELECT pglock.sem_acquire('k', 'o', 0, 1)`,
		`SELECT pglock.sem_want('k', 0)`,
		`SELECT pglock.sem_release('', 'o')`,
	} {
		_, err := pool.Exec(ctx, q)
		require.Error(t, err, q)
		require.Contains(t, err.Error(), "22023", q)
	}
	require.Len(t, lockKeys(t, pool), 1)
}

// TestSemaphoreForceRelease breaks one permit: its holder loses it, the next
// acquisition takes that permit with a greater token, and the list shows it.
func TestSemaphoreForceRelease(t *testing.T) {
	t.Parallel()
	for name, newStore := range semaphoreStores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			store, _ := newStore(t)
			// The client renews when the test moves its clock; the store keeps its leases
			// however slow the machine.
			const ttl = time.Minute
			clock := pglocktest.NewManualClock(time.Now())
			c := newClient(t, store, quiet, pglock.TTL(ttl), pglock.WithClock(clock))
			ctx := t.Context()
			sem, err := c.Semaphore("jobs", 2)
			require.NoError(t, err)
			l1, err := sem.TryAcquire(ctx)
			require.NoError(t, err)
			l2, err := sem.TryAcquire(ctx)
			require.NoError(t, err)
			info, err := sem.ForceRelease(ctx, 2)
			require.NoError(t, err)
			require.Equal(t, "jobs", info.Key)
			require.Equal(t, 2, info.Permit)
			require.Equal(t, l2.Token(), info.Token)
			_, err = sem.ForceRelease(ctx, 2)
			require.ErrorIs(t, err, pglock.ErrNotHeld)
			clock.Advance(ttl / 3) // the renewal of both permits
			require.Error(t, l2.Context().Err(), "the broken permit's holder never learnt")
			var lost *pglock.LockLostError
			require.ErrorAs(t, context.Cause(l2.Context()), &lost)
			require.Equal(t, "jobs", lost.Key)
			require.Equal(t, 2, lost.Permit, "the lost permit's number")
			require.Equal(t, `pglock: permit 2 of "jobs" (token `+strconv.FormatInt(l2.Token(), 10)+`) lost: refused`, lost.Error())
			require.True(t, l1.Held())
			l3, err := sem.TryAcquire(ctx)
			require.NoError(t, err)
			require.Equal(t, 2, l3.Permit())
			require.Greater(t, l3.Token(), l2.Token())
			require.True(t, errors.Is(l2.Release(ctx), pglock.ErrLockLost))
		})
	}
}

// TestJobAtMost: three instances tick a job limited to two runs at once; two run, the
// third skips its tick (SkipLimitReached, in events and skip counts), each run holds
// a permit (FromContext), and the run history records the permits' tokens.
func TestJobAtMost(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t)
	ctx := t.Context()
	const job = "invoice-export"
	events := &eventLog{}
	release := make(chan struct{})
	running := make(chan *pglock.Lock, 3)
	var jobs []*pglock.Job
	var clients []*pglock.Client
	for _, name := range []string{"api-1", "api-2", "api-3"} {
		c := historyClient(t, pool, name, pglock.WithEventHandler(events.record))
		j, err := c.Job(job, func(ctx context.Context) error {
			l, ok := pglock.FromContext(ctx)
			if !ok {
				return errors.New("no permit in the run's ctx")
			}
			running <- l
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}, pglock.AtMost(2))
		require.NoError(t, err)
		jobs, clients = append(jobs, j), append(clients, c)
	}
	var wg sync.WaitGroup
	for _, j := range jobs[:2] {
		wg.Go(func() { require.NoError(t, j.Run(ctx)) })
	}
	permits := []*pglock.Lock{receive(t, running, "a run"), receive(t, running, "a second run")}
	third, cancel := context.WithTimeout(ctx, 10*time.Second) // a third run that starts ends with it
	defer cancel()
	require.NoError(t, jobs[2].Run(third), "a skipped tick")
	require.Empty(t, running, "a third run")
	requireEvents(t, events, 1, pglock.EventJobSkipped, job, pglock.SkipLimitReached)
	require.ElementsMatch(t, []int{1, 2}, []int{permits[0].Permit(), permits[1].Permit()})
	close(release)
	wg.Wait()
	for _, c := range clients {
		require.NoError(t, c.Close(ctx)) // writes what is pending
	}
	runs, err := clients[0].JobRuns(ctx, job, 10)
	require.NoError(t, err)
	require.Len(t, runs, 2)
	require.ElementsMatch(t, []int64{permits[0].Token(), permits[1].Token()}, []int64{runs[0].Token, runs[1].Token})
	statuses, err := clients[0].JobStatuses(ctx)
	require.NoError(t, err)
	require.Len(t, statuses, 1)
	require.Equal(t, []pglock.JobSkips{{Instance: "api-3", Reason: pglock.SkipLimitReached, Count: 1, Last: statuses[0].Skips[0].Last}}, statuses[0].Skips)
}

// TestJobAtMostBadInput: AtMost out of range, or beside WithoutOverlapping or
// OnOneInstance, is refused and registers nothing.
func TestJobAtMostBadInput(t *testing.T) {
	t.Parallel()
	c := newClient(t, pglock.NewMemoryStore(nil), quiet)
	fn := func(context.Context) error { return nil }
	for _, tc := range []struct {
		name string
		opts []pglock.JobOption
	}{
		{"zero", []pglock.JobOption{pglock.AtMost(0)}},
		{"negative", []pglock.JobOption{pglock.AtMost(-2)}},
		{"over MaxPermits", []pglock.JobOption{pglock.AtMost(pglock.MaxPermits + 1)}},
		{"with WithoutOverlapping", []pglock.JobOption{pglock.AtMost(2), pglock.WithoutOverlapping()}},
		{"with OnOneInstance", []pglock.JobOption{pglock.OnOneInstance(), pglock.AtMost(2)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Job("limited", fn, tc.opts...)
			require.ErrorIs(t, err, pglock.ErrInvalidArgument)
			require.Contains(t, err.Error(), "AtMost")
		})
	}
	_, err := c.Job("limited", fn, pglock.AtMost(pglock.MaxPermits))
	require.NoError(t, err, "the key was left free")
}
