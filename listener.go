package pglock

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pglock/internal/store"
)

// releasedChannel is what pglock.lock_release notifies, with the key as the payload,
// when a waiter marked the key (migrations/000003_notify.up.sql).
const releasedChannel = "pglock_released"

// grantedChannel is what a release that hands its key to the head of the fair queue
// notifies, with the head's owner as the payload (migrations/000014_queue.up.sql), so
// that the one waiter granted the key is woken, on whichever client it waits.
const grantedChannel = "pglock_granted"

// The listener's reconnection backoff. It runs on the real clock, not the client's:
// it waits for a server to come back, not for a lease.
const (
	listenerMinBackoff = 100 * time.Millisecond
	listenerMaxBackoff = 10 * time.Second
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

// run keeps a connection LISTENing until ctx ends.
func (l *listener) run(ctx context.Context) {
	defer close(l.done)
	backoff, down := listenerMinBackoff, false
	for {
		conn, err := l.connect(ctx)
		l.mu.Lock()
		l.starting = false
		l.mu.Unlock()
		if err == nil {
			if down {
				l.logger.Info("pglock: listener reconnected")
				l.back() // perhaps to another server: a failover
			} else {
				l.logger.Debug("pglock: listening for releases")
			}
			select {
			case <-l.retry: // for the connection that just came up
			default:
			}
			backoff, down = listenerMinBackoff, false
			err = l.receive(ctx, conn)
		}
		if ctx.Err() != nil {
			return
		}
		if !down {
			l.logger.Warn("pglock: listener not connected; waiters poll until it is", slog.Any("err", err))
			down = true
		}
		t := time.NewTimer(jitter(backoff))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		case <-l.retry:
			t.Stop()
		}
		backoff = min(2*backoff, listenerMaxBackoff)
	}
}

// retryNow has a listener that waits to reconnect try at once: the client's other
// connections just came back.
func (l *listener) retryNow() {
	select {
	case l.retry <- struct{}{}:
	default:
	}
}

func (l *listener) connect(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, l.config)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+releasedChannel+"; LISTEN "+grantedChannel); err != nil {
		closeConn(ctx, conn)
		return nil, err
	}
	return conn, nil
}

// receive wakes the waiters of every key notified on conn until conn fails or ctx
// ends, then closes conn.
func (l *listener) receive(ctx context.Context, conn *pgx.Conn) error {
	l.mu.Lock()
	l.up = true
	l.wakeAll() // they may have missed releases while it was down: each tries again
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.up = false
		l.mu.Unlock()
		closeConn(ctx, conn)
	}()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if n != nil {
			l.mu.Lock()
			if n.Channel == grantedChannel {
				signal(l.fair[n.Payload])
			} else {
				l.released(n.Payload)
			}
			l.mu.Unlock()
		}
	}
}

func closeConn(ctx context.Context, conn *pgx.Conn) {
	ctx, cancel := detached(ctx)
	defer cancel()
	_ = conn.Close(ctx)
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
