//go:build unix

package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/failover"
	"github.com/pgfence/pglock/pglocktest"
)

// The failover tests run on a primary and a streaming standby of their own
// (internal/failover), which take a few seconds to start: they are skipped unless
// PGLOCK_FAILOVER=1, as .ci/failover sets. They run in parallel, each on its pair: most
// of their time is spent waiting, on servers starting and on ttls.

// failoverPair starts a pair in mode and migrates it through its multi-host URL; the
// standby has the schema when it returns.
func failoverPair(t testing.TB, mode failover.Mode) *failover.Pair {
	t.Helper()
	p := failover.Start(t, mode)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	require.NoError(t, pglock.Migrate(ctx, p.URL()))
	waitStandbyReplayed(t, p)
	return p
}

// failoverClient is a client on a pool of its own on the pair's multi-host URL, closed
// when the test ends.
func failoverClient(t *testing.T, p *failover.Pair, instance string, opts ...pglock.ClientOption) *pglock.Client {
	t.Helper()
	c, _ := failoverClientPool(t, p, instance, opts...)
	return c
}

// failoverClientPool is failoverClient, with the client's pool.
func failoverClientPool(t *testing.T, p *failover.Pair, instance string, opts ...pglock.ClientOption) (*pglock.Client, *pgxpool.Pool) {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), p.URL())
	require.NoError(t, err)
	c, err := pglock.New(pool, append([]pglock.ClientOption{pglock.WithInstanceName(instance)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Close(ctx) // a lock lost in a failover is no error here
		pool.Close()
	})
	return c, pool
}

// waitStandbyReplayed waits until the standby has replayed everything the primary
// wrote so far.
func waitStandbyReplayed(t testing.TB, p *failover.Pair) {
	t.Helper()
	var lsn string
	queryURL(t, p.PrimaryURL(), "SELECT pg_current_wal_lsn()::text", []any{&lsn})
	require.Eventually(t, func() bool {
		var ok bool
		queryURL(t, p.StandbyURL(), "SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", []any{&ok}, lsn)
		return ok
	}, 30*time.Second, 10*time.Millisecond)
}

// queryURL runs one query that returns one row on a connection of its own.
func queryURL(t testing.TB, url, sql string, dest []any, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(context.WithoutCancel(ctx))
	require.NoError(t, conn.QueryRow(ctx, sql, args...).Scan(dest...))
}

