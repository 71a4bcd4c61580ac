package pglock_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/testkit"
	"github.com/pgfence/pglock/pglocktest"
)

const (
	jobExportKey    = "invoices:nightly-export"
	jobReconcileKey = "inventory:stock-reconciliation"
)

// The orders the nightly export books on the first night: every placed order.
var jobFirstNight = []string{"ord_1001", "ord_1002", "ord_1004"}

// jobPause holds an external system's calls open while paused, as a slow system would.
type jobPause struct {
	mu   sync.Mutex
	held chan struct{} // nil when not paused
}

// pause holds the calls that start from now on until resume.
func (p *jobPause) pause() (resume func()) {
	held := make(chan struct{})
	p.mu.Lock()
	p.held = held
	p.mu.Unlock()
	return sync.OnceFunc(func() {
		p.mu.Lock()
		p.held = nil
		p.mu.Unlock()
		close(held)
	})
}

func (p *jobPause) wait(ctx context.Context) error {
	p.mu.Lock()
	held := p.held
	p.mu.Unlock()
	if held == nil {
		return nil
	}
	select {
	case <-held:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// jobAccounting is the accounting system: it records every batch it is sent.
type jobAccounting struct {
	jobPause
	mu      sync.Mutex
	batches [][]string
}

func (a *jobAccounting) uploadInvoices(ctx context.Context, orders []string) (batch string, err error) {
	a.mu.Lock()
	a.batches = append(a.batches, orders)
	batch = fmt.Sprintf("batch_%d", len(a.batches))
	a.mu.Unlock()
	return batch, a.wait(ctx)
}

func (a *jobAccounting) booked() [][]string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.batches)
}

// jobWarehouse is the warehouse: it counts the full stock counts it is asked for.
type jobWarehouse struct {
	jobPause
	counts atomic.Int32
}

func (w *jobWarehouse) stockCounts(ctx context.Context) error {
	w.counts.Add(1)
	return w.wait(ctx)
}

// jobShop is the tutorial's two jobs, on an orders table and the two fakes.
type jobShop struct {
	pool       *pgxpool.Pool
	accounting jobAccounting
	warehouse  jobWarehouse
	exported   atomic.Int32 // finished exports
	reconciled atomic.Int32 // finished reconciliations

	mu       sync.Mutex
	runLocks []string // the key of the lock each reconciliation ran under
}

func newJobShop(t *testing.T, pool *pgxpool.Pool) *jobShop {
	t.Helper()
	_, err := pool.Exec(t.Context(), `
		CREATE TABLE orders (id text PRIMARY KEY, status text NOT NULL, invoice_batch text);
		INSERT INTO orders (id, status) VALUES
			('ord_1001', 'placed'), ('ord_1002', 'placed'), ('ord_1003', 'cancelled'), ('ord_1004', 'placed')`)
	require.NoError(t, err)
	return &jobShop{pool: pool}
}

// exportInvoices books every placed order without an invoice: a night it did not run
// is caught up the next night.
func (s *jobShop) exportInvoices(ctx context.Context) error {
	defer s.exported.Add(1)
	rows, err := s.pool.Query(ctx, "SELECT id FROM orders WHERE status = 'placed' AND invoice_batch IS NULL ORDER BY id")
	if err != nil {
		return err
	}
	pending, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(pending) == 0 {
		return err
	}
	batch, err := s.accounting.uploadInvoices(ctx, pending)
	if err != nil {
		return err
	}
	_, err = s.pool.Exec(ctx, "UPDATE orders SET invoice_batch = $1 WHERE id = ANY($2)", batch, pending)
	return err
}

func (s *jobShop) reconcileStock(ctx context.Context) error {
	defer s.reconciled.Add(1)
	if l, ok := pglock.FromContext(ctx); ok {
		s.mu.Lock()
		s.runLocks = append(s.runLocks, l.Key())
		s.mu.Unlock()
	}
	return s.warehouse.stockCounts(ctx)
}

// jobInstance is one instance of the shop's app: a client and the two jobs.
type jobInstance struct {
	client    *pglock.Client
	export    *pglock.Job
	reconcile *pglock.Job
}

