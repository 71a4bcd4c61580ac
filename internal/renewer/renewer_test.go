package renewer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgfence/pglock/internal/testkit"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// patience bounds every wait for something that must happen.
const patience = 5 * time.Second

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// newFakeClock returns a clock that moves only when told to, reading t0 until then.
func newFakeClock() *testkit.Clock { return testkit.NewClock(t0) }

// fakeStore renews what fn says (everything when fn is nil) and reports each call's
// keys on sent when it is not nil. It has no batch call; fakeBatchStore has.
type fakeStore struct {
	fn   func(ctx context.Context, keys []string) ([]string, error)
	sent chan []string

	mu    sync.Mutex
	calls int
}

func (s *fakeStore) do(ctx context.Context, keys []string) ([]string, error) {
	s.mu.Lock()
	s.calls++
	s.mu.Unlock()
	if s.sent != nil {
		s.sent <- keys
	}
	if s.fn == nil {
		return keys, nil
	}
	return s.fn(ctx, keys)
}

func (s *fakeStore) Calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

func (s *fakeStore) Renew(ctx context.Context, key, _ string, _ time.Duration) (bool, error) {
	got, err := s.do(ctx, []string{key})
	return len(got) == 1, err
}

type fakeBatchStore struct{ *fakeStore }

func (s fakeBatchStore) RenewMany(ctx context.Context, keys, _ []string, _ time.Duration) ([]string, error) {
	return s.do(ctx, keys)
}

// lostLog records the calls of an entry's Lost.
type lostLog struct {
	mu      sync.Mutex
	reasons []Reason
}

func (l *lostLog) Reasons() []Reason {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Reason(nil), l.reasons...)
}

func newEntry(key string, ttl time.Duration) (*Entry, *lostLog) {
	l := &lostLog{}
	e := &Entry{Key: key, Owner: "owner-" + key, TTL: ttl, Lost: func(r Reason) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.reasons = append(l.reasons, r)
	}}
	return e, l
}

func newRenewer(t *testing.T, store Store, clock *testkit.Clock, logger *slog.Logger) *Renewer {
	t.Helper()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	r := New(Config{Store: store, Now: clock.Now, AfterFunc: clock.AfterFunc, Logger: logger})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), patience)
		defer cancel()
		require.NoError(t, r.Close(ctx))
	})
	return r
}

func recv[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(patience):
		require.FailNow(t, "nothing received in time")
		var zero T
		return zero
	}
}

// goAdvance advances the clock on its own goroutine, where a round blocks in g's call,
// and when the test ends opens g and waits for it.
func goAdvance(t *testing.T, clock *testkit.Clock, d time.Duration, g *gate) <-chan struct{} {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		clock.Advance(d)
	}()
	t.Cleanup(func() {
		g.Open(true)
		recv(t, done)
	})
	return done
}

// gate makes calls for one key block until it is opened (or, when honour is set, until
// their ctx is done). Other keys are renewed at
// once.
type gate struct {
	key     string
	entered chan struct{}
	open    chan struct{}
	once    sync.Once
	ok      bool
	ctxErr  chan error // the blocked call's ctx.Err() when it was let go
	honour  bool       // return as soon as ctx is done
}

func newGate(key string, honour bool) *gate {
	return &gate{key: key, entered: make(chan struct{}, 16), open: make(chan struct{}),
		ctxErr: make(chan error, 16), honour: honour}
}

// Open lets the blocked calls go: they renew g's key when ok, and refuse it otherwise.
func (g *gate) Open(ok bool) {
	g.once.Do(func() {
		g.ok = ok
		close(g.open)
	})
}

func (g *gate) fn(ctx context.Context, keys []string) ([]string, error) {
	for _, k := range keys {
		if k != g.key {
			continue
		}
		g.entered <- struct{}{}
		var done <-chan struct{}
		if g.honour {
			done = ctx.Done()
		}
		select {
		case <-g.open:
		case <-done:
		}
		g.ctxErr <- ctx.Err()
		if !g.ok {
			var rest []string
			for _, k := range keys {
				if k != g.key {
					rest = append(rest, k)
				}
			}
			return rest, nil
		}
		return keys, nil
	}
	return keys, nil
}