// TestFailoverSynchronousKeepsWhatIsHeld: with synchronous replication, what a client
// holds across the primary's death and the standby's promotion stays held, with its
// token: a lock, the leadership of an election and a job's lease (OnOneInstance). The
// client reaches the new primary through the multi-host URL and renews them there, and
// the new primary's lock_held agrees; the other instance's candidate never leads, and
// every tick of the job runs at most once, on the holder, its writes fenced by the
// lease (a tick while its renewal is overdue in the failover is skipped).
func TestFailoverSynchronousKeepsWhatIsHeld(t *testing.T) {
	t.Parallel()
	p := failoverPair(t, failover.Synchronous)
	// Longer than a renewal's period (a third of it) plus the promotion plus a new
	// connection: a promotion beside .ci/failover's other packages took up to 3.2 s,
	// and a ttl of 3 s expired the lock before the new primary was up.
	const ttl = 8 * time.Second
	var events eventLog
	c, pool := failoverClientPool(t, p, "holder", pglock.TTL(ttl), pglock.WithEventHandler(events.record))
	other, otherPool := failoverClientPool(t, p, "other", pglock.TTL(ttl))
	ticks := newTicks(t, p)
	lock, err := c.TryAcquire(t.Context(), "failover:sync")
	require.NoError(t, err)
	leader := newTerms(t, c, "failover:sync:leader", ttl)
	term := leader.next(t)
	candidate := newTerms(t, other, "failover:sync:leader", ttl)
	jobs := []*tickJob{ticks.job(t, c, pool, "holder", ttl), ticks.job(t, other, otherPool, "other", ttl)}
	ticks.tick(t, jobs[0]) // the holder takes the job's lease (both ticking, either might)

	p.Failover()
	promoted := time.Now()

	// Renewed on the new primary: its expiry moves past what it was at the promotion.
	var before time.Time
	queryURL(t, p.PrimaryURL(), "SELECT expires_at FROM pglock.locks WHERE key = 'failover:sync'", []any{&before})
	require.Eventually(t, func() bool {
		var after time.Time
		queryURL(t, p.PrimaryURL(), "SELECT expires_at FROM pglock.locks WHERE key = 'failover:sync'", []any{&after})
		return after.After(before)
	}, 2*ttl, 20*time.Millisecond, "a renewal on the new primary")
	t.Logf("first renewal on the new primary %v after the promotion", time.Since(promoted).Round(time.Millisecond))

	// Held for longer than a ttl after the promotion: the renewals go on, and the job
	// ticks on its schedule.
	for time.Since(promoted) < ttl+time.Second {
		ticks.tick(t, jobs...)
		require.NoError(t, lock.Context().Err(), "the lock's context ended: %v", context.Cause(lock.Context()))
	}
	require.True(t, lock.Held())
	var held bool
	var owner string
	var token int64
	queryURL(t, p.PrimaryURL(), "SELECT pglock.lock_held('failover:sync', $1), owner, fencing_token FROM pglock.locks WHERE key = 'failover:sync'",
		[]any{&held, &owner, &token}, lock.Token())
	require.True(t, held, "lock_held on the new primary")
	require.Equal(t, lock.Owner(), owner)
	require.Equal(t, lock.Token(), token)
	require.NoError(t, lock.Release(t.Context()))

	// The leader leads on, with its token; the candidate never led.
	require.True(t, leader.e.IsLeader())
	info, err := leader.e.Leader(t.Context())
	require.NoError(t, err)
	require.Equal(t, term.Token(), info.Token)
	require.Equal(t, term.Owner(), info.Owner)
	leader.requireNoChange(t)
	candidate.requireNoChange(t)

	// Every tick ran at most once, on the holder, under the lease it took before the
	// failover. A tick while the holder's renewal was overdue (one sent to the dead
	// primary, or not yet answered by the new one) is skipped as in doubt
	// (SkipLeaseInDoubt), never run by the other instance; once the lease is renewed
	// on the new primary, every tick runs.
	ran := ticks.ran(t)
	require.Len(t, ran, ticks.n)
	skipped := 0
	for tick, by := range ran {
		if by == nil {
			skipped++
			continue
		}
		require.Equal(t, []string{"holder"}, by, "tick %d", tick)
	}
	for tick := ticks.n - 5; tick < ticks.n; tick++ {
		require.Equal(t, []string{"holder"}, ran[tick], "tick %d, a ttl after the promotion", tick)
	}
	events.awaitCount(t, pglock.EventJobSkipped, "failover:job", pglock.SkipLeaseInDoubt, skipped) // each skip the holder's, in doubt
	require.Equal(t, 1, jobs[0].tokens(), "one lease, one token")
	t.Logf("%d ticks, %d of them after the promotion, all on the holder; %d skipped in the failover", ticks.n, ticks.n-1, skipped)
}

