package main

import (
	"context"
	"errors"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/failover"
	"github.com/pgfence/pglock/internal/tcpproxy"
	"github.com/pgfence/pglock/pglocktest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Environment variables that shorten or replay the CI run.
const (
	durationEnv = "PGLOCK_TORTURE_DURATION" // e.g. 20s; the default is the 60s
	seedEnv     = "PGLOCK_TORTURE_SEED"     // the seed a failed run printed
	dirEnv      = "PGLOCK_TORTURE_DIR"      // keep the histories in a new directory under it, for `torture check -dir`
)

// TestTorture is the CI version of the torture test: 3 worker processes for 60 s, every
// fault but the PostgreSQL restart (other tests share the server), on a database of its
// own. It fails on any violation, and when the unfenced table lost no update (the
// checker would have been blind) in two runs in a row: a blind run proves nothing either
// way, and one in a fresh-clone CI run (a slow one: 107 s for 60 s of faults) had no pause
// land in an unfenced section; .ci/matrix's short runs try again the same way.
func TestTorture(t *testing.T) {
	if testing.Short() {
		t.Skip("the torture test runs for a minute; it is skipped with -short")
	}
	t.Parallel()
	for try := 1; ; try++ {
		cfg := tortureConfig(t, 60*time.Second, "")
		cfg.Faults = slices.DeleteFunc(slices.Clone(allFaults), func(f string) bool { return f == faultRestart || f == faultFailover })
		res := runTorture(t, cfg)
		if blindOnly(res) && try < 2 {
			t.Logf("try %d (seed %d): no pause hit an unfenced section, the only violation (invariant 6): once more", try, cfg.Seed)
			continue
		}
		require.False(t, res.Failed(), "violations: see the report above; replay the faults with %s=%d", seedEnv, cfg.Seed)
		return
	}
}

// blindOnly reports whether invariant 6 (the checker was blind) is res's only violation.
func blindOnly(res *Result) bool {
	for inv, n := range res.Violations {
		if n > 0 && inv != invBlind {
			return false
		}
	}
	return res.Violations[invBlind] > 0
}

// mutateEnv names a mutation for TestTortureMutation.
const mutateEnv = "PGLOCK_TORTURE_MUTATE"

// TestTortureFailover is the CI version of the failover runs (issue 19): 3 worker
// processes for 25 s in each replication mode, on a primary and a standby of the run's
// own, failed over about every 8 s, with pauses of lock holders between failovers (the
// other faults are TestTorture's). It fails on any violation: in synchronous mode as on
// one server; in asynchronous mode, past what the mode allows (see failover_check.go).
// Invariant 6 (the checker is not blind) is TestTorture's: in 25 s the pauses need not
// hit a critical section; TestTortureMutation with old-tokens shows that the checker
// sees a token that goes back across a failover.
// It runs when PGLOCK_FAILOVER=1, as .ci/failover sets; each mode takes about 40 s,
// and the two run side by side.
func TestTortureFailover(t *testing.T) {
	if os.Getenv(failover.EnableEnv) != "1" {
		t.Skipf("set %s=1 to run the torture test across failovers (.ci/failover does)", failover.EnableEnv)
	}
	for _, mode := range []string{failoverSync, failoverAsync} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			cfg := tortureConfig(t, 25*time.Second, mode)
			cfg.Faults = []string{faultPause, faultFailover}
			res := runTorture(t, cfg)
			for inv, n := range res.Violations {
				if inv != invBlind { // TestTorture's: 25 s of pauses need not hit a critical section
					require.Zero(t, n, "invariant %d: see the report above; replay the faults with %s=%d", inv, seedEnv, cfg.Seed)
				}
			}
			require.Positive(t, res.Stats.Failover.Failovers)
		})
	}
}

// TestTortureMutation runs the torture test with an old behaviour restored
// (PGLOCK_TORTURE_MUTATE=old-close, old-renewal, old-acquire, old-deadline, or
// old-tokens, which runs across asynchronous failovers), or the semaphore's
// count-then-take, and only the fault that walks its path, for 30 s, and requires the invariant the mutation names to fail: the
// checker sees it in a real run, not only in the histories of
// TestCheckerCatchesTheOldBehaviours. It runs only when asked.
func TestTortureMutation(t *testing.T) {
	name := os.Getenv(mutateEnv)
	if name == "" {
		t.Skip(mutateEnv + " names no mutation")
	}
	m, ok := mutations[name]
	require.True(t, ok, "%s=%s: no such mutation", mutateEnv, name)
	cfg := tortureConfig(t, 30*time.Second, m.Failover)
	cfg.Mutate, cfg.Faults = name, nil
	if m.Fault != "" {
		cfg.Faults = []string{m.Fault}
	}
	res := runTorture(t, cfg)
	require.Positive(t, res.Violations[m.Invariant], "mutation %s: invariant %d (%s) held", name, m.Invariant, invariantNames[m.Invariant])
}

// tortureConfig is the CI configuration: 3 workers for d, or PGLOCK_TORTURE_DURATION,
// on a database of the test's own (with a failover mode, on a primary and a standby of
// the run's own, failed over every 8 s), with a seed of the clock's or
// PGLOCK_TORTURE_SEED.
func tortureConfig(t *testing.T, d time.Duration, failoverMode string) Config {
	t.Helper()
	cfg := defaultConfig()
	cfg.Workers, cfg.Duration = 3, d
	var err error
	if s := os.Getenv(durationEnv); s != "" {
		cfg.Duration, err = time.ParseDuration(s)
		require.NoError(t, err, durationEnv)
	}
	cfg.Seed = uint64(time.Now().UnixNano())
	if s := os.Getenv(seedEnv); s != "" {
		cfg.Seed, err = strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, seedEnv)
	}
	if cfg.Failover = failoverMode; failoverMode == "" {
		cfg.DatabaseURL = pglocktest.PostgresURL(t)
	} else {
		cfg.FailoverEvery = 8 * time.Second
	}
	cfg.Dir = t.TempDir()
	if d := os.Getenv(dirEnv); d != "" {
		cfg.Dir, err = os.MkdirTemp(d, "pglock-torture-")
		require.NoError(t, err, dirEnv)
		t.Logf("histories kept in %s", cfg.Dir)
	}
	cfg.Log = testLog{t}
	cfg.Command = "go test ./internal/torture -run " + t.Name() + " (" + seedEnv + "=" + strconv.FormatUint(cfg.Seed, 10) + ")"
	return cfg
}

// runTorture builds the workers, runs cfg and logs the report.
func runTorture(t *testing.T, cfg Config) *Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), cfg.Duration+3*time.Minute)
	defer cancel()
	cfg.WorkerBin = buildWorker(ctx, t)
	start := time.Now()
	res, err := run(ctx, cfg)
	if errors.Is(err, failover.ErrUnavailable) && os.Getenv("CI") == "" {
		t.Skip(err) // as failover.Start does: CI=1 makes it a failure
	}
	require.NoError(t, err)
	t.Logf("run and check took %v\n%s", time.Since(start).Round(time.Second), summary(res))
	return res
}

// buildWorker builds the worker binary. It is built without -race: five
// race-instrumented processes would crowd the machine the rest of the tests run on.
func buildWorker(ctx context.Context, t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "torture")
	out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}

