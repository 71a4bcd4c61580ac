package pglock_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"runtime/pprof"
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

// The machine these run on is shared and its load drifts over seconds, so every
// benchmark times its subject and its baselines in alternating chunks of about
// chunkTarget each (interleave) and reports the subject as a multiple of each baseline
// (the vs-* metrics): both sides of a ratio saw the same load. BENCHMARKS.md has the
// results and how to rerun them.

// chunkTarget is about how long one op runs before the next takes its turn: short,
// because the latency of a WAL flush here moves within a second. An op on several
// goroutines runs at least 20 operations per goroutine a turn, so that the turn's
// wall time is not its slowest goroutine's last operation.
const chunkTarget = 10 * time.Millisecond

// benchOp is one operation a benchmark times: run does it once on behalf of goroutine
// g (0 <= g < goroutines), so that each goroutine can own its key or its row.
type benchOp struct {
	name       string
	goroutines int
	run        func(ctx context.Context, g int) error
}

// spread calls fn(g, i) for every i in [0, n) from the given number of goroutines, g
// being the calling goroutine's index, and returns the first error.
func spread(goroutines, n int, fn func(g, i int) error) error {
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for g := range goroutines {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				if err := fn(g, i); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

// warmUp runs every op once on each of its goroutines, so that the pool has opened its
// connections and prepared the statements before the clock starts, and resets the timer.
func warmUp(b *testing.B, ops ...benchOp) {
	b.Helper()
	for _, op := range ops {
		require.NoError(b, spread(op.goroutines, op.goroutines, func(g, _ int) error { return op.run(b.Context(), g) }))
	}
	b.ResetTimer()
}

// interleave runs every op b.N times, each on its own number of goroutines, taking
// turns in chunks of about chunkTarget (the order rotating every round), and returns
// the wall time each op took in all.
func interleave(b *testing.B, ops ...benchOp) []time.Duration {
	b.Helper()
	total := make([]time.Duration, len(ops))
	done := make([]int, len(ops))
	chunk := make([]int, len(ops))
	least := make([]int, len(ops))
	for i, op := range ops {
		least[i] = 1
		if op.goroutines > 1 {
			least[i] = 20 * op.goroutines
		}
		chunk[i] = least[i]
	}
	for round := 0; ; round++ {
		busy := false
		for j := range ops {
			i := (round + j) % len(ops)
			n := min(chunk[i], b.N-done[i])
			if n <= 0 {
				continue
			}
			busy = true
			op := ops[i]
			start := time.Now()
			require.NoError(b, spread(op.goroutines, n, func(g, _ int) error { return op.run(b.Context(), g) }), op.name)
			d := time.Since(start)
			total[i] += d
			done[i] += n
			chunk[i] = max(least[i], int(int64(n)*int64(chunkTarget)/max(int64(d), 1)))
		}
		if !busy {
			return total
		}
	}
}

// reportVs reports the first op's wall time per operation as ns/op and, for every
// other op (a baseline), its own as <name>-ns/op and the first op's as a multiple of
// it, vs-<name>.
func reportVs(b *testing.B, ops []benchOp, total []time.Duration) {
	perOp := func(i int) float64 { return float64(total[i].Nanoseconds()) / float64(b.N) }
	b.ReportMetric(perOp(0), "ns/op")
	for i := 1; i < len(ops); i++ {
		b.ReportMetric(perOp(i), ops[i].name+"-ns/op")
		b.ReportMetric(perOp(0)/perOp(i), "vs-"+ops[i].name)
	}
}

// acquireRelease is the subject of BenchmarkAcquireRelease: TryAcquire and Release,
// each goroutine on its own key.
func acquireRelease(c *pglock.Client, goroutines int) benchOp {
	keys := make([]string, goroutines)
	for g := range keys {
		keys[g] = "bench:distinct:" + strconv.Itoa(g)
	}
	return benchOp{name: "pglock", goroutines: goroutines, run: func(ctx context.Context, g int) error {
		l, err := c.TryAcquire(ctx, keys[g])
		if err != nil {
			return err
		}
		return l.Release(ctx)
	}}
}

// selectOne is one round trip that touches no table.
func selectOne(pool *pgxpool.Pool, goroutines int) benchOp {
	return benchOp{name: "select1", goroutines: goroutines, run: func(ctx context.Context, _ int) error {
		var one int
		return pool.QueryRow(ctx, "SELECT 1").Scan(&one)
	}}
}

// createBenchRows creates the table update2 writes, with a row for each of n goroutines.
func createBenchRows(b *testing.B, pool *pgxpool.Pool, n int) {
	b.Helper()
	_, err := pool.Exec(b.Context(), "CREATE TABLE bench_rows (id int PRIMARY KEY, v bigint NOT NULL)")
	require.NoError(b, err)
	_, err = pool.Exec(b.Context(), "INSERT INTO bench_rows SELECT g, 0 FROM generate_series(0, $1) g", n-1)
	require.NoError(b, err)
}

// update2 is two durable single-row UPDATEs of a plain table (createBenchRows), each
// goroutine on its own row: the least a lock that survives a crash can cost, a WAL
// flush for the acquire and one for the release.
func update2(pool *pgxpool.Pool, goroutines int) benchOp {
	return benchOp{name: "update2", goroutines: goroutines, run: func(ctx context.Context, g int) error {
		for range 2 {
			if _, err := pool.Exec(ctx, "UPDATE bench_rows SET v = v + 1 WHERE id = $1", g); err != nil {
				return err
			}
		}
		return nil
	}}
}

// BenchmarkAcquireRelease times TryAcquire + Release on distinct keys against a SELECT 1,
// a pg_try_advisory_lock + pg_advisory_unlock pair (two round trips on one session,
// nothing durable) and two durable single-row UPDATEs of a plain table: the least a
// lock that survives a crash can cost, a WAL flush for the acquire and one for the
// release; and the raw SQL of the tutorial pglock started from (seed). Target:
// vs-seed <= 1.15.
func BenchmarkAcquireRelease(b *testing.B) {
	for _, goroutines := range []int{1, 16} {
		b.Run("goroutines="+strconv.Itoa(goroutines), func(b *testing.B) {
			pool := pglocktest.Postgres(b)
			c := newClient(b, pglock.NewPostgresStore(pool), pglock.TTL(time.Minute))
			createBenchRows(b, pool, goroutines)

			advisory := benchOp{name: "advisory", goroutines: goroutines, run: func(ctx context.Context, g int) error {
				conn, err := pool.Acquire(ctx) // session locks: both calls on one connection
				if err != nil {
					return err
				}
				defer conn.Release()
				for _, q := range []string{"SELECT pg_try_advisory_lock($1)", "SELECT pg_advisory_unlock($1)"} {
					var ok bool
					if err := conn.QueryRow(ctx, q, int64(g)).Scan(&ok); err != nil {
						return err
					}
					if !ok {
						return fmt.Errorf("%s with %d: false", q, g)
					}
				}
				return nil
			}}
			ops := []benchOp{acquireRelease(c, goroutines), selectOne(pool, goroutines), advisory, update2(pool, goroutines), seedSQL(b, pool, goroutines)}
			warmUp(b, ops...)
			reportVs(b, ops, interleave(b, ops...))
		})
	}
}

// BenchmarkAcquireReleaseBreakdown splits BenchmarkAcquireRelease's cycle between the
// client and the server, interleaved in one run: the subject is TryAcquire + Release on
// a ctx that can end (as a user's), against the same with context.Background() (no
// acquisition goroutine: nothing can end the call early), the two SQL functions the
// client calls (lock_acquire, lock_release_async) sent through the same pool (the
// server's share and pgx's), the seed's SQL and two durable UPDATEs.
func BenchmarkAcquireReleaseBreakdown(b *testing.B) {
	for _, goroutines := range []int{1, 16} {
		b.Run("goroutines="+strconv.Itoa(goroutines), func(b *testing.B) {
			pool := pglocktest.Postgres(b)
			c := newClient(b, pglock.NewPostgresStore(pool), pglock.TTL(time.Minute))
			createBenchRows(b, pool, goroutines)
			background := acquireRelease(c, goroutines)
			cycle := background.run
			background.name = "background"
			background.run = func(_ context.Context, g int) error { return cycle(context.Background(), g) }
			functions := benchOp{name: "functions", goroutines: goroutines, run: func(ctx context.Context, g int) error {
				key, owner := "bench:functions:"+strconv.Itoa(g), "functions/"+strconv.Itoa(g)
				var token *int64
				if err := pool.QueryRow(ctx, "SELECT pglock.lock_acquire($1, $2, 60000)", key, owner).Scan(&token); err != nil {
					return err
				}
				if token == nil {
					return fmt.Errorf("lock_acquire %s: not acquired", key)
				}
				var ok bool
				if err := pool.QueryRow(ctx, "SELECT pglock.lock_release_async($1, $2)", key, owner).Scan(&ok); err != nil {
					return err
				}
				if !ok {
					return fmt.Errorf("lock_release_async %s: not released", key)
				}
				return nil
			}}
			ops := []benchOp{acquireRelease(c, goroutines), background, functions, seedSQL(b, pool, goroutines), update2(pool, goroutines), selectOne(pool, goroutines)}
			warmUp(b, ops...)
			reportVs(b, ops, interleave(b, ops...))
		})
	}
}

// BenchmarkPermitVsLock times Semaphore.TryAcquire + Release of a permit against
// Client.TryAcquire + Release of a plain lock (the ns/op is the permit's; vs-lock is
// the ratio), interleaved in one run: each goroutine on a semaphore of its own (4
// permits), and, in shared, 16 goroutines on one semaphore of 16 permits, whose
// acquisitions take turns on the semaphore's row.
func BenchmarkPermitVsLock(b *testing.B) {
	for _, tc := range []struct {
		name       string
		goroutines int
		shared     bool
	}{{"goroutines=1", 1, false}, {"goroutines=16", 16, false}, {"shared/goroutines=16", 16, true}} {
		b.Run(tc.name, func(b *testing.B) {
			pool := pglocktest.Postgres(b)
			c := newClient(b, pglock.NewPostgresStore(pool), pglock.TTL(time.Minute))
			sems := make([]*pglock.Semaphore, tc.goroutines)
			for g := range sems {
				key, permits := "bench:sem:"+strconv.Itoa(g), 4
				if tc.shared {
					key, permits = "bench:sem:shared", tc.goroutines
				}
				var err error
				sems[g], err = c.Semaphore(key, permits)
				require.NoError(b, err)
			}
			permit := benchOp{name: "permit", goroutines: tc.goroutines, run: func(ctx context.Context, g int) error {
				l, err := sems[g].TryAcquire(ctx)
				if err != nil {
					return err
				}
				return l.Release(ctx)
			}}
			lock := acquireRelease(c, tc.goroutines)
			lock.name = "lock"
			ops := []benchOp{permit, lock}
			warmUp(b, ops...)
			reportVs(b, ops, interleave(b, ops...))
		})
	}
}

// seedSQL is the raw SQL of the tutorial this library started from, on a table and a
// sequence like pglock's own: its INSERT ... ON CONFLICT DO UPDATE acquisition and its
// UPDATE release, sent as plain statements, each goroutine on its own key. It is what
// acquire+release would cost without pglock's functions, checks and client.
func seedSQL(b *testing.B, pool *pgxpool.Pool, goroutines int) benchOp {
	_, err := pool.Exec(b.Context(), `
		CREATE TABLE seed_locks (
			key text PRIMARY KEY, owner text, fencing_token bigint NOT NULL,
			expires_at timestamptz NOT NULL) WITH (fillfactor = 50);
		CREATE SEQUENCE seed_locks_token_seq`)
	require.NoError(b, err)
	return benchOp{name: "seed", goroutines: goroutines, run: func(ctx context.Context, g int) error {
		key, owner := "seed:"+strconv.Itoa(g), "seed-owner/"+strconv.Itoa(g)
		var token int64
		err := pool.QueryRow(ctx, `
			INSERT INTO seed_locks (key, owner, fencing_token, expires_at)
			VALUES ($1, $2, nextval('seed_locks_token_seq'), clock_timestamp() + $3 * interval '1 millisecond')
			ON CONFLICT (key) DO UPDATE SET
				owner = EXCLUDED.owner,
				fencing_token = greatest(nextval('seed_locks_token_seq'), seed_locks.fencing_token + 1),
				expires_at = clock_timestamp() + $3 * interval '1 millisecond'
			WHERE seed_locks.owner IS NULL OR seed_locks.expires_at <= clock_timestamp()
			RETURNING fencing_token`, key, owner, int64(60000)).Scan(&token)
		if err != nil {
			return fmt.Errorf("seed acquire: %w", err)
		}
		tag, err := pool.Exec(ctx, `UPDATE seed_locks SET owner = NULL
			WHERE key = $1 AND owner = $2 AND expires_at > clock_timestamp()`, key, owner)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("seed release of %s: %d rows", key, tag.RowsAffected())
		}
		return nil
	}}
}

// BenchmarkReleaseFlush times lock_acquire + lock_release_async, the release pglock's
// store makes (it commits without waiting for its WAL flush, migration 000009), against
// lock_acquire + lock_release, which waits for it, interleaved in one run, each
// goroutine on its own key.
func BenchmarkReleaseFlush(b *testing.B) {
	for _, goroutines := range []int{1, 16} {
		b.Run("goroutines="+strconv.Itoa(goroutines), func(b *testing.B) {
			pool := pglocktest.Postgres(b)
			cycle := func(name, release string) benchOp {
				return benchOp{name: name, goroutines: goroutines, run: func(ctx context.Context, g int) error {
					key, owner := "flush:"+name+":"+strconv.Itoa(g), "flush-owner/"+strconv.Itoa(g)
					var token *int64
					if err := pool.QueryRow(ctx, "SELECT pglock.lock_acquire($1, $2, 60000)", key, owner).Scan(&token); err != nil {
						return err
					}
					if token == nil {
						return fmt.Errorf("%s: not acquired", key)
					}
					var ok bool
					if err := pool.QueryRow(ctx, "SELECT pglock."+release+"($1, $2)", key, owner).Scan(&ok); err != nil {
						return err
					}
					if !ok {
						return fmt.Errorf("%s: not released", key)
					}
					return nil
				}}
			}
			ops := []benchOp{cycle("async", "lock_release_async"), cycle("durable", "lock_release")}
			warmUp(b, ops...)
			reportVs(b, ops, interleave(b, ops...))
		})
	}
}

// BenchmarkLosingTryAcquire times a TryAcquire that finds the key held by another
// client against one SELECT 1 round trip (target: vs-select1 <= 1.5), and splits it, in
// the same run: the same call on context.Background() (pgx's own query path, not the
// store's for a ctx that can end), and the bare lock_acquire sent through the same pool
// (the server's share and pgx's).
func BenchmarkLosingTryAcquire(b *testing.B) {
	ctx := b.Context()
	pool := pglocktest.Postgres(b)
	holder := newClient(b, pglock.NewPostgresStore(pool), pglock.TTL(time.Hour))
	_, err := holder.TryAcquire(ctx, "bench:held")
	require.NoError(b, err)
	loser := newClient(b, pglock.NewPostgresStore(pool), pglock.TTL(time.Hour))
	lose := benchOp{name: "losing", goroutines: 1, run: func(ctx context.Context, _ int) error {
		if _, err := loser.TryAcquire(ctx, "bench:held"); !errors.Is(err, pglock.ErrNotAcquired) {
			return fmt.Errorf("want ErrNotAcquired, got %v", err)
		}
		return nil
	}}
	background := benchOp{name: "background", goroutines: 1, run: func(context.Context, int) error {
		return lose.run(context.Background(), 0)
	}}
	function := benchOp{name: "function", goroutines: 1, run: func(ctx context.Context, _ int) error {
		var token *int64
		if err := pool.QueryRow(ctx, "SELECT pglock.lock_acquire('bench:held', 'x/1', 3600000)").Scan(&token); err != nil {
			return err
		}
		if token != nil {
			return fmt.Errorf("lock_acquire of a held key: token %d", *token)
		}
		return nil
	}}
	ops := []benchOp{lose, selectOne(pool, 1), background, function}
	warmUp(b, ops...)
	reportVs(b, ops, interleave(b, ops...))
}

// seedLocks makes n locks, held for an hour, in one statement, and returns their keys
// and owners.
func seedLocks(tb testing.TB, pool *pgxpool.Pool, n int) (keys, owners []string) {
	tb.Helper()
	keys, owners = make([]string, n), make([]string, n)
	for i := range n {
		keys[i] = "renew:" + strconv.Itoa(i)
		owners[i] = fmt.Sprintf("bench-host/4242/%013d", i) // as long as a Client's owner ids
	}
	var taken int
	require.NoError(tb, pool.QueryRow(tb.Context(),
		"SELECT count(pglock.lock_acquire(k, o, 3600000)) FROM unnest($1::text[], $2::text[]) AS u(k, o)",
		keys, owners).Scan(&taken))
	require.Equal(tb, n, taken)
	return keys, owners
}

// BenchmarkRenewMany times one lock_renew_many call renewing n held locks (ns/op)
// against renewing them with one lock_renew statement each. Target: vs-each < 0.02 at 10,000 locks.
func BenchmarkRenewMany(b *testing.B) {
	for _, n := range []int{100, 10_000} {
		b.Run("locks="+strconv.Itoa(n), func(b *testing.B) {
			pool := pglocktest.Postgres(b)
			store := pglock.NewPostgresStore(pool)
			batch := pglock.InternalStore(store)
			keys, owners := seedLocks(b, pool, n)

			many := benchOp{name: "many", goroutines: 1, run: func(ctx context.Context, _ int) error {
				renewed, err := batch.RenewMany(ctx, keys, owners, time.Hour)
				if err == nil && len(renewed) != n {
					err = fmt.Errorf("renewed %d of %d", len(renewed), n)
				}
				return err
			}}
			each := benchOp{name: "each", goroutines: 1, run: func(ctx context.Context, _ int) error {
				for i := range keys {
					ok, err := pglock.InternalStore(store).Renew(ctx, keys[i], owners[i], time.Hour)
					if err != nil {
						return err
					}
					if !ok {
						return fmt.Errorf("renewal of %q refused", keys[i])
					}
				}
				return nil
			}}
			b.ResetTimer()
			ops := []benchOp{many, each}
			reportVs(b, ops, interleave(b, ops...))
		})
	}
}

// BenchmarkRenewManyTableSize renews 10,000 locks with lock_renew_many, 60 rounds per
// operation, and reports the size of the table (heap and index) after them as a
// multiple of its size before (size-ratio). Target: at most 1.10. The renewals are HOT
// updates into the room fillfactor 50 leaves, and each round prunes the row versions
// the one before left, without VACUUM (autovacuum is off for the table here). Pruning
// needs every older transaction to have ended: a transaction holding a transaction id
// anywhere on the server, in any database, keeps the dead versions, and the table
// grows while it lasts. That is why this is a metric and not a test: the tests of the
// other packages share the server (see BENCHMARKS.md).
func BenchmarkRenewManyTableSize(b *testing.B) {
	ctx := b.Context()
	pool := pglocktest.Postgres(b)
	_, err := pool.Exec(ctx, "ALTER TABLE pglock.locks SET (autovacuum_enabled = false)")
	require.NoError(b, err)
	keys, owners := seedLocks(b, pool, 10_000)
	batch := pglock.InternalStore(pglock.NewPostgresStore(pool))
	const size = "SELECT pg_total_relation_size('pglock.locks')"
	var before, after int64
	require.NoError(b, pool.QueryRow(ctx, size).Scan(&before))
	b.ResetTimer()
	for b.Loop() {
		for range 60 {
			renewed, err := batch.RenewMany(ctx, keys, owners, time.Hour)
			require.NoError(b, err)
			require.Len(b, renewed, len(keys))
		}
	}
	b.StopTimer()
	require.NoError(b, pool.QueryRow(ctx, size).Scan(&after))
	b.ReportMetric(float64(after)/float64(before), "size-ratio")
}

// BenchmarkContendedKey has 32 goroutines racing for one key with TryAcquire, the
// winner releasing at once, and reports successful acquisitions per second (acq/s)
// next to acquire+release per second on distinct keys at 16 goroutines
// (BenchmarkAcquireRelease/goroutines=16), and their ratio (vs-distinct).
func BenchmarkContendedKey(b *testing.B) {
	pool := pglocktest.Postgres(b)
	c := newClient(b, pglock.NewPostgresStore(pool), pglock.TTL(time.Minute))
	var won atomic.Int64
	race := benchOp{name: "race", goroutines: 32, run: func(ctx context.Context, _ int) error {
		l, err := c.TryAcquire(ctx, "bench:contended")
		if errors.Is(err, pglock.ErrNotAcquired) {
			return nil
		}
		if err != nil {
			return err
		}
		won.Add(1)
		return l.Release(ctx)
	}}
	distinct := acquireRelease(c, 16)
	warmUp(b, race, distinct)
	won.Store(0)
	total := interleave(b, race, distinct)
	acqPerSec := float64(won.Load()) / total[0].Seconds()
	distinctPerSec := float64(b.N) / total[1].Seconds()
	b.ReportMetric(float64(total[0].Nanoseconds())/float64(b.N), "ns/op") // per attempt
	b.ReportMetric(acqPerSec, "acq/s")
	b.ReportMetric(distinctPerSec, "distinct-acq/s")
	b.ReportMetric(acqPerSec/distinctPerSec, "vs-distinct")
	b.ReportMetric(float64(won.Load())/float64(b.N), "won/attempt")
}

// warmPool has pool open 16 connections, and c prepare its statements on them, so
// that holdLocks does not count them.
func warmPool(tb testing.TB, pool *pgxpool.Pool, c *pglock.Client) {
	tb.Helper()
	ctx := tb.Context()
	conns := make([]*pgxpool.Conn, 16)
	for i := range conns {
		var err error
		conns[i], err = pool.Acquire(ctx)
		require.NoError(tb, err)
	}
	for _, conn := range conns {
		conn.Release()
	}
	op := acquireRelease(c, 16)
	require.NoError(tb, spread(16, 64, func(g, _ int) error { return op.run(ctx, g) }))
}

// holdLocks takes keys on c from 16 goroutines and returns the locks and the heap the
// client kept per lock (after GC; keys and the slice excluded). It fails if holding
// them added a goroutine.
func holdLocks(tb testing.TB, c *pglock.Client, keys []string) (locks []*pglock.Lock, bytesPerLock float64) {
	tb.Helper()
	ctx := tb.Context()
	locks = make([]*pglock.Lock, len(keys))
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	goroutines := ownGoroutines()

	require.NoError(tb, spread(16, len(keys), func(_, i int) (err error) {
		locks[i], err = c.TryAcquire(ctx, keys[i])
		return err
	}))
	runtime.GC()
	runtime.ReadMemStats(&after)
	// At most as many: a goroutine of an earlier test's pool may have ended meanwhile,
	// and one the pools started on the way (a connection that a loaded machine is slow
	// to open) ends once it has done its work; one per lock, or per client, stays.
	for deadline := time.Now().Add(5 * time.Second); ownGoroutines() > goroutines && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	require.LessOrEqual(tb, ownGoroutines(), goroutines, "goroutines after holding %d locks", len(keys))
	return locks, (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / float64(len(keys))
}

// ownGoroutines counts the process's goroutines but pgx's background readers: pgx
// starts one on a connection whose write to the server is slow (a loaded machine), and
// it ends only with that connection's next read, which an idle pooled connection may
// not make for a while.
func ownGoroutines() int {
	var profile strings.Builder
	if err := pprof.Lookup("goroutine").WriteTo(&profile, 1); err != nil {
		panic(err)
	}
	_, groups, _ := strings.Cut(profile.String(), "\n") // after "goroutine profile: total N"
	n := 0
	for _, group := range strings.Split(groups, "\n\n") {
		var count int
		if _, err := fmt.Sscanf(group, "%d @", &count); err == nil && !strings.Contains(group, "bgreader.(*BGReader).bgRead") {
			n += count
		}
	}
	return n
}

func heldKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "held:" + strconv.Itoa(i)
	}
	return keys
}

