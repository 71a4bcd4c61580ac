package pglock_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/testkit"
	"github.com/pgfence/pglock/pglocktest"
)

// perRunLocker is the usual gocron distributed locker: a lock per run, released when
// the run ends. settled is called when a tick is over: skipped, or its lock released.
type perRunLocker struct {
	c       *pglock.Client
	settled func()
}

func (p *perRunLocker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	l, err := p.c.TryAcquire(ctx, key)
	if err != nil {
		p.settled()
		return nil, err
	}
	return perRunLock{l: l, settled: p.settled}, nil
}

type perRunLock struct {
	l       *pglock.Lock
	settled func()
}

func (p perRunLock) Unlock(ctx context.Context) error {
	defer p.settled()
	return p.l.Release(ctx)
}

// settling returns fn calling settled when it returns.
func settling(fn func(context.Context) error, settled func()) func(context.Context) error {
	return func(ctx context.Context) error {
		defer settled()
		return fn(ctx)
	}
}

// gocron's splay case (gocron issue #841): three schedulers fire the same job 5 ms apart,
// and the job takes 1 ms. A lock per run is free again by the time the next instance's
// tick comes, so that instance runs the same tick again; a sticky lease is not. Each
// tick is fired once the previous instance's tick is over, so that the case does not
// depend on how busy the machine is.
func TestGocronSplayRunsEachTickOnceWithStickyLeases(t *testing.T) {
	t.Parallel()
	const ticks = 50
	store := pglock.NewPostgresStore(pglocktest.Postgres(t))

	// Each variant returns one instance's scheduler options and task for job name; its
	// ticks call settled when they are over.
	type setup func(t *testing.T, c *pglock.Client, name string, fn func(context.Context) error, settled func()) ([]gocron.SchedulerOption, gocron.Task)
	variants := []struct {
		name  string
		setup setup
		runs  int // of 3*ticks ticks
	}{
		{"PerRunLocker", func(t *testing.T, c *pglock.Client, name string, fn func(context.Context) error, settled func()) ([]gocron.SchedulerOption, gocron.Task) {
			return []gocron.SchedulerOption{gocron.WithDistributedLocker(&perRunLocker{c: c, settled: settled})}, gocron.NewTask(fn)
		}, 3 * ticks},
		{"OnOneInstance", func(t *testing.T, c *pglock.Client, name string, fn func(context.Context) error, settled func()) ([]gocron.SchedulerOption, gocron.Task) {
			job, err := c.Job(name, settling(fn, settled), pglock.OnOneInstance())
			require.NoError(t, err)
			return nil, job.Task()
		}, ticks},
		{"GocronLocker", func(t *testing.T, c *pglock.Client, name string, fn func(context.Context) error, settled func()) ([]gocron.SchedulerOption, gocron.Task) {
			locker, err := c.GocronLocker()
			require.NoError(t, err)
			return []gocron.SchedulerOption{gocron.WithDistributedLocker(locker)}, gocron.NewTask(settling(fn, settled))
		}, ticks},
		{"GocronElector", func(t *testing.T, c *pglock.Client, name string, fn func(context.Context) error, settled func()) ([]gocron.SchedulerOption, gocron.Task) {
			elector, err := c.GocronElector(name)
			require.NoError(t, err)
			return []gocron.SchedulerOption{gocron.WithDistributedElector(elector)}, gocron.NewTask(settling(fn, settled))
		}, ticks},
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			name := "splay-" + v.name
			var settled atomic.Int32
			runs := make([]atomic.Int32, 3)
			var jobs []gocron.Job
			for i := range runs {
				c := newClient(t, store, quiet, pglock.WithEventHandler(func(ev pglock.Event) {
					if ev.Type == pglock.EventJobSkipped {
						settled.Add(1)
					}
				}))
				fn := func(ctx context.Context) error {
					runs[i].Add(1)
					select { // the job's work: 1 ms
					case <-time.After(time.Millisecond):
						return nil
					case <-ctx.Done():
						return context.Cause(ctx)
					}
				}
				opts, task := v.setup(t, c, name, fn, func() { settled.Add(1) })
				// No singleton mode: no tick here overlaps another on its scheduler.
				job, err := newScheduler(t, opts...).NewJob(gocron.DurationJob(time.Hour), task, gocron.WithName(name))
				require.NoError(t, err)
				jobs = append(jobs, job)
			}

			fire := time.NewTicker(5 * time.Millisecond) // the schedulers' splay
			defer fire.Stop()
			for i := range 3 * ticks {
				<-fire.C
				require.NoError(t, jobs[i%3].RunNow())
				require.Eventually(t, func() bool { return settled.Load() == int32(i+1) }, 10*time.Second, time.Millisecond,
					"tick %d is not over", i)
			}

			perInstance := []int32{runs[0].Load(), runs[1].Load(), runs[2].Load()}
			total := perInstance[0] + perInstance[1] + perInstance[2]
			t.Logf("%d ticks on each of 3 instances, 5 ms apart: %d runs %v", ticks, total, perInstance)
			require.EqualValues(t, v.runs, total)
			if v.runs == ticks {
				require.ElementsMatch(t, []int32{ticks, 0, 0}, perInstance, "one instance runs every tick")
			}
		})
	}
}

