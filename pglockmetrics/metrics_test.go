package pglockmetrics_test

import (
	"context"
	"errors"
	"log/slog"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/goleak"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/pglockmetrics"
	"github.com/pgfence/pglock/pglocktest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var discard = slog.New(slog.DiscardHandler)

// failingQueryer fails every renewal statement (lock_renew, lock_renew_many) of the
// store on it while failing is set.
type failingQueryer struct {
	pglock.Queryer
	failing atomic.Bool
}

var errDown = errors.New("store down")

func (q *failingQueryer) renewal(sql string) bool {
	return q.failing.Load() && strings.Contains(sql, "pglock.lock_renew")
}

func (q *failingQueryer) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if q.renewal(sql) {
		return errRow{}
	}
	return q.Queryer.QueryRow(ctx, sql, args...)
}

func (q *failingQueryer) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if q.renewal(sql) {
		return nil, errDown
	}
	return q.Queryer.Query(ctx, sql, args...)
}

// errRow is a row whose Scan fails with errDown.
type errRow struct{}

func (errRow) Scan(...any) error { return errDown }

// events counts a client's events, to check the metrics against.
type events struct {
	mu   sync.Mutex
	list []pglock.Event
}

func (e *events) add(ev pglock.Event) {
	e.mu.Lock()
	e.list = append(e.list, ev)
	e.mu.Unlock()
}

func (e *events) count(match func(pglock.Event) bool) int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	var n int64
	for _, ev := range e.list {
		if match(ev) {
			n++
		}
	}
	return n
}

func receive[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		require.FailNow(t, "nothing received in time")
		var zero T
		return zero
	}
}

