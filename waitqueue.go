package pglock

import (
	"context"
	"slices"
	"sync/atomic"
	"time"

	"github.com/pgfence/pglock/internal/store"
)

// The wait queue: how a Client's callers that wait for one key (Acquire calls and
// campaigning elections) share the work of waiting, so that a crowd costs the database
// about one call per client and handover, not one per waiter. The listener
// (listener.go) delivers the releases; who tries, who marks the key and who is woken is
// decided here.
//
// Who tries. A waiter joins its client's queue for the key as it calls (waiter.join),
// when the client can listen, listener up or not. Only the head of the queue makes
// attempts; a waiter behind it makes no call until its turn comes (waiter.behind),
// except one attempt when its Wait runs out first. Wait(0) is one attempt, queue or
// not. Across clients there is no queue: the first attempt to land wins, so waiters of
// one client are served in order, and no order is promised across clients.
//
// Who marks. After a losing attempt the head marks the key wanted, so that its release
// notifies: in the losing call itself once it is subscribed and the listener listens
// (waiter.marking), or with a call of its own (waiter.want). The mark is set only while
// the connection LISTENs, never without a listener to hear it, and one mark serves
// every client. A mark that finds the key free (released in between) has the head try
// again soon (freeAgain).
//
// Who is woken. A release wakes one waiter of its key per client, the head
// (listener.released), which tries at once. When a waiter leaves the queue from its
// head (it won, or its ctx ended), the next one is woken with the baton (waiter.stop,
// waiter.takeBaton): it marks the key, and tries only if the key turns out free, so
// that the next release notifies even when every waiter was in this client. Each time
// the connection comes up, every waiter is woken (wakeAll), since releases may have
// gone unheard while it was down: each head tries again and marks the key again. Close
// wakes every waiter too; their next attempt meets ErrClosed.
//
// Who polls. No release can wake anyone while the listener's first connection is under
// way, so the head then tries every few milliseconds (startingPoll). A lock whose holder
// died expires without a release, so the head also tries after each pause: a backoff
// up to a quarter of the ttl and a second at most (Acquire), a third of the ttl (an
// election).

// waiter is one caller waiting for a key: an Acquire, or a campaigning election.
type waiter struct {
	l   *listener
	key string // the key of its queue: a lock's, or a semaphore's followed by U+001F
	// sem and permits are the semaphore's, for a waiter for a permit: the release of
	// any of its permits wakes it (listener.released); permits is 0 for a lock.
	sem     string
	permits int
	ch      chan struct{} // nil until the first want
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

func (l *listener) waiter(t target) *waiter {
	if t.permits > 0 {
		return &waiter{l: l, key: t.key + store.PermitSeparator, sem: t.key, permits: t.permits}
	}
	return &waiter{l: l, key: t.key}
}

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
	var wanted bool
	var err error
	if w.permits > 0 {
		wanted, err = w.l.marker.SemWant(ctx, w.sem, w.permits)
	} else {
		wanted, err = w.l.marker.MarkWanted(ctx, w.key)
	}
	if wanted {
		w.marked(wakes)
	}
	return wanted || err != nil // on an error, polling carries on
}