func deadlineOf(r *Renewer, e *Entry) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return e.deadline
}

func TestDeadlineCountsFromSendTime(t *testing.T) {
	t.Parallel()
	const ttl, took = 30 * time.Second, 4 * time.Second
	for _, batch := range []bool{false, true} {
		t.Run(map[bool]string{false: "Renew", true: "RenewMany"}[batch], func(t *testing.T) {
			t.Parallel()
			clock := newFakeClock()
			fs := &fakeStore{fn: func(_ context.Context, keys []string) ([]string, error) {
				clock.Move(took) // the reply comes back later than the call was sent
				return keys, nil
			}}
			var store Store = fs
			if batch {
				store = fakeBatchStore{fs}
			}
			r := newRenewer(t, store, clock, nil)
			a, _ := newEntry("a", ttl)
			b, _ := newEntry("b", ttl)
			r.Add(a, t0)
			r.Add(b, t0)

			clock.Advance(ttl / 3)

			sentAt := t0.Add(ttl / 3)
			calls := map[bool]int{false: 2, true: 1}[batch] // two Renews, or one RenewMany
			require.Equal(t, calls, fs.Calls())
			require.Equal(t, sentAt.Add(time.Duration(calls)*took), clock.Now())
			require.Equal(t, Deadline(sentAt, ttl), deadlineOf(r, a))
			require.Equal(t, Deadline(sentAt, ttl), deadlineOf(r, b))
		})
	}
}

func TestGroupsOfOneRoundRenewSideBySide(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	g := newGate("a", true)
	fs := &fakeStore{fn: g.fn, sent: make(chan []string, 16)}
	r := newRenewer(t, fakeBatchStore{fs}, clock, nil)
	a, _ := newEntry("a", 30*time.Second) // due at 10s
	b, _ := newEntry("b", 60*time.Second) // due at 20s, within a sixth of its ttl of 10s
	r.Add(a, t0)
	r.Add(b, t0)

	goAdvance(t, clock, 10*time.Second, g)
	recv(t, g.entered)

	// a's call hangs; b's, in the same round, is sent anyway.
	got := map[string]bool{}
	for len(got) < 2 {
		for _, k := range recv(t, fs.sent) {
			got[k] = true
		}
	}
	require.Equal(t, map[string]bool{"a": true, "b": true}, got)
}

func TestInFlightEntryLostAtItsDeadline(t *testing.T) {
	t.Parallel()
	const ttl = 30 * time.Second
	clock := newFakeClock()
	g := newGate("a", false)
	fs := &fakeStore{fn: g.fn}
	r := newRenewer(t, fs, clock, nil)
	a, lost := newEntry("a", ttl)
	r.Add(a, t0)

	advanced := goAdvance(t, clock, ttl/3, g)
	recv(t, g.entered)

	// Half a ttl after the last confirmed send, the renewal is overdue: still live, no
	// longer fresh.
	clock.AdvanceTo(t0.Add(ttl/2 - time.Nanosecond))
	require.True(t, r.Fresh(a))
	clock.AdvanceTo(t0.Add(ttl / 2))
	require.False(t, r.Fresh(a))
	require.True(t, r.Live(a))

	deadline := Deadline(t0, ttl)
	clock.AdvanceTo(deadline.Add(-time.Nanosecond))
	require.Empty(t, lost.Reasons())
	require.True(t, r.Live(a))
	require.False(t, r.Fresh(a))

	clock.AdvanceTo(deadline) // the call still hangs
	require.Equal(t, []Reason{Expired}, lost.Reasons())
	require.False(t, r.Live(a))

	g.Open(true) // a late success does not revive it
	recv(t, advanced)
	clock.Advance(2 * ttl)
	require.Equal(t, []Reason{Expired}, lost.Reasons())
	require.False(t, r.Live(a))
	require.Equal(t, 1, fs.Calls())
	held, reason := r.Remove(a)
	require.False(t, held)
	require.Equal(t, Expired, reason)
}

