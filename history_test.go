package pglock_test

import (
	"context"
	"errors"
	"io/fs"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/testkit"
	"github.com/pgfence/pglock/pglocktest"
)

// dbNow is the database's clock_timestamp().
func dbNow(t *testing.T, pool *pgxpool.Pool) time.Time {
	t.Helper()
	var now time.Time
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT clock_timestamp()").Scan(&now))
	return now
}

// historyClient is an instance named name on pool, closed when the test ends.
func historyClient(t *testing.T, pool *pgxpool.Pool, name string, opts ...pglock.ClientOption) *pglock.Client {
	t.Helper()
	return newClient(t, pglock.NewPostgresStore(pool), append([]pglock.ClientOption{quiet, pglock.WithInstanceName(name)}, opts...)...)
}

// runRows counts the rows of pglock.job_runs, as the migrating role sees them.
func runRows(t *testing.T, pool *pgxpool.Pool, job string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT count(*) FROM pglock.job_runs WHERE job = $1", job).Scan(&n))
	return n
}

// A run ends as ok, error, panicked or lost: each is recorded with where it ran, the
// token of the lock it ran under, its times on the database clock and its error,
// truncated to 1000 characters; EventJobRan says the same.
func TestJobRunHistoryRecordsEveryOutcome(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pglocktest.Postgres(t)
	job := t.Name()
	longErr := strings.Repeat("é", 1500) // 1500 characters, 3000 bytes
	var events eventLog
	c, err := pglock.New(pool, quiet, pglock.WithInstanceName("worker-1"), pglock.WithEventHandler(events.record))
	require.NoError(t, err)

	var mu sync.Mutex
	var tokens []int64
	outcome := make(chan pglock.Outcome, 1)
	// At 300 ms, a run's first acquisition was answered past its ttl under load, and at
	// 1 s a renewal had 0.57 s; 5 s leaves a loaded machine seconds for both. The lost
	// run waits ttl/3 for its next renewal.
	const runTTL = 5 * time.Second
	j, err := c.Job(job, func(ctx context.Context) error {
		l, _ := pglock.FromContext(ctx)
		mu.Lock()
		tokens = append(tokens, l.Token())
		mu.Unlock()
		// 50 ms of database time, so the recorded duration has a floor.
		if _, err := pool.Exec(ctx, "SELECT pg_sleep(0.05)"); err != nil {
			return err
		}
		switch <-outcome {
		case pglock.OutcomeError:
			return errors.New(longErr)
		case pglock.OutcomePanicked:
			panic("inventory feed returned garbage")
		case pglock.OutcomeLost:
			// Another party breaks the run lock; the next renewal finds it gone.
			_, err := pool.Exec(ctx, "UPDATE pglock.locks SET expires_at = clock_timestamp() WHERE key = $1", job)
			if err != nil {
				return err
			}
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Second):
				return errors.New("the run's ctx was not cancelled within 10s of its lock's loss")
			}
		}
		return nil
	}, pglock.WithoutOverlapping(), pglock.TTL(runTTL))
	require.NoError(t, err)

	before := dbNow(t, pool)
	outcome <- pglock.OutcomeOK
	require.NoError(t, j.Run(ctx))
	outcome <- pglock.OutcomeError
	require.EqualError(t, j.Run(ctx), longErr)
	outcome <- pglock.OutcomePanicked
	func() {
		defer func() { require.Equal(t, "inventory feed returned garbage", recover(), "the panic goes on up") }()
		_ = j.Run(ctx)
	}()
	outcome <- pglock.OutcomeLost
	require.ErrorIs(t, j.Run(ctx), pglock.ErrLockLost)
	require.NoError(t, c.Close(ctx)) // writes what is pending
	after := dbNow(t, pool)          // each run was recorded before this

	runs, err := c.JobRuns(ctx, job, 10)
	require.NoError(t, err)
	require.Len(t, runs, 4)
	want := []pglock.Outcome{pglock.OutcomeLost, pglock.OutcomePanicked, pglock.OutcomeError, pglock.OutcomeOK}
	// A run's times are the database's clock when its record's statement began, less
	// how long before its send the run ended (the client's clock): late by the time the
	// statement took to start, tens of ms under load.
	slack := 100 * time.Millisecond
	for i, r := range runs {
		require.Equal(t, want[i], r.Outcome, "newest first")
		require.Equal(t, job, r.Job)
		require.Equal(t, "worker-1", r.Instance)
		require.True(t, strings.HasPrefix(r.Owner, "worker-1/"), r.Owner)
		require.Equal(t, tokens[3-i], r.Token)
		require.WithinRange(t, r.Started, before.Add(-slack), after.Add(slack))
		require.WithinRange(t, r.Ended, r.Started.Add(50*time.Millisecond), after.Add(slack))
		if i > 0 {
			require.True(t, r.Ended.Before(runs[i-1].Started.Add(slack)), "one run after the other")
		}
	}
	require.Empty(t, runs[3].Error)
	require.Equal(t, 1000, utf8.RuneCountInString(runs[2].Error))
	require.Equal(t, longErr[:2000], runs[2].Error, "the first 1000 characters")
	require.Equal(t, "inventory feed returned garbage", runs[1].Error)
	require.Contains(t, runs[0].Error, "lost")

	var ran []pglock.Event
	for _, ev := range events.all() {
		if ev.Type == pglock.EventJobRan {
			ran = append(ran, ev)
		}
	}
	require.Len(t, ran, 4)
	for i, ev := range ran {
		require.Equal(t, want[3-i], ev.Outcome)
		require.Equal(t, tokens[i], ev.Token)
		require.GreaterOrEqual(t, ev.Duration, 50*time.Millisecond)
		require.InDelta(t, runs[3-i].Ended.Sub(runs[3-i].Started), ev.Duration, float64(time.Millisecond),
			"the duration recorded is the event's")
	}
}