// start starts an instance named name; reconcile are the reconciliation's options.
func (s *jobShop) start(t *testing.T, name string, logs *testkit.LogBuffer, events *eventLog, reconcile []pglock.JobOption, opts ...pglock.ClientOption) jobInstance {
	t.Helper()
	opts = append([]pglock.ClientOption{pglock.WithInstanceName(name), pglock.WithLogger(newLogger(logs)),
		pglock.WithEventHandler(events.record)}, opts...)
	c := newClient(t, pglock.NewPostgresStore(s.pool), opts...)
	export, err := c.Job(jobExportKey, s.exportInvoices, pglock.OnOneInstance())
	require.NoError(t, err)
	rec, err := c.Job(jobReconcileKey, s.reconcileStock, reconcile...)
	require.NoError(t, err)
	return jobInstance{client: c, export: export, reconcile: rec}
}

// tickJobs fires a tick on each job at once, as the instances' schedulers do, and
// waits for them.
func tickJobs(t *testing.T, jobs ...*pglock.Job) {
	t.Helper()
	errs := make(chan error, len(jobs))
	for _, j := range jobs {
		go func() { errs <- j.Run(t.Context()) }()
	}
	for range jobs {
		select {
		case err := <-errs:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("a tick did not return within 10s")
		}
	}
}

// newScheduler returns a started gocron scheduler, shut down when the test ends (before
// the clients it uses are closed, as an app does it).
func newScheduler(t *testing.T, opts ...gocron.SchedulerOption) gocron.Scheduler {
	t.Helper()
	s, err := gocron.NewScheduler(opts...)
	require.NoError(t, err)
	s.Start()
	t.Cleanup(func() { require.NoError(t, s.Shutdown()) })
	return s
}

// See the problem: three instances of an app with plain gocron jobs, on one database.
// Their schedulers fire every job on each of them.
func TestWithoutPglockThreeInstancesRunEveryTickThreeTimes(t *testing.T) {
	t.Parallel()
	shop := newJobShop(t, pglocktest.Postgres(t))
	var exports, reconciliations []gocron.Job
	for range 3 {
		s := newScheduler(t)
		// The real schedules (02:00, every five minutes) must not come during the test:
		// RunNow fires the ticks, through gocron, as the schedule would.
		export, err := s.NewJob(gocron.DurationJob(time.Hour), gocron.NewTask(shop.exportInvoices), pglock.GocronOptions("invoice-export")...)
		require.NoError(t, err)
		reconcile, err := s.NewJob(gocron.DurationJob(time.Hour), gocron.NewTask(shop.reconcileStock), pglock.GocronOptions("stock-reconciliation")...)
		require.NoError(t, err)
		exports, reconciliations = append(exports, export), append(reconciliations, reconcile)
	}

	// Uploads are slow enough that all three instances read the orders before any of
	// them marks them invoiced.
	resume := shop.accounting.pause()
	for _, j := range exports {
		require.NoError(t, j.RunNow())
	}
	require.Eventually(t, func() bool { return len(shop.accounting.booked()) == 3 }, 10*time.Second, 5*time.Millisecond)
	resume()
	require.Eventually(t, func() bool { return shop.exported.Load() == 3 }, 10*time.Second, 5*time.Millisecond)
	require.Equal(t, [][]string{jobFirstNight, jobFirstNight, jobFirstNight}, shop.accounting.booked())
	// The orders table looks fine: every order has one batch, whichever wrote last.
	var batches int
	require.NoError(t, shop.pool.QueryRow(t.Context(),
		"SELECT count(DISTINCT invoice_batch) FROM orders WHERE status = 'placed'").Scan(&batches))
	require.Equal(t, 1, batches)

	for _, j := range reconciliations {
		require.NoError(t, j.RunNow())
	}
	require.Eventually(t, func() bool { return shop.reconciled.Load() == 3 }, 10*time.Second, 5*time.Millisecond)
	require.EqualValues(t, 3, shop.warehouse.counts.Load())
}