// A call is bounded on the clock, as the deadlines are, not on the wall: a call slower on
// the wire than the time left to the earliest deadline is answered while the clock
// stands still, and the clock reaching that deadline ends the call as a timeout would.
func TestCallIsBoundedOnTheClock(t *testing.T) {
	t.Parallel()

	t.Run("ASlowCallIsAnsweredWhileTheClockStandsStill", func(t *testing.T) {
		t.Parallel()
		const ttl = 30 * time.Millisecond // the call is sent 17 ms before the deadline
		const took = 300 * time.Millisecond
		clock := newFakeClock()
		fs := &fakeStore{fn: func(ctx context.Context, keys []string) ([]string, error) {
			select { // a reply slow on the wire; the clock does not move meanwhile
			case <-time.After(took):
				return keys, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}}
		r := newRenewer(t, fs, clock, nil)
		a, lost := newEntry("a", ttl)
		r.Add(a, t0)

		clock.Advance(ttl / 3)
		require.Equal(t, Deadline(t0.Add(ttl/3), ttl), deadlineOf(r, a), "not renewed")
		require.Empty(t, lost.Reasons())
		require.Equal(t, 1, fs.Calls())
	})

	t.Run("TheClockReachingTheDeadlineEndsTheCall", func(t *testing.T) {
		t.Parallel()
		const ttl = 30 * time.Second
		clock := newFakeClock()
		g := newGate("a", true)
		fs := &fakeStore{fn: g.fn}
		r := newRenewer(t, fs, clock, nil)
		a, lost := newEntry("a", ttl)
		r.Add(a, t0)

		advanced := goAdvance(t, clock, ttl/3, g)
		recv(t, g.entered)
		clock.AdvanceTo(Deadline(t0, ttl))
		require.ErrorIs(t, recv(t, g.ctxErr), context.DeadlineExceeded)
		recv(t, advanced)
		require.Equal(t, []Reason{Expired}, lost.Reasons())
	})
}

func TestEntryAddedDuringHangingRoundIsRenewed(t *testing.T) {
	t.Parallel()
	const ttl = 30 * time.Second
	clock := newFakeClock()
	g := newGate("a", true)
	fs := &fakeStore{fn: g.fn, sent: make(chan []string, 16)}
	r := newRenewer(t, fs, clock, nil)
	a, _ := newEntry("a", ttl)
	r.Add(a, t0)

	goAdvance(t, clock, ttl/3, g)
	recv(t, g.entered)
	require.Equal(t, []string{"a"}, recv(t, fs.sent))

	b, lostB := newEntry("b", ttl)
	r.Add(b, clock.Now())
	clock.Advance(ttl / 3) // b is due; a's call still hangs

	select {
	case keys := <-fs.sent:
		require.Equal(t, []string{"b"}, keys)
	default:
		require.FailNow(t, "b was not renewed while a's call hung")
	}
	require.Empty(t, lostB.Reasons())
	require.Equal(t, Deadline(t0.Add(2*ttl/3), ttl), deadlineOf(r, b))
}

func TestRefusedAndRemove(t *testing.T) {
	t.Parallel()
	const ttl = 30 * time.Second

	t.Run("RefusedLosesAtOnce", func(t *testing.T) {
		t.Parallel()
		clock := newFakeClock()
		fs := &fakeStore{fn: func(context.Context, []string) ([]string, error) { return nil, nil }}
		r := newRenewer(t, fs, clock, nil)
		a, lost := newEntry("a", ttl)
		r.Add(a, t0)

		clock.Advance(ttl / 3)
		require.Equal(t, []Reason{Refused}, lost.Reasons())
		require.False(t, r.Live(a))

		clock.Advance(2 * ttl)
		require.Equal(t, []Reason{Refused}, lost.Reasons())
		require.Equal(t, 1, fs.Calls())
		held, reason := r.Remove(a)
		require.False(t, held)
		require.Equal(t, Refused, reason)
	})

	t.Run("RemoveOfHeldReportsHeld", func(t *testing.T) {
		t.Parallel()
		clock := newFakeClock()
		fs := &fakeStore{}
		r := newRenewer(t, fs, clock, nil)
		a, lost := newEntry("a", ttl)
		never, _ := newEntry("never", ttl)
		r.Add(a, t0)
		clock.Advance(ttl / 3)
		require.Equal(t, 1, fs.Calls())

		held, reason := r.Remove(a)
		require.True(t, held)
		require.Zero(t, reason)
		require.False(t, r.Live(a))
		held, reason = r.Remove(a)
		require.False(t, held)
		require.Zero(t, reason)
		held, reason = r.Remove(never)
		require.False(t, held)
		require.Zero(t, reason)

		clock.Advance(2 * ttl)
		require.Equal(t, 1, fs.Calls())
		require.Empty(t, lost.Reasons())
	})

	for _, late := range []struct {
		name string
		ok   bool
	}{{"IgnoresLateRefusal", false}, {"IgnoresLateSuccess", true}} {
		t.Run("RemoveInFlight"+late.name, func(t *testing.T) {
			t.Parallel()
			clock := newFakeClock()
			g := newGate("a", false)
			fs := &fakeStore{fn: g.fn}
			r := newRenewer(t, fs, clock, nil)
			a, lost := newEntry("a", ttl)
			r.Add(a, t0)

			advanced := goAdvance(t, clock, ttl/3, g)
			recv(t, g.entered)
			held, reason := r.Remove(a)
			require.True(t, held)
			require.Zero(t, reason)

			g.Open(late.ok)
			recv(t, advanced)
			clock.Advance(2 * ttl)
			require.Empty(t, lost.Reasons())
			require.False(t, r.Live(a))
			require.Equal(t, 1, fs.Calls())
			held, reason = r.Remove(a)
			require.False(t, held)
			require.Zero(t, reason)
		})
	}
}

func TestFailureWarningIsRateLimited(t *testing.T) {
	t.Parallel()
	const (
		warn  = `level=WARN msg="pglock: renewal failed; retrying until the deadline" ttl=%s locks=1 err="connection reset"`
		debug = `level=DEBUG msg="pglock: renewal failed; retrying until the deadline" ttl=%s locks=1 err="connection reset"`
	)
	for _, tc := range []struct {
		name   string
		ttl    time.Duration
		ok     map[int]bool // calls (from 1) that succeed
		levels []string     // one per failed call
		lostAt time.Duration
	}{{
		// ttl 15s: calls at 5s (fails), 6.5s (succeeds), then every 1.5s from 11.5s
		// (all fail) until the deadline at 6.5s+13.5s.
		name:   "WarnsAtFirstFailureAfterSuccess",
		ttl:    15 * time.Second,
		ok:     map[int]bool{2: true},
		levels: []string{warn, warn, debug, debug, debug, debug, debug},
		lostAt: 20 * time.Second,
	}, {
		// ttl 60s: calls at 20s, then every 6s until the deadline at 54s.
		name:   "WarnsAgainAfterTenSeconds",
		ttl:    60 * time.Second,
		levels: []string{warn, debug, warn, debug, warn, debug},
		lostAt: 54 * time.Second,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var out testkit.LogBuffer
			logger := slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{
				Level: slog.LevelDebug,
				ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
					if len(groups) == 0 && a.Key == slog.TimeKey {
						return slog.Attr{}
					}
					return a
				},
			}))
			clock := newFakeClock()
			call := 0
			fs := &fakeStore{fn: func(_ context.Context, keys []string) ([]string, error) {
				call++ // rounds run one after another on the test's goroutine
				if tc.ok[call] {
					return keys, nil
				}
				return nil, errors.New("connection reset")
			}}
			r := newRenewer(t, fs, clock, logger)
			a, lost := newEntry("a", tc.ttl)
			r.Add(a, t0)

			clock.AdvanceTo(t0.Add(tc.lostAt - time.Nanosecond))
			require.Empty(t, lost.Reasons())
			clock.AdvanceTo(t0.Add(tc.lostAt))
			require.Equal(t, []Reason{Expired}, lost.Reasons())

			var want []string
			for _, l := range tc.levels {
				want = append(want, fmt.Sprintf(l, tc.ttl))
			}
			require.Equal(t, want, strings.Split(strings.TrimSpace(out.String()), "\n"))
		})
	}
}

