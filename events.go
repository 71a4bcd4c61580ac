package pglock

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/pgfence/pglock/internal/store"
)

// EventType names what happened in an Event.
type EventType string

// The events a Client emits.
const (
	EventAcquired           EventType = "acquired"            // a lock was taken
	EventReleased           EventType = "released"            // a lock was given back
	EventLost               EventType = "lost"                // a lock was lost before its release; LostReason says how, Err is its *LockLostError
	EventJobRan             EventType = "job ran"             // a job's tick ran here
	EventJobSkipped         EventType = "job skipped"         // a job's tick was skipped here; SkipReason says why
	EventLeadershipAcquired EventType = "leadership acquired" // this instance started leading
	EventLeadershipLost     EventType = "leadership lost"     // this instance stopped leading; StepDownReason and Err say why
	EventAcquireFailed      EventType = "acquire failed"      // an Acquire, TryAcquire or WithLock returned without the lock; Err says why (ErrNotAcquired when the key was held)
	EventRenewal            EventType = "renewal"             // one renewal call to the store ended; Key is empty, Duration is its latency, Err its failure
	EventJobRegistered      EventType = "job registered"      // a job was registered here (Client.Job, a GocronLocker's first Lock of a job name); Key is the job's
)

// Event is something that happened to a lock, a job or an election of a Client. See
// WithEventHandler.
type Event struct {
	Type   EventType
	Key    string // the lock's key; for job events the job's key, gocron job name or elector key
	Permit int    // a permit's number, for events about a permit of a semaphore (Key is the semaphore's); else 0
	// Permits is, for EventAcquired and EventAcquireFailed of a semaphore's permit, the
	// semaphore's number of permits (Semaphore.Permits); 0 for a lock. It tells a failed
	// acquisition of a permit, which has no Permit, from a lock's.
	Permits int
	Owner   string // the lock's owner id; empty for a skipped tick
	Token   int64  // the lock's fencing token; zero for a skipped tick
	// LostReason is, for EventLost, how the lock was lost; for EventLeadershipLost
	// with StepDownLeaseLost, how the lease was. Else "".
	LostReason     LostReason
	SkipReason     SkipReason     // for EventJobSkipped: why; else ""
	StepDownReason StepDownReason // for EventLeadershipLost: why; else ""
	// Err is, for EventLost and EventLeadershipLost, why (a *LockLostError, ErrResigned,
	// ErrClosed or OnAcquired's error); for EventAcquireFailed and EventRenewal, the
	// failure; else nil.
	Err error
	// Wait is, for EventAcquired and EventAcquireFailed, the time from the call to the
	// acquisition or the giving up, waiting included.
	Wait time.Duration
	// Duration is, for EventAcquired, the latency of the store call that took the lock;
	// for EventJobRan, the run's; for EventRenewal, the renewal call's.
	Duration time.Duration
	Outcome  Outcome   // for EventJobRan: how the run ended
	Time     time.Time // on the client's clock
	// Slot is, for EventJobRan and EventJobSkipped of a job with a schedule (Cron,
	// Every), the slot the run or skip stands for (the last one, for several); else zero.
	Slot time.Time
	// Count is, for EventJobSkipped, how many ticks or slots it stands for: 1, or the
	// slots missed at once (SkipSlotMissed).
	Count int
	// Attempt is, for EventJobRan of a slot, its attempt: 1, or more for a retry
	// (AtLeastOnce); else 0.
	Attempt int
}

// eventQueueCap is how many events may wait for the handlers: beyond it, a new event
// is dropped and counted, so that a handler that blocks costs a bounded amount of
// memory, not the process's.
const eventQueueCap = 4096

// eventDropWarnEvery is how often, at most, dropped events are logged at Warn.
const eventDropWarnEvery = 10 * time.Second

// events delivers events to the handlers, in order, on one goroutine, so that whoever
// emits (the renewer above all) never waits for a handler.
type events struct {
	handlers []func(Event)
	logger   *slog.Logger

	mu       sync.Mutex
	cond     *sync.Cond
	queue    []Event // at most eventQueueCap
	closed   bool
	dropped  int64     // since New
	unlogged int64     // dropped since the last warning
	warned   time.Time // the last warning, on the real clock
	done     chan struct{}
}

func newEvents(handlers []func(Event), logger *slog.Logger) *events {
	e := &events{handlers: handlers, logger: logger, done: make(chan struct{})}
	e.cond = sync.NewCond(&e.mu)
	if len(handlers) == 0 {
		close(e.done)
		return e
	}
	go e.run()
	return e
}

func (e *events) emit(ev Event) {
	if len(e.handlers) == 0 {
		return
	}
	var warn int64
	e.mu.Lock()
	switch {
	case e.closed:
	case len(e.queue) < eventQueueCap:
		e.queue = append(e.queue, ev)
		e.cond.Signal()
	default:
		e.dropped++
		e.unlogged++
		if now := time.Now(); now.Sub(e.warned) >= eventDropWarnEvery {
			warn, e.unlogged, e.warned = e.unlogged, 0, now
		}
	}
	e.mu.Unlock()
	if warn > 0 {
		e.warnDropped(warn)
	}
}

func (e *events) warnDropped(n int64) {
	e.logger.Warn("pglock: events dropped: the event handlers fell behind", slog.Int64("dropped", n),
		slog.Int("queue", eventQueueCap))
}

// droppedCount returns how many events were dropped since New.
func (e *events) droppedCount() int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.dropped
}

func (e *events) run() {
	defer close(e.done)
	for {
		e.mu.Lock()
		for len(e.queue) == 0 && !e.closed {
			e.cond.Wait()
		}
		if len(e.queue) == 0 { // closed, and delivered
			unlogged := e.unlogged
			e.unlogged = 0
			e.mu.Unlock()
			if unlogged > 0 {
				e.warnDropped(unlogged)
			}
			return
		}
		ev := e.queue[0]
		e.queue[0] = Event{} // let its error go
		e.queue = e.queue[1:]
		e.mu.Unlock()
		for _, h := range e.handlers {
			e.deliver(h, ev)
		}
	}
}

// deliver calls h with ev; a panic in h is logged, and the next handler still gets ev.
func (e *events) deliver(h func(Event), ev Event) {
	defer func() {
		if r := recover(); r != nil {
			e.logger.Error("pglock: event handler panicked", slog.String("key", ev.Key), slog.Any("err", r))
		}
	}()
	h(ev)
}

// close delivers what is queued and stops, waiting for the handler until ctx ends
// (then returning ctx's cause; the queue is still delivered, and the goroutine ends
// after it).
func (e *events) close(ctx context.Context) error {
	e.mu.Lock()
	e.closed = true
	e.cond.Signal()
	e.mu.Unlock()
	return store.WaitDone(ctx, e.done)
}