// TestHeldLockCost holds 2,500 locks on one client and checks that each costs the
// client less than 1 KiB of heap and no goroutine. It does not run in parallel (other
// tests' goroutines and allocations would be counted), so the whole run waits for it;
// BenchmarkHeldLock holds more.
func TestHeldLockCost(t *testing.T) {
	pool := pglocktest.Postgres(t)
	c, err := pglock.New(pool, pglock.TTL(time.Hour)) // no renewal fires
	require.NoError(t, err)
	warmPool(t, pool, c)
	locks, perLock := holdLocks(t, c, heldKeys(2_500))
	t.Logf("heap per held lock: %.0f bytes", perLock)
	require.Less(t, perLock, 1024.0)
	for _, l := range locks {
		require.True(t, l.Held())
	}
	abandon(t, c)
}

// abandon closes c without releasing its locks, one round trip each, and leaves them
// to expire with the test's database.
func abandon(tb testing.TB, c *pglock.Client) {
	tb.Helper()
	ctx, cancel := context.WithCancel(tb.Context())
	cancel()
	require.ErrorIs(tb, c.Close(ctx), context.Canceled)
}

// BenchmarkHeldLock holds b.N locks on one client and reports the heap each costs it
// (B/lock); ns/op is suppressed, the time being the GC's as much as the acquisitions'.
func BenchmarkHeldLock(b *testing.B) {
	pool := pglocktest.Postgres(b)
	c, err := pglock.New(pool, pglock.TTL(time.Hour))
	require.NoError(b, err)
	keys := heldKeys(b.N)
	warmPool(b, pool, c)
	b.ResetTimer()
	_, perLock := holdLocks(b, c, keys)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(perLock, "B/lock")
	abandon(b, c)
}

