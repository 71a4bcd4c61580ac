package pglock

import (
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock/internal/store"
	"github.com/pgfence/pglock/internal/tcpproxy"
)

// countingStore is the PostgreSQL store counting its acquisition statements
// (lock_acquire, lock_acquire_or_want, queue_acquire). It keeps the store's
// capabilities (markWanted above all, so that its clients listen).
type countingStore struct {
	store.Store
	store.Wanter
	attempts *atomic.Int64
	marks    *atomic.Int64 // lock_want calls
	polls    *atomic.Int64 // queue_poll calls
	claims   *atomic.Int64 // queue_poll calls that returned a token
	// claimCalls records how long each queue_poll call that returned a token took, from
	// its call to its return: a handover's claim.
	claimCalls *durations
}

// durations is a list of durations that goroutines append to.
type durations struct {
	mu sync.Mutex
	ds []time.Duration
}

func (d *durations) add(v time.Duration) {
	d.mu.Lock()
	d.ds = append(d.ds, v)
	d.mu.Unlock()
}

// newCountingStore returns a countingStore on pool.
func newCountingStore(pool *pgxpool.Pool, attempts, marks, polls, claims *atomic.Int64, claimCalls *durations) countingStore {
	s := NewPostgresStore(pool).s
	return countingStore{Store: s, Wanter: s.(store.Wanter), attempts: attempts, marks: marks, polls: polls, claims: claims,
		claimCalls: claimCalls}
}

// Unwrap returns the PostgreSQL store, for the renewals (see store.NewRenewals).
func (s countingStore) Unwrap() store.Store { return s.Store }

func (s countingStore) QueueAcquire(ctx context.Context, t store.Target, owner string, ttl time.Duration) (int, int64, int64, int, error) {
	s.attempts.Add(1)
	return s.Store.QueueAcquire(ctx, t, owner, ttl)
}

func (s countingStore) QueuePoll(ctx context.Context, key string, ticket int64) (int, int64, bool, int, error) {
	s.polls.Add(1)
	start := time.Now()
	permit, token, queued, ahead, err := s.Store.QueuePoll(ctx, key, ticket)
	if token > 0 {
		s.claims.Add(1)
		s.claimCalls.add(time.Since(start))
	}
	return permit, token, queued, ahead, err
}

func (s countingStore) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (int64, bool, error) {
	s.attempts.Add(1)
	return s.Store.Acquire(ctx, key, owner, ttl)
}

func (s countingStore) MarkWanted(ctx context.Context, key string) (bool, error) {
	s.marks.Add(1)
	return s.Wanter.MarkWanted(ctx, key)
}

func (s countingStore) AcquireOrWant(ctx context.Context, key, owner string, ttl time.Duration) (int64, bool, bool, error) {
	s.attempts.Add(1)
	return s.Wanter.AcquireOrWant(ctx, key, owner, ttl)
}

// stoppedClock never moves: a waiter on it never polls, so only a release's wake-up
// can bring it its turn.
type stoppedClock struct{ t time.Time }

func (c stoppedClock) Now() time.Time                        { return c.t }
func (c stoppedClock) AfterFunc(time.Duration, func()) Timer { return stoppedTimer{} }

type stoppedTimer struct{}

func (stoppedTimer) Stop() bool { return true }

// crowd is N waiters over M clients on one pool, each taking one key with Acquire in
// turn, holding it for hold and releasing it, until n acquisitions are done.
type crowd struct {
	clients, waitersEach int
	hold                 time.Duration
	clock                Clock // nil: the real clock
	// once makes it the start of a crowd: every waiter calls Acquire at the same
	// moment, once, and leaves when it has held the key (n is then ignored).
	once bool
	// warm has each client wait once before the crowd, so that its listener is up when
	// the crowd starts; otherwise it starts with the crowd.
	warm bool
	// listen is where the clients' listeners connect; nil: the pool's server.
	listen *pgx.ConnConfig
	// fair has every waiter wait in the fair queue (Fair).
	fair bool
}

