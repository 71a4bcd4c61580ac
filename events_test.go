package pglock

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock/internal/testkit"
)

// A handler that blocks does not grow the client's memory without end: the events that
// wait for it stay within eventQueueCap, the ones beyond are dropped and counted (in
// Health and in a warning), and once the handler returns, it gets every event kept, in
// order, and Close ends the delivery goroutine.
func TestEventsQueueIsBoundedWhileAHandlerBlocks(t *testing.T) {
	t.Parallel()
	var logs testkit.LogBuffer
	unblock, first := make(chan struct{}), make(chan struct{})
	var got []int64 // the tokens the handler got, in order; read after Close
	var calls atomic.Int64
	c, err := NewWithStore(NewMemoryStore(nil), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))),
		WithEventHandler(func(e Event) {
			got = append(got, e.Token)
			if calls.Add(1) == 1 {
				close(first)
				<-unblock
			}
		}))
	require.NoError(t, err)
	c.events.emit(Event{Type: EventAcquired, Token: 0})
	select {
	case <-first:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler got no event")
	}

	const extra = 1000
	for i := range int64(eventQueueCap + extra) {
		c.events.emit(Event{Type: EventAcquired, Token: i + 1})
	}
	c.events.mu.Lock()
	queued := len(c.events.queue)
	c.events.mu.Unlock()
	require.Equal(t, eventQueueCap, queued, "the queue stays bounded")
	require.EqualValues(t, extra, c.Health().EventsDropped)
	require.Equal(t, 1, strings.Count(logs.String(), "pglock: events dropped"), "one warning for a burst: %s", logs.String())
	require.Contains(t, logs.String(), "dropped=1 ")

	close(unblock)
	require.NoError(t, c.Close(t.Context()))
	select {
	case <-c.events.done:
	default:
		t.Fatal("the delivery goroutine still runs after Close")
	}
	require.Len(t, got, 1+eventQueueCap, "the events kept were delivered")
	for i, tok := range got {
		require.EqualValues(t, i, tok, "in order, the first ones kept")
	}
	require.Contains(t, logs.String(), "dropped=999 ", "Close logs the drops not yet logged")
	require.EqualValues(t, extra, c.Health().EventsDropped)
}

// Close bounded by its ctx gives up on a handler that never returns, without waiting
// for the queue; the queue stays bounded meanwhile.
func TestEventsCloseGivesUpOnABlockedHandler(t *testing.T) {
	t.Parallel()
	unblock := make(chan struct{})
	c, err := NewWithStore(NewMemoryStore(nil), WithLogger(slog.New(slog.DiscardHandler)),
		WithEventHandler(func(Event) { <-unblock }))
	require.NoError(t, err)
	for range 2 * eventQueueCap {
		c.events.emit(Event{Type: EventReleased})
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, c.Close(ctx), context.DeadlineExceeded)
	require.GreaterOrEqual(t, c.Health().EventsDropped, int64(eventQueueCap-1))
	close(unblock) // the goroutine delivers what was kept, then ends
	select {
	case <-c.events.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the delivery goroutine did not end")
	}
}
