package pglock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
	"unicode/utf8"
)

// leaseSuffix ends the key of a job's lease: the lease of job "k" is the lock "k:owner".
const leaseSuffix = ":owner"

// Job is a function that one tick of a schedule runs through pglock's locks: see
// Client.Job. Give Task to gocron, or call Run. It is safe for concurrent use.
type Job struct {
	c       *Client
	key     string
	fn      func(ctx context.Context) error
	ttl     time.Duration
	lease   *lease     // nil without OnOneInstance
	runLock bool       // WithoutOverlapping
	limit   *Semaphore // AtMost's; nil without it
	runs    runs
}

// Job returns a Job that runs fn under key, at most MaxKeyLength-6 characters, with
// OnOneInstance, WithoutOverlapping or both, or AtMost alone, and the client's ttl unless
// TTL sets it. Inside fn, FromContext(ctx) returns the run lock (with OnOneInstance alone
// the lease, with AtMost the permit), and ctx is cancelled, its cause a *LockLostError,
// when that lock or the lease is lost. Errors match ErrInvalidKey, ErrInvalidArgument
// (nil fn, no option, a bad option, a key already registered) or ErrClosed, and nothing
// is registered then. See the package doc, # Jobs.
func (c *Client) Job(key string, fn func(ctx context.Context) error, opts ...JobOption) (*Job, error) {
	if err := checkJobKey(key); err != nil {
		return nil, err
	}
	if fn == nil {
		return nil, invalidArg("Job %q: nil fn", key)
	}
	cfg := settings{ttl: c.ttl}
	if err := applyOptions(&cfg, fmt.Sprintf("Job %q", key), opts, JobOption.jobOption); err != nil {
		return nil, err
	}
	switch {
	case cfg.atMost > 0 && (cfg.oneInstance || cfg.withoutOverlapping):
		return nil, invalidArg("Job %q: AtMost goes alone: not with OnOneInstance (runs on one instance) nor WithoutOverlapping (AtMost(1) is one run at a time)", key)
	case cfg.atMost == 0 && !cfg.oneInstance && !cfg.withoutOverlapping:
		return nil, invalidArg("Job %q: want OnOneInstance, WithoutOverlapping or both, or AtMost", key)
	}
	var limit *Semaphore
	if cfg.atMost > 0 {
		var err error
		if limit, err = c.Semaphore(key, cfg.atMost); err != nil {
			return nil, err
		}
	}
	if err := c.register(fmt.Sprintf("job %q", key), key, key+leaseSuffix); err != nil {
		return nil, err
	}
	c.registered(kindJob, key)
	j := &Job{c: c, key: key, fn: fn, ttl: cfg.ttl, runLock: cfg.withoutOverlapping, limit: limit, runs: runs{c: c}}
	if cfg.oneInstance {
		j.lease = newLease(c, key, key+leaseSuffix, cfg.ttl)
	}
	c.onClose(func(ctx context.Context) error { return shutdown(ctx, &j.runs, j.lease) })
	return j, nil
}

// Key returns the job's key.
func (j *Job) Key() string { return j.key }

// Run runs one tick of the job through its locks, as Task does for gocron; a test or an
// admin path may call it. ctx bounds the store calls and is the parent of fn's ctx. A
// skipped tick returns nil. It returns fn's error, a *LockLostError when fn returned nil
// but a lock was lost during the run, ErrClosed once Close has begun, or a store error
// when the tick could not tell whether to run.
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
	if !j.runLock && j.limit == nil {
		ctx, s, err := j.c.enter(ctx)
		if err != nil {
			return err
		}
		defer j.c.leave(s)
		l, _ := FromContext(ctx)
		return j.run(ctx, l)
	}
	// A run under the run lock, or a permit of AtMost's semaphore; none left: a skip.
	with, full := func(ctx context.Context, fn func(context.Context) error, opts ...AcquireOption) error {
		return j.c.WithLock(ctx, j.key, fn, opts...)
	}, ReasonRunInProgress
	if j.limit != nil {
		with, full = j.limit.WithPermit, ReasonLimitReached
	}
	started := false
	err := with(ctx, func(ctx context.Context) error {
		started = true
		l, _ := FromContext(ctx)
		return j.run(ctx, l)
	}, TTL(j.ttl), Wait(0))
	if !started && errors.Is(err, ErrNotAcquired) {
		j.c.skipped(j.key, full)
		return nil
	}
	return err
}

// run calls fn under l: the run lock, or the lease without WithoutOverlapping, and
// reports the run (EventJobRan, the run history), a panic included before it goes on.
func (j *Job) run(ctx context.Context, l *Lock) (err error) {
	if j.lease != nil {
		j.lease.ran()
	}
	start := time.Now()
	returned := false
	defer func() {
		if returned {
			return
		}
		if r := recover(); r != nil {
			j.c.jobRan(j.key, l, start, OutcomePanicked, fmt.Sprint(r))
			panic(r)
		}
	}()
	err = j.fn(ctx)
	returned = true
	// A lost lock is the outcome even when fn returned an error: most likely the
	// cancellation of its ctx, which the loss caused.
	outcome, text := OutcomeOK, ""
	if lost := lostCause(ctx); lost != nil {
		outcome, text = OutcomeLost, lost.Error()
		if err == nil {
			err = lost
		}
	} else if err != nil {
		outcome, text = OutcomeError, err.Error()
	}
	j.c.jobRan(j.key, l, start, outcome, text)
	return err
}

// lostCause returns ctx's cause when it is a lost lock (a *LockLostError), else nil:
// what a run that returned nil reports when its lock was lost under it.
func lostCause(ctx context.Context) error {
	if cause := context.Cause(ctx); errors.Is(cause, ErrLockLost) {
		return cause
	}
	return nil
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

// skippedMessages are the log messages of skipped ticks, by reason.
var skippedMessages = map[Reason]string{
	ReasonOtherInstance: "pglock: skipped job: it runs on another instance",
	ReasonRunInProgress: "pglock: skipped job: a run is still in progress",
	ReasonLimitReached:  "pglock: skipped job: as many runs as its limit are in progress",
	ReasonLeaseInDoubt:  "pglock: skipped job: its lease was taken or renewed too late to vouch for this tick",
}

// skipped reports a skipped tick of job (a job key, a gocron job name or an elector key).
func (c *Client) skipped(job string, reason Reason) {
	c.logger.Debug(skippedMessages[reason], slog.String("key", job), slog.String("reason", string(reason)))
	c.emit(EventJobSkipped, job, nil, reason, nil)
	c.history.skip(job, reason)
}
