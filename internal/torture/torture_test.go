package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/pglocktest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Environment variables that shorten or replay the CI run.
const (
	durationEnv = "PGLOCK_TORTURE_DURATION" // e.g. 20s; the default is the 60s
	seedEnv     = "PGLOCK_TORTURE_SEED"     // the seed a failed run printed
)

// TestTorture is the CI version of the torture test: 3 worker processes for 60 s, every
// fault but the PostgreSQL restart (other tests share the server), on a database of its
// own. It fails on any violation, and when the unfenced table lost no update (the
// checker would have been blind).
func TestTorture(t *testing.T) {
	if testing.Short() {
		t.Skip("the torture test runs for a minute; it is skipped with -short")
	}
	t.Parallel()
	cfg := defaultConfig()
	cfg.Workers, cfg.Duration = 3, 60*time.Second
	cfg.Faults = slices.DeleteFunc(slices.Clone(allFaults), func(f string) bool { return f == faultRestart })
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
	cfg.DatabaseURL = pglocktest.PostgresURL(t)
	cfg.Dir = t.TempDir()
	cfg.Log = testLog{t}
	cfg.Command = "go test ./internal/torture -run TestTorture (" + seedEnv + "=" + strconv.FormatUint(cfg.Seed, 10) + ")"

	ctx, cancel := context.WithTimeout(t.Context(), cfg.Duration+3*time.Minute)
	defer cancel()
	// The workers are built without -race: five race-instrumented processes would
	// crowd the machine the rest of the tests run on.
	cfg.WorkerBin = filepath.Join(t.TempDir(), "torture")
	out, err := exec.CommandContext(ctx, "go", "build", "-o", cfg.WorkerBin, ".").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

	start := time.Now()
	res, err := run(ctx, cfg)
	require.NoError(t, err)
	t.Logf("run and check took %v\n%s", time.Since(start).Round(time.Second), summary(res))
	require.False(t, res.Failed(), "violations: see the report above; replay the faults with %s=%d", seedEnv, cfg.Seed)
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
		{"WorkerExitsOnItsOwn", invRun, func(h *History) {
			h.Lives[1].Exit = "exit status 1"
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
		Config: Config{Workers: 2, Keys: 1, TTL: time.Second, Slack: 100 * time.Millisecond},
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
	slices.SortStableFunc(h.Leases, func(a, b LeaseRow) int { return a.At.Compare(b.At) })
	return h
}
