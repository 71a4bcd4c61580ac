package pglock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/go-co-op/gocron/v2"

	"github.com/pgfence/pglock/internal/schedule"
	"github.com/pgfence/pglock/internal/store"
)

// Slots: a job that knows its schedule (Cron, Every) claims each scheduled time, its
// slot, once, on the database clock (see "Slots" in the package doc and
// migration 000030).

const (
	// minSlotGap is the shortest time between two slots Every takes: each slot is a
	// durable row and a lock, claimed by every instance's tick.
	minSlotGap = 100 * time.Millisecond
	// slotKeySuffix and maxSlotDigits make a slot's lock key: "<job>:slot:<ms>", the
	// slot in milliseconds since the epoch (15 digits up to the year 9999).
	slotKeySuffix = ":slot:"
	maxSlotDigits = 15
	// maxAttempts and maxBackoff bound AtLeastOnce; maxCatchUp, CatchUp; maxDeadline,
	// Deadline.
	maxAttempts = 100
	maxBackoff  = 24 * time.Hour
	maxCatchUp  = 1000
	maxDeadline = 365 * 24 * time.Hour
	// slotWatchMargin is how long after an attempt's lock expires another instance
	// looks at it.
	slotWatchMargin = 5 * time.Millisecond
)

// Cron gives the job a schedule: a cron expression of five fields, or six with seconds
// first, or a descriptor such as @hourly, in UTC unless it starts with TZ= or CRON_TZ=.
// Each time it names is a slot, claimed by one instance's tick; register the job with
// Job.Schedule. Client.Job refuses an expression that does not parse, or @every (see
// Every), with ErrInvalidArgument. It is a JobOption: Client.Job takes it.
func Cron(expr string) JobOption {
	return jobOpt{name: "Cron", apply: func(s *settings) error {
		if s.schedule != nil {
			return errors.New("a second schedule: give Cron or Every once")
		}
		sc, err := schedule.ParseCron(expr)
		if err != nil {
			return err
		}
		s.schedule = sc
		return nil
	}}
}

// Every gives the job a schedule of a slot every d, aligned to the Unix epoch (every 5
// minutes: at :00, :05...), so that every instance names the same slots. d is 100 ms
// to 365 days in whole milliseconds; a shorter d is refused (ErrInvalidArgument), not
// coalesced. It is a JobOption: Client.Job takes it.
func Every(d time.Duration) JobOption {
	return jobOpt{name: "Every", apply: func(s *settings) error {
		if s.schedule != nil {
			return errors.New("a second schedule: give Cron or Every once")
		}
		if d < minSlotGap || d > MaxTTL || d%time.Millisecond != 0 {
			return fmt.Errorf("%v: want %v to %v in whole milliseconds", d, minSlotGap, MaxTTL)
		}
		s.schedule = &schedule.Schedule{Every: d}
		return nil
	}}
}

// CatchUp makes a tick that finds slots nobody claimed since the last claimed one run
// the latest n of them, oldest first, before its own; the others count as missed
// (SkipSlotMissed). CatchUp(1) runs the latest missed slot once. Without it, every
// missed slot is counted and none run. n is 1 to 1000. It needs Cron or Every.
func CatchUp(n int) JobOption {
	return jobOpt{name: "CatchUp", apply: func(s *settings) error {
		if n < 1 || n > maxCatchUp {
			return fmt.Errorf("%d slots: want 1 to %d", n, maxCatchUp)
		}
		s.catchUp = n
		return nil
	}}
}

// Deadline makes a slot that no tick has started within d of its time, on the database
// clock, count as missed rather than late: it never runs. Without it, a slot may start
// until the next one comes, and a missed one caught up whenever. d is 1 ms to 365
// days. It needs Cron or Every.
func Deadline(d time.Duration) JobOption {
	return jobOpt{name: "Deadline", apply: func(s *settings) error {
		if d < time.Millisecond || d > maxDeadline {
			return fmt.Errorf("%v: want %v to %v", d, time.Millisecond, maxDeadline)
		}
		s.deadline = d
		return nil
	}}
}

