package pglock

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/pgfence/pglock/internal/store"
)

// The hand-backs: what a failed acquisition may have been granted, released in the
// background (see the package doc, # Handing back a failed acquisition).

// maxHandBacks caps the hand-backs a Client keeps pending. Past it, what a failed
// acquisition may have been granted is left to expire after its ttl (logged at Warn):
// a flood of failures (an outage, a crowd whose ctxs end) must not become a flood of
// releases.
const maxHandBacks = 1024

// handBackRetries are the pauses, on the real clock, between the releases of a failed
// acquisition that found nothing to release: about the time a statement can take to
// reach the server and commit there, when the link or the server is slow. A call that
// fails counts as a try too.
var handBackRetries = []time.Duration{20 * time.Millisecond, 100 * time.Millisecond, 500 * time.Millisecond, 2 * time.Second}

// maxHandBackPause bounds the pause of every pending hand-back after a release call
// failed: while the store is away, a Client makes at most one release call per pause.
const maxHandBackPause = 2 * time.Second

// handBacks releases, in the background, what failed acquisitions may have been granted
// (see undoAcquire). They are bounded for the whole Client: one goroutine, running while
// any is pending, makes one release call at a time, which hands back every one that is
// due (up to store.MaxReleaseMany: over a slow link, one call per hand-back in a row made
// the last ones later than their ttl); each (key, owner) is pending once,
// at most maxHandBacks of them, each released up to 1+len(handBackRetries) times while
// nothing is found; a failed call pauses them all (doubling up to maxHandBackPause),
// so that an unreachable store sees about one connection attempt per pause. On a
// *pgxpool.Pool, the calls go as renewals do (Renewals.ReleaseMany), never behind the
// application's use of the pool. Close gives
// each one last release at once and waits (a failed call then drops the rest, which
// expire after their ttl); when Close's ctx ends first, the call in flight is cancelled.
type handBacks struct {
	many   func(ctx context.Context, keys, owners []string) ([]int, error) // the store's ReleaseMany, or the renewals'
	logger *slog.Logger
	ctx    context.Context // the release calls'; cancelled when Close stops waiting
	cancel context.CancelFunc

	mu      sync.Mutex
	pending map[handBackID]*handBack
	wake    chan struct{} // a new hand-back or Close, for the worker
	idle    chan struct{} // closed when the running worker ends; nil when none runs
	closing bool          // Close began: one last release each; none waits once the worker ends

	awaiting sync.WaitGroup // abandoned acquisitions waiting for their replies (undoAbandoned)
}

type handBackID struct{ key, owner string }

type handBack struct {
	tries int       // release calls made
	next  time.Time // when the next is due, on the real clock
}

func newHandBacks(s store.Store, logger *slog.Logger) *handBacks {
	ctx, cancel := context.WithCancel(context.Background())
	return &handBacks{many: s.ReleaseMany, logger: logger, ctx: ctx, cancel: cancel,
		pending: make(map[handBackID]*handBack), wake: make(chan struct{}, 1)}
}

// undoAcquire releases key for owner, drawn by an acquisition that failed after its
// call may have reached the store (or whose grant came too late, or was bad), so that
// the key is not left to an owner nobody knows for a whole ttl. The acquisition may
// reach the server, or commit, only after a release has found nothing, so a release
// that finds nothing is tried again (see handBacks). Best effort: an acquisition that
// commits later still expires after its ttl. It does not wait, except once Close has
// stopped the hand-backs: then it makes one release call itself.
func (c *Client) undoAcquire(key, owner string, ttl time.Duration) {
	h := c.handBacks
	id := handBackID{key, owner}
	h.mu.Lock()
	switch {
	case h.closing && h.idle == nil:
		h.mu.Unlock()
		ctx, cancel := detached(context.Background())
		defer cancel()
		_, _ = h.release(ctx, []handBackID{id})
		return
	case h.pending[id] != nil:
		h.mu.Unlock()
		return
	case len(h.pending) >= maxHandBacks:
		h.mu.Unlock()
		h.logger.Warn("pglock: too many hand-backs pending; the lock may stay held until its ttl",
			slog.String("key", key), slog.String("owner", owner), slog.Duration("ttl", ttl))
		return
	}
	h.pending[id] = &handBack{next: time.Now()}
	if h.idle == nil {
		h.idle = make(chan struct{})
		go h.run(h.idle)
	}
	h.mu.Unlock()
	h.poke()
}

