package pglock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/pglocktest"
)

// A link that goes silent: Health says "not ready" once the lock's renewal is overdue,
// while the lock is still held, here and in the database; once the link comes back and
// the renewal goes through, it is ready again, and the lock was never lost.
func TestHealthIsUnreadyWhileTheLinkIsSilentBeforeTheLockIsLost(t *testing.T) {
	t.Parallel()
	url := pglocktest.PostgresURL(t)
	silent, proxy := proxiedPool(t, url, 3)
	direct := pglocktest.Pool(t, url, 2)
	c := newClient(t, pglock.NewPostgresStore(silent), quiet)
	key := t.Name()

	h := c.Health()
	require.True(t, h.Ready, "a client that holds nothing is ready: %v", h.Err)
	require.Zero(t, h.Held)
	require.True(t, h.LastRenewal.IsZero())

	l, err := c.TryAcquire(t.Context(), key, pglock.TTL(6*time.Second)) // renewed every 2 s, lost at 5.4 s
	require.NoError(t, err)
	require.Eventually(t, func() bool { return !c.Health().LastRenewal.IsZero() }, 5*time.Second, 10*time.Millisecond,
		"the first renewal")
	h = c.Health()
	require.True(t, h.Ready, "%v", h.Err)
	require.Equal(t, 1, h.Held)
	firstRenewal := h.LastRenewal

	proxy.Blackhole() // nothing answers, nothing refuses
	defer proxy.Restore()
	silentAt := time.Now()
	require.Eventually(t, func() bool { h = c.Health(); return !h.Ready }, 6*time.Second, 10*time.Millisecond)
	// The lock is given up 5.4 s after the last confirmed renewal was sent.
	t.Logf("unready %v after the link went silent, %v after the last confirmed renewal; the lock is lost 5.4 s after its send",
		time.Since(silentAt).Round(time.Millisecond), time.Since(firstRenewal).Round(time.Millisecond))
	require.True(t, l.Held(), "unready before the lock is lost")
	require.NoError(t, l.Context().Err())
	require.Equal(t, 1, h.Held)
	require.ErrorContains(t, h.Err, "renewal overdue for 1 of 1 locks held")
	var live bool
	require.NoError(t, direct.QueryRow(t.Context(),
		"SELECT expires_at > clock_timestamp() FROM pglock.locks WHERE key = $1 AND owner = $2", key, l.Owner()).Scan(&live))
	require.True(t, live, "the database still has the lock")

	proxy.Restore() // the renewal held up goes through
	require.Eventually(t, func() bool { h = c.Health(); return h.Ready }, 3*time.Second, 10*time.Millisecond, "%v", h.Err)
	require.NoError(t, h.Err)
	require.True(t, h.LastRenewal.After(firstRenewal))
	require.True(t, l.Held())
	require.NoError(t, l.Context().Err(), "the lock was never lost")
	require.NoError(t, l.Release(t.Context()))
}

// A renewal call that fails makes the client unready at once, long before the lock's
// deadline; the first renewal that succeeds makes it ready again. Each call is an
// EventRenewal with its error.
func TestHealthIsUnreadyOnceARenewalFails(t *testing.T) {
	t.Parallel()
	store := &failingStore{Store: pglock.NewPostgresStore(pglocktest.Postgres(t))}
	clock := pglocktest.NewManualClock(time.Now())
	var mu sync.Mutex
	var renewals []pglock.Event
	c := newClient(t, store, quiet, pglock.TTL(time.Minute), pglock.WithClock(clock),
		pglock.WithEventHandler(func(e pglock.Event) {
			if e.Type == pglock.EventRenewal {
				mu.Lock()
				renewals = append(renewals, e)
				mu.Unlock()
			}
		}))
	l, err := c.TryAcquire(t.Context(), t.Name())
	require.NoError(t, err)

	clock.Advance(20 * time.Second) // renewed
	h := c.Health()
	require.True(t, h.Ready, "%v", h.Err)
	require.Equal(t, clock.Now(), h.LastRenewal)
	renewedAt := h.LastRenewal

	store.failing.Store(true)
	clock.Advance(20 * time.Second) // the renewal fails; the deadline is 34 s away
	h = c.Health()
	require.False(t, h.Ready)
	require.ErrorIs(t, h.Err, errStoreDown)
	require.ErrorContains(t, h.Err, "pglock: renewal failed")
	require.Equal(t, renewedAt, h.LastRenewal)
	require.Equal(t, 1, h.Held)
	require.True(t, l.Held())

	store.failing.Store(false)
	clock.Advance(6 * time.Second) // the retry, a tenth of the ttl later, succeeds
	h = c.Health()
	require.True(t, h.Ready, "%v", h.Err)
	require.Equal(t, clock.Now(), h.LastRenewal)

	require.NoError(t, c.Close(t.Context()))
	h = c.Health()
	require.False(t, h.Ready, "a closed client takes no work")
	require.ErrorIs(t, h.Err, pglock.ErrClosed)
	require.Zero(t, h.Held)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, renewals, 3)
	require.NoError(t, renewals[0].Err)
	require.ErrorIs(t, renewals[1].Err, errStoreDown)
	require.NoError(t, renewals[2].Err)
	for _, e := range renewals {
		require.Empty(t, e.Key)
	}
}