// TestFailoverAsynchronousTokensGoOn: with asynchronous replication, a failover loses
// the last commits the old primary acknowledged, here an acquisition and the tokens
// issued before it (the standby stopped receiving WAL before them, as across a network
// partition). The next holder of the key on the new primary must still get a greater
// token than the lost holder's, so that the lost holder's late writes fail the fences.
// And the lost holder must hear of its loss as soon as its client reaches the new
// primary, not at its next renewal (a third of a long ttl later): in round 1 a call of
// its client fails while no server takes writes, and the client confirms its locks when
// a call (a read) succeeds again; in round 2 no call fails (the pool finds its
// connections dead before using them), and the client confirms its locks when it is
// granted a token of a later timeline.
func TestFailoverAsynchronousTokensGoOn(t *testing.T) {
	t.Parallel()
	p := failoverPair(t, failover.Asynchronous)
	// The lost holder's next renewal would come 10 s after its acquisition: far later
	// than it must hear of the loss.
	const ttl = 30 * time.Second
	const bound = time.Second
	lost, lostPool := failoverClientPool(t, p, "lost", pglock.TTL(ttl))
	next := failoverClient(t, p, "next", pglock.TTL(ttl))

	// Twice, the old primary rebuilt as the standby in between: failovers repeat.
	for round := 1; round <= 2; round++ {
		p.Detach()
		// Other keys' acquisitions in the window the standby misses: the old primary's
		// sequence runs ahead of what the standby has (it logs 32 values ahead).
		var issued int64
		queryURL(t, p.PrimaryURL(), "SELECT max(pglock.lock_acquire('failover:other:' || g, 'other', 60000)) FROM generate_series(1, 100) g", []any{&issued})
		lock, err := lost.TryAcquire(t.Context(), "failover:async")
		require.NoError(t, err)
		t.Logf("round %d: lost holder's token on the old primary: %d", round, lock.Token())

		p.KillPrimary()
		if round == 1 {
			// A call while no server takes writes: the client's connections are cut.
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			_, err := lost.TryAcquire(ctx, "failover:async:cut")
			cancel()
			require.Error(t, err, "no server takes writes")
		} else {
			// pgxpool pings a connection idle for a second before it hands it out, and
			// drops it when the server is gone: a client idle for that long reaches the
			// new primary without a failed call. Reset makes that so at once.
			lostPool.Reset()
		}
		p.Promote()
		promoted := time.Now()

		// The lost holder's client reaches the new primary: its first call there that
		// succeeds (tried again while it meets the dead primary's connections). In round
		// 1, a read; in round 2, an acquisition of another key, on timeline 3.
		reached := reach(t, func(ctx context.Context) error {
			if round == 1 {
				_, err := lost.Locks(ctx, "failover:async")
				return err
			}
			l, err := lost.TryAcquire(ctx, "failover:async:work")
			if err == nil {
				err = l.Release(ctx)
			}
			return err
		})
		t.Logf("round %d: the lost holder's client reached the new primary %v after the promotion", round, reached.Sub(promoted).Round(time.Millisecond))
		select {
		case <-lock.Context().Done():
		case <-time.After(time.Until(reached.Add(bound))):
			t.Fatalf("round %d: the lost holder's context did not end within %v of its client reaching the new primary (its next renewal is at ttl/3, %v)", round, bound, ttl/3)
		}
		t.Logf("round %d: lost holder's context ended %v after the promotion, %v after its client reached the new primary: %v", round,
			time.Since(promoted).Round(time.Millisecond), time.Since(reached).Round(time.Millisecond), context.Cause(lock.Context()))
		var lle *pglock.LockLostError
		require.True(t, errors.As(context.Cause(lock.Context()), &lle), "cause %v", context.Cause(lock.Context()))
		require.Equal(t, pglock.LostRefused, lle.Reason)
		require.ErrorIs(t, lock.Release(t.Context()), pglock.ErrLockLost)

		// The next holder: the key is free on the new primary, which never saw the lost
		// acquisition. Its pool may still hold a connection to the dead primary (used
		// less than a second ago, so not pinged): an Acquire whose first attempt meets it
		// returns that error, so it is tried again, as for the lost holder's client.
		var took *pglock.Lock
		reach(t, func(ctx context.Context) (err error) {
			took, err = next.Acquire(ctx, "failover:async")
			return err
		})
		t.Logf("round %d: next holder's token on the new primary: %d, %v after the promotion", round, took.Token(), time.Since(promoted).Round(time.Millisecond))
		require.Greater(t, took.Token(), lock.Token(), "round %d: the next holder's token", round)
		require.NoError(t, took.Release(t.Context()))
		p.Rebuild()
	}
}

// reach makes call until it succeeds (a client's first calls after a failover may
// meet connections to the dead primary), and returns when it did.
func reach(t *testing.T, call func(ctx context.Context) error) time.Time {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		err := call(ctx)
		cancel()
		if err == nil {
			return time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("no call succeeded on the new primary in 30 s: %v", err)
		}
		time.Sleep(10 * time.Millisecond) // the new primary comes up in real time
	}
}

