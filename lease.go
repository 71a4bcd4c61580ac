package pglock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// lease is the sticky lease of a job, of a gocron locker's job or of a gocron elector:
// taken by the first tick that finds it free, then kept, renewed by the client's
// renewer, between ticks, until it is lost (the next tick tries to take it again) or
// handed back at Close.
type lease struct {
	c      *Client
	job    string // what ticks under it, for logs and events
	key    string // the lease's own key
	ttl    time.Duration
	taking chan struct{} // one hold at a time: concurrent ticks wait for a take, not lose to it
	// slotted: the job's slots vouch that a tick runs once, not the lease, which only
	// says which instance claims them: hold skips the rules below.
	slotted bool

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
//
// The lease vouches that no other instance ran the same tick, which instances' ticks
// begin within moments of each other; two rules keep that true when one is late. An
// owner runs a tick only while its renewal is not overdue (Lock.fresh): its lease
// lives on for more than half a ttl on the database clock, so another instance's take
// finds it held. A take must be answered within a third of the ttl after the tick
// began (the wait for a concurrent hold and for a pool connection included), so it
// cannot find free a lease that a paused owner kept past the tick and ran it under.
// Either rule broken, the tick is skipped (SkipLeaseInDoubt), and a grant that came
// too late is handed back. The lease of a job with slots keeps neither rule.
func (s *lease) hold(ctx context.Context) (*Lock, error) {
	if s.c.isClosed() {
		return nil, ErrClosed
	}
	bound, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if !s.slotted {
		t := s.c.clock.AfterFunc(s.ttl/3, func() { cancel(errTakeLate) })
		defer t.Stop()
	}
	select {
	case s.taking <- struct{}{}:
	default: // wait, unless ctx ends first; a held lease needs no live ctx
		select {
		case s.taking <- struct{}{}:
		case <-bound.Done():
			return nil, s.late(ctx, context.Cause(bound))
		}
	}
	defer func() { <-s.taking }()
	s.mu.Lock()
	l := s.lock
	s.mu.Unlock()
	if l != nil && l.Held() {
		if !s.slotted && !l.fresh() {
			return nil, s.doubt("its renewal is overdue")
		}
		return l, nil
	}
	l, err := s.c.try(bound, s.key, s.ttl)
	if errors.Is(err, ErrNotAcquired) {
		s.c.skipped(s.job, SkipOtherInstance)
	}
	if err != nil {
		return nil, s.late(ctx, err)
	}
	s.mu.Lock()
	s.lock = l
	s.mu.Unlock()
	s.c.logger.Info("pglock: job runs on this instance", slog.String("key", s.job),
		slog.String("lease", s.key), slog.String("owner", l.Owner()), slog.Int64("token", l.Token()))
	return l, nil
}

// errTakeLate is the cause of a take's ctx when a third of the ttl has passed.
var errTakeLate = errors.New("pglock: the take of a job's lease came too late")

// late returns err, or, when the take ran out of its third of the ttl while ctx is
// live, skips the tick as in doubt.
func (s *lease) late(ctx context.Context, err error) error {
	if ctx.Err() == nil && errors.Is(err, errTakeLate) {
		return s.doubt(fmt.Sprintf("its take was not answered within %v, a third of the ttl, of the tick's start", s.ttl/3))
	}
	return err
}

// doubt skips the tick as one the lease cannot vouch for (SkipLeaseInDoubt).
func (s *lease) doubt(why string) error {
	s.c.skipped(s.job, SkipLeaseInDoubt)
	return fmt.Errorf("%w: job %q: the lease %q cannot vouch for this tick: %s", ErrNotAcquired, s.job, s.key, why)
}

// ran records that a run under the lease starts now.
func (s *lease) ran() {
	now := s.c.clock.Now()
	s.mu.Lock()
	s.ranAt = now
	s.mu.Unlock()
}

// releaseAtClose gives the lease back at Close. A lease whose last run started less than a
// second ago, on the client's clock, is kept for the rest of that second, so that
// instances firing the same tick a moment later skip it rather than run it again.
// ctx bounds that wait; the release runs detached from ctx's cancellation.
func (s *lease) releaseAtClose(ctx context.Context) error {
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
		if err := s.releaseAtClose(ctx); err != nil {
			if ctx.Err() != nil {
				return err
			}
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
