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
	"github.com/pgfence/pglock/internal/testkit"
	"github.com/pgfence/pglock/pglocktest"
)

const feedKey = "inventory:warehouse-feed"

// term is one leadership term, as OnAcquired saw it.
type term struct {
	who  int
	lock *pglock.Lock
	ctx  context.Context
}

// feed is the tutorial's warehouse feed: OnAcquired "connects" (reports the term and
// returns, the connection living on ctx), OnLost "disconnects". It checks that OnLost
// never comes without an OnAcquired, nor while it runs.
type feed struct {
	t        testing.TB
	acquired chan term
	lost     chan term
	leading  []atomic.Bool
}

func newFeed(t testing.TB, instances int) *feed {
	return &feed{t: t, acquired: make(chan term, 1000), lost: make(chan term, 1000), leading: make([]atomic.Bool, instances)}
}

func (f *feed) leader(who int) pglock.LeaderCallbacks {
	var ctx context.Context
	return pglock.LeaderCallbacks{
		OnAcquired: func(c context.Context, l *pglock.Lock) error {
			if f.leading[who].Swap(true) {
				f.t.Errorf("instance %d: OnAcquired while it leads", who)
			}
			ctx = c
			f.acquired <- term{who, l, c}
			return nil
		},
		OnLost: func(l *pglock.Lock) {
			if !f.leading[who].Swap(false) {
				f.t.Errorf("instance %d: OnLost without OnAcquired", who)
			}
			if ctx.Err() == nil {
				f.t.Errorf("instance %d: OnLost before OnAcquired's ctx was cancelled", who)
			}
			f.lost <- term{who, l, ctx}
		},
	}
}

func TestElectionHasOneLeaderAndHandsOverAtClose(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := pglocktest.PostgresURL(t)
	f := newFeed(t, 3)
	clients := make([]*pglock.Client, 3)
	elections := make([]*pglock.Election, 3)
	logs := make([]testkit.LogBuffer, 3)
	events := make([]eventLog, 3)
	// The first leader's lease outlives every wait of the test, so that another instance
	// leading before the test ends can only be the hand-back, never the expiry, however
	// slow the machine. The others, on a ttl of 5 s, campaign every ttl/3; the one that
	// takes over must keep its lease through the checks after the hand-over, which at
	// 1 s a renewal answered late on a loaded machine could end.
	const leaderTTL, othersTTL = time.Minute, 5 * time.Second
	for i := range clients {
		ttl := othersTTL
		if i == 0 {
			ttl = leaderTTL
		}
		clients[i] = newPoolClient(t, pglocktest.Pool(t, url, 4), pglock.TTL(ttl),
			pglock.WithLogger(newLogger(&logs[i])), pglock.WithEventHandler(events[i].record))
	}
	var err error
	elections[0], err = clients[0].Elect(feedKey, f.leader(0)) // the first instance up leads
	require.NoError(t, err)
	first := receive(t, f.acquired, "leader")
	require.Equal(t, 0, first.who)
	for i := 1; i < 3; i++ {
		elections[i], err = clients[i].Elect(feedKey, f.leader(i))
		require.NoError(t, err)
	}

	// The others campaign at once and again ttl/3 later, and lose: one connection to the feed.
	require.Never(t, func() bool { return len(f.acquired) > 0 }, othersTTL/3+300*time.Millisecond, 20*time.Millisecond)
	require.True(t, elections[0].IsLeader())
	for i, e := range elections {
		h, err := e.Leader(ctx)
		require.NoError(t, err)
		require.Equal(t, leaseOf(first.lock, h), h)
		require.Positive(t, h.ExpiresIn)
		require.LessOrEqual(t, h.ExpiresIn, leaderTTL)
		require.Equal(t, i == 0, e.IsLeader())
	}
	require.Contains(t, logs[0].String(), `level=INFO msg="pglock: leading" key=inventory:warehouse-feed owner=`+first.lock.Owner())

	// Close hands the lease back: another instance leads long before the lease would
	// have expired (receive waits 10 s; the lease had a minute left).
	start := time.Now()
	require.NoError(t, clients[0].Close(ctx))
	require.Equal(t, 0, receive(t, f.lost, "OnLost").who, "OnLost ran before Close returned")
	second := receive(t, f.acquired, "new leader")
	handover := time.Since(start)
	t.Logf("handover at Close: %v", handover)
	require.Less(t, handover, leaderTTL/2)
	require.NotEqual(t, 0, second.who)
	require.Greater(t, second.lock.Token(), first.lock.Token())
	require.ErrorIs(t, context.Cause(first.ctx), pglock.ErrClosed)
	require.False(t, elections[0].IsLeader())
	require.True(t, elections[second.who].IsLeader())
	require.Contains(t, logs[0].String(), `level=INFO msg="pglock: stepped down" key=inventory:warehouse-feed token=`)
	require.Contains(t, logs[0].String(), `err="pglock: client closed"`)
	require.Equal(t, []string{"leadership acquired", "leadership lost: closed: ErrClosed"}, events[0].leadership())
	require.Eventually(t, func() bool { return len(events[second.who].leadership()) == 1 }, 2*time.Second, 5*time.Millisecond)
	require.Equal(t, []string{"leadership acquired"}, events[second.who].leadership())
	_, err = elections[0].Leader(ctx)
	require.ErrorIs(t, err, pglock.ErrClosed)
	require.NoError(t, elections[0].Resign(ctx), "resigning from an election its Close ended")
}