// TestFailoverTokensStayUniqueAcrossKeys: the first acquisitions on a new timeline, at
// once on many keys, move the sequence up to the timeline's range one at a time: every
// token is above the range's floor, and no two are equal.
func TestFailoverTokensStayUniqueAcrossKeys(t *testing.T) {
	t.Parallel()
	p := failoverPair(t, failover.Synchronous)
	p.Failover()
	require.Equal(t, 2, p.Timeline())
	pool, err := pgxpool.New(t.Context(), p.URL())
	require.NoError(t, err)
	defer pool.Close()
	store := pglock.NewPostgresStore(pool)
	const n = 16
	tokens := make(chan int64, n)
	errs := make(chan error, n)
	for i := range n {
		go func() {
			token, ok, err := pglock.InternalStore(store).Acquire(t.Context(), fmt.Sprintf("failover:unique:%d", i), "o", time.Minute)
			if err == nil && !ok {
				err = fmt.Errorf("key %d: not acquired", i)
			}
			errs <- err
			tokens <- token
		}()
	}
	seen := map[int64]bool{}
	for range n {
		require.NoError(t, <-errs)
		token := <-tokens
		require.Greater(t, token, int64(1)<<40, "a token of timeline 2")
		require.False(t, seen[token], "token %d twice", token)
		seen[token] = true
	}
}

