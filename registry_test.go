package pglock_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/pglocktest"
)

// awaitJobs waits until JobStatuses lists want jobs, the registry being written in the
// background, and returns them by job.
func awaitJobs(t *testing.T, c *pglock.Client, want int) map[string]pglock.JobStatus {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		jobs, err := c.JobStatuses(t.Context())
		require.NoError(t, err)
		regs := 0
		for _, j := range jobs {
			regs += len(j.Registrations)
		}
		if regs >= want || time.Now().After(deadline) {
			byJob := map[string]pglock.JobStatus{}
			for _, j := range jobs {
				byJob[j.Job] = j
			}
			require.Equal(t, want, regs, "registrations in %v", jobs)
			return byJob
		}
		time.Sleep(10 * time.Millisecond) // polling a write made in the background
	}
}

// awaitElections waits until Elections lists want elections.
func awaitElections(t *testing.T, c *pglock.Client, want int, leading ...string) []pglock.LockInfo {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		elections, err := c.Elections(t.Context())
		require.NoError(t, err)
		held := map[string]bool{}
		for _, e := range elections {
			held[e.Key] = e.Held
		}
		ok := len(elections) == want
		for _, k := range leading {
			ok = ok && held[k]
		}
		if ok || time.Now().After(deadline) {
			require.Len(t, elections, want, "%v", elections)
			return elections
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Registered jobs are listed, with the instances that registered them, before their
// first run: a Job's key and a GocronLocker's job name, from two instances.
func TestJobStatusesListRegisteredJobsBeforeTheirFirstRun(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t)
	a := historyClient(t, pool, "a")
	b := historyClient(t, pool, "b")
	before := time.Now()
	for _, c := range []*pglock.Client{a, b} {
		_, err := c.Job("inventory:stock-reconciliation", func(context.Context) error { return nil }, pglock.OnOneInstance())
		require.NoError(t, err)
	}
	locker, err := a.GocronLocker()
	require.NoError(t, err)
	l, err := locker.Lock(t.Context(), "invoices:export") // registers the job name at its first Lock
	require.NoError(t, err)
	require.NoError(t, l.Unlock(t.Context()))

	jobs := awaitJobs(t, a, 3)
	j := jobs["inventory:stock-reconciliation"]
	require.Nil(t, j.LastRun, "never ran")
	require.Len(t, j.Registrations, 2)
	require.Equal(t, "a", j.Registrations[0].Instance)
	require.Equal(t, "b", j.Registrations[1].Instance)
	for _, r := range j.Registrations {
		require.WithinDuration(t, before, r.Registered, 5*time.Second) // the database's clock, the test's host
		require.Equal(t, r.Registered, r.Seen)
	}
	require.Len(t, jobs["invoices:export"].Registrations, 1)
	require.Equal(t, "a", jobs["invoices:export"].Registrations[0].Instance)

	// A restart registers again: the registration moves, the rows stay one per instance.
	require.NoError(t, b.Close(t.Context()))
	b2 := historyClient(t, pool, "b")
	_, err = b2.Job("inventory:stock-reconciliation", func(context.Context) error { return nil }, pglock.OnOneInstance())
	require.NoError(t, err)
	deadline := time.Now().Add(10 * time.Second)
	for {
		j = awaitJobs(t, a, 3)["inventory:stock-reconciliation"]
		if j.Registrations[1].Registered.After(jobs["inventory:stock-reconciliation"].Registrations[1].Registered) {
			break
		}
		require.True(t, time.Now().Before(deadline), "b's second registration")
		time.Sleep(10 * time.Millisecond)
	}
}

// Elections lists every election registered, by Elect or GocronElector on any
// instance, with its leader; one nobody leads is listed with Held false.
func TestElectionsListEveryRegisteredElectionWithItsLeader(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t)
	a := historyClient(t, pool, "a")
	b := historyClient(t, pool, "b")
	led := make(chan struct{})
	_, err := a.Elect("billing:leader", pglock.LeaderCallbacks{OnAcquired: func(ctx context.Context, _ *pglock.Lock) error {
		close(led)
		<-ctx.Done()
		return nil
	}})
	require.NoError(t, err)
	receive(t, led) // before b campaigns: a leads
	_, err = b.Elect("billing:leader", pglock.LeaderCallbacks{OnAcquired: func(ctx context.Context, _ *pglock.Lock) error {
		<-ctx.Done()
		return nil
	}})
	require.NoError(t, err)
	_, err = b.GocronElector("scheduler:leader") // registered; nobody asked IsLeader yet
	require.NoError(t, err)

	elections := awaitElections(t, a, 2, "billing:leader")
	require.Equal(t, "billing:leader", elections[0].Key)
	require.True(t, elections[0].Held)
	require.Equal(t, "a", elections[0].Instance)
	require.Positive(t, elections[0].Token)
	require.Positive(t, elections[0].ExpiresIn)
	require.Equal(t, pglock.LockInfo{Key: "scheduler:leader"}, elections[1])

	jobs, err := a.JobStatuses(t.Context())
	require.NoError(t, err)
	require.Empty(t, jobs, "an election is not a job")
}