// marking reports whether the waiter's next attempt should mark the key when it finds
// it held (store.Wanter's AcquireOrWant): once it is subscribed, while the listener
// listens. It returns the marker and the wakes to pass to marked. A nil waiter never
// marks, nor does a waiter for a permit: it marks with want, after its attempt.
func (w *waiter) marking() (store.Wanter, uint64, bool) {
	if w == nil || w.ch == nil || w.permits > 0 || !w.l.listening() {
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
	if l.config == nil || l.closed {
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
	return l.config != nil && !l.closed && len(queue) > 1 && queue[0] != w && slices.Contains(queue, w)
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
	if i == 0 {
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
	l.start()
}

// start starts the listener's connection if it has none. Called with mu held.
func (l *listener) start() {
	if l.config != nil && l.cancel == nil && !l.closed {
		var ctx context.Context
		ctx, l.cancel = context.WithCancel(context.Background())
		l.starting = true
		go l.run(ctx)
	}
}

// wakeAll signals every waiter, fair ones too. Called with mu held.
func (l *listener) wakeAll() {
	for _, queue := range l.waiters {
		for _, w := range queue {
			wake(w)
		}
	}
	for _, ch := range l.fair {
		signal(ch)
	}
}

// released wakes the first in line of the waiters of a key whose release was
// notified; for a permit's row key, of its semaphore. Called with mu held.
func (l *listener) released(key string) {
	if sem, permit := store.SplitPermitKey(key); permit > 0 {
		key = sem + store.PermitSeparator
	}
	queue := l.waiters[key]
	if len(queue) == 0 {
		return
	}
	queue[0].baton.Store(false) // a release: try at once
	wake(queue[0])
}

// wake signals w, unless it is woken already, and has it mark the key again.
func wake(w *waiter) {
	w.wakes.Add(1)
	signal(w.ch)
}

// signal wakes the waiter of ch, unless it is woken already. A nil ch is no one.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// waitTurn is a waiter's pause after a failed attempt on its key (Acquire, a
// campaigning election). Behind another of this client's waiters, who tries and marks
// the key, it only waits for its turn. Otherwise it marks the key wanted, then waits up
// to pause for the release that wakes it; a key that looked free is tried again soon
// (freeAgain), and so is a key that no release can wake it for yet (startingPoll). free
// counts the times in a row the key looked free. It returns ctx's cause when ctx ends
// first.
func (c *Client) waitTurn(ctx context.Context, w *waiter, pause time.Duration, free *int) error {
	if w.behind() {
		*free = 0
		return c.sleepOrWake(ctx, pause, w.woken())
	}
	if !w.want(ctx) {
		return freeAgain(ctx, free, pause, w.woken())
	}
	*free = 0
	if w.l.isStarting() {
		return startingPoll(ctx, pause, w.woken())
	}
	return c.sleepOrWake(ctx, pause, w.woken())
}

// startingPoll is the pause of a waiter whose listener's first connection is under way,
// at the start of a crowd: no release can wake it until the listener is up, which takes
// a second or more on a loaded machine, while the backoff grows towards a second; and
// the waiters that lose leave nothing marked, so a key released meanwhile stays free
// until someone tries. So it tries every startingPollEvery at most (jittered), on the
// real clock as freeAgain does, one waiter per client (the head of its queue): with n
// clients, a free key waits startingPollEvery/n on average. The listener's coming up
// wakes it.
func startingPoll(ctx context.Context, pause time.Duration, wake <-chan struct{}) error {
	return wakeOrAfter(ctx, min(pause, jitter(startingPollEvery)), wake)
}

// startingPollEvery is the longest pause of startingPoll.
const startingPollEvery = 40 * time.Millisecond

// freeAgain is a waiter's step when marking its key found it free (released in
// between): try again soon, not after the pause. Not at once: the release that freed
// the key notifies when anyone marked the key while it was held, and in a crowd every
// client's first waiter is then woken and tries anyway, so an attempt of its own now
// would be a second one for the same release. So it waits for that wake, or 1 ms at
// most when none comes (no one marked the key). A key can look free and still refuse
// the acquisition (an expired row that a fenced transaction keeps locked), so each
// further time in a row waits twice as long, up to limit, on the real clock: it must
// not spin, and a test's stopped clock must not park a waiter whose key is free.
func freeAgain(ctx context.Context, times *int, limit time.Duration, wake <-chan struct{}) error {
	defer func() { *times++ }()
	return wakeOrAfter(ctx, min(time.Millisecond<<min(*times, 20), limit), wake)
}

// wakeOrAfter waits for wake or d on the real clock, or until ctx ends (returning its
// cause).
func wakeOrAfter(ctx context.Context, d time.Duration, wake <-chan struct{}) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-wake:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