// AtLeastOnce runs a slot again, up to attempts times in all, when an attempt ends
// without success: fn returned an error or panicked, a lock was lost, or its holder
// died (its slot's lock expired). Attempt k+1 waits backoff·2^(k-1) (a day at most)
// and takes a greater token. attempts is 2 to 100, backoff 0 to 24h. It needs Cron or
// Every.
func AtLeastOnce(attempts int, backoff time.Duration) JobOption {
	return jobOpt{name: "AtLeastOnce", apply: func(s *settings) error {
		if attempts < 2 || attempts > maxAttempts {
			return fmt.Errorf("%d attempts: want 2 to %d", attempts, maxAttempts)
		}
		if backoff < 0 || backoff > maxBackoff {
			return fmt.Errorf("backoff %v: want 0 to %v", backoff, maxBackoff)
		}
		s.attempts, s.backoff = attempts, backoff
		return nil
	}}
}

// SlotPolicy is what a job with a schedule does with its slots, as the options given
// to Client.Job set it. The store does not keep it: a console or a report that shows
// it gets it from the Job. See the package doc, # Slots.
type SlotPolicy struct {
	Cron     string        // Cron's expression, its zone first ("CRON_TZ=UTC 0 2 * * *"); "" with Every
	Every    time.Duration // Every's gap between slots; 0 with Cron
	CatchUp  int           // CatchUp's n; 0: every missed slot is counted and none runs
	Deadline time.Duration // Deadline's; 0: a slot may start until the next one comes
	Attempts int           // AtLeastOnce's attempts; 1: at most once
	Backoff  time.Duration // AtLeastOnce's backoff before the second attempt; 0 without it
}

// SlotFromContext returns the slot that a job's run stands for, inside the run: the
// time its schedule names, and true. Elsewhere, and in the run of a job without a
// schedule, it returns the zero time and false.
func SlotFromContext(ctx context.Context) (time.Time, bool) {
	r, ok := ctx.Value(slotContextKey{}).(slotRun)
	return r.slot, ok
}

type slotContextKey struct{}

// slotRun is what a run's ctx carries of its slot.
type slotRun struct {
	slot    time.Time
	attempt int
}

// definition is the gocron job definition of s.
func definition(s *schedule.Schedule) gocron.JobDefinition {
	if s.IsCron() {
		return gocron.CronJob(s.Expr, true)
	}
	return gocron.DurationJob(s.Every)
}

// slotKey is the key of the lock of job's slot.
func slotKey(job string, slot time.Time) string {
	return job + slotKeySuffix + strconv.FormatInt(slot.UnixMilli(), 10)
}

// checkSlotJobKey checks that a slotted job's slots' lock keys are keys.
func checkSlotJobKey(key string) error {
	if n := utf8.RuneCountInString(key) + len(slotKeySuffix) + maxSlotDigits; n > MaxKeyLength {
		return fmt.Errorf("%w: its slots' lock keys (the key, %q and up to %d digits) would have %d characters, the most is %d",
			ErrInvalidKey, slotKeySuffix, maxSlotDigits, n, MaxKeyLength)
	}
	return nil
}

// slotted is the slots' side of a Job with a schedule.
type slotted struct {
	j        *Job
	store    store.Slots
	sched    *schedule.Schedule
	catchUp  int
	deadline time.Duration
	attempts int // 1: at most once
	backoff  time.Duration
	offset   atomic.Int64 // how far the database's clock is ahead of this process's, in ns

	mu     sync.Mutex
	timer  Timer     // the next look at the job's slots that may be attempted again; nil when none
	at     time.Time // when it fires, on the client's clock
	closed bool
}

// newSlotted returns the slots' side of j, or nil for a job without a schedule.
func newSlotted(j *Job, cfg settings) *slotted {
	if cfg.schedule == nil {
		return nil
	}
	return &slotted{j: j, store: j.c.slotStore(), sched: cfg.schedule, catchUp: cfg.catchUp, deadline: cfg.deadline,
		attempts: max(cfg.attempts, 1), backoff: cfg.backoff}
}

