package pglock_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/tcpproxy"
	"github.com/pgfence/pglock/internal/testkit"
	"github.com/pgfence/pglock/pglocktest"
)

// A link that goes silent: Health says "not ready" once the lock's renewal is overdue,
// while the lock is still held, here and in the database; once the link comes back and
// the renewal goes through, it is ready again, and the lock was never lost.
func TestHealthIsUnreadyWhileTheLinkIsSilentBeforeTheLockIsLost(t *testing.T) {
	t.Parallel()
	url := pglocktest.PostgresURL(t)
	silent, proxy := proxiedPool(t, url, 3)
	direct := pglocktest.Pool(t, url, 2)
	clock := pglock.TestClock{Clock: testkit.NewClock(time.Now())} // moves while a renewal round waits
	// A lease the database keeps however slow the machine; the client's clock says when
	// its renewal is overdue.
	const ttl = time.Minute
	c := newClient(t, pglock.NewPostgresStore(silent), quiet, pglock.WithClock(clock), pglock.TTL(ttl))
	t.Cleanup(proxy.Restore) // before Close
	key := t.Name()

	h := c.Health()
	require.True(t, h.Ready, "a client that holds nothing is ready: %v", h.Err)
	require.Zero(t, h.LocksHeld)
	require.True(t, h.LastRenewal.IsZero())

	l, err := c.TryAcquire(t.Context(), key)
	require.NoError(t, err)
	clock.Advance(ttl / 3) // the first renewal
	h = c.Health()
	require.True(t, h.Ready, "%v", h.Err)
	require.Equal(t, 1, h.LocksHeld)
	require.Equal(t, clock.Now(), h.LastRenewal)
	firstRenewal := h.LastRenewal

	// The next renewal is sent (its statement prepared, the key is in its parameters),
	// and nothing answers, nothing refuses.
	sent := proxy.BlackholeAfter(func(chunk []byte) bool { return bytes.Contains(chunk, []byte(key)) })
	renewed := make(chan struct{})
	go func() { defer close(renewed); clock.Advance(ttl / 3) }() // the renewal round waits for its answer
	receive(t, sent, "the renewal")
	clock.Move(ttl/2 - ttl/3) // half a ttl since the last confirmed renewal was sent
	h = c.Health()
	require.False(t, h.Ready, "a renewal overdue for half the ttl")
	require.True(t, l.Held(), "unready before the lock is lost")
	require.NoError(t, l.Context().Err())
	require.Equal(t, 1, h.LocksHeld)
	require.ErrorContains(t, h.Err, "renewal overdue for 1 of 1 locks held")
	var live bool
	require.NoError(t, direct.QueryRow(t.Context(),
		"SELECT expires_at > clock_timestamp() FROM pglock.locks WHERE key = $1 AND owner = $2", key, l.Owner()).Scan(&live))
	require.True(t, live, "the database still has the lock")

	proxy.Restore() // the renewal held up is answered
	receive(t, renewed, "the renewal's answer")
	h = c.Health()
	require.True(t, h.Ready, "%v", h.Err)
	require.True(t, h.LastRenewal.After(firstRenewal))
	require.True(t, l.Held())
	require.NoError(t, l.Context().Err(), "the lock was never lost")
	require.NoError(t, l.Release(t.Context()))
}