func TestCloseIsBoundedByCtx(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	g := newGate("a", false) // ignores ctx
	fs := &fakeStore{fn: g.fn}
	r := newRenewer(t, fs, clock, nil)
	a, lost := newEntry("a", 30*time.Second)
	r.Add(a, t0)
	advanced := goAdvance(t, clock, 10*time.Second, g)
	recv(t, g.entered)

	cause := errors.New("shutdown took too long")
	ctx, cancel := context.WithCancelCause(t.Context())
	errc := make(chan error, 1)
	go func() { errc <- r.Close(ctx) }()
	cancel(cause)
	require.ErrorIs(t, recv(t, errc), cause)

	go func() { errc <- r.Close(t.Context()) }()
	g.Open(true)
	require.ErrorIs(t, recv(t, g.ctxErr), context.Canceled) // Close cancelled the call
	require.NoError(t, recv(t, errc))
	recv(t, advanced)
	require.Empty(t, lost.Reasons())
}

// TestConcurrentAddRemove adds, checks and removes entries of several ttls from many
// goroutines, which also move the clock: one of them, or all (then rounds overlap, and
// one can be slow enough under -race for another goroutine to run the clock past a
// deadline). Whatever the timing, Remove and Lost must agree: an entry is either
// removed while held and never lost, or lost once with the reason Remove reports. With
// one goroutine moving the clock, entries held throughout (anchors) must stay held.
func TestConcurrentAddRemove(t *testing.T) {
	t.Parallel()
	const workers, perWorker, step = 8, 200, 5 * time.Millisecond
	for _, tc := range []struct {
		batch     bool
		advancers int
	}{{false, 1}, {true, 1}, {false, workers}, {true, workers}} {
		name := fmt.Sprintf("%sWith%dAdvancing", map[bool]string{false: "Renew", true: "RenewMany"}[tc.batch], tc.advancers)
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			clock := newFakeClock()
			fs := &fakeStore{}
			var store Store = fs
			if tc.batch {
				store = fakeBatchStore{fs}
			}
			r := newRenewer(t, store, clock, nil)
			// Short enough for a step or two of the clock to renew something.
			ttls := []time.Duration{30 * time.Millisecond, 50 * time.Millisecond, 70 * time.Millisecond}

			type result struct {
				e      *Entry
				lost   *lostLog
				held   bool
				reason Reason
			}
			var anchors []result
			for _, ttl := range ttls {
				e, lost := newEntry(fmt.Sprint("anchor-", ttl), ttl)
				r.Add(e, clock.Now())
				anchors = append(anchors, result{e: e, lost: lost})
			}

			results := make([][]result, workers)
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() {
					var added []result
					remove := func() {
						res := added[0]
						added = added[1:]
						res.held, res.reason = r.Remove(res.e)
						results[w] = append(results[w], res)
					}
					for i := range perWorker {
						e, lost := newEntry(fmt.Sprintf("w%d-%d", w, i), ttls[(w+i)%len(ttls)])
						r.Add(e, clock.Now())
						added = append(added, result{e: e, lost: lost})
						if w < tc.advancers {
							clock.Advance(step)
						}
						r.Live(added[0].e) // read while rounds renew it
						if i%3 == 0 {
							remove()
						}
					}
					for len(added) > 0 {
						remove()
					}
				})
			}
			wg.Wait()
			for i, res := range anchors {
				anchors[i].held, anchors[i].reason = r.Remove(res.e)
			}
			require.NoError(t, r.Close(t.Context())) // every Lost has been called

			held := 0
			for _, res := range append(slices.Concat(results...), anchors...) {
				if res.held {
					held++
					require.Zero(t, res.reason, res.e.Key)
					require.Empty(t, res.lost.Reasons(), res.e.Key)
				} else {
					require.NotZero(t, res.reason, res.e.Key)
					require.Equal(t, []Reason{res.reason}, res.lost.Reasons(), res.e.Key)
				}
			}
			if tc.advancers == 1 {
				for _, res := range anchors {
					require.True(t, res.held, res.e.Key)
				}
				require.GreaterOrEqual(t, fs.Calls(), 100) // the anchors, renewed every step or two
			}
			t.Logf("%d of %d removed while held; %d store calls", held, workers*perWorker+len(anchors), fs.Calls())
		})
	}
}