// The nemesis may pick a worker that has just started (the next fault after a kill or
// a stop can land on the same slot). A SIGTERM sent before the worker handles it kills
// the process, and so does a SIGUSR1 sent before the Go runtime has started in it; the
// checker then reports a worker that "exited on its own" (a fresh-clone CI run on
// PostgreSQL 13 did, for a SIGUSR1, "w3.2 exited on its own: signal: user defined
// signal 1", with no history). Each signal here hits a worker the moment it starts:
// each must be survived or end in a clean exit. The SIGTERM's window is the wider (main
// fails here on it); the SIGUSR1's, a few milliseconds, is shut the same way.
func TestTheNemesisSignalsAWorkerOnlyOnceItListens(t *testing.T) {
	if testing.Short() {
		t.Skip("it runs worker processes")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cfg := tortureConfig(t, time.Minute, "")
	cfg.Workers, cfg.Burn, cfg.WorkerBin = 1, 50*time.Millisecond, buildWorker(ctx, t)
	c := &controller{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, 0x7047))}
	var err error
	c.pool, err = pgxpool.New(ctx, cfg.DatabaseURL)
	require.NoError(t, err)
	defer c.pool.Close()
	require.NoError(t, c.setup(ctx))
	s := &slot{n: 1}
	c.slots = []*slot{s}
	defer c.stopAll() // it closes the proxy
	srv := serversOf(c.pool.Config().ConnConfig)[0]
	p, err := tcpproxy.New(tcpproxy.To(srv.host, srv.port))
	require.NoError(t, err)
	s.proxies = []*tcpproxy.Proxy{p}

	for _, kind := range []string{faultSlow, faultStop, faultSlow} {
		require.NoError(t, c.start(s))
		if kind == faultStop {
			_ = c.stop(s) // inject would look for a WithLock section first; the lives below say how it ended
			continue
		}
		_, err := c.inject(ctx, kind, s)
		require.NoError(t, err, kind)
		_ = c.stop(s)
	}
	require.Len(t, c.lives, 3)
	for _, l := range c.lives {
		require.Empty(t, l.Exit, "%s exited on its own, killed by a signal it did not handle yet (see %s)", l.ID, l.Stderr)
		require.False(t, l.Killed, l.ID)
	}
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(string(p[:len(p)-1]))
	return len(p), nil
}

// The checker must be able to fail: each mutation of a clean history breaks exactly
// the invariant it names.
func TestCheckerCatchesEachViolation(t *testing.T) {
	t.Parallel()
	clean := check(baseline())
	require.False(t, clean.Failed(), "the baseline history is clean: %v", clean.Details)
	require.Equal(t, 1, clean.Stats.LostUpdates, "the baseline's unfenced table lost one increment")
	require.Equal(t, [3]int{3, 0, 0}, clean.Stats.Permits)
	require.Equal(t, 3, clean.Stats.PermitLeases)
	require.Equal(t, 2, clean.Stats.MaxHolders, "a permit released at 800 and taken at 800 is held once")
	require.Equal(t, 250*time.Millisecond, clean.Stats.SemaphoreFull, "both permits held from 650 to 900")
	require.Equal(t, 2, clean.Stats.AcquireOK, "the permits' acquisitions are counted apart")

	for _, tc := range []struct {
		name   string
		inv    int
		mutate func(h *History)
	}{
		{"LostUpdateOnAColumnFencedCounter", invCounters, func(h *History) {
			w := findWrite(h, tableColumn, "w2.1-1")
			w.Old, w.New = 0, 1
			h.Final[tableColumn]["k0"] = 1
		}},
		{"AcknowledgedWriteMissingFromTheDatabase", invCounters, func(h *History) {
			h.Writes = slices.DeleteFunc(h.Writes, func(w WriteRow) bool { return w.Table == tableLock && w.Op == "w2.1-2" })
			h.Final[tableLock]["k0"] = 1
		}},
		{"TokenGoesBack", invCounters, func(h *History) {
			findWrite(h, tableLock, "w2.1-2").NewToken = 0
		}},
		{"AcquisitionTokenGoesBack", invCounters, func(h *History) {
			for i, l := range h.Leases {
				if l.Key == leaderKey && l.Token == 4 {
					h.Leases[i].Token = 2
				}
			}
			for i, r := range h.Records {
				if r.Key == leaderKey && r.Token == 4 {
					h.Records[i].Token = 2
				}
			}
		}},
		{"CriticalSectionsOverlap", invOverlap, func(h *History) {
			for i, r := range h.Records {
				if r.Op == "w2.1-2" && r.F == fRead && r.Type == typeOK {
					h.Records[i].DB = at(140) // before w1.1's write at 150
				}
			}
		}},
		{"TwoLiveLeasesOnAKey", invOverlap, func(h *History) {
			for i, l := range h.Leases {
				if l.Key == "k0" && l.Token == 2 && l.Owner != "" {
					h.Leases[i].At = at(200) // w1.1 holds k0 until 300
				}
			}
			slices.SortStableFunc(h.Leases, func(a, b LeaseRow) int { return a.At.Compare(b.At) })
		}},
		{"LeaseExpiresUnnoticedByARunningHolder", invSignal, func(h *History) {
			h.Leases = slices.DeleteFunc(h.Leases, func(l LeaseRow) bool { return l.Key == "k0" && l.Token == 2 && l.Owner == "" })
			h.Records = slices.DeleteFunc(h.Records, func(r Record) bool { return r.F == fRelease && r.Token == 2 })
		}},
		{"LossSignalledLate", invSignal, func(h *History) {
			h.Leases = slices.DeleteFunc(h.Leases, func(l LeaseRow) bool { return l.Key == "k0" && l.Token == 2 && l.Owner == "" })
			h.Records = slices.DeleteFunc(h.Records, func(r Record) bool { return r.F == fRelease && r.Token == 2 })
			h.Records = append(h.Records, Record{Worker: "w2.1", Type: typeEvent, F: fCtxLost, Key: "k0", Token: 2, Local: at(1310 + 150)})
		}},
		{"OnLostWithoutOnAcquired", invLeader, func(h *History) {
			h.Records = append(h.Records, Record{Worker: "w2.1", Type: typeEvent, F: fOnLost, Key: leaderKey, Token: 99, Local: at(9500)})
		}},
		{"TwoRunningLeaders", invLeader, func(h *History) {
			for i, r := range h.Records {
				if r.F == fLead && r.Worker == "w2.1" {
					h.Records[i].Local = at(4000) // w1.1 leads until 5000
				}
			}
		}},
		{"TickRecordedTwice", invJob, func(h *History) {
			h.Writes = append(h.Writes, WriteRow{ID: 200, Table: tableJob, Key: "tick", Op: "w2.1-9", Old: 102, New: 101, OldToken: 6, NewToken: 6, At: at(260)})
		}},
		{"TickRunTwiceWithLiveLeases", invJob, func(h *History) {
			h.Records = append(h.Records, Record{Worker: "w2.1", Type: typeInvoke, F: fTick, Key: jobLeaseKey, Op: "w2.1-9", Token: 6, Wrote: 101, Local: at(151)})
		}},
		{"UnfencedTableLosesNothing", invBlind, func(h *History) {
			w := findWrite(h, tableUnfenced, "w2.1-3")
			w.Old, w.New = 1, 2
			h.Final[tableUnfenced]["k0"] = 2
		}},
		{"MorePermitHoldersThanPermits", invSemaphore, thirdPermit},
		{"PermitHeldTwice", invOverlap, func(h *History) {
			holdPermit(h, "w1.1", 2, 53, 1000, 1100)
			holdPermit(h, "w2.1", 2, 54, 1050, 1080) // two holders of the one permit, none of the other
			slices.SortStableFunc(h.Leases, func(a, b LeaseRow) int { return a.At.Compare(b.At) })
		}},
		{"SlotRunUnderTwoClaims", invSlots, func(h *History) {
			for _, token := range []int64{70, 71} {
				h.Records = append(h.Records, Record{Worker: "w1.1", Type: typeInvoke, F: fSlot, Key: slotOnceKey, Token: token, Wrote: 500, Local: at(500)})
			}
		}},
		{"SlotRowsOfTwoClaims", invSlots, func(h *History) {
			h.SlotRuns = append(h.SlotRuns, SlotRunRow{ID: 1, Job: slotOnceKey, Slot: at(500), Token: 70},
				SlotRunRow{ID: 2, Job: slotOnceKey, Slot: at(500), Token: 71})
		}},
		{"SlotAttemptRowAfterALaterAttempts", invSlots, func(h *History) {
			h.SlotRuns = append(h.SlotRuns, SlotRunRow{ID: 1, Job: slotAtLeastKey, Slot: at(500), Token: 71},
				SlotRunRow{ID: 2, Job: slotAtLeastKey, Slot: at(500), Token: 70})
		}},
		{"SlotAtLeastOnceLeftWithAttempts", invSlots, func(h *History) {
			failed := "error"
			h.Slots = append(h.Slots, SlotRow{Job: slotAtLeastKey, Slot: at(500), Attempt: 1, Attempts: 3, EndedAt: ptr(at(600)), Outcome: &failed})
		}},
		{"WorkerExitsOnItsOwn", invRun, func(h *History) {
			h.Lives[1].Exit = "exit status 1"
		}},
		{"WorkerLeavesNoHistory", invRun, func(h *History) {
			h.Lives = append(h.Lives, Life{ID: "w1.2", Slot: 1, Start: at(9000), End: at(9900)})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := baseline()
			tc.mutate(h)
			r := check(h)
			for inv, n := range r.Violations {
				if inv == tc.inv {
					require.Positive(t, n, "invariant %d not violated", inv)
				} else {
					require.Zero(t, n, "invariant %d violated too: %v", inv, r.Details[inv])
				}
			}
		})
	}
}

