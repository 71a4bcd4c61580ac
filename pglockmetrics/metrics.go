// Package pglockmetrics records what a pglock.Client does as OpenTelemetry metrics. It
// is a package of its own so that the pglock package depends on no telemetry library.
//
//	m, err := pglockmetrics.New(meterProvider) // nil: the global one
//	client, err := pglock.New(pool, pglock.WithEventHandler(m.Handle))
//	stop := m.Observe(client) // the gauges; call stop after client.Close
//
// # Instruments
//
// Counters:
//   - pglock.acquisitions {acquisition}, by kind and outcome: acquired, not_acquired (the
//     key was held, or every permit of the semaphore, for the whole wait), canceled (the
//     caller's ctx ended), closed, invalid (bad input), error (the store's);
//   - pglock.releases {release}, by kind;
//   - pglock.locks.lost {lock}, by kind and reason (pglock.LostReason: expired, refused, ...);
//   - pglock.renewal.failures {call}: renewal calls that failed (a lock is lost only if
//     they go on failing until its deadline);
//   - pglock.job.runs {run}, by pglock.job.name and outcome (pglock.Outcome);
//   - pglock.job.skips {tick}, by pglock.job.name and reason (pglock.SkipReason): ticks skipped, and the
//     slots of a job with a schedule that another tick claimed (slot-claimed) or
//     nobody ran (slot-missed);
//   - pglock.job.retries {run}, by pglock.job.name: runs that were a slot's attempt
//     after the first (pglock.AtLeastOnce).
//
// (The slots' skip reasons and retries appear at their first count, so that a job
// without a schedule has no series for them.)
//
// The counters an alert watches exist from the start, at 0: every acquisition outcome,
// releases, the reasons a lock is lost (expired, refused, release-refused), each of
// both kinds, and renewal failures from New; a job's runs by every outcome and skips by
// every reason (limit-reached too, for a job with pglock.AtMost) from its
// registration on an observed client (pglock.EventJobRegistered), before its first run.
// So increase(pglock_locks_lost_total[5m]) sees the first lost lock, and a job that
// never runs has series that stay at 0.
//
// Histograms, in seconds:
//   - pglock.acquire.duration: the store call that took a lock, by kind;
//   - pglock.acquire.wait: from an Acquire, TryAcquire or WithLock call (a Semaphore's
//     too) to the lock, or to giving up, by kind and outcome;
//   - pglock.renewal.duration: one renewal call, which renews every lock of a ttl;
//   - pglock.job.duration: a job's run, by pglock.job.name.
//
// Gauges, from Client.Health: pglock.locks.held {lock}, by kind, and
// pglock.elections.led {election}, summed over the observed clients.
//
// A counter from Client.Health: pglock.events.dropped {event}, the events the observed
// clients dropped because their handlers were too slow (see pglock.WithEventHandler),
// since each was created; a client that stops being observed keeps its count in it.
//
// # Attributes
//
// Attributes come from small fixed sets, so that a series never exists per lock: a lock's
// key is never one, nor a semaphore's, nor a permit's number. kind is lock (a lock of a
// key: a caller's, a job's run lock or lease, an election's) or permit (a permit of a
// semaphore, pglock.Client.Semaphore, or of a job with pglock.AtMost): the two add up
// to what a dashboard showed before semaphores. Jobs are named by their key (or gocron job name) because jobs are
// registered on the client, a few per application. The job's attribute is
// pglock.job.name (as OpenTelemetry names k8s.job.name), pglock_job_name in Prometheus:
// never job or instance, the labels Prometheus gives every series it scrapes, which
// would rename a library's own to exported_job.
package pglockmetrics

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/pgfence/pglock"
)

// ScopeName is the name of the meter the instruments belong to: the package's import
// path, as OpenTelemetry's instrumentation packages name theirs.
const ScopeName = "github.com/pgfence/pglock/pglockmetrics"

// Acquisition outcomes: the values of the outcome attribute of pglock.acquisitions and
// pglock.acquire.wait.
const (
	OutcomeAcquired    = "acquired"
	OutcomeNotAcquired = "not_acquired"
	OutcomeCanceled    = "canceled"
	OutcomeClosed      = "closed"
	OutcomeInvalid     = "invalid"
	OutcomeError       = "error"
)

// jobAttribute is the attribute that names a job: its key (or gocron job name).
const jobAttribute = "pglock.job.name"

// Kinds: the values of the kind attribute.
const (
	KindLock   = "lock"   // a lock of a key
	KindPermit = "permit" // a permit of a semaphore
)

var kinds = []string{KindLock, KindPermit}

// lostReasons are the reasons a lock is lost.
var lostReasons = []pglock.LostReason{pglock.LostExpired, pglock.LostRefused, pglock.LostReleaseRefused}