// Two instances on the real database acquire, wait, release, lose locks both ways, fail
// renewals, run and skip a job and lead an election; a ManualReader reads back what the
// metrics recorded, with bounded attributes only.
func TestMetricsRecordWhatTheClientsDo(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	m, reader := newMetrics(t)

	pool := pglocktest.Postgres(t)
	quiet := pglock.WithLogger(discard)
	var seen events
	// a is a paused instance: its clock moves only when the test says so.
	clock := pglocktest.NewManualClock(time.Now())
	store := &failingQueryer{Queryer: pool}
	a, err := pglock.NewWithStore(pglock.NewPostgresStore(store), quiet, pglock.TTL(time.Second), pglock.WithClock(clock),
		pglock.WithEventHandler(m.Handle), pglock.WithEventHandler(seen.add))
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close(context.Background()) })
	b, err := pglock.NewWithStore(pglock.NewPostgresStore(pool), quiet,
		pglock.WithEventHandler(m.Handle), pglock.WithEventHandler(seen.add))
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	defer m.Observe(a)()
	defer m.Observe(b)()
	k1, k2 := t.Name()+":k1", t.Name()+":k2"

	// Lost, expired: a's renewals fail until its deadline. The lock's ttl of a minute
	// keeps it live on the database clock until its first renewal, however late a loaded
	// machine sends it (at 1 s, a stall of a second would have it refused).
	_, err = a.TryAcquire(ctx, k1, pglock.TTL(time.Minute))
	require.NoError(t, err)
	clock.Advance(20 * time.Second) // renewed
	store.failing.Store(true)
	clock.Advance(time.Minute) // failing renewals, then the deadline
	store.failing.Store(false)

	// Lost, refused: a pauses, the database expires its lock, b takes it, and a's next
	// renewal is refused.
	_, err = a.TryAcquire(ctx, k2)
	require.NoError(t, err)
	l, err := b.Acquire(ctx, k2, pglock.Wait(10*time.Second))
	require.NoError(t, err)
	clock.Advance(400 * time.Millisecond)

	// Acquisitions that fail, for each reason but closed, and a release.
	_, err = b.TryAcquire(ctx, k2)
	require.ErrorIs(t, err, pglock.ErrNotAcquired)
	_, err = b.Acquire(ctx, k2, pglock.Wait(50*time.Millisecond))
	require.ErrorIs(t, err, pglock.ErrNotAcquired)
	_, err = b.TryAcquire(ctx, "")
	require.ErrorIs(t, err, pglock.ErrInvalidKey)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = b.TryAcquire(cancelled, t.Name()+":k3")
	require.ErrorIs(t, err, context.Canceled)
	require.NoError(t, l.Release(ctx))

	// A job: a run that is skipped on a while b runs it, a run that fails.
	const job = "reports:nightly"
	entered, finish := make(chan struct{}), make(chan error)
	jb, err := b.Job(job, func(context.Context) error {
		entered <- struct{}{}
		return <-finish
	}, pglock.WithoutOverlapping())
	require.NoError(t, err)
	ja, err := a.Job(job, func(context.Context) error { return nil }, pglock.WithoutOverlapping())
	require.NoError(t, err)
	ran := make(chan error, 1)
	go func() { ran <- jb.Run(ctx) }()
	receive(t, entered)
	require.NoError(t, ja.Run(ctx)) // skipped: b's run is in progress
	finish <- nil
	require.NoError(t, receive(t, ran))
	go func() { ran <- jb.Run(ctx) }()
	receive(t, entered)
	finish <- errors.New("report failed")
	require.Error(t, receive(t, ran))

	// An election b leads.
	led := make(chan struct{})
	_, err = b.Elect(t.Name()+":leader", pglock.LeaderCallbacks{OnAcquired: func(context.Context, *pglock.Lock) error {
		close(led)
		return nil
	}})
	require.NoError(t, err)
	receive(t, led)

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	got := read(t, rm)
	require.Equal(t, map[string]int64{"kind=lock": 1, "kind=permit": 0}, got.gauges["pglock.locks.held"], "the election's lease")
	require.Equal(t, map[string]int64{"": 1}, got.gauges["pglock.elections.led"])

	require.NoError(t, a.Close(ctx))
	require.NoError(t, b.Close(ctx)) // hands the lease back: a release
	require.NoError(t, reader.Collect(ctx, &rm))
	got = read(t, rm)

	require.Equal(t, map[string]int64{
		"kind=lock,outcome=acquired":     6, // a: k1, k2; b: k2, two runs, the election
		"kind=lock,outcome=not_acquired": 3, // b: k2 twice; a: the skipped run
		"kind=lock,outcome=invalid":      1,
		"kind=lock,outcome=canceled":     1,
		"kind=lock,outcome=closed":       0, // every outcome of both kinds from the start
		"kind=lock,outcome=error":        0,
		"kind=permit,outcome=acquired":   0, "kind=permit,outcome=not_acquired": 0, "kind=permit,outcome=invalid": 0,
		"kind=permit,outcome=canceled": 0, "kind=permit,outcome=closed": 0, "kind=permit,outcome=error": 0,
	}, got.sums["pglock.acquisitions"])
	require.Equal(t, map[string]int64{"kind=lock": 4, "kind=permit": 0}, got.sums["pglock.releases"], "k2, two runs, the lease")
	require.Equal(t, map[string]int64{"kind=lock,reason=expired": 1, "kind=lock,reason=refused": 1, "kind=lock,reason=release-refused": 0,
		"kind=permit,reason=expired": 0, "kind=permit,reason=refused": 0, "kind=permit,reason=release-refused": 0}, got.sums["pglock.locks.lost"])
	failures := seen.count(func(e pglock.Event) bool { return e.Type == pglock.EventRenewal && e.Err != nil })
	require.Positive(t, failures)
	require.Equal(t, map[string]int64{"": failures}, got.sums["pglock.renewal.failures"])
	require.Equal(t, map[string]int64{
		"pglock.job.name=reports:nightly,reason=run-in-progress": 1,
		"pglock.job.name=reports:nightly,reason=other-instance":  0, // from the job's registration
		"pglock.job.name=reports:nightly,reason=limit-reached":   0,
		"pglock.job.name=reports:nightly,reason=lease-in-doubt":  0,
	}, got.sums["pglock.job.skips"])
	require.Equal(t, map[string]int64{
		"outcome=ok,pglock.job.name=reports:nightly":       1,
		"outcome=error,pglock.job.name=reports:nightly":    1,
		"outcome=panicked,pglock.job.name=reports:nightly": 0,
		"outcome=lost,pglock.job.name=reports:nightly":     0,
	}, got.sums["pglock.job.runs"])

	require.Equal(t, map[string]uint64{"kind=lock": 6}, got.counts["pglock.acquire.duration"])
	require.Equal(t, map[string]uint64{
		"kind=lock,outcome=acquired": 6, "kind=lock,outcome=not_acquired": 3, "kind=lock,outcome=invalid": 1, "kind=lock,outcome=canceled": 1,
	}, got.counts["pglock.acquire.wait"])
	renewals := seen.count(func(e pglock.Event) bool { return e.Type == pglock.EventRenewal })
	require.Equal(t, map[string]uint64{"": uint64(renewals)}, got.counts["pglock.renewal.duration"])
	require.Equal(t, map[string]uint64{"pglock.job.name=reports:nightly": 2}, got.counts["pglock.job.duration"])
	require.Greater(t, got.waitOver50ms, uint64(0), "the Acquire that waited 50 ms is in a bucket above 25 ms")

	for name, unit := range map[string]string{"pglock.acquire.duration": "s", "pglock.acquire.wait": "s",
		"pglock.renewal.duration": "s", "pglock.job.duration": "s", "pglock.acquisitions": "{acquisition}",
		"pglock.locks.held": "{lock}", "pglock.elections.led": "{election}"} {
		require.Equal(t, unit, got.units[name], name)
	}
	// Attributes are bounded: never a lock's key.
	for _, kv := range got.attributes {
		require.Contains(t, []attribute.Key{"kind", "outcome", "reason", "pglock.job.name"}, kv.Key)
		require.NotContains(t, kv.Value.String(), t.Name())
	}
}