// TestLosingAcquireWritesNoWAL checks that a TryAcquire that finds the key held takes
// no transaction id, so it has no WAL record of its own and no commit to flush, and
// writes no tuple. The WAL position of the server is no use here: other tests write
// to it. Instead the losing calls run in one transaction (the client on a store over
// a pgx.Tx), whose own counters say what it did: pg_current_xact_id_if_assigned and
// pg_stat_xact_user_tables; EXPLAIN (ANALYZE, WAL) counts the WAL records one call
// generates in this backend, checked against a winning call that must show some.
func TestLosingAcquireWritesNoWAL(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pglocktest.Postgres(t)
	holder := newClient(t, pglock.NewPostgresStore(pool), pglock.TTL(time.Minute))
	held, err := holder.TryAcquire(ctx, "reports:nightly")
	require.NoError(t, err)
	rowVersion := func() string {
		var v string
		require.NoError(t, pool.QueryRow(ctx, "SELECT xmin || '/' || xmax || '/' || ctid FROM pglock.locks WHERE key = $1", held.Key()).Scan(&v))
		return v
	}
	versionBefore := rowVersion()

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { require.NoError(t, tx.Rollback(context.WithoutCancel(ctx))) }()
	// The backend's counters include its earlier transactions until it next goes idle
	// outside one, which it does not do while tx is open: compare within tx.
	tableCounters := func() (scans, written int64) {
		require.NoError(t, tx.QueryRow(ctx, `SELECT coalesce(idx_scan, 0), n_tup_ins + n_tup_upd + n_tup_del
			FROM pg_stat_xact_user_tables WHERE relid = 'pglock.locks'::regclass`).Scan(&scans, &written))
		return scans, written
	}
	scansBefore, writtenBefore := tableCounters()
	loser := newClient(t, pglock.NewPostgresStore(tx), pglock.TTL(time.Minute))
	for range 100 {
		_, err := loser.TryAcquire(ctx, held.Key())
		require.ErrorIs(t, err, pglock.ErrNotAcquired)
	}
	var xid *string
	require.NoError(t, tx.QueryRow(ctx, "SELECT pg_current_xact_id_if_assigned()::text").Scan(&xid))
	require.Nil(t, xid, "a losing acquire took a transaction id")
	scans, written := tableCounters()
	require.GreaterOrEqual(t, scans-scansBefore, int64(100), "the counters saw the losing calls")
	require.Equal(t, writtenBefore, written, "tuples written by losing acquires")

	walRecords := func(key string) int64 {
		var plan []struct {
			Plan struct {
				Records int64 `json:"WAL Records"`
			}
		}
		var out []byte // EXPLAIN's output is text, whatever its format
		require.NoError(t, tx.QueryRow(ctx, "EXPLAIN (ANALYZE, WAL, FORMAT JSON) SELECT pglock.lock_acquire($1, $2, $3)",
			key, "explain/1", int64(60_000)).Scan(&out))
		require.NoError(t, json.Unmarshal(out, &plan))
		require.Len(t, plan, 1)
		return plan[0].Plan.Records
	}
	require.Zero(t, walRecords(held.Key()), "WAL records of a losing acquire")
	require.Positive(t, walRecords("reports:weekly"), "WAL records of a winning acquire")

	require.Equal(t, versionBefore, rowVersion(), "the held row was locked or rewritten")
	require.NoError(t, held.Release(ctx))
}