// Skipped ticks are counters per job, instance and reason, not a row per skip.
func TestJobRunHistoryCountsSkips(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pglocktest.Postgres(t)
	job := t.Name()
	fn := func(context.Context) error { return nil }
	owner := historyClient(t, pool, "owner")
	other := historyClient(t, pool, "other")
	jo, err := owner.Job(job, fn, pglock.OnOneInstance())
	require.NoError(t, err)
	jx, err := other.Job(job, fn, pglock.OnOneInstance())
	require.NoError(t, err)

	require.NoError(t, jo.Run(ctx))
	for range 7 {
		require.NoError(t, jx.Run(ctx)) // skipped: the lease is owner's
	}
	require.NoError(t, jo.Run(ctx))
	start := dbNow(t, pool) // after the skips
	require.NoError(t, other.Close(ctx))
	require.NoError(t, owner.Close(ctx))

	var rows int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pglock.job_skips").Scan(&rows))
	require.Equal(t, 1, rows, "one counter for 7 skips")
	jobs, err := owner.JobStatuses(ctx)
	require.NoError(t, err)
	require.Len(t, jobs, 1)
	s := jobs[0]
	require.Equal(t, job, s.Job)
	require.Len(t, s.Skips, 1)
	require.Equal(t, "other", s.Skips[0].Instance)
	require.Equal(t, pglock.SkipOtherInstance, s.Skips[0].Reason)
	require.EqualValues(t, 7, s.Skips[0].Count)
	// The last skip's time, moved onto the database's clock at the flush: later than it
	// was by up to the flush statement's own latency.
	require.WithinRange(t, s.Skips[0].Last, start.Add(-time.Minute), start.Add(time.Second))
	require.NotNil(t, s.LastRun)
	require.Equal(t, "owner", s.LastRun.Instance)
	require.Equal(t, pglock.OutcomeOK, s.LastRun.Outcome)
	require.Nil(t, s.LastFailure)

	// Counts add up across flushes and clients of one instance.
	again := historyClient(t, pool, "other")
	jx, err = again.Job(job, fn, pglock.OnOneInstance())
	require.NoError(t, err)
	owner2 := historyClient(t, pool, "owner")
	_, err = owner2.TryAcquire(ctx, job+":owner", pglock.TTL(time.Minute)) // the lease, held elsewhere
	require.NoError(t, err)
	for range 3 {
		require.NoError(t, jx.Run(ctx))
	}
	require.NoError(t, again.Close(ctx))
	jobs, err = again.JobStatuses(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 10, jobs[0].Skips[0].Count)
}

