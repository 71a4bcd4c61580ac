package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock/internal/testkit"
)

// A call stuck past its patience counts against the store even when another call was
// answered just after it began (the answer of a call already on its way as an outage
// starts); an answer once it had waited its patience shows the store up, and excuses it.
func TestHealthCountsAStuckCallDespiteAnAnswerAsItBegan(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		answerAt time.Duration // after the stuck call began
		failed   bool
	}{
		{"answered as it began", time.Millisecond, true},
		{"answered once it had waited its patience", 2 * time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clock := testkit.NewClock(time.Unix(0, 0))
			k := &Calls{now: clock.Now, afterFunc: clock.AfterFunc, patience: time.Second}
			t.Cleanup(func() { k.mu.Lock(); k.closed = true; k.mu.Unlock() })
			ctx, cancel := context.WithCancel(context.Background())
			stuck := k.begin(ctx, "renew", 0, false)
			clock.Advance(tc.answerAt)
			other := k.begin(context.Background(), "acquire", 0, false)
			var ok error
			k.end(other, &ok)
			clock.AdvanceTo(time.Unix(0, 0).Add(3 * time.Second))
			require.Equal(t, tc.failed, k.State().Err != nil, "while it waits")
			cancel()
			err := error(context.Canceled)
			k.end(stuck, &err)
			s := k.State()
			require.Equal(t, tc.failed, s.Err != nil, "%v", s.Err)
			if tc.failed {
				require.True(t, errors.Is(s.Err, context.Canceled), "%v", s.Err)
			}
		})
	}
}