// Observe sees every renewal call, failed or not, with its latency; Overdue counts a
// lock whose renewal has not been confirmed for half its ttl, long before it is lost.
func TestObserveAndOverdue(t *testing.T) {
	t.Parallel()
	const ttl = 30 * time.Second
	clock := newFakeClock()
	var mu sync.Mutex
	var took time.Duration
	var failing bool
	errDown := errors.New("down")
	store := &fakeStore{fn: func(_ context.Context, keys []string) ([]string, error) {
		mu.Lock()
		d, fail := took, failing
		mu.Unlock()
		clock.Move(d)
		if fail {
			return nil, errDown
		}
		return keys, nil
	}}
	var calls []Call
	r := New(Config{Store: store, Now: clock.Now, AfterFunc: clock.AfterFunc, Logger: slog.New(slog.DiscardHandler),
		Observe: func(c Call) {
			mu.Lock()
			calls = append(calls, c)
			mu.Unlock()
		}})
	t.Cleanup(func() { require.NoError(t, r.Close(context.Background())) })
	e, lost := newEntry("k", ttl)
	r.Add(e, t0)

	took = 2 * time.Second
	clock.AdvanceTo(t0.Add(10 * time.Second)) // renewed: sent at 10 s, answered at 12 s
	require.Zero(t, r.Overdue())
	mu.Lock()
	took, failing = 0, true
	mu.Unlock()
	clock.AdvanceTo(t0.Add(24 * time.Second)) // fails at 20 s and at 23 s
	require.Zero(t, r.Overdue(), "the last confirmed renewal was sent 14 s ago")
	clock.AdvanceTo(t0.Add(25 * time.Second))
	require.Equal(t, 1, r.Overdue(), "15 s: half the ttl")
	require.Empty(t, lost.Reasons(), "the lock is lost only at 37 s")
	mu.Lock()
	failing = false
	mu.Unlock()
	clock.AdvanceTo(t0.Add(26 * time.Second)) // the retry succeeds
	require.Zero(t, r.Overdue())

	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []Call{
		{TTL: ttl, Locks: 1, Sent: t0.Add(10 * time.Second), Duration: 2 * time.Second},
		{TTL: ttl, Locks: 1, Sent: t0.Add(20 * time.Second), Err: errDown},
		{TTL: ttl, Locks: 1, Sent: t0.Add(23 * time.Second), Err: errDown},
		{TTL: ttl, Locks: 1, Sent: t0.Add(26 * time.Second)},
	}, calls)
}