// A pause of a holder past its expiry owes no signal; the same lease expiring while
// it runs does.
func TestCheckerExcusesPausedHoldersOnly(t *testing.T) {
	t.Parallel()
	h := baseline()
	h.Leases = slices.DeleteFunc(h.Leases, func(l LeaseRow) bool { return l.Key == "k0" && l.Token == 2 && l.Owner == "" })
	h.Records = slices.DeleteFunc(h.Records, func(r Record) bool { return r.F == fRelease && r.Token == 2 })
	h.Faults = append(h.Faults, Fault{Kind: faultPause, Target: "w2.1", Start: at(1000), End: at(3000)})
	r := check(h)
	require.False(t, r.Failed(), "%v", r.Details)
	require.Equal(t, 1, r.Stats.PausedHolders)
}

// A worker paused just after its lease expired, before it noticed, and resumed only
// as the run ended owes no signal; resumed with time to notice, it does.
func TestCheckerExcusesAHolderPausedUntilTheEnd(t *testing.T) {
	t.Parallel()
	paused := func(from, to int) *History { // k0's token 2 expires at 1310, unreleased
		h := baseline()
		h.Leases = slices.DeleteFunc(h.Leases, func(l LeaseRow) bool { return l.Key == "k0" && l.Token == 2 && l.Owner == "" })
		h.Records = slices.DeleteFunc(h.Records, func(r Record) bool { return r.F == fRelease && r.Token == 2 })
		h.Faults = append(h.Faults, Fault{Kind: faultPause, Target: "w2.1", Start: at(from), End: at(to)})
		return h
	}
	for _, end := range []int{10000, 9950} { // resumed at the end of its life, or 50 ms before it
		r := check(paused(1350, end))
		require.False(t, r.Failed(), "resumed at %d: %v", end, r.Details)
		require.Equal(t, 1, r.Stats.PausedHolders)
	}
	r := check(paused(1350, 2000))
	require.Equal(t, 1, r.Violations[invSignal], "resumed with 8 s to notice: %v", r.Details)
}