func TestGocronLockerKeepsItsLeaseBetweenRuns(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pglocktest.Postgres(t)
	store := pglock.NewPostgresStore(pool)
	var logsA, logsB testkit.LogBuffer
	var eventsA eventLog
	clockA := pglocktest.NewManualClock(time.Now())
	a := newClient(t, store, pglock.WithClock(clockA), pglock.WithLogger(newLogger(&logsA)), pglock.WithEventHandler(eventsA.record))
	t.Cleanup(func() { clockA.Advance(time.Second) }) // a failed test's Close does not wait on it
	b := newClient(t, store, pglock.WithLogger(newLogger(&logsB)))
	lockerA, err := a.GocronLocker(pglock.TTL(10 * time.Second))
	require.NoError(t, err)
	lockerB, err := b.GocronLocker()
	require.NoError(t, err)

	first, err := lockerA.Lock(ctx, "invoice-export")
	require.NoError(t, err)
	_, err = lockerB.Lock(ctx, "invoice-export")
	require.ErrorIs(t, err, pglock.ErrNotAcquired)
	cancelled, cancel := context.WithCancel(ctx)
	cancel() // gocron passes its job's ctx, cancelled at its shutdown
	require.NoError(t, first.Unlock(cancelled))
	_, err = lockerB.Lock(ctx, "invoice-export")
	require.ErrorIs(t, err, pglock.ErrNotAcquired, "Unlock keeps the lease")

	second, err := lockerA.Lock(cancelled, "invoice-export") // the lease is held: no store call
	require.NoError(t, err)
	require.NoError(t, second.Unlock(ctx))
	require.NoError(t, second.Unlock(ctx))
	require.Equal(t, 1, logLines(&logsA, "pglock: job runs on this instance", "invoice-export"))
	require.Equal(t, 1, logLines(&logsA, "pglock: acquired lock", "invoice-export:owner"))
	require.Equal(t, 2, logLines(&logsB, "pglock: skipped job: it runs on another instance", "invoice-export"))
	requireEvents(t, &eventsA, 2, pglock.EventJobRan, "invoice-export", "")
	var ttl time.Duration
	require.NoError(t, pool.QueryRow(ctx, "SELECT expires_at - clock_timestamp() FROM pglock.locks WHERE key = 'invoice-export:owner'").Scan(&ttl))
	require.Greater(t, ttl, 5*time.Second, "the locker's TTL option")

	clockA.Advance(time.Second)
	require.NoError(t, a.Close(ctx))
	_, err = lockerA.Lock(ctx, "invoice-export")
	require.ErrorIs(t, err, pglock.ErrClosed)
	third, err := lockerB.Lock(ctx, "invoice-export") // handed back: at once, not after the ttl
	require.NoError(t, err)
	require.NoError(t, third.Unlock(ctx))
}

