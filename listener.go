package pglock

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// releasedChannel is what pglock.lock_release notifies, with the key as the payload,
// when a waiter marked the key (migrations/000003_notify.up.sql).
const releasedChannel = "pglock_released"

// The listener's reconnection backoff. It runs on the real clock, not the client's:
// it waits for a server to come back, not for a lease.
const (
	listenerMinBackoff = 100 * time.Millisecond
	listenerMaxBackoff = 10 * time.Second
)

// listener wakes a Client's waiters (Acquire calls and campaigning elections) when the
// key they wait for is released. With a connection configuration and a store that can
// mark a key wanted, it LISTENs on one dedicated connection, opened when the first
// waiter subscribes and closed by Client.Close, reconnecting with backoff. Without
// one, waiters only poll; Close still wakes them.
//
// A waiter subscribes after its first failed attempt and then marks the key wanted
// (waiter.want), only while the connection LISTENs: a release then notifies, and the
// mark is never set without a listener to hear it. Notifications missed while the
// connection was down are made up for by waking every waiter when it is back: each
// tries again, and marks the key again.
type listener struct {
	config *pgx.ConnConfig // nil: no connection
	marker wantMarker
	logger *slog.Logger

	mu      sync.Mutex
	waiters map[string]map[*waiter]struct{}
	up      bool // LISTEN is active
	closed  bool
	cancel  context.CancelFunc // set when the connection's goroutine starts
	done    chan struct{}      // closed when it ends
}

func newListener(config *pgx.ConnConfig, store Store, logger *slog.Logger) *listener {
	l := &listener{logger: logger, waiters: make(map[string]map[*waiter]struct{}), done: make(chan struct{})}
	if marker, ok := store.(wantMarker); ok && config != nil {
		l.config, l.marker = config, marker
	}
	return l
}

// waiter is one caller waiting for a key: an Acquire, or a campaigning election.
type waiter struct {
	l   *listener
	key string
	ch  chan struct{} // nil until the first want
	// The key's row carries this waiter's mark while markedAt == wakes+1, and a
	// further want then needs no round trip. A release clears the mark and notifies,
	// and a reconnection may have missed that: both count a wake (signal), which also
	// voids a mark whose round trip was under way when it came.
	wakes    atomic.Uint64
	markedAt atomic.Uint64
}

func (l *listener) waiter(key string) *waiter { return &waiter{l: l, key: key} }

// want is called after a failed attempt on the key. It subscribes the waiter (the first
// time) and, while the listener LISTENs, marks the key wanted so that its release
// notifies. It reports false when the key was released in between: try again now.
func (w *waiter) want(ctx context.Context) bool {
	if w.ch == nil {
		w.l.subscribe(w)
	}
	if !w.l.listening() {
		return true
	}
	wakes := w.wakes.Load()
	if w.markedAt.Load() == wakes+1 {
		return true
	}
	wanted, err := w.l.marker.markWanted(ctx, w.key)
	if wanted {
		w.markedAt.Store(wakes + 1)
	}
	return wanted || err != nil // on an error, polling carries on
}

// woken returns the channel a release of the key is signalled on: nil, which never
// fires, before the first want.
func (w *waiter) woken() <-chan struct{} { return w.ch }

// stop unsubscribes the waiter.
func (w *waiter) stop() {
	if w.ch == nil {
		return
	}
	l := w.l
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.waiters[w.key], w)
	if len(l.waiters[w.key]) == 0 {
		delete(l.waiters, w.key)
	}
}

// subscribe gives w its channel and adds it to the key's waiters.
func (l *listener) subscribe(w *waiter) {
	key := w.key
	l.mu.Lock()
	defer l.mu.Unlock()
	w.ch = make(chan struct{}, 1)
	if l.closed {
		w.ch <- struct{}{} // the waiter's next attempt meets ErrClosed
		return
	}
	if l.waiters[key] == nil {
		l.waiters[key] = make(map[*waiter]struct{})
	}
	l.waiters[key][w] = struct{}{}
	if l.config != nil && l.cancel == nil {
		var ctx context.Context
		ctx, l.cancel = context.WithCancel(context.Background())
		go l.run(ctx)
	}
}

func (l *listener) listening() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.up
}

// wakeAll signals every waiter. Called with mu held.
func (l *listener) wakeAll() {
	for _, set := range l.waiters {
		signal(set)
	}
}

// signal wakes each waiter of set that is not woken yet, and has it mark the key again.
func signal(set map[*waiter]struct{}) {
	for w := range set {
		w.wakes.Add(1)
		select {
		case w.ch <- struct{}{}:
		default:
		}
	}
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
	return waitDone(ctx, l.done)
}

// run keeps a connection LISTENing until ctx ends.
func (l *listener) run(ctx context.Context) {
	defer close(l.done)
	backoff, down := listenerMinBackoff, false
	for {
		conn, err := l.connect(ctx)
		if err == nil {
			if down {
				l.logger.Info("pglock: listener reconnected")
			} else {
				l.logger.Debug("pglock: listening for releases")
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
		}
		backoff = min(2*backoff, listenerMaxBackoff)
	}
}

func (l *listener) connect(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, l.config)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+releasedChannel); err != nil {
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
			signal(l.waiters[n.Payload])
			l.mu.Unlock()
		}
	}
}

func closeConn(ctx context.Context, conn *pgx.Conn) {
	ctx, cancel := detached(ctx)
	defer cancel()
	_ = conn.Close(ctx)
}
