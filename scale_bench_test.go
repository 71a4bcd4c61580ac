package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/pglocktest"
)

// The scale benchmarks: many instances holding many locks on one PostgreSQL
// (BenchmarkManyInstances), the held locks at which renewals stop keeping up or
// acquisitions slow down (BenchmarkRenewalLimit), and the acquisitions per second one
// server gives (BenchmarkAcquireScale). BENCHMARKS.md, "Capacity", has the results
// and the model built on them.
//
// Each is one scenario, run once whatever b.N (run them with -benchtime 1x). By default
// they run at small sizes, so that a plain `go test -bench .` stays short; with
// PGLOCK_SCALE=full they run at the issue's: 50 clients and 100,000 locks, held locks
// up to 400,000, up to 64 goroutines; about three minutes in all on 2 cores. They need
// the server's processes on this machine for their CPU figures (/proc/<pid>/stat of
// the backends); elsewhere those read zero.

// scaleFull reports whether PGLOCK_SCALE=full asks for the full sizes.
func scaleFull() bool { return os.Getenv("PGLOCK_SCALE") == "full" }

// pick returns full at PGLOCK_SCALE=full, else small.
func pick[T any](small, full T) T {
	if scaleFull() {
		return full
	}
	return small
}

func skipScaleIfShort(b *testing.B) {
	if testing.Short() {
		b.Skip("scale benchmark: skipped with -short")
	}
}

// scaleClockTick is the unit of utime and stime in /proc/<pid>/stat: USER_HZ, 100 on
// Linux (getconf CLK_TCK).
const scaleClockTick = 10 * time.Millisecond

// scaleCPU is the CPU time (user + system) each backend of a database had used, by pid.
type scaleCPU map[int]time.Duration

// backendCPU reads the CPU time of every backend connected to pool's database, from
// /proc/<pid>/stat: the server must run on this machine (a pid it cannot read counts
// nothing). Background processes (WAL writer, checkpointer) serve every database and
// are left out; a commit's WAL flush is done by the committing backend and is in.
func backendCPU(tb testing.TB, pool *pgxpool.Pool) scaleCPU {
	tb.Helper()
	rows, _ := pool.Query(context.WithoutCancel(tb.Context()),
		"SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(tb, err)
	cpu := make(scaleCPU, len(pids))
	for _, pid := range pids {
		if t, ok := procCPU(int(pid)); ok {
			cpu[int(pid)] = t
		}
	}
	return cpu
}

func procCPU(pid int) (time.Duration, bool) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:]) // the command may hold spaces
	if len(f) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64) // field 14
	stime, err2 := strconv.ParseInt(f[12], 10, 64) // field 15
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(utime+stime) * scaleClockTick, true
}

// until returns the CPU the backends used from c to later: a backend that started in
// between counts all its time, one that ended counts nothing.
func (c scaleCPU) until(later scaleCPU) time.Duration {
	var d time.Duration
	for pid, t := range later {
		d += t - c[pid]
	}
	return d
}

// scaleLatencies are the latencies of operations.
type scaleLatencies []time.Duration