// TestACycleWritesNoMoreWALThanTheSeed: an acquisition and a release of a key nobody
// else holds (lock_acquire, lock_release_async, what a Client sends) write no more WAL
// records than the tutorial's own lease SQL (seedSQL's INSERT ... ON CONFLICT and
// UPDATE) on a table like pglock's, and at most a fifth more bytes: pglock's row also
// records when the lease began and its ttl (at the acquisition), and when it ended (at
// the release), which Locks, Prune and the console read. The medians of 40 cycles of
// each, taking turns, each statement in a transaction of its own, as EXPLAIN (ANALYZE,
// WAL) counts it.
func TestACycleWritesNoMoreWALThanTheSeed(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pglocktest.Postgres(t)
	_, err := pool.Exec(ctx, `CREATE TABLE seed_locks (key text PRIMARY KEY, owner text, fencing_token bigint NOT NULL,
		expires_at timestamptz NOT NULL) WITH (fillfactor = 50); CREATE SEQUENCE seed_locks_token_seq`)
	require.NoError(t, err)
	type wal struct{ records, bytes int64 }
	explain := func(sql string, args ...any) wal {
		var out []byte
		require.NoError(t, pool.QueryRow(ctx, "EXPLAIN (ANALYZE, WAL, FORMAT JSON) "+sql, args...).Scan(&out))
		var plan []struct {
			Plan struct {
				Records int64 `json:"WAL Records"`
				Bytes   int64 `json:"WAL Bytes"`
			}
		}
		require.NoError(t, json.Unmarshal(out, &plan))
		return wal{plan[0].Plan.Records, plan[0].Plan.Bytes}
	}
	cycles := map[string]func(i int) wal{
		"pglock": func(i int) wal {
			a := explain("SELECT pglock.lock_acquire('wal', $1, 60000)", "o"+strconv.Itoa(i))
			r := explain("SELECT pglock.lock_release_async('wal', $1)", "o"+strconv.Itoa(i))
			return wal{a.records + r.records, a.bytes + r.bytes}
		},
		"seed": func(i int) wal {
			a := explain(`INSERT INTO seed_locks (key, owner, fencing_token, expires_at)
				VALUES ('wal', $1, nextval('seed_locks_token_seq'), clock_timestamp() + 60000 * interval '1 millisecond')
				ON CONFLICT (key) DO UPDATE SET owner = EXCLUDED.owner,
					fencing_token = greatest(nextval('seed_locks_token_seq'), seed_locks.fencing_token + 1),
					expires_at = clock_timestamp() + 60000 * interval '1 millisecond'
				WHERE seed_locks.owner IS NULL OR seed_locks.expires_at <= clock_timestamp()
				RETURNING fencing_token`, "o"+strconv.Itoa(i))
			r := explain(`UPDATE seed_locks SET owner = NULL WHERE key = 'wal' AND owner = $1 AND expires_at > clock_timestamp()`,
				"o"+strconv.Itoa(i))
			return wal{a.records + r.records, a.bytes + r.bytes}
		},
	}
	records, bytes := map[string][]int64{}, map[string][]int64{}
	for i := range 41 {
		for name, cycle := range cycles {
			w := cycle(i)
			if i > 0 { // the first creates the rows
				records[name], bytes[name] = append(records[name], w.records), append(bytes[name], w.bytes)
			}
		}
	}
	median := func(v []int64) int64 {
		slices.Sort(v)
		return v[len(v)/2]
	}
	t.Logf("WAL per cycle, median: pglock %d records, %d bytes; seed %d records, %d bytes",
		median(records["pglock"]), median(bytes["pglock"]), median(records["seed"]), median(bytes["seed"]))
	require.LessOrEqual(t, median(records["pglock"]), median(records["seed"]), "WAL records per cycle")
	require.LessOrEqual(t, 5*median(bytes["pglock"]), 6*median(bytes["seed"]), "WAL bytes per cycle")
}