// An acquisition whose reply arrives after the lease expired (a partition held it)
// owes its signal at once, not by an expiry the client could not know of.
func TestCheckerOwesNoSignalBeforeTheClientKnows(t *testing.T) {
	t.Parallel()
	h := baseline()
	h.Leases = slices.DeleteFunc(h.Leases, func(l LeaseRow) bool { return l.Key == "k0" && l.Token == 2 && l.Owner == "" })
	h.Records = slices.DeleteFunc(h.Records, func(r Record) bool { return r.F == fRelease && r.Token == 2 })
	for i, r := range h.Records {
		if r.F == string(pglock.EventAcquired) && r.Token == 2 {
			h.Records[i].Local = at(2000) // the lease expired at 1310
		}
	}
	lost := Record{Worker: "w2.1", Type: typeEvent, F: fCtxLost, Key: "k0", Token: 2, Local: at(2001)}
	r := check(h)
	require.Equal(t, 1, r.Violations[invSignal], "without a signal: %v", r.Details)
	h.Records = append(h.Records, lost)
	r = check(h)
	require.False(t, r.Failed(), "%v", r.Details)
	require.Equal(t, []time.Duration{time.Millisecond}, r.Stats.Lateness)
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func findWrite(h *History, table, op string) *WriteRow {
	for i, w := range h.Writes {
		if w.Table == table && w.Op == op {
			return &h.Writes[i]
		}
	}
	panic("no write " + op + " in " + table)
}

// baseline is a clean history: w1.1 then w2.1 take k0 and increment it in the three
// tables (w2.1 read the unfenced counter before w1.1's write landed: the one lost
// increment of invariant 6); w1.1 leads, then w2.1; w1.1 owns the job and runs
// ticks 100 to 102.
func baseline() *History {
	h := &History{
		Config: Config{Workers: 2, Keys: 1, Permits: 2, TTL: time.Second, Slack: 100 * time.Millisecond},
		Lives:  []Life{{ID: "w1.1", Slot: 1, Start: at(0), End: at(10000)}, {ID: "w2.1", Slot: 2, Start: at(0), End: at(10000)}},
		Final:  map[string]map[string]int64{tableColumn: {"k0": 2}, tableLock: {"k0": 2}, tableUnfenced: {"k0": 1}, tableJob: {"tick": 102}},
	}
	id := int64(0)
	lease := func(key, owner string, token int64, from, expires int) {
		id++
		h.Leases = append(h.Leases, LeaseRow{ID: id, Key: key, Owner: owner, Token: token, ExpiresAt: at(expires), At: at(from)})
	}
	rec := func(r Record) { h.Records = append(h.Records, r) }
	// One critical section on k0: reads at from+10, writes at from+50.
	turn := func(w string, token int64, from, to int, unfencedRead, unfencedOld int64) {
		owner := w + "/x"
		lease("k0", owner, token, from, from+1000)
		rec(Record{Worker: w, Type: typeInvoke, F: fAcquire, Key: "k0", Local: at(from - 5)})
		rec(Record{Worker: w, Type: typeOK, F: fAcquire, Key: "k0", Owner: owner, Token: token, Start: at(from - 5), Local: at(from + 1)})
		rec(Record{Worker: w, Type: typeEvent, F: "acquired", Key: "k0", Owner: owner, Token: token, Local: at(from + 1)})
		for i, table := range counterTables {
			op := w + "-" + strconv.Itoa(i+1)
			read := token - 1
			if table == tableUnfenced {
				read = unfencedRead
			}
			rec(Record{Worker: w, Type: typeOK, F: fRead, Table: table, Key: "k0", Op: op, Token: token, Read: read, Local: at(from + 10), DB: at(from + 10)})
			rec(Record{Worker: w, Type: typeOK, F: fWrite, Table: table, Key: "k0", Op: op, Token: token, Read: read, Wrote: read + 1, Local: at(from + 50), DB: at(from + 50)})
			old := token - 1
			if table == tableUnfenced {
				old = unfencedOld
			}
			h.Writes = append(h.Writes, WriteRow{ID: int64(len(h.Writes) + 1), Table: table, Key: "k0", Op: op, Old: old, New: read + 1,
				OldToken: token - 1, NewToken: token, At: at(from + 50)})
		}
		rec(Record{Worker: w, Type: typeInvoke, F: fRelease, Key: "k0", Owner: owner, Token: token, Local: at(to - 1)})
		rec(Record{Worker: w, Type: typeOK, F: fRelease, Key: "k0", Owner: owner, Token: token, Local: at(to)})
		lease("k0", "", token, to, from+1000)
	}
	turn("w1.1", 1, 100, 300, 0, 0)
	turn("w2.1", 2, 310, 500, 0, 1) // a stale read of 0: it writes 1 over w1.1's 1

	term := func(w string, token int64, from, to int) {
		owner := w + "/l"
		lease(leaderKey, owner, token, from, from+6000)
		lease(leaderKey, "", token, to, from+6000)
		rec(Record{Worker: w, Type: typeEvent, F: "acquired", Key: leaderKey, Owner: owner, Token: token, Local: at(from)})
		rec(Record{Worker: w, Type: typeEvent, F: fLead, Key: leaderKey, Owner: owner, Token: token, Local: at(from + 1)})
		rec(Record{Worker: w, Type: typeEvent, F: fUnlead, Key: leaderKey, Owner: owner, Token: token, Local: at(to), Reason: "pglock: client closed"})
		rec(Record{Worker: w, Type: typeEvent, F: fOnLost, Key: leaderKey, Owner: owner, Token: token, Local: at(to + 1)})
	}
	term("w1.1", 3, 0, 5000)
	term("w2.1", 4, 5005, 9000)

	lease(jobLeaseKey, "w1.1/j", 6, 90, 9999)
	rec(Record{Worker: "w1.1", Type: typeEvent, F: "acquired", Key: jobLeaseKey, Owner: "w1.1/j", Token: 6, Local: at(90)})
	for i, n := range []int64{100, 101, 102} {
		op := "w1.1-t" + strconv.Itoa(i)
		rec(Record{Worker: "w1.1", Type: typeInvoke, F: fTick, Key: jobLeaseKey, Op: op, Token: 6, Wrote: n, Local: at(100 + 50*i)})
		rec(Record{Worker: "w1.1", Type: typeOK, F: fTick, Key: jobLeaseKey, Op: op, Token: 6, Wrote: n, Local: at(101 + 50*i), DB: at(101 + 50*i)})
		h.Writes = append(h.Writes, WriteRow{ID: int64(len(h.Writes) + 1), Table: tableJob, Key: "tick", Op: op, Old: max(n-1, 0), New: n,
			OldToken: 6, NewToken: 6, At: at(101 + 50*i)})
	}
	lease(jobLeaseKey, "", 6, 9500, 9999)

	// The semaphore's two permits: w1.1 holds permit 1 from 600 to 800, when w2.1 takes
	// it; w2.1 holds permit 2 from 650 to 900.
	for _, p := range []struct {
		w              string
		permit         int
		token          int64
		from, released int
	}{{"w1.1", 1, 50, 600, 800}, {"w2.1", 2, 51, 650, 900}, {"w2.1", 1, 52, 800, 950}} {
		holdPermit(h, p.w, p.permit, p.token, p.from, p.released)
	}
	slices.SortStableFunc(h.Leases, func(a, b LeaseRow) int { return a.At.Compare(b.At) })
	return h
}

// holdPermit adds to h w's acquisition of the semaphore's permit at from, with token,
// and its release at released.
func holdPermit(h *History, w string, permit int, token int64, from, released int) {
	key, owner := permitRowKey(semKey, permit), w+"/s"+strconv.FormatInt(token, 10)
	n := int64(len(h.Leases))
	h.Leases = append(h.Leases, LeaseRow{ID: n + 1, Key: key, Owner: owner, Token: token, ExpiresAt: at(from + 1000), At: at(from)},
		LeaseRow{ID: n + 2, Key: key, Token: token, ExpiresAt: at(from + 1000), At: at(released)})
	h.Records = append(h.Records,
		Record{Worker: w, Type: typeInvoke, F: fAcquire, Key: semKey, Local: at(from - 5)},
		Record{Worker: w, Type: typeOK, F: fAcquire, Key: key, Owner: owner, Token: token, Start: at(from - 5), Local: at(from + 1)},
		Record{Worker: w, Type: typeEvent, F: string(pglock.EventAcquired), Key: key, Owner: owner, Token: token, Local: at(from + 1)},
		Record{Worker: w, Type: typeInvoke, F: fRelease, Key: key, Owner: owner, Token: token, Local: at(released - 1)},
		Record{Worker: w, Type: typeOK, F: fRelease, Key: key, Owner: owner, Token: token, Local: at(released)})
}

// thirdPermit is what count-then-take does: w1.1 takes permit 3 of the semaphore's 2
// while both are held.
func thirdPermit(h *History) {
	holdPermit(h, "w1.1", 3, 53, 700, 750)
	slices.SortStableFunc(h.Leases, func(a, b LeaseRow) int { return a.At.Compare(b.At) })
}

// Each old behaviour that the issue "Keep the lease's promise on every path" fixed, as
// a mutation of a clean history of the four paths, breaks exactly the invariant its
// worker mutation (-mutate) names.
func TestCheckerCatchesTheOldBehaviours(t *testing.T) {
	t.Parallel()
	clean := check(paths(baseline()))
	require.False(t, clean.Failed(), "the paths' history is clean: %v", clean.Details)
	st := clean.Stats
	require.Equal(t, 2, st.Sections)
	require.Equal(t, 1, st.SectionCancels[cancelClosed])
	require.Equal(t, 1, st.LongTxs)
	require.Equal(t, 1, st.LongTxsRenewed)
	require.Equal(t, 1, st.Ghosts)
	require.Zero(t, st.GhostsExpired)
	require.Equal(t, []time.Duration{120 * time.Millisecond}, st.GhostTime)
	require.ElementsMatch(t, []time.Duration{-100 * time.Millisecond, -200 * time.Millisecond}, st.Lateness, "the two-ttl pair, each by its own expiry")

	cases := map[string]func(h *History){
		// Close handed the key back while the section, its ctx cancelled, went on.
		mutOldClose: func(h *History) {
			for i, r := range h.Records {
				if r.F == fSection && r.Type == typeOK && r.Token == 1 {
					h.Records[i].Local = at(420) // released at 300; w2.1 took k0 at 310
				}
			}
		},
		// The batched renewal waited on the transaction's row lock: both locks lost.
		mutOldRenewal: func(h *History) {
			h.Leases = slices.DeleteFunc(h.Leases, func(l LeaseRow) bool {
				return (l.Token == 20 || l.Token == 21) && (l.Owner == "" || l.At.After(at(6400)))
			})
			for i, r := range h.Records {
				if r.F == fRelease && r.Type == typeOK && (r.Token == 20 || r.Token == 21) {
					h.Records[i].Type, h.Records[i].Reason = typeFail, string(pglock.LostExpired)
				}
			}
			h.Records = append(h.Records,
				Record{Worker: "w2.1", Type: typeEvent, F: fCtxLost, Key: "other/w2.1", Token: 20, Local: at(7233)},
				Record{Worker: "w2.1", Type: typeEvent, F: fCtxLost, Key: "k1", Token: 21, Local: at(7243)})
		},
		// TryAcquire gave up in flight and handed nothing back.
		mutOldAcquire: func(h *History) {
			h.Leases = slices.DeleteFunc(h.Leases, func(l LeaseRow) bool { return l.Token == 30 && l.Owner == "" })
		},
		// The short lock's ctx was cancelled only when the long one's call returned.
		mutOldDeadline: func(h *History) {
			for i, r := range h.Records {
				if r.F == fCtxLost && r.Token == 40 {
					h.Records[i].Local = at(8200) // its lease expired at 7333; the lost event stays on time
				}
			}
		},
	}
	// The lock_acquire of 000011, after an asynchronous failover that lost w1.1's
	// acquisition of token 10: the new primary's sequence, behind the old one's, hands
	// the next holder token 9 (see withFailover).
	cases[mutOldTokens] = func(h *History) { withFailover(h, failoverAsync, 9) }
	cases[mutCountThenTake] = thirdPermit
	// A tick claimed the slot again once its first run had ended: two runs, two tokens.
	cases[mutSlotReclaim] = func(h *History) {
		for i, token := range []int64{70, 71} {
			h.Records = append(h.Records, Record{Worker: "w1.1", Type: typeInvoke, F: fSlot, Key: slotOnceKey, Token: token, Wrote: 500, Local: at(500 + 10*i)})
		}
	}
	require.ElementsMatch(t, slices.Collect(maps.Keys(mutations)), slices.Collect(maps.Keys(cases)), "a case for every mutation")
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			h := paths(baseline())
			mutate(h)
			r := check(h)
			t.Log(r.Details[mutations[name].Invariant])
			requireOnly(t, r, mutations[name].Invariant)
		})
	}
}