// A renewal call that fails makes the client unready at once, long before the lock's
// deadline; the first call that succeeds makes it ready again: here the client's own
// probe, a second after the failure. Each renewal call is an EventRenewal with its
// error.
func TestHealthIsUnreadyOnceARenewalFails(t *testing.T) {
	t.Parallel()
	store := &failingStore{Store: pglock.InternalStore(pglock.NewPostgresStore(pglocktest.Postgres(t)))}
	clock := pglocktest.NewManualClock(time.Now())
	var mu sync.Mutex
	var renewals []pglock.Event
	c := newClient(t, pglock.WrapStore(store), quiet, pglock.TTL(time.Minute), pglock.WithClock(clock),
		pglock.WithEventHandler(func(e pglock.Event) {
			if e.Type == pglock.EventRenewal {
				mu.Lock()
				renewals = append(renewals, e)
				mu.Unlock()
			}
		}))
	l, err := c.TryAcquire(t.Context(), t.Name())
	require.NoError(t, err)

	clock.Advance(20 * time.Second) // renewed
	h := c.Health()
	require.True(t, h.Ready, "%v", h.Err)
	require.Equal(t, clock.Now(), h.LastRenewal)
	renewedAt := h.LastRenewal

	store.failing.Store(true)
	clock.Advance(20 * time.Second) // the renewal fails; the deadline is 34 s away
	h = c.Health()
	require.False(t, h.Ready)
	require.ErrorIs(t, h.Err, errStoreDown)
	require.ErrorContains(t, h.Err, "pglock: store call renew failed")
	require.Equal(t, "renew", h.FailedCall)
	require.Equal(t, clock.Now(), h.FailedAt)
	require.Equal(t, renewedAt, h.LastRenewal)
	require.Equal(t, 1, h.LocksHeld)
	require.True(t, l.Held())

	clock.Advance(time.Second) // the client's probe fails too
	h = c.Health()
	require.False(t, h.Ready)
	require.Equal(t, "renew", h.FailedCall, "the failure that made it unready")

	store.failing.Store(false)
	clock.Advance(time.Second) // the next probe succeeds: the store answers
	h = c.Health()
	require.True(t, h.Ready, "%v", h.Err)
	require.Equal(t, clock.Now(), h.LastAnswer)
	// The store is back, maybe another server (a failover): the lock is confirmed at
	// once, not at the retry a tenth of the ttl after the failure.
	require.Equal(t, clock.Now(), h.LastRenewal)
	require.Empty(t, h.FailedCall)
	confirmedAt := h.LastRenewal

	clock.Advance(4 * time.Second) // when the retry would have been: none is due
	h = c.Health()
	require.True(t, h.Ready, "%v", h.Err)
	require.Equal(t, confirmedAt, h.LastRenewal)

	require.NoError(t, c.Close(t.Context()))
	h = c.Health()
	require.False(t, h.Ready, "a closed client takes no work")
	require.ErrorIs(t, h.Err, pglock.ErrClosed)
	require.Zero(t, h.LocksHeld)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, renewals, 3)
	require.NoError(t, renewals[0].Err)
	require.ErrorIs(t, renewals[1].Err, errStoreDown)
	require.NoError(t, renewals[2].Err)
	for _, e := range renewals {
		require.Empty(t, e.Key)
	}
}

func TestHealthCountsTheElectionsLed(t *testing.T) {
	t.Parallel()
	c := newClient(t, pglock.NewPostgresStore(pglocktest.Postgres(t)), quiet)
	led := make(chan struct{})
	e, err := c.Elect(t.Name(), pglock.LeaderCallbacks{OnAcquired: func(context.Context, *pglock.Lock) error {
		close(led)
		return nil
	}})
	require.NoError(t, err)
	receive(t, led)
	h := c.Health()
	require.Equal(t, 1, h.ElectionsLed)
	require.Equal(t, 1, h.LocksHeld, "the lease")
	require.True(t, h.Ready)
	require.NoError(t, e.Resign(t.Context()))
	h = c.Health()
	require.Zero(t, h.ElectionsLed)
	require.Zero(t, h.LocksHeld)
}

