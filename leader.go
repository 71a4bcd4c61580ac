package pglock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"github.com/pgfence/pglock/internal/store"
)

// LeaderCallbacks is what an instance does while it leads an election: see
// Client.Elect.
type LeaderCallbacks struct {
	// OnAcquired is called, on a goroutine of the election's, when this instance starts
	// leading, with the lease, whose Token fences what the leader writes. ctx carries the
	// lease (FromContext) and is cancelled when the leadership ends, its cause a
	// *LockLostError, ErrResigned or ErrClosed. It may return nil at once, leaving work
	// on ctx, or run until ctx ends, but must return once ctx ends. An error or a panic
	// steps down. Required.
	OnAcquired func(ctx context.Context, lock *Lock) error
	// OnLost is called when this instance stops leading, on OnAcquired's goroutine once
	// OnAcquired has returned (never without one before it) and, on a voluntary
	// step-down, before the lease is handed back, so that the next leader's work never
	// overlaps this one's. Optional.
	OnLost func(lock *Lock)
}

// StepDownReason says why a leader stepped down (Event.StepDownReason, with
// EventLeadershipLost): a value that stays the same from release to release.
type StepDownReason string

const (
	// StepDownLeaseLost: the lease was lost; Event.LostReason says how, and Err is the
	// *LockLostError.
	StepDownLeaseLost StepDownReason = "lease-lost"
	// StepDownResigned: Election.Resign; Err is ErrResigned.
	StepDownResigned StepDownReason = "resigned"
	// StepDownClosed: the Client's Close; Err is ErrClosed.
	StepDownClosed StepDownReason = "closed"
	// StepDownOnAcquiredFailed: OnAcquired returned an error (Err wraps it) or
	// panicked; the instance campaigns again after ttl/3.
	StepDownOnAcquiredFailed StepDownReason = "on-acquired-failed"
)

// Election is this instance's part in a leader election on a key: see Client.Elect.
// Its methods are safe for concurrent use.
type Election struct {
	c      *Client
	key    string
	leader LeaderCallbacks
	ttl    time.Duration
	ctx    context.Context         // the election's lifetime
	end    context.CancelCauseFunc // ends it, with ErrResigned or ErrClosed
	done   chan struct{}           // closed once it has ended (stepped down, stopped campaigning)

	mu   sync.Mutex
	lock *Lock // the lease while leading
}

// Elect makes this instance campaign for the leadership of key until Resign or Close,
// with a lease of the client's ttl unless TTL sets it. While it leads it runs
// leader.OnAcquired, then leader.OnLost when the lease is lost, at Resign or Close, or
// when OnAcquired fails. It returns an error wrapping ErrInvalidKey for a bad key,
// ErrInvalidArgument for a nil OnAcquired, a bad option or a key already registered on
// this client (a job's or another election's), or ErrClosed after Close, and then starts
// nothing. See the package doc, # Leader election.
func (c *Client) Elect(key string, leader LeaderCallbacks, opts ...Option) (*Election, error) {
	cfg, err := lockSettings(c, key, "Elect", opts, Option.everyOption)
	if err != nil {
		return nil, err
	}
	if leader.OnAcquired == nil {
		return nil, invalidArg("Elect: nil OnAcquired")
	}
	ttl := cfg.ttl
	if err := c.register(fmt.Sprintf("election %q", key), key); err != nil {
		return nil, err
	}
	c.registered(store.KindElection, key)
	e := &Election{c: c, key: key, leader: leader, ttl: ttl, done: make(chan struct{})}
	e.ctx, e.end = context.WithCancelCause(context.Background())
	c.onClose(func(ctx context.Context) error { return e.stop(ctx, ErrClosed) })
	go e.run()
	return e, nil
}

// IsLeader reports whether this instance leads: it holds the lease and has not started
// stepping down. A paused leader cannot know that its lease expired meanwhile, so fence
// its writes with the lease's token (see FenceUpdate and the package doc, # Leader
// election).
func (e *Election) IsLeader() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lock != nil && e.lock.Held()
}

// Resign ends this instance's part in the election: it steps down if it leads
// (OnAcquired's ctx ends with ErrResigned, OnLost runs, the lease is handed back) and
// stops campaigning; the key is then free for another Elect on this client. ctx bounds
// the wait: when it ends first, Resign returns its cause and the step-down goes on. It
// returns nil once the election has ended, now or before (after Close, for one), and is
// safe to call more than once.
func (e *Election) Resign(ctx context.Context) error {
	return e.stop(ctx, ErrResigned)
}

// Leader reads who leads now from the store, as a LockInfo of the election's key, with
// Held false and every field but Key zero when nobody leads. It may name another instance
// while IsLeader is still true. ctx bounds the store call. It returns ErrClosed after
// Close, or the store's error.
func (e *Election) Leader(ctx context.Context) (LockInfo, error) {
	if e.c.isClosed() {
		return LockInfo{}, ErrClosed
	}
	l, err := e.c.store.Holder(ctx, e.key)
	return lockInfo(l), err
}

// stop ends the election with why (the first why wins) and waits until it has ended
// or ctx ends.
func (e *Election) stop(ctx context.Context, why error) error {
	e.end(why)
	return store.WaitDone(ctx, e.done)
}