// A fault on the worker excuses what the old behaviours would be blamed for: a lost
// lock in a long transaction, a ghost left to expire; a slow link does not.
func TestCheckerExcusesFaultedPathsOnly(t *testing.T) {
	t.Parallel()
	h := paths(baseline())
	h.Leases = slices.DeleteFunc(h.Leases, func(l LeaseRow) bool { return l.Token == 30 && l.Owner == "" })
	h.Records = append(h.Records, Record{Worker: "w2.1", Type: typeEvent, F: string(pglock.EventLost), Key: "other/w2.1", Token: 20, Local: at(7000)})
	r := check(h)
	require.Equal(t, 1, r.Violations[invRenew], "%v", r.Details)
	require.Equal(t, 1, r.Violations[invGhost], "under a delay: %v", r.Details)

	h.Faults = append(h.Faults, Fault{Kind: faultTerminate, Target: "w2.1", Start: at(6500), End: at(6500)},
		Fault{Kind: faultPartition, Target: "w2.1", Start: at(8300), End: at(8600)})
	r = check(h)
	require.False(t, r.Failed(), "%v", r.Details)
	require.Equal(t, 1, r.Stats.LongTxsExcused)
	require.Equal(t, 1, r.Stats.GhostsExcused)
}

func TestSectionOpenReadsTheHistoryTail(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "history-w1.1.jsonl")
	require.False(t, sectionOpen(path), "no file")
	h, err := openHistory(path, "w1.1")
	require.NoError(t, err)
	h.add(Record{Type: typeInvoke, F: fSection, Key: "k0", Token: 1})
	h.add(Record{Type: typeOK, F: fSection, Key: "k0", Token: 1})
	require.False(t, sectionOpen(path))
	h.add(Record{Type: typeInvoke, F: fSection, Key: "k0", Token: 2})
	for range 20 {
		h.add(Record{Type: typeInvoke, F: fTick, Key: jobLeaseKey})
	}
	require.True(t, sectionOpen(path))
	require.NoError(t, h.close())
}

// requireOnly requires r to break invariant inv, and no other.
func requireOnly(t *testing.T, r *Result, inv int) {
	t.Helper()
	for i, n := range r.Violations {
		if i == inv {
			require.Positive(t, n, "invariant %d not violated", i)
		} else {
			require.Zero(t, n, "invariant %d violated too: %v", i, r.Details[i])
		}
	}
}

// paths adds to baseline the four paths of the issue "Keep the lease's promise on every
// path", each as the fixed library walks it: w1.1's and w2.1's turns on k0 are
// WithLock sections, w1.1's cancelled by Close at 290 and returned before the release
// at 300; w2.1 holds other/w2.1 and k1 through a fenced transaction open from 6020 to
// 7400, both renewed; a probe of w2.1 gives up in flight under a slow link at 8010 and
// the client hands back, at 8120, what the database granted at 8000; w1.1 holds a lock
// of 1 s and one of 2 s through a partition from 6500, and each ctx is cancelled at its
// own deadline, 100 and 200 ms before its expiry.
func paths(h *History) *History {
	rec := func(r Record) { h.Records = append(h.Records, r) }
	lease := func(key, owner string, token int64, from, expires int) {
		h.Leases = append(h.Leases, LeaseRow{ID: int64(len(h.Leases) + 1), Key: key, Owner: owner, Token: token, ExpiresAt: at(expires), At: at(from)})
	}
	for _, s := range []struct {
		w        string
		token    int64
		from, to int
	}{{"w1.1", 1, 102, 295}, {"w2.1", 2, 312, 490}} {
		rec(Record{Worker: s.w, Type: typeInvoke, F: fSection, Key: "k0", Token: s.token, Local: at(s.from)})
		rec(Record{Worker: s.w, Type: typeOK, F: fSection, Key: "k0", Token: s.token, Local: at(s.to)})
	}
	rec(Record{Worker: "w1.1", Type: typeEvent, F: fCancel, Key: "k0", Token: 1, Reason: cancelClosed, Local: at(200)})

	// The long transaction.
	held := func(w, key string, token int64, from, ttl int, renewals []int, release int) {
		owner := w + "/o" + strconv.FormatInt(token, 10)
		lease(key, owner, token, from, from+ttl)
		for _, r := range renewals {
			lease(key, owner, token, r, r+ttl)
		}
		if release > 0 {
			lease(key, "", token, release, renewals[len(renewals)-1]+ttl)
		}
		rec(Record{Worker: w, Type: typeEvent, F: string(pglock.EventAcquired), Key: key, Owner: owner, Token: token, Local: at(from + 1)})
	}
	held("w2.1", "other/w2.1", 20, 6000, 1000, []int{6333, 6667, 7000, 7333}, 7402)
	held("w2.1", "k1", 21, 6010, 1000, []int{6343, 6676, 7010, 7343}, 7401)
	rec(Record{Worker: "w2.1", Type: typeInvoke, F: fLongTx, Op: "w2.1-20", Key: "k1", Token: 21, Local: at(6011)})
	rec(Record{Worker: "w2.1", Type: typeInvoke, F: fLongTx, Op: "w2.1-20", Key: "other/w2.1", Token: 20, Local: at(6011)})
	rec(Record{Worker: "w2.1", Type: typeOK, F: fLongTx, Op: "w2.1-20", Key: "k1", Token: 21, Local: at(7400)})
	for _, tok := range []int64{21, 20} {
		rec(Record{Worker: "w2.1", Type: typeInvoke, F: fRelease, Token: tok, Local: at(7400)})
		rec(Record{Worker: "w2.1", Type: typeOK, F: fRelease, Token: tok, Local: at(7403)})
	}

	// The probe under a slow link.
	h.Faults = append(h.Faults, Fault{Kind: faultDelay, Target: "w2.1", Start: at(7900), End: at(8500), Detail: "80ms each way"})
	rec(Record{Worker: "w2.1", Type: typeInvoke, F: fProbe, Key: "probe/w2.1", Local: at(7990)})
	rec(Record{Worker: "w2.1", Type: typeFail, F: fProbe, Key: "probe/w2.1", Start: at(7990), Local: at(8010), Err: "context deadline exceeded"})
	lease("probe/w2.1", "w2.1/p", 30, 8000, 9000)
	lease("probe/w2.1", "", 30, 8120, 9000)

	// Two ttls through a partition.
	h.Faults = append(h.Faults, Fault{Kind: faultPartition, Target: "w1.1", Start: at(6500), End: at(8500)})
	held("w1.1", "short/w1.1", 40, 6000, 1000, []int{6333}, 0)
	held("w1.1", "long/w1.1", 41, 6000, 2000, []int{6400}, 0)
	for _, l := range []struct {
		key      string
		token    int64
		deadline int
	}{{"short/w1.1", 40, 7233}, {"long/w1.1", 41, 8200}} {
		rec(Record{Worker: "w1.1", Type: typeEvent, F: fCtxLost, Key: l.key, Token: l.token, Local: at(l.deadline)})
		rec(Record{Worker: "w1.1", Type: typeEvent, F: string(pglock.EventLost), Key: l.key, Token: l.token, Local: at(l.deadline + 1)})
		rec(Record{Worker: "w1.1", Type: typeInvoke, F: fRelease, Key: l.key, Token: l.token, Local: at(9000)})
		rec(Record{Worker: "w1.1", Type: typeFail, F: fRelease, Key: l.key, Token: l.token, Local: at(9001), Reason: string(pglock.LostExpired)})
	}
	slices.SortStableFunc(h.Leases, func(a, b LeaseRow) int { return a.At.Compare(b.At) })
	return h
}

// An acquisition that writes its lock row twice in one transaction (a placeholder token,
// then the real one) is one lease: no one else could see the first.
func TestCheckerOneLeasePerTransaction(t *testing.T) {
	t.Parallel()
	twice := func(xact int64) *History {
		h := baseline()
		i := slices.IndexFunc(h.Leases, func(l LeaseRow) bool { return l.Key == "k0" && l.Token == 2 && l.Owner != "" })
		placeholder := h.Leases[i]
		placeholder.Token = 1
		h.Leases[i].Xact, placeholder.Xact = xact, xact
		h.Leases = slices.Insert(h.Leases, i, placeholder)
		return h
	}
	r := check(twice(42))
	require.False(t, r.Failed(), "%v", r.Details)
	require.Positive(t, check(twice(0)).Violations[invOverlap], "without the transaction, the placeholder is a lease of its own")
}