// TestFailoverAsynchronousLeaderAndJobMove: with asynchronous replication, the
// leadership of an election and a job's lease that one instance took after the standby
// stopped receiving WAL are lost in the failover. Exactly one leader results, with a
// greater token, and the instance that lost its term hears of it (OnLost, a refused
// renewal); the job moves or stays, and no tick's run is accepted twice: the lost
// lease's writes fail its fence (FenceHeld) on the new primary.
func TestFailoverAsynchronousLeaderAndJobMove(t *testing.T) {
	t.Parallel()
	p := failoverPair(t, failover.Asynchronous)
	const ttl = 3 * time.Second
	var events eventLog
	a, aPool := failoverClientPool(t, p, "a", pglock.TTL(ttl), pglock.WithEventHandler(events.record))
	b, bPool := failoverClientPool(t, p, "b", pglock.TTL(ttl), pglock.WithEventHandler(events.record))
	ticks := newTicks(t, p)
	p.Detach()

	aTerms := newTerms(t, a, "failover:leader", ttl)
	lostTerm := aTerms.next(t)
	bTerms := newTerms(t, b, "failover:leader", ttl)
	jobs := []*tickJob{ticks.job(t, a, aPool, "a", ttl), ticks.job(t, b, bPool, "b", ttl)}
	// a takes the job's lease: its tick alone, since with both ticking the first to land
	// takes it, which may be b.
	ticks.tick(t, jobs[0])
	require.Equal(t, 1, jobs[0].tokens())

	p.Failover()
	promoted := time.Now()
	// The job ticks on; a leader emerges on the new primary.
	var lostAt, bLeads time.Time
	var leader *pglock.Lock
	leaderOf := map[*pglock.Lock]string{}
	// Until a heard of its loss, a leader emerged, and then the job ran on one instance
	// at each of five ticks in a row. A tick may still run nowhere after the election
	// settled: the job's lease is renewed on a schedule of its own, and while its
	// renewal is overdue (one sent to the dead primary, retried), the holder skips the
	// tick as in doubt (SkipLeaseInDoubt) and the other instance finds the lease held.
	for settled := 0; lostAt.IsZero() || leader == nil || settled < 5; {
		before := !lostAt.IsZero() && leader != nil
		if !before {
			require.Less(t, time.Since(promoted), 3*ttl, "a has not heard of its loss, or no leader emerged")
		} else {
			require.Less(t, time.Since(promoted), 5*ttl, "the job did not run on one instance at five ticks in a row")
		}
		doubts := func() int { return events.count(pglock.EventJobSkipped, "failover:job", pglock.SkipLeaseInDoubt) }
		doubted, unrun := doubts(), jobs[0].unrun()+jobs[1].unrun()
		ticks.tick(t, jobs...)
		if before {
			if by := ticks.ran(t)[ticks.n-1]; len(by) == 1 {
				settled++
			} else {
				// Only the holder's doubt, a lost lease's refused write or a run's
				// error may leave a tick unrun, never a silent skip (the client hands
				// events over on a goroutine of its own).
				require.Eventually(t, func() bool { return doubts() > doubted || jobs[0].unrun()+jobs[1].unrun() > unrun },
					time.Second, 5*time.Millisecond, "tick %d ran on %v: not skipped in doubt, refused or failed", ticks.n-1, by)
				settled = 0
				t.Logf("tick %d ran on %v, %v after the promotion: skipped in doubt, refused or failed", ticks.n-1, by,
					time.Since(promoted).Round(time.Millisecond))
			}
		}
		select {
		case l := <-aTerms.lost:
			require.Equal(t, lostTerm, l)
			lostAt = time.Now()
			t.Logf("a's term ended %v after the promotion: %v", lostAt.Sub(promoted).Round(time.Millisecond), context.Cause(l.Context()))
		case l := <-aTerms.acquired:
			leader, leaderOf[l] = l, "a"
		case l := <-bTerms.acquired:
			leader, leaderOf[l] = l, "b"
			if bLeads.IsZero() {
				bLeads = time.Now()
			}
			t.Logf("b leads %v after the promotion, token %d", time.Since(promoted).Round(time.Millisecond), l.Token())
		default:
		}
	}
	var lle *pglock.LockLostError
	require.True(t, errors.As(context.Cause(lostTerm.Context()), &lle), "cause %v", context.Cause(lostTerm.Context()))
	// Refused: a renewal reached the new primary and found the term gone. Expired: the
	// kill and the promotion took the renewals' whole margin, as they may under load.
	// Either way a heard of it, in the bound below.
	require.Contains(t, []pglock.LostReason{pglock.LostRefused, pglock.LostExpired}, lle.Reason)
	// a's client makes no call of its own on the new primary before its next renewal:
	// that renewal, a third of the ttl after the last one, finds the term lost, or its
	// retry a tenth of the ttl later when it meets a connection to the dead primary.
	// Until then, both may lead: the overlap that asynchronous replication allows.
	require.Less(t, lostAt.Sub(promoted), ttl/3+ttl/10+time.Second)
	if !bLeads.IsZero() && bLeads.Before(lostAt) {
		t.Logf("a and b both led for %v", lostAt.Sub(bLeads).Round(time.Millisecond))
	}

	// Exactly one leader, with a greater token than the lost term's, as the new
	// primary says.
	require.NotNil(t, leader, "no leader after the failover")
	require.Greater(t, leader.Token(), lostTerm.Token())
	require.True(t, (leaderOf[leader] == "a") != (leaderOf[leader] == "b"))
	require.Equal(t, leaderOf[leader] == "a", aTerms.e.IsLeader())
	require.Equal(t, leaderOf[leader] == "b", bTerms.e.IsLeader())
	info, err := bTerms.e.Leader(t.Context())
	require.NoError(t, err)
	require.Equal(t, leader.Token(), info.Token)
	require.Equal(t, leader.Owner(), info.Owner)
	aTerms.requireNoChange(t)
	bTerms.requireNoChange(t)

	// No tick's run was accepted twice; the ticks after the failover ran on whichever
	// instance holds the lease on the new primary.
	ran := ticks.ran(t)
	once := 0
	for tick, by := range ran {
		require.LessOrEqual(t, len(by), 1, "tick %d ran on %v", tick, by)
		once += len(by)
	}
	for i, j := range jobs {
		j.mu.Lock()
		t.Logf("%s: ran under %d leases; %d of its runs' writes were refused by the fence", []string{"a", "b"}[i], len(j.seen), j.refused)
		j.mu.Unlock()
	}
	t.Logf("%d ticks, %d accepted; %d skipped in doubt", ticks.n, once,
		events.count(pglock.EventJobSkipped, "failover:job", pglock.SkipLeaseInDoubt))
}

