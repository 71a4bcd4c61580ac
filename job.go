package pglock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
	"unicode/utf8"

	"github.com/go-co-op/gocron/v2"
	"github.com/pgfence/pglock/internal/store"
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
	slots   *slotted   // nil without Cron or Every
	runs    runs
}

// Job returns a Job that runs fn under key, at most MaxKeyLength-6 characters
// (MaxKeyLength-21 with a schedule), with a schedule (Cron or Every: each slot runs
// once), OnOneInstance, WithoutOverlapping or both, or AtMost alone, or a schedule with
// any of them, and the client's ttl unless TTL sets it. Inside fn, FromContext(ctx)
// returns the run lock (with a schedule the slot's lock, with OnOneInstance alone the
// lease, with AtMost the permit), and ctx is cancelled, its cause a *LockLostError,
// when that lock or the lease is lost. Errors match ErrInvalidKey, ErrInvalidArgument
// (nil fn, no option, a bad option, a key already registered), ErrClosed, or wrap
// errors.ErrUnsupported (a schedule on the memory store); nothing is registered then.
// See the package doc, # Jobs.
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
	case cfg.atMost == 0 && !cfg.oneInstance && !cfg.withoutOverlapping && cfg.schedule == nil:
		return nil, invalidArg("Job %q: want a schedule (Cron or Every), OnOneInstance, WithoutOverlapping or both, or AtMost", key)
	}
	if err := checkSlotted(c, key, cfg); err != nil {
		return nil, err
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
	c.registered(store.KindJob, key)
	j := &Job{c: c, key: key, fn: fn, ttl: cfg.ttl, runLock: cfg.withoutOverlapping, limit: limit, runs: runs{c: c}}
	if cfg.oneInstance {
		j.lease = newLease(c, key, key+leaseSuffix, cfg.ttl)
		j.lease.slotted = cfg.schedule != nil
	}
	j.slots = newSlotted(j, cfg)
	c.onClose(func(ctx context.Context) error {
		if j.slots != nil {
			j.slots.close()
		}
		return shutdown(ctx, &j.runs, j.lease)
	})
	return j, nil
}

// Key returns the job's key.
func (j *Job) Key() string { return j.key }

// Run runs one tick of the job through its locks, as Task does for gocron; a test or an
// admin path may call it. With a schedule it claims the slot the database's clock
// names (and CatchUp's missed slots) and runs those it claimed. ctx bounds the store
// calls and is the parent of fn's ctx. A skipped tick returns nil. It returns fn's
// error, a *LockLostError when fn returned nil but a lock was lost during the run,
// ErrClosed once Close has begun, or a store error when the tick could not tell whether
// to run.
func (j *Job) Run(ctx context.Context) error {
	if err := j.runs.start(); err != nil {
		return err
	}
	defer j.runs.end()
	ctx, stop, err := j.underLease(ctx)
	if err != nil || ctx == nil {
		return err
	}
	defer stop()
	if j.slots != nil {
		return j.slots.tick(ctx)
	}
	_, reason, err := j.gated(ctx, func(ctx context.Context) error {
		l, _ := FromContext(ctx)
		_, err := j.run(ctx, l)
		return err
	})
	if reason != "" {
		j.c.skipped(j.key, reason)
	}
	return err
}

// Task returns the gocron task that runs j: every tick calls Run with the ctx gocron
// passes (cancelled at the scheduler's shutdown), and gocron gets Run's error. Register
// it with GocronOptions(j.Key()); a job with a schedule (Cron, Every) registers itself
// with Job.Schedule instead (see the package doc, # Jobs).
func (j *Job) Task() gocron.Task {
	return gocron.NewTask(j.Run)
}

