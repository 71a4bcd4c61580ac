package store

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPruneOnTheMemoryStoreDeletesDeadWaiters: as lock_prune, the memory store's prune
// deletes a waiter not polled for a minute, and keeps one polled within it.
func TestPruneOnTheMemoryStoreDeletesDeadWaiters(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	clock := &steppedClock{now: time.Now()}
	store := NewMemory(clock).(*memoryStore)
	_, ok, err := store.Acquire(ctx, "k", "holder", time.Hour)
	require.NoError(t, err)
	require.True(t, ok)
	_, _, dead, _, err := store.QueueAcquire(ctx, Target{Key: "k"}, "dead", time.Minute)
	require.NoError(t, err)
	require.Positive(t, dead)
	clock.now = clock.now.Add(50 * time.Second)
	_, _, alive, _, err := store.QueueAcquire(ctx, Target{Key: "k"}, "alive", time.Minute)
	require.NoError(t, err)
	clock.now = clock.now.Add(11 * time.Second)

	_, err = store.Prune(ctx, time.Hour, 1000)
	require.NoError(t, err)
	require.Len(t, store.waiters["k"], 1)
	require.Equal(t, alive, store.waiters["k"][0].ticket)
	clock.now = clock.now.Add(time.Minute)
	_, err = store.Prune(ctx, time.Hour, 1000)
	require.NoError(t, err)
	require.NotContains(t, store.waiters, "k", "an emptied queue")
}

// steppedClock is a Clock whose Now the test sets.
type steppedClock struct{ now time.Time }

func (c *steppedClock) Now() time.Time { return c.now }

// TestMemoryQueuePollTellsThePlace: as queue_poll (000024) and queue_acquire (000026),
// the memory store tells a queued waiter how many live waiters ahead of it wait for a
// grant.
func TestMemoryQueuePollTellsThePlace(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	clock := &steppedClock{now: time.Now()}
	store := NewMemory(clock).(*memoryStore)
	_, ok, err := store.Acquire(ctx, "k", "holder", time.Hour)
	require.NoError(t, err)
	require.True(t, ok)
	var tickets [2]int64
	for i := range tickets {
		var ahead int
		_, _, tickets[i], ahead, err = store.QueueAcquire(ctx, Target{Key: "k"}, "w"+string(rune('0'+i)), time.Minute)
		require.NoError(t, err)
		require.Equal(t, i, ahead, "queueing, waiter %d", i)
	}
	for i, want := range []int{0, 1} {
		_, _, queued, ahead, err := store.QueuePoll(ctx, "k", tickets[i])
		require.NoError(t, err)
		require.True(t, queued)
		require.Equal(t, want, ahead, "waiter %d", i)
	}
	clock.now = clock.now.Add(2 * QueueBound) // the head silent: dead
	_, _, _, ahead, err := store.QueuePoll(ctx, "k", tickets[1])
	require.NoError(t, err)
	require.Zero(t, ahead, "behind a dead head")
}