// TestFailoverWaiterIsWoken: waiters parked in Acquire across a failover are woken by
// the releases on the new primary. Their client's clock stands still, so that they
// never poll: only a wake-up gets them the key. The failover is asynchronous, and the
// waiters marked their keys after the standby stopped receiving WAL: the holder's locks
// are on the new primary, the marks that make a release notify are not. The waiters'
// listener must reconnect to the new primary and LISTEN again, and then wake them to
// try and mark their keys again; their first calls there, on the dead primary's pooled
// connections, fail, and they must ride that out rather than return the error.
func TestFailoverWaiterIsWoken(t *testing.T) {
	t.Parallel()
	p := failoverPair(t, failover.Asynchronous)
	const ttl = 30 * time.Second
	const bound = time.Second // a waiter that cannot poll is woken or never acquires
	holder := failoverClient(t, p, "holder", pglock.TTL(ttl))
	frozen := pglocktest.NewManualClock(time.Now())
	waiter := failoverClient(t, p, "waiter", pglock.TTL(ttl), pglock.WithClock(frozen))
	keys := []string{"failover:wait:0", "failover:wait:1", "failover:wait:2"}
	held := map[string]*pglock.Lock{}
	for _, key := range keys {
		l, err := holder.TryAcquire(t.Context(), key)
		require.NoError(t, err)
		held[key] = l
	}
	waitStandbyReplayed(t, p) // the holder's locks are on the standby
	p.Detach()                // the marks are not

	type acquired struct {
		key string
		err error
		at  time.Time
	}
	got := make(chan acquired, len(keys))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	for _, key := range keys {
		go func() {
			l, err := waiter.Acquire(ctx, key)
			got <- acquired{key, err, time.Now()}
			if err == nil {
				_ = l.Release(context.WithoutCancel(ctx))
			}
		}()
	}
	marked := func(keys []string) func() bool {
		return func() bool {
			var n int
			queryURL(t, p.PrimaryURL(), "SELECT count(*) FROM pglock.locks WHERE key = ANY($1) AND wanted_at IS NOT NULL", []any{&n}, keys)
			return n == len(keys)
		}
	}
	require.Eventually(t, marked(keys), 10*time.Second, 5*time.Millisecond, "the waiters mark their keys")

	p.Failover()
	promoted := time.Now()
	// A release on the new primary at once: the listener, cut from the dead primary,
	// may not be back to hear it.
	queryURL(t, p.PrimaryURL(), "SELECT pglock.lock_release($1, $2)", []any{new(bool)}, keys[0], held[keys[0]].Owner())
	released := time.Now()
	select {
	case r := <-got:
		require.NoError(t, r.err, r.key)
		require.Equal(t, keys[0], r.key)
		t.Logf("%s: acquired %v after its release at the promotion", r.key, r.at.Sub(released).Round(time.Millisecond))
	case <-time.After(bound):
		t.Fatalf("%s: not acquired within %v of its release on the new primary", keys[0], bound)
	}

	require.Eventually(t, marked(keys[1:]), 10*time.Second, 5*time.Millisecond, "the waiters mark their keys on the new primary")
	t.Logf("the other waiters' keys marked again on the new primary %v after the promotion", time.Since(promoted).Round(time.Millisecond))
	reach(t, func(ctx context.Context) error { _, err := holder.Locks(ctx, "failover:wait:"); return err })
	for _, key := range keys[1:] {
		released := time.Now()
		require.NoError(t, held[key].Release(t.Context()))
		select {
		case r := <-got:
			require.NoError(t, r.err, r.key)
			require.Equal(t, key, r.key)
			t.Logf("%s: acquired %v after its release on the new primary", key, r.at.Sub(released).Round(time.Millisecond))
		case <-time.After(bound):
			t.Fatalf("%s: not acquired within %v of its release on the new primary", key, bound)
		}
	}
}

// terms follows an instance's part in an election: its terms as leader, each sent on
// acquired when it begins and on lost when it ends.
type terms struct {
	e        *pglock.Election
	acquired chan *pglock.Lock
	lost     chan *pglock.Lock
}

// newTerms has c campaign for key.
func newTerms(t *testing.T, c *pglock.Client, key string, ttl time.Duration) *terms {
	t.Helper()
	tm := &terms{acquired: make(chan *pglock.Lock, 16), lost: make(chan *pglock.Lock, 16)}
	e, err := c.Elect(key, pglock.LeaderCallbacks{
		OnAcquired: func(_ context.Context, l *pglock.Lock) error { tm.acquired <- l; return nil },
		OnLost:     func(l *pglock.Lock) { tm.lost <- l },
	}, pglock.TTL(ttl))
	require.NoError(t, err)
	tm.e = e
	return tm
}

// next waits for the instance's next term.
func (tm *terms) next(t *testing.T) *pglock.Lock {
	t.Helper()
	select {
	case l := <-tm.acquired:
		return l
	case <-time.After(30 * time.Second):
		t.Fatal("no term began within 30 s")
		return nil
	}
}