func TestPausedLeaderBelievesItLeadsUntilItsRenewalIsRefused(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := pglocktest.PostgresURL(t)
	f := newFeed(t, 3)
	paused := pglocktest.NewManualClock(time.Now())
	var logs testkit.LogBuffer
	var events eventLog
	const pausedTTL = 300 * time.Millisecond // the others may campaign before or after it ends
	a := newPoolClient(t, pglocktest.Pool(t, url, 4), pglock.TTL(pausedTTL), pglock.WithClock(paused),
		pglock.WithLogger(newLogger(&logs)), pglock.WithEventHandler(events.record))
	ea, err := a.Elect(feedKey, f.leader(0))
	require.NoError(t, err)
	old := receive(t, f.acquired, "leader")
	elections := []*pglock.Election{ea}
	for i := 1; i < 3; i++ {
		// The new leader must keep its lease to the end of the test: a ttl of 5 s, so that
		// a renewal answered late on a loaded machine does not end it (at 1 s, one had
		// 0.57 s). It takes over at its first campaign after the expiry, ttl/3 at most.
		c := newPoolClient(t, pglocktest.Pool(t, url, 4), pglock.TTL(5*time.Second))
		e, err := c.Elect(feedKey, f.leader(i))
		require.NoError(t, err)
		elections = append(elections, e)
	}

	// The lease expires on the database clock; the leader's clock stands still.
	newer := receive(t, f.acquired, "leader after the expiry")
	require.NotEqual(t, 0, newer.who)
	require.Greater(t, newer.lock.Token(), old.lock.Token())
	// The blind spot: both believe they lead. What the old one writes needs its token.
	require.True(t, ea.IsLeader())
	require.True(t, elections[newer.who].IsLeader())
	require.NoError(t, old.ctx.Err())
	h, err := ea.Leader(ctx)
	require.NoError(t, err)
	require.Equal(t, newer.lock.Owner(), h.Owner, "the store knows better")

	paused.Advance(pausedTTL / 3) // it wakes up: its renewal is refused
	lost := receive(t, f.lost, "OnLost")
	require.Equal(t, 0, lost.who)
	require.False(t, ea.IsLeader())
	var lockLost *pglock.LockLostError
	require.ErrorAs(t, context.Cause(old.ctx), &lockLost)
	require.Equal(t, pglock.LostRefused, lockLost.Reason)
	require.Eventually(t, func() bool { return len(events.leadership()) == 2 }, 2*time.Second, 5*time.Millisecond)
	require.Equal(t, []string{"leadership acquired", "leadership lost: lease-lost: refused"}, events.leadership())
	require.Regexp(t, `msg="pglock: stepped down" .*reason=lease-lost err=".* lost: refused"`, logs.String())
	require.True(t, elections[newer.who].IsLeader())
}