func TestOnOneInstanceRunsEachTickOnce(t *testing.T) {
	t.Parallel()
	shop := newJobShop(t, pglocktest.Postgres(t))
	var logs testkit.LogBuffer
	var events eventLog
	var apps []jobInstance
	for i := range 3 {
		apps = append(apps, shop.start(t, fmt.Sprintf("instance-%d", i+1), &logs, &events, []pglock.JobOption{pglock.OnOneInstance()}))
	}

	tickJobs(t, apps[0].export, apps[1].export, apps[2].export)
	require.Equal(t, [][]string{jobFirstNight}, shop.accounting.booked())
	tickJobs(t, apps[0].reconcile, apps[1].reconcile, apps[2].reconcile)
	tickJobs(t, apps[0].reconcile, apps[1].reconcile, apps[2].reconcile)
	require.EqualValues(t, 2, shop.warehouse.counts.Load())

	require.Equal(t, 1, logLines(&logs, "pglock: job runs on this instance", jobReconcileKey))
	require.Contains(t, logs.String(), "lease="+jobReconcileKey+":owner")
	require.Equal(t, 4, logLines(&logs, "pglock: skipped job: it runs on another instance", jobReconcileKey))
	require.Equal(t, 2, logLines(&logs, "pglock: skipped job: it runs on another instance", jobExportKey))
	requireEvents(t, &events, 4, pglock.EventJobSkipped, jobReconcileKey, pglock.SkipOtherInstance)
	requireEvents(t, &events, 2, pglock.EventJobRan, jobReconcileKey, "")
	// With OnOneInstance alone, the run's lock is the lease.
	require.Equal(t, []string{jobReconcileKey + ":owner", jobReconcileKey + ":owner"}, shop.runLocks)
}

func TestOnOneInstanceMovesTheJobOnceItsDeadOwnersLeaseEnds(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	shop := newJobShop(t, pglocktest.Postgres(t))
	var logs testkit.LogBuffer
	var events eventLog
	// The crashed instance's clock stands still: it never renews, as if its process died.
	// Its lease outlives the three runs and the insert below, however slow the machine,
	// and ends when the test says.
	const crashedTTL = time.Minute
	stopped := pglocktest.NewManualClock(time.Now())
	crashed := shop.start(t, "crashed", &logs, &events, []pglock.JobOption{pglock.OnOneInstance()},
		pglock.WithClock(stopped), pglock.TTL(crashedTTL))
	t.Cleanup(func() { stopped.Advance(crashedTTL) }) // before its Close: it finds its lease lost
	// The survivor has the default ttl: with a ttl of 1 s, a loaded machine could make
	// its last tick skip (the store's confirmation came after 0.9 s).
	survivor := shop.start(t, "survivor", &logs, &events, []pglock.JobOption{pglock.OnOneInstance()})

	require.NoError(t, crashed.export.Run(ctx))
	require.NoError(t, survivor.export.Run(ctx))
	require.Equal(t, [][]string{jobFirstNight}, shop.accounting.booked())

	_, err := shop.pool.Exec(ctx, "INSERT INTO orders (id, status) VALUES ('ord_1005', 'placed')")
	require.NoError(t, err)
	require.NoError(t, survivor.export.Run(ctx)) // the lease is still the crashed instance's
	require.Len(t, shop.accounting.booked(), 1)
	require.Equal(t, 2, logLines(&logs, "pglock: skipped job: it runs on another instance", jobExportKey))

	pglock.EndLease(t, shop.pool, jobExportKey+":owner") // the crashed instance's lease
	require.NoError(t, survivor.export.Run(ctx))
	require.Equal(t, [][]string{jobFirstNight, {"ord_1005"}}, shop.accounting.booked())
	require.Equal(t, 2, logLines(&logs, "pglock: job runs on this instance", jobExportKey))
	require.Contains(t, logs.String(), `msg="pglock: job runs on this instance" key=`+jobExportKey+" lease="+jobExportKey+":owner owner=survivor/")
}

