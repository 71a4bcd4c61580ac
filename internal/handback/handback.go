// Package handback releases, in the background, what failed acquisitions may have been
// granted, so that a key is not left to an owner nobody knows for a whole ttl (see the
// root package's doc, # Handing back a failed acquisition).
//
// An acquisition may reach the server, or commit, only after a release has found
// nothing, so a release that finds nothing is tried again. The hand-backs are bounded
// for the whole Client: one goroutine, running while any is pending, makes one release
// call at a time, which hands back every one that is due (up to store.MaxReleaseMany:
// over a slow link, one call per hand-back in a row made the last ones later than their
// ttl); each (key, owner) is pending once, at most maxPending of them, each released up
// to 1+len(retries) times while nothing is found; a failed call pauses them all
// (doubling up to maxPause), so that an unreachable store sees about one connection
// attempt per pause. Best effort: an acquisition that commits later still expires after
// its ttl.
package handback

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/pgfence/pglock/internal/store"
)

// maxPending caps the hand-backs a Queue keeps pending. Past it, what a failed
// acquisition may have been granted is left to expire after its ttl (logged at Warn): a
// flood of failures (an outage, a crowd whose ctxs end) must not become a flood of
// releases.
const maxPending = 1024

// retries are the pauses, on the real clock, between the releases of a hand-back that
// found nothing to release: about the time a statement can take to reach the server and
// commit there, when the link or the server is slow. A call that fails counts as a try.
var retries = []time.Duration{20 * time.Millisecond, 100 * time.Millisecond, 500 * time.Millisecond, 2 * time.Second}

// maxPause bounds the pause of every pending hand-back after a release call failed:
// while the store is away, a Queue makes at most one release call per pause.
const maxPause = 2 * time.Second

// Config is what a Queue needs.
type Config struct {
	// ReleaseMany releases keys[i] held by owners[i] and returns the indexes of those
	// it released (store.Store.ReleaseMany, or the renewals' own connections').
	ReleaseMany func(ctx context.Context, keys, owners []string) ([]int, error)
	Logger      *slog.Logger
}

// Queue holds a Client's pending hand-backs. Close gives each one last release at once
// and waits (a failed call then drops the rest, which expire after their ttl); when
// Close's ctx ends first, the call in flight is cancelled.
type Queue struct {
	many   func(ctx context.Context, keys, owners []string) ([]int, error)
	logger *slog.Logger
	ctx    context.Context // the release calls'; cancelled when Close stops waiting
	cancel context.CancelFunc

	mu      sync.Mutex
	pending map[id]*handBack
	wake    chan struct{} // a new hand-back or Close, for the worker
	idle    chan struct{} // closed when the running worker ends; nil when none runs
	closing bool          // Close began: one last release each; none waits once the worker ends

	awaiting sync.WaitGroup // abandoned acquisitions waiting for their replies (Await)
}

type id struct{ key, owner string }

type handBack struct {
	tries int       // release calls made
	next  time.Time // when the next is due, on the real clock
}

// New returns a Queue that releases through cfg.ReleaseMany.
func New(cfg Config) *Queue {
	ctx, cancel := context.WithCancel(context.Background())
	return &Queue{many: cfg.ReleaseMany, logger: cfg.Logger, ctx: ctx, cancel: cancel,
		pending: make(map[id]*handBack), wake: make(chan struct{}, 1)}
}

// Add hands key back for owner: an acquisition that failed after its call may have
// reached the store (or whose grant came too late, or was bad). It does not wait, except
// once Close has stopped the worker: then it makes one release call itself.
func (q *Queue) Add(key, owner string, ttl time.Duration) {
	hid := id{key, owner}
	q.mu.Lock()
	switch {
	case q.closing && q.idle == nil:
		q.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), store.Timeout)
		defer cancel()
		_, _ = q.release(ctx, []id{hid})
		return
	case q.pending[hid] != nil:
		q.mu.Unlock()
		return
	case len(q.pending) >= maxPending:
		q.mu.Unlock()
		q.logger.Warn("pglock: too many hand-backs pending; the lock may stay held until its ttl",
			slog.String("key", key), slog.String("owner", owner), slog.Duration("ttl", ttl))
		return
	}
	q.pending[hid] = &handBack{next: time.Now()}
	if q.idle == nil {
		q.idle = make(chan struct{})
		go q.run(q.idle)
	}
	q.mu.Unlock()
	q.poke()
}

// Await counts an abandoned acquisition that Close must wait for (ending with Done),
// unless Close is handing back already (false).
func (q *Queue) Await() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closing {
		return false
	}
	q.awaiting.Add(1)
	return true
}