// q returns the q-quantile (nearest rank).
func (l scaleLatencies) q(q float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	s := slices.Clone(l)
	slices.Sort(s)
	return s[max(int(math.Ceil(q*float64(len(s))))-1, 0)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// scaleProbe takes a fresh key and releases it, one cycle after another, on its own
// client: the acquisition latency an application sees.
type scaleProbe struct {
	c *pglock.Client
	n int
}

// run cycles for d and returns each cycle's latency (TryAcquire + Release).
func (p *scaleProbe) run(ctx context.Context, d time.Duration) (scaleLatencies, error) {
	var lat scaleLatencies
	for end := time.Now().Add(d); time.Now().Before(end); {
		key := "probe:" + strconv.Itoa(p.n)
		p.n++
		start := time.Now()
		l, err := p.c.TryAcquire(ctx, key)
		if err != nil {
			return lat, err
		}
		if err := l.Release(ctx); err != nil {
			return lat, err
		}
		lat = append(lat, time.Since(start))
	}
	return lat, nil
}

// renewTracer counts the lock_renew_many statements a pool runs and the locks they
// renewed (the rows they returned): what the Clients' renewers did, exactly.
type renewTracer struct{ calls, rows atomic.Int64 }

type renewTraceKey struct{}

func (t *renewTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "lock_renew_many") {
		return context.WithValue(ctx, renewTraceKey{}, true)
	}
	return ctx
}

func (t *renewTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	if ctx.Value(renewTraceKey{}) != nil && d.Err == nil {
		t.calls.Add(1)
		t.rows.Add(d.CommandTag.RowsAffected())
	}
}

// scalePool returns a pool of maxConns connections on url, traced by tracer when not
// nil, closed when the benchmark ends.
func scalePool(tb testing.TB, url string, maxConns int32, tracer pgx.QueryTracer) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(tb, err)
	cfg.MaxConns = maxConns
	if tracer != nil {
		cfg.ConnConfig.Tracer = tracer
	}
	pool, err := pgxpool.NewWithConfig(tb.Context(), cfg)
	require.NoError(tb, err)
	tb.Cleanup(pool.Close)
	return pool
}

// freeConnections is how many more connections the server accepts from an ordinary
// role: the server is shared, so the benchmarks size what they open by it.
func freeConnections(tb testing.TB, pool *pgxpool.Pool) int {
	tb.Helper()
	var free int
	require.NoError(tb, pool.QueryRow(tb.Context(), `SELECT current_setting('max_connections')::int
		- current_setting('superuser_reserved_connections')::int - count(*) FROM pg_stat_activity
		WHERE backend_type = 'client backend'`).Scan(&free))
	return free
}

// flushTableStats has the pool's idle backends publish their pending table statistics
// (PostgreSQL 15 holds them up to 10 s after a busy second), so that
// pg_stat_user_tables counts what they did.
func flushTableStats(tb testing.TB, pool *pgxpool.Pool) {
	tb.Helper()
	ctx := tb.Context()
	for _, conn := range pool.AcquireAllIdle(ctx) {
		_, err := conn.Exec(ctx, "SELECT pg_stat_force_next_flush()")
		conn.Release()
		require.NoError(tb, err)
	}
}

// scaleTable is what pg_stat_user_tables and the catalog say of pglock.locks.
type scaleTable struct {
	bytes, rows, updated, hot int64
}

func readScaleTable(tb testing.TB, pool *pgxpool.Pool) scaleTable {
	tb.Helper()
	var t scaleTable
	require.NoError(tb, pool.QueryRow(tb.Context(), `SELECT pg_total_relation_size('pglock.locks'),
		(SELECT count(*) FROM pglock.locks), n_tup_upd, n_tup_hot_upd
		FROM pg_stat_user_tables WHERE relid = 'pglock.locks'::regclass`).Scan(&t.bytes, &t.rows, &t.updated, &t.hot))
	return t
}

// oldestXactWithXid is how long the oldest transaction holding a transaction id has
// been open anywhere on the server, other than this statement's: while one is, no
// dead row version newer than it can be pruned, in any database.
func oldestXactWithXid(tb testing.TB, pool *pgxpool.Pool) time.Duration {
	tb.Helper()
	var s float64
	require.NoError(tb, pool.QueryRow(tb.Context(), `SELECT coalesce(max(extract(epoch FROM clock_timestamp() - xact_start)), 0)
		FROM pg_stat_activity WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()`).Scan(&s))
	return time.Duration(s * float64(time.Second))
}