// The memory store keeps a registry too.
func TestRegistryOnTheMemoryStore(t *testing.T) {
	t.Parallel()
	clock := pglocktest.NewManualClock(time.Now())
	store := pglock.NewMemoryStore(clock)
	c := newClient(t, store, pglock.WithClock(clock), pglock.WithInstanceName("a"))
	_, err := c.Job("reports:nightly", func(context.Context) error { return nil }, pglock.WithoutOverlapping())
	require.NoError(t, err)
	e, err := c.GocronElector("scheduler:leader")
	require.NoError(t, err)
	require.NoError(t, e.IsLeader(t.Context()))

	jobs := awaitJobs(t, c, 1)
	require.Equal(t, "a", jobs["reports:nightly"].Registrations[0].Instance)
	require.Equal(t, clock.Now(), jobs["reports:nightly"].Registrations[0].Registered)
	elections := awaitElections(t, c, 1, "scheduler:leader")
	require.Equal(t, "a", elections[0].Instance)
}

// registry_touch refuses bad input with invalid_parameter_value (22023) and writes
// nothing: a role granted EXECUTE cannot fill the table with junk.
func TestRegistryTouchRefusesBadInput(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t)
	long := make([]byte, 501)
	for i := range long {
		long[i] = 'k'
	}
	many := make([]string, 1001)
	for i := range many {
		many[i] = "k"
	}
	for _, tc := range []struct {
		name     string
		kind     string
		keys     []*string
		instance string
	}{
		{"an unknown kind", "lock", keys("k"), "a"},
		{"an empty instance", "job", keys("k"), ""},
		{"an empty key", "job", keys(""), "a"},
		{"a null key", "job", []*string{nil}, "a"},
		{"a key of 501 characters", "election", keys(string(long)), "a"},
		{"1001 keys", "job", keys(many...), "a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := pool.Exec(t.Context(), `SELECT pglock.registry_touch($1, $2, $3, true)`, tc.kind, tc.keys, tc.instance)
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr)
			require.Equal(t, "22023", pgErr.Code, pgErr.Message)
			require.Zero(t, registryRows(t, pool))
		})
	}
}

func keys(ks ...string) []*string {
	out := make([]*string, len(ks))
	for i := range ks {
		out[i] = &ks[i]
	}
	return out
}

func registryRows(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM pglock.registry`).Scan(&n))
	return n
}

// GocronOptions names the gocron job after the pglock job's key: one name for both.
func TestGocronOptionsWithTheKeyNameTheJobOnce(t *testing.T) {
	t.Parallel()
	c := newClient(t, pglock.NewMemoryStore(nil))
	job, err := c.Job("inventory:stock-reconciliation", func(context.Context) error { return nil }, pglock.WithoutOverlapping())
	require.NoError(t, err)
	s, err := gocron.NewScheduler()
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Shutdown()) })
	gj, err := s.NewJob(gocron.DurationJob(time.Hour), job.Task(), pglock.GocronOptions(job.Key())...)
	require.NoError(t, err)
	require.Equal(t, job.Key(), gj.Name())
}
