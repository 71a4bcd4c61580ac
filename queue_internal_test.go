package pglock

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock/internal/store"
)

// TestFairOnTheMemoryStore: the memory store keeps the queue too: waiters served in the
// order they arrived, and a plain TryAcquire refused while one waits.
func TestFairOnTheMemoryStore(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	s := NewMemoryStore(nil)
	queued := func(n int) func() bool {
		return func() bool { return store.Queued(s.s, "k") == n }
	}
	var cs [2]*Client
	for i := range cs {
		c, err := NewWithStore(s)
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

// TestNearPollIsFasterTheNearerTheHead: while the listener starts, the head of the queue
// polls every 5 ms at most, the two behind it every 10 and 20 ms, and a waiter further
// back, or whose place is unknown, has no pace of its own (the first of its client's waiters
// polls every startingPollEvery; the others keep the heartbeat).
func TestNearPollIsFasterTheNearerTheHead(t *testing.T) {
	t.Parallel()
	for ahead, want := range map[int]time.Duration{-1: 0, 0: 5 * time.Millisecond, 1: 10 * time.Millisecond,
		2: 20 * time.Millisecond, 3: 0, store.MaxAhead: 0} {
		require.Equal(t, want, nearPoll(ahead), "%d ahead", ahead)
	}
}