// A run in progress skips the next tick with SkipRunInProgress; Jobs says what
// failed last even when the last run did not fail.
func TestJobRunHistoryLastFailureAndRunInProgress(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pglocktest.Postgres(t)
	c := historyClient(t, pool, "solo")
	fail := errors.New("warehouse API: 503")
	var err error
	var mu sync.Mutex
	result := fail
	entered, release := make(chan struct{}, 1), make(chan struct{})
	var j *pglock.Job
	j, err = c.Job(t.Name(), func(ctx context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		if result == nil {
			entered <- struct{}{}
			<-release
		}
		return result
	}, pglock.WithoutOverlapping())
	require.NoError(t, err)
	require.ErrorIs(t, j.Run(ctx), fail)
	mu.Lock()
	result = nil
	mu.Unlock()
	done := make(chan error, 1)
	go func() { done <- j.Run(ctx) }()
	<-entered
	require.NoError(t, j.Run(ctx), "skipped: a run is in progress") // mu is the first run's: this one never enters fn
	close(release)
	require.NoError(t, <-done)
	require.NoError(t, c.Close(ctx))

	jobs, err := c.JobStatuses(ctx)
	require.NoError(t, err)
	require.Len(t, jobs, 1)
	require.Equal(t, pglock.OutcomeOK, jobs[0].LastRun.Outcome)
	require.Equal(t, pglock.OutcomeError, jobs[0].LastFailure.Outcome)
	require.Equal(t, "warehouse API: 503", jobs[0].LastFailure.Error)
	require.True(t, jobs[0].LastFailure.Ended.Before(jobs[0].LastRun.Started.Add(20*time.Millisecond))) // the clocks' slack
	require.Equal(t, []pglock.JobSkips{{Instance: "solo", Reason: pglock.SkipRunInProgress, Count: 1,
		Last: jobs[0].Skips[0].Last}}, jobs[0].Skips)
}

// The recording function deletes a job's runs older than the retention as it records
// others: nobody has to prune the history.
func TestJobRunHistoryRetentionPrunesOldRuns(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pglocktest.Postgres(t)
	job, other := t.Name(), t.Name()+":other"
	c := historyClient(t, pool, "i", pglock.RunHistory(24*time.Hour))
	j, err := c.Job(job, func(context.Context) error { return nil }, pglock.WithoutOverlapping())
	require.NoError(t, err)
	o, err := c.Job(other, func(context.Context) error { return nil }, pglock.WithoutOverlapping())
	require.NoError(t, err)
	require.NoError(t, j.Run(ctx))
	require.NoError(t, o.Run(ctx))
	require.NoError(t, c.Close(ctx))
	// Two days pass, for these runs.
	_, err = pool.Exec(ctx, `UPDATE pglock.job_runs
		SET started_at = started_at - interval '2 days', ended_at = ended_at - interval '2 days'`)
	require.NoError(t, err)

	c = historyClient(t, pool, "i", pglock.RunHistory(24*time.Hour))
	j, err = c.Job(job, func(context.Context) error { return nil }, pglock.WithoutOverlapping())
	require.NoError(t, err)
	for range 16 { // one of 16 records prunes
		require.NoError(t, j.Run(ctx))
	}
	require.NoError(t, c.Close(ctx))
	runs, err := c.JobRuns(ctx, job, 1000)
	require.NoError(t, err)
	require.Len(t, runs, 16, "the old run is gone")
	for _, r := range runs {
		require.WithinDuration(t, dbNow(t, pool), r.Ended, time.Hour)
	}
	require.Equal(t, 1, runRows(t, pool, other), "another job's runs are pruned by its own records")
}

// Close writes the runs and skips still queued; a client whose Close's ctx has ended
// does not wait for them.
func TestJobRunHistoryCloseFlushesPendingRecords(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pglocktest.Postgres(t)
	job := t.Name()
	c := historyClient(t, pool, "i")
	// WithoutOverlapping alone: no lease for Close to keep a second after the last run.
	j, err := c.Job(job, func(context.Context) error { return nil }, pglock.WithoutOverlapping())
	require.NoError(t, err)
	// The writer is held up by a table lock, so that the runs are still pending when
	// Close comes: it must wait for them, not drop them.
	blocker, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = blocker.Rollback(context.WithoutCancel(ctx)) }() // on a failure too, or the pool never closes
	_, err = blocker.Exec(ctx, "LOCK TABLE pglock.job_runs IN EXCLUSIVE MODE")
	require.NoError(t, err)
	const n = 50
	for range n {
		require.NoError(t, j.Run(ctx))
	}
	closed := make(chan error, 1)
	go func() { closed <- c.Close(ctx) }()
	require.Never(t, func() bool { return len(closed) > 0 }, 200*time.Millisecond, 10*time.Millisecond,
		"Close waits for the pending runs")
	require.NoError(t, blocker.Rollback(ctx))
	require.NoError(t, <-closed)
	require.Equal(t, n, runRows(t, pool, job))

	gone, err := pglock.New(pool, quiet)
	require.NoError(t, err)
	g, err := gone.Job(job+":gone", func(context.Context) error { return nil }, pglock.OnOneInstance())
	require.NoError(t, err)
	for range n {
		require.NoError(t, g.Run(ctx))
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, gone.Close(cancelled), context.Canceled) // returns at once; the writer stops (goleak checks)
}