// checkSlotted checks what a job's slots need: a schedule for the options that need
// one, a key that leaves room for the slots' lock keys, a store that keeps slots.
func checkSlotted(c *Client, key string, cfg settings) error {
	if cfg.schedule == nil {
		if cfg.catchUp > 0 || cfg.deadline > 0 || cfg.attempts > 0 {
			return invalidArg("Job %q: CatchUp, Deadline and AtLeastOnce need a schedule: give Cron or Every", key)
		}
		return nil
	}
	if err := checkSlotJobKey(key); err != nil {
		return err
	}
	if c.slotStore() == nil {
		return fmt.Errorf("pglock: Job %q: slots (Cron, Every) need a store of New, NewPostgresStore or NewSQLStore, not NewMemoryStore: %w",
			key, errors.ErrUnsupported)
	}
	return nil
}

// slotStore returns the client's store as a store.Slots, its calls observed for Health,
// or nil when the store keeps no slots.
func (c *Client) slotStore() store.Slots {
	s, ok := store.Unobserved(c.store).(store.Slots)
	if !ok {
		return nil
	}
	return store.ObserveSlots(s, c.health.calls)
}

// dbNow is this process's guess of the database's clock.
func (s *slotted) dbNow() time.Time { return time.Now().Add(time.Duration(s.offset.Load())) }

// learn records the database's clock as a reply read it, sent at sent (real clock).
func (s *slotted) learn(dbNow, sent time.Time) {
	if !dbNow.IsZero() {
		mid := sent.Add(time.Since(sent) / 2)
		s.offset.Store(int64(dbNow.Sub(mid)))
	}
}

// tick runs one tick of the job: it claims the slot the database clock names, catches
// up what CatchUp asks, and runs the slots it claimed. ctx is the run's (the lease's
// when there is one).
func (s *slotted) tick(ctx context.Context) error {
	j := s.j
	slot, next := s.sched.Current(s.dbNow())
	var r store.SlotClaimReply
	var l *Lock
	for try := 0; ; try++ {
		if slot.IsZero() {
			return fmt.Errorf("pglock: job %q: its schedule names no slot now", j.key)
		}
		var err error
		sent := time.Now()
		r, l, err = s.claim(ctx, slot, next)
		if err != nil {
			return err
		}
		s.learn(r.Now, sent)
		if r.Status != store.ClaimMoved {
			break
		}
		if try == 1 {
			return fmt.Errorf("pglock: job %q: the database's clock (%v) and this process's name different slots: %v is not the slot to claim",
				j.key, r.Now.UTC(), slot.UTC())
		}
		slot, next = s.sched.Current(s.dbNow())
	}
	switch r.Status {
	case store.ClaimTaken:
		j.c.skippedSlot(j.key, SkipSlotClaimed, slot, 1)
		s.watchDue(r)
		return nil
	case store.ClaimLate:
		j.c.skippedSlot(j.key, SkipSlotMissed, slot, 1)
	}
	var catchUp []time.Time
	if !r.Prior.IsZero() {
		missed := s.sched.Between(r.Prior, slot)
		for len(missed) > 0 && len(catchUp) < s.catchUp {
			m := missed[len(missed)-1]
			if s.deadline > 0 && r.Now.Sub(m) > s.deadline {
				break
			}
			missed, catchUp = missed[:len(missed)-1], append(catchUp, m)
		}
		if len(missed) > 0 {
			j.c.skippedSlot(j.key, SkipSlotMissed, missed[len(missed)-1], len(missed))
		}
	}
	var errs []error
	for i := len(catchUp) - 1; i >= 0; i-- {
		m := catchUp[i]
		mr, ml, err := s.claim(ctx, m, time.Time{})
		switch {
		case err != nil:
			errs = append(errs, err)
		case mr.Status == store.ClaimClaimed:
			errs = append(errs, s.run(ctx, m, ml, 1))
		case mr.Status == store.ClaimLate:
			j.c.skippedSlot(j.key, SkipSlotMissed, m, 1)
		case mr.Status == store.ClaimTaken:
			j.c.skippedSlot(j.key, SkipSlotClaimed, m, 1)
		}
	}
	if l != nil {
		errs = append(errs, s.run(ctx, slot, l, 1))
	}
	return errors.Join(errs...)
}