// crowdResult is what a crowd run measured.
type crowdResult struct {
	acquisitions int
	attempts     int64
	marks        int64 // lock_want calls
	polls        int64 // queue_poll calls
	claims       int64 // queue_poll calls that took the key
	// firstAttempts is how many attempts had been sent when the first acquisition came
	// back, the winning one included.
	firstAttempts int64
	handovers     []time.Duration // from a holder's Release call to the next acquisition
	claimCalls    []time.Duration // how long each claiming queue_poll call took
	waits         []time.Duration // from each Acquire call to its acquisition (in a loop, each waiter's second on)
	elapsed       time.Duration   // from the crowd's start to its last release
	// waiting is, summed over the clients, how long each had a waiter: from the crowd's
	// start to its last acquisition.
	waiting time.Duration
}

// longest returns the longest handover.
func (r crowdResult) longest() time.Duration {
	if len(r.handovers) == 0 {
		return 0
	}
	return slices.Max(r.handovers)
}

func (r crowdResult) attemptsPerAcquisition() float64 {
	return float64(r.attempts) / float64(r.acquisitions)
}

// percentile returns the p-th percentile of ds (sorted in place).
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(p*float64(len(ds))))]
}

// fairness is the longest wait over the mean wait.
func (r crowdResult) fairness() float64 {
	if len(r.waits) == 0 {
		return 0
	}
	var sum time.Duration
	for _, w := range r.waits {
		sum += w
	}
	return float64(slices.Max(r.waits)) / (float64(sum) / float64(len(r.waits)))
}

// run makes n acquisitions of key. It fails tb when two waiters hold the key at once,
// or when ctx ends first (a wake-up was lost, with a stopped clock).
func (cr crowd) run(ctx context.Context, tb testing.TB, pool *pgxpool.Pool, key string, n int) crowdResult {
	tb.Helper()
	var attempts, marks, polls, claims atomic.Int64
	claimCalls := &durations{}
	counting := &Store{newCountingStore(pool, &attempts, &marks, &polls, &claims, claimCalls)}
	var acquireOpts []AcquireOption
	if cr.fair {
		acquireOpts = append(acquireOpts, Fair())
	}
	listen := cr.listen
	if listen == nil {
		listen = pool.Config().ConnConfig
	}
	opts := []ClientOption{listenOn(listen), TTL(30 * time.Second), WithInstanceName("crowd")}
	if cr.clock != nil {
		opts = append(opts, WithClock(cr.clock))
	}
	var (
		remaining atomic.Int64
		inside    atomic.Int32
		released  atomic.Int64 // the unix nanoseconds of the last Release call
		mu        sync.Mutex
		res       crowdResult
		wg        sync.WaitGroup
		failed    atomic.Value
	)
	if cr.once {
		n = cr.clients * cr.waitersEach
	}
	remaining.Store(int64(n))
	fail := func(err error) { failed.CompareAndSwap(nil, err) }
	ready := make(chan struct{}) // closed when every waiter may start
	var clients []*Client
	lastAcquired := make([]atomic.Int64, cr.clients) // unix nanoseconds, by client
	for i := range cr.clients {
		c, err := newClient(counting, "New", opts)
		require.NoError(tb, err)
		clients = append(clients, c)
		defer func() { require.NoError(tb, c.Close(context.Background())) }()
		if cr.warm {
			waitOnce(ctx, tb, c, key+"/warm")
		}
		for range cr.waitersEach {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-ready
				for first := true; remaining.Load() > 0 && failed.Load() == nil; first = false {
					start := time.Now()
					l, err := c.Acquire(ctx, key, acquireOpts...)
					if err != nil {
						fail(fmt.Errorf("acquire: %w", err))
						return
					}
					now := time.Now()
					lastAcquired[i].Store(now.UnixNano())
					if inside.Add(1) != 1 {
						fail(fmt.Errorf("two waiters hold %q at once", key))
					}
					left := remaining.Add(-1)
					if left >= 0 {
						mu.Lock()
						if res.acquisitions == 0 {
							res.firstAttempts = attempts.Load()
						}
						res.acquisitions++
						if cr.once || !first { // a loop's first waits are its start's, which once measures
							res.waits = append(res.waits, now.Sub(start))
						}
						if r := released.Load(); r != 0 {
							res.handovers = append(res.handovers, now.Sub(time.Unix(0, r)))
						}
						mu.Unlock()
					}
					time.Sleep(cr.hold) // the work under the lock
					inside.Add(-1)
					released.Store(time.Now().UnixNano())
					if err := l.Release(ctx); err != nil {
						fail(fmt.Errorf("release: %w", err))
						return
					}
					if cr.once {
						return
					}
				}
			}()
		}
	}
	openAll(ctx, tb, pool)
	attempts.Store(0) // the warm-up's do not count
	marks.Store(0)
	polls.Store(0)
	claims.Store(0)
	close(ready)
	start := time.Now()
	wg.Wait()
	res.elapsed = time.Since(start)
	for i := range lastAcquired {
		res.waiting += time.Unix(0, lastAcquired[i].Load()).Sub(start)
	}
	if err, _ := failed.Load().(error); err != nil {
		tb.Fatalf("crowd of %d×%d: %v; %s", cr.clients, cr.waitersEach, err, queueState(pool, key))
	}
	for _, c := range clients {
		c.listener.mu.Lock()
		lines := maps.Clone(c.listener.lines)
		c.listener.mu.Unlock()
		assert.Empty(tb, lines, "a client's lines of fair waiters, once its waiters are served")
	}
	res.attempts = attempts.Load()
	res.marks = marks.Load()
	res.polls, res.claims = polls.Load(), claims.Load()
	res.claimCalls = claimCalls.ds
	return res
}

