package pglock_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/pglocktest"
)

// BenchmarkSlotTick measures what a slot costs per tick (issue 35): N instances
// (Clients of one pool of 16 connections) each register the same J jobs in each mode,
// and every instance ticks every job of a mode once, as their schedulers would at one
// scheduled time, for the modes in turn:
//
//   - lease: today's OnOneInstance job, its lease held (taken in a first round, not
//     measured): the owner runs, every other instance's take fails;
//   - slot: a schedule alone (Every): every instance claims, one runs;
//   - slot+lease: a schedule and OnOneInstance: the owner claims and runs, the others'
//     takes fail.
//
// The runs are empty and the history off (RunHistory(0)), so what is counted is the
// tick's own cost, per job and scheduled time across all N instances: the statements
// the pool sent (a pgx tracer), and the WAL they write, from the WAL of each kind of
// statement measured alone afterwards (EXPLAIN (ANALYZE, WAL), the median of 200, in
// the same database: the server is shared, and its WAL position moves with every other
// database's). Each round waits for the next slot of the schedule (10 s, 120 s at full
// size), so that every mode's ticks name a new slot; the modes go in a rotated order.
// Reported per mode over the measured rounds: stmts/job-tick, wal-B/job-tick,
// ms/job-tick (wall time ÷ jobs, N instances at once), and their ratios or differences
// to lease. Small sizes unless PGLOCK_SCALE=full: 50 instances, 1,000 jobs.
func BenchmarkSlotTick(b *testing.B) {
	skipScaleIfShort(b)
	var (
		nClients = pick(5, 50)
		nJobs    = pick(100, 1000)
		every    = pick(10*time.Second, 120*time.Second)
		rounds   = pick(3, 3) // the first is not measured
	)
	ctx := b.Context()
	url := pglocktest.PostgresURL(b)
	tracer := &countTracer{}
	pool := scalePool(b, url, 16, tracer)
	modes := []struct {
		name string
		opts []pglock.JobOption
	}{
		{"lease", []pglock.JobOption{pglock.OnOneInstance()}},
		{"slot", []pglock.JobOption{pglock.Every(every)}},
		{"slot+lease", []pglock.JobOption{pglock.Every(every), pglock.OnOneInstance()}},
	}
	var runs atomic.Int64
	fn := func(context.Context) error { runs.Add(1); return nil }
	jobs := make([][][]*pglock.Job, len(modes)) // mode → client → jobs
	for m := range modes {
		jobs[m] = make([][]*pglock.Job, nClients)
	}
	for i := range nClients {
		c, err := pglock.New(pool, quiet, pglock.TTL(5*time.Minute), pglock.RunHistory(0), pglock.WithoutListener(),
			pglock.WithInstanceName(fmt.Sprintf("instance-%02d", i)))
		require.NoError(b, err)
		b.Cleanup(func() { abandon(b, c) })
		for m, mode := range modes {
			for j := range nJobs {
				job, err := c.Job(fmt.Sprintf("%s:%04d", mode.name, j), fn, mode.opts...)
				require.NoError(b, err)
				jobs[m][i] = append(jobs[m][i], job)
			}
		}
	}
	type totals struct{ stmts, ns, jobTicks int64 }
	sums := make([]totals, len(modes))
	b.ResetTimer()
	for r := range rounds {
		awaitSlot(b, pool, every, 100*time.Millisecond)
		for k := range modes {
			m := (k + r) % len(modes)
			runs.Store(0)
			stmts, start := tracer.n.Load(), time.Now()
			require.NoError(b, spread(nClients, nClients, func(_, i int) error {
				for _, j := range jobs[m][i] {
					if err := j.Run(ctx); err != nil {
						return err
					}
				}
				return nil
			}))
			took := time.Since(start)
			sent := tracer.n.Load() - stmts
			require.EqualValues(b, nJobs, runs.Load(), "%s, round %d: each job runs once a tick", modes[m].name, r)
			b.Logf("round %d %-10s %6d statements, %v", r, modes[m].name, sent, took.Round(time.Millisecond))
			if r > 0 {
				s := &sums[m]
				s.stmts, s.ns, s.jobTicks = s.stmts+sent, s.ns+int64(took), s.jobTicks+int64(nJobs)
			}
		}
	}
	b.StopTimer()
	// The WAL of each statement of a tick, alone: EXPLAIN (ANALYZE, WAL) of it, the
	// median of 200 (the server's WAL position moves with every other database's).
	wal := statementWAL(b, pool, every, 200)
	b.Logf("WAL per statement (median, commit record not included): %v", wal)
	n := float64(nClients)
	walPerTick := []float64{
		(n - 1) * wal["lease-take-lost"],
		wal["claim-won"] + (n-1)*wal["claim-lost"] + wal["end"],
		wal["claim-won"] + wal["end"] + (n-1)*wal["lease-take-lost"],
	}
	per := func(m int, v int64) float64 { return float64(v) / float64(sums[m].jobTicks) }
	for m, mode := range modes {
		name := strings.ReplaceAll(mode.name, "+", "-")
		b.ReportMetric(per(m, sums[m].stmts), name+"-stmts/job-tick")
		b.ReportMetric(walPerTick[m], name+"-wal-B/job-tick")
		b.ReportMetric(per(m, sums[m].ns)/1e6, name+"-ms/job-tick")
		if m > 0 {
			b.ReportMetric(per(m, sums[m].stmts)/per(0, sums[0].stmts), name+"-stmts-vs-lease")
			b.ReportMetric(walPerTick[m]-walPerTick[0], name+"-wal-B-more-than-lease")
			b.ReportMetric(per(m, sums[m].ns)/per(0, sums[0].ns), name+"-time-vs-lease")
		}
	}
	b.ReportMetric(0, "ns/op")
	require.True(b, slices.ContainsFunc(sums, func(t totals) bool { return t.jobTicks > 0 }), "measured rounds")
}