// A lock lost under a fenced transaction, and a ghost left to expire, are excused only
// when the evidence shows the machine kept pglock from acting in time: the worker or
// the controller (the link) did not run, or the server's commit waited for the WAL
// flush, for most of the time in which the renewal, or the hand-back, was due. A renewal that waited for a pool connection, or on a row lock,
// is pglock's, stalls or not.
// A hand-back answered before its grant expired, then lost with the server that a
// restart or failover killed soon after (a release commits asynchronously), is the
// crash's doing: excused. A kill long after the answer, or no answer, excuses nothing.
func TestCheckerExcusesAHandBackTheServerLost(t *testing.T) {
	t.Parallel()
	ghost := func(answered, killed int) *History {
		h := paths(baseline())
		h.Leases = slices.DeleteFunc(h.Leases, func(l LeaseRow) bool { return l.Token == 30 && l.Owner == "" })
		h.Records = append(h.Records, Record{Worker: "w2.1", Type: typeEvent, F: fCall, Reason: "lock_release_many",
			Keys: []string{"probe/w2.1"}, Owners: []string{"w2.1/p"}, Start: at(answered - 20), Local: at(answered)})
		h.Faults = append(h.Faults, Fault{Kind: faultRestart, Start: at(killed), End: at(killed + 500)})
		return h
	}
	r := check(ghost(8120, 9100)) // killed after the expiry (9000), 980 ms after the answer
	require.False(t, r.Failed(), "%v", r.Details)
	require.Equal(t, 1, r.Stats.GhostsExcused)

	r = check(ghost(8120, 8120+int(asyncReleaseLoss/time.Millisecond)+500))
	require.Equal(t, 1, r.Violations[invGhost], "killed long after the answer: %v", r.Details)
	r = check(ghost(9050, 9100))
	require.Equal(t, 1, r.Violations[invGhost], "answered after the expiry: %v", r.Details)

	// Answered after the last point that an asynchronous failover's new primary kept,
	// long before the kill: lost with the old primary's last commits. A synchronous
	// failover loses nothing acknowledged.
	lostInFailover := func(mode string) *History {
		h := ghost(8120, 8120)
		h.Faults = slices.DeleteFunc(h.Faults, func(f Fault) bool { return f.Kind == faultRestart })
		h.Config.Failover, h.Config.Faults = mode, append(h.Config.Faults, faultFailover)
		kill := 8120 + int(asyncReleaseLoss/time.Millisecond) + 500
		h.Failovers = append(h.Failovers, Failover{OldPrimary: "a", NewPrimary: "b", From: 1, To: 2,
			Kill: at(kill), Killed: at(kill + 10), Promoted: at(kill + 100), Rebuilt: at(kill + 1000), KeptUntil: at(8100)})
		h.Faults = append(h.Faults, Fault{Kind: faultFailover, Start: at(kill), End: at(kill + 100)})
		return h
	}
	r = check(lostInFailover(failoverAsync))
	require.Zero(t, r.Violations[invGhost], "lost with the old primary's last commits: %v", r.Details)
	require.Equal(t, 1, r.Stats.GhostsExcused)
	r = check(lostInFailover(failoverSync))
	require.Equal(t, 1, r.Violations[invGhost], "a synchronous failover: %v", r.Details)
}