func TestWithoutOverlappingSkipsEveryTickDuringARunThenRunsTheNext(t *testing.T) {
	t.Parallel()
	shop := newJobShop(t, pglocktest.Postgres(t))
	var logs testkit.LogBuffer
	var events eventLog
	clock := pglocktest.NewManualClock(time.Now())
	both := []pglock.JobOption{pglock.OnOneInstance(), pglock.WithoutOverlapping()}
	owner := shop.start(t, "owner", &logs, &events, both, pglock.WithClock(clock))
	other := shop.start(t, "other", &logs, &events, both, pglock.WithClock(clock))
	t.Cleanup(func() { clock.Advance(time.Second) }) // past the last run's first second, before Close

	resume := shop.warehouse.pause()
	first := make(chan error, 1)
	go func() { first <- owner.reconcile.Run(t.Context()) }()
	require.Eventually(t, func() bool { return shop.warehouse.counts.Load() == 1 }, 10*time.Second, time.Millisecond)
	for range 3 {
		clock.Advance(5 * time.Minute) // the run goes on, its locks renewed
		tickJobs(t, owner.reconcile, other.reconcile)
	}
	require.EqualValues(t, 1, shop.warehouse.counts.Load())
	require.Equal(t, 3, logLines(&logs, "pglock: skipped job: a run is still in progress", jobReconcileKey))
	require.Equal(t, 3, logLines(&logs, "pglock: skipped job: it runs on another instance", jobReconcileKey))
	requireEvents(t, &events, 3, pglock.EventJobSkipped, jobReconcileKey, pglock.SkipRunInProgress)

	resume()
	require.NoError(t, receive(t, first))
	clock.Advance(5 * time.Minute)
	tickJobs(t, owner.reconcile, other.reconcile)
	require.EqualValues(t, 2, shop.warehouse.counts.Load())
	requireEvents(t, &events, 2, pglock.EventJobRan, jobReconcileKey, "")
	// With WithoutOverlapping, the run's lock is the run lock, not the lease.
	require.Equal(t, []string{jobReconcileKey, jobReconcileKey}, shop.runLocks)
}

func TestWithoutOverlappingAloneRunsOnAnyInstanceOneRunAtATime(t *testing.T) {
	t.Parallel()
	shop := newJobShop(t, pglocktest.Postgres(t))
	var logs testkit.LogBuffer
	var events eventLog
	only := []pglock.JobOption{pglock.WithoutOverlapping()}
	a := shop.start(t, "a", &logs, &events, only)
	b := shop.start(t, "b", &logs, &events, only)

	resume := shop.warehouse.pause()
	first := make(chan error, 1)
	go func() { first <- a.reconcile.Run(t.Context()) }()
	require.Eventually(t, func() bool { return shop.warehouse.counts.Load() == 1 }, 10*time.Second, time.Millisecond)
	tickJobs(t, a.reconcile, b.reconcile)
	require.EqualValues(t, 1, shop.warehouse.counts.Load())
	require.Equal(t, 2, logLines(&logs, "pglock: skipped job: a run is still in progress", jobReconcileKey))
	resume()
	require.NoError(t, receive(t, first))

	require.NoError(t, b.reconcile.Run(t.Context())) // no lease: any instance runs the next tick
	require.NoError(t, a.reconcile.Run(t.Context()))
	require.EqualValues(t, 3, shop.warehouse.counts.Load())
	require.Zero(t, logLines(&logs, "pglock: job runs on this instance", jobReconcileKey))
}

