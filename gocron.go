package pglock

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/pgfence/pglock/internal/store"
)

// GocronOptions returns the gocron job options pglock recommends for a job named name,
// the job's key (Job.Key): gocron.WithName(name) and
// gocron.WithSingletonMode(gocron.LimitModeReschedule), so that gocron refuses an overlap
// inside one process. Append options of your own to the result. gocron's NewJob refuses
// an empty name.
func GocronOptions(name string) []gocron.JobOption {
	return []gocron.JobOption{gocron.WithName(name), gocron.WithSingletonMode(gocron.LimitModeReschedule)}
}

// GocronElector returns a gocron.Elector (gocron.WithDistributedElector) under which only
// the leader's scheduler runs jobs: the leader holds a lease on key, as OnOneInstance's,
// of the ttl TTL sets. Use its Task for the jobs, so that Close can hand the lease back
// and runs have a fencing token. Errors match ErrInvalidKey, ErrInvalidArgument (a bad
// option, a key already registered) or ErrClosed. See the package doc, # gocron adapters.
func (c *Client) GocronElector(key string, opts ...Option) (*GocronElector, error) {
	lc, err := lockSettings(c, key, "GocronElector", opts, Option.everyOption)
	if err != nil {
		return nil, err
	}
	if err := c.register(fmt.Sprintf("gocron elector %q", key), key); err != nil {
		return nil, err
	}
	c.registered(store.KindElection, key)
	e := &GocronElector{lease: newLease(c, key, key, lc.ttl), runs: runs{c: c}}
	c.onClose(e.close)
	return e, nil
}

// GocronElector is a gocron.Elector on a pglock lease: see Client.GocronElector. It is
// safe for concurrent use.
type GocronElector struct {
	lease *lease
	runs  runs // of Task's tasks

	mu      sync.Mutex
	closing bool
	// untracked counts the runs IsLeader let start that no Task has claimed: plain
	// tasks' runs, and Task's runs about to start.
	untracked int
}

// IsLeader returns nil on the leader (taking the lease if it is free), an error matching
// ErrNotAcquired where another instance leads or where the lease cannot vouch for this
// run (SkipLeaseInDoubt), ErrClosed once Close has begun, or a store error. ctx bounds
// its store call. gocron calls it before each run.
func (e *GocronElector) IsLeader(ctx context.Context) error {
	e.mu.Lock()
	if e.closing {
		e.mu.Unlock()
		return ErrClosed
	}
	e.untracked++ // before the lease is held: close must see every run that may start
	e.mu.Unlock()
	if _, err := e.lease.hold(ctx); err != nil {
		e.mu.Lock()
		e.untracked--
		e.mu.Unlock()
		return err
	}
	e.lease.ran()
	return nil
}

// Task returns a gocron task that runs fn as a run of the elector. fn's ctx is gocron's,
// cancelled too when the lease is lost (its cause a *LockLostError) or when Close begins
// (ErrClosed; Close waits for fn); FromContext(ctx) returns the lease. The task returns
// fn's error, or, without calling fn, ErrClosed once Close has begun or the lease's
// *LockLostError when it was lost since IsLeader.
func (e *GocronElector) Task(fn func(ctx context.Context) error) gocron.Task {
	return gocron.NewTask(func(ctx context.Context) error { return e.run(ctx, fn) })
}

func (e *GocronElector) run(ctx context.Context, fn func(ctx context.Context) error) error {
	e.mu.Lock()
	if e.untracked > 0 {
		e.untracked--
	}
	e.mu.Unlock()
	if err := e.runs.start(); err != nil {
		return err
	}
	defer e.runs.end()
	e.lease.mu.Lock()
	l := e.lease.lock
	e.lease.mu.Unlock()
	if l == nil {
		return fmt.Errorf("%w: gocron elector %q does not lead", ErrNotAcquired, e.lease.key)
	}
	if err := lostCause(l.Context()); err != nil {
		return err
	}
	lctx, stop := withLockContext(ctx, l)
	defer stop()
	fctx, s, err := e.lease.c.enter(lctx)
	if err != nil {
		return err
	}
	defer e.lease.c.leave(s)
	return fn(fctx)
}