// claim claims slot (next zero: a missed slot) for a new owner, as an acquisition
// does: on a call detached from ctx, whose grant is handed back if ctx ends first.
// It returns the store's reply, and the slot's lock when it claimed it.
func (s *slotted) claim(ctx context.Context, slot, next time.Time) (store.SlotClaimReply, *Lock, error) {
	j := s.j
	a := store.SlotClaimArgs{Job: j.key, Slot: slot, Next: next, TTL: j.ttl, Attempts: s.attempts, Deadline: s.deadline}
	return s.take(ctx, slot, func(ctx context.Context, owner string) (store.SlotClaimReply, error) {
		a.Owner = owner
		return s.store.SlotClaim(ctx, a)
	})
}

// take makes a claim of slot's lock (it took it when the reply's token is positive) as
// tryFrom makes an acquisition: detached from ctx, its grant handed back when ctx ends
// first or the reply came too late.
func (s *slotted) take(ctx context.Context, slot time.Time, call func(ctx context.Context, owner string) (store.SlotClaimReply, error)) (store.SlotClaimReply, *Lock, error) {
	c, key := s.j.c, slotKey(s.j.key, slot)
	if c.isClosed() {
		return store.SlotClaimReply{}, nil, ErrClosed
	}
	if ctx.Err() != nil {
		return store.SlotClaimReply{}, nil, fmt.Errorf("pglock: claim %q: %w", key, context.Cause(ctx))
	}
	t, owner := target{key: key}, c.newOwner()
	start := c.clock.Now()
	mark := &store.SendMark{Now: c.clock.Now, Sent: start}
	var reply store.SlotClaimReply
	ar, abandoned := c.acquireCall(ctx, t, owner, s.j.ttl, mark, func(ctx context.Context) acquireReply {
		r, err := call(ctx, owner)
		reply = r
		return acquireReply{token: r.Token, ok: err == nil && r.Token > 0, err: err}
	})
	switch {
	case abandoned: // the call goes on, and writes reply: read it no more
		return store.SlotClaimReply{}, nil, fmt.Errorf("pglock: claim %q: %w", key, context.Cause(ctx))
	case ar.err != nil:
		if mayHaveReached(ar.err) {
			c.handBacks.Add(key, owner, s.j.ttl)
		}
		return reply, nil, ar.err
	case !ar.ok:
		return reply, nil, nil
	}
	l, err := c.newLock(t, 0, owner, s.j.ttl, ar.token, start, mark.Sent)
	if err != nil {
		return reply, nil, err
	}
	return reply, l, nil
}

// run runs attempt of slot under its lock l, through the job's other locks, and ends
// the attempt: the slot's row records how, and l is released in the same statement.
func (s *slotted) run(ctx context.Context, slot time.Time, l *Lock, attempt int) (err error) {
	j := s.j
	ctx = context.WithValue(ctx, slotContextKey{}, slotRun{slot: slot, attempt: attempt})
	outcome := "lost" // until fn returns: a panic is recorded below
	defer func() {
		if r := recover(); r != nil {
			s.end(l, slot, attempt, "panicked")
			panic(r)
		}
		if eerr := s.end(l, slot, attempt, outcome); err == nil {
			err = eerr
		}
	}()
	lctx, stop := withLockContext(ctx, l)
	defer stop()
	started, reason, err := j.gated(lctx, func(ctx context.Context) error {
		ctx = context.WithValue(ctx, lockContextKey{}, l)
		o, err := j.run(ctx, l)
		outcome = string(o)
		return err
	})
	if !started && reason != "" {
		outcome = "skipped"
		j.c.skippedSlot(j.key, reason, slot, 1)
	}
	return err
}

// end ends an attempt of slot under l with outcome, and, when another may follow,
// looks again when it is due.
func (s *slotted) end(l *Lock, slot time.Time, attempt int, outcome string) error {
	j := s.j
	err := l.releaseVia(context.Background(), func(ctx context.Context, key, owner string) (bool, bool, error) {
		ctx, cancel := detached(ctx)
		defer cancel()
		ok, err := s.store.SlotEnd(ctx, j.key, slot, owner, l.token, outcome, s.backoff)
		return ok, false, err
	})
	if outcome != string(OutcomeOK) && attempt < s.attempts {
		s.watch(min(s.backoff<<(attempt-1), maxBackoff) + slotWatchMargin)
	}
	return err
}