func TestJobContextIsCancelledWhenTheLeaseIsLost(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pglocktest.Postgres(t)
	store := pglock.NewPostgresStore(pool)
	var logs testkit.LogBuffer
	clockA := pglocktest.NewManualClock(time.Now())
	const ttl = 200 * time.Millisecond // A's run does nothing while it holds the lease
	a := newClient(t, store, pglock.TTL(ttl), pglock.WithClock(clockA), pglock.WithLogger(newLogger(&logs)))
	t.Cleanup(func() { clockA.Advance(time.Second) }) // a failed test's Close does not wait on it
	// B's lease must outlast the test however slow the machine: the default ttl.
	b := newClient(t, store, quiet)
	started := make(chan *pglock.Lock, 1)
	jobA, err := a.Job("reports:daily", func(ctx context.Context) error {
		l, _ := pglock.FromContext(ctx)
		started <- l
		<-ctx.Done()
		return context.Cause(ctx)
	}, pglock.OnOneInstance())
	require.NoError(t, err)
	var ranOnB atomic.Int32
	jobB, err := b.Job("reports:daily", func(context.Context) error { ranOnB.Add(1); return nil }, pglock.OnOneInstance())
	require.NoError(t, err)

	runA := make(chan error, 1)
	go func() { runA <- jobA.Run(ctx) }()
	lease := receive(t, started)
	require.Equal(t, "reports:daily:owner", lease.Key())
	awaitExpiry(t, pool, lease.Key()) // A's clock stands still
	require.NoError(t, jobB.Run(ctx))
	require.EqualValues(t, 1, ranOnB.Load())

	clockA.Advance(ttl / 3) // A wakes up: its renewal is refused, its run is cancelled
	err = receive(t, runA)
	var lost *pglock.LockLostError
	require.ErrorAs(t, err, &lost)
	require.Equal(t, "reports:daily:owner", lost.Key)
	require.Equal(t, pglock.LostRefused, lost.Reason)
	require.Equal(t, lease.Token(), lost.Token)

	require.NoError(t, jobA.Run(ctx)) // the next tick tries again, and finds B's lease
	require.Equal(t, 1, logLines(&logs, "pglock: skipped job: it runs on another instance", "reports:daily"))
}

