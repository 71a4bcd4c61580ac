package pglock

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestFairOnTheMemoryStore: the memory store keeps the queue too: waiters served in the
// order they arrived, and a plain TryAcquire refused while one waits.
func TestFairOnTheMemoryStore(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	store := NewMemoryStore(nil).(*memoryStore)
	queued := func(n int) func() bool {
		return func() bool {
			store.mu.Lock()
			defer store.mu.Unlock()
			return len(store.waiters["k"]) == n
		}
	}
	var cs [2]*Client
	for i := range cs {
		c, err := NewWithStore(store)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, c.Close(context.Background())) })
		cs[i] = c
	}
	holder, err := cs[0].TryAcquire(ctx, "k")
	require.NoError(t, err)
	type result struct {
		l   *Lock
		err error
	}
	acquire := func(c *Client) <-chan result {
		ch := make(chan result, 1)
		go func() {
			l, err := c.Acquire(ctx, "k", Fair())
			ch <- result{l, err}
		}()
		return ch
	}
	first := acquire(cs[1])
	require.Eventually(t, queued(1), 5*time.Second, time.Millisecond)
	second := acquire(cs[0])
	require.Eventually(t, queued(2), 5*time.Second, time.Millisecond)
	require.NoError(t, holder.Release(ctx))
	got := <-first
	require.NoError(t, got.err)
	_, err = cs[0].TryAcquire(ctx, "k")
	require.ErrorIs(t, err, ErrNotAcquired, "a plain attempt barged past the queued waiter")
	require.NoError(t, got.l.Release(ctx))
	got = <-second
	require.NoError(t, got.err)
	require.NoError(t, got.l.Release(ctx))
	require.Eventually(t, queued(0), time.Second, time.Millisecond)
}

// TestPruneOnTheMemoryStoreDeletesDeadWaiters: as lock_prune, the memory store's prune
// deletes a waiter not polled for a minute, and keeps one polled within it.
func TestPruneOnTheMemoryStoreDeletesDeadWaiters(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	clock := &steppedClock{now: time.Now()}
	store := NewMemoryStore(clock).(*memoryStore)
	_, ok, err := store.Acquire(ctx, "k", "holder", time.Hour)
	require.NoError(t, err)
	require.True(t, ok)
	_, _, dead, _, err := store.queueAcquire(ctx, target{key: "k"}, "dead", time.Minute)
	require.NoError(t, err)
	require.Positive(t, dead)
	clock.now = clock.now.Add(50 * time.Second)
	_, _, alive, _, err := store.queueAcquire(ctx, target{key: "k"}, "alive", time.Minute)
	require.NoError(t, err)
	clock.now = clock.now.Add(11 * time.Second)

	_, err = store.prune(ctx, time.Hour, 1000)
	require.NoError(t, err)
	require.Len(t, store.waiters["k"], 1)
	require.Equal(t, alive, store.waiters["k"][0].ticket)
	clock.now = clock.now.Add(time.Minute)
	_, err = store.prune(ctx, time.Hour, 1000)
	require.NoError(t, err)
	require.NotContains(t, store.waiters, "k", "an emptied queue")
}

// steppedClock is a Clock whose Now the test sets; its timers run on the real clock.
type steppedClock struct{ now time.Time }

func (c *steppedClock) Now() time.Time { return c.now }

func (c *steppedClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// TestMemoryQueuePollTellsThePlace: as queue_poll (000024) and queue_acquire (000026),
// the memory store tells a queued waiter how many live waiters ahead of it wait for a
// grant.
func TestMemoryQueuePollTellsThePlace(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	clock := &steppedClock{now: time.Now()}
	store := NewMemoryStore(clock).(*memoryStore)
	_, ok, err := store.Acquire(ctx, "k", "holder", time.Hour)
	require.NoError(t, err)
	require.True(t, ok)
	var tickets [2]int64
	for i := range tickets {
		var ahead int
		_, _, tickets[i], ahead, err = store.queueAcquire(ctx, target{key: "k"}, "w"+string(rune('0'+i)), time.Minute)
		require.NoError(t, err)
		require.Equal(t, i, ahead, "queueing, waiter %d", i)
	}
	for i, want := range []int{0, 1} {
		_, _, queued, ahead, err := store.queuePoll(ctx, "k", tickets[i])
		require.NoError(t, err)
		require.True(t, queued)
		require.Equal(t, want, ahead, "waiter %d", i)
	}
	clock.now = clock.now.Add(2 * queueBound) // the head silent: dead
	_, _, _, ahead, err := store.queuePoll(ctx, "k", tickets[1])
	require.NoError(t, err)
	require.Zero(t, ahead, "behind a dead head")
}

// TestNearPollIsFasterTheNearerTheHead: while the listener starts, the head of the queue
// polls every 5 ms at most, the two behind it every 10 and 20 ms, and a waiter further
// back, or whose place is unknown, has no pace of its own (the first of its client's waiters
// polls every startingPollEvery; the others keep the heartbeat).
func TestNearPollIsFasterTheNearerTheHead(t *testing.T) {
	t.Parallel()
	for ahead, want := range map[int]time.Duration{-1: 0, 0: 5 * time.Millisecond, 1: 10 * time.Millisecond,
		2: 20 * time.Millisecond, 3: 0, maxAhead: 0} {
		require.Equal(t, want, nearPoll(ahead), "%d ahead", ahead)
	}
}