func TestGocronElectorLeadsUntilClose(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	store := pglock.NewPostgresStore(pglocktest.Postgres(t))
	var logs testkit.LogBuffer
	var events eventLog
	clockA := pglocktest.NewManualClock(time.Now())
	a := newClient(t, store, pglock.WithClock(clockA), pglock.WithLogger(newLogger(&logs)))
	t.Cleanup(func() { clockA.Advance(time.Second) }) // a failed test's Close does not wait on it
	b := newClient(t, store, pglock.WithLogger(newLogger(&logs)), pglock.WithEventHandler(events.record))
	electorA, err := a.GocronElector("shop:scheduler")
	require.NoError(t, err)
	electorB, err := b.GocronElector("shop:scheduler")
	require.NoError(t, err)

	// Every job of A's scheduler asks at its first tick, at once: one takes the lease,
	// the others wait for it rather than lose to it.
	leading := make(chan error, 5)
	for range cap(leading) {
		go func() { leading <- electorA.IsLeader(ctx) }()
	}
	for range cap(leading) {
		require.NoError(t, receive(t, leading))
	}
	for i := range 3 {
		require.NoError(t, electorA.IsLeader(ctx), "tick %d", i)
		require.ErrorIs(t, electorB.IsLeader(ctx), pglock.ErrNotAcquired, "tick %d", i)
	}
	require.Equal(t, 1, logLines(&logs, "pglock: job runs on this instance", "shop:scheduler"))
	require.Equal(t, 3, logLines(&logs, "pglock: skipped job: it runs on another instance", "shop:scheduler"))
	requireEvents(t, &events, 3, pglock.EventJobSkipped, "shop:scheduler", pglock.SkipOtherInstance)

	clockA.Advance(time.Second)
	require.NoError(t, a.Close(ctx))
	require.ErrorIs(t, electorA.IsLeader(ctx), pglock.ErrClosed)
	// Whatever IsLeader let run was no Task's: it may still run, so the lease is left to
	// expire rather than handed back.
	require.ErrorIs(t, electorB.IsLeader(ctx), pglock.ErrNotAcquired)
	require.Equal(t, 1, logLines(&logs, "pglock: gocron elector lease left to expire: runs of tasks other than its Task's may go on", "shop:scheduler"))
}

// gocron's Shutdown gives up on a run after its stop timeout; the elector cannot know
// when a plain task's run ends, so Close does not hand the lease back while it may go
// on: another instance leads only once the lease has expired on the database clock.
func TestGocronElectorLeavesItsLeaseToExpireWhileAPlainRunMayGoOn(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pglocktest.Postgres(t)
	store := pglock.NewPostgresStore(pool)
	var logs testkit.LogBuffer
	// A renews when the test moves its clock; its lease ends when the test says.
	const ttl = time.Minute
	clockA := pglocktest.NewManualClock(time.Now())
	a, err := pglock.NewWithStore(store, pglock.WithLogger(newLogger(&logs)), pglock.WithClock(clockA))
	require.NoError(t, err)
	b := newClient(t, store, quiet)
	electorA, err := a.GocronElector("shop:feed", pglock.TTL(ttl))
	require.NoError(t, err)
	electorB, err := b.GocronElector("shop:feed", pglock.TTL(ttl))
	require.NoError(t, err)

	sched, err := gocron.NewScheduler(gocron.WithDistributedElector(electorA), gocron.WithStopTimeout(50*time.Millisecond))
	require.NoError(t, err)
	sched.Start()
	running, finish := make(chan struct{}, 1), make(chan struct{})
	ended := make(chan struct{})
	job, err := sched.NewJob(gocron.DurationJob(time.Hour), gocron.NewTask(func() {
		defer close(ended)
		running <- struct{}{}
		<-finish // a long run that knows nothing of contexts
	}), gocron.WithName("feed"))
	require.NoError(t, err)
	t.Cleanup(func() { close(finish); <-ended })
	require.NoError(t, job.RunNow())
	receive(t, running)

	require.ErrorIs(t, sched.Shutdown(), gocron.ErrStopJobsTimedOut, "gocron gives up on the run")
	require.NoError(t, a.Close(ctx))
	require.ErrorIs(t, electorB.IsLeader(ctx), pglock.ErrNotAcquired, "not handed back while the run may go on")
	require.Equal(t, 1, logLines(&logs, "pglock: gocron elector lease left to expire: runs of tasks other than its Task's may go on", "shop:feed"))
	expires := expiresAt(t, pool, "shop:feed")
	clockA.Advance(ttl) // past every renewal the lease would have had
	require.Equal(t, expires, expiresAt(t, pool, "shop:feed"), "the closed client renewed the lease")
	require.ErrorIs(t, electorB.IsLeader(ctx), pglock.ErrNotAcquired, "not handed back while the run may go on")
	pglock.EndLease(t, pool, "shop:feed")
	require.NoError(t, electorB.IsLeader(ctx), "B leads once the lease ended")
}