// BenchmarkManyInstances has 50 Clients (pglock.New, one pool of 16 connections, each
// client with its own listener connection) hold 100,000 locks between them, with ttl
// 9 s: each lock is renewed every 3 s, in one lock_renew_many call per client and ttl
// group. It reports, over a window of one ttl with nothing else running:
//
//   - renew-stmts/s, renewed-locks/s: the renewal statements and the locks they renewed
//     per second (counted by a pgx tracer on the pool), and target-locks/s, locks ÷
//     (ttl/3), what keeping up takes; renewal-calls/s, the EventRenewal events;
//   - db-cpu-us/lock, db-cpu-us/stmt: the CPU time (user + system, /proc) of the
//     database's backends per renewed lock and per renewal statement;
//   - client-B/lock: the heap all the clients kept per held lock (after GC);
//   - table-B/row: pg_total_relation_size('pglock.locks') ÷ its rows;
//   - acq-p50-vs-idle, acq-p99-vs-idle: the latency of TryAcquire + Release of a fresh
//     key on a separate client (its own pool) while the 50 clients renew, ÷ the same
//     with nothing held or renewed (before the locks were taken and after the clients
//     closed; both in this run);
//
// and then an hour of renewals compressed (once the clients are closed, their locks
// left live: every lock renewed by the store's RenewMany, a call per client's share,
// round after round back to back for a fixed time): hour-size-ratio, the
// table's size after the rounds ÷ before, hour-fraction, how much of an hour's 1,200
// rounds at ttl 9 s it did, hour-rounds-grew, the share of rounds after which the
// table was larger, and hot-fraction, n_tup_hot_upd ÷ n_tup_upd over the rounds (the
// log says whether a transaction holding an xid elsewhere on the server kept a round
// from pruning). Small sizes unless PGLOCK_SCALE=full.
func BenchmarkManyInstances(b *testing.B) {
	skipScaleIfShort(b)
	var (
		nClients = pick(5, 50)
		nLocks   = pick(5_000, 100_000)
		ttl      = pick(3*time.Second, 9*time.Second)
		idle     = pick(2*time.Second, 4500*time.Millisecond) // each of the two idle probes
		hourTime = pick(5*time.Second, 40*time.Second)
	)
	const poolSize = 16
	ctx := b.Context()
	url := pglocktest.PostgresURL(b)
	tracer := &renewTracer{}
	pool := scalePool(b, url, poolSize, tracer)
	// Every client has a listener unless the shared server has too few connections left.
	listeners := min(nClients, freeConnections(b, pool)-poolSize-2-10)
	require.Positive(b, listeners, "connections free on the server")

	var (
		renewCalls, renewErrs, lost atomic.Int64
		renewMax                    atomic.Int64 // ns
	)
	onEvent := func(ev pglock.Event) {
		switch ev.Type {
		case pglock.EventRenewal:
			renewCalls.Add(1)
			if ev.Err != nil {
				renewErrs.Add(1)
			}
			for d := int64(ev.Duration); ; {
				m := renewMax.Load()
				if d <= m || renewMax.CompareAndSwap(m, d) {
					break
				}
			}
		case pglock.EventLost:
			lost.Add(1)
		}
	}
	clients := make([]*pglock.Client, nClients)
	for i := range clients {
		opts := []pglock.ClientOption{quiet, pglock.TTL(ttl), pglock.WithEventHandler(onEvent),
			pglock.WithInstanceName(fmt.Sprintf("instance-%02d/%d", i, 1000+i))}
		if i >= listeners {
			opts = append(opts, pglock.WithoutListener())
		}
		c, err := pglock.New(pool, opts...)
		require.NoError(b, err)
		clients[i] = c
	}
	closed := false
	closeClients := func() {
		if !closed {
			closed = true
			for _, c := range clients {
				abandon(b, c) // 100,000 releases would take minutes: the database is dropped
			}
		}
	}
	b.Cleanup(closeClients)
	probe := &scaleProbe{c: newClient(b, pglock.NewPostgresStore(scalePool(b, url, 2, nil)), quiet, pglock.TTL(ttl))}

	// Each client waits once for a held key, which opens its listener connection.
	held, err := probe.c.TryAcquire(ctx, "scale:listen")
	require.NoError(b, err)
	require.NoError(b, spread(listeners, listeners, func(_, i int) error {
		// Long enough for the first attempt, queued behind the other clients' on the
		// pool, to fail and the wait (which opens the listener) to begin.
		_, err := clients[i].Acquire(ctx, held.Key(), pglock.Wait(2*time.Second))
		if errors.Is(err, pglock.ErrNotAcquired) {
			err = nil
		}
		return err
	}))
	require.Eventually(b, func() bool {
		var n int
		require.NoError(b, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND query LIKE 'LISTEN pglock_released%'`).Scan(&n))
		return n == listeners
	}, 30*time.Second, 50*time.Millisecond, "listener connections")
	require.NoError(b, held.Release(ctx))
	// Open the pool's connections and prepare the statements on them.
	require.NoError(b, spread(poolSize, 4*poolSize, func(g, _ int) error {
		l, err := clients[g%nClients].TryAcquire(ctx, "scale:warm:"+strconv.Itoa(g))
		if err != nil {
			return err
		}
		return l.Release(ctx)
	}))
	_, err = probe.run(ctx, 200*time.Millisecond)
	require.NoError(b, err)
	b.ResetTimer()

	idleBefore, err := probe.run(ctx, idle)
	require.NoError(b, err)

	// Take the locks, 32 at a time, each client its share.
	keys := make([]string, nLocks)
	for i := range keys {
		keys[i] = fmt.Sprintf("tenant:%06d:sync", i)
	}
	locks := make([]*pglock.Lock, nLocks)
	var memBefore, memAfter runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&memBefore)
	seedStart := time.Now()
	require.NoError(b, spread(32, nLocks, func(_, i int) (err error) {
		locks[i], err = clients[i%nClients].TryAcquire(ctx, keys[i])
		return err
	}))
	seedTime := time.Since(seedStart)
	runtime.GC()
	runtime.ReadMemStats(&memAfter)
	clientPerLock := (float64(memAfter.HeapAlloc) - float64(memBefore.HeapAlloc)) / float64(nLocks)
	flushTableStats(b, pool)
	table := readScaleTable(b, pool)

	// A ttl of renewals, nothing else.
	cpu0, calls0, rows0, events0 := backendCPU(b, pool), tracer.calls.Load(), tracer.rows.Load(), renewCalls.Load()
	start := time.Now()
	time.Sleep(ttl)
	window := time.Since(start)
	cpu1, calls1, rows1, events1 := backendCPU(b, pool), tracer.calls.Load(), tracer.rows.Load(), renewCalls.Load()
	renewCPU := cpu0.until(cpu1)
	stmts, rows := calls1-calls0, rows1-rows0

	// As long again, with the probe.
	loaded, err := probe.run(ctx, ttl)
	require.NoError(b, err)

	require.Zero(b, lost.Load(), "locks lost")
	for i, c := range clients {
		h := c.Health()
		require.True(b, h.Ready, "client %d: %v", i, h.Err)
		require.Equal(b, nLocks/nClients+boolInt(i < nLocks%nClients), h.LocksHeld)
	}
	maxRenewal := time.Duration(renewMax.Load())
	// The clients stop renewing (and the locks stay, live for a ttl).
	closeClients()

	// An hour of rounds, compressed: every lock renewed, a call per client's share, back
	// to back, the clients' renewers stopped: two lock_renew_many calls over the same rows
	// in different orders can deadlock (each locks its rows in its array's order), which
	// pglock never does, each key being renewed by one client, one call at a time.
	batch := pglock.InternalStore(pglock.NewPostgresStore(pool))
	shareKeys, shareOwners := make([][]string, nClients), make([][]string, nClients)
	for i, l := range locks {
		shareKeys[i%nClients] = append(shareKeys[i%nClients], l.Key())
		shareOwners[i%nClients] = append(shareOwners[i%nClients], l.Owner())
	}
	flushTableStats(b, pool)
	hourBefore := readScaleTable(b, pool)
	oldest := oldestXactWithXid(b, pool)
	var sizes []int64
	// A round grows the table when it cannot prune the row versions the round before it
	// left: when a transaction holding an xid, anywhere on the server, began before that
	// round ended. blocked counts the rounds after which one was seen running.
	hourRounds, grew, blocked, blockedGrew := 0, 0, 0, 0
	wasBlocked := false
	for end := time.Now().Add(hourTime); time.Now().Before(end) && hourRounds < 1200; hourRounds++ {
		roundStart := time.Now()
		require.NoError(b, spread(4, nClients, func(_, i int) error {
			renewed, err := batch.RenewMany(ctx, shareKeys[i], shareOwners[i], ttl)
			if err == nil && len(renewed) != len(shareKeys[i]) {
				err = fmt.Errorf("renewed %d of %d", len(renewed), len(shareKeys[i]))
			}
			return err
		}))
		var size int64
		require.NoError(b, pool.QueryRow(ctx, "SELECT pg_total_relation_size('pglock.locks')").Scan(&size))
		if len(sizes) > 0 && size > sizes[len(sizes)-1] {
			grew++
			if wasBlocked {
				blockedGrew++
			}
		}
		sizes = append(sizes, size)
		o := oldestXactWithXid(b, pool)
		oldest = max(oldest, o)
		wasBlocked = o > time.Since(roundStart)/4 // it began before the round's last quarter
		if wasBlocked {
			blocked++
		}
	}
	time.Sleep(1100 * time.Millisecond) // a backend publishes its statistics at most once a second
	flushTableStats(b, pool)
	hourAfter := readScaleTable(b, pool)
	idleAfter, err := probe.run(ctx, idle)
	require.NoError(b, err)
	b.StopTimer()

	idleAll := append(slices.Clone(idleBefore), idleAfter...)
	perSecond := func(n int64) float64 { return float64(n) / window.Seconds() }
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(listeners), "listeners")
	b.ReportMetric(float64(nLocks)/seedTime.Seconds(), "seed-acq/s")
	b.ReportMetric(perSecond(stmts), "renew-stmts/s")
	b.ReportMetric(perSecond(events1-events0), "renewal-calls/s")
	b.ReportMetric(perSecond(rows), "renewed-locks/s")
	b.ReportMetric(float64(nLocks)/(ttl/3).Seconds(), "target-locks/s")
	b.ReportMetric(ms(maxRenewal), "renew-max-ms")
	b.ReportMetric(float64(renewCPU.Microseconds())/float64(max(rows, 1)), "db-cpu-us/lock")
	b.ReportMetric(float64(renewCPU.Microseconds())/float64(max(stmts, 1)), "db-cpu-us/stmt")
	b.ReportMetric(renewCPU.Seconds()/window.Seconds(), "db-cores")
	b.ReportMetric(clientPerLock, "client-B/lock")
	b.ReportMetric(float64(table.bytes)/float64(table.rows), "table-B/row")
	b.ReportMetric(ms(loaded.q(0.5))/ms(idleAll.q(0.5)), "acq-p50-vs-idle")
	b.ReportMetric(ms(loaded.q(0.99))/ms(idleAll.q(0.99)), "acq-p99-vs-idle")
	b.ReportMetric(ms(loaded.q(0.5)), "acq-p50-ms")
	b.ReportMetric(ms(idleAll.q(0.5)), "idle-p50-ms")
	b.ReportMetric(float64(hourAfter.bytes)/float64(hourBefore.bytes), "hour-size-ratio")
	b.ReportMetric(float64(hourRounds)/1200, "hour-fraction")
	b.ReportMetric(float64(grew)/float64(max(hourRounds-1, 1)), "hour-rounds-grew")
	b.ReportMetric(float64(hourAfter.hot-hourBefore.hot)/float64(max(hourAfter.updated-hourBefore.updated, 1)), "hot-fraction")
	b.Logf("%d clients (%d with a listener), %d locks, ttl %v; taken in %v (%.0f/s, 32 goroutines)",
		nClients, listeners, nLocks, ttl, seedTime.Round(time.Millisecond), float64(nLocks)/seedTime.Seconds())
	b.Logf("renewals over %v: %d statements (%d EventRenewal, %d failed, longest %v), %d locks; target %.0f locks/s; db cpu %v (%.2f cores)",
		window.Round(time.Millisecond), stmts, events1-events0, renewErrs.Load(), maxRenewal.Round(time.Millisecond), rows,
		float64(nLocks)/(ttl/3).Seconds(), renewCPU, renewCPU.Seconds()/window.Seconds())
	b.Logf("client heap %.0f B/lock; table %d B for %d rows (%.0f B/row)", clientPerLock, table.bytes, table.rows,
		float64(table.bytes)/float64(table.rows))
	b.Logf("acquire+release p50/p99: idle before %.2f/%.2f ms (%d), loaded %.2f/%.2f ms (%d), idle after %.2f/%.2f ms (%d)",
		ms(idleBefore.q(0.5)), ms(idleBefore.q(0.99)), len(idleBefore), ms(loaded.q(0.5)), ms(loaded.q(0.99)), len(loaded),
		ms(idleAfter.q(0.5)), ms(idleAfter.q(0.99)), len(idleAfter))
	b.Logf("hour compressed: %d rounds of %d locks in %v; size %d -> %d B (after round 1: %d); n_tup_upd +%d, n_tup_hot_upd +%d",
		hourRounds, nLocks, hourTime, hourBefore.bytes, hourAfter.bytes, sizes[0], hourAfter.updated-hourBefore.updated,
		hourAfter.hot-hourBefore.hot)
	b.Logf("hour compressed: %d rounds grew the table; after %d rounds a transaction holding an xid on the server had begun before the round's end (the next round grew the table %d times); the oldest seen: %v",
		grew, blocked, blockedGrew, oldest.Round(time.Millisecond))
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// BenchmarkRenewalLimit finds the held locks at which one PostgreSQL stops keeping up
// with their renewals at ttl 3 s (one call per instance every second), or at which an
// acquisition's latency doubles. Per size (sub-benchmark locks=N), N rows are inserted
// straight into pglock.locks (taking them through TryAcquire would take minutes), split
// between 50 instances, and each instance renews its share with the store's RenewMany
// on the renewer's schedule: a call every period, the next one a period after the
// previous was sent (at once when it took longer), the instances spread evenly over
// the period. (The rows' ttl is an hour, so that they outlive the quiet phases; the
// work of a renewal does not depend on it.) Phases with the renewals on and off take
// turns, a probe client cycling TryAcquire + Release of fresh keys through both:
//
//   - renewed-locks/s, vs-target: the locks renewed per second while on, and that ÷
//     N/period, what keeping up takes (below 1: falling behind);
//   - call-p99-ms, max-gap-vs-period: a renewal call's 99th percentile latency, and the
//     longest time between two calls of one instance ÷ the period (1.5 is where a
//     client's Health turns not ready, 2.7 where its locks are lost);
//   - acq-p50-vs-idle, acq-p99-vs-idle: the probe's latency while on ÷ while off;
//   - db-cpu-us/lock: the database backends' CPU while on less while off, per lock
//     renewed; db-cores: their CPU while on ÷ wall time.
func BenchmarkRenewalLimit(b *testing.B) {
	skipScaleIfShort(b)
	const (
		instances = 50
		period    = time.Second // ttl 3 s
	)
	phase := 2 * time.Second // two calls per instance
	pairs := pick(1, 3)
	for _, n := range pick([]int{2_000, 20_000}, []int{10_000, 50_000, 100_000, 200_000, 400_000}) {
		b.Run("locks="+strconv.Itoa(n), func(b *testing.B) {
			ctx := b.Context()
			url := pglocktest.PostgresURL(b)
			pool := scalePool(b, url, 16, nil)
			probe := &scaleProbe{c: newClient(b, pglock.NewPostgresStore(scalePool(b, url, 2, nil)), quiet, pglock.TTL(time.Minute))}
			_, err := pool.Exec(ctx, `INSERT INTO pglock.locks (key, owner, fencing_token, expires_at)
				SELECT 'tenant:' || lpad(g::text, 7, '0') || ':sync',
				       'instance-' || lpad((g % 50)::text, 2, '0') || '/4242/' || lpad(g::text, 13, '0'),
				       nextval('pglock.fencing_token_seq'), clock_timestamp() + interval '1 hour'
				FROM generate_series(0, $1::int - 1) g`, n)
			require.NoError(b, err)
			_, err = pool.Exec(ctx, "ANALYZE pglock.locks")
			require.NoError(b, err)
			keys, owners := make([][]string, instances), make([][]string, instances)
			for g := range n {
				i := g % instances
				keys[i] = append(keys[i], fmt.Sprintf("tenant:%07d:sync", g))
				owners[i] = append(owners[i], fmt.Sprintf("instance-%02d/4242/%013d", i, g))
			}
			batch := pglock.InternalStore(pglock.NewPostgresStore(pool))
			renew := func(i int) (int, error) {
				renewed, err := batch.RenewMany(ctx, keys[i], owners[i], time.Hour)
				if err == nil && len(renewed) != len(keys[i]) {
					err = fmt.Errorf("instance %d: renewed %d of %d", i, len(renewed), len(keys[i]))
				}
				return len(renewed), err
			}
			// One unmeasured round: the first visit of each page sets hint bits.
			require.NoError(b, spread(4, instances, func(_, i int) error { _, err := renew(i); return err }))
			_, err = probe.run(ctx, 200*time.Millisecond)
			require.NoError(b, err)
			b.ResetTimer()

			var (
				on, off             scaleLatencies
				calls               scaleLatencies
				onTime, offTime     time.Duration
				onCPU, offCPU       time.Duration
				renewedRows, maxGap atomic.Int64
				mu                  sync.Mutex
			)
			// renewing runs the instances on their schedule until stop, and waits for
			// their calls in flight.
			renewing := func(stop <-chan struct{}) (wait func() error) {
				start := time.Now()
				var wg sync.WaitGroup
				errs := make([]error, instances)
				for i := range instances {
					wg.Go(func() {
						next := start.Add(period * time.Duration(i) / instances)
						var last time.Time
						for {
							t := time.NewTimer(time.Until(next))
							select {
							case <-stop:
								t.Stop()
								return
							case <-t.C:
							}
							sent := time.Now()
							if !last.IsZero() {
								for gap := int64(sent.Sub(last)); ; {
									m := maxGap.Load()
									if gap <= m || maxGap.CompareAndSwap(m, gap) {
										break
									}
								}
							}
							last = sent
							k, err := renew(i)
							if err != nil {
								errs[i] = err
								return
							}
							d := time.Since(sent)
							renewedRows.Add(int64(k))
							mu.Lock()
							calls = append(calls, d)
							mu.Unlock()
							next = sent.Add(period)
						}
					})
				}
				return func() error {
					wg.Wait()
					return errors.Join(errs...)
				}
			}
			for p := range 2 * pairs {
				renewOn := p%4 == 0 || p%4 == 3 // on off, off on, on off, ...
				cpu0 := backendCPU(b, pool)
				start := time.Now()
				stop := make(chan struct{})
				var wait func() error
				if renewOn {
					wait = renewing(stop)
				}
				lat, err := probe.run(ctx, phase)
				require.NoError(b, err)
				close(stop)
				if wait != nil {
					require.NoError(b, wait())
				}
				d, cpu := time.Since(start), cpu0.until(backendCPU(b, pool))
				if renewOn {
					on, onTime, onCPU = append(on, lat...), onTime+d, onCPU+cpu
				} else {
					off, offTime, offCPU = append(off, lat...), offTime+d, offCPU+cpu
				}
			}
			b.StopTimer()

			rows := renewedRows.Load()
			rate := float64(rows) / onTime.Seconds()
			target := float64(n) / period.Seconds()
			renewCPU := onCPU.Seconds() - offCPU.Seconds()*onTime.Seconds()/offTime.Seconds()
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(rate, "renewed-locks/s")
			b.ReportMetric(rate/target, "vs-target")
			b.ReportMetric(ms(calls.q(0.99)), "call-p99-ms")
			b.ReportMetric(float64(maxGap.Load())/float64(period), "max-gap-vs-period")
			b.ReportMetric(ms(on.q(0.5))/ms(off.q(0.5)), "acq-p50-vs-idle")
			b.ReportMetric(ms(on.q(0.99))/ms(off.q(0.99)), "acq-p99-vs-idle")
			b.ReportMetric(renewCPU*1e6/float64(max(rows, 1)), "db-cpu-us/lock")
			b.ReportMetric(onCPU.Seconds()/onTime.Seconds(), "db-cores")
			b.Logf("%d locks, %d instances, period %v: renewed %.0f locks/s (target %.0f) in %d calls, call p50/p99 %.1f/%.1f ms, longest gap %v; "+
				"acquire+release p50/p99 on %.2f/%.2f ms (%d), off %.2f/%.2f ms (%d); db cpu on %.2f cores, off %.2f",
				n, instances, period, rate, target, len(calls), ms(calls.q(0.5)), ms(calls.q(0.99)), time.Duration(maxGap.Load()).Round(time.Millisecond),
				ms(on.q(0.5)), ms(on.q(0.99)), len(on), ms(off.q(0.5)), ms(off.q(0.99)), len(off),
				onCPU.Seconds()/onTime.Seconds(), offCPU.Seconds()/offTime.Seconds())
		})
	}
}

// BenchmarkAcquireScale reports the TryAcquire + Release cycles per second one
// PostgreSQL gives to 1, 2, 4, 8, 16 and 64 goroutines (each on its own key, reused, as jobs
// and elections reuse theirs; one pool of up to 64 connections), in turns of about
// half a second, the order rotating, and each level's latency: gN-cycles/s, gN-p50-ms,
// gN-p99-ms, and gN-p50-vs-g1, its median latency ÷ one goroutine's.
func BenchmarkAcquireScale(b *testing.B) {
	skipScaleIfShort(b)
	levels := []int{1, 2, 4, 8, 16, 64}
	turn := pick(200*time.Millisecond, 500*time.Millisecond)
	rounds := pick(2, 6)
	ctx := b.Context()
	url := pglocktest.PostgresURL(b)
	probe := scalePool(b, url, 1, nil)
	conns := int32(min(64, freeConnections(b, probe)-10))
	require.Positive(b, conns, "connections free on the server")
	pool := scalePool(b, url, conns, nil)
	c, err := pglock.New(pool, quiet, pglock.TTL(time.Minute), pglock.WithoutListener())
	require.NoError(b, err)
	b.Cleanup(func() { require.NoError(b, c.Close(context.Background())) })

	type level struct {
		lat     scaleLatencies
		cycles  int
		elapsed time.Duration
	}
	results := make([]level, len(levels))
	cycle := func(g, key int) (time.Duration, error) {
		start := time.Now()
		l, err := c.TryAcquire(ctx, "acq:"+strconv.Itoa(g)+":"+strconv.Itoa(key))
		if err != nil {
			return 0, err
		}
		return time.Since(start), l.Release(ctx)
	}
	runLevel := func(i int, d time.Duration) {
		g := levels[i]
		lats := make([]scaleLatencies, g)
		start := time.Now()
		end := start.Add(d)
		var wg sync.WaitGroup
		errs := make([]error, g)
		for k := range g {
			wg.Go(func() {
				for time.Now().Before(end) {
					lat, err := cycle(g, k)
					if err != nil {
						errs[k] = err
						return
					}
					lats[k] = append(lats[k], lat)
				}
			})
		}
		wg.Wait()
		require.NoError(b, errors.Join(errs...))
		r := &results[i]
		r.elapsed += time.Since(start)
		for _, l := range lats {
			r.lat = append(r.lat, l...)
			r.cycles += len(l)
		}
	}
	for i := range levels { // warm: connections and prepared statements
		runLevel(i, 50*time.Millisecond)
	}
	clear(results)
	b.ResetTimer()
	for r := range rounds {
		for j := range levels {
			runLevel((r+j)%len(levels), turn)
		}
	}
	b.StopTimer()
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(conns), "pool-conns")
	base := ms(results[0].lat.q(0.5))
	for i, g := range levels {
		r := results[i]
		name := "g" + strconv.Itoa(g)
		b.ReportMetric(float64(r.cycles)/r.elapsed.Seconds(), name+"-cycles/s")
		b.ReportMetric(ms(r.lat.q(0.5)), name+"-p50-ms")
		b.ReportMetric(ms(r.lat.q(0.99)), name+"-p99-ms")
		b.ReportMetric(ms(r.lat.q(0.5))/base, name+"-p50-vs-g1")
		b.Logf("%2d goroutines: %6.0f cycles/s, p50 %.2f ms, p99 %.2f ms (%d cycles)",
			g, float64(r.cycles)/r.elapsed.Seconds(), ms(r.lat.q(0.5)), ms(r.lat.q(0.99)), r.cycles)
	}
}