// Schedule registers the job with s on its own schedule (Cron or Every): the job
// definition, Task, GocronOptions(j.Key()), for Every a start on the next slot, and
// for CatchUp a run at once, so that slots missed while every instance was down are
// caught up when the first comes back; opts are appended. Errors: ErrInvalidArgument
// for a job without a schedule or a nil s, or gocron's error.
func (j *Job) Schedule(s gocron.Scheduler, opts ...gocron.JobOption) (gocron.Job, error) {
	if j.slots == nil {
		return nil, invalidArg("Job %q: Schedule: the job has no schedule: give Cron or Every", j.key)
	}
	if s == nil {
		return nil, invalidArg("Job %q: Schedule: nil scheduler", j.key)
	}
	sc := j.slots.sched
	all := GocronOptions(j.key)
	if !sc.IsCron() {
		start := sc.Next(time.Now().Add(10 * time.Millisecond))
		all = append(all, gocron.WithStartAt(gocron.WithStartDateTime(start)))
	}
	all = append(all, opts...)
	gj, err := s.NewJob(definition(sc), j.Task(), all...)
	if err != nil {
		return nil, fmt.Errorf("pglock: Job %q: Schedule: %w", j.key, err)
	}
	if j.slots.catchUp > 0 {
		_, err = s.NewJob(gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()), j.Task(),
			gocron.WithName(j.key), gocron.WithSingletonMode(gocron.LimitModeReschedule))
		if err != nil {
			return nil, errors.Join(fmt.Errorf("pglock: Job %q: Schedule its catch-up: %w", j.key, err), s.RemoveJob(gj.ID()))
		}
	}
	return gj, nil
}

// SlotPolicy returns the slot policy of j, and false for a job without a schedule
// (Cron or Every).
func (j *Job) SlotPolicy() (SlotPolicy, bool) {
	s := j.slots
	if s == nil {
		return SlotPolicy{}, false
	}
	return SlotPolicy{Cron: s.sched.Expr, Every: s.sched.Every, CatchUp: s.catchUp, Deadline: s.deadline,
		Attempts: s.attempts, Backoff: s.backoff}, true
}

// underLease holds the job's lease for a tick, if it has one, and returns ctx under it
// (FromContext gives the lease) and the stop of that ctx; a nil ctx, with a nil error,
// when the tick is skipped (hold logged and emitted why).
func (j *Job) underLease(ctx context.Context) (_ context.Context, stop func(), _ error) {
	if j.lease == nil {
		return ctx, func() {}, nil
	}
	l, err := j.lease.hold(ctx)
	if errors.Is(err, ErrNotAcquired) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	ctx, stop = withLockContext(ctx, l)
	return ctx, stop, nil
}

// gated calls run through the job's run lock (WithoutOverlapping) or a permit of
// AtMost's semaphore, or as a section of its own without either: started false, with
// the reason, when the tick is skipped because a run holds them.
func (j *Job) gated(ctx context.Context, run func(ctx context.Context) error) (started bool, skipped SkipReason, err error) {
	if !j.runLock && j.limit == nil {
		ctx, s, err := j.c.enter(ctx)
		if err != nil {
			return false, "", err
		}
		defer j.c.leave(s)
		return true, "", run(ctx)
	}
	with, full := func(ctx context.Context, fn func(context.Context) error, opts ...AcquireOption) error {
		return j.c.WithLock(ctx, j.key, fn, opts...)
	}, SkipRunInProgress
	if j.limit != nil {
		with, full = j.limit.WithPermit, SkipLimitReached
	}
	err = with(ctx, func(ctx context.Context) error {
		started = true
		return run(ctx)
	}, TTL(j.ttl), Wait(0))
	if !started && errors.Is(err, ErrNotAcquired) {
		return false, full, nil
	}
	return started, "", err
}