// A semaphore's permits are counted apart from locks (kind=permit), never by key or
// permit number, and a job with AtMost skips a tick as limit-reached, counted from its
// registration at 0.
func TestMetricsShowPermitsApartFromLocks(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	m, reader := newMetrics(t)
	c, err := pglock.New(pglocktest.Postgres(t), pglock.WithLogger(discard), pglock.WithEventHandler(m.Handle))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	defer m.Observe(c)()
	collect := func() collected {
		t.Helper()
		var rm metricdata.ResourceMetrics
		require.NoError(t, reader.Collect(ctx, &rm))
		return read(t, rm)
	}

	exports, err := c.Semaphore(t.Name()+":exports", 2)
	require.NoError(t, err)
	first, err := exports.TryAcquire(ctx)
	require.NoError(t, err)
	_, err = exports.Acquire(ctx) // the second permit, kept till Close
	require.NoError(t, err)
	_, err = exports.TryAcquire(ctx)
	require.ErrorIs(t, err, pglock.ErrNotAcquired, "both permits are held")
	_, err = exports.Acquire(ctx, pglock.Wait(50*time.Millisecond))
	require.ErrorIs(t, err, pglock.ErrNotAcquired)
	lock, err := c.TryAcquire(ctx, t.Name()+":lock")
	require.NoError(t, err)

	// A job with AtMost(1) whose one permit another holder has: its tick is skipped.
	const job = "reports:limited"
	j, err := c.Job(job, func(context.Context) error { return nil }, pglock.AtMost(1))
	require.NoError(t, err)
	got := collect()
	require.Equal(t, int64(0), got.sums["pglock.job.skips"]["pglock.job.name="+job+",reason=limit-reached"], "from the registration on")
	jobSem, err := c.Semaphore(job, 1)
	require.NoError(t, err)
	held, err := jobSem.TryAcquire(ctx)
	require.NoError(t, err)
	require.NoError(t, j.Run(ctx))
	got = collect()
	require.Equal(t, map[string]int64{"kind=lock": 1, "kind=permit": 3}, got.gauges["pglock.locks.held"])
	require.NoError(t, held.Release(ctx))
	require.NoError(t, first.Release(ctx))
	require.NoError(t, lock.Release(ctx))

	require.Eventually(t, func() bool { // the events reach the handler on the client's goroutine
		got = collect()
		return got.sums["pglock.releases"]["kind=lock"] == 1 && got.sums["pglock.releases"]["kind=permit"] == 2
	}, 10*time.Second, 10*time.Millisecond, "the releases counted")
	require.Equal(t, map[string]int64{"kind=lock": 0, "kind=permit": 1}, got.gauges["pglock.locks.held"])
	acq := got.sums["pglock.acquisitions"]
	require.Equal(t, int64(3), acq["kind=permit,outcome=acquired"], "two of exports, one of the job's")
	require.Equal(t, int64(3), acq["kind=permit,outcome=not_acquired"], "exports full twice, the job's limit once")
	require.Equal(t, int64(1), acq["kind=lock,outcome=acquired"])
	require.Equal(t, int64(0), acq["kind=lock,outcome=not_acquired"])
	require.Equal(t, map[string]int64{"kind=lock": 1, "kind=permit": 2}, got.sums["pglock.releases"])
	require.Equal(t, map[string]uint64{"kind=lock": 1, "kind=permit": 3}, got.counts["pglock.acquire.duration"])
	require.Equal(t, map[string]int64{
		"pglock.job.name=" + job + ",reason=limit-reached": 1, "pglock.job.name=" + job + ",reason=other-instance": 0,
		"pglock.job.name=" + job + ",reason=run-in-progress": 0, "pglock.job.name=" + job + ",reason=lease-in-doubt": 0,
	}, got.sums["pglock.job.skips"])
	for _, kv := range got.attributes {
		require.Contains(t, []attribute.Key{"kind", "outcome", "reason", "pglock.job.name"}, kv.Key)
		require.NotContains(t, kv.Value.String(), t.Name(), "never a semaphore's key")
	}
}

