package pglock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
	"unicode/utf8"
)

// leaseSuffix ends the key of a job's lease: the lease of job "k" is the lock "k:owner".
const leaseSuffix = ":owner"

// Why a job's tick was skipped, in the Reason of an EventJobSkipped.
const (
	// ReasonOtherInstance: another instance holds the job's lease (OnOneInstance,
	// GocronLocker) or leads (GocronElector).
	ReasonOtherInstance = "it runs on another instance"
	// ReasonRunInProgress: a run of the job still holds its run lock
	// (WithoutOverlapping), on this instance or another.
	ReasonRunInProgress = "a run is still in progress"
)

const (
	msgSkippedOtherInstance = "pglock: skipped job: " + ReasonOtherInstance
	msgSkippedRunInProgress = "pglock: skipped job: " + ReasonRunInProgress
)

// JobOption configures a Job. A Job needs OnOneInstance, WithoutOverlapping or both.
type JobOption func(*jobConfig) error

type jobConfig struct {
	oneInstance        bool
	withoutOverlapping bool
	ttl                time.Duration
}

// OnOneInstance runs the job on one instance: the first instance whose tick comes
// takes the job's lease, the lock "<key>:owner", and keeps it, renewed, between ticks
// for as long as its Client is up; it runs every tick. The other instances skip each
// tick. When the owner dies, its lease expires after the ttl, on the database clock,
// and the first tick after that, on any instance, takes the job over; when it closes
// its Client, it hands the lease back at once (see Client.Close). Missed ticks are not
// caught up.
func OnOneInstance() JobOption {
	return func(c *jobConfig) error {
		c.oneInstance = true
		return nil
	}
}

// WithoutOverlapping keeps a run from overlapping another run of the job: a run holds
// the run lock "<key>", renewed, from its start to its end, and a tick that finds it
// held is skipped, on this instance or any other. Without OnOneInstance it means "any
// instance, one run at a time".
func WithoutOverlapping() JobOption {
	return func(c *jobConfig) error {
		c.withoutOverlapping = true
		return nil
	}
}

// JobTTL sets the ttl of the job's lease and run lock, instead of the client's: between
// MinTTL and MaxTTL. A dead owner's job moves to another instance after about this
// long; locks are renewed every ttl/3, so a run may last longer than the ttl.
func JobTTL(ttl time.Duration) JobOption {
	return func(c *jobConfig) error {
		if err := checkTTL("JobTTL", ttl); err != nil {
			return err
		}
		c.ttl = ttl
		return nil
	}
}

// Job is a function that one tick of a schedule runs through pglock's locks: see
// Client.Job. Give Task to gocron, or call Run. It is safe for concurrent use.
type Job struct {
	c       *Client
	key     string
	fn      func(ctx context.Context) error
	ttl     time.Duration
	lease   *lease // nil without OnOneInstance
	runLock bool   // WithoutOverlapping
	runs    runs
}

// Job returns a Job that runs fn under key. key is required (a rename must not change
// it during a rolling deploy) and is checked as a lock key, its lease key "<key>:owner"
// included, so it has at most MaxKeyLength-6 characters. Give OnOneInstance,
// WithoutOverlapping or both; the ttl is the client's unless JobTTL sets it.
//
// Inside fn, FromContext(ctx) returns the run lock (with OnOneInstance alone, the
// lease), whose Token fences fn's writes; fn's ctx is cancelled, with a
// *LockLostError as its cause, when the run lock or the lease is lost.
//
// Keys are registered with the client: a second job with the same key, a job whose key
// is another job's lease key, or one that is a gocron elector's or an election's key,
// is refused, the error naming both. Errors match ErrInvalidKey, ErrInvalidArgument
// (nil fn, no option, a bad option, a taken key) or ErrClosed; nothing is registered
// then.
//
// Register the job with gocron in singleton mode (see JobOptions), so that gocron
// itself refuses an overlap inside one process.
//
// Client.Close shuts the job down: from its start, Run returns ErrClosed; it cancels
// the runs in progress (their ctx's cause is ErrClosed) and waits for them to return
// (bounded by its ctx), then hands the lease back, so that the next tick on another
// instance runs at once rather than after the ttl; when its ctx ends first, the lease
// is left to expire instead. A lease whose last
// run started less than a second before, on the client's clock, is kept for the rest of
// that second, so that instances firing the same tick a few milliseconds later skip it
// rather than run it again. An app shuts down in this order: the scheduler's Shutdown
// (no more ticks, running ones finish), then Client.Close, then the pool's Close.
func (c *Client) Job(key string, fn func(ctx context.Context) error, opts ...JobOption) (*Job, error) {
	if err := checkJobKey(key); err != nil {
		return nil, err
	}
	if fn == nil {
		return nil, invalidArg("Job %q: nil fn", key)
	}
	cfg := jobConfig{ttl: c.ttl}
	for _, opt := range opts {
		if opt == nil {
			return nil, invalidArg("Job %q: nil JobOption", key)
		}
		if err := opt(&cfg); err != nil {
			return nil, err
		}
	}
	if !cfg.oneInstance && !cfg.withoutOverlapping {
		return nil, invalidArg("Job %q: want OnOneInstance, WithoutOverlapping or both", key)
	}
	if err := c.register(fmt.Sprintf("job %q", key), key, key+leaseSuffix); err != nil {
		return nil, err
	}
	j := &Job{c: c, key: key, fn: fn, ttl: cfg.ttl, runLock: cfg.withoutOverlapping, runs: runs{c: c}}
	if cfg.oneInstance {
		j.lease = newLease(c, key, key+leaseSuffix, cfg.ttl)
	}
	c.onClose(func(ctx context.Context) error { return shutdown(ctx, &j.runs, j.lease) })
	return j, nil
}