func TestCheckerExcusesOnlyWhatTheMachineDid(t *testing.T) {
	t.Parallel()
	lostRenewals := func() *History { // the old-renewal case: both locks lost at their deadlines
		h := paths(baseline())
		h.Leases = slices.DeleteFunc(h.Leases, func(l LeaseRow) bool {
			return (l.Token == 20 || l.Token == 21) && (l.Owner == "" || l.At.After(at(6400)))
		})
		h.Records = append(h.Records,
			Record{Worker: "w2.1", Type: typeEvent, F: fCtxLost, Key: "other/w2.1", Token: 20, Local: at(7233)},
			Record{Worker: "w2.1", Type: typeEvent, F: fCtxLost, Key: "k1", Token: 21, Local: at(7243)})
		return h
	}
	stall := func(w string, from, to int) Record {
		return Record{Worker: w, Type: typeEvent, F: fStall, Start: at(from), Local: at(to)}
	}

	h := lostRenewals()
	h.Records = append(h.Records, stall("w2.1", 6400, 6700), stall("w2.1", 6710, 7300))
	r := check(h)
	require.False(t, r.Failed(), "the worker did not run when its renewals were due: %v", r.Details)
	require.Equal(t, 1, r.Stats.LongTxsStarved)

	h = lostRenewals()
	h.Stalls = []Stall{{Due: at(6600), Ran: at(7300)}}
	r = check(h)
	require.False(t, r.Failed(), "the controller, the link, did not run: %v", r.Details)

	h = lostRenewals()
	h.Records = append(h.Records, stall("w2.1", 6700, 6800),
		Record{Worker: "w2.1", Type: typeEvent, F: fRenewal, Start: at(6670), Local: at(7233), Err: "context deadline exceeded"},
		Record{Worker: "w2.1", Type: typeEvent, F: fCall, Reason: callPool, Pool: at(6670), Local: at(7233), Err: "context deadline exceeded"})
	r = check(h)
	require.Equal(t, 2, r.Violations[invRenew], "a renewal that waited for a connection: %v", r.Details)
	require.Contains(t, r.Details[invRenew][0], "asked the pool for a connection at")
	// The same wait while the server took 700 ms to open the connection the pool asked
	// for (a fresh-clone CI run: 2 s each, on two workers at once, with no fault on
	// either): the machine's doing. (A fault on the worker excuses a loss anyway.)
	slowRenewalConnect := func() *History {
		h := lostRenewals()
		h.Faults = slices.DeleteFunc(h.Faults, func(f Fault) bool { return f.Target == "w2.1" }) // paths' delay
		h.Records = append(h.Records, stall("w2.1", 6700, 6800),
			Record{Worker: "w2.1", Type: typeEvent, F: fRenewal, Start: at(6670), Local: at(7233), Err: "context deadline exceeded"},
			Record{Worker: "w2.1", Type: typeEvent, F: fCall, Reason: callPool, Pool: at(6670), Local: at(7233), Err: "context deadline exceeded"},
			Record{Worker: "w2.1", Type: typeEvent, F: fCall, Reason: callConnect, Start: at(6600), Local: at(7300)})
		return h
	}
	r = check(slowRenewalConnect())
	require.False(t, r.Failed(), "the server took 700 ms to open a connection: %v", r.Details)
	require.Equal(t, 1, r.Stats.LongTxsStarved)
	h = slowRenewalConnect() // a connection that opened in 200 ms excuses nothing
	h.Records[len(h.Records)-1].Local = at(6800)
	r = check(h)
	require.Equal(t, 2, r.Violations[invRenew], "a connection opened in 200 ms: %v", r.Details)

	h = lostRenewals()
	h.Records = append(h.Records, stall("w2.1", 6400, 7300))
	h.Waits = []Wait{{At: at(6700), Worker: "w2.1", Type: "Lock", Event: "tuple", Query: "SELECT pglock.lock_renew_many($1::text[], $2::text[], $3)",
		BlockedBy: []string{"SELECT 1 FROM pglock.locks WHERE key = ANY($1) FOR SHARE"}}}
	r = check(h)
	require.Equal(t, 2, r.Violations[invRenew], "a renewal that waited on the fenced row, stalls or not: %v", r.Details)
	require.Contains(t, r.Details[invRenew][0], "waited on a row lock")

	// The server's disk stalled under the renewal (a failover's rebuild: pg_basebackup of
	// the new primary): it waited on pages held by backends waiting to insert WAL, on a
	// table file's extension, then on the WAL's write. The machine's doing.
	samples := func(w string, pid int32, typ, event, query string, from, to int) []Wait {
		var ws []Wait
		for ms := from; ms <= to; ms += 20 {
			ws = append(ws, Wait{At: at(ms), Worker: w, PID: pid, Type: typ, Event: event, Query: query, Since: at(from - 5)})
		}
		return ws
	}
	const renew, acquire = "SELECT pglock.lock_renew_many($1::text[], $2::text[], $3)", "SELECT pglock.lock_acquire_or_want($1, $2, $3)"
	// Each wait below alone covers most of the renewal's window (6666 to 7233).
	diskStall := func(first string) *History {
		typ, event, _ := strings.Cut(first, "/")
		h := lostRenewals()
		h.Waits = slices.Concat(samples("w2.1", 7, typ, event, renew, 6600, 7100),
			samples("w2.1", 7, "LWLock", "WALWrite", renew, 7120, 7230))
		return h
	}
	for _, first := range []string{"LWLock/BufferContent", "Lock/extend", "IO/DataFileRead"} {
		r = check(diskStall(first))
		require.False(t, r.Failed(), "the renewal waited on the disk (%s): %v", first, r.Details)
		require.Equal(t, 1, r.Stats.LongTxsStarved)
	}
	r = check(diskStall("Lock/tuple"))
	require.Equal(t, 2, r.Violations[invRenew], "a renewal that waited on a row lock, then on the disk: %v", r.Details)

	// The server did not answer the controller's pings for most of the renewal's window
	// (its backends starved of CPU: a renewal on no wait event, answered at the deadline):
	// the machine's doing; unless the renewal waited on a row lock.
	h = lostRenewals()
	h.Stalls = []Stall{{Due: at(6600), Ran: at(6900), Server: true}, {Due: at(6910), Ran: at(7240), Server: true}}
	r = check(h)
	require.False(t, r.Failed(), "the server did not answer: %v", r.Details)
	require.Equal(t, 1, r.Stats.LongTxsStarved)
	h.Waits = samples("w2.1", 7, "Lock", "tuple", renew, 6700, 6760)
	require.Equal(t, 2, check(h).Violations[invRenew], "a renewal that waited on a row lock while the server was slow")

	// The renewal waited on a row held by a transaction whose commit waited on the disk
	// (its pid seen on WALSync in the same samples): the disk's doing; held by a
	// transaction not seen waiting (a fenced one, idle in its transaction): pglock's.
	behindDisk := func(blockerOnDisk bool) *History {
		h := lostRenewals()
		h.Waits = samples("w2.1", 7, "Lock", "transactionid", renew, 6600, 7230)
		for i := range h.Waits {
			h.Waits[i].Blockers = []int32{9}
		}
		if blockerOnDisk {
			h.Waits = append(h.Waits, samples("w1.1", 9, "IO", "WALSync", "SELECT pglock.lock_want($1)", 6601, 7231)...)
		}
		return h
	}
	r = check(behindDisk(true))
	require.False(t, r.Failed(), "the row's holder waited on the disk: %v", r.Details)
	r = check(behindDisk(false))
	require.Equal(t, 2, r.Violations[invRenew], "the row's holder was not seen waiting: %v", r.Details)
	require.Contains(t, r.Details[invRenew][0], "waited on a row lock")

	// The lease's acquisition (its last confirmation) waited for a synchronous standby
	// that was catching up, until the renewal's window was nearly over: the standby's
	// doing. The same wait on an advisory lock is pglock's.
	h = lostRenewals()
	h.Waits = samples("w2.1", 7, "IPC", "SyncRep", acquire, 6600, 7230)
	r = check(h)
	require.False(t, r.Failed(), "the acquisition waited for the synchronous standby: %v", r.Details)
	h = lostRenewals()
	h.Waits = samples("w2.1", 7, "Lock", "advisory", acquire, 6600, 7230)
	require.Equal(t, 2, check(h).Violations[invRenew], "an acquisition that waited on an advisory lock")

	h = paths(baseline()) // the old-deadline case: the short lock's ctx cancelled 967 ms after its expiry
	for i, r := range h.Records {
		if r.F == fCtxLost && r.Token == 40 {
			h.Records[i].Local = at(8300)
		}
	}
	require.Equal(t, 1, check(h).Violations[invSignal])
	h.Records = append(h.Records, stall("w1.1", 7300, 7800))
	require.Equal(t, 1, check(h).Violations[invSignal], "stalls shorter than the lateness excuse nothing")
	h.Records = append(h.Records, stall("w1.1", 7810, 8290))
	r = check(h)
	require.False(t, r.Failed(), "the worker did not run: %v", r.Details)
	require.Equal(t, 1, r.Stats.LateStalled)

	h = lostRenewals() // a loss before the transaction began is not the transaction's
	for i, r := range h.Records {
		if r.F == fLongTx && r.Type == typeInvoke {
			h.Records[i].Local = at(7300)
		}
	}
	require.False(t, check(h).Failed(), "lost before the transaction began")

	ghost := func() *History { // the old-acquire case: the probe's grant left to expire
		h := paths(baseline())
		h.Leases = slices.DeleteFunc(h.Leases, func(l LeaseRow) bool { return l.Token == 30 && l.Owner == "" })
		return h
	}
	h = ghost()
	h.Records = append(h.Records, stall("w2.1", 7990, 8800))
	r = check(h)
	require.False(t, r.Failed(), "the worker did not run to hand back: %v", r.Details)
	require.Equal(t, 1, r.Stats.GhostsStarved)

	h = ghost()
	h.Waits = []Wait{{At: at(8000), Worker: "w2.1", PID: 7, Type: "IO", Event: "WALSync", Query: "SELECT pglock.lock_acquire($1, $2, $3)", Since: at(7995)},
		{At: at(8980), Worker: "w2.1", PID: 7, Type: "LWLock", Event: "WALWrite", Query: "SELECT pglock.lock_acquire($1, $2, $3)", Since: at(7995)}}
	r = check(h)
	require.False(t, r.Failed(), "the acquisition's commit waited for the WAL flush past the expiry: %v", r.Details)
	require.Equal(t, 1, r.Stats.GhostsStarved)

	h = ghost()
	h.Records = append(h.Records, Record{Worker: "w2.1", Type: typeEvent, F: fCall, Reason: "lock_release_async", Key: "probe/w2.1", Owner: "w2.1/p",
		Pool: at(8010), Start: at(9100), Local: at(9150)})
	r = check(h)
	require.Equal(t, 1, r.Violations[invGhost], "a hand-back that waited for a connection: %v", r.Details)
	require.Contains(t, r.Details[invGhost][0], "waited 1.09s for a connection")

	// The same wait, while the server took a second to open the connection the pool
	// asked for: the machine's doing; unless the worker's link was faulted then.
	slowConnect := func() *History {
		h := ghost()
		h.Faults = slices.DeleteFunc(h.Faults, func(f Fault) bool { return f.Target == "w2.1" }) // paths' delay
		h.Records = append(h.Records, Record{Worker: "w2.1", Type: typeEvent, F: fCall, Reason: "lock_release_async", Key: "probe/w2.1", Owner: "w2.1/p",
			Pool: at(8010), Start: at(9100), Local: at(9150)},
			Record{Worker: "w2.1", Type: typeEvent, F: fCall, Reason: callConnect, Start: at(8010), Local: at(9090)})
		return h
	}
	r = check(slowConnect())
	require.False(t, r.Failed(), "the server took 1.08s to open a connection: %v", r.Details)
	require.Equal(t, 1, r.Stats.GhostsStarved)
	h = slowConnect()
	h.Faults = append(h.Faults, Fault{Kind: faultDelay, Target: "w2.1", Start: at(7900), End: at(8500)})
	r = check(h)
	require.Equal(t, 1, r.Violations[invGhost], "a connection slowed by the link's own fault: %v", r.Details)
}

// A worker that the nemesis killed as it started, before it opened its history, did
// nothing to check: its empty history is no finding.
func TestCheckerExcusesAWorkerKilledAsItStarted(t *testing.T) {
	t.Parallel()
	h := baseline()
	h.Lives = append(h.Lives, Life{ID: "w1.2", Slot: 1, Start: at(9000), End: at(9116), Killed: true})
	r := check(h)
	require.False(t, r.Failed(), "%v", r.Details)
}

