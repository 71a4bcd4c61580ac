package pglock_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/store"
	"github.com/pgfence/pglock/pglocktest"
)

// What a client does when its store goes away and comes back, maybe as another server
// (a failover): it confirms every lock it holds at once, since the new server may have
// lost some, not at each one's next renewal, a third of its ttl later; and a waiter
// parked in Acquire rides the outage out. These tests fail over a memory store;
// failover_test.go does it to PostgreSQL.

// switchingStore is a memory store that a test fails over: failover forgets every lock
// granted so far, as a promoted standby that missed the last commits does, and with a
// new timeline, tokens carry it from then on (as migration 000012 has PostgreSQL's do);
// while down, every call fails as on a connection to a server that is gone.
type switchingStore struct {
	store.Store

	mu       sync.Mutex
	granted  map[string]string // key → owner, granted since the last failover
	timeline int64             // added to tokens, shifted as 000012 does
	down     bool
	attempts int // Acquire calls
	failed   int // Acquire calls that failed
}

func newSwitchingStore(clock pglock.Clock) *switchingStore {
	return &switchingStore{Store: pglock.InternalStore(pglock.NewMemoryStore(clock)), granted: map[string]string{}}
}

func (s *switchingStore) err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down { // a connection that cannot be made: nothing reached the server, nothing to hand back
		return &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	}
	return nil
}

func (s *switchingStore) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (int64, bool, error) {
	err := s.err()
	s.mu.Lock()
	s.attempts++
	if err != nil {
		s.failed++
	}
	s.mu.Unlock()
	if err != nil {
		return 0, false, err
	}
	token, ok, err := s.Store.Acquire(ctx, key, owner, ttl)
	s.mu.Lock()
	defer s.mu.Unlock()
	if ok {
		s.granted[key] = owner
		token += s.timeline << 40
	}
	return token, ok, err
}

func (s *switchingStore) Renew(ctx context.Context, key, owner string, ttl time.Duration) (bool, error) {
	if err := s.err(); err != nil {
		return false, err
	}
	return s.Store.Renew(ctx, key, owner, ttl)
}

func (s *switchingStore) Release(ctx context.Context, key, owner string) (bool, error) {
	if err := s.err(); err != nil {
		return false, err
	}
	return s.Store.Release(ctx, key, owner)
}

func (s *switchingStore) RenewMany(ctx context.Context, keys, owners []string, ttl time.Duration) ([]string, error) {
	if err := s.err(); err != nil {
		return nil, err
	}
	return s.Store.RenewMany(ctx, keys, owners, ttl)
}

func (s *switchingStore) ReleaseMany(ctx context.Context, keys, owners []string) ([]int, error) {
	if err := s.err(); err != nil {
		return nil, err
	}
	return s.Store.ReleaseMany(ctx, keys, owners)
}

// failover loses every lock granted so far; newTimeline has the tokens show it.
func (s *switchingStore) failover(t *testing.T, newTimeline bool) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for key, owner := range s.granted {
		ok, err := s.Store.Release(t.Context(), key, owner)
		require.NoError(t, err)
		require.True(t, ok)
	}
	clear(s.granted)
	if newTimeline {
		s.timeline++
	}
}

// counts returns how many acquisitions were attempted, and how many of them failed.
func (s *switchingStore) counts() (attempts, failed int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.attempts, s.failed
}

func (s *switchingStore) setDown(down bool) {
	s.mu.Lock()
	s.down = down
	s.mu.Unlock()
}

// requireLost checks that l was found lost, with a refused renewal.
func requireLost(t *testing.T, l *pglock.Lock) {
	t.Helper()
	require.Error(t, l.Context().Err(), "the lock lost in the failover is still held")
	var lle *pglock.LockLostError
	require.True(t, errors.As(context.Cause(l.Context()), &lle), "cause %v", context.Cause(l.Context()))
	require.Equal(t, pglock.LostRefused, lle.Reason)
}