// jobOutcomes and skipReasons are a job's runs' outcomes and its ticks' skip reasons.
var (
	jobOutcomes = []pglock.Outcome{pglock.OutcomeOK, pglock.OutcomeError, pglock.OutcomePanicked, pglock.OutcomeLost}
	skipReasons = []pglock.SkipReason{pglock.SkipOtherInstance, pglock.SkipRunInProgress, pglock.SkipLimitReached,
		pglock.SkipLeaseInDoubt}
)

// buckets are the histograms' bounds, in seconds: from a millisecond (a store call on a
// near database) to ten minutes (a long wait or job run).
var buckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}

// Metrics records pglock's events and health as OpenTelemetry metrics. Its methods are
// safe for concurrent use.
type Metrics struct {
	acquisitions    metric.Int64Counter
	releases        metric.Int64Counter
	lost            metric.Int64Counter
	renewalFailures metric.Int64Counter
	jobRuns         metric.Int64Counter
	jobSkips        metric.Int64Counter
	jobRetries      metric.Int64Counter
	acquireDuration metric.Float64Histogram
	acquireWait     metric.Float64Histogram
	renewalDuration metric.Float64Histogram
	jobDuration     metric.Float64Histogram
	held            metric.Int64ObservableGauge
	led             metric.Int64ObservableGauge
	dropped         metric.Int64ObservableCounter

	mu      sync.Mutex
	clients map[*observed]struct{}
	gone    int64 // the events dropped by the clients no longer observed
}

type observed struct{ c *pglock.Client }

// New creates the instruments on a meter of mp (the global MeterProvider when mp is
// nil). It returns the meter's error when an instrument or the gauges' callback cannot
// be created.
func New(mp metric.MeterProvider) (*Metrics, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	meter := mp.Meter(ScopeName)
	m := &Metrics{clients: make(map[*observed]struct{})}
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := meter.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	histogram := func(name, desc string) metric.Float64Histogram {
		h, err := meter.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(buckets...))
		errs = append(errs, err)
		return h
	}
	gauge := func(name, unit, desc string) metric.Int64ObservableGauge {
		g, err := meter.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	m.acquisitions = counter("pglock.acquisitions", "{acquisition}", "Lock acquisitions that ended, by outcome.")
	m.releases = counter("pglock.releases", "{release}", "Locks released.")
	m.lost = counter("pglock.locks.lost", "{lock}", "Locks lost before their release, by reason.")
	m.renewalFailures = counter("pglock.renewal.failures", "{call}", "Renewal calls that failed.")
	m.jobRuns = counter("pglock.job.runs", "{run}", "Job runs, by job and outcome.")
	m.jobSkips = counter("pglock.job.skips", "{tick}", "Job ticks skipped, or slots missed, by job and reason.")
	m.jobRetries = counter("pglock.job.retries", "{run}", "Job runs that were a slot's retry, by job.")
	m.acquireDuration = histogram("pglock.acquire.duration", "Latency of the store call that took a lock.")
	m.acquireWait = histogram("pglock.acquire.wait", "Time from an acquisition call to the lock or to giving up, by outcome.")
	m.renewalDuration = histogram("pglock.renewal.duration", "Latency of one renewal call.")
	m.jobDuration = histogram("pglock.job.duration", "Duration of a job's run, by job.")
	m.held = gauge("pglock.locks.held", "{lock}", "Locks and permits held now, by kind.")
	m.led = gauge("pglock.elections.led", "{election}", "Elections led now.")
	var err error
	m.dropped, err = meter.Int64ObservableCounter("pglock.events.dropped", metric.WithUnit("{event}"),
		metric.WithDescription("Events dropped because the client's event handlers were too slow."))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("pglockmetrics: %w", err)
	}
	if _, err := meter.RegisterCallback(m.observe, m.held, m.led, m.dropped); err != nil {
		return nil, fmt.Errorf("pglockmetrics: %w", err)
	}
	// The counters an alert watches, at 0 from the start (an absent series is no
	// increase, and the first event would go unseen).
	ctx := context.Background()
	for _, k := range kinds {
		kind := attribute.String("kind", k)
		for _, o := range []string{OutcomeAcquired, OutcomeNotAcquired, OutcomeCanceled, OutcomeClosed, OutcomeInvalid, OutcomeError} {
			m.acquisitions.Add(ctx, 0, metric.WithAttributes(kind, attribute.String("outcome", o)))
		}
		m.releases.Add(ctx, 0, metric.WithAttributes(kind))
		for _, r := range lostReasons {
			m.lost.Add(ctx, 0, metric.WithAttributes(kind, attribute.String("reason", string(r))))
		}
	}
	m.renewalFailures.Add(ctx, 0)
	return m, nil
}