// watch arranges a look, after d, for the job's slots that may be attempted again, for
// a job at least once; an earlier look already arranged stands.
func (s *slotted) watch(d time.Duration) {
	if s.attempts < 2 {
		return
	}
	c := s.j.c
	at := c.clock.Now().Add(d)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.timer != nil && !at.Before(s.at) {
		return
	}
	if s.timer != nil {
		s.timer.Stop()
	}
	s.at, s.timer = at, c.clock.AfterFunc(max(d, 0)+slotWatchMargin, s.look)
}

// look is the timer's call: a run of its own, counted as a run of the job, that
// retries what may be retried now.
func (s *slotted) look() {
	s.mu.Lock()
	s.timer = nil
	s.mu.Unlock()
	if err := s.j.runs.start(); err != nil {
		return
	}
	go func() {
		defer s.j.runs.end()
		if err := s.retry(context.Background()); err != nil && !errors.Is(err, ErrClosed) {
			s.j.c.logger.Warn("pglock: job slot not retried", slog.String("key", s.j.key), slog.Any("err", err))
		}
	}()
}

// retry claims and runs, one after the other, the job's slots that may be attempted
// again now, then arranges the next look.
func (s *slotted) retry(ctx context.Context) error {
	j := s.j
	ctx, stop, err := j.underLease(ctx)
	if err != nil || ctx == nil {
		return err
	}
	defer stop()
	for {
		r, l, err := s.claimRetry(ctx)
		if err != nil {
			return err
		}
		if l == nil {
			s.watchDue(r.SlotClaimReply)
			return nil
		}
		if err := s.run(ctx, r.slot, l, r.attempt); err != nil {
			j.c.logger.Debug("pglock: job slot retried", slog.String("key", j.key), slog.Int64("token", l.Token()),
				slog.Int("attempt", r.attempt), slog.Any("err", err))
		}
	}
}

// retryReply is a retry's claim: the slot and attempt it claimed, if any.
type retryReply struct {
	store.SlotClaimReply
	slot    time.Time
	attempt int
}

// claimRetry claims a new attempt of a slot that may be attempted again now, if any.
// The call is not abandoned when ctx ends: which slot's lock it takes is known only
// from its reply. A call that failed after it may have reached the server leaves what
// it took to expire, and the slot to the next retry.
func (s *slotted) claimRetry(ctx context.Context) (retryReply, *Lock, error) {
	j := s.j
	c := j.c
	if c.isClosed() {
		return retryReply{}, nil, ErrClosed
	}
	owner := c.newOwner()
	start := c.clock.Now()
	mark := &store.SendMark{Now: c.clock.Now, Sent: start}
	rctx, cancel := context.WithTimeout(store.WithSendMark(context.WithoutCancel(ctx), mark), store.Timeout)
	defer cancel()
	sent := time.Now()
	rr, err := s.store.SlotRetry(rctx, j.key, owner, j.ttl)
	if err != nil {
		return retryReply{}, nil, err
	}
	s.learn(rr.Now, sent)
	r := retryReply{SlotClaimReply: store.SlotClaimReply{Now: rr.Now, Due: rr.Due}, slot: rr.Slot, attempt: rr.Attempt}
	if !rr.OK {
		return r, nil, nil
	}
	l, err := c.newLock(target{key: slotKey(j.key, rr.Slot)}, 0, owner, j.ttl, rr.Token, start, mark.Sent)
	return r, l, err
}

// watchDue arranges a look at the time r says an attempt may next be due, if any.
func (s *slotted) watchDue(r store.SlotClaimReply) {
	if !r.Due.IsZero() {
		s.watch(r.Due.Sub(r.Now))
	}
}

// close stops the looks: Close's step, before the job's runs are waited for.
func (s *slotted) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
}