// newMetrics returns Metrics on a meter provider of their own, shut down when the test
// ends, and the reader that collects what they recorded.
func newMetrics(t *testing.T) (*pglockmetrics.Metrics, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { require.NoError(t, mp.Shutdown(context.Background())) })
	m, err := pglockmetrics.New(mp)
	require.NoError(t, err)
	return m, reader
}

// Events dropped because a handler was too slow are counted, and the count stays when
// the client is no longer observed: a counter never goes back.
func TestMetricsCountDroppedEvents(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	m, reader := newMetrics(t)
	unblock, first := make(chan struct{}), make(chan struct{})
	var once sync.Once
	c, err := pglock.NewWithStore(pglock.NewMemoryStore(nil), pglock.WithLogger(discard),
		pglock.WithEventHandler(func(pglock.Event) {
			once.Do(func() { close(first); <-unblock })
		}))
	require.NoError(t, err)
	stop := m.Observe(c)
	collect := func() int64 {
		var rm metricdata.ResourceMetrics
		require.NoError(t, reader.Collect(ctx, &rm))
		got := read(t, rm)
		require.Equal(t, "{event}", got.units["pglock.events.dropped"])
		return got.sums["pglock.events.dropped"][""]
	}
	require.Zero(t, collect())

	// Each TryAcquire of an empty key emits one event and never reaches the store.
	_, err = c.TryAcquire(ctx, "")
	require.ErrorIs(t, err, pglock.ErrInvalidKey)
	receive(t, first) // the handler holds the first event
	const calls = 5000
	for range calls {
		_, err = c.TryAcquire(ctx, "")
		require.ErrorIs(t, err, pglock.ErrInvalidKey)
	}
	dropped := c.Health().EventsDropped
	require.Positive(t, dropped, "%d events behind a blocked handler", calls)
	require.Equal(t, dropped, collect())

	stop()
	close(unblock)
	require.NoError(t, c.Close(ctx))
	require.Equal(t, dropped, collect(), "the count stays once the client is no longer observed")
}

// collected is what a Collect read, by instrument: each data point's value (sums,
// gauges) or count (histograms), by its attributes as "k=v,k=v".
type collected struct {
	sums, gauges map[string]map[string]int64
	counts       map[string]map[string]uint64
	units        map[string]string
	attributes   []attribute.KeyValue
	waitOver50ms uint64
}

