package pglock_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/tcpproxy"
	"github.com/pgfence/pglock/pglocktest"
)

// slotRun is a run of a slotted job, as its fn saw it.
type slotRun struct {
	instance string
	slot     time.Time
	token    int64
}

// slotRuns records the runs of a job's fn on every instance.
type slotRuns struct {
	mu   sync.Mutex
	runs []slotRun
}

// fn returns the job function of instance: it records the run, then does what then
// says (nil: nothing).
func (r *slotRuns) fn(instance string, then func(ctx context.Context) error) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		l, _ := pglock.FromContext(ctx)
		slot, _ := pglock.SlotFromContext(ctx)
		r.mu.Lock()
		r.runs = append(r.runs, slotRun{instance: instance, slot: slot, token: l.Token()})
		r.mu.Unlock()
		if then != nil {
			return then(ctx)
		}
		return nil
	}
}

func (r *slotRuns) all() []slotRun {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]slotRun(nil), r.runs...)
}

// slots returns the slots run, in the order they ran.
func (r *slotRuns) slots() []time.Time {
	var out []time.Time
	for _, run := range r.all() {
		out = append(out, run.slot)
	}
	return out
}

// slotEvery is the schedule of the tests that name slots: a tick a second late on a
// loaded machine still names the slot it fired for (a tick may claim a slot up to half
// the gap, a second at most, before it comes).
const slotEvery = 2 * time.Second

// databaseNow reads the database's clock.
func databaseNow(t testing.TB, pool *pgxpool.Pool) time.Time {
	t.Helper()
	var now time.Time
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT clock_timestamp()").Scan(&now))
	return now
}

// awaitSlot waits, on the database's clock, until after the next multiple of every
// since the epoch, by after, and returns that slot.
func awaitSlot(t testing.TB, pool *pgxpool.Pool, every, after time.Duration) time.Time {
	t.Helper()
	now := databaseNow(t, pool)
	slot := now.Truncate(every).Add(every)
	time.Sleep(time.Until(now.Add(slot.Sub(now) + after))) // the database's time, on this machine's clock
	for !databaseTimeReached(t, pool, slot.Add(after)) {
		time.Sleep(time.Millisecond)
	}
	return slot
}

// Two instances whose timers for the same time fire 40% of the ttl apart (a rollout
// shifted them, or their clocks drift): today, with WithoutOverlapping, the first run
// ends and releases the run lock before the second tick, which runs the same tick
// again. A slot is claimed once.
func TestSlotRunsOnceWhenTimersFireFortyPercentOfTheTTLApart(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t)
	const ttl = time.Second
	const every = 3 * slotEvery // a round's three runs and 40% of the ttl, well within one slot on a loaded machine
	var runs slotRuns
	var jobs []*pglock.Job
	for _, name := range []string{"early", "late"} {
		c := newPoolClient(t, pool, pglock.WithInstanceName(name), pglock.TTL(ttl))
		j, err := c.Job("reports:hourly", runs.fn(name, nil), pglock.Every(every), pglock.WithoutOverlapping())
		require.NoError(t, err)
		jobs = append(jobs, j)
	}
	var events eventLog
	late := newPoolClient(t, pool, pglock.WithInstanceName("late-2"), pglock.TTL(ttl), pglock.WithEventHandler(events.record))
	lateJob, err := late.Job("reports:hourly", runs.fn("late-2", nil), pglock.Every(every), pglock.WithoutOverlapping())
	require.NoError(t, err)

	for range 2 {
		slot := awaitSlot(t, pool, every, 20*time.Millisecond)
		require.NoError(t, jobs[0].Run(t.Context()))
		time.Sleep(ttl * 4 / 10) // the other timer, 40% of the ttl later
		require.NoError(t, jobs[1].Run(t.Context()))
		require.NoError(t, lateJob.Run(t.Context()))
		require.Equal(t, slot, runs.slots()[len(runs.slots())-1])
	}
	require.Len(t, runs.all(), 2, "each slot runs once: %+v", runs.all())
	requireEvents(t, &events, 2, pglock.EventJobSkipped, "reports:hourly", pglock.SkipSlotClaimed)
}

