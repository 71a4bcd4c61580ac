package pglock_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/tcpproxy"
	"github.com/pgfence/pglock/pglocktest"
)

// A client on a ManualClock counts its renewal's bound on that clock, as it counts its
// deadlines: a renewal that takes longer on the wire than the time left to the lock's
// deadline on the clock (a loaded machine, here a slow link) is answered, not cut short,
// as long as the clock has not reached the deadline.
func TestRenewalOnAManualClockIsBoundedOnThatClock(t *testing.T) {
	t.Parallel()
	// The lease is live on the database clock for the ttl, and the confirmed renewal
	// must reach it in that time: 3 s (at 1 s, a loaded machine's stall of a second
	// between the acquisition and the renewal would have it refused).
	const ttl = 3 * time.Second
	// After Advance(ttl/3), the deadline is 1.7 s away on the clock; every reply is held
	// longer than that on the wire.
	const slow = 2 * time.Second

	// setup returns a client on a ManualClock whose store goes through a proxy, holding
	// "k" for ttl, and the proxy.
	setup := func(t *testing.T) (*pglock.Client, *pglocktest.ManualClock, *pglock.Lock, *tcpproxy.Proxy) {
		t.Helper()
		url := pglocktest.PostgresURL(t)
		pool, proxy := proxiedPool(t, url, 1)
		clock := pglocktest.NewManualClock(time.Now())
		c := newClient(t, pglock.NewPostgresStore(pool), pglock.TTL(ttl), pglock.WithClock(clock), quiet)
		t.Cleanup(func() { clock.Advance(ttl) }) // a failed test's Close does not wait on it
		l, err := c.TryAcquire(t.Context(), "k")
		require.NoError(t, err)
		return c, clock, l, proxy
	}

	t.Run("ARefusedRenewalLosesTheLockAsRefused", func(t *testing.T) {
		t.Parallel()
		c, clock, l, proxy := setup(t)
		_, err := c.ForceRelease(t.Context(), "k")
		require.NoError(t, err)

		proxy.SetDelay(tcpproxy.ToClient, slow)
		clock.Advance(ttl / 3) // the renewal is sent, and refused
		proxy.SetDelay(tcpproxy.ToClient, 0)
		var lost *pglock.LockLostError
		require.ErrorAs(t, context.Cause(l.Context()), &lost, "the refused renewal did not lose the lock: %v", c.Health().Err)
		require.Equal(t, pglock.LostRefused, lost.Reason)
	})

	t.Run("AConfirmedRenewalIsNoFailure", func(t *testing.T) {
		t.Parallel()
		c, clock, l, proxy := setup(t)

		proxy.SetDelay(tcpproxy.ToClient, slow)
		clock.Advance(ttl / 3) // the renewal is sent, and confirmed
		proxy.SetDelay(tcpproxy.ToClient, 0)
		h := c.Health()
		require.NoError(t, h.Err)
		require.True(t, h.Ready)
		require.Equal(t, clock.Now(), h.LastRenewal, "answered at once on the clock, which did not move")
		require.True(t, l.Held())
	})
}