func TestFailingOnAcquiredStepsDownAndCampaignsAgain(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		fail func() error
		log  string
	}{
		{"Error", func() error { return errors.New("feed refused the connection") }, `err="pglock: OnAcquired: feed refused the connection"`},
		{"Panic", func() error { panic("feed client bug") }, `level=ERROR msg="pglock: leader callback panicked" key=inventory:warehouse-feed err="pglock: OnAcquired panicked: feed client bug" stack=`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			clock := pglocktest.NewManualClock(time.Now())
			var logs testkit.LogBuffer
			var events eventLog
			c := newPoolClient(t, pglocktest.Postgres(t), pglock.TTL(time.Second), pglock.WithClock(clock),
				pglock.WithLogger(newLogger(&logs)), pglock.WithEventHandler(events.record))
			acquired, lost := make(chan *pglock.Lock, 2), make(chan *pglock.Lock, 2)
			var calls atomic.Int32
			e, err := c.Elect(feedKey, pglock.LeaderCallbacks{
				OnAcquired: func(ctx context.Context, l *pglock.Lock) error {
					acquired <- l
					if calls.Add(1) == 1 {
						return tc.fail()
					}
					return nil
				},
				OnLost: func(l *pglock.Lock) { lost <- l },
			})
			require.NoError(t, err)
			first := receive(t, acquired, "OnAcquired")
			require.Same(t, first, receive(t, lost, "OnLost"))
			require.Eventually(t, func() bool { h, err := e.Leader(ctx); return err == nil && !h.Held }, 2*time.Second, 5*time.Millisecond,
				"the lease is handed back")
			require.Contains(t, logs.String(), tc.log)
			require.Contains(t, logs.String(), `msg="pglock: stepped down" key=inventory:warehouse-feed token=`)
			require.Contains(t, logs.String(), `reason=on-acquired-failed`)

			// It campaigns again after ttl/3 on its clock, which stands still until told.
			require.Never(t, func() bool { return len(acquired) > 0 }, 200*time.Millisecond, 10*time.Millisecond)
			clock.Advance(time.Second / 3)
			second := receive(t, acquired, "OnAcquired again")
			require.Greater(t, second.Token(), first.Token())
			require.Eventually(t, e.IsLeader, 2*time.Second, 5*time.Millisecond)
			require.NoError(t, e.Resign(ctx))
			require.Same(t, second, receive(t, lost, "OnLost again"))
			require.Eventually(t, func() bool { return len(events.leadership()) == 4 }, 2*time.Second, 5*time.Millisecond)
			require.Equal(t, []string{"leadership acquired", "leadership lost: on-acquired-failed",
				"leadership acquired", "leadership lost: resigned: ErrResigned"}, events.leadership())
		})
	}
}

// TestRapidHandoversNeverOverlap hands the leadership over 200 times between three
// instances, by Resign and a new Elect, and checks that no two leaders ever overlap:
// each OnAcquired finds the others' OnLost done and its own lease the live one in
// the table, and the callbacks of each election alternate.
func TestRapidHandoversNeverOverlap(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := pglocktest.PostgresURL(t)
	check := pglocktest.Pool(t, url, 4)
	const instances, handovers = 3, 200
	var leaders, terms atomic.Int32
	acquired := make(chan term, handovers+instances)
	leader := func(who int) pglock.LeaderCallbacks {
		var inTerm atomic.Bool
		var ctxs sync.Map // lock → OnAcquired's ctx
		return pglock.LeaderCallbacks{
			OnAcquired: func(c context.Context, l *pglock.Lock) error {
				if n := leaders.Add(1); n != 1 {
					t.Errorf("%d leaders at once", n)
				}
				if inTerm.Swap(true) {
					t.Errorf("instance %d: OnAcquired during its term", who)
				}
				var owner string
				err := check.QueryRow(context.WithoutCancel(c), `SELECT owner FROM pglock.locks
					WHERE key = $1 AND owner IS NOT NULL AND expires_at > clock_timestamp()`, feedKey).Scan(&owner)
				switch {
				case c.Err() != nil:
					// The term ended while the table was read (the test's last Resign): the
					// lease may have been handed back already, nothing to hold it against.
				case err != nil:
					t.Errorf("read the live lease: %v", err)
				case owner != l.Owner():
					t.Errorf("OnAcquired of %s, the table says %s", l.Owner(), owner)
				}
				ctxs.Store(l, c)
				acquired <- term{who, l, c}
				if terms.Add(1)%2 == 0 {
					<-c.Done() // half of the terms run in OnAcquired, half on its ctx
				}
				return nil
			},
			OnLost: func(l *pglock.Lock) {
				c, ok := ctxs.LoadAndDelete(l)
				if !ok || !inTerm.Swap(false) {
					t.Errorf("instance %d: OnLost without OnAcquired", who)
					return
				}
				if err := context.Cause(c.(context.Context)); !errors.Is(err, pglock.ErrResigned) && !errors.Is(err, pglock.ErrClosed) {
					t.Errorf("OnLost: OnAcquired's ctx: %v", err)
				}
				leaders.Add(-1)
			},
		}
	}
	clients := make([]*pglock.Client, instances)
	elections := make([]*pglock.Election, instances)
	for i := range clients {
		// Every term must end by its Resign, not by a renewal answered late on a loaded
		// machine, and its lease be live when OnAcquired reads the table: a ttl of 5 s.
		// The handovers do not wait for it: a Resign's release wakes the others.
		clients[i] = newPoolClient(t, pglocktest.Pool(t, url, 4), pglock.TTL(5*time.Second))
		var err error
		elections[i], err = clients[i].Elect(feedKey, leader(i))
		require.NoError(t, err)
	}
	start := time.Now()
	var lastToken int64
	for range handovers {
		tm := receive(t, acquired, "leader")
		require.Greater(t, tm.lock.Token(), lastToken)
		lastToken = tm.lock.Token()
		require.NoError(t, elections[tm.who].Resign(ctx))
		var err error
		elections[tm.who], err = clients[tm.who].Elect(feedKey, leader(tm.who))
		require.NoError(t, err, "Resign frees the key for a new Elect")
	}
	t.Logf("%d handovers in %v", handovers, time.Since(start))
	for _, e := range elections {
		require.NoError(t, e.Resign(ctx))
	}
	require.Zero(t, leaders.Load())
}