func TestConfirm(t *testing.T) {
	t.Parallel()

	t.Run("RenewsWhatWasConfirmedBeforeInOneRound", func(t *testing.T) {
		t.Parallel()
		clock := newFakeClock()
		fs := &fakeStore{sent: make(chan []string, 16)}
		r := newRenewer(t, fakeBatchStore{fs}, clock, nil)
		a, _ := newEntry("a", 30*time.Second)
		b, _ := newEntry("b", 30*time.Second)
		c, _ := newEntry("c", 60*time.Second)
		late, _ := newEntry("late", 30*time.Second)
		r.Add(a, t0)
		r.Add(b, t0)
		r.Add(c, t0)
		clock.Advance(2 * time.Second)
		r.Add(late, t0.Add(2*time.Second))
		clock.Advance(time.Second)

		r.Confirm(t0.Add(time.Second)) // late was confirmed after that: not renewed
		clock.Advance(0)
		sent := map[string]bool{}
		for range 2 { // one call per ttl
			for _, k := range recv(t, fs.sent) {
				sent[k] = true
			}
		}
		require.Equal(t, map[string]bool{"a": true, "b": true, "c": true}, sent)
		require.Equal(t, 2, fs.Calls())
		now := t0.Add(3 * time.Second)
		require.Equal(t, Deadline(now, 30*time.Second), deadlineOf(r, a))
		require.Equal(t, Deadline(now, 60*time.Second), deadlineOf(r, c))
		require.Equal(t, Deadline(t0.Add(2*time.Second), 30*time.Second), deadlineOf(r, late))

		// The next renewals count from the confirmation.
		clock.AdvanceTo(t0.Add(12 * time.Second)) // late's, due at 12 s, takes a and b along (due at 13 s)
		require.Equal(t, 3, fs.Calls())
		require.ElementsMatch(t, []string{"a", "b", "late"}, recv(t, fs.sent))
	})

	t.Run("RefusedRenewalConfirmsTheOthers", func(t *testing.T) {
		t.Parallel()
		clock := newFakeClock()
		fs := &fakeStore{fn: func(context.Context, []string) ([]string, error) { return nil, nil }}
		r := newRenewer(t, fakeBatchStore{fs}, clock, nil)
		a, lostA := newEntry("a", 30*time.Second) // due at 10 s
		b, lostB := newEntry("b", 90*time.Second) // due at 30 s, not within a sixth of its ttl of 10 s
		r.Add(a, t0)
		r.Add(b, t0)

		clock.AdvanceTo(t0.Add(10 * time.Second))
		require.Equal(t, []Reason{Refused}, lostA.Reasons())
		require.Equal(t, []Reason{Refused}, lostB.Reasons(), "b is confirmed, and found lost, at 10 s, not at 30 s")
		require.Equal(t, 2, fs.Calls())
	})

	t.Run("RetriesAFailedCallSoon", func(t *testing.T) {
		t.Parallel()
		clock := newFakeClock()
		var mu sync.Mutex
		var sent []time.Time
		fails := 2 // calls on connections to a server that is gone
		fs := &fakeStore{fn: func(_ context.Context, keys []string) ([]string, error) {
			mu.Lock()
			defer mu.Unlock()
			sent = append(sent, clock.Now())
			if fails > 0 {
				fails--
				return nil, errors.New("unexpected EOF")
			}
			return nil, nil // refused: the new server never had the lock
		}}
		r := newRenewer(t, fs, clock, nil)
		a, lost := newEntry("a", 30*time.Second)
		r.Add(a, t0)
		clock.Advance(time.Second)
		r.Confirm(clock.Now())
		clock.Advance(100 * time.Millisecond)
		require.Equal(t, []Reason{Refused}, lost.Reasons())
		mu.Lock()
		defer mu.Unlock()
		at := t0.Add(time.Second)
		require.Equal(t, []time.Time{at, at.Add(10 * time.Millisecond), at.Add(30 * time.Millisecond)}, sent,
			"retried after 10 ms, then 20 ms, not after a tenth of the ttl")
	})

	t.Run("LeavesACallInFlightAlone", func(t *testing.T) {
		t.Parallel()
		clock := newFakeClock()
		g := newGate("a", false)
		fs := &fakeStore{fn: g.fn}
		r := newRenewer(t, fs, clock, nil)
		a, lost := newEntry("a", 30*time.Second)
		r.Add(a, t0)
		advanced := goAdvance(t, clock, 10*time.Second, g)
		recv(t, g.entered)
		r.Confirm(t0.Add(10 * time.Second))
		g.Open(true)
		recv(t, advanced)
		clock.Advance(0)
		require.Equal(t, 1, fs.Calls(), "the call in flight confirms it")
		require.Empty(t, lost.Reasons())
	})
}