// close is the elector's Close step: no more runs; Task's runs end (bounded by ctx);
// then the lease is handed back, unless a run that no Task tracked may still go on:
// then it is left to expire.
func (e *GocronElector) close(ctx context.Context) error {
	e.mu.Lock()
	e.closing = true
	e.mu.Unlock()
	if err := e.runs.wait(ctx); err != nil {
		return err
	}
	e.mu.Lock()
	untracked := e.untracked
	e.mu.Unlock()
	if untracked > 0 {
		e.leaveToExpire()
		return nil
	}
	return shutdown(ctx, nil, e.lease)
}

// leaveToExpire gives the lease up without handing it back: it is no longer renewed,
// and expires after its ttl.
func (e *GocronElector) leaveToExpire() {
	s := e.lease
	s.mu.Lock()
	l := s.lock
	s.mu.Unlock()
	if l == nil || !l.Held() {
		return
	}
	s.c.renewer.Remove(&l.entry)
	l.abandon()
	s.c.logger.Info("pglock: gocron elector lease left to expire: runs of tasks other than its Task's may go on",
		slog.String("key", s.key), slog.String("owner", l.Owner()), slog.Int64("token", l.Token()), slog.Duration("ttl", s.ttl))
}

// GocronLocker returns a gocron.Locker (gocron.WithDistributedLocker or
// WithDistributedJobLocker) whose lock for a job name is OnOneInstance's lease of a job
// keyed name, of the ttl TTL sets, kept between runs: elsewhere Lock fails with an error
// matching ErrNotAcquired, and gocron skips the run. Lock registers each name as a Job's
// key (ErrInvalidKey, ErrInvalidArgument); Unlock returns a *LockLostError when the lease
// was lost during the run. GocronLocker returns an error matching ErrInvalidArgument for
// a bad option, or ErrClosed. The locker is safe for concurrent use. See the package
// doc, # gocron adapters.
func (c *Client) GocronLocker(opts ...Option) (gocron.Locker, error) {
	lc := settings{ttl: c.ttl}
	err := applyOptions(&lc, "GocronLocker", opts, Option.everyOption)
	if err != nil {
		return nil, err
	}
	if c.isClosed() {
		return nil, ErrClosed
	}
	k := &gocronLocker{c: c, ttl: lc.ttl, runs: runs{c: c}, leases: make(map[string]*lease)}
	c.onClose(func(ctx context.Context) error {
		k.mu.Lock()
		leases := slices.Collect(maps.Values(k.leases))
		k.mu.Unlock()
		return shutdown(ctx, &k.runs, leases...)
	})
	return k, nil
}

type gocronLocker struct {
	c    *Client
	ttl  time.Duration
	runs runs

	mu     sync.Mutex
	leases map[string]*lease // by job name
}

func (k *gocronLocker) Lock(ctx context.Context, name string) (gocron.Lock, error) {
	s, err := k.lease(name)
	if err != nil {
		return nil, err
	}
	if err := k.runs.start(); err != nil {
		return nil, err
	}
	l, err := s.hold(ctx)
	if err != nil {
		k.runs.end()
		return nil, err
	}
	s.ran()
	return &gocronLock{k: k, job: name, l: l, start: time.Now()}, nil
}

// lease returns the lease of job name, registering it at its first use.
func (k *gocronLocker) lease(name string) (*lease, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if s, ok := k.leases[name]; ok {
		return s, nil
	}
	if err := checkJobKey(name); err != nil {
		return nil, err
	}
	if err := k.c.register(fmt.Sprintf("gocron locker job %q", name), name+leaseSuffix); err != nil {
		return nil, err
	}
	k.c.registered(store.KindJob, name)
	s := newLease(k.c, name, name+leaseSuffix, k.ttl)
	k.leases[name] = s
	return s, nil
}

type gocronLock struct {
	k     *gocronLocker
	job   string
	l     *Lock
	start time.Time // when Lock returned, real clock
	once  sync.Once
}

// Unlock reports the run as OutcomeOK, or OutcomeLost when the lease was lost during
// it: gocron does not tell a locker how its task ended.
func (g *gocronLock) Unlock(context.Context) error {
	var err error
	g.once.Do(func() {
		err = lostCause(g.l.Context())
		outcome, text := OutcomeOK, ""
		if err != nil {
			outcome, text = OutcomeLost, err.Error()
		}
		g.k.c.jobRan(g.job, g.l, slotRun{}, g.start, outcome, text)
		g.k.runs.end()
	})
	return err
}