func TestCloseHandsLeasesOver(t *testing.T) {
	t.Parallel()

	// start returns a job on a client of its own on clock (nil: the real one), counting runs.
	start := func(t *testing.T, store *pglock.Store, logs *testkit.LogBuffer, clock pglock.Clock, ran *atomic.Int32) (*pglock.Client, *pglock.Job) {
		t.Helper()
		opts := []pglock.ClientOption{pglock.WithLogger(newLogger(logs))}
		if clock != nil {
			opts = append(opts, pglock.WithClock(clock))
		}
		c := newClient(t, store, opts...)
		if clock, ok := clock.(*pglocktest.ManualClock); ok {
			t.Cleanup(func() { clock.Advance(time.Second) }) // a failed test's Close does not wait on it
		}
		j, err := c.Job(jobReconcileKey, func(context.Context) error { ran.Add(1); return nil }, pglock.OnOneInstance(), pglock.WithoutOverlapping())
		require.NoError(t, err)
		return c, j
	}

	t.Run("TheNextTickElsewhereRunsAtOnceNotAfterTTL", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		store := pglock.NewPostgresStore(pglocktest.Postgres(t))
		var logs testkit.LogBuffer
		var ranA, ranB atomic.Int32
		clock := pglocktest.NewManualClock(time.Now())
		a, jobA := start(t, store, &logs, clock, &ranA)
		_, jobB := start(t, store, &logs, nil, &ranB)

		require.NoError(t, jobA.Run(ctx))
		skipping := time.Now()
		require.NoError(t, jobB.Run(ctx)) // a store call, with nothing to wait for
		ref := time.Since(skipping)
		require.Equal(t, []int32{1, 0}, []int32{ranA.Load(), ranB.Load()})
		clock.Advance(time.Second) // the run started a second ago
		closed := time.Now()
		require.NoError(t, a.Close(ctx))
		// A Close that waited would wait for the stopped clock (for ever) or the 30 s ttl:
		// 5 s tells that from a loaded machine's Close, which has the listener, the pools
		// and the hand-back to close, over a second.
		requirePrompt(t, time.Since(closed), 5*time.Second, ref, "Close waited to hand the lease back")
		require.ErrorIs(t, jobA.Run(ctx), pglock.ErrClosed)
		require.NoError(t, jobB.Run(ctx)) // the client's ttl is 30 s: only a handed-back lease lets it run
		require.Equal(t, []int32{1, 1}, []int32{ranA.Load(), ranB.Load()})
		require.Equal(t, 1, logLines(&logs, "pglock: job lease handed back", jobReconcileKey))
		require.Equal(t, 2, logLines(&logs, "pglock: job runs on this instance", jobReconcileKey))
	})

	t.Run("ALeaseIsKeptUntilASecondAfterItsLastRunStarted", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		store := pglock.NewPostgresStore(pglocktest.Postgres(t))
		var logs testkit.LogBuffer
		var ranA, ranB atomic.Int32
		clock := pglocktest.NewManualClock(time.Now())
		a, jobA := start(t, store, &logs, clock, &ranA)
		_, jobB := start(t, store, &logs, nil, &ranB)

		require.NoError(t, jobA.Run(ctx))
		runAt := clock.Now()
		closed := make(chan error, 1)
		go func() { closed <- a.Close(ctx) }()
		require.Eventually(t, func() bool {
			return logLines(&logs, "pglock: keeping job lease until a second after its last run started", jobReconcileKey) == 1
		}, 10*time.Second, time.Millisecond)
		require.ErrorIs(t, jobA.Run(ctx), pglock.ErrClosed)
		clock.Advance(999 * time.Millisecond)
		require.NoError(t, jobB.Run(ctx)) // another instance firing the same tick skips it
		require.Zero(t, ranB.Load())
		select {
		case err := <-closed:
			t.Fatalf("Close returned %v before the second passed", err)
		default:
		}
		// Close waits on the client's clock: move it until Close hands the lease back.
		var closeErr error
		require.Eventually(t, func() bool {
			select {
			case closeErr = <-closed:
				return true
			default:
				clock.Advance(time.Millisecond)
				return false
			}
		}, 10*time.Second, time.Millisecond)
		require.NoError(t, closeErr)
		require.GreaterOrEqual(t, clock.Now().Sub(runAt), time.Second)
		require.NoError(t, jobB.Run(ctx))
		require.EqualValues(t, 1, ranB.Load())
	})

	t.Run("RunsInProgressFinishFirst", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		store := pglock.NewPostgresStore(pglocktest.Postgres(t))
		c := newClient(t, store, quiet)
		running, finish := make(chan struct{}), make(chan struct{})
		var finished atomic.Bool
		job, err := c.Job(jobReconcileKey, func(context.Context) error {
			close(running)
			await(t, finish)
			finished.Store(true)
			return nil
		}, pglock.OnOneInstance(), pglock.WithoutOverlapping())
		require.NoError(t, err)
		ran := make(chan error, 1)
		go func() { ran <- job.Run(ctx) }()
		receive(t, running)
		closed := make(chan error, 1)
		go func() { closed <- c.Close(ctx) }()
		close(finish)
		require.NoError(t, receive(t, closed))
		require.True(t, finished.Load(), "Close returned before the run finished")
		require.NoError(t, receive(t, ran))
	})

	t.Run("ARunThatIgnoresItsContextHoldsCloseOnlyUntilCtxEnds", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		store := pglock.NewPostgresStore(pglocktest.Postgres(t))
		idle, err := pglock.NewWithStore(store, quiet)
		require.NoError(t, err)
		_, err = idle.TryAcquire(ctx, "idle")
		require.NoError(t, err)
		closing := time.Now()
		require.NoError(t, idle.Close(ctx)) // a like Close, with nothing to wait for
		ref := time.Since(closing)
		c := newClient(t, store, quiet)
		running, finish := make(chan struct{}), make(chan struct{})
		job, err := c.Job(jobReconcileKey, func(context.Context) error {
			close(running)
			await(t, finish) // ignores its ctx
			return nil
		}, pglock.OnOneInstance())
		require.NoError(t, err)
		ran := make(chan error, 1)
		go func() { ran <- job.Run(ctx) }()
		receive(t, running)

		const closeTimeout = 200 * time.Millisecond
		closeCtx, cancel := context.WithTimeout(ctx, closeTimeout)
		defer cancel()
		began := time.Now()
		require.ErrorIs(t, c.Close(closeCtx), context.DeadlineExceeded)
		requirePrompt(t, time.Since(began), 2*time.Second, closeTimeout+ref, "Close waited past its ctx")
		close(finish)
		require.NoError(t, receive(t, ran))
	})
}

