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