// Handle records ev. Give it to pglock.WithEventHandler.
func (m *Metrics) Handle(ev pglock.Event) {
	ctx := context.Background()
	switch ev.Type {
	case pglock.EventAcquired:
		kind := kindOf(ev)
		set := metric.WithAttributeSet(attribute.NewSet(kind, attribute.String("outcome", OutcomeAcquired)))
		m.acquisitions.Add(ctx, 1, set)
		m.acquireWait.Record(ctx, ev.Wait.Seconds(), set)
		m.acquireDuration.Record(ctx, ev.Duration.Seconds(), metric.WithAttributes(kind))
	case pglock.EventAcquireFailed:
		set := metric.WithAttributeSet(attribute.NewSet(kindOf(ev), attribute.String("outcome", acquireOutcome(ev.Err))))
		m.acquisitions.Add(ctx, 1, set)
		m.acquireWait.Record(ctx, ev.Wait.Seconds(), set)
	case pglock.EventReleased:
		m.releases.Add(ctx, 1, metric.WithAttributes(kindOf(ev)))
	case pglock.EventLost:
		m.lost.Add(ctx, 1, metric.WithAttributes(kindOf(ev), attribute.String("reason", string(ev.LostReason))))
	case pglock.EventRenewal:
		m.renewalDuration.Record(ctx, ev.Duration.Seconds())
		if ev.Err != nil {
			m.renewalFailures.Add(ctx, 1)
		}
	case pglock.EventJobRegistered:
		job := attribute.String(jobAttribute, ev.Key)
		for _, o := range jobOutcomes {
			m.jobRuns.Add(ctx, 0, metric.WithAttributes(job, attribute.String("outcome", string(o))))
		}
		for _, r := range skipReasons {
			m.jobSkips.Add(ctx, 0, metric.WithAttributes(job, attribute.String("reason", string(r))))
		}
	case pglock.EventJobRan:
		outcome := string(ev.Outcome)
		if outcome == "" {
			outcome = "unknown"
		}
		job := attribute.String(jobAttribute, ev.Key)
		m.jobRuns.Add(ctx, 1, metric.WithAttributes(job, attribute.String("outcome", outcome)))
		m.jobDuration.Record(ctx, ev.Duration.Seconds(), metric.WithAttributes(job))
		if ev.Attempt > 1 {
			m.jobRetries.Add(ctx, 1, metric.WithAttributes(job))
		}
	case pglock.EventJobSkipped:
		m.jobSkips.Add(ctx, int64(max(ev.Count, 1)), metric.WithAttributes(attribute.String(jobAttribute, ev.Key),
			attribute.String("reason", string(ev.SkipReason))))
	}
}

// kindOf is the kind attribute of an event about a lock or a permit.
func kindOf(ev pglock.Event) attribute.KeyValue {
	if ev.Permit > 0 || ev.Permits > 0 {
		return attribute.String("kind", KindPermit)
	}
	return attribute.String("kind", KindLock)
}

// acquireOutcome classifies why an acquisition failed.
func acquireOutcome(err error) string {
	switch { // a wait cut short by its ctx wraps ErrNotAcquired too: canceled comes first
	case errors.Is(err, pglock.ErrClosed):
		return OutcomeClosed
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return OutcomeCanceled
	case errors.Is(err, pglock.ErrNotAcquired):
		return OutcomeNotAcquired
	case errors.Is(err, pglock.ErrInvalidKey), errors.Is(err, pglock.ErrInvalidArgument):
		return OutcomeInvalid
	}
	return OutcomeError
}

// Observe adds c to the clients whose Health the gauges read, until stop is called
// (call it once c is closed; it is safe to call more than once).
func (m *Metrics) Observe(c *pglock.Client) (stop func()) {
	o := &observed{c: c}
	m.mu.Lock()
	m.clients[o] = struct{}{}
	m.mu.Unlock()
	return func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if _, ok := m.clients[o]; ok {
			delete(m.clients, o)
			m.gone += c.Health().EventsDropped
		}
	}
}

func (m *Metrics) observe(_ context.Context, o metric.Observer) error {
	m.mu.Lock()
	clients := make([]*pglock.Client, 0, len(m.clients))
	for c := range m.clients {
		clients = append(clients, c.c)
	}
	dropped := m.gone
	m.mu.Unlock()
	var locks, permits, led int64
	for _, c := range clients {
		h := c.Health()
		locks += int64(h.LocksHeld - h.PermitsHeld)
		permits += int64(h.PermitsHeld)
		led += int64(h.ElectionsLed)
		dropped += h.EventsDropped
	}
	o.ObserveInt64(m.held, locks, metric.WithAttributes(attribute.String("kind", KindLock)))
	o.ObserveInt64(m.held, permits, metric.WithAttributes(attribute.String("kind", KindPermit)))
	o.ObserveInt64(m.led, led)
	o.ObserveInt64(m.dropped, dropped)
	return nil
}