func TestJobKeysAreRegisteredOnce(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c := newClient(t, pglock.NewPostgresStore(pglocktest.Postgres(t)), quiet)
	fn := func(context.Context) error { return nil }

	_, err := c.Job("nightly", fn, pglock.OnOneInstance())
	require.NoError(t, err)
	_, err = c.Job("nightly", fn, pglock.WithoutOverlapping())
	require.ErrorIs(t, err, pglock.ErrInvalidArgument)
	require.ErrorContains(t, err, `job "nightly": key "nightly" is already used by job "nightly"`)
	_, err = c.Job("nightly:owner", fn, pglock.OnOneInstance())
	require.ErrorIs(t, err, pglock.ErrInvalidArgument)
	require.ErrorContains(t, err, `job "nightly:owner": key "nightly:owner" is already used by job "nightly"`)

	// The other way round: a job whose lease key is another job's key.
	_, err = c.Job("hourly:owner", fn, pglock.OnOneInstance())
	require.NoError(t, err)
	_, err = c.Job("hourly", fn, pglock.OnOneInstance())
	require.ErrorContains(t, err, `job "hourly": key "hourly:owner" is already used by job "hourly:owner"`)

	// Elections and gocron electors share the registry.
	_, err = c.GocronElector("scheduler")
	require.NoError(t, err)
	_, err = c.Job("scheduler", fn, pglock.OnOneInstance())
	require.ErrorContains(t, err, `job "scheduler": key "scheduler" is already used by gocron elector "scheduler"`)
	_, err = c.GocronElector("nightly:owner")
	require.ErrorContains(t, err, `gocron elector "nightly:owner": key "nightly:owner" is already used by job "nightly"`)

	// A gocron locker's job names are registered at their first Lock.
	locker, err := c.GocronLocker()
	require.NoError(t, err)
	_, err = locker.Lock(ctx, "nightly")
	require.ErrorIs(t, err, pglock.ErrInvalidArgument)
	require.ErrorContains(t, err, `gocron locker job "nightly": key "nightly:owner" is already used by job "nightly"`)
	lock, err := locker.Lock(ctx, "weekly")
	require.NoError(t, err)
	require.NoError(t, lock.Unlock(ctx))
	_, err = c.Job("weekly", fn, pglock.OnOneInstance())
	require.ErrorContains(t, err, `job "weekly": key "weekly:owner" is already used by gocron locker job "weekly"`)

	require.NoError(t, c.Close(ctx))
	_, err = c.Job("after-close", fn, pglock.OnOneInstance())
	require.ErrorIs(t, err, pglock.ErrClosed)
	_, err = c.GocronElector("after-close")
	require.ErrorIs(t, err, pglock.ErrClosed)
	_, err = c.GocronLocker()
	require.ErrorIs(t, err, pglock.ErrClosed)
}

