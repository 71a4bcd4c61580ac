package pglock_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/store"
	"github.com/pgfence/pglock/internal/tcpproxy"
	"github.com/pgfence/pglock/pglocktest"
)

func TestBadInputGetsAClearErrorAndTouchesNothing(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t)
	c := newClient(t, pglock.NewPostgresStore(pool))
	fn := func(context.Context) error { return nil }
	long := strings.Repeat("é", pglock.MaxKeyLength+1)
	cases := []struct {
		name string
		key  string
		opts []pglock.Option // the calls' options; TTL is every call's
		fn   func(context.Context) error
		want error
	}{
		{"EmptyKey", "", nil, fn, pglock.ErrInvalidKey},
		{"KeyOver500Characters", long, nil, fn, pglock.ErrInvalidKey},
		{"InvalidUTF8", "inv\xffalid", nil, fn, pglock.ErrInvalidKey},
		{"NULByte", "nul\x00key", nil, fn, pglock.ErrInvalidKey},
		{"UnitSeparator", "exports\x1f1", nil, fn, pglock.ErrInvalidKey},
		{"TTLUnder1ms", "k", []pglock.Option{pglock.TTL(time.Microsecond)}, fn, pglock.ErrInvalidArgument},
		{"ZeroTTL", "k", []pglock.Option{pglock.TTL(0)}, fn, pglock.ErrInvalidArgument},
		{"TTLOverOneYear", "k", []pglock.Option{pglock.TTL(pglock.MaxTTL + time.Millisecond)}, fn, pglock.ErrInvalidArgument},
		{"NilOption", "k", []pglock.Option{nil}, fn, pglock.ErrInvalidArgument},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.TryAcquire(t.Context(), tc.key, tc.opts...)
			require.ErrorIs(t, err, tc.want)
			require.True(t, strings.HasPrefix(err.Error(), "pglock: "), err.Error())
			_, err = c.Acquire(t.Context(), tc.key, optionsOf[pglock.AcquireOption](tc.opts)...)
			require.ErrorIs(t, err, tc.want)
			ran := false
			err = c.WithLock(t.Context(), tc.key, func(context.Context) error { ran = true; return nil }, optionsOf[pglock.AcquireOption](tc.opts)...)
			require.ErrorIs(t, err, tc.want)
			require.False(t, ran)
		})
	}
	t.Run("NilFn", func(t *testing.T) {
		require.ErrorIs(t, c.WithLock(t.Context(), "k", nil), pglock.ErrInvalidArgument)
	})
	t.Run("NegativeWait", func(t *testing.T) {
		_, err := c.Acquire(t.Context(), "k", pglock.Wait(-time.Second))
		require.ErrorIs(t, err, pglock.ErrInvalidArgument)
		require.ErrorContains(t, err, "pglock: invalid argument: Acquire: Wait: -1s is negative")
		ran := false
		err = c.WithLock(t.Context(), "k", func(context.Context) error { ran = true; return nil }, pglock.Wait(-time.Second))
		require.ErrorIs(t, err, pglock.ErrInvalidArgument)
		require.False(t, ran)
	})
	t.Run("NilOptionNamesTheCall", func(t *testing.T) {
		_, err := c.TryAcquire(t.Context(), "k", nil)
		require.ErrorIs(t, err, pglock.ErrInvalidArgument)
		require.ErrorContains(t, err, "pglock: invalid argument: TryAcquire: a nil Option")
		_, err = c.Acquire(t.Context(), "k", pglock.TTL(time.Second), nil)
		require.ErrorContains(t, err, "pglock: invalid argument: Acquire: a nil AcquireOption")
	})
	require.Empty(t, lockKeys(t, pool), "bad input wrote to the locks table")
}

func TestBadOptionsNameTheOption(t *testing.T) {
	t.Parallel()
	store := pglock.NewMemoryStore(nil)
	cases := []struct {
		name string
		opt  pglock.ClientOption
		want string
	}{
		{"TTLZero", pglock.TTL(0), "NewWithStore: TTL: 0s: want 1ms to 8760h0m0s"},
		{"TTLOverOneYear", pglock.TTL(pglock.MaxTTL + 1), "NewWithStore: TTL"},
		{"EmptyInstanceName", pglock.WithInstanceName(""), "NewWithStore: WithInstanceName"},
		{"InstanceNameWithNUL", pglock.WithInstanceName("a\x00b"), "WithInstanceName"},
		{"NilEventHandler", pglock.WithEventHandler(nil), "WithEventHandler: nil handler"},
		{"NilOption", nil, "NewWithStore: a nil ClientOption"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := pglock.NewWithStore(store, tc.opt)
			require.ErrorIs(t, err, pglock.ErrInvalidArgument)
			require.ErrorContains(t, err, tc.want)
			require.Nil(t, c)
		})
	}
	_, err := pglock.NewWithStore(nil)
	require.ErrorIs(t, err, pglock.ErrInvalidArgument)
	_, err = pglock.New(nil)
	require.ErrorIs(t, err, pglock.ErrInvalidArgument)
}