// queueState describes key's lock row and its fair queue, for a crowd that failed.
func queueState(pool *pgxpool.Pool, key string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var lock string
	if err := pool.QueryRow(ctx, `SELECT format('owner %s, token %s, expires in %s', owner, fencing_token, expires_at - clock_timestamp())
		FROM pglock.locks WHERE key = $1`, key).Scan(&lock); err != nil {
		lock = err.Error()
	}
	rows, err := pool.Query(ctx, `SELECT format('%s (%s): seen %s ago, granted %s', ticket, owner, clock_timestamp() - seen_at, granted)
		FROM pglock.waiters WHERE key = $1 ORDER BY ticket`, key)
	var waiters []string
	if err == nil {
		waiters, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		waiters = append(waiters, err.Error())
	}
	return fmt.Sprintf("the lock: %s; its fair queue: %s", lock, strings.Join(waiters, "; "))
}

// openAll opens every connection the pool may have, so that no call of the crowd waits
// for a new one (which takes a second on a loaded machine): as an application's pool
// in its steady state.
func openAll(ctx context.Context, tb testing.TB, pool *pgxpool.Pool) {
	tb.Helper()
	conns := make([]*pgxpool.Conn, pool.Config().MaxConns)
	var g sync.WaitGroup
	for i := range conns {
		g.Go(func() {
			c, err := pool.Acquire(ctx)
			assert.NoError(tb, err)
			conns[i] = c
		})
	}
	g.Wait()
	for _, c := range conns {
		if c != nil {
			c.Release()
		}
	}
}

// waitOnce has c wait once for a key held by another client, so that c's listener is up
// (as a client's that has waited before): it returns when the listener listens and the
// renewals' own connections are open.
func waitOnce(ctx context.Context, tb testing.TB, c *Client, key string) {
	tb.Helper()
	_, _, err := c.store.Acquire(ctx, key, "someone else", time.Minute)
	require.NoError(tb, err)
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, err := c.Acquire(wctx, key)
		assert.ErrorIs(tb, err, context.Canceled)
	}()
	require.Eventually(tb, c.listener.listening, 10*time.Second, time.Millisecond, "the listener of a waiting client is up")
	stop()
	<-done
	// And its renewals' own connections, which a client opens soon after it first
	// holds a lock (renewals.warmSoon): up in a client that has run a while.
	c.renewals.Warm()
	if c.renewals.Active() {
		require.Eventually(tb, func() bool { return c.renewals.Own().Stat().IdleConns() == store.RenewalConns }, 10*time.Second,
			time.Millisecond, "the renewals' own connections are up")
	}
}

