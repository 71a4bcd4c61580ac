package pglock

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pglock/internal/store"
)

// listener wakes a Client's waiters (Acquire calls and campaigning elections) when the
// key they wait for is released. With a connection configuration and a store that can
// mark a key wanted, it LISTENs on one dedicated connection, opened when a waiter first
// loses an attempt and closed by Client.Close, reconnecting with backoff. Without one,
// waiters only poll; Close still wakes them. It holds the waiters' queues, one per key;
// which waiter tries, marks the key and is woken is the wait queue's rule
// (waitqueue.go).
//
// Across a failover: its configuration is a copy of the pool's (or
// WithListenerConnString's), with the fallback hosts and the target_session_attrs
// check that pgx keeps in it (Config.Fallbacks, ValidateConnect), so a connection cut by
// the primary's death reconnects to whichever server takes writes; it retries at once,
// rather than after its backoff, when the client's other calls come back (retryNow).
// Coming back, it wakes every waiter, who tries and marks its key again (the new
// primary may lack the marks), and has the client confirm its locks (back).
type listener struct {
	config *pgx.ConnConfig // nil: no connection
	marker store.Wanter
	logger *slog.Logger
	back   func()        // called when the connection comes back after it was cut
	retry  chan struct{} // cuts a backoff short (retryNow)

	mu      sync.Mutex
	waiters map[string][]*waiter     // by key, in the order they subscribed
	fair    map[string]chan struct{} // the fair waiters' wake-ups, by owner (queue.go)
	lines   map[string][]fairEntry   // the queued fair waiters, by queue, in ticket order (queue.go)
	up      bool                     // LISTEN is active
	closed  bool
	// starting is set while the first connection is under way (a second or more on a
	// loaded machine): the waiters' heads poll (startingPoll).
	starting bool
	cancel   context.CancelFunc // set when the connection's goroutine starts
	done     chan struct{}      // closed when it ends
}

func newListener(config *pgx.ConnConfig, s store.Store, logger *slog.Logger, back func()) *listener {
	l := &listener{logger: logger, back: back, retry: make(chan struct{}, 1),
		waiters: make(map[string][]*waiter), fair: make(map[string]chan struct{}),
		lines: make(map[string][]fairEntry), done: make(chan struct{})}
	if marker, ok := s.(store.Wanter); ok && config != nil {
		l.config, l.marker = config, marker
	}
	return l
}

func (l *listener) listening() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.up
}

// isStarting reports whether the listener's first connection is under way: until it is
// up, no release can wake a waiter.
func (l *listener) isStarting() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.starting
}

// close wakes every waiter (their next attempt meets ErrClosed) and closes the
// connection, waiting for it until ctx ends. It is a step of Client.Close.
func (l *listener) close(ctx context.Context) error {
	l.mu.Lock()
	l.closed = true
	l.wakeAll()
	cancel := l.cancel
	l.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	return store.WaitDone(ctx, l.done)
}

// run keeps a connection LISTENing until ctx ends (store.Listen), and wakes the
// waiters of what it hears.
func (l *listener) run(ctx context.Context) {
	defer close(l.done)
	store.Listen(ctx, l.config, store.Listening{
		Logger: l.logger,
		Retry:  l.retry,
		Tried: func() {
			l.mu.Lock()
			l.starting = false
			l.mu.Unlock()
		},
		Up: func() {
			l.mu.Lock()
			l.up = true
			l.wakeAll() // they may have missed releases while it was down: each tries again
			l.mu.Unlock()
		},
		Down: func() {
			l.mu.Lock()
			l.up = false
			l.mu.Unlock()
		},
		Back: l.back,
		Released: func(key string) {
			l.mu.Lock()
			l.released(key)
			l.mu.Unlock()
		},
		Granted: func(owner string) {
			l.mu.Lock()
			signal(l.fair[owner])
			l.mu.Unlock()
		},
	})
}

// retryNow has a listener that waits to reconnect try at once: the client's other
// connections just came back.
func (l *listener) retryNow() {
	select {
	case l.retry <- struct{}{}:
	default:
	}
}

// The listener's side of the fair queue (queue.go): the fair waiters it wakes, and the
// client's lines of each queue.

// fairWait registers the fair waiter of owner and returns the channel the grant of its
// key, and Close, signal.
func (l *listener) fairWait(owner string) <-chan struct{} {
	ch := make(chan struct{}, 1)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		ch <- struct{}{}
		return ch
	}
	l.fair[owner] = ch
	return ch
}

// fairQueued starts the listener's connection, for a fair waiter that is queued.
func (l *listener) fairQueued() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.start()
}

// fairEntry is a queued fair waiter of the client: its ticket, and the owner by which its
// wake-up is registered.
type fairEntry struct {
	ticket int64
	owner  string
}

// fairLine moves owner's waiter in the client's line of queue line from ticket from to
// ticket to (0: out of the line). When the first of the line leaves while the listener
// starts, the new first is woken, to poll from now on as the first does.
func (l *listener) fairLine(line string, from, to int64, owner string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	es := l.lines[line]
	if i := slices.IndexFunc(es, func(e fairEntry) bool { return e.ticket == from }); from != 0 && i >= 0 {
		es = slices.Delete(es, i, i+1)
		if i == 0 && len(es) > 0 && l.starting {
			signal(l.fair[es[0].owner])
		}
	}
	if to != 0 {
		i, _ := slices.BinarySearchFunc(es, to, func(e fairEntry, t int64) int { return cmp.Compare(e.ticket, t) })
		es = slices.Insert(es, i, fairEntry{ticket: to, owner: owner})
	}
	if len(es) == 0 {
		delete(l.lines, line)
	} else {
		l.lines[line] = es
	}
}

// fairFirst reports whether ticket is the first of the client's line of queue line.
func (l *listener) fairFirst(line string, ticket int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	es := l.lines[line]
	return len(es) > 0 && es[0].ticket == ticket
}

// fairDone unregisters the fair waiter of owner.
func (l *listener) fairDone(owner string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.fair, owner)
}