func read(t *testing.T, rm metricdata.ResourceMetrics) collected {
	t.Helper()
	c := collected{sums: map[string]map[string]int64{}, gauges: map[string]map[string]int64{},
		counts: map[string]map[string]uint64{}, units: map[string]string{}}
	for _, sm := range rm.ScopeMetrics {
		require.Equal(t, pglockmetrics.ScopeName, sm.Scope.Name)
		for _, mt := range sm.Metrics {
			c.units[mt.Name] = mt.Unit
			switch d := mt.Data.(type) {
			case metricdata.Sum[int64]:
				require.True(t, d.IsMonotonic, mt.Name)
				c.sums[mt.Name] = map[string]int64{}
				for _, p := range d.DataPoints {
					c.sums[mt.Name][c.key(p.Attributes)] += p.Value
				}
			case metricdata.Gauge[int64]:
				c.gauges[mt.Name] = map[string]int64{}
				for _, p := range d.DataPoints {
					c.gauges[mt.Name][c.key(p.Attributes)] += p.Value
				}
			case metricdata.Histogram[float64]:
				c.counts[mt.Name] = map[string]uint64{}
				for _, p := range d.DataPoints {
					c.counts[mt.Name][c.key(p.Attributes)] += p.Count
					if mt.Name == "pglock.acquire.wait" && p.Attributes.HasValue("outcome") {
						if v, _ := p.Attributes.Value("outcome"); v.AsString() == pglockmetrics.OutcomeNotAcquired {
							for i, b := range p.Bounds {
								if b >= 0.025 {
									c.waitOver50ms += p.BucketCounts[i+1]
								}
							}
						}
					}
				}
			default:
				t.Fatalf("%s: unexpected data %T", mt.Name, mt.Data)
			}
		}
	}
	return c
}

func (c *collected) key(set attribute.Set) string {
	kvs := set.ToSlice()
	c.attributes = append(c.attributes, kvs...)
	parts := make([]string, len(kvs))
	for i, kv := range kvs {
		parts[i] = string(kv.Key) + "=" + kv.Value.String()
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// The pglock package itself depends on no telemetry library: only this one does.
func TestPglockImportsNoTelemetry(t *testing.T) {
	t.Parallel()
	out, err := exec.CommandContext(t.Context(), "go", "list", "-deps", "github.com/pgfence/pglock").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "github.com/jackc/pgx/v5\n")
	for _, dep := range strings.Fields(string(out)) {
		require.False(t, strings.HasPrefix(dep, "go.opentelemetry.io/") || strings.HasPrefix(dep, "github.com/prometheus/"), dep)
	}
}

// A job's slots show in its skips (claimed by another tick, missed: as many as the
// event counts) and its retries.
func TestMetricsCountSlots(t *testing.T) {
	t.Parallel()
	m, reader := newMetrics(t)
	job := "exports:nightly"
	slot := time.Date(2026, 1, 2, 2, 0, 0, 0, time.UTC)
	for _, ev := range []pglock.Event{
		{Type: pglock.EventJobSkipped, Key: job, SkipReason: pglock.SkipSlotClaimed, Slot: slot, Count: 1},
		{Type: pglock.EventJobSkipped, Key: job, SkipReason: pglock.SkipSlotMissed, Slot: slot, Count: 5},
		{Type: pglock.EventJobSkipped, Key: job, SkipReason: pglock.SkipOtherInstance}, // Count unset: one tick
		{Type: pglock.EventJobRan, Key: job, Outcome: pglock.OutcomeError, Slot: slot, Attempt: 1},
		{Type: pglock.EventJobRan, Key: job, Outcome: pglock.OutcomeOK, Slot: slot, Attempt: 2},
	} {
		m.Handle(ev)
	}
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(t.Context(), &rm))
	got := read(t, rm)
	name := "pglock.job.name=" + job
	require.Equal(t, map[string]int64{name + ",reason=other-instance": 1, name + ",reason=slot-claimed": 1,
		name + ",reason=slot-missed": 5}, got.sums["pglock.job.skips"])
	require.Equal(t, map[string]int64{name: 1}, got.sums["pglock.job.retries"])
	require.Equal(t, "{run}", got.units["pglock.job.retries"])
}