// Done ends what a true Await began.
func (q *Queue) Done() { q.awaiting.Done() }

// AfterGiveUp calls f in its own goroutine once Close stops waiting for the abandoned
// acquisitions; stop undoes it (context.AfterFunc).
func (q *Queue) AfterGiveUp(f func()) (stop func() bool) { return context.AfterFunc(q.ctx, f) }

// Close waits for the abandoned acquisitions' replies, then gives every pending
// hand-back its last release and waits for the worker, or for ctx to end: then it
// cancels the calls in flight, drops the rest and returns ctx's cause. Hand-backs that
// come later make their one release call in their caller.
func (q *Queue) Close(ctx context.Context) error {
	q.mu.Lock()
	q.closing = true
	q.mu.Unlock()
	replied := make(chan struct{})
	go func() {
		q.awaiting.Wait()
		close(replied)
	}()
	if err := store.WaitDone(ctx, replied); err != nil {
		q.cancel() // their calls end, and so does the goroutine above
		return err
	}
	q.mu.Lock()
	idle := q.idle
	q.mu.Unlock()
	if idle == nil {
		return nil
	}
	q.poke()
	if err := store.WaitDone(ctx, idle); err != nil {
		q.cancel()
		return err
	}
	return nil
}

// release hands ids back in one call and returns those it released.
func (q *Queue) release(ctx context.Context, ids []id) (map[id]bool, error) {
	released := make(map[id]bool, len(ids))
	keys, owners := make([]string, len(ids)), make([]string, len(ids))
	for i, hid := range ids {
		keys[i], owners[i] = hid.key, hid.owner
	}
	is, err := q.many(ctx, keys, owners)
	for _, i := range is {
		released[ids[i]] = true
	}
	return released, err
}

func (q *Queue) poke() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// run is the worker: it releases what is due, in one call, until nothing is pending,
// then closes idle.
func (q *Queue) run(idle chan struct{}) {
	var pause time.Duration // after a failed call; zero after a good one
	var notBefore time.Time // no call before, after a failed one
	for {
		q.mu.Lock()
		if len(q.pending) == 0 || q.ctx.Err() != nil {
			clear(q.pending)
			q.idle = nil
			close(idle)
			q.mu.Unlock()
			return
		}
		closing := q.closing
		due := q.firstDue()
		if closing {
			due = time.Time{} // one last release each, at once
		} else if notBefore.After(due) {
			due = notBefore
		}
		if wait := time.Until(due); wait > 0 {
			q.mu.Unlock()
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-q.wake: // something new, maybe due earlier, or Close
			case <-q.ctx.Done():
			}
			t.Stop()
			continue
		}
		ids := q.due(closing)
		q.mu.Unlock()

		ctx, cancel := context.WithTimeout(q.ctx, store.Timeout)
		released, err := q.release(ctx, ids)
		cancel()
		now := time.Now()
		if err != nil {
			pause = min(max(2*pause, retries[0]), maxPause)
			notBefore = now.Add(pause)
		} else {
			pause = 0
		}

		q.mu.Lock()
		if closing && err != nil {
			q.logger.Debug("pglock: store unreachable at Close; failed acquisitions left to expire",
				slog.Int("locks", len(q.pending)), slog.Any("err", err))
			clear(q.pending)
		}
		for _, hid := range ids {
			hb := q.pending[hid]
			if hb == nil {
				continue
			}
			hb.tries++
			if released[hid] || closing || hb.tries > len(retries) {
				delete(q.pending, hid)
			} else {
				hb.next = now.Add(retries[hb.tries-1])
			}
		}
		q.mu.Unlock()
	}
}

// firstDue returns when the pending hand-back due first is due. Called with mu held,
// pending not empty.
func (q *Queue) firstDue() time.Time {
	var first time.Time
	for _, hb := range q.pending {
		if first.IsZero() || hb.next.Before(first) {
			first = hb.next
		}
	}
	return first
}

// due returns the pending hand-backs that are due (all of them when closing), at most
// store.MaxReleaseMany, those due first first. Called with mu held.
func (q *Queue) due(closing bool) []id {
	now := time.Now()
	var ids []id
	for hid, hb := range q.pending {
		if closing || !hb.next.After(now) {
			ids = append(ids, hid)
		}
	}
	slices.SortFunc(ids, func(a, b id) int { return q.pending[a].next.Compare(q.pending[b].next) })
	return ids[:min(len(ids), store.MaxReleaseMany)]
}