// run calls fn under l: the slot's lock, the run lock, or the lease without
// WithoutOverlapping, and reports the run (EventJobRan, the run history), a panic
// included before it goes on. It returns the run's outcome and error.
func (j *Job) run(ctx context.Context, l *Lock) (outcome Outcome, err error) {
	if j.lease != nil {
		j.lease.ran()
	}
	slot, _ := ctx.Value(slotContextKey{}).(slotRun)
	start := time.Now()
	returned := false
	defer func() {
		if returned {
			return
		}
		if r := recover(); r != nil {
			j.c.jobRan(j.key, l, slot, start, OutcomePanicked, fmt.Sprint(r))
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
	j.c.jobRan(j.key, l, slot, start, outcome, text)
	return outcome, err
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
	if err := store.CheckKey(key); err != nil {
		return err
	}
	if n := utf8.RuneCountInString(key + leaseSuffix); n > MaxKeyLength {
		return fmt.Errorf("%w: its lease key (the key and %q) would have %d characters, the most is %d",
			ErrInvalidKey, leaseSuffix, n, MaxKeyLength)
	}
	return nil
}

// Outcome is how a job's run ended (EventJobRan, JobRun): a short value that stays the
// same from release to release.
type Outcome string

const (
	OutcomeOK       Outcome = store.OutcomeOK // fn returned nil and no lock was lost
	OutcomeError    Outcome = "error"         // fn returned an error
	OutcomePanicked Outcome = "panicked"      // fn panicked; the panic goes on up the stack after it is recorded
	OutcomeLost     Outcome = "lost"          // a lock the run held was lost during it (its ctx's cause was a *LockLostError)
)

// SkipReason says why a job's tick was skipped (Event.SkipReason, JobSkips.Reason): a
// value that stays the same from release to release, as the run history stores it.
type SkipReason string

const (
	// SkipOtherInstance: another instance holds the job's lease (OnOneInstance,
	// GocronLocker) or leads (GocronElector).
	SkipOtherInstance SkipReason = "other-instance"
	// SkipRunInProgress: a run of the job still holds its run lock
	// (WithoutOverlapping), on this instance or another.
	SkipRunInProgress SkipReason = "run-in-progress"
	// SkipLimitReached: AtMost(n) runs of the job were in progress, on this instance
	// or others.
	SkipLimitReached SkipReason = "limit-reached"
	// SkipLeaseInDoubt: the job's lease could not vouch that no other instance ran
	// the tick: its take came late, or its renewal was overdue (see the package doc,
	// # Jobs).
	SkipLeaseInDoubt SkipReason = "lease-in-doubt"
	// SkipSlotClaimed: another tick, on this instance or another, claimed the tick's
	// slot first (Cron, Every).
	SkipSlotClaimed SkipReason = "slot-claimed"
	// SkipSlotMissed: slots of a job with a schedule were missed: no tick claimed
	// them in their Deadline, and CatchUp did not run them (Event.Count says how many).
	SkipSlotMissed SkipReason = "slot-missed"
)

// skippedMessages are the log messages of skipped ticks, by reason.
var skippedMessages = map[SkipReason]string{
	SkipOtherInstance: "pglock: skipped job: it runs on another instance",
	SkipRunInProgress: "pglock: skipped job: a run is still in progress",
	SkipLimitReached:  "pglock: skipped job: as many runs as its limit are in progress",
	SkipLeaseInDoubt:  "pglock: skipped job: its lease was taken or renewed too late to vouch for this tick",
	SkipSlotClaimed:   "pglock: skipped job: another tick claimed its slot",
	SkipSlotMissed:    "pglock: missed job slots: no tick claimed them in time",
}

// skipped reports a skipped tick of job (a job key, a gocron job name or an elector key).
func (c *Client) skipped(job string, reason SkipReason) {
	c.skippedSlot(job, reason, time.Time{}, 1)
}

// skippedSlot reports n skipped ticks or slots of job, the last of them slot (zero
// for a job without a schedule).
func (c *Client) skippedSlot(job string, reason SkipReason, slot time.Time, n int) {
	attrs := []any{slog.String("key", job), slog.String("reason", string(reason))}
	if !slot.IsZero() {
		attrs = append(attrs, slog.Time("slot", slot), slog.Int("slots", n))
	}
	c.logger.Debug(skippedMessages[reason], attrs...)
	c.health.count(EventJobSkipped)
	c.events.emit(Event{Type: EventJobSkipped, Key: job, SkipReason: reason, Slot: slot, Count: n, Time: c.clock.Now()})
	c.history.Skip(job, string(reason), n)
}