func TestJobBadInputGetsAClearErrorAndRegistersNothing(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t)
	store := pglock.NewPostgresStore(pool)
	fn := func(context.Context) error { return nil }
	longest := strings.Repeat("é", pglock.MaxKeyLength-len(":owner"))
	cases := []badInput{
		{"JobEmptyKey", "", func(t *testing.T, c *pglock.Client) error {
			_, err := c.Job("", fn, pglock.OnOneInstance())
			return err
		}, pglock.ErrInvalidKey},
		{"JobLeaseKeyTooLong", "", func(t *testing.T, c *pglock.Client) error {
			_, err := c.Job(longest+"é", fn, pglock.OnOneInstance())
			return err
		}, pglock.ErrInvalidKey},
		{"JobKeyTooLong", "", func(t *testing.T, c *pglock.Client) error {
			_, err := c.Job(strings.Repeat("k", pglock.MaxKeyLength+1), fn, pglock.WithoutOverlapping())
			return err
		}, pglock.ErrInvalidKey},
		{"JobKeyWithNUL", "", func(t *testing.T, c *pglock.Client) error {
			_, err := c.Job("nightly\x00", fn, pglock.OnOneInstance())
			return err
		}, pglock.ErrInvalidKey},
		{"JobNilFn", "nightly", func(t *testing.T, c *pglock.Client) error {
			_, err := c.Job("nightly", nil, pglock.OnOneInstance())
			return err
		}, pglock.ErrInvalidArgument},
		{"JobNoOption", "nightly", func(t *testing.T, c *pglock.Client) error {
			_, err := c.Job("nightly", fn)
			return err
		}, pglock.ErrInvalidArgument},
		{"JobTTLOnlyIsNoOption", "nightly", func(t *testing.T, c *pglock.Client) error {
			_, err := c.Job("nightly", fn, pglock.TTL(time.Second))
			return err
		}, pglock.ErrInvalidArgument},
		{"JobNilOption", "nightly", func(t *testing.T, c *pglock.Client) error {
			_, err := c.Job("nightly", fn, pglock.OnOneInstance(), nil)
			return err
		}, pglock.ErrInvalidArgument},
		{"JobTTLZero", "nightly", func(t *testing.T, c *pglock.Client) error {
			_, err := c.Job("nightly", fn, pglock.OnOneInstance(), pglock.TTL(0))
			return err
		}, pglock.ErrInvalidArgument},
		{"JobTTLNegative", "nightly", func(t *testing.T, c *pglock.Client) error {
			_, err := c.Job("nightly", fn, pglock.OnOneInstance(), pglock.TTL(-time.Second))
			return err
		}, pglock.ErrInvalidArgument},
		{"JobTTLOverAYear", "nightly", func(t *testing.T, c *pglock.Client) error {
			_, err := c.Job("nightly", fn, pglock.WithoutOverlapping(), pglock.TTL(pglock.MaxTTL+time.Millisecond))
			return err
		}, pglock.ErrInvalidArgument},
		{"GocronElectorEmptyKey", "", func(t *testing.T, c *pglock.Client) error {
			_, err := c.GocronElector("")
			return err
		}, pglock.ErrInvalidKey},
		{"GocronElectorKeyTooLong", "", func(t *testing.T, c *pglock.Client) error {
			_, err := c.GocronElector(strings.Repeat("é", pglock.MaxKeyLength+1))
			return err
		}, pglock.ErrInvalidKey},
		{"GocronElectorBadTTL", "nightly", func(t *testing.T, c *pglock.Client) error {
			_, err := c.GocronElector("nightly", pglock.TTL(0))
			return err
		}, pglock.ErrInvalidArgument},
		{"GocronElectorNilOption", "nightly", func(t *testing.T, c *pglock.Client) error {
			_, err := c.GocronElector("nightly", nil)
			return err
		}, pglock.ErrInvalidArgument},
		{"GocronLockerBadTTL", "", func(t *testing.T, c *pglock.Client) error {
			_, err := c.GocronLocker(pglock.TTL(pglock.MaxTTL + time.Millisecond))
			return err
		}, pglock.ErrInvalidArgument},
		{"GocronLockerNilOption", "", func(t *testing.T, c *pglock.Client) error {
			_, err := c.GocronLocker(nil)
			return err
		}, pglock.ErrInvalidArgument},
		{"GocronLockerEmptyJobName", "", func(t *testing.T, c *pglock.Client) error {
			locker, err := c.GocronLocker()
			require.NoError(t, err)
			_, err = locker.Lock(t.Context(), "")
			return err
		}, pglock.ErrInvalidKey},
		{"GocronLockerLeaseKeyTooLong", "", func(t *testing.T, c *pglock.Client) error {
			locker, err := c.GocronLocker()
			require.NoError(t, err)
			_, err = locker.Lock(t.Context(), longest+"é")
			return err
		}, pglock.ErrInvalidKey},
	}
	requireBadInputRefused(t, store, cases, func(c *pglock.Client, key string) error {
		_, err := c.Job(key, fn, pglock.OnOneInstance())
		return err
	})
	// The longest key whose lease key fits is fine.
	_, err := newClient(t, store, quiet).Job(longest, fn, pglock.OnOneInstance())
	require.NoError(t, err)
	require.Empty(t, lockKeys(t, pool))
}