// A run of the elector's Task has the lease's token to fence with, is cancelled by
// Close with ErrClosed, and Close hands the lease back only after it returned: the next
// leader starts at once, never beside it.
func TestGocronElectorTaskRunsAreFencedAndWaitedFor(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pglocktest.Postgres(t)
	store := pglock.NewPostgresStore(pool)
	a, err := pglock.NewWithStore(store, quiet)
	require.NoError(t, err)
	b := newClient(t, store, quiet)
	electorA, err := a.GocronElector("shop:feed")
	require.NoError(t, err)
	electorB, err := b.GocronElector("shop:feed")
	require.NoError(t, err)

	// The run has returned by Shutdown: its stop timeout only has to outlast gocron's own
	// bookkeeping, which can take over 50 ms on a loaded machine.
	sched, err := gocron.NewScheduler(gocron.WithDistributedElector(electorA), gocron.WithStopTimeout(5*time.Second))
	require.NoError(t, err)
	sched.Start()
	tokens := make(chan int64, 1)
	var cause error
	returned := make(chan struct{})
	job, err := sched.NewJob(gocron.DurationJob(time.Hour), electorA.Task(func(ctx context.Context) error {
		defer close(returned)
		if l, ok := pglock.FromContext(ctx); ok {
			tokens <- l.Token()
		} else {
			tokens <- 0
		}
		<-ctx.Done()
		cause = context.Cause(ctx)
		return cause
	}), gocron.WithName("feed"))
	require.NoError(t, err)
	require.NoError(t, job.RunNow())
	token := receive(t, tokens)
	var leaseToken int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT fencing_token FROM pglock.locks WHERE key = 'shop:feed'").Scan(&leaseToken))
	require.Equal(t, leaseToken, token, "the run fences with the lease's token")
	require.ErrorIs(t, electorB.IsLeader(ctx), pglock.ErrNotAcquired)

	require.NoError(t, a.Close(ctx))
	select {
	case <-returned:
	default:
		t.Fatal("Close returned before the run")
	}
	require.ErrorIs(t, cause, pglock.ErrClosed)
	require.NoError(t, electorB.IsLeader(ctx), "handed back after the run: B leads at once")
	require.NoError(t, sched.Shutdown())
}

// JobOptions registers a job in gocron's singleton mode: gocron refuses an overlap
// inside one process before pglock makes a store call for it.
func TestJobOptionsLetGocronRefuseAnOverlapInOneProcess(t *testing.T) {
	t.Parallel()
	var events eventLog
	c := newClient(t, pglock.NewPostgresStore(pglocktest.Postgres(t)), quiet, pglock.WithEventHandler(events.record))
	running, finish := make(chan struct{}, 3), make(chan struct{})
	job, err := c.Job("reports:weekly", func(ctx context.Context) error {
		running <- struct{}{}
		await(t, finish)
		return nil
	}, pglock.OnOneInstance(), pglock.WithoutOverlapping())
	require.NoError(t, err)
	gj, err := newScheduler(t).NewJob(gocron.DurationJob(time.Hour), job.Task(), pglock.GocronOptions("weekly-report")...)
	require.NoError(t, err)
	require.Equal(t, "weekly-report", gj.Name())

	require.NoError(t, gj.RunNow())
	receive(t, running)
	require.NoError(t, gj.RunNow())
	require.NoError(t, gj.RunNow())
	// Without singleton mode, gocron would call Run at once, and pglock would skip the
	// tick after a store call.
	require.Never(t, func() bool {
		return len(running) > 0 || events.count(pglock.EventJobSkipped, "reports:weekly", pglock.SkipRunInProgress) > 0
	}, 100*time.Millisecond, 5*time.Millisecond)
	close(finish)
	requireEvents(t, &events, 1, pglock.EventJobRan, "reports:weekly", "")
}