func TestHeldLocksAreConfirmedAtOnce(t *testing.T) {
	t.Parallel()
	const ttl = 30 * time.Second // renewed every 10 s on a clock that moves only when told to

	t.Run("WhenCallsSucceedAgainAfterFailing", func(t *testing.T) {
		t.Parallel()
		clock := pglocktest.NewManualClock(time.Now())
		store := newSwitchingStore(clock)
		c := newClient(t, pglock.WrapStore(store), pglock.TTL(ttl), pglock.WithClock(clock), quiet)
		lost, err := c.TryAcquire(t.Context(), "held")
		require.NoError(t, err)
		clock.Advance(time.Second)

		store.failover(t, false)
		store.setDown(true)
		_, err = c.TryAcquire(t.Context(), "work:1")
		var op *net.OpError
		require.ErrorAs(t, err, &op)
		store.setDown(false)
		clock.Advance(0)
		require.NoError(t, lost.Context().Err(), "nothing has succeeded yet")

		_, err = c.TryAcquire(t.Context(), "work:2") // the client's calls come back
		require.NoError(t, err)
		clock.Advance(0) // runs the round that Confirm armed
		requireLost(t, lost)
	})

	t.Run("WhenATokenComesFromALaterTimeline", func(t *testing.T) {
		t.Parallel()
		clock := pglocktest.NewManualClock(time.Now())
		store := newSwitchingStore(clock)
		c := newClient(t, pglock.WrapStore(store), pglock.TTL(ttl), pglock.WithClock(clock), quiet)
		lost, err := c.TryAcquire(t.Context(), "held")
		require.NoError(t, err)
		clock.Advance(time.Second)

		store.failover(t, false) // no new timeline, no failed call: nothing tells the client
		_, err = c.TryAcquire(t.Context(), "work:1")
		require.NoError(t, err)
		clock.Advance(0)
		require.NoError(t, lost.Context().Err(), "no sign of a failover yet")

		store.failover(t, true) // no call fails; the next token is of timeline 2
		l, err := c.TryAcquire(t.Context(), "work:2")
		require.NoError(t, err)
		require.Greater(t, l.Token(), int64(1)<<40)
		clock.Advance(0)
		requireLost(t, lost)
		require.True(t, l.Held(), "the lock granted on the new timeline is not confirmed again")
	})
}

// TestHeldLocksAreConfirmedWhenTheListenerReconnects: the listener's connection is cut
// and comes back (as in a failover, where it comes back to the promoted standby): the
// client confirms its locks at once, finding lost the one whose row went away.
func TestHeldLocksAreConfirmedWhenTheListenerReconnects(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pglocktest.Postgres(t)
	c := newPoolClient(t, pool, pglock.TTL(30*time.Second)) // renewed every 10 s
	other := newPoolClient(t, pool)
	lost, err := c.TryAcquire(ctx, "held")
	require.NoError(t, err)
	held, err := other.TryAcquire(ctx, "k")
	require.NoError(t, err)
	t.Cleanup(func() { _ = held.Release(context.WithoutCancel(ctx)) })
	waitCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _, _ = c.Acquire(waitCtx, "k") }() // starts the listener
	require.Eventually(t, func() bool { return wanted(pool, "k") }, 5*time.Second, 5*time.Millisecond)
	pid := listenerPID(pool)
	require.NotZero(t, pid)

	// As a standby that missed the acquisition would: the row is gone.
	_, err = pool.Exec(ctx, "DELETE FROM pglock.locks WHERE key = 'held'")
	require.NoError(t, err)
	cut := time.Now()
	_, err = pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid)
	require.NoError(t, err)
	select {
	case <-lost.Context().Done():
		t.Logf("lost %v after the listener's connection was cut", time.Since(cut).Round(time.Millisecond))
	case <-time.After(3 * time.Second):
		t.Fatal("the lock whose row went away is still held 3 s after the listener's connection was cut")
	}
	requireLost(t, lost)
}