func TestResignHandsOverAndWaitsBoundedByCtx(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := pglocktest.PostgresURL(t)
	// A's lease must last until its Resign hands it back (its OnLost checks it is held):
	// a ttl of 5 s, so that a renewal answered late on a loaded machine does not end it.
	// B keeps 1 s: it polls every ttl/3, should the release's wake-up not reach it, well
	// within the 2.5 s it is given to take over (a second was too tight on a loaded
	// machine; A's lease, had it not been handed back, would last 3.3 s at least).
	a := newPoolClient(t, pglocktest.Pool(t, url, 4), pglock.TTL(5*time.Second))
	b := newPoolClient(t, pglocktest.Pool(t, url, 4), pglock.TTL(time.Second))
	finish := make(chan struct{})
	var order []string
	var mu sync.Mutex
	note := func(s string) {
		mu.Lock()
		order = append(order, s)
		mu.Unlock()
	}
	started := make(chan struct{})
	ea, err := a.Elect(feedKey, pglock.LeaderCallbacks{
		OnAcquired: func(ctx context.Context, l *pglock.Lock) error {
			close(started)
			<-ctx.Done()
			note("a: ctx cancelled: " + context.Cause(ctx).Error())
			<-finish // slow to let go of the feed
			note("a: OnAcquired returned")
			return nil
		},
		OnLost: func(l *pglock.Lock) {
			if !l.Held() {
				t.Error("OnLost ran after the lease was handed back")
			}
			note("a: OnLost")
		},
	})
	require.NoError(t, err)
	<-started
	tookOver := make(chan struct{})
	_, err = b.Elect(feedKey, pglock.LeaderCallbacks{OnAcquired: func(context.Context, *pglock.Lock) error {
		note("b: OnAcquired")
		close(tookOver)
		return nil
	}})
	require.NoError(t, err)

	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, ea.Resign(short), context.DeadlineExceeded, "Resign gives up waiting when its ctx ends")
	require.False(t, ea.IsLeader())
	close(finish)
	require.NoError(t, ea.Resign(ctx), "the step-down went on")
	select {
	case <-tookOver:
	case <-time.After(2500 * time.Millisecond): // A's lease, last renewed at most ttl/3 ago, expires 3.3 s from now at the soonest
		t.Fatal("the resigned leader's lease was not taken over within 2.5 s: it was not handed back")
	}
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"a: ctx cancelled: pglock: resigned from the election", "a: OnAcquired returned", "a: OnLost", "b: OnAcquired"}, order)
	require.NoError(t, ea.Resign(ctx), "Resign twice")
}