// RunHistory(0) records nothing; reading still works.
func TestJobRunHistoryOff(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pglocktest.Postgres(t)
	job := t.Name()
	a := historyClient(t, pool, "a", pglock.RunHistory(0))
	b := historyClient(t, pool, "b", pglock.RunHistory(0))
	ja, err := a.Job(job, func(context.Context) error { return nil }, pglock.OnOneInstance())
	require.NoError(t, err)
	jb, err := b.Job(job, func(context.Context) error { return nil }, pglock.OnOneInstance())
	require.NoError(t, err)
	require.NoError(t, ja.Run(ctx))
	require.NoError(t, jb.Run(ctx)) // skipped
	require.NoError(t, a.Close(ctx))
	require.NoError(t, b.Close(ctx))
	require.Zero(t, runRows(t, pool, job))
	var skips int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pglock.job_skips").Scan(&skips))
	require.Zero(t, skips)
	runs, err := a.JobRuns(ctx, job, 10)
	require.NoError(t, err)
	require.Empty(t, runs)
	jobs, err := a.JobStatuses(ctx)
	require.NoError(t, err)
	require.Len(t, jobs, 1, "the registry is not the history: the job is listed, without runs")
	require.Nil(t, jobs[0].LastRun)
	require.Empty(t, jobs[0].Skips)
	require.Len(t, jobs[0].Registrations, 2)
}

// A run whose record fails (here, a schema without the history) still succeeds; the
// failure is logged at warn.
func TestJobRunHistoryFailureToRecordNeverFailsTheRun(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pglocktest.Postgres(t)
	down, err := fs.ReadFile(pglock.Migrations(), "000008_job_runs.down.sql")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, string(down))
	require.NoError(t, err)
	var logs testkit.LogBuffer
	c := newClient(t, pglock.NewPostgresStore(pool), pglock.WithLogger(newLogger(&logs)))
	j, err := c.Job(t.Name(), func(context.Context) error { return nil }, pglock.WithoutOverlapping())
	require.NoError(t, err)
	require.NoError(t, j.Run(ctx))
	require.NoError(t, c.Close(ctx))
	require.Equal(t, 1, logLines(&logs, "pglock: job run not recorded", t.Name()), logs.String())
	require.Contains(t, logs.String(), "level=WARN")
	require.Contains(t, logs.String(), "run pglock.Migrate")
	_, err = c.JobRuns(ctx, t.Name(), 1)
	require.ErrorContains(t, err, "run pglock.Migrate")
}

// A gocron locker's runs are recorded too: ok, or lost when the lease was lost.
func TestGocronLockerRunHistory(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pglocktest.Postgres(t)
	c := historyClient(t, pool, "cron-1")
	locker, err := c.GocronLocker()
	require.NoError(t, err)
	name := t.Name()
	l, err := locker.Lock(ctx, name)
	require.NoError(t, err)
	require.NoError(t, l.Unlock(ctx))
	require.NoError(t, c.Close(ctx))
	runs, err := c.JobRuns(ctx, name, 5)
	require.NoError(t, err)
	require.Len(t, runs, 1)
	require.Equal(t, pglock.OutcomeOK, runs[0].Outcome)
	require.Equal(t, "cron-1", runs[0].Instance)
	require.Positive(t, runs[0].Token)
}

// The memory store keeps the history in memory, on its own clock.
func TestJobRunHistoryInMemory(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	clock := pglocktest.NewManualClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	store := pglock.NewMemoryStore(clock)
	a := newClient(t, store, pglock.WithClock(clock), pglock.WithInstanceName("a"))
	b := newClient(t, store, pglock.WithClock(clock), pglock.WithInstanceName("b"))
	fn := func(context.Context) error { return errors.New("boom") }
	ja, err := a.Job("mem:job", fn, pglock.OnOneInstance())
	require.NoError(t, err)
	jb, err := b.Job("mem:job", fn, pglock.OnOneInstance())
	require.NoError(t, err)
	require.Error(t, ja.Run(ctx))
	require.NoError(t, jb.Run(ctx))
	require.NoError(t, jb.Run(ctx))
	clock.Advance(2 * time.Second) // a's lease is kept for a second after its run
	require.NoError(t, a.Close(ctx))
	require.NoError(t, b.Close(ctx))
	runs, err := a.JobRuns(ctx, "mem:job", 10)
	require.NoError(t, err)
	require.Len(t, runs, 1)
	require.Equal(t, pglock.OutcomeError, runs[0].Outcome)
	require.Equal(t, "boom", runs[0].Error)
	require.WithinDuration(t, clock.Now(), runs[0].Ended, 3*time.Second) // written at Close, after the Advance
	jobs, err := b.JobStatuses(ctx)
	require.NoError(t, err)
	require.Len(t, jobs, 1)
	require.Equal(t, runs[0], *jobs[0].LastFailure)
	require.Equal(t, []pglock.JobSkips{{Instance: "b", Reason: pglock.SkipOtherInstance, Count: 2, Last: jobs[0].Skips[0].Last}},
		jobs[0].Skips)
}

