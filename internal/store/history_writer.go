package store

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
)

// The client's side of the run history: runs and skipped ticks written to the store in
// the background (pglock's history.go).
const (
	// skipFlushEvery is how often, at most, a client writes the skips it counted.
	skipFlushEvery = time.Second
	// maxPendingRuns bounds the runs waiting for the writer: runs that come faster than
	// the store takes them are dropped beyond it (and logged), never queued without end.
	maxPendingRuns = 10000
)

// History writes a client's runs and skip counts to its store in the background, on a
// goroutine started at the first record. Its methods do nothing on a nil History
// (recording off). It is safe for concurrent use.
type History struct {
	store     Store
	logger    *slog.Logger
	instance  string
	retention time.Duration
	ctx       context.Context // the writes'; cancelled when Close stops waiting
	cancel    context.CancelFunc

	mu      sync.Mutex
	runs    []RunRecord
	dropped int // runs dropped since the last write, maxPendingRuns being reached
	skips   map[skipKey]*SkipCount
	flushed time.Time // the last write of skips, real clock
	started bool
	closed  bool
	wake    chan struct{} // buffered 1
	done    chan struct{} // closed when the writer ends
}

type skipKey struct {
	job    string
	reason string
}

// NewHistory returns the history writer of a client of instance on b, or nil when
// retention is 0.
func NewHistory(b Store, logger *slog.Logger, instance string, retention time.Duration) *History {
	if retention == 0 {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &History{store: b, logger: logger, instance: instance, retention: retention, ctx: ctx, cancel: cancel,
		skips: make(map[skipKey]*SkipCount), wake: make(chan struct{}, 1), done: make(chan struct{})}
}

// Record queues a run; after Close it is dropped.
func (h *History) Record(r RunRecord) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		h.logger.Debug("pglock: job run not recorded: the client is closed", slog.String("key", r.Job),
			slog.String("owner", r.Owner), slog.Int64("token", r.Token))
		return
	}
	if len(h.runs) >= maxPendingRuns {
		h.dropped++
		return
	}
	h.runs = append(h.runs, r)
	h.signal()
}

// Skip counts n skipped ticks (or slots) of job.
func (h *History) Skip(job string, reason string, n int) {
	if h == nil {
		return
	}
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	k := skipKey{job, reason}
	s := h.skips[k]
	if s == nil {
		s = &SkipCount{Job: job, Reason: reason}
		h.skips[k] = s
	}
	s.Count += int64(n)
	s.Last = now
	h.signal()
}

// signal wakes the writer, starting it the first time. h.mu is held.
func (h *History) signal() {
	if !h.started {
		h.started = true
		go h.write()
	}
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// write is the writer: it writes the runs queued, one statement each, and the skips
// counted once skipFlushEvery has passed since their last write (at once when
// closing), until Close.
func (h *History) write() {
	defer close(h.done)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		h.mu.Lock()
		runs, dropped := h.runs, h.dropped
		h.runs, h.dropped = nil, 0
		closed := h.closed
		var skips []SkipCount
		var wait time.Duration
		if len(h.skips) > 0 {
			if due := h.flushed.Add(skipFlushEvery); closed || !time.Now().Before(due) {
				for _, s := range h.skips {
					skips = append(skips, *s)
				}
				clear(h.skips)
				h.flushed = time.Now()
			} else {
				wait = time.Until(due)
			}
		}
		h.mu.Unlock()
		if h.ctx.Err() != nil { // Close gave up waiting: drop the rest
			if n := len(runs); n > 0 {
				h.logger.Warn("pglock: job runs not recorded: Close did not wait for them", slog.Int("runs", n))
			}
			return
		}
		if dropped > 0 {
			h.logger.Warn("pglock: job runs not recorded: they came faster than the store took them",
				slog.Int("runs", dropped))
		}
		for _, r := range runs {
			h.writeRun(r)
		}
		if len(skips) > 0 {
			h.writeSkips(skips)
		}
		if len(runs) > 0 || len(skips) > 0 {
			continue // more may have come meanwhile
		}
		if closed {
			return
		}
		if wait > 0 {
			timer.Reset(wait)
		}
		select {
		case <-h.wake:
		case <-timer.C:
		}
		timer.Stop()
	}
}

func (h *History) writeRun(r RunRecord) {
	ctx, cancel := context.WithTimeout(h.ctx, Timeout)
	defer cancel()
	if err := h.store.RecordRun(ctx, r, h.retention); err != nil {
		h.logger.Warn("pglock: job run not recorded", slog.String("key", r.Job), slog.String("owner", r.Owner),
			slog.Int64("token", r.Token), slog.Any("err", err))
	}
}

func (h *History) writeSkips(skips []SkipCount) {
	slices.SortFunc(skips, func(a, b SkipCount) int {
		return cmp.Or(strings.Compare(a.Job, b.Job), strings.Compare(a.Reason, b.Reason))
	})
	ctx, cancel := context.WithTimeout(h.ctx, Timeout)
	defer cancel()
	if err := h.store.RecordSkips(ctx, h.instance, skips, h.retention); err != nil {
		h.logger.Warn("pglock: skipped job ticks not counted", slog.Int("jobs", len(skips)), slog.Any("err", err))
	}
}

// Close is Client.Close's step: it writes what is pending, until ctx ends; then the
// writes in flight are cancelled and the rest dropped.
func (h *History) Close(ctx context.Context) error {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	h.closed = true
	started := h.started
	h.mu.Unlock()
	defer h.cancel()
	if !started {
		return nil
	}
	select {
	case h.wake <- struct{}{}:
	default:
	}
	return WaitDone(ctx, h.done)
}
