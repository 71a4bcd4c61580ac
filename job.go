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

// Job returns a Job that runs fn under key. key is required (a rename must not change
// it during a rolling deploy) and is checked as a lock key, its lease key "<key>:owner"
// included, so it has at most MaxKeyLength-6 characters. Give OnOneInstance,
// WithoutOverlapping or both, or AtMost alone; the ttl is the client's unless TTL sets
// it.
//
// Inside fn, FromContext(ctx) returns the run lock (with OnOneInstance alone, the
// lease; with AtMost, the permit), whose Token fences fn's writes; fn's ctx is cancelled, with a
// *LockLostError as its cause, when the run lock or the lease is lost.
//
// Keys are registered with the client: a second job with the same key, a job whose key
// is another job's lease key, or one that is a gocron elector's or an election's key,
// is refused, the error naming both. Errors match ErrInvalidKey, ErrInvalidArgument
// (nil fn, no option, a bad option, a taken key) or ErrClosed; nothing is registered
// then.
//
// Register the job with gocron in singleton mode (see GocronOptions), so that gocron
// itself refuses an overlap inside one process.
//
// Client.Close shuts the job down: from its start, Run returns ErrClosed; it cancels
// the runs in progress (their ctx's cause is ErrClosed) and waits for them to return
// (bounded by its ctx), then hands the lease back, so that the next tick on another
// instance runs at once rather than after the ttl; when its ctx ends first, the lease
// is left to expire instead. A lease whose last run started less than a second before,
// on the client's clock, is kept for the rest of that second, so that instances firing
// the same tick a few milliseconds later skip it rather than run it again. An app shuts
// down in this order: the scheduler's Shutdown (no more ticks, running ones finish),
// then Client.Close, then the pool's Close.
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

// Run runs one tick of the job through its locks: what gocron calls through Task, and
// what a test or an admin path calls directly. A skipped tick (another instance owns
// the job, a run is in progress, or AtMost's limit is reached) returns nil; it is logged at debug, emitted as an
// EventJobSkipped and counted in the run history, and a run is emitted as an
// EventJobRan (its Duration and Outcome set) and recorded in the run history (see
// RunHistory), a panicking fn's too (OutcomePanicked) before the panic goes on up.
// ctx bounds the store calls and is the parent of fn's ctx.
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