func TestJobRunHistoryBadInput(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	store := pglock.NewMemoryStore(nil)
	c := newClient(t, store)
	for _, tc := range []struct {
		name  string
		job   string
		limit int
		want  error
		text  string
	}{
		{"empty job", "", 10, pglock.ErrInvalidKey, "pglock: invalid key: empty"},
		{"job not UTF-8", "job\xff", 10, pglock.ErrInvalidKey, "not valid UTF-8"},
		{"job with NUL", "job\x00", 10, pglock.ErrInvalidKey, "NUL"},
		{"job too long", strings.Repeat("k", pglock.MaxKeyLength+1), 10, pglock.ErrInvalidKey, "the most is 500"},
		{"limit 0", "job", 0, pglock.ErrInvalidArgument, "pglock: invalid argument: JobRuns: limit 0: want 1 to 1000"},
		{"limit negative", "job", -1, pglock.ErrInvalidArgument, "limit -1"},
		{"limit over 1000", "job", 1001, pglock.ErrInvalidArgument, "limit 1001"},
	} {
		t.Run("JobRuns/"+tc.name, func(t *testing.T) {
			runs, err := c.JobRuns(ctx, tc.job, tc.limit)
			require.ErrorIs(t, err, tc.want)
			require.ErrorContains(t, err, tc.text)
			require.True(t, strings.HasPrefix(err.Error(), "pglock: "), err.Error())
			require.Nil(t, runs)
		})
	}

	for _, tc := range []struct {
		name      string
		retention time.Duration
		text      string
	}{
		{"negative", -time.Hour, "RunHistory: -1h0m0s: want 0 (off) or 1s to 87600h0m0s"},
		{"under a second", 999 * time.Millisecond, "RunHistory: 999ms"},
		{"over 10 years", 87601 * time.Hour, "RunHistory: 87601h0m0s"},
	} {
		t.Run("RunHistory/"+tc.name, func(t *testing.T) {
			c, err := pglock.NewWithStore(store, pglock.RunHistory(tc.retention))
			require.ErrorIs(t, err, pglock.ErrInvalidArgument)
			require.ErrorContains(t, err, "pglock: invalid argument: NewWithStore: "+tc.text)
			require.Nil(t, c)
		})
	}
}

// Through database/sql (lib/pq, pgx's stdlib), the history records and reads the same.
func TestJobRunHistoryThroughDatabaseSQL(t *testing.T) {
	t.Parallel()
	for _, driver := range []string{"postgres", "pgx"} {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			dbURL := pglocktest.PostgresURL(t)
			store := pglock.NewSQLStore(openSQL(t, driver, dbURL))
			a := newClient(t, store, quiet, pglock.WithInstanceName("a"))
			b := newClient(t, store, quiet, pglock.WithInstanceName("b"))
			fn := func(context.Context) error { return errors.New("nope") }
			ja, err := a.Job("sql:job", fn, pglock.OnOneInstance())
			require.NoError(t, err)
			jb, err := b.Job("sql:job", fn, pglock.OnOneInstance())
			require.NoError(t, err)
			require.Error(t, ja.Run(ctx))
			require.NoError(t, jb.Run(ctx))
			require.NoError(t, b.Close(ctx))
			require.NoError(t, a.Close(ctx))
			runs, err := a.JobRuns(ctx, "sql:job", 5)
			require.NoError(t, err)
			require.Len(t, runs, 1)
			require.Equal(t, "nope", runs[0].Error)
			jobs, err := a.JobStatuses(ctx)
			require.NoError(t, err)
			require.Len(t, jobs, 1)
			require.Equal(t, runs[0], *jobs[0].LastFailure)
			require.EqualValues(t, 1, jobs[0].Skips[0].Count)
		})
	}
}