func TestAcquireRidesOutAnOutage(t *testing.T) {
	t.Parallel()
	// The waiters poll every quarter of the ttl, and ride out an outage for a ttl, in
	// which the attempts counted below must be made: 3 s, which ForATTLAtMost waits out,
	// so that a loaded machine's stall of a second or two still leaves time for them.
	const ttl = 3 * time.Second

	// parked returns a waiter's client on a store that fails over, the store, and the
	// waiter's result, once the waiter found key held by another client.
	parked := func(t *testing.T) (*switchingStore, *pglock.Lock, <-chan error) {
		t.Helper()
		store := newSwitchingStore(nil)
		holder := newClient(t, pglock.WrapStore(store.Store), quiet) // beside the outage
		held, err := holder.TryAcquire(t.Context(), "k")
		require.NoError(t, err)
		waiter := newClient(t, pglock.WrapStore(store), pglock.TTL(ttl), quiet)
		got := make(chan error, 1)
		go func() {
			l, err := waiter.Acquire(t.Context(), "k")
			if err == nil {
				err = l.Release(t.Context())
			}
			got <- err
		}()
		require.Eventually(t, func() bool { attempts, _ := store.counts(); return attempts > 0 }, 5*time.Second, time.Millisecond)
		return store, held, got
	}

	t.Run("AndAcquiresOnceTheStoreIsBack", func(t *testing.T) {
		t.Parallel()
		store, held, got := parked(t)
		store.setDown(true)
		require.Eventually(t, func() bool { _, failed := store.counts(); return failed >= 2 }, 5*time.Second, time.Millisecond)
		require.NoError(t, held.Release(t.Context()))
		store.setDown(false)
		require.NoError(t, receive(t, got, "acquisition once the store is back"))
	})

	t.Run("ForATTLAtMost", func(t *testing.T) {
		t.Parallel()
		store, _, got := parked(t)
		store.setDown(true)
		start := time.Now()
		err := receive(t, got, "the outage's error")
		var op *net.OpError
		require.ErrorAs(t, err, &op)
		require.NotErrorIs(t, err, pglock.ErrNotAcquired)
		require.GreaterOrEqual(t, time.Since(start), ttl)
		_, failed := store.counts()
		require.Greater(t, failed, 4, "tried again soon, then with its backoff")
	})

	t.Run("NotBeforeTheStoreAnsweredIt", func(t *testing.T) {
		t.Parallel()
		store := newSwitchingStore(nil)
		store.setDown(true)
		c := newClient(t, pglock.WrapStore(store), pglock.TTL(ttl), quiet)
		start := time.Now()
		_, err := c.Acquire(t.Context(), "k")
		var op *net.OpError
		require.ErrorAs(t, err, &op)
		require.Less(t, time.Since(start), ttl/2, "an Acquire whose first attempt fails returns at once")
	})
}

// TestCampaignRetriesSoonAfterAnOutage: a campaign that fails because the store is
// away is made again soon, not a third of the ttl later: an election whose candidates'
// first calls after a failover meet the dead primary's connections has a leader as soon
// as the new primary answers.
func TestCampaignRetriesSoonAfterAnOutage(t *testing.T) {
	t.Parallel()
	const ttl = 3 * time.Second // campaigns every second
	store := newSwitchingStore(nil)
	holder := newClient(t, pglock.WrapStore(store.Store), quiet) // beside the outage
	held, err := holder.TryAcquire(t.Context(), "leader")
	require.NoError(t, err)
	c := newClient(t, pglock.WrapStore(store), quiet)
	acquired := make(chan time.Time, 1)
	_, err = c.Elect("leader", pglock.LeaderCallbacks{
		OnAcquired: func(context.Context, *pglock.Lock) error { acquired <- time.Now(); return nil },
	}, pglock.TTL(ttl))
	require.NoError(t, err)
	require.Eventually(t, func() bool { attempts, _ := store.counts(); return attempts > 0 }, 5*time.Second, time.Millisecond)

	store.setDown(true)
	require.Eventually(t, func() bool { _, failed := store.counts(); return failed > 0 }, 5*time.Second, time.Millisecond,
		"a campaign fails")
	require.NoError(t, held.Release(t.Context()))
	store.setDown(false)
	back := time.Now()
	at := receive(t, acquired, "leadership")
	require.Less(t, at.Sub(back), ttl/6, "the next campaign came a third of the ttl after the failed one")
	t.Logf("leading %v after the store came back", at.Sub(back).Round(time.Millisecond))
}