// Key returns the job's key.
func (j *Job) Key() string { return j.key }

// Run runs one tick of the job through its locks: what gocron calls through Task, and
// what a test or an admin path calls directly. A skipped tick (another instance owns
// the job, or a run is in progress) returns nil; it is logged at debug and emitted as
// an EventJobSkipped, and a run as an EventJobRan. ctx bounds the store calls and is
// the parent of fn's ctx.
//
// It returns fn's error; a *LockLostError (ErrLockLost) when fn returned nil but a
// lock was lost during the run; ErrClosed once the client's Close has begun (no new run
// starts then, and an admin path calling Run can tell a shutdown from a skip); or a
// store error, when the tick could not tell whether to run.
func (j *Job) Run(ctx context.Context) error {
	if err := j.runs.start(); err != nil {
		return err
	}
	defer j.runs.end()
	if j.lease != nil {
		l, err := j.lease.hold(ctx)
		if errors.Is(err, ErrNotAcquired) {
			return nil
		}
		if err != nil {
			return err
		}
		var stop func()
		ctx, stop = withLockContext(ctx, l)
		defer stop()
	}
	if !j.runLock {
		ctx, s, err := j.c.enter(ctx)
		if err != nil {
			return err
		}
		defer j.c.leave(s)
		l, _ := FromContext(ctx)
		return j.run(ctx, l)
	}
	started := false
	err := j.c.WithLock(ctx, j.key, func(ctx context.Context) error {
		started = true
		l, _ := FromContext(ctx)
		return j.run(ctx, l)
	}, TTL(j.ttl), Wait(0))
	if !started && errors.Is(err, ErrNotAcquired) {
		j.c.skipped(j.key, msgSkippedRunInProgress, ReasonRunInProgress)
		return nil
	}
	return err
}

// run calls fn under l: the run lock, or the lease without WithoutOverlapping.
func (j *Job) run(ctx context.Context, l *Lock) error {
	if j.lease != nil {
		j.lease.ran()
	}
	err := j.fn(ctx)
	if cause := context.Cause(ctx); err == nil && errors.Is(cause, ErrLockLost) {
		err = cause
	}
	j.c.jobEvent(EventJobRan, j.key, l, "")
	return err
}

// checkJobKey checks a key whose lease key is key+leaseSuffix.
func checkJobKey(key string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if n := utf8.RuneCountInString(key + leaseSuffix); n > MaxKeyLength {
		return fmt.Errorf("%w: its lease key (the key and %q) would have %d characters, the most is %d",
			ErrInvalidKey, leaseSuffix, n, MaxKeyLength)
	}
	return nil
}

// jobEvent emits an event of job (a job key, a gocron job name or an elector key); l
// is the lock it ran under, nil for a skip.
func (c *Client) jobEvent(t EventType, job string, l *Lock, reason string) {
	ev := Event{Type: t, Key: job, Reason: reason, Time: c.clock.Now()}
	if l != nil {
		ev.Owner, ev.Token = l.Owner(), l.Token()
	}
	c.events.emit(ev)
}

// skipped reports a skipped tick of job: msg is the log message for reason.
func (c *Client) skipped(job, msg, reason string) {
	c.logger.Debug(msg, slog.String("key", job))
	c.jobEvent(EventJobSkipped, job, nil, reason)
}