// A store on nil fails at construction of its client, and every call says why.
func TestStoreOnNilFailsWithAClearError(t *testing.T) {
	t.Parallel()
	var nilPool *pgxpool.Pool
	for name, store := range map[string]*pglock.Store{
		"NilQueryer":   pglock.NewPostgresStore(nil),
		"TypedNilPool": pglock.NewPostgresStore(nilPool),
		"NilSQLDB":     pglock.NewSQLStore(nil),
	} {
		t.Run(name, func(t *testing.T) {
			c, err := pglock.NewWithStore(store)
			require.ErrorIs(t, err, pglock.ErrInvalidArgument)
			require.ErrorContains(t, err, "nil db")
			require.Nil(t, c)
			_, _, err = pglock.InternalStore(store).Acquire(t.Context(), "k", "o", time.Second)
			require.ErrorIs(t, err, pglock.ErrInvalidArgument)
			_, err = pglock.InternalStore(store).Renew(t.Context(), "k", "o", time.Second)
			require.ErrorIs(t, err, pglock.ErrInvalidArgument)
			_, err = pglock.InternalStore(store).Release(t.Context(), "k", "o")
			require.ErrorIs(t, err, pglock.ErrInvalidArgument)
			_, err = storeRenewMany(t.Context(), store, []string{"k"}, []string{"o"}, time.Second)
			require.ErrorIs(t, err, pglock.ErrInvalidArgument)
			_, err = storeHolder(t.Context(), store, "k")
			require.ErrorIs(t, err, pglock.ErrInvalidArgument)
		})
	}
}

// zeroTokenStore is a broken store: it hands out token 0.
type zeroTokenStore struct {
	store.Store
	released atomic.Int32
}

func (s *zeroTokenStore) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (int64, bool, error) {
	_, ok, err := s.Store.Acquire(ctx, key, owner, ttl)
	return 0, ok, err
}

func (s *zeroTokenStore) Release(ctx context.Context, key, owner string) (bool, error) {
	s.released.Add(1)
	return s.Store.Release(ctx, key, owner)
}

func (s *zeroTokenStore) ReleaseMany(ctx context.Context, keys, owners []string) ([]int, error) {
	s.released.Add(1)
	return s.Store.ReleaseMany(ctx, keys, owners)
}

func TestStoreAnsweringNonPositiveTokenIsRefused(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t)
	broken := &zeroTokenStore{Store: pglock.InternalStore(pglock.NewPostgresStore(pool))}
	c := newClient(t, pglock.WrapStore(broken))
	_, err := c.TryAcquire(t.Context(), "k")
	require.ErrorIs(t, err, pglock.ErrInvalidToken)
	require.Eventually(t, func() bool { // handed back in the background
		var owners int
		require.NoError(t, pool.QueryRow(t.Context(), "SELECT count(owner) FROM pglock.locks").Scan(&owners))
		return owners == 0
	}, 5*time.Second, 5*time.Millisecond, "the lock it took is handed back")
	require.EqualValues(t, 1, broken.released.Load())
}

func TestStoreRejectsBadCalls(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t)
	for name, store := range map[string]*pglock.Store{
		"Postgres": pglock.NewPostgresStore(pool),
		"Memory":   pglock.NewMemoryStore(nil),
	} {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			_, _, err := pglock.InternalStore(store).Acquire(ctx, "", "o", time.Second)
			require.ErrorIs(t, err, pglock.ErrInvalidKey)
			_, _, err = pglock.InternalStore(store).Acquire(ctx, "k", "", time.Second)
			require.ErrorIs(t, err, pglock.ErrInvalidArgument)
			_, _, err = pglock.InternalStore(store).Acquire(ctx, "k", "o", 0)
			require.ErrorIs(t, err, pglock.ErrInvalidArgument)
			_, err = pglock.InternalStore(store).Renew(ctx, "k", "o", -time.Second)
			require.ErrorIs(t, err, pglock.ErrInvalidArgument)
			_, err = pglock.InternalStore(store).Release(ctx, "k\x00", "o")
			require.ErrorIs(t, err, pglock.ErrInvalidKey)
			_, _, err = pglock.InternalStore(store).Acquire(ctx, "k\x1f1", "o", time.Second)
			require.ErrorIs(t, err, pglock.ErrInvalidKey, "a permit's row key: taken only through its semaphore")
		})
	}
	_, err := storeRenewMany(t.Context(), pglock.NewPostgresStore(pool), []string{"a"}, nil, time.Second)
	require.ErrorIs(t, err, pglock.ErrInvalidArgument)
	require.Empty(t, lockKeys(t, pool))
}