// An owner paused past its lease (its clock stands still: it never renews, and
// believes its lease fresh) resumes after another instance took the lease and ran the
// slot. Today it runs the tick again under the lease it no longer holds; a slot's
// claim is on the database, which says no.
func TestSlotAnOwnerPausedPastItsLeaseDoesNotRunTheSlotAnotherRan(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t)
	const ttl = time.Minute // its lease ends when the test says (EndLease), not on a loaded machine's whim
	var runs slotRuns
	stopped := pglocktest.NewManualClock(time.Now())
	paused := newPoolClient(t, pool, pglock.WithInstanceName("paused"), pglock.TTL(ttl), pglock.WithClock(stopped))
	t.Cleanup(func() { stopped.Advance(2 * ttl) }) // before its Close: it finds its lease lost
	other := newPoolClient(t, pool, pglock.WithInstanceName("other"), pglock.TTL(ttl))
	opts := []pglock.JobOption{pglock.Every(slotEvery), pglock.OnOneInstance()}
	pausedJob, err := paused.Job("ledger:close", runs.fn("paused", nil), opts...)
	require.NoError(t, err)
	otherJob, err := other.Job("ledger:close", runs.fn("other", nil), opts...)
	require.NoError(t, err)

	first := awaitSlot(t, pool, slotEvery, 20*time.Millisecond)
	require.NoError(t, pausedJob.Run(t.Context())) // takes the lease, runs the first slot
	pglock.EndLease(t, pool, "ledger:close:owner") // never renewed: it has expired for the database
	second := awaitSlot(t, pool, slotEvery, 20*time.Millisecond)
	require.NoError(t, otherJob.Run(t.Context())) // takes the lease over, runs the second slot
	require.NoError(t, pausedJob.Run(t.Context()))
	require.Equal(t, []slotRun{{"paused", first, runs.all()[0].token}, {"other", second, runs.all()[1].token}}, runs.all())
}

// Every instance is down over a slot. With CatchUp, the first tick back runs it once
// (and its own); without, it is counted missed and never runs.
func TestSlotMissedWhileTheFleetWasDownRunsOnceOnReturnOnlyWithCatchUp(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		opts     []pglock.JobOption
		caughtUp bool
	}{
		{"WithCatchUp", []pglock.JobOption{pglock.Every(slotEvery), pglock.CatchUp(1)}, true},
		{"Without", []pglock.JobOption{pglock.Every(slotEvery)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := pglocktest.Postgres(t)
			var runs slotRuns
			var events eventLog
			before := newPoolClient(t, pool, pglock.WithInstanceName("before"))
			j, err := before.Job("exports:nightly", runs.fn("before", nil), tc.opts...)
			require.NoError(t, err)
			first := awaitSlot(t, pool, slotEvery, 20*time.Millisecond)
			require.NoError(t, j.Run(t.Context()))
			require.NoError(t, before.Close(t.Context())) // the fleet goes down

			// The instances that come back are made while the fleet is down, not ticking
			// yet: made after the slot they come back at, on a loaded machine, their ticks
			// came more than half a gap late and claimed the next slot.
			var jobs []*pglock.Job
			for _, name := range []string{"back-1", "back-2"} {
				c := newPoolClient(t, pool, pglock.WithInstanceName(name), pglock.WithEventHandler(events.record))
				j, err := c.Job("exports:nightly", runs.fn(name, nil), tc.opts...)
				require.NoError(t, err)
				jobs = append(jobs, j)
			}
			missed := awaitSlot(t, pool, slotEvery, 20*time.Millisecond)
			back := awaitSlot(t, pool, slotEvery, 20*time.Millisecond)
			tickJobs(t, jobs...)
			want := []time.Time{first, back}
			if tc.caughtUp {
				want = []time.Time{first, missed, back}
			} else {
				requireEvents(t, &events, 1, pglock.EventJobSkipped, "exports:nightly", pglock.SkipSlotMissed)
			}
			require.Equal(t, want, runs.slots())
		})
	}
}