// TestCrowdNeverLetsTwoInAndNeverLosesAWakeUp: 20 waiters over 5 clients whose clock is
// stopped, so that none of them ever polls: every acquisition after the first comes
// from a release's wake-up, through the one waiter per client that a release wakes and
// the next one woken when a waiter leaves. A lost wake-up would park every waiter for
// good and the ctx would end. Never two inside at once.
func TestCrowdNeverLetsTwoInAndNeverLosesAWakeUp(t *testing.T) {
	t.Parallel()
	pool := fenceTestDB(t)
	cfg := pool.Config()
	cfg.MaxConns = 24
	big, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	defer big.Close()
	for _, cr := range []crowd{
		{clients: 1, waitersEach: 8},
		{clients: 5, waitersEach: 4},
	} {
		t.Run(fmt.Sprintf("%dx%d", cr.clients, cr.waitersEach), func(t *testing.T) {
			cr.hold = time.Millisecond
			cr.clock = stoppedClock{time.Now()}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			n := 10 * cr.clients * cr.waitersEach
			res := cr.run(ctx, t, big, "crowd/"+t.Name(), n)
			require.Equal(t, n, res.acquisitions)
			// About one attempt per client with waiters and handover, whatever the
			// waiters: the head of each client's queue tries, the others wait their turn,
			// and a losing attempt marks the key itself.
			assert.LessOrEqual(t, res.attemptsPerAcquisition(), 1.5*float64(cr.clients)+0.5,
				"attempts per acquisition with %d clients", cr.clients)
			t.Logf("%d acquisitions, %.1f attempts each, handover p50 %v p99 %v",
				res.acquisitions, res.attemptsPerAcquisition(),
				percentile(res.handovers, 0.5).Round(10*time.Microsecond), percentile(res.handovers, 0.99).Round(10*time.Microsecond))
		})
	}
}