// BenchmarkPrune times Client.Prune deleting 10,000 locks released an hour ago, among
// 1,000 live ones it passes over, and reports rows/s. Each op is one Prune call, ten
// batches; the dead rows are inserted again, untimed, before each.
func BenchmarkPrune(b *testing.B) {
	ctx := b.Context()
	pool := pglocktest.Postgres(b)
	c := newClient(b, pglock.NewPostgresStore(pool), pglock.TTL(time.Hour))
	seedLocks(b, pool, 1000)
	const dead = 10_000
	var rows int64
	for b.Loop() {
		b.StopTimer()
		_, err := pool.Exec(ctx, `INSERT INTO pglock.locks (key, owner, fencing_token, expires_at)
			SELECT 'dead:' || g, NULL, nextval('pglock.fencing_token_seq'), clock_timestamp() - interval '1 hour'
			FROM generate_series(1, $1::int) g`, dead)
		require.NoError(b, err)
		b.StartTimer()
		n, err := c.Prune(ctx, time.Minute)
		require.NoError(b, err)
		require.EqualValues(b, dead, n)
		rows += n
	}
	b.ReportMetric(float64(rows)/b.Elapsed().Seconds(), "rows/s")
}

// pruner deletes rows released two hours ago, 100 a statement (lock_prune), while its
// mode is pruning, and inserts 20,000 more whenever none is left, so that it always has
// work. In mode deleting it does the same to a plain table of the same shape, with a
// plain DELETE: the same load on the server without pglock.locks. The ops of
// BenchmarkWhilePruning set the mode for their own turns only: one statement, well
// under a millisecond, may run into the next op's turn.
type pruner struct {
	mu   sync.Mutex
	cond *sync.Cond
	mode string // "", "pruning", "deleting"
	stop bool
	rows atomic.Int64
}

