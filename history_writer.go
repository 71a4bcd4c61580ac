package pglock

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// The client's side of the run history: runs and skipped ticks written to the store in
// the background.
const (
	// maxRunErr is how many characters of a run's error the history keeps.
	maxRunErr = 1000
	// skipFlushEvery is how often, at most, a client writes the skips it counted.
	skipFlushEvery = time.Second
	// maxPendingRuns bounds the runs waiting for the writer: runs that come faster than
	// the store takes them are dropped beyond it (and logged), never queued without end.
	maxPendingRuns = 10000
)

// runRecord is one run waiting to be written. ended is on the real clock of this
// process: the store turns it into its own clock when it writes the run.
type runRecord struct {
	job, instance, owner string
	token                int64
	slot                 slotRun // zero for a job without a schedule
	ended                time.Time
	duration             time.Duration
	outcome              Outcome
	err                  string
}

// skipCount is the skips of one job for one reason counted since the last flush.
type skipCount struct {
	job    string
	reason SkipReason
	count  int64
	last   time.Time // real clock, as runRecord.ended
}

// jobRan reports a run of job under l, of slot (zero without a schedule), that started
// at start (real clock) and ended now with outcome and err: an EventJobRan, and a
// record for the history.
func (c *Client) jobRan(job string, l *Lock, slot slotRun, start time.Time, outcome Outcome, err string) {
	end := time.Now()
	ev := Event{Type: EventJobRan, Key: job, Duration: end.Sub(start), Outcome: outcome, Time: c.clock.Now(),
		Slot: slot.slot, Attempt: slot.attempt}
	if l != nil {
		ev.Owner, ev.Token = l.entry.Owner, l.token
	}
	c.events.emit(ev)
	c.history.record(runRecord{job: job, instance: c.instance, owner: ev.Owner, token: ev.Token, slot: slot,
		ended: end, duration: ev.Duration, outcome: outcome, err: runErrText(err)})
}

// runErrText is err as the history keeps it: valid UTF-8 without NUL, at most
// maxRunErr characters.
func runErrText(err string) string {
	err = strings.ReplaceAll(strings.ToValidUTF8(err, "\uFFFD"), "\x00", "")
	if utf8.RuneCountInString(err) <= maxRunErr {
		return err
	}
	runes := []rune(err)
	return string(runes[:maxRunErr])
}

// history writes a client's runs and skip counts to its store in the background, on a
// goroutine started at the first record. Its methods do nothing on a nil history
// (recording off, or a type that embeds a Store).
type history struct {
	store     backend
	logger    *slog.Logger
	instance  string
	retention time.Duration
	ctx       context.Context // the writes'; cancelled when Close stops waiting
	cancel    context.CancelFunc

	mu      sync.Mutex
	runs    []runRecord
	dropped int // runs dropped since the last write, maxPendingRuns being reached
	skips   map[skipKey]*skipCount
	flushed time.Time // the last write of skips, real clock
	started bool
	closed  bool
	wake    chan struct{} // buffered 1
	done    chan struct{} // closed when the writer ends
}

type skipKey struct {
	job    string
	reason SkipReason
}

// newHistory returns the history writer of a client on store, or nil when retention
// is 0 or store is a type that embeds a Store.
func newHistory(store Store, logger *slog.Logger, instance string, retention time.Duration) *history {
	b, ok := store.(backend)
	if !ok || retention == 0 {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &history{store: b, logger: logger, instance: instance, retention: retention, ctx: ctx, cancel: cancel,
		skips: make(map[skipKey]*skipCount), wake: make(chan struct{}, 1), done: make(chan struct{})}
}

// record queues a run; after Close it is dropped.
func (h *history) record(r runRecord) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		h.logger.Debug("pglock: job run not recorded: the client is closed", slog.String("key", r.job),
			slog.String("owner", r.owner), slog.Int64("token", r.token))
		return
	}
	if len(h.runs) >= maxPendingRuns {
		h.dropped++
		return
	}
	h.runs = append(h.runs, r)
	h.signal()
}

// skip counts n skipped ticks (or slots) of job.
func (h *history) skip(job string, reason SkipReason, n int) {
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
		s = &skipCount{job: job, reason: reason}
		h.skips[k] = s
	}
	s.count += int64(n)
	s.last = now
	h.signal()
}

// signal wakes the writer, starting it the first time. h.mu is held.
func (h *history) signal() {
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
func (h *history) write() {
	defer close(h.done)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		h.mu.Lock()
		runs, dropped := h.runs, h.dropped
		h.runs, h.dropped = nil, 0
		closed := h.closed
		var skips []skipCount
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

func (h *history) writeRun(r runRecord) {
	ctx, cancel := context.WithTimeout(h.ctx, storeTimeout)
	defer cancel()
	if err := h.store.recordRun(ctx, r, h.retention); err != nil {
		h.logger.Warn("pglock: job run not recorded", slog.String("key", r.job), slog.String("owner", r.owner),
			slog.Int64("token", r.token), slog.Any("err", err))
	}
}

func (h *history) writeSkips(skips []skipCount) {
	slices.SortFunc(skips, func(a, b skipCount) int {
		return cmp.Or(strings.Compare(a.job, b.job), strings.Compare(string(a.reason), string(b.reason)))
	})
	ctx, cancel := context.WithTimeout(h.ctx, storeTimeout)
	defer cancel()
	if err := h.store.recordSkips(ctx, h.instance, skips, h.retention); err != nil {
		h.logger.Warn("pglock: skipped job ticks not counted", slog.Int("jobs", len(skips)), slog.Any("err", err))
	}
}

// close is Close's step: it writes what is pending, until ctx ends; then the writes
// in flight are cancelled and the rest dropped.
func (h *history) close(ctx context.Context) error {
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
	return waitDone(ctx, h.done)
}