// countTracer counts the statements a pool sends.
type countTracer struct{ n atomic.Int64 }

func (t *countTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	t.n.Add(1)
	return ctx
}

func (t *countTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// statementWAL measures, n times each, the WAL of the statements of a tick, each alone
// (EXPLAIN (ANALYZE, WAL)), and returns the median bytes of each: a lease's take that
// fails (the lease held), a claim that wins a new slot, one that finds it taken, and a
// slot's end.
func statementWAL(tb testing.TB, pool *pgxpool.Pool, every time.Duration, n int) map[string]float64 {
	tb.Helper()
	ctx := tb.Context()
	explain := func(q string, args ...any) float64 {
		tb.Helper()
		var plan []struct {
			Plan struct {
				WALBytes float64 `json:"WAL Bytes"`
			} `json:"Plan"`
		}
		var out []byte
		require.NoError(tb, pool.QueryRow(ctx, "EXPLAIN (ANALYZE, WAL, FORMAT JSON) "+q, args...).Scan(&out))
		require.NoError(tb, json.Unmarshal(out, &plan))
		return plan[0].Plan.WALBytes
	}
	var held int64
	require.NoError(tb, pool.QueryRow(ctx, "SELECT pglock.lock_acquire('wal:lease:owner', 'holder', 600000)").Scan(&held))
	got := map[string][]float64{}
	every64 := every.Milliseconds()
	for i := range n {
		var now int64
		require.NoError(tb, pool.QueryRow(ctx, "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint").Scan(&now))
		slot := now - now%every64
		if now+min(every64/2, 1000) >= slot+every64 {
			slot += every64 // as the client names it, near the next slot
		}
		job := fmt.Sprintf("wal:%d", i)
		claim := "SELECT * FROM pglock.job_slot_claim($1, $2, $3, $4, 300000, 1, 0)"
		got["lease-take-lost"] = append(got["lease-take-lost"], explain("SELECT pglock.lock_acquire('wal:lease:owner', 'other', 300000)"))
		got["lease-renewal"] = append(got["lease-renewal"], explain("SELECT * FROM pglock.lock_renew_many(ARRAY['wal:lease:owner'], ARRAY['holder'], 600000)"))
		got["claim-won"] = append(got["claim-won"], explain(claim, job, slot, slot+every64, "winner"))
		got["claim-lost"] = append(got["claim-lost"], explain(claim, job, slot, slot+every64, "loser"))
		var token int64
		require.NoError(tb, pool.QueryRow(ctx, "SELECT fencing_token FROM pglock.job_slots WHERE job = $1", job).Scan(&token))
		got["end"] = append(got["end"], explain("SELECT pglock.job_slot_end($1, $2, 'winner', $3, 'ok', 0)", job, slot, token))
	}
	med := map[string]float64{}
	for k, v := range got {
		slices.Sort(v)
		med[k] = v[len(v)/2]
	}
	return med
}