func TestWithLockCancelsFnWhenLockIsLost(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t)
	store := pglock.NewPostgresStore(pool)
	clock := pglocktest.NewManualClock(time.Now())
	const ttl = time.Minute // A does nothing while it holds the lock: its clock stands still
	a := newClient(t, store, pglock.TTL(ttl), pglock.WithClock(clock))
	// B's 5 s ttl: its TryAcquire must be confirmed within nine tenths of it, which a
	// loaded machine can make last over a second.
	b := newClient(t, store, pglock.TTL(5*time.Second))

	inside := make(chan *pglock.Lock)
	result := make(chan error)
	go func() {
		result <- a.WithLock(t.Context(), "payment:42", func(ctx context.Context) error {
			l, ok := pglock.FromContext(ctx)
			if !ok {
				return errors.New("no lock in ctx")
			}
			inside <- l
			<-ctx.Done()
			return context.Cause(ctx)
		})
	}()
	lockA := receive(t, inside)
	pglock.EndLease(t, pool, "payment:42") // A's lease ends; A's clock stands still
	lockB, err := b.TryAcquire(t.Context(), "payment:42")
	require.NoError(t, err)
	require.Greater(t, lockB.Token(), lockA.Token())

	clock.Advance(ttl / 3) // A's renewal is refused: fn's ctx ends
	err = receive(t, result, "fn's return")
	var lost *pglock.LockLostError
	require.ErrorAs(t, err, &lost)
	require.Equal(t, "payment:42", lost.Key)
	require.Equal(t, pglock.LostRefused, lost.Reason)
}

func TestWithLockReleasesWhenFnPanics(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t)
	c := newClient(t, pglock.NewPostgresStore(pool))
	require.PanicsWithValue(t, "boom", func() {
		_ = c.WithLock(t.Context(), "k", func(context.Context) error { panic("boom") })
	})
	l, err := c.TryAcquire(t.Context(), "k")
	require.NoError(t, err, "the lock was released on the panic")
	require.NoError(t, l.Release(t.Context()))
	require.NoError(t, l.Release(t.Context()), "Release is idempotent")
}

func TestWithLockReturnsFnErrorAndCallerCancellation(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t)
	c := newClient(t, pglock.NewPostgresStore(pool))
	boom := errors.New("boom")
	require.ErrorIs(t, c.WithLock(t.Context(), "k", func(context.Context) error { return boom }), boom)

	ctx, cancel := context.WithCancel(t.Context())
	err := c.WithLock(ctx, "k", func(ctx context.Context) error {
		cancel()
		<-ctx.Done()
		return ctx.Err()
	})
	require.ErrorIs(t, err, context.Canceled)
	_, err = c.TryAcquire(t.Context(), "k")
	require.NoError(t, err, "released although the caller's ctx was cancelled")
}

func TestAcquireWaitsForRelease(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t)
	store := pglock.NewPostgresStore(pool)
	a := newClient(t, store)
	b := newClient(t, store)
	held, err := a.TryAcquire(t.Context(), "k")
	require.NoError(t, err)

	got := make(chan *pglock.Lock)
	go func() {
		l, err := b.Acquire(t.Context(), "k", pglock.Wait(10*time.Second))
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	time.Sleep(50 * time.Millisecond) // let the waiter find the key held at least once
	require.NoError(t, held.Release(t.Context()))
	select {
	case l := <-got:
		require.Greater(t, l.Token(), held.Token())
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter did not get the lock after its release")
	}
}