// run campaigns until the election ends.
func (e *Election) run() {
	defer close(e.done)
	defer e.c.unregister(e.key)
	defer e.c.registry.Remove(store.KindElection, e.key)
	w := e.c.listener.waiter(target{key: e.key})
	defer w.stop()
	free := 0 // how many times in a row the key looked free
	// A campaign that fails for want of the store (outage: a failover, say, whose
	// first calls meet pooled connections to the dead primary) is made again soon,
	// doubling up to ttl/3, on the real clock as Acquire does; failed counts them.
	failed := 0
	for e.ctx.Err() == nil {
		wake := w.woken()
		l, err := e.campaign()
		switch {
		case err == nil:
			free, failed = 0, 0
			if e.lead(l) {
				wake = nil // campaign again after ttl/3, not at once
			}
		case errors.Is(err, ErrNotAcquired):
			failed = 0
			if e.c.waitTurn(e.ctx, w, e.ttl/3, &free) != nil {
				return
			}
			continue
		case errors.Is(err, ErrClosed):
			return
		case outage(err):
			failed++
			retry := min(e.ttl/3, 5*time.Millisecond<<min(failed-1, 20))
			if failed == 1 || retry == e.ttl/3 {
				e.c.logger.Warn("pglock: campaign failed", slog.String("key", e.key), slog.Any("err", err))
			}
			if wakeOrAfter(e.ctx, jitter(retry), wake) != nil {
				return
			}
			continue
		default:
			e.c.logger.Warn("pglock: campaign failed", slog.String("key", e.key), slog.Any("err", err))
		}
		if e.c.sleepOrWake(e.ctx, e.ttl/3, wake) != nil {
			return
		}
	}
}

// campaign tries to take the lease once. The call is detached from the election's end,
// so that a lease taken while Resign or Close cancels it is known, and handed back.
func (e *Election) campaign() (*Lock, error) {
	ctx, cancel := detached(e.ctx)
	defer cancel()
	return e.c.try(ctx, e.key, e.ttl)
}

// lead is one term: from taking the lease to stepping down. It reports whether the term
// ended because OnAcquired failed.
func (e *Election) lead(l *Lock) (failed bool) {
	if e.ctx.Err() != nil { // ended while campaigning: never led
		e.releaseLease(l)
		return false
	}
	ctx, cancel := context.WithCancelCause(l.Context())
	e.mu.Lock()
	e.lock = l
	e.mu.Unlock()
	e.c.logger.Info("pglock: leading", slog.String("key", e.key), slog.String("owner", l.Owner()), slog.Int64("token", l.Token()))
	e.c.emit(Event{Type: EventLeadershipAcquired, Key: e.key}, l)

	returned := make(chan error, 1)
	go func() { returned <- e.onAcquired(ctx, l) }()
	var err error // OnAcquired's, if it returned before the term ended
	running := true
	select {
	case err = <-returned:
		running = false
	case <-l.Context().Done():
	case <-e.ctx.Done():
	}
	if !running && err == nil { // it left its work running on ctx: lead on
		select {
		case <-l.Context().Done():
		case <-e.ctx.Done():
		}
	}

	// Why the term ends: a lost lease first, then Resign or Close, then OnAcquired.
	var lost *LockLostError
	var cause error
	var why StepDownReason
	switch {
	case errors.As(context.Cause(l.Context()), &lost):
		cause, why = lost, StepDownLeaseLost
	case e.ctx.Err() != nil:
		cause, why = context.Cause(e.ctx), StepDownResigned
		if errors.Is(cause, ErrClosed) {
			why = StepDownClosed
		}
	case err != nil:
		cause, why, failed = err, StepDownOnAcquiredFailed, true
	default: // the lease was released under the election: only Close does that
		cause, why = ErrClosed, StepDownClosed
	}
	e.mu.Lock()
	e.lock = nil
	e.mu.Unlock()
	cancel(cause)
	if running {
		<-returned // what it returns once cancelled is no reason to step down: there is one
	}
	e.onLost(l)
	e.c.logger.Info("pglock: stepped down", slog.String("key", e.key), slog.Int64("token", l.Token()),
		slog.String("reason", string(why)), slog.Any("err", cause))
	ev := Event{Type: EventLeadershipLost, Key: e.key, StepDownReason: why, Err: cause}
	if lost != nil {
		ev.LostReason = lost.Reason
	}
	e.c.emit(ev, l)
	if lost == nil {
		e.releaseLease(l)
	}
	return failed
}

// releaseLease releases the lease, logging a failure (Release is detached from e.ctx's cancellation).
func (e *Election) releaseLease(l *Lock) {
	if err := l.Release(e.ctx); err != nil {
		e.c.logger.Warn("pglock: lease not handed back; it expires after its ttl", slog.String("key", e.key),
			slog.Int64("token", l.Token()), slog.Any("err", err))
	}
}

// onAcquired calls OnAcquired, wrapping its error and turning a panic into one.
func (e *Election) onAcquired(ctx context.Context, l *Lock) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("pglock: OnAcquired panicked: %v", r)
			e.logPanic(err)
		}
	}()
	if err := e.leader.OnAcquired(ctx, l); err != nil {
		return fmt.Errorf("pglock: OnAcquired: %w", err)
	}
	return nil
}

// onLost calls OnLost, if set, recovering a panic.
func (e *Election) onLost(l *Lock) {
	if e.leader.OnLost == nil {
		return
	}
	defer func() {
		if r := recover(); r != nil {
			e.logPanic(fmt.Errorf("pglock: OnLost panicked: %v", r))
		}
	}()
	e.leader.OnLost(l)
}

func (e *Election) logPanic(err error) {
	e.c.logger.Error("pglock: leader callback panicked", slog.String("key", e.key), slog.Any("err", err),
		slog.String("stack", string(debug.Stack())))
}

// Elections returns every election registered on any instance, sorted by key, each as
// Election.Leader reads it. ctx bounds the store call. Errors: the store's.
func (c *Client) Elections(ctx context.Context) ([]LockInfo, error) {
	locks, err := c.store.Elections(ctx)
	if err != nil {
		return nil, err
	}
	return lockInfos(locks), nil
}