// TestCrowdStartNeverLeavesAFreeKeyIdle: 100 waiters over 20 clients call Acquire at the
// same moment, once each, and hold the key 1 ms. Their clock is stopped, so that no
// waiter ever polls on it: the key goes on only because a release woke a waiter, the
// waiter before in a client's queue passed the turn on, or a waiter that nothing can
// wake yet tried on its own.
//
// cold: the clients' listeners start with the crowd and cannot connect during it (their
// link is a black hole), as a listener that starts with a crowd on a loaded machine may
// take a second or more: no release wakes anyone, and a free key must not wait for the
// listeners (before, every waiter parked until its listener was up, here for good).
// warm: each client has waited once before, its listener is up; one attempt per client
// starts the crowd (before, all 100 waiters tried at once, then marked the key, and the
// first holder's release queued behind those 200 calls).
//
// cold/fair: the same in the fair queue. The first of each client's waiters polls while
// the listener starts, on the real clock, and the head of the queue is always among
// them; a waiter that becomes its client's first is woken to poll (the others, silent
// on the stopped clock, are skipped as dead once Q passes, then polled again as firsts).
// Before, only the waiter a poll had called the head polled: the next head never learnt
// it was, and the crowd hung. warm/fair: on the real clock (see there).
//
// Every waiter gets the key, never two at once, with at most one attempt per client and
// acquisition (cold: per client and poll), and no handover near the second that a
// waiter's backoff reaches.
func TestCrowdStartNeverLeavesAFreeKeyIdle(t *testing.T) {
	t.Parallel()
	pool := fenceTestDB(t)
	needConnections(t, pool, 110) // the pool's 40, and each client's listener and 2 renewal connections
	cfg := pool.Config()
	cfg.MaxConns = 40
	big, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	defer big.Close()
	for _, v := range []struct{ warm, fair bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		warm := v.warm
		t.Run(map[bool]string{false: "cold", true: "warm"}[warm]+map[bool]string{true: "/fair"}[v.fair], func(t *testing.T) {
			cr := crowd{clients: 20, waitersEach: 5, hold: time.Millisecond, once: true, warm: warm, fair: v.fair, clock: stoppedClock{time.Now()}}
			if warm && v.fair {
				// A fair waiter that does not poll for Q (1 s) is skipped as dead, and on
				// a stopped clock only the fast polls of a starting listener come: with
				// the listeners up, a crowd longer than Q (a loaded machine's) would find
				// every waiter dead. The real clock: the waiters' heartbeats keep them.
				cr.clock = nil
			}
			if !warm {
				cr.listen = blackholed(t, cfg.ConnConfig)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			res := cr.run(ctx, t, big, "crowd/"+t.Name(), 0)
			t.Logf("%d acquisitions in %v (the clients waited %v in all), %d attempts before the first, %.1f attempts and %.1f marks each, handover p50 %v p99 %v, longest %v",
				res.acquisitions, res.elapsed.Round(time.Millisecond), res.waiting.Round(time.Millisecond), res.firstAttempts, res.attemptsPerAcquisition(), float64(res.marks)/float64(res.acquisitions),
				percentile(res.handovers, 0.5).Round(10*time.Microsecond), percentile(res.handovers, 0.99).Round(10*time.Microsecond),
				res.longest().Round(10*time.Microsecond))
			require.Equal(t, cr.clients*cr.waitersEach, res.acquisitions)
			if warm && !v.fair { // a fair waiter queues at once: 100 queue_acquire calls
				assert.LessOrEqual(t, res.firstAttempts, int64(cr.clients), "attempts sent before the first acquisition")
			}
			if !warm && !v.fair {
				// With no listener, a client's first waiter tries every startingPoll (20 to
				// 40 ms) while the client has waiters, and a waiter becoming its client's
				// first tries once: the attempts follow how long the clients wait, which a
				// loaded machine stretches, not the acquisitions. At most one poll per
				// 20 ms and client; two pollers per client, or polls twice as often, would
				// go over.
				polls := float64(res.waiting) / float64(startingPollEvery/2)
				assert.LessOrEqual(t, float64(res.attempts), polls+float64(cr.clients*(cr.waitersEach+1)),
					"attempts: one poller per client, never more often than startingPoll, while the clients waited %v in all", res.waiting)
			} else {
				assert.LessOrEqual(t, res.attemptsPerAcquisition(), float64(cr.clients), "attempts per acquisition")
			}
			assert.Less(t, res.longest(), crowdStartLongestHandover, "the longest handover")
		})
	}
}

// crowdStartLongestHandover bounds the longest handover of
// TestCrowdStartNeverLeavesAFreeKeyIdle: generous for a loaded 2-core machine under
// -race (100 goroutines, 20 listeners and PostgreSQL on it), and no more than the
// backoff a waiter's polls reach, which the
// stopped clock never lets it make: a handover that long was not a wake-up's.
const crowdStartLongestHandover = time.Second

// connsPerTest is the share of the server's max_connections each test running at once
// may take, and connsBeside what the tests of other packages take beside them (go test
// ./...: the torture workers, the console's browser tests). Most tests take a few, the
// contract suites up to 70, a crowd 100 (needConnections). At 100, PostgreSQL's default,
// 2 tests run at once (4 ran out of connections beside the other packages); at 200, as
// .ci/run sets, 6 (a whole go test ./... peaked at 157 there).
const connsPerTest, connsBeside = 25, 50

// needConnections skips t, or fails it when CI is set, when the max_connections of
// pool's server leaves no room for n connections of t's own beside other tests'
// (connsBeside): at PostgreSQL's default of 100, a crowd of 20 clients would take the
// connections of the tests running beside it, and its own.
func needConnections(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	var max int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT current_setting('max_connections')::int").Scan(&max))
	if max >= n+connsBeside {
		return
	}
	msg := fmt.Sprintf("this test needs max_connections of at least %d; the server has %d (.ci/run sets 200)", n+connsBeside, max)
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// blackholed returns cfg leading to a TCP proxy that passes nothing on: a connection
// made with it never gets an answer. The proxy is closed when the test ends.
func blackholed(t *testing.T, cfg *pgx.ConnConfig) *pgx.ConnConfig {
	t.Helper()
	p, err := tcpproxy.New(tcpproxy.To(cfg.Host, cfg.Port))
	require.NoError(t, err)
	t.Cleanup(p.Close)
	p.Blackhole()
	host, port, err := net.SplitHostPort(p.Addr())
	require.NoError(t, err)
	n, err := strconv.Atoi(port)
	require.NoError(t, err)
	cfg = cfg.Copy()
	cfg.Host, cfg.Port, cfg.Fallbacks = host, uint16(n), nil
	return cfg
}

// BenchmarkCrowd: N waiters over M clients on one pool take one key in turn, holding it
// 2 ms, with a release waking one waiter per client (one), or waiting in the fair queue
// (fair: a release hands the key to the waiter that came first); one op is one
// handover. Then the start of a crowd: 100 waiters over 20 clients call Acquire at the
// same moment, once each, holding the key 2 ms, with listeners that start with the
// crowd (start-cold) or are up already (start-warm), without and with Fair; one op is
// one such crowd of 100 acquisitions (run it with -benchtime=3x: the steady crowds make
// 300 handovers at least). Reported: handover p50, p99 and longest,
// acquisition statements per acquisition (lock_acquire, lock_acquire_or_want,
// queue_acquire), the fair queue's polls and claims per acquisition, and the longest
// wait over the mean wait.
func BenchmarkCrowd(b *testing.B) {
	pool := fenceTestDB(b)
	cfg := pool.Config()
	cfg.MaxConns = 40
	big, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(b, err)
	defer big.Close()
	report := func(b *testing.B, res crowdResult) {
		b.ReportMetric(float64(percentile(res.handovers, 0.5).Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(percentile(res.handovers, 0.99).Microseconds())/1000, "p99-ms")
		b.ReportMetric(float64(res.longest().Microseconds())/1000, "max-ms")
		b.ReportMetric(res.attemptsPerAcquisition(), "attempts/acq")
		b.ReportMetric(float64(res.polls)/float64(res.acquisitions), "polls/acq")
		b.ReportMetric(float64(res.claims)/float64(res.acquisitions), "claims/acq")
		b.ReportMetric(res.fairness(), "maxwait/mean")
		if len(res.claimCalls) > 0 {
			b.ReportMetric(float64(percentile(res.claimCalls, 0.5).Microseconds())/1000, "claim-p50-ms")
			b.ReportMetric(float64(percentile(res.claimCalls, 0.99).Microseconds())/1000, "claim-p99-ms")
		}
	}
	variants := map[bool]string{false: "one", true: "fair"}
	for _, size := range [][2]int{{1, 2}, {1, 20}, {5, 4}, {20, 5}} {
		for _, fair := range []bool{false, true} {
			b.Run(fmt.Sprintf("%dx%d/%s", size[0], size[1], variants[fair]), func(b *testing.B) {
				cr := crowd{clients: size[0], waitersEach: size[1], hold: 2 * time.Millisecond, fair: fair}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				defer cancel()
				n := max(b.N, 300) // a crowd's worth, whatever -benchtime: it is run with 3x for the starts
				b.ResetTimer()
				res := cr.run(ctx, b, big, fmt.Sprintf("crowd/bench/%s/%d", b.Name(), b.N), n)
				b.StopTimer()
				report(b, res)
			})
		}
	}
	for _, warm := range []bool{false, true} {
		for _, fair := range []bool{false, true} {
			b.Run(fmt.Sprintf("20x5/start-%s/%s", map[bool]string{false: "cold", true: "warm"}[warm], variants[fair]), func(b *testing.B) {
				var all crowdResult
				for i := range b.N {
					cr := crowd{clients: 20, waitersEach: 5, hold: 2 * time.Millisecond, once: true, warm: warm, fair: fair}
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
					res := cr.run(ctx, b, big, fmt.Sprintf("crowd/bench/%s/%d/%d", b.Name(), b.N, i), 0)
					cancel()
					all.acquisitions += res.acquisitions
					all.attempts += res.attempts
					all.polls += res.polls
					all.claims += res.claims
					all.handovers = append(all.handovers, res.handovers...)
					all.claimCalls = append(all.claimCalls, res.claimCalls...)
					all.waits = append(all.waits, res.waits...)
				}
				report(b, all)
			})
		}
	}
}

// TestWaitZeroTriesBehindAQueue: Wait(0) is one attempt, even when the client already
// has a waiter parked on the key (which the next release, not a poll, would wake). Here
// the key's holder dies (its lock expires on the database, no release, no wake-up) while
// a waiter of the same client is parked on a stopped clock: Acquire with Wait(0) must try
// and take the now free key, not queue behind the parked waiter and give up untried.
func TestWaitZeroTriesBehindAQueue(t *testing.T) {
	t.Parallel()
	pool := fenceTestDB(t)
	ctx := t.Context()
	clock := stoppedClock{time.Now()}
	s := NewPostgresStore(pool)
	holder, err := newClient(s, "New", []ClientOption{WithClock(clock), WithoutListener()})
	require.NoError(t, err)
	defer func() { require.NoError(t, holder.Close(context.Background())) }()
	key := "wait-zero/" + t.Name()
	c, err := newClient(s, "New", []ClientOption{listenOn(pool.Config().ConnConfig), WithClock(clock)})
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close(context.Background())) }()
	// Its listener up first: one still connecting would have the waiter poll, and take
	// the key itself once it expired.
	waitOnce(ctx, t, c, key+"/warm")

	// The first waiter must park before the holder's lease ends, however slow the
	// machine: a ttl of a minute, the lease ended by the test.
	_, err = holder.TryAcquire(ctx, key, TTL(time.Minute)) // never renewed: its clock is stopped
	require.NoError(t, err)
	parkedCtx, stopParked := context.WithCancel(ctx)
	parked := make(chan error, 1)
	go func() {
		_, err := c.Acquire(parkedCtx, key)
		parked <- err
	}()
	// Parked: behind a listening connection, its attempt over (it marked the key), so
	// that it makes none once the key is free.
	require.Eventually(t, func() bool {
		c.listener.mu.Lock()
		listening := c.listener.up && len(c.listener.waiters[key]) == 1
		c.listener.mu.Unlock()
		var marked bool
		err := pool.QueryRow(ctx, "SELECT wanted_at IS NOT NULL FROM pglock.locks WHERE key = $1", key).Scan(&marked)
		return listening && err == nil && marked
	}, 10*time.Second, time.Millisecond, "the first waiter parks behind a listening connection")

	EndLease(t, pool, key) // the holder dies: no release, no wake-up
	l, err := c.Acquire(ctx, key, Wait(0))
	require.NoError(t, err, "Wait(0) makes its one attempt, queue or not")
	// The parked waiter stopped while the key is held: released first, the key could
	// go to it before its ctx ends.
	stopParked()
	require.ErrorIs(t, <-parked, context.Canceled)
	require.NoError(t, l.Release(ctx))
}

// TestCrowdClientsRenewAndReleaseAsNewsDo: a client on the crowd's counting store (a
// PostgreSQL store underneath) has the renewals' own connections, as a client of New:
// without them the crowd measured releases through the application's pool, a path no
// client of New takes (BENCHMARKS.md, session 12). Its lock is released through them.
func TestCrowdClientsRenewAndReleaseAsNewsDo(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := fenceTestDB(t)
	var attempts, marks, polls, claims atomic.Int64
	counting := &Store{newCountingStore(pool, &attempts, &marks, &polls, &claims, &durations{})}
	c, err := newClient(counting, "New", []ClientOption{WithoutListener(), TTL(6 * time.Second)})
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close(context.Background())) }()
	require.True(t, c.renewals.Active(), "the counting store's client has no renewals' connections of its own")
	own := c.renewals.Own
	l, err := c.TryAcquire(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, int64(1), attempts.Load(), "the acquisition went through the counting store")
	// Not with the first lock, which may come in a burst of new clients, but half-way to
	// its first renewal (1 s of its 2 s here).
	require.True(t, own() == nil, "own connections made with the first lock")
	require.Eventually(t, func() bool { return own() != nil }, 10*time.Second, 5*time.Millisecond,
		"no own connections made before the first renewal")
	require.NoError(t, l.Release(ctx))

	// A later lock of a shorter ttl brings the own pool forward: its first renewal comes
	// before the first lock's would.
	c2, err := newClient(counting, "New", []ClientOption{WithoutListener()})
	require.NoError(t, err)
	defer func() { require.NoError(t, c2.Close(context.Background())) }()
	_, err = c2.TryAcquire(ctx, "long", TTL(time.Hour)) // its own pool 10 minutes later
	require.NoError(t, err)
	_, err = c2.TryAcquire(ctx, "short", TTL(600*time.Millisecond))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return c2.renewals.Own() != nil }, 5*time.Second, 5*time.Millisecond, "a shorter ttl's lock did not bring the own pool forward")
}