// lease is the sticky lease of a job, of a gocron locker's job or of a gocron elector:
// taken by the first tick that finds it free, then kept, renewed by the client's
// renewer, between ticks, until it is lost (the next tick tries to take it again) or
// handed back at Close.
type lease struct {
	c      *Client
	job    string // what ticks under it, for logs and events
	key    string // the lease's own key
	ttl    time.Duration
	taking chan struct{} // one hold at a time: ticks that come together wait for a take rather than lose to it

	mu    sync.Mutex
	lock  *Lock     // nil until taken; not Held once lost
	ranAt time.Time // when the last run under it started, on the client's clock
}

func newLease(c *Client, job, key string, ttl time.Duration) *lease {
	return &lease{c: c, job: job, key: key, ttl: ttl, taking: make(chan struct{}, 1)}
}

// hold returns the lease for a tick: kept from an earlier tick, or taken now. When
// another instance holds it, the tick is skipped (logged and emitted) and the error
// matches ErrNotAcquired. ctx bounds the wait for a concurrent hold and the store call.
func (s *lease) hold(ctx context.Context) (*Lock, error) {
	if s.c.isClosed() {
		return nil, ErrClosed
	}
	select {
	case s.taking <- struct{}{}:
	default: // wait, unless ctx ends first; a held lease needs no live ctx
		select {
		case s.taking <- struct{}{}:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
	defer func() { <-s.taking }()
	s.mu.Lock()
	l := s.lock
	s.mu.Unlock()
	if l != nil && l.Held() {
		return l, nil
	}
	l, err := s.c.try(ctx, s.key, s.ttl)
	if errors.Is(err, ErrNotAcquired) {
		s.c.skipped(s.job, msgSkippedOtherInstance, ReasonOtherInstance)
	}
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.lock = l
	s.mu.Unlock()
	s.c.logger.Info("pglock: job runs on this instance", slog.String("key", s.job), slog.String("lease", s.key),
		slog.String("owner", l.Owner()), slog.Int64("token", l.Token()))
	return l, nil
}

// ran records that a run under the lease starts now.
func (s *lease) ran() {
	now := s.c.clock.Now()
	s.mu.Lock()
	s.ranAt = now
	s.mu.Unlock()
}

// handBack gives the lease back at Close. A lease whose last run started less than a
// second ago, on the client's clock, is kept for the rest of that second, so that
// instances firing the same tick a moment later skip it rather than run it again.
// ctx bounds that wait; the release runs detached from ctx's cancellation.
func (s *lease) handBack(ctx context.Context) error {
	s.mu.Lock()
	l, ranAt := s.lock, s.ranAt
	s.mu.Unlock()
	if l == nil || !l.Held() {
		return nil
	}
	if wait := ranAt.Add(time.Second).Sub(s.c.clock.Now()); wait > 0 {
		s.c.logger.Debug("pglock: keeping job lease until a second after its last run started",
			slog.String("key", s.job), slog.String("lease", s.key), slog.Int64("token", l.Token()))
		if err := s.c.sleep(ctx, wait); err != nil {
			return err
		}
	}
	if err := l.Release(ctx); err != nil {
		if errors.Is(err, ErrLockLost) {
			return nil
		}
		return err
	}
	s.c.logger.Info("pglock: job lease handed back", slog.String("key", s.job), slog.String("lease", s.key),
		slog.Int64("token", l.Token()))
	return nil
}

// runs counts the runs in progress of a job or a gocron locker, so that Close can
// refuse new ones and wait for the others. Its zero value, with c set, is ready.
type runs struct {
	c *Client

	mu      sync.Mutex
	closing bool
	n       int
	idle    chan struct{} // made by wait; closed once closing and no run is left
}

// start counts a run in, or returns ErrClosed once the client's Close has begun.
func (r *runs) start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closing || r.c.isClosed() {
		return ErrClosed
	}
	r.n++
	return nil
}

// end counts a run out.
func (r *runs) end() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n--; r.closing && r.n == 0 {
		close(r.idle)
	}
}

// wait refuses new runs and waits for those in progress, or for ctx to end (returning
// its cause). It is called once, by Close.
func (r *runs) wait(ctx context.Context) error {
	r.mu.Lock()
	r.closing = true
	r.idle = make(chan struct{})
	if r.n == 0 {
		close(r.idle)
	}
	idle := r.idle
	r.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// shutdown is the Close step of a job, a gocron locker or a gocron elector: it waits for
// the runs in progress (r may be nil), then hands the leases back (nil ones skipped).
func shutdown(ctx context.Context, r *runs, leases ...*lease) error {
	if r != nil {
		if err := r.wait(ctx); err != nil {
			return err
		}
	}
	var errs []error
	for _, s := range leases {
		if s == nil {
			continue
		}
		if err := s.handBack(ctx); err != nil {
			if ctx.Err() != nil {
				return err
			}
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