func startPruner(b *testing.B, pool *pgxpool.Pool) *pruner {
	p := &pruner{}
	p.cond = sync.NewCond(&p.mu)
	ctx := context.WithoutCancel(b.Context()) // b's ends before its cleanups run
	_, err := pool.Exec(ctx, `CREATE TABLE bench_dead (key text PRIMARY KEY, owner text,
		fencing_token bigint NOT NULL, expires_at timestamptz NOT NULL) WITH (fillfactor = 50)`)
	require.NoError(b, err)
	work := map[string][2]string{
		"pruning": {"SELECT pglock.lock_prune(3600000, 100)", "pglock.locks"},
		"deleting": {`WITH d AS (DELETE FROM bench_dead WHERE key IN (SELECT key FROM bench_dead
			WHERE owner IS NULL AND expires_at < clock_timestamp() - interval '1 hour'
			LIMIT 100 FOR UPDATE SKIP LOCKED) RETURNING 1) SELECT count(*) FROM d`, "bench_dead"},
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			p.mu.Lock()
			for p.mode == "" && !p.stop {
				p.cond.Wait()
			}
			mode, stop := p.mode, p.stop
			p.mu.Unlock()
			if stop {
				return
			}
			var n int64
			if err := pool.QueryRow(ctx, work[mode][0]).Scan(&n); err != nil {
				b.Error(err)
				return
			}
			p.rows.Add(n)
			if n == 0 {
				if _, err := pool.Exec(ctx, `INSERT INTO `+work[mode][1]+` (key, owner, fencing_token, expires_at)
					SELECT 'dead:' || gen_random_uuid(), NULL, nextval('pglock.fencing_token_seq'),
					       clock_timestamp() - interval '2 hours'
					FROM generate_series(1, 20000)`); err != nil {
					b.Error(err)
					return
				}
			}
		}
	}()
	b.Cleanup(func() {
		p.mu.Lock()
		p.stop = true
		p.cond.Broadcast()
		p.mu.Unlock()
		<-done
	})
	return p
}