// Acquisitions report how long the caller waited and how long the store call took;
// calls that return without the lock report why, for each of the three calls.
func TestAcquireEventsCarryWaitDurationAndWhy(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t)
	clock := pglocktest.NewManualClock(time.Now())
	const took = 30 * time.Millisecond
	slow := &clockMovingStore{Store: pglock.InternalStore(pglock.NewPostgresStore(pool)), clock: clock, d: took}
	var mu sync.Mutex
	var got []pglock.Event
	record := func(e pglock.Event) {
		mu.Lock()
		got = append(got, e)
		mu.Unlock()
	}
	var second []pglock.EventType // a second handler gets every event too, after the first
	c, err := pglock.NewWithStore(pglock.WrapStore(slow), quiet, pglock.WithClock(clock), pglock.WithEventHandler(record),
		pglock.WithEventHandler(func(e pglock.Event) {
			mu.Lock()
			second = append(second, e.Type)
			mu.Unlock()
		}))
	require.NoError(t, err)
	other := newClient(t, pglock.NewPostgresStore(pool), quiet)
	key := t.Name()

	l, err := c.TryAcquire(t.Context(), key)
	require.NoError(t, err)
	require.NoError(t, l.Release(t.Context()))
	held, err := other.TryAcquire(t.Context(), key)
	require.NoError(t, err)
	_, err = c.TryAcquire(t.Context(), key)
	require.ErrorIs(t, err, pglock.ErrNotAcquired)
	_, err = c.Acquire(t.Context(), key, pglock.Wait(0))
	require.ErrorIs(t, err, pglock.ErrNotAcquired)
	err = c.WithLock(t.Context(), key, nil)
	require.ErrorIs(t, err, pglock.ErrInvalidArgument)
	_, err = c.Acquire(t.Context(), "", pglock.Wait(0))
	require.ErrorIs(t, err, pglock.ErrInvalidKey)
	require.NoError(t, held.Release(t.Context()))
	require.NoError(t, c.WithLock(t.Context(), key, func(context.Context) error { return nil }))
	require.NoError(t, c.Close(t.Context()))

	mu.Lock()
	defer mu.Unlock()
	type seen struct {
		typ        pglock.EventType
		wait, took time.Duration
		err        error
	}
	var seq []seen
	for _, e := range got {
		if e.Type == pglock.EventAcquired || e.Type == pglock.EventAcquireFailed {
			seq = append(seq, seen{e.Type, e.Wait, e.Duration, e.Err})
		}
	}
	require.Len(t, seq, 6)
	require.Equal(t, seen{pglock.EventAcquired, took, took, nil}, seq[0], "TryAcquire")
	require.Equal(t, pglock.EventAcquireFailed, seq[1].typ, "TryAcquire on a held key")
	require.Equal(t, took, seq[1].wait)
	require.ErrorIs(t, seq[1].err, pglock.ErrNotAcquired)
	require.Equal(t, pglock.EventAcquireFailed, seq[2].typ, "Acquire on a held key")
	require.ErrorIs(t, seq[2].err, pglock.ErrNotAcquired)
	require.Equal(t, took, seq[2].wait, "Wait(0): one attempt")
	require.Equal(t, pglock.EventAcquireFailed, seq[3].typ, "WithLock without fn")
	require.ErrorIs(t, seq[3].err, pglock.ErrInvalidArgument)
	require.Zero(t, seq[3].wait)
	require.Equal(t, pglock.EventAcquireFailed, seq[4].typ, "Acquire of an empty key")
	require.ErrorIs(t, seq[4].err, pglock.ErrInvalidKey)
	require.Equal(t, seen{pglock.EventAcquired, took, took, nil}, seq[5], "WithLock")
	require.Equal(t, pglock.EventReleased, got[len(got)-1].Type)
	var types []pglock.EventType
	for _, e := range got {
		types = append(types, e.Type)
	}
	require.Equal(t, types, second, "the second handler got every event, in order")
}

// outageLink is a pool whose link to PostgreSQL goes through a proxy that can fail in
// two ways: cut (every connection ends and new ones are refused, as when the server or
// the proxy in front of it dies) or black-holed (nothing moves either way, as behind a
// partition); restore ends the outage.
type outageLink struct {
	url   string
	proxy *tcpproxy.Proxy

	mu    sync.Mutex
	down  bool
	conns []net.Conn // to the server
}

func newOutageLink(t *testing.T) (*outageLink, *pgxpool.Pool) {
	t.Helper()
	url := pglocktest.PostgresURL(t)
	o := &outageLink{url: url}
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	upstream := tcpproxy.To(cfg.ConnConfig.Host, cfg.ConnConfig.Port)
	refused := errors.New("connection refused")
	o.proxy, err = tcpproxy.New(func(ctx context.Context) (net.Conn, error) {
		o.mu.Lock()
		down := o.down
		o.mu.Unlock()
		if down {
			return nil, refused
		}
		conn, err := upstream(ctx)
		if err != nil {
			return nil, err
		}
		o.mu.Lock()
		defer o.mu.Unlock()
		if o.down { // cut while it dialled
			_ = conn.Close()
			return nil, refused
		}
		o.conns = append(o.conns, conn)
		return conn, nil
	})
	require.NoError(t, err)
	t.Cleanup(o.proxy.Close)
	host, port, err := net.SplitHostPort(o.proxy.Addr())
	require.NoError(t, err)
	n, err := strconv.Atoi(port)
	require.NoError(t, err)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Fallbacks = host, uint16(n), nil
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	t.Cleanup(o.restore) // before the client's Close and the pool's
	return o, pool
}