// An at-least-once slot whose first attempt's holder dies (its clock stands still: it
// never renews) is run again by another instance once the attempt's lock expires, with
// a greater token; the dead attempt's late fenced write is refused.
func TestSlotAtLeastOnceRunsAgainElsewhereWhenItsHolderDies(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pglocktest.Postgres(t)
	_, err := pool.Exec(ctx, `CREATE TABLE exports (id int PRIMARY KEY, attempt_token bigint NOT NULL DEFAULT 0, rows int)`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO exports (id, rows) VALUES (1, 0);
		CREATE TABLE export_log (slot timestamptz, token bigint, rows int)`)
	require.NoError(t, err)
	// write is the export's fenced writes: a row appended to its log and an update, with
	// the slot's lock (FenceHeld), then the update with its token in a column
	// (FenceUpdate). It returns how many rows they wrote.
	write := func(ctx context.Context, rows int) (int64, error) {
		ctx = context.WithoutCancel(ctx)
		l, _ := pglock.FromContext(ctx)
		slot, _ := pglock.SlotFromContext(ctx)
		var n int64
		for _, w := range []struct {
			q    string
			args []any
		}{
			{"INSERT INTO export_log (slot, token, rows) VALUES ($1, $2, $3)", []any{slot, l.Token(), rows}},
			{"UPDATE exports SET rows = $1 WHERE id = 1", []any{rows}},
		} {
			q, args, err := pglock.FenceHeld(w.q, l.Key(), l.Token(), w.args...)
			if err != nil {
				return n, err
			}
			tag, err := pool.Exec(ctx, q, args...)
			if err != nil {
				return n, err
			}
			n += tag.RowsAffected()
		}
		written, err := pglock.ExecFenced(ctx, pool, "UPDATE exports SET rows = $1 WHERE id = 1", "attempt_token", l.Token(), rows)
		return n + written, err
	}

	const ttl = 500 * time.Millisecond
	// Hourly: both attempts stand for the same slot unless the test straddles an hour.
	opts := []pglock.JobOption{pglock.Every(time.Hour), pglock.AtLeastOnce(3, 0)}
	var runs slotRuns
	stopped := pglocktest.NewManualClock(time.Now())
	dead := newPoolClient(t, pool, pglock.WithInstanceName("dead"), pglock.TTL(ttl), pglock.WithClock(stopped))
	resume := make(chan struct{})
	lateWrite := make(chan int64, 1)
	deadJob, err := dead.Job("exports:ledger", runs.fn("dead", func(ctx context.Context) error {
		<-resume
		n, err := write(ctx, 111)
		lateWrite <- n
		return err
	}), opts...)
	require.NoError(t, err)
	var events eventLog
	alive := newPoolClient(t, pool, pglock.WithInstanceName("alive"), pglock.TTL(ttl), pglock.WithEventHandler(events.record))
	retried := make(chan struct{})
	aliveJob, err := alive.Job("exports:ledger", runs.fn("alive", func(ctx context.Context) error {
		defer close(retried)
		n, err := write(ctx, 222)
		if err == nil && n != 3 {
			err = errors.New("the retry's fenced writes were refused")
		}
		return err
	}), opts...)
	require.NoError(t, err)
	var resumed sync.Once // a test that fails before it resumes the dead attempt lets it end, or Close would wait for it
	t.Cleanup(func() { resumed.Do(func() { close(resume) }) })

	deadRun := make(chan error, 1)
	go func() { deadRun <- deadJob.Run(ctx) }()
	require.Eventually(t, func() bool { return len(runs.all()) == 1 }, 10*time.Second, time.Millisecond)
	require.NoError(t, aliveJob.Run(ctx)) // finds the slot claimed; looks again when its attempt's lock expires
	receive(t, retried, "retry on the live instance")
	all := runs.all()
	require.Len(t, all, 2)
	require.Equal(t, all[0].slot, all[1].slot, "the same slot")
	require.Greater(t, all[1].token, all[0].token)

	resumed.Do(func() { close(resume) }) // the dead attempt's process runs again, and writes
	require.Zero(t, receive(t, lateWrite, "the dead attempt's write"), "a dead attempt's fenced write landed")
	var rows, logged int
	require.NoError(t, pool.QueryRow(ctx, "SELECT rows, (SELECT count(*) FROM export_log) FROM exports WHERE id = 1").Scan(&rows, &logged))
	require.Equal(t, 222, rows)
	require.Equal(t, 1, logged, "the log has the retry's row alone")
	stopped.Advance(time.Second)
	require.ErrorIs(t, receive(t, deadRun), pglock.ErrLockLost)
	requireEvents(t, &events, 1, pglock.EventJobSkipped, "exports:ledger", pglock.SkipSlotClaimed)
}

func TestSlotBadInputGetsAClearErrorAndRegistersNothing(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t)
	store := pglock.NewPostgresStore(pool)
	fn := func(context.Context) error { return nil }
	longest := strings.Repeat("é", pglock.MaxKeyLength-len(":slot:")-15)
	job := func(key string, opts ...pglock.JobOption) func(t *testing.T, c *pglock.Client) error {
		return func(t *testing.T, c *pglock.Client) error {
			_, err := c.Job(key, fn, opts...)
			return err
		}
	}
	cases := []badInput{
		{"CronThatDoesNotParse", "nightly", job("nightly", pglock.Cron("0 2 * *")), pglock.ErrInvalidArgument},
		{"CronOfWords", "nightly", job("nightly", pglock.Cron("at two every night")), pglock.ErrInvalidArgument},
		{"CronEmpty", "nightly", job("nightly", pglock.Cron("")), pglock.ErrInvalidArgument},
		{"CronAtEvery", "nightly", job("nightly", pglock.Cron("@every 5m")), pglock.ErrInvalidArgument},
		{"CronUnknownZone", "nightly", job("nightly", pglock.Cron("CRON_TZ=Mars/Olympus 0 2 * * *")), pglock.ErrInvalidArgument},
		{"CronNeverAgain", "nightly", job("nightly", pglock.Cron("0 0 30 2 *")), pglock.ErrInvalidArgument},
		{"TwoSchedules", "nightly", job("nightly", pglock.Cron("0 2 * * *"), pglock.Every(time.Hour)), pglock.ErrInvalidArgument},
		{"EveryMillisecond", "nightly", job("nightly", pglock.Every(time.Millisecond)), pglock.ErrInvalidArgument},
		{"EveryUnderTheMinimum", "nightly", job("nightly", pglock.Every(99*time.Millisecond)), pglock.ErrInvalidArgument},
		{"EveryInMicroseconds", "nightly", job("nightly", pglock.Every(time.Second+time.Microsecond)), pglock.ErrInvalidArgument},
		{"EveryZero", "nightly", job("nightly", pglock.Every(0)), pglock.ErrInvalidArgument},
		{"EveryNegative", "nightly", job("nightly", pglock.Every(-time.Hour)), pglock.ErrInvalidArgument},
		{"EveryOverAYear", "nightly", job("nightly", pglock.Every(pglock.MaxTTL+time.Second)), pglock.ErrInvalidArgument},
		{"CatchUpZero", "nightly", job("nightly", pglock.Every(time.Hour), pglock.CatchUp(0)), pglock.ErrInvalidArgument},
		{"CatchUpOver1000", "nightly", job("nightly", pglock.Every(time.Hour), pglock.CatchUp(1001)), pglock.ErrInvalidArgument},
		{"CatchUpWithoutSchedule", "nightly", job("nightly", pglock.OnOneInstance(), pglock.CatchUp(1)), pglock.ErrInvalidArgument},
		{"DeadlineZero", "nightly", job("nightly", pglock.Every(time.Hour), pglock.Deadline(0)), pglock.ErrInvalidArgument},
		{"DeadlineOverAYear", "nightly", job("nightly", pglock.Every(time.Hour), pglock.Deadline(366*24*time.Hour)), pglock.ErrInvalidArgument},
		{"DeadlineWithoutSchedule", "nightly", job("nightly", pglock.WithoutOverlapping(), pglock.Deadline(time.Minute)), pglock.ErrInvalidArgument},
		{"AtLeastOnceOneAttempt", "nightly", job("nightly", pglock.Every(time.Hour), pglock.AtLeastOnce(1, 0)), pglock.ErrInvalidArgument},
		{"AtLeastOnceOver100Attempts", "nightly", job("nightly", pglock.Every(time.Hour), pglock.AtLeastOnce(101, 0)), pglock.ErrInvalidArgument},
		{"AtLeastOnceNegativeBackoff", "nightly", job("nightly", pglock.Every(time.Hour), pglock.AtLeastOnce(3, -time.Second)), pglock.ErrInvalidArgument},
		{"AtLeastOnceBackoffOverADay", "nightly", job("nightly", pglock.Every(time.Hour), pglock.AtLeastOnce(3, 25*time.Hour)), pglock.ErrInvalidArgument},
		{"AtLeastOnceWithoutSchedule", "nightly", job("nightly", pglock.OnOneInstance(), pglock.AtLeastOnce(3, 0)), pglock.ErrInvalidArgument},
		{"KeyTooLongForItsSlots", "", job(longest+"é", pglock.Every(time.Hour)), pglock.ErrInvalidKey},
		{"ScheduleWithoutSchedule", "", func(t *testing.T, c *pglock.Client) error {
			j, err := c.Job("nightly", fn, pglock.OnOneInstance())
			require.NoError(t, err)
			s := newScheduler(t)
			_, err = j.Schedule(s)
			require.Empty(t, s.Jobs())
			return err
		}, pglock.ErrInvalidArgument},
		{"ScheduleNilScheduler", "", func(t *testing.T, c *pglock.Client) error {
			j, err := c.Job("nightly", fn, pglock.Every(time.Hour))
			require.NoError(t, err)
			_, err = j.Schedule(nil)
			return err
		}, pglock.ErrInvalidArgument},
	}
	requireBadInputRefused(t, store, cases, func(c *pglock.Client, key string) error {
		_, err := c.Job(key, fn, pglock.Every(time.Hour))
		return err
	})
	t.Run("MemoryStore", func(t *testing.T) {
		c := newClient(t, pglock.NewMemoryStore(nil), quiet)
		_, err := c.Job("nightly", fn, pglock.Every(time.Hour))
		require.ErrorIs(t, err, errors.ErrUnsupported)
		require.True(t, strings.HasPrefix(err.Error(), "pglock: "), err.Error())
		_, err = c.Job("nightly", fn, pglock.OnOneInstance())
		require.NoError(t, err)
	})
	// The longest key whose slots' lock keys fit is fine.
	_, err := newClient(t, store, quiet).Job(longest, fn, pglock.Every(time.Hour))
	require.NoError(t, err)
	require.Empty(t, lockKeys(t, pool))
}

// Job.Schedule gives gocron the job's own schedule: on three schedulers, each slot
// runs once, at its time.
func TestSlotScheduleRunsEachSlotOnceAcrossSchedulers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		schedule pglock.JobOption
	}{
		{"Every", pglock.Every(500 * time.Millisecond)},
		{"Cron", pglock.Cron("* * * * * *")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := pglocktest.Postgres(t)
			var runs slotRuns
			for _, name := range []string{"a", "b", "c"} {
				c := newPoolClient(t, pool, pglock.WithInstanceName(name))
				j, err := c.Job("feed:refresh", runs.fn(name, nil), tc.schedule)
				require.NoError(t, err)
				_, err = j.Schedule(newScheduler(t))
				require.NoError(t, err)
			}
			require.Eventually(t, func() bool { return len(runs.all()) >= 3 }, 10*time.Second, 10*time.Millisecond)
			slots := runs.slots()
			for i, s := range slots {
				require.Zero(t, s.UnixMilli()%500, "slot %v is not on the schedule", s)
				if i > 0 {
					require.True(t, s.After(slots[i-1]), "slots %v: one ran twice or out of order", slots)
				}
			}
		})
	}
}

// The run history records each run with its slot and attempt; JobStatuses says what
// the slots came to, and counts the ticks that found their slot claimed.
func TestSlotHistoryRecordsEachRunWithItsSlot(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pglocktest.Postgres(t)
	var runs slotRuns
	failed := false
	fn := runs.fn("a", func(context.Context) error {
		if !failed {
			failed = true
			return errors.New("the warehouse did not answer")
		}
		return nil
	})
	a := newPoolClient(t, pool, pglock.WithInstanceName("a"))
	b := newPoolClient(t, pool, pglock.WithInstanceName("b"))
	opts := []pglock.JobOption{pglock.Every(time.Hour), pglock.AtLeastOnce(2, 0)}
	ja, err := a.Job("stock:count", fn, opts...)
	require.NoError(t, err)
	jb, err := b.Job("stock:count", runs.fn("b", nil), opts...)
	require.NoError(t, err)
	require.ErrorContains(t, ja.Run(ctx), "the warehouse did not answer")
	require.NoError(t, jb.Run(ctx)) // finds the slot claimed
	require.Eventually(t, func() bool { return len(runs.all()) == 2 }, 10*time.Second, 5*time.Millisecond, "the retry")
	slot := runs.all()[0].slot
	require.Equal(t, slot, runs.all()[1].slot)

	var history []pglock.JobRun
	require.Eventually(t, func() bool {
		history, err = a.JobRuns(ctx, "stock:count", 10)
		return err == nil && len(history) == 2
	}, 10*time.Second, 10*time.Millisecond)
	for i, want := range []struct {
		attempt int
		outcome pglock.Outcome
	}{{2, pglock.OutcomeOK}, {1, pglock.OutcomeError}} {
		require.Equal(t, slot, history[i].Slot)
		require.Equal(t, want.attempt, history[i].Attempt)
		require.Equal(t, want.outcome, history[i].Outcome)
	}
	require.Eventually(t, func() bool {
		statuses, err := b.JobStatuses(ctx)
		if err != nil || len(statuses) != 1 || statuses[0].Slots == nil || len(statuses[0].Skips) != 1 {
			return false
		}
		s := statuses[0]
		return *s.Slots == pglock.JobSlots{Last: slot, OK: 1, Retried: 1} && s.LastRun.Slot.Equal(slot) &&
			s.Skips[0].Reason == pglock.SkipSlotClaimed && s.Skips[0].Instance == "b"
	}, 10*time.Second, 10*time.Millisecond)
}

// A tick that finds its slot claimed writes nothing: no WAL, no transaction id, no
// token drawn; most ticks of a slot are such.
func TestSlotLosingClaimWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pglocktest.Postgres(t)
	var now int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint").Scan(&now))
	slot := now - now%3600000
	claim := "SELECT * FROM pglock.job_slot_claim('exports:nightly', $1, $2, $3, 60000, 1, 0)"
	var status string
	var token *int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT status, fencing_token FROM ("+claim+") c", slot, slot+3600000, "winner").Scan(&status, &token))
	require.Equal(t, "claimed", status)
	var seq int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT last_value FROM pglock.fencing_token_seq").Scan(&seq))

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { require.NoError(t, tx.Rollback(context.WithoutCancel(ctx))) }()
	for range 20 {
		var out []byte
		require.NoError(t, tx.QueryRow(ctx, "EXPLAIN (ANALYZE, WAL, FORMAT JSON) "+claim, slot, slot+3600000, "loser").Scan(&out))
		require.Regexp(t, `"WAL Records": 0\b`, string(out), "a losing claim wrote WAL")
		require.Regexp(t, `"WAL Bytes": 0\b`, string(out), "a losing claim wrote WAL")
	}
	var xid *string
	require.NoError(t, tx.QueryRow(ctx, "SELECT txid_current_if_assigned()::text").Scan(&xid))
	require.Nil(t, xid, "a losing claim took a transaction id")
	var after int64
	require.NoError(t, tx.QueryRow(ctx, "SELECT last_value FROM pglock.fencing_token_seq").Scan(&after))
	require.Equal(t, seq, after, "a losing claim drew a token")
}

// A claim whose ctx ends while its statement is in flight is handed back once its reply
// comes, as an acquisition is: the slot's next attempt (AtLeastOnce) runs on another
// instance within about a round trip, not a ttl later, and the instance that gave up
// never runs it.
func TestSlotClaimWhoseCtxEndsInFlightIsHandedBack(t *testing.T) {
	t.Parallel()
	url := pglocktest.PostgresURL(t)
	slow, proxy := proxiedPool(t, url, 1)
	const ttl = 10 * time.Second
	// Hourly: both claims stand for the same slot unless the test straddles an hour.
	opts := []pglock.JobOption{pglock.Every(time.Hour), pglock.AtLeastOnce(3, 0), pglock.TTL(ttl)}
	var runs slotRuns
	a := newPoolClient(t, slow, pglock.WithInstanceName("a"))
	aJob, err := a.Job("exports:ledger", runs.fn("a", nil), opts...)
	require.NoError(t, err)
	b := newPoolClient(t, pglocktest.Pool(t, url, 4), pglock.WithInstanceName("b"))
	bJob, err := b.Job("exports:ledger", runs.fn("b", nil), opts...)
	require.NoError(t, err)
	warm, err := a.TryAcquire(t.Context(), "warm") // a's connection is open
	require.NoError(t, err)
	require.NoError(t, warm.Release(t.Context()))

	proxy.SetDelay(tcpproxy.ToClient, 300*time.Millisecond)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, aJob.Run(ctx), context.DeadlineExceeded)
	gaveUp := time.Now()

	require.Eventually(t, func() bool {
		require.NoError(t, bJob.Run(t.Context()))
		return len(runs.all()) > 0
	}, ttl/2, 10*time.Millisecond, "the slot's attempt stayed with a claim nobody runs")
	t.Logf("the slot ran on b %v after a gave up", time.Since(gaveUp).Round(time.Millisecond))
	all := runs.all()
	require.Len(t, all, 1)
	require.Equal(t, "b", all[0].instance, "the instance that gave up ran the slot")
}