func TestAcquireGivesUpAfterWaitOrCtx(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t)
	store := pglock.NewPostgresStore(pool)
	a := newClient(t, store)
	b := newClient(t, store)
	_, err := a.TryAcquire(t.Context(), "k")
	require.NoError(t, err)

	start := time.Now()
	_, err = b.Acquire(t.Context(), "k", pglock.Wait(200*time.Millisecond))
	require.ErrorIs(t, err, pglock.ErrNotAcquired)
	require.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)

	_, err = b.Acquire(t.Context(), "k", pglock.Wait(0))
	require.ErrorIs(t, err, pglock.ErrNotAcquired)

	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, err = b.Acquire(ctx, "k")
	require.ErrorIs(t, err, pglock.ErrNotAcquired)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// An Acquire whose ctx ends while an attempt is on the wire gives up as one whose ctx
// ends between attempts: the key was not taken, for ctx's reason. (Under load the
// pause before an attempt can end on ctx's deadline just as well.)
func TestAcquireWhoseCtxEndsDuringAnAttemptIsNotAcquired(t *testing.T) {
	t.Parallel()
	url := pglocktest.PostgresURL(t)
	slow, proxy := proxiedPool(t, url, 1)
	a := newClient(t, pglock.NewPostgresStore(pglocktest.Pool(t, url, 2)), quiet)
	b := newClient(t, pglock.NewPostgresStore(slow), quiet)
	_, err := a.TryAcquire(t.Context(), "k")
	require.NoError(t, err)

	proxy.SetDelay(tcpproxy.ToClient, 300*time.Millisecond) // every reply comes after ctx's end
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, err = b.Acquire(ctx, "k")
	require.ErrorIs(t, err, pglock.ErrNotAcquired)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// Renewals keep a lock held past the ttl it was acquired with, on the database clock:
// the test of renewals that waits in real time, a ttl of 1 s. A renewal answered later
// than its margin (0.57 s at that ttl: a loaded machine's commit or stall) loses the
// lock, as it must; that attempt tells nothing, and the next has a ttl three times
// longer. A lock lost while every renewal was answered in time fails the test.
func TestRenewalsKeepALockPastItsTTL(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t)
	store := pglock.NewPostgresStore(pool)
	b := newClient(t, store)
	stalls := watchStalls(t)
	for ttl := time.Second; !keptPastTTL(t, pool, store, b, stalls, ttl); ttl *= 3 {
		require.Less(t, ttl, 9*time.Second, "renewals answered too late to tell, even at a ttl of %v", ttl)
		t.Logf("a renewal was answered too late for a ttl of %v: trying %v", ttl, 3*ttl)
	}
}

// keptPastTTL has a client of ttl acquire a key of its own, waits until the database
// clock is a renewal's interval past the lock's first expiry, and requires that b cannot
// take the key and the client still holds it. It returns false, having told nothing,
// when the lock was lost while a renewal call or a stall of the process took as long
// as a renewal's interval.
func keptPastTTL(t *testing.T, pool *pgxpool.Pool, store *pglock.Store, b *pglock.Client, stalls *stallWatch, ttl time.Duration) bool {
	t.Helper()
	ctx := t.Context()
	var slowest atomic.Int64 // the longest renewal call, in nanoseconds: set by the client's one event goroutine
	a := newClient(t, store, quiet, pglock.TTL(ttl), pglock.WithEventHandler(func(e pglock.Event) {
		if e.Type == pglock.EventRenewal && int64(e.Duration) > slowest.Load() {
			slowest.Store(int64(e.Duration))
		}
	}))
	key := "k-" + ttl.String()
	start := time.Now()
	l, err := a.TryAcquire(ctx, key)
	// A connection's first statements make their plans and may answer after the ttl
	// on a loaded machine: the lock is then handed back as too late to trust, which is
	// right, and is not what this test is about. Until that hand-back is done, the key
	// is held: poll.
	for until := time.Now().Add(10 * time.Second); errors.Is(err, pglock.ErrNotAcquired) && time.Now().Before(until); {
		time.Sleep(20 * time.Millisecond)
		l, err = a.TryAcquire(ctx, key)
	}
	require.NoError(t, err)
	awaitDatabaseTime(t, pool, expiresAt(t, pool, key).Add(ttl/3)) // database time: past the first expiry
	taken, err := b.TryAcquire(ctx, key)
	if err == nil {
		defer func() { require.NoError(t, taken.Release(ctx)) }()
	} else {
		require.ErrorIs(t, err, pglock.ErrNotAcquired)
	}
	if l.Held() {
		require.Nil(t, taken, "another client took the key while its holder held it")
		require.NoError(t, l.Release(ctx))
		return true
	}
	slow := max(time.Duration(slowest.Load()), stalls.longest(start, time.Now()))
	require.GreaterOrEqual(t, slow, ttl/3, "the lock was lost though no renewal call nor stall took a renewal's interval: %v",
		context.Cause(l.Context()))
	return false
}