func TestLeaderReadsTheHolderFromTheStore(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	clock := pglocktest.NewManualClock(time.Now())
	c := newClient(t, pglock.NewMemoryStore(clock), pglock.WithClock(clock), pglock.TTL(time.Minute), quiet)
	locks := make(chan *pglock.Lock, 1)
	e, err := c.Elect(feedKey, pglock.LeaderCallbacks{OnAcquired: func(_ context.Context, l *pglock.Lock) error {
		locks <- l
		return nil
	}})
	require.NoError(t, err)
	l := receive(t, locks, "OnAcquired")
	h, err := e.Leader(ctx)
	require.NoError(t, err)
	expires := clock.Now().Add(time.Minute)
	require.Equal(t, pglock.LockInfo{Key: feedKey, Owner: l.Owner(), Instance: instanceOf(l), Token: l.Token(), Held: true,
		ExpiresAt: expires, ExpiresIn: time.Minute}, h)
	clock.Advance(10 * time.Second)
	h, err = e.Leader(ctx)
	require.NoError(t, err)
	require.Equal(t, 50*time.Second, h.ExpiresIn)
	require.Equal(t, expires, h.ExpiresAt)
	require.NoError(t, e.Resign(ctx))
	h, err = e.Leader(ctx)
	require.NoError(t, err)
	require.Equal(t, pglock.LockInfo{Key: feedKey}, h, "nobody leads")
}

func TestLeaderBadCalls(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t)
	onAcquired := func(context.Context, *pglock.Lock) error { return nil }
	cases := []struct {
		name  string
		store *pglock.Store
		ctx   func(context.Context) context.Context
		want  error
	}{
		{"CancelledCtx", pglock.NewPostgresStore(pool), func(ctx context.Context) context.Context {
			ctx, cancel := context.WithCancel(ctx)
			cancel()
			return ctx
		}, context.Canceled},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newClient(t, tc.store, quiet)
			e, err := c.Elect("leader-bad-calls:"+tc.name, pglock.LeaderCallbacks{OnAcquired: onAcquired})
			require.NoError(t, err)
			ctx := t.Context()
			if tc.ctx != nil {
				ctx = tc.ctx(ctx)
			}
			_, err = e.Leader(ctx)
			require.ErrorIs(t, err, tc.want)
			require.True(t, strings.HasPrefix(err.Error(), "pglock: "), err.Error())
		})
	}
}

func TestElectBadInputGetsAClearErrorAndStartsNothing(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t)
	c := newPoolClient(t, pool)
	started := make(chan string, 10)
	onAcquired := func(_ context.Context, l *pglock.Lock) error {
		started <- l.Key()
		return nil
	}
	taken, err := c.Elect("taken", pglock.LeaderCallbacks{OnAcquired: onAcquired})
	require.NoError(t, err)
	require.Equal(t, "taken", receive(t, started, "OnAcquired"))
	closed, err := pglock.NewWithStore(pglock.NewPostgresStore(pool))
	require.NoError(t, err)
	require.NoError(t, closed.Close(t.Context()))

	valid := pglock.LeaderCallbacks{OnAcquired: onAcquired}
	cases := []struct {
		name   string
		client *pglock.Client
		key    string
		leader pglock.LeaderCallbacks
		opts   []pglock.Option
		want   error
	}{
		{"EmptyKey", c, "", valid, nil, pglock.ErrInvalidKey},
		{"KeyOver500Characters", c, strings.Repeat("é", pglock.MaxKeyLength+1), valid, nil, pglock.ErrInvalidKey},
		{"InvalidUTF8", c, "inv\xffalid", valid, nil, pglock.ErrInvalidKey},
		{"NULByte", c, "nul\x00key", valid, nil, pglock.ErrInvalidKey},
		{"NilOnAcquired", c, "free", pglock.LeaderCallbacks{OnLost: func(*pglock.Lock) {}}, nil, pglock.ErrInvalidArgument},
		{"TTLUnder1ms", c, "free", valid, []pglock.Option{pglock.TTL(time.Microsecond)}, pglock.ErrInvalidArgument},
		{"NegativeTTL", c, "free", valid, []pglock.Option{pglock.TTL(-time.Second)}, pglock.ErrInvalidArgument},
		{"TTLOverOneYear", c, "free", valid, []pglock.Option{pglock.TTL(pglock.MaxTTL + time.Millisecond)}, pglock.ErrInvalidArgument},
		{"NilOption", c, "free", valid, []pglock.Option{nil}, pglock.ErrInvalidArgument},
		{"KeyOfAnotherElection", c, "taken", valid, nil, pglock.ErrInvalidArgument},
		{"AfterClose", closed, "free", valid, nil, pglock.ErrClosed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e, err := tc.client.Elect(tc.key, tc.leader, tc.opts...)
			require.ErrorIs(t, err, tc.want)
			require.Nil(t, e)
			require.True(t, strings.HasPrefix(err.Error(), "pglock: "), err.Error())
		})
	}
	require.Never(t, func() bool { return len(started) > 0 }, 100*time.Millisecond, 10*time.Millisecond)
	require.Len(t, lockKeys(t, pool), 1, "only the valid election's lease is in the table")

	free, err := c.Elect("free", valid)
	require.NoError(t, err, "the failed calls registered nothing")
	require.Equal(t, "free", receive(t, started, "OnAcquired"))
	require.NoError(t, free.Resign(t.Context()))
	require.NoError(t, taken.Resign(t.Context()))
}