// requireNoChange checks that no term began or ended since the last look.
func (tm *terms) requireNoChange(t *testing.T) {
	t.Helper()
	select {
	case l := <-tm.acquired:
		t.Fatalf("a term began, token %d", l.Token())
	case l := <-tm.lost:
		t.Fatalf("a term ended, token %d", l.Token())
	default:
	}
}

// ticks is a table of a job's ticks: each run of the job adds itself to the row of the
// tick that fired it, with a write fenced by the lease it runs under (FenceHeld), so
// that a run whose lease the database does not hold writes nothing.
type ticks struct {
	p      *failover.Pair
	n      int          // ticks fired so far
	firing atomic.Int64 // the tick firing now
}

func newTicks(t *testing.T, p *failover.Pair) *ticks {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.PrimaryURL())
	require.NoError(t, err)
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, `CREATE TABLE failover_ticks (tick int PRIMARY KEY, ran text[] NOT NULL DEFAULT '{}');
		INSERT INTO failover_ticks (tick) SELECT generate_series(0, 999)`)
	require.NoError(t, err)
	waitStandbyReplayed(t, p)
	return &ticks{p: p}
}

// tickJob is an instance's job on the ticks (OnOneInstance).
type tickJob struct {
	job      *pglock.Job
	mu       sync.Mutex
	seen     map[int64]bool // the lease tokens it ran under
	refused  int            // runs whose fenced write the database refused
	failed   int            // ticks whose Run returned an error
	instance string
}

// job makes c's job on the ticks, which writes through pool as instance.
func (tk *ticks) job(t *testing.T, c *pglock.Client, pool *pgxpool.Pool, instance string, ttl time.Duration) *tickJob {
	t.Helper()
	j := &tickJob{seen: map[int64]bool{}, instance: instance}
	job, err := c.Job("failover:job", func(ctx context.Context) error {
		l, _ := pglock.FromContext(ctx)
		q, args, err := pglock.FenceHeld("UPDATE failover_ticks SET ran = ran || $1::text WHERE tick = $2", l.Key(), l.Token(), instance, tk.firing.Load())
		if err != nil {
			return err
		}
		j.mu.Lock()
		j.seen[l.Token()] = true
		j.mu.Unlock()
		for try := 1; ; try++ { // the first writes after a failover may meet the dead primary's connections
			tag, err := pool.Exec(ctx, q, args...)
			if err == nil {
				if tag.RowsAffected() == 0 {
					j.mu.Lock()
					j.refused++
					j.mu.Unlock()
				}
				return nil
			}
			if try == 3 {
				return err
			}
		}
	}, pglock.OnOneInstance(), pglock.TTL(ttl))
	require.NoError(t, err)
	j.job = job
	return j
}

// unrun returns how many of the job's runs failed or had their fenced write refused.
func (j *tickJob) unrun() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.refused + j.failed
}

// tokens returns how many lease tokens the job ran under.
func (j *tickJob) tokens() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.seen)
}

// tick fires the next tick on every instance at once, as their schedulers do, and
// waits for the runs; then the schedule's pause.
func (tk *ticks) tick(t *testing.T, jobs ...*tickJob) {
	t.Helper()
	tk.firing.Store(int64(tk.n))
	tk.n++
	var wg sync.WaitGroup
	for _, j := range jobs {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			if err := j.job.Run(ctx); err != nil {
				j.mu.Lock()
				j.failed++
				j.mu.Unlock()
				t.Logf("tick %d on %s: %v", tk.n-1, j.instance, err) // a tick may fail in the failover
			}
		})
	}
	wg.Wait()
	time.Sleep(100 * time.Millisecond) // the schedule: a tick every 100 ms
}

// ran returns, by tick fired, the instances whose runs the database accepted.
func (tk *ticks) ran(t *testing.T) [][]string {
	t.Helper()
	var rows []string
	queryURL(t, tk.p.PrimaryURL(), "SELECT array_agg(array_to_string(ran, ',') ORDER BY tick) FROM failover_ticks WHERE tick < $1",
		[]any{&rows}, tk.n)
	ran := make([][]string, len(rows))
	for i, r := range rows {
		if r != "" {
			ran[i] = strings.Split(r, ",")
		}
	}
	return ran
}