func TestFailedRenewalsLoseTheLockAtItsDeadline(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t)
	store := &failingStore{Store: pglock.InternalStore(pglock.NewPostgresStore(pool))}
	clock := pglocktest.NewManualClock(time.Now())
	var events []pglock.Event
	var mu sync.Mutex
	c := newClient(t, pglock.WrapStore(store), pglock.TTL(time.Minute), pglock.WithClock(clock), pglock.WithEventHandler(func(e pglock.Event) {
		if e.Type == pglock.EventRenewal {
			return // one per renewal call
		}
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}))
	l, err := c.TryAcquire(t.Context(), "k")
	require.NoError(t, err)
	clock.Advance(20 * time.Second) // renewed
	store.failing.Store(true)
	clock.Advance(53 * time.Second) // renewals fail; the deadline, 20 s + 60 s less a tenth, not yet reached
	require.True(t, l.Held())
	clock.Advance(time.Second)
	require.False(t, l.Held())
	var lost *pglock.LockLostError
	require.ErrorAs(t, context.Cause(l.Context()), &lost)
	require.Equal(t, pglock.LostExpired, lost.Reason)
	require.NoError(t, c.Close(t.Context()))
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, events, 2)
	require.Equal(t, pglock.EventAcquired, events[0].Type)
	require.Equal(t, pglock.EventLost, events[1].Type)
	require.Equal(t, pglock.LostExpired, events[1].LostReason)
	require.Equal(t, l.Token(), events[1].Token)
}

func TestCloseReleasesEverything(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t)
	store := pglock.NewPostgresStore(pool)
	a, err := pglock.NewWithStore(store)
	require.NoError(t, err)
	b := newClient(t, store)
	var locks []*pglock.Lock
	for _, k := range []string{"a", "b", "c"} {
		l, err := a.TryAcquire(t.Context(), k)
		require.NoError(t, err)
		locks = append(locks, l)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel() // a cancelled ctx: Close gives up at once and leaves the locks to expire...
	require.ErrorIs(t, a.Close(ctx), context.Canceled)
	a, err = pglock.NewWithStore(store)
	require.NoError(t, err)
	for _, l := range locks {
		require.False(t, l.Held())
	}
	for _, k := range []string{"d", "e"} {
		_, err := a.TryAcquire(t.Context(), k)
		require.NoError(t, err)
	}
	require.NoError(t, a.Close(t.Context())) // ...a live one hands everything back
	for _, k := range []string{"d", "e"} {
		_, err := b.TryAcquire(t.Context(), k)
		require.NoError(t, err, "closed client handed %q back", k)
	}
	_, err = a.TryAcquire(t.Context(), "f")
	require.ErrorIs(t, err, pglock.ErrClosed)
	require.NoError(t, a.Close(t.Context()), "Close twice")
}

func TestOneHolderAtATimeUnderRace(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t)
	store := pglock.NewPostgresStore(pool)
	const instances, rounds = 4, 25
	clients := make([]*pglock.Client, instances)
	for i := range clients {
		clients[i] = newClient(t, store)
	}
	var inside, maxInside, runs atomic.Int32
	var lastToken atomic.Int64
	var wg sync.WaitGroup
	for i := range instances * 4 {
		wg.Go(func() {
			for range rounds {
				err := clients[i%instances].WithLock(t.Context(), "counter", func(ctx context.Context) error {
					n := inside.Add(1)
					defer inside.Add(-1)
					if n > maxInside.Load() {
						maxInside.Store(n)
					}
					l, _ := pglock.FromContext(ctx)
					if prev := lastToken.Swap(l.Token()); prev >= l.Token() {
						t.Errorf("token went back: %d after %d", l.Token(), prev)
					}
					runs.Add(1)
					return nil
				}, pglock.Wait(30*time.Second))
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	require.EqualValues(t, 1, maxInside.Load())
	require.EqualValues(t, instances*4*rounds, runs.Load())
}

// optionsOf returns opts as options of one call (O: pglock.AcquireOption, for one), nil
// staying nil; every Option is one.
func optionsOf[O any](opts []pglock.Option) []O {
	out := make([]O, len(opts))
	for i, o := range opts {
		out[i], _ = any(o).(O)
	}
	return out
}
