package pglock_test

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/testkit"
	"github.com/pgfence/pglock/pglocktest"
)

// A tick whose take of the job's lease comes late must not run a tick that the lease's
// owner ran. The owner runs the tick and is paused (its clock stands still: it never
// renews); the other instance's tick began at the same moment, but its take waited
// for a busy pool until the owner's lease had expired on the database clock. Taken
// then, the lease would let it run the same tick a second time: the take has a third
// of the ttl, from the tick's start, to be answered, and the tick is skipped as in
// doubt. (A worker started a moment before, its pool still opening connections, is
// such an instance.)
func TestATickWhoseTakeComesLateDoesNotRunTheOwnersTickAgain(t *testing.T) {
	t.Parallel()
	url := pglocktest.PostgresURL(t)
	const key, ttl = "late:take", 300 * time.Millisecond
	var ran atomic.Int32
	tick := func(context.Context) error { ran.Add(1); return nil }

	paused := pglocktest.NewManualClock(time.Now())
	const ownerTTL = time.Minute // its lease ends when the test says
	owner := newPoolClient(t, pglocktest.Pool(t, url, 2), pglock.WithClock(paused), pglock.TTL(ownerTTL))
	t.Cleanup(func() { paused.Advance(ownerTTL) }) // before its Close: it finds its lease lost
	ownerJob, err := owner.Job(key, tick, pglock.OnOneInstance())
	require.NoError(t, err)

	pool, nextAcquire := watchedPool(t, url)
	clock := pglocktest.NewManualClock(time.Now())
	var events eventLog
	late := newPoolClient(t, pool, pglock.WithClock(clock), pglock.TTL(ttl), pglock.WithEventHandler(events.record))
	t.Cleanup(func() { clock.Advance(time.Second) }) // before its Close, should it hold the lease after a run
	lateJob, err := late.Job(key, tick, pglock.OnOneInstance())
	require.NoError(t, err)
	busy, err := pool.Acquire(t.Context())
	require.NoError(t, err)

	require.NoError(t, ownerJob.Run(t.Context()))
	waiting := nextAcquire()
	done := make(chan error, 1)
	go func() { done <- lateJob.Run(t.Context()) }()
	receive(t, waiting, "the take's wait for a connection")
	clock.Advance(ttl / 3)
	pglock.EndLease(t, pglocktest.Pool(t, url, 1), key+":owner") // the paused owner's lease
	busy.Release()
	require.NoError(t, receive(t, done, "the late tick"))

	require.Equal(t, int32(1), ran.Load(), "the late tick ran the owner's tick again")
	events.awaitCount(t, pglock.EventJobSkipped, key, pglock.SkipLeaseInDoubt, 1)
	holders, err := late.Locks(t.Context(), key+":owner")
	require.NoError(t, err)
	for _, h := range holders {
		require.False(t, h.Held, "the late take was granted and kept: %+v", h)
	}
}

// The owner's half of the same rule: an owner whose renewal is overdue (its link
// silent for half a ttl) skips the tick, as its lease may end before another
// instance's take of that tick, within its third of the ttl, finds it free.
func TestAnOwnerWhoseRenewalIsOverdueSkipsTheTick(t *testing.T) {
	t.Parallel()
	pool, proxy := proxiedPool(t, pglocktest.PostgresURL(t), 2)
	clock := pglock.TestClock{Clock: testkit.NewClock(time.Now())} // moves while a renewal round waits
	var events eventLog
	const key, ttl = "late:renewal", 10 * time.Second
	c := newClient(t, pglock.NewPostgresStore(pool), quiet, pglock.WithClock(clock), pglock.TTL(ttl),
		pglock.WithEventHandler(events.record))
	t.Cleanup(func() { clock.Advance(time.Second) }) // before Close: it keeps the lease a second after a run
	t.Cleanup(proxy.Restore)                         // and hands it back
	var ran atomic.Int32
	job, err := c.Job(key, func(context.Context) error { ran.Add(1); return nil }, pglock.OnOneInstance())
	require.NoError(t, err)
	require.NoError(t, job.Run(t.Context()))

	sent := proxy.BlackholeAfter(func(chunk []byte) bool { return bytes.Contains(chunk, []byte("lock_renew")) })
	renewed := make(chan struct{})
	go func() { defer close(renewed); clock.Advance(ttl / 3) }() // the renewal round waits for its answer
	receive(t, sent, "the renewal")
	clock.Move(ttl/2 - ttl/3) // half a ttl since the last confirmed renewal was sent
	require.NoError(t, job.Run(t.Context()))
	require.Equal(t, int32(1), ran.Load(), "an owner whose renewal was overdue ran the tick")
	events.awaitCount(t, pglock.EventJobSkipped, key, pglock.SkipLeaseInDoubt, 1)

	proxy.Restore() // the renewal is answered: the owner runs ticks again
	receive(t, renewed, "the renewal's answer")
	require.NoError(t, job.Run(t.Context()))
	require.Equal(t, int32(2), ran.Load(), "the renewed owner skipped the tick")
}