// as returns op run with the background in mode ("" is quiet), named after the mode.
func (p *pruner) as(mode string, op benchOp) benchOp {
	op.name = cmp.Or(mode, "quiet")
	run := op.run
	op.run = func(ctx context.Context, g int) error {
		p.mu.Lock()
		if p.mode != mode {
			p.mode = mode
			p.cond.Broadcast()
		}
		p.mu.Unlock()
		return run(ctx, g)
	}
	return op
}

// BenchmarkWhilePruning times what a holder does while another instance prunes: an
// acquire+release on its own key, and one lock_renew_many of 100 held locks, with a
// pruner deleting dead rows back to back (ns/op), against the same with the same
// deletions done to a plain table (vs-deleting: what pruning costs beyond the load any
// busy writer puts on the server; target within the noise of 1.0) and with nothing in
// the background (vs-quiet), in alternating turns. pruned-rows/s is the pruner's pace.
func BenchmarkWhilePruning(b *testing.B) {
	for _, what := range []string{"acquire+release", "renew100"} {
		b.Run(what, func(b *testing.B) {
			url := pglocktest.PostgresURL(b)
			pool := pglocktest.Pool(b, url, 20)
			store := pglock.NewPostgresStore(pool)
			p := startPruner(b, pglocktest.Pool(b, url, 2))
			var op benchOp
			if what == "acquire+release" {
				op = acquireRelease(newClient(b, store, pglock.TTL(time.Minute)), 1)
			} else {
				keys, owners := seedLocks(b, pool, 100)
				batch := pglock.InternalStore(store)
				op = benchOp{goroutines: 1, run: func(ctx context.Context, _ int) error {
					renewed, err := batch.RenewMany(ctx, keys, owners, time.Hour)
					if err == nil && len(renewed) != len(keys) {
						err = fmt.Errorf("renewed %d of %d", len(renewed), len(keys))
					}
					return err
				}}
			}
			ops := []benchOp{p.as("pruning", op), p.as("deleting", op), p.as("", op)}
			warmUp(b, ops...)
			total := interleave(b, ops...)
			reportVs(b, ops, total)
			b.ReportMetric(float64(p.rows.Load())/(total[0]+total[1]).Seconds(), "deleted-rows/s")
		})
	}
}