// A campaign is woken by the leader's release (NOTIFY), not by its next poll: the
// follower's clock stands still, so it never polls, and still leads at once when the
// leader resigns.
func TestResignWakesAFollowerThatNeverPolls(t *testing.T) {
	t.Parallel()
	url := pglocktest.PostgresURL(t)
	f := newFeed(t, 2)
	pool := pglocktest.Pool(t, url, 4)
	leader := newPoolClient(t, pool)
	follower := newPoolClient(t, pglocktest.Pool(t, url, 4), pglock.WithClock(pglocktest.NewManualClock(time.Now())))
	first, err := leader.Elect(feedKey, f.leader(0))
	require.NoError(t, err)
	require.Equal(t, 0, receive(t, f.acquired, "leader").who)
	_, err = follower.Elect(feedKey, f.leader(1))
	require.NoError(t, err)
	// The follower has lost its first campaign and marked the key wanted.
	require.Eventually(t, func() bool { return wanted(pool, feedKey) }, 5*time.Second, 5*time.Millisecond)

	require.NoError(t, first.Resign(t.Context()))
	require.Equal(t, 1, receive(t, f.acquired, "the follower leading after the leader's release").who)
}

// A service shutting down may still use every connection of its pool (requests in
// flight, a WithLock section's writes). Close's step-down must not wait behind them to
// hand the lease back: its renewals have stopped, so a hand-back queued behind the
// application lands after the lease expired, or much later, and the next leader waits
// for the expiry.
func TestCloseHandsTheLeaseBackWhileItsPoolIsBusy(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := pglocktest.PostgresURL(t)
	f := newFeed(t, 2)
	pool := pglocktest.Pool(t, url, 2)
	leader, err := pglock.New(pool, quiet, pglock.TTL(time.Minute)) // only a hand-back ends the lease in the test
	require.NoError(t, err)
	_, err = leader.Elect(feedKey, f.leader(0))
	require.NoError(t, err)
	require.Equal(t, 0, receive(t, f.acquired, "leader").who)
	followerPool := pglocktest.Pool(t, url, 4)
	_, err = newPoolClient(t, followerPool).Elect(feedKey, f.leader(1))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return wanted(followerPool, feedKey) }, 5*time.Second, 5*time.Millisecond)

	// The application takes every connection its pool will give.
	var busy []*pgxpool.Conn
	for {
		actx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		c, err := pool.Acquire(actx)
		cancel()
		if err != nil {
			break
		}
		busy = append(busy, c)
	}
	require.NotEmpty(t, busy)
	free := sync.OnceFunc(func() {
		for _, c := range busy {
			c.Release()
		}
	})
	t.Cleanup(free)

	closed := make(chan error, 1)
	start := time.Now()
	go func() { closed <- leader.Close(context.WithoutCancel(ctx)) }()
	select {
	case second := <-f.acquired:
		t.Logf("handover at Close, the pool busy: %v", time.Since(start))
		require.Equal(t, 1, second.who)
	case <-time.After(5 * time.Second):
		t.Errorf("no new leader within 5 s of Close while the closing client's pool was busy")
	}
	free()
	require.NoError(t, receive(t, closed, "Close's return"))
}
