package renewer

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// naiveOverdue is Overdue's meaning, counted the long way: the entries held whose last
// confirmed renewal was sent half their ttl ago or more.
func naiveOverdue(r *Renewer) int {
	now := r.cfg.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.queue {
		if !e.lost && !e.removed && !now.Before(e.deadline.Add(-e.TTL*2/5)) {
			n++
		}
	}
	return n
}

// Overdue keeps its meaning whatever happens to the locks: added at different times
// with different ttls, renewed, refused, failing for a while, lost at their deadline,
// removed, added again.
func TestOverdueCountsWhatIsOverdueThroughEveryChange(t *testing.T) {
	t.Parallel()
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	clock := newFakeClock()
	var mu sync.Mutex
	failing := map[string]bool{} // keys whose renewals fail
	refused := map[string]bool{} // keys whose renewals are refused once
	store := fakeBatchStore{&fakeStore{fn: func(_ context.Context, keys []string) ([]string, error) {
		mu.Lock()
		defer mu.Unlock()
		var ok []string
		for _, k := range keys {
			if failing[k] {
				return nil, errors.New("down")
			}
			if refused[k] {
				delete(refused, k)
				continue
			}
			ok = append(ok, k)
		}
		return ok, nil
	}}}
	r := newRenewer(t, store, clock, nil)
	ttls := []time.Duration{time.Second, 3 * time.Second, 10 * time.Second}
	var entries []*Entry
	for i := range 60 {
		e, _ := newEntry(fmt.Sprintf("k%d", i), ttls[i%len(ttls)])
		entries = append(entries, e)
	}
	added := map[*Entry]bool{}
	for step := range 3000 {
		e := entries[rng.IntN(len(entries))]
		switch op := rng.IntN(10); {
		case op < 3:
			if !added[e] || !r.Live(e) {
				r.Remove(e)
				r.Add(e, clock.Now())
				added[e] = true
			}
		case op < 4:
			r.Remove(e)
			added[e] = false
		case op < 6:
			mu.Lock()
			failing[e.Key] = !failing[e.Key]
			mu.Unlock()
		case op < 7:
			mu.Lock()
			refused[e.Key] = true
			mu.Unlock()
		default:
			clock.Advance(time.Duration(rng.IntN(400)) * time.Millisecond)
		}
		require.Equal(t, naiveOverdue(r), r.Overdue(), "step %d", step)
	}
}

// BenchmarkOverdue is a probe's cost with 100k locks held, a quarter of them overdue.
func BenchmarkOverdue(b *testing.B) {
	clock := newFakeClock()
	r := New(Config{Store: &fakeStore{}, Now: clock.Now, AfterFunc: clock.AfterFunc})
	defer func() { _ = r.Close(context.Background()) }()
	const n = 100_000
	for i := range n {
		e, _ := newEntry(fmt.Sprintf("k%d", i), time.Minute)
		sent := t0
		if i%4 == 0 {
			sent = t0.Add(-40 * time.Second) // its last confirmed renewal was sent 40 s ago
		}
		r.Add(e, sent)
	}
	require.Equal(b, n/4, r.Overdue())
	b.ResetTimer()
	for b.Loop() {
		r.Overdue()
	}
}

// BenchmarkRound is a renewal round of 100k locks of one ttl, all due: what keeping
// Overdue's order costs the rounds.
func BenchmarkRound(b *testing.B) {
	clock := newFakeClock()
	r := New(Config{Store: fakeBatchStore{&fakeStore{}}, Now: clock.Now, AfterFunc: clock.AfterFunc})
	defer func() { _ = r.Close(context.Background()) }()
	const n = 100_000
	for i := range n {
		e, _ := newEntry(fmt.Sprintf("k%d", i), time.Minute)
		r.Add(e, t0)
	}
	for b.Loop() {
		clock.Advance(20 * time.Second) // every lock is due: one round, one call
	}
	require.Zero(b, r.Overdue())
}