// BenchmarkStoreExecMode times what the PostgreSQL store's statements cost straight to
// PostgreSQL, where it keeps the pool's mode, and behind a pooler, where it switches to
// pgx.QueryExecModeExec: the store's acquire + release (ns/op) against the same two
// statements in the pool's default mode, prepared and cached per connection
// (vs-cache, target within the noise of 1.0), and in pgx.QueryExecModeExec, the unnamed
// statement that the server plans at every call (vs-exec: what the mode behind
// PgBouncer costs).
func BenchmarkStoreExecMode(b *testing.B) {
	for _, goroutines := range []int{1, 16} {
		b.Run("goroutines="+strconv.Itoa(goroutines), func(b *testing.B) {
			pool := pglocktest.Postgres(b)
			store := pglock.NewPostgresStore(pool)
			keys := make([]string, goroutines)
			for g := range keys {
				keys[g] = "bench:mode:" + strconv.Itoa(g)
			}
			statements := func(name string, mode ...any) benchOp {
				return benchOp{name: name, goroutines: goroutines, run: func(ctx context.Context, g int) error {
					var token *int64
					if err := pool.QueryRow(ctx, `SELECT pglock.lock_acquire($1, $2, $3)`,
						append(mode, keys[g], "o", int64(60_000))...).Scan(&token); err != nil || token == nil {
						return cmp.Or(err, errors.New("not acquired"))
					}
					var ok bool
					return pool.QueryRow(ctx, `SELECT pglock.lock_release($1, $2)`, append(mode, keys[g], "o")...).Scan(&ok)
				}}
			}
			storeOp := benchOp{name: "store", goroutines: goroutines, run: func(ctx context.Context, g int) error {
				if _, ok, err := pglock.InternalStore(store).Acquire(ctx, keys[g], "o", time.Minute); err != nil || !ok {
					return cmp.Or(err, errors.New("not acquired"))
				}
				_, err := pglock.InternalStore(store).Release(ctx, keys[g], "o")
				return err
			}}
			ops := []benchOp{storeOp, statements("cache"), statements("exec", pgx.QueryExecModeExec)}
			warmUp(b, ops...)
			reportVs(b, ops, interleave(b, ops...))
		})
	}
}

// BenchmarkLocks10000 times Client.Locks listing 10,000 held locks under one prefix
// (ns/op: one call, all rows read into LockInfo) against a plain SELECT of the same rows
// and columns by the same prefix, read into Go the same way but neither sorted nor
// computed (vs-select: what lock_list's clock, sort and SECURITY DEFINER call cost), and
// against SELECT count(*) of them (vs-count: the scan alone).
func BenchmarkLocks10000(b *testing.B) {
	pool := pglocktest.Postgres(b)
	c := newClient(b, pglock.NewPostgresStore(pool), quiet)
	const n = 10_000
	seedLocks(b, pool, n)
	locks := benchOp{name: "locks", goroutines: 1, run: func(ctx context.Context, _ int) error {
		l, err := c.Locks(ctx, "renew:")
		if err == nil && len(l) != n {
			err = fmt.Errorf("%d locks, want %d", len(l), n)
		}
		return err
	}}
	selectRows := benchOp{name: "select", goroutines: 1, run: func(ctx context.Context, _ int) error {
		rows, _ := pool.Query(ctx, `SELECT key, owner, fencing_token, expires_at, wanted_at IS NOT NULL
			FROM pglock.locks WHERE starts_with(key, $1)`, "renew:")
		var got []pglock.LockInfo
		var l pglock.LockInfo
		var owner *string
		_, err := pgx.ForEachRow(rows, []any{&l.Key, &owner, &l.Token, &l.ExpiresAt, &l.Waiting}, func() error {
			if owner != nil {
				l.Owner = *owner
			}
			got = append(got, l)
			return nil
		})
		if err == nil && len(got) != n {
			err = fmt.Errorf("%d rows, want %d", len(got), n)
		}
		return err
	}}
	count := benchOp{name: "count", goroutines: 1, run: func(ctx context.Context, _ int) error {
		var got int
		return pool.QueryRow(ctx, `SELECT count(*) FROM pglock.locks WHERE starts_with(key, $1)`, "renew:").Scan(&got)
	}}
	ops := []benchOp{locks, selectRows, count}
	warmUp(b, ops...)
	reportVs(b, ops, interleave(b, ops...))
}

// BenchmarkJobRunHistory times a run of a WithoutOverlapping job (its run lock taken
// and released around an empty fn: two statements) on a client that records its runs
// (the default RunHistory) against the same run on a client with RunHistory(0)
// (vs-off), in alternating turns. The recording client writes one statement per run in
// the background; the time its Close then takes to write what is still pending is
// added to its side, so ns/op and vs-off count the writes as well as the run.
// tick-ns/op is what the run alone cost its caller; recorded is the share of runs
// found in pglock.job_runs afterwards (1: none dropped).
func BenchmarkJobRunHistory(b *testing.B) {
	ctx := b.Context()
	pool := pglocktest.Postgres(b)
	on, err := pglock.New(pool, quiet, pglock.TTL(time.Minute))
	require.NoError(b, err)
	b.Cleanup(func() { require.NoError(b, on.Close(context.Background())) })
	off := newClient(b, pglock.NewPostgresStore(pool), quiet, pglock.TTL(time.Minute), pglock.RunHistory(0))
	noop := func(context.Context) error { return nil }
	jobOn, err := on.Job("bench:history:on", noop, pglock.WithoutOverlapping())
	require.NoError(b, err)
	jobOff, err := off.Job("bench:history:off", noop, pglock.WithoutOverlapping())
	require.NoError(b, err)
	ops := []benchOp{
		{name: "history", goroutines: 1, run: func(ctx context.Context, _ int) error { return jobOn.Run(ctx) }},
		{name: "off", goroutines: 1, run: func(ctx context.Context, _ int) error { return jobOff.Run(ctx) }},
	}
	warmUp(b, ops...)
	total := interleave(b, ops...)
	tick := total[0]
	start := time.Now()
	require.NoError(b, on.Close(ctx))
	total[0] += time.Since(start)
	b.StopTimer()
	reportVs(b, ops, total)
	b.ReportMetric(float64(tick.Nanoseconds())/float64(b.N), "tick-ns/op")
	var n int
	require.NoError(b, pool.QueryRow(ctx, "SELECT count(*) FROM pglock.job_runs WHERE job = 'bench:history:on'").Scan(&n))
	b.ReportMetric(float64(n)/float64(b.N+1), "recorded")
}