func TestHealthCountsTheElectionsLed(t *testing.T) {
	t.Parallel()
	c := newClient(t, pglock.NewPostgresStore(pglocktest.Postgres(t)), quiet)
	led := make(chan struct{})
	e, err := c.Elect(t.Name(), pglock.LeaderCallbacks{OnAcquired: func(context.Context, *pglock.Lock) error {
		close(led)
		return nil
	}})
	require.NoError(t, err)
	receive(t, led)
	h := c.Health()
	require.Equal(t, 1, h.Leading)
	require.Equal(t, 1, h.Held, "the lease")
	require.True(t, h.Ready)
	require.NoError(t, e.Resign(t.Context()))
	h = c.Health()
	require.Zero(t, h.Leading)
	require.Zero(t, h.Held)
}

// Acquisitions report how long the caller waited and how long the store call took;
// calls that return without the lock report why, for each of the three calls.
func TestAcquireEventsCarryWaitDurationAndWhy(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t)
	clock := pglocktest.NewManualClock(time.Now())
	const took = 30 * time.Millisecond
	slow := &clockMovingStore{Store: pglock.NewPostgresStore(pool), clock: clock, d: took}
	var mu sync.Mutex
	var got []pglock.Event
	record := func(e pglock.Event) {
		mu.Lock()
		got = append(got, e)
		mu.Unlock()
	}
	var second []pglock.EventType // a second handler gets every event too, after the first
	c, err := pglock.NewWithStore(slow, quiet, pglock.WithClock(clock), pglock.WithEventHandler(record),
		pglock.WithEventHandler(func(e pglock.Event) {
			mu.Lock()
			second = append(second, e.Type)
			mu.Unlock()
		}))
	require.NoError(t, err)
	other := newClient(t, pglock.NewPostgresStore(pool), quiet)
	key := t.Name()

	l, err := c.TryAcquire(t.Context(), key)
	require.NoError(t, err)
	require.NoError(t, l.Release(t.Context()))
	held, err := other.TryAcquire(t.Context(), key)
	require.NoError(t, err)
	_, err = c.TryAcquire(t.Context(), key)
	require.ErrorIs(t, err, pglock.ErrNotAcquired)
	_, err = c.Acquire(t.Context(), key, pglock.Wait(0))
	require.ErrorIs(t, err, pglock.ErrNotAcquired)
	err = c.WithLock(t.Context(), key, nil)
	require.ErrorIs(t, err, pglock.ErrInvalidArgument)
	_, err = c.Acquire(t.Context(), "", pglock.Wait(0))
	require.ErrorIs(t, err, pglock.ErrInvalidKey)
	require.NoError(t, held.Release(t.Context()))
	require.NoError(t, c.WithLock(t.Context(), key, func(context.Context) error { return nil }))
	require.NoError(t, c.Close(t.Context()))

	mu.Lock()
	defer mu.Unlock()
	type seen struct {
		typ        pglock.EventType
		wait, took time.Duration
		err        error
	}
	var seq []seen
	for _, e := range got {
		if e.Type == pglock.EventAcquired || e.Type == pglock.EventAcquireFailed {
			seq = append(seq, seen{e.Type, e.Wait, e.Duration, e.Err})
		}
	}
	require.Len(t, seq, 6)
	require.Equal(t, seen{pglock.EventAcquired, took, took, nil}, seq[0], "TryAcquire")
	require.Equal(t, pglock.EventAcquireFailed, seq[1].typ, "TryAcquire on a held key")
	require.Equal(t, took, seq[1].wait)
	require.ErrorIs(t, seq[1].err, pglock.ErrNotAcquired)
	require.Equal(t, pglock.EventAcquireFailed, seq[2].typ, "Acquire on a held key")
	require.ErrorIs(t, seq[2].err, pglock.ErrNotAcquired)
	require.Equal(t, took, seq[2].wait, "Wait(0): one attempt")
	require.Equal(t, pglock.EventAcquireFailed, seq[3].typ, "WithLock without fn")
	require.ErrorIs(t, seq[3].err, pglock.ErrInvalidArgument)
	require.Zero(t, seq[3].wait)
	require.Equal(t, pglock.EventAcquireFailed, seq[4].typ, "Acquire of an empty key")
	require.ErrorIs(t, seq[4].err, pglock.ErrInvalidKey)
	require.Equal(t, seen{pglock.EventAcquired, took, took, nil}, seq[5], "WithLock")
	require.Equal(t, pglock.EventReleased, got[len(got)-1].Type)
	var types []pglock.EventType
	for _, e := range got {
		types = append(types, e.Type)
	}
	require.Equal(t, types, second, "the second handler got every event, in order")
}