// fail starts an outage: "cut" ends every connection and refuses new ones;
// "black-holed" lets nothing through either way.
func (o *outageLink) fail(kind string) {
	switch kind {
	case "cut":
		o.mu.Lock()
		o.down = true
		for _, c := range o.conns {
			_ = c.Close()
		}
		o.conns = nil
		o.mu.Unlock()
	case "black-holed":
		o.proxy.Blackhole()
	default:
		panic("unknown outage " + kind)
	}
}

func (o *outageLink) restore() {
	o.mu.Lock()
	o.down = false
	o.mu.Unlock()
	o.proxy.Restore()
}

// A role a client plays while its database goes away: start puts c in it, on key
// (direct reaches the same database), and returns a channel closed once the outage
// (begun when outage is closed) has cost the client its call, lock or leadership; nil
// when it costs nothing.
type outageRole struct {
	name  string
	start func(t *testing.T, c *pglock.Client, key string, direct *pgxpool.Pool, outage <-chan struct{}) (lost <-chan struct{})
}

var outageRoles = []outageRole{{
	name: "NoLock", // tries a key during the outage, as a request would, and gives up after 3 s
	start: func(t *testing.T, c *pglock.Client, key string, _ *pgxpool.Pool, outage <-chan struct{}) <-chan struct{} {
		done := make(chan struct{})
		go func() {
			defer close(done)
			<-outage
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			if l, err := c.TryAcquire(ctx, key); err == nil {
				_ = l.Release(context.Background())
			}
		}()
		t.Cleanup(func() { <-done })
		return done
	},
}, {
	name: "Waiter", // waits for a key another instance holds
	start: func(t *testing.T, c *pglock.Client, key string, direct *pgxpool.Pool, _ <-chan struct{}) <-chan struct{} {
		other := newClient(t, pglock.NewPostgresStore(direct), quiet)
		held, err := other.TryAcquire(t.Context(), key, pglock.TTL(time.Minute))
		require.NoError(t, err)
		t.Cleanup(func() { _ = held.Release(context.Background()) })
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		t.Cleanup(func() { cancel(); <-done })
		go func() {
			defer close(done)
			if l, err := c.Acquire(ctx, key); err == nil {
				_ = l.Release(context.Background())
			}
		}()
		require.Eventually(t, func() bool { return wanted(direct, key) }, 10*time.Second, 10*time.Millisecond,
			"it listens, and has marked the key")
		return nil
	},
}, {
	name: "Leader",
	start: func(t *testing.T, c *pglock.Client, key string, _ *pgxpool.Pool, _ <-chan struct{}) <-chan struct{} {
		led, lost := make(chan struct{}), make(chan struct{})
		_, err := c.Elect(key, pglock.LeaderCallbacks{
			OnAcquired: func(context.Context, *pglock.Lock) error {
				select {
				case <-led: // leads again after the outage
				default:
					close(led)
				}
				return nil
			},
			OnLost: func(*pglock.Lock) {
				select {
				case <-lost:
				default:
					close(lost)
				}
			},
		})
		require.NoError(t, err)
		receive(t, led)
		return lost
	},
}, {
	name: "Holder",
	start: func(t *testing.T, c *pglock.Client, key string, _ *pgxpool.Pool, _ <-chan struct{}) <-chan struct{} {
		l, err := c.TryAcquire(t.Context(), key)
		require.NoError(t, err)
		return l.Context().Done()
	},
}}