// release hands ids back in one call and returns those it released.
func (h *handBacks) release(ctx context.Context, ids []handBackID) (map[handBackID]bool, error) {
	released := make(map[handBackID]bool, len(ids))
	keys, owners := make([]string, len(ids)), make([]string, len(ids))
	for i, id := range ids {
		keys[i], owners[i] = id.key, id.owner
	}
	is, err := h.many(ctx, keys, owners)
	for _, i := range is {
		released[ids[i]] = true
	}
	return released, err
}

func (h *handBacks) poke() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// run is the worker: it releases what is due, in one call, until nothing is pending,
// then closes idle.
func (h *handBacks) run(idle chan struct{}) {
	var pause time.Duration // after a failed call; zero after a good one
	var notBefore time.Time // no call before, after a failed one
	for {
		h.mu.Lock()
		if len(h.pending) == 0 || h.ctx.Err() != nil {
			clear(h.pending)
			h.idle = nil
			close(idle)
			h.mu.Unlock()
			return
		}
		closing := h.closing
		due := h.firstDue()
		if closing {
			due = time.Time{} // one last release each, at once
		} else if notBefore.After(due) {
			due = notBefore
		}
		if wait := time.Until(due); wait > 0 {
			h.mu.Unlock()
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-h.wake: // something new, maybe due earlier, or Close
			case <-h.ctx.Done():
			}
			t.Stop()
			continue
		}
		ids := h.due(closing)
		h.mu.Unlock()

		ctx, cancel := context.WithTimeout(h.ctx, store.Timeout)
		released, err := h.release(ctx, ids)
		cancel()
		now := time.Now()
		if err != nil {
			pause = min(max(2*pause, handBackRetries[0]), maxHandBackPause)
			notBefore = now.Add(pause)
		} else {
			pause = 0
		}

		h.mu.Lock()
		if closing && err != nil {
			h.logger.Debug("pglock: store unreachable at Close; failed acquisitions left to expire",
				slog.Int("locks", len(h.pending)), slog.Any("err", err))
			clear(h.pending)
		}
		for _, id := range ids {
			hb := h.pending[id]
			if hb == nil {
				continue
			}
			hb.tries++
			if released[id] || closing || hb.tries > len(handBackRetries) {
				delete(h.pending, id)
			} else {
				hb.next = now.Add(handBackRetries[hb.tries-1])
			}
		}
		h.mu.Unlock()
	}
}

// firstDue returns when the pending hand-back due first is due. Called with mu held,
// pending not empty.
func (h *handBacks) firstDue() time.Time {
	var first time.Time
	for _, hb := range h.pending {
		if first.IsZero() || hb.next.Before(first) {
			first = hb.next
		}
	}
	return first
}

// due returns the pending hand-backs that are due (all of them when closing), at most
// store.MaxReleaseMany, those due first first. Called with mu held.
func (h *handBacks) due(closing bool) []handBackID {
	now := time.Now()
	var ids []handBackID
	for id, hb := range h.pending {
		if closing || !hb.next.After(now) {
			ids = append(ids, id)
		}
	}
	slices.SortFunc(ids, func(a, b handBackID) int { return h.pending[a].next.Compare(h.pending[b].next) })
	return ids[:min(len(ids), store.MaxReleaseMany)]
}

// await counts an abandoned acquisition that Close must wait for, unless Close is
// handing back already (false).
func (h *handBacks) await() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closing {
		return false
	}
	h.awaiting.Add(1)
	return true
}

// close waits for the abandoned acquisitions' replies, then gives every pending
// hand-back its last release and waits for the worker, or for ctx to end: then it
// cancels the calls in flight, drops the rest and returns ctx's cause. Hand-backs that
// come later make their one release call in their caller.
func (h *handBacks) close(ctx context.Context) error {
	h.mu.Lock()
	h.closing = true
	h.mu.Unlock()
	replied := make(chan struct{})
	go func() {
		h.awaiting.Wait()
		close(replied)
	}()
	if err := store.WaitDone(ctx, replied); err != nil {
		h.cancel() // their calls end, and so does the goroutine above
		return err
	}
	h.mu.Lock()
	idle := h.idle
	h.mu.Unlock()
	if idle == nil {
		return nil
	}
	h.poke()
	if err := store.WaitDone(ctx, idle); err != nil {
		h.cancel()
		return err
	}
	return nil
}
