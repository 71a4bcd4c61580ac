package pglock

import (
	"context"
	"log/slog"
	"slices"
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
// mark a key wanted, it LISTENs on one dedicated connection, opened when a waiter first
// loses an attempt and closed by Client.Close, reconnecting with backoff. Without one,
// waiters only poll; Close still wakes them.
//
// A waiter queues behind its client's other waiters of the key as soon as it calls
// (waiter.join), listener up or not: only the head of the queue tries, from the very
// start of a crowd. After a failed attempt the head marks the key wanted (waiter.want),
// only while the connection LISTENs: a release then notifies, and the mark is never set
// without a listener to hear it. Until the first connection is up (a second or more on
// a loaded machine) nothing can wake it, so it polls every few milliseconds
// (startingPoll). Notifications missed while the connection was down are made up for by
// waking every waiter when it is back: each head tries again, and marks the key again.
//
// A release wakes one waiter of its key per client, the one that has waited longest
// here, not all of them: each client with waiters makes one attempt per handover, and
// the rest of its waiters stay parked, making no call, so the attempts grow with the
// clients, not with the waiters. The woken waiter tries, and, if it lost, marks the key
// again for every client (one mark serves all), then parks at the head of the queue.
// When it leaves the queue (it won, or its ctx ended), the next waiter is woken: it
// marks the key, and tries only if the key turns out free, so that the next release
// notifies even when every waiter was in this client. Waiters of one client are thus
// served in order; across clients, the first attempt to land wins.
type listener struct {
	config *pgx.ConnConfig // nil: no connection
	marker wantMarker
	logger *slog.Logger

	// everyWaiter makes every waiter of a key try at its release, as pglock did before
	// it kept a queue per client: no queue (join, behind), every waiter woken, and a
	// losing attempt does not mark the key (marking). The crowd benchmark's baseline,
	// set by tests only.
	everyWaiter bool

	mu      sync.Mutex
	waiters map[string][]*waiter // by key, in the order they subscribed
	up      bool                 // LISTEN is active
	closed  bool
	// starting is set while the first connection is under way (a second or more on a
	// loaded machine): the waiters' heads poll (startingPoll).
	starting bool
	cancel   context.CancelFunc // set when the connection's goroutine starts
	done     chan struct{}      // closed when it ends
}

func newListener(config *pgx.ConnConfig, store Store, logger *slog.Logger) *listener {
	l := &listener{logger: logger, waiters: make(map[string][]*waiter), done: make(chan struct{})}
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
	// baton is set when the waiter was woken because the one before it left the queue,
	// not by a release: it marks the key before it tries (see takeBaton).
	baton atomic.Bool
}

func (l *listener) waiter(key string) *waiter { return &waiter{l: l, key: key} }

// want is called after a failed attempt on the key. It subscribes the waiter (unless it
// joined the queue), starts the listener's connection (the first time) and, while the
// listener LISTENs, marks the key wanted so that its release notifies. It reports false
// when the key was released in between: try again now.
func (w *waiter) want(ctx context.Context) bool {
	w.l.subscribe(w)
	if !w.l.listening() {
		return true
	}
	wakes := w.wakes.Load()
	if w.markedAt.Load() == wakes+1 {
		return true
	}
	wanted, err := w.l.marker.markWanted(ctx, w.key)
	if wanted {
		w.marked(wakes)
	}
	return wanted || err != nil // on an error, polling carries on
}

// marking reports whether the waiter's next attempt should mark the key when it finds
// it held (wantMarker.acquireOrWant): once it is subscribed, while the listener
// listens. It returns the marker and the wakes to pass to marked. A nil waiter never
// marks.
func (w *waiter) marking() (wantMarker, uint64, bool) {
	if w == nil || w.ch == nil || w.l.everyWaiter || !w.l.listening() {
		return nil, 0, false
	}
	return w.l.marker, w.wakes.Load(), true
}

// marked records that the key's row carries the waiter's mark, set by a call that
// began when the waiter had been woken wakes times: a wake since voids it.
func (w *waiter) marked(wakes uint64) { w.markedAt.Store(wakes + 1) }

// join subscribes the waiter at the back of its client's queue for the key, when the
// client can listen, and reports whether it is behind another waiter: it then waits its
// turn (see takeBaton) before its first attempt, rather than try alongside the head of
// the queue, whom the next release wakes. The head makes the attempts of a crowd from
// its very start, listener up or not. It does not start the listener: a waiter whose
// first attempt wins never needs it.
func (w *waiter) join() bool {
	l := w.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.config == nil || l.closed || l.everyWaiter {
		return false
	}
	w.ch = make(chan struct{}, 1)
	l.waiters[w.key] = append(l.waiters[w.key], w)
	return len(l.waiters[w.key]) > 1
}

// behind reports whether the waiter is queued behind another waiter of its client: it
// then leaves the attempts, and marking the key, to the head of the queue, whom a
// release wakes (or who polls while the listener is not up), and waits for its turn.
func (w *waiter) behind() bool {
	l := w.l
	l.mu.Lock()
	defer l.mu.Unlock()
	queue := l.waiters[w.key]
	return l.config != nil && !l.closed && !l.everyWaiter && len(queue) > 1 && queue[0] != w && slices.Contains(queue, w)
}

// takeBaton reports, once, whether the waiter was last woken because the waiter before
// it left the queue: it then only needs to mark the key (want), and to try only if the
// key turns out free.
func (w *waiter) takeBaton() bool { return w.baton.Swap(false) }

// woken returns the channel a release of the key is signalled on: nil, which never
// fires, before the first want.
func (w *waiter) woken() <-chan struct{} { return w.ch }

// stop unsubscribes the waiter. A waiter that leaves from the head of its key's queue
// (it won, or its ctx ended) wakes the next one: that one tries and marks the key, so
// that no release goes unnotified while waiters remain.
func (w *waiter) stop() {
	if w.ch == nil {
		return
	}
	l := w.l
	l.mu.Lock()
	defer l.mu.Unlock()
	queue := l.waiters[w.key]
	i := slices.Index(queue, w)
	if i < 0 {
		return
	}
	queue = slices.Delete(queue, i, i+1)
	if len(queue) == 0 {
		delete(l.waiters, w.key)
		return
	}
	l.waiters[w.key] = queue
	if i == 0 && !l.everyWaiter {
		queue[0].baton.Store(true)
		wake(queue[0])
	}
}

// subscribe adds w to the key's waiters, unless it joined them already, and starts the
// listener's connection if it has none.
func (l *listener) subscribe(w *waiter) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if w.ch == nil {
		w.ch = make(chan struct{}, 1)
		if l.closed {
			w.ch <- struct{}{} // the waiter's next attempt meets ErrClosed
			return
		}
		l.waiters[w.key] = append(l.waiters[w.key], w)
	}
	if l.config != nil && l.cancel == nil && !l.closed {
		var ctx context.Context
		ctx, l.cancel = context.WithCancel(context.Background())
		l.starting = true
		go l.run(ctx)
	}
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

// wakeAll signals every waiter. Called with mu held.
func (l *listener) wakeAll() {
	for _, queue := range l.waiters {
		for _, w := range queue {
			wake(w)
		}
	}
}

// released wakes the waiters of a key whose release was notified: the first in line,
// or every one with everyWaiter. Called with mu held.
func (l *listener) released(key string) {
	queue := l.waiters[key]
	if len(queue) == 0 {
		return
	}
	if !l.everyWaiter {
		queue = queue[:1]
	}
	for _, w := range queue {
		w.baton.Store(false) // a release: try at once
		wake(w)
	}
}

// wake signals w, unless it is woken already, and has it mark the key again.
func wake(w *waiter) {
	w.wakes.Add(1)
	select {
	case w.ch <- struct{}{}:
	default:
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
		l.mu.Lock()
		l.starting = false
		l.mu.Unlock()
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
			l.released(n.Payload)
			l.mu.Unlock()
		}
	}
}

func closeConn(ctx context.Context, conn *pgx.Conn) {
	ctx, cancel := detached(ctx)
	defer cancel()
	_ = conn.Close(ctx)
}