// A permit granted to an acquisition abandoned in flight is a ghost like a lock's: its
// evidence is the semaphore's calls (sem_acquire's WAL waits, the sem_release that
// hands back a permit of unknown number), and permit leases are counted under invariant 8.
func TestCheckerWeighsAPermitGhostsEvidence(t *testing.T) {
	t.Parallel()
	ghost := func() *History {
		h := baseline()
		h.Leases = append(h.Leases, LeaseRow{ID: 100, Key: permitRowKey(semKey, 2), Owner: "w2.1/p", Token: 60, ExpiresAt: at(3000), At: at(2000)})
		return h
	}
	h := ghost()
	h.Records = append(h.Records, Record{Worker: "w2.1", Type: typeEvent, F: fCall, Reason: "sem_release", Key: semKey, Owner: "w2.1/p",
		Pool: at(2010), Start: at(3100), Local: at(3150)})
	r := check(h)
	require.Equal(t, 1, r.Violations[invGhost], "%v", r.Details)
	require.Contains(t, r.Details[invGhost][0], "the hand-back: sem_release asked the pool at")

	// The client's hand-backs in one lock_release_many call name a permit of unknown
	// number by its semaphore's key and U+001F.
	h = ghost()
	h.Records = append(h.Records, Record{Worker: "w2.1", Type: typeEvent, F: fCall, Reason: "lock_release_many",
		Keys: []string{"k0", semKey + permitSeparator}, Owners: []string{"w2.1/q", "w2.1/p"}, Pool: at(2010), Start: at(3100), Local: at(3150)})
	r = check(h)
	require.Equal(t, 1, r.Violations[invGhost], "%v", r.Details)
	require.Contains(t, r.Details[invGhost][0], "the hand-back: lock_release_many asked the pool at")

	h = ghost()
	q := "SELECT permit, fencing_token FROM pglock.sem_acquire($1, $2, $3, $4)"
	h.Waits = []Wait{{At: at(2000), Worker: "w2.1", PID: 7, Type: "IO", Event: "WALSync", Query: q, Since: at(1995)},
		{At: at(2980), Worker: "w2.1", PID: 7, Type: "LWLock", Event: "WALWrite", Query: q, Since: at(1995)}}
	r = check(h)
	require.False(t, r.Failed(), "the acquisition's commit waited for the WAL flush past the expiry: %v", r.Details)
	require.Equal(t, 1, r.Stats.GhostsStarved)
}

func TestPglockCallNamesTheSemaphoresCalls(t *testing.T) {
	t.Parallel()
	require.Equal(t, "sem_acquire", pglockCall("SELECT permit, fencing_token FROM pglock.sem_acquire($1, $2, $3, $4)"))
	require.Equal(t, "lock_acquire", pglockCall("SELECT pglock.lock_acquire($1, $2, $3)"))
	require.Equal(t, "lock_release_many", pglockCall("SELECT pglock.lock_release_many($1::text[], $2::text[], $3)"))
	require.Empty(t, pglockCall("UPDATE t SET v = 1 WHERE pglock.lock_held($1, $2)"))
}

// A leader that stepped down (Close, Resign) before its lease expired had let it go,
// as a Release call does, even when its hand-back never landed (a fresh-clone CI run:
// w3.2, stopped in a WithLock section, stepped down at Close and its hand-back waited
// behind the worker's busy pool until after the expiry); one that stepped down after
// the expiry plus the slack still broke invariant 3.
func TestCheckerCountsAStepDownAsLettingGo(t *testing.T) {
	t.Parallel()
	expiredAfterStepDown := func(stepDown int) *History { // w2.1's term: token 4, stepping down at 9000
		h := baseline()
		h.Leases = slices.DeleteFunc(h.Leases, func(l LeaseRow) bool { return l.Key == leaderKey && l.Token == 4 && l.Owner == "" })
		for i, l := range h.Leases {
			if l.Key == leaderKey && l.Token == 4 {
				h.Leases[i].ExpiresAt = at(9050)
			}
		}
		for i, r := range h.Records {
			if r.Key == leaderKey && r.Token == 4 && r.F == fUnlead {
				h.Records[i].Local = at(stepDown)
			}
		}
		return h
	}
	r := check(expiredAfterStepDown(9000))
	require.False(t, r.Failed(), "stepped down 50 ms before the expiry: %v", r.Details)
	r = check(expiredAfterStepDown(9200))
	require.Equal(t, 1, r.Violations[invSignal], "stepped down 150 ms after the expiry: %v", r.Details)
	h := expiredAfterStepDown(9000)
	h.Records = slices.DeleteFunc(h.Records, func(r Record) bool { return r.Key == leaderKey && r.Token == 4 && r.F == fUnlead })
	r = check(h)
	require.Equal(t, 1, r.Violations[invSignal], "never stepped down: %v", r.Details)
}

// The job's skipped ticks are counted by the reason of the EventJobSkipped emitted during
// each skip's Run, and a tick that no worker ran is counted, apart when a worker skipped
// it as lease-in-doubt: what that rule cost.
func TestCheckerCountsSkippedTicks(t *testing.T) {
	t.Parallel()
	h := baseline() // w1.1 runs ticks 100 to 102, from 100 ms on
	rec := func(r Record) { h.Records = append(h.Records, r) }
	skip := func(w string, n int64, from int, reason pglock.SkipReason) {
		rec(Record{Worker: w, Type: typeEvent, F: fSkip, Wrote: n, Start: at(from), Local: at(from + 10)})
		if reason != "" {
			rec(Record{Worker: w, Type: typeEvent, F: fSkipped, Key: jobKey, Reason: string(reason), Local: at(from + 5)})
		}
	}
	skip("w2.1", 100, 100, pglock.SkipOtherInstance)
	skip("w1.1", 103, 250, pglock.SkipLeaseInDoubt)
	skip("w2.1", 103, 250, pglock.SkipOtherInstance)
	skip("w1.1", 104, 300, "") // its event was never recorded
	// An event outside any skip's Run is not a skip's.
	rec(Record{Worker: "w2.1", Type: typeEvent, F: fSkipped, Key: jobKey, Reason: string(pglock.SkipLeaseInDoubt), Local: at(400)})

	r := check(h)
	require.False(t, r.Failed(), "%v", r.Details)
	require.Equal(t, map[string]int{"other-instance": 2, "lease-in-doubt": 1, "unknown": 1}, r.Stats.TickSkips)
	require.Equal(t, 2, r.Stats.TicksNowhere, "ticks 103 and 104")
	require.Equal(t, 1, r.Stats.TicksNowhereInDoubt, "tick 103")
	require.Contains(t, summary(r), "| job ticks skipped on a worker: lease-in-doubt | 1 |")
}

func ptr[T any](v T) *T { return &v }

// A slot of the at-least-once job claimed near the run's end, its attempts not all
// come before the workers stopped, is counted, not a violation; one that ended in a
// success, or with its attempts spent, is fine wherever it falls.
func TestCheckerExcusesSlotsClaimedNearTheEnd(t *testing.T) {
	t.Parallel()
	h := baseline()
	failed, ok := "error", "ok"
	end := h.Lives[0].End
	for _, l := range h.Lives {
		if l.End.Before(end) {
			end = l.End
		}
	}
	h.Slots = append(h.Slots,
		SlotRow{Job: slotAtLeastKey, Slot: end.Add(-time.Millisecond), Attempt: 1, Attempts: 3, Outcome: &failed},
		SlotRow{Job: slotAtLeastKey, Slot: at(100), Attempt: 3, Attempts: 3, Outcome: &failed},
		SlotRow{Job: slotAtLeastKey, Slot: at(200), Attempt: 2, Attempts: 3, Outcome: &ok})
	r := check(h)
	require.Zero(t, r.Violations[invSlots], "%v", r.Details[invSlots])
	require.Equal(t, 1, r.Stats.SlotsPendingAtEnd)
}