// Health follows the database, not only the locks held: whatever the client does (it
// holds nothing and tries a key, it waits for a key, it leads an election, it holds a
// lock), it is unready while the database cannot be reached, still unready once its
// call, lock or leadership is lost to the outage, and ready again once a store call
// succeeds after it, with nothing else to do. It names the call that failed.
func TestHealthFollowsTheDatabaseWhateverTheClientDoes(t *testing.T) {
	t.Parallel()
	const ttl = 3 * time.Second // renewed every second, lost at 2.7 s; a call may wait 1.5 s
	for _, outage := range []string{"cut", "black-holed"} {
		for _, r := range outageRoles {
			t.Run(r.name+"/"+outage, func(t *testing.T) {
				t.Parallel()
				link, pool := newOutageLink(t)
				direct := pglocktest.Pool(t, link.url, 2)
				c, err := pglock.New(pool, quiet, pglock.TTL(ttl))
				require.NoError(t, err)
				t.Cleanup(func() { require.NoError(t, c.Close(context.Background())) })
				t.Cleanup(link.restore)
				begun := make(chan struct{})
				lost := r.start(t, c, t.Name(), direct, begun)
				h := c.Health()
				require.True(t, h.Ready, "before the outage: %v", h.Err)

				outageAt := time.Now()
				link.fail(outage)
				close(begun)
				require.Eventually(t, func() bool { h = c.Health(); return !h.Ready }, 10*time.Second, 5*time.Millisecond,
					"unready during the outage")
				if lost != nil {
					receive(t, lost)
					h = c.Health()
					// On failure, say which answer made it ready.
					require.False(t, h.Ready, "still unready once the outage took what the client had: last answer %s (outage from %s), held %d, leading %d",
						h.LastAnswer.Format("15:04:05.000"), outageAt.Format("15:04:05.000"), h.LocksHeld, h.ElectionsLed)
				}
				require.NotEmpty(t, h.FailedCall, "%v", h.Err)
				require.False(t, h.FailedAt.IsZero())
				t.Logf("during: %s at %s: %v", h.FailedCall, h.FailedAt.Format("15:04:05.000"), h.Err)

				link.restore()
				restoredAt := time.Now()
				require.Eventually(t, func() bool { h = c.Health(); return h.Ready }, 10*time.Second, 5*time.Millisecond,
					"ready after the outage: %v", h.Err)
				require.True(t, h.LastAnswer.After(restoredAt), "a call succeeded after the outage")
				require.Empty(t, h.FailedCall)
				t.Logf("ready %v after the outage", time.Since(restoredAt).Round(time.Millisecond))
			})
		}
	}
}

// "Held by another" is an answer, so a success; a call that the caller gives up on
// before it waited long is the caller's doing, not the database's: neither makes the
// client unready.
func TestHealthCountsAnswersNotTheCallersGivingUp(t *testing.T) {
	t.Parallel()
	link, pool := newOutageLink(t)
	other := newClient(t, pglock.NewPostgresStore(pglocktest.Pool(t, link.url, 2)), quiet)
	c := newClient(t, pglock.NewPostgresStore(pool), quiet, pglock.TTL(10*time.Second)) // a call may wait 5 s
	t.Cleanup(link.restore)
	key := t.Name()
	held, err := other.TryAcquire(t.Context(), key)
	require.NoError(t, err)

	_, err = c.TryAcquire(t.Context(), key)
	require.ErrorIs(t, err, pglock.ErrNotAcquired)
	h := c.Health()
	require.True(t, h.Ready, "%v", h.Err)
	require.False(t, h.LastAnswer.IsZero())
	answered := h.LastAnswer

	link.fail("black-holed")
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, err = c.Acquire(ctx, key)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	h = c.Health()
	require.True(t, h.Ready, "the caller gave up: %v", h.Err)
	require.Equal(t, answered, h.LastAnswer)
	link.restore()
	require.NoError(t, held.Release(t.Context()))
}

// A caller that gives up leaves its statement in flight, on its connection, to its reply:
// unanswered past its patience (half the ttl here), the call makes the client unready,
// as any call does, until an answer comes.
func TestHealthCountsAGivenUpCallThatGoesUnanswered(t *testing.T) {
	t.Parallel()
	link, pool := newOutageLink(t)
	const ttl = time.Second // patience: 500 ms
	c := newClient(t, pglock.NewPostgresStore(pool), quiet, pglock.TTL(ttl))
	t.Cleanup(link.restore)
	warm, err := c.TryAcquire(t.Context(), "warm") // the pool's connection is open
	require.NoError(t, err)
	require.NoError(t, warm.Release(t.Context()))

	link.fail("black-holed")
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, err = c.TryAcquire(ctx, t.Name())
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.True(t, c.Health().Ready, "the caller gave up before its patience")
	var h pglock.Health
	require.Eventually(t, func() bool { h = c.Health(); return !h.Ready }, 3*time.Second, 5*time.Millisecond,
		"a call given up and unanswered past its patience")
	require.Equal(t, "acquire", h.FailedCall, "%v", h.Err)
	link.restore()
	require.Eventually(t, func() bool { h = c.Health(); return h.Ready }, 10*time.Second, 5*time.Millisecond,
		"ready once answered: %v", h.Err)
}
