package main

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
)

// timeline2 is the first token of timeline 2 (migration 000012).
const timeline2 = int64(1)<<40 + 1

// withFailover adds to h a failover in mode at 12 s, and around it, on key k2: w1.1's
// acquisition of token 10 at 11.9 s, acknowledged on the old primary after the last
// point the new one is known to have (11.8 s), so not in the log; its Context cancelled
// at 12.5 s, when its renewal reaches the new primary; w2.1's acquisition there at
// 12.3 s (token next), released at 12.4 s. On k0's lock-fenced counter: w1.1's write
// acknowledged at 11.9 s, not in the log; and w2.1's read of 3 on the old primary at
// 11.9 s, written as 4 on the new one over its 2. The workers live until 20 s.
func withFailover(h *History, mode string, next int64) *History {
	h.Config.Failover, h.Config.FailoverEvery = mode, 10*time.Second
	h.Config.Faults = append(h.Config.Faults, faultFailover)
	for i := range h.Lives {
		h.Lives[i].End = at(20000)
	}
	h.Failovers = append(h.Failovers, Failover{OldPrimary: "a", NewPrimary: "b", From: 1, To: 2,
		Kill: at(12000), Killed: at(12010), Promoted: at(12100), Rebuilt: at(13000), KeptUntil: at(11800)})
	h.Faults = append(h.Faults, Fault{Kind: faultFailover, Start: at(12000), End: at(12100)})
	rec := func(r Record) { h.Records = append(h.Records, r) }

	rec(Record{Worker: "w1.1", Type: typeEvent, F: fCall, Reason: "lock_acquire", Key: "k2", Owner: "w1.1/f", Start: at(11895), Local: at(11899)})
	rec(Record{Worker: "w1.1", Type: typeEvent, F: string(pglock.EventAcquired), Key: "k2", Owner: "w1.1/f", Token: 10, Local: at(11900)})
	rec(Record{Worker: "w1.1", Type: typeEvent, F: fCtxLost, Key: "k2", Owner: "w1.1/f", Token: 10, Local: at(12500)})

	h.Leases = append(h.Leases, LeaseRow{ID: 100, Key: "k2", Owner: "w2.1/f", Token: next, ExpiresAt: at(13300), At: at(12300)},
		LeaseRow{ID: 101, Key: "k2", Token: next, ExpiresAt: at(13300), At: at(12400)})
	rec(Record{Worker: "w2.1", Type: typeEvent, F: string(pglock.EventAcquired), Key: "k2", Owner: "w2.1/f", Token: next, Local: at(12301)})
	rec(Record{Worker: "w2.1", Type: typeInvoke, F: fRelease, Key: "k2", Owner: "w2.1/f", Token: next, Local: at(12399)})

	rec(Record{Worker: "w1.1", Type: typeOK, F: fWrite, Table: tableLock, Key: "k0", Op: "w1.1-lost", Token: 10, Read: 2, Wrote: 3, Local: at(11900)})
	rec(Record{Worker: "w2.1", Type: typeOK, F: fRead, Table: tableLock, Key: "k0", Op: "w2.1-stale", Token: 9, Read: 3, Local: at(11900), DB: at(11900)})
	rec(Record{Worker: "w2.1", Type: typeOK, F: fWrite, Table: tableLock, Key: "k0", Op: "w2.1-stale", Token: 9, Read: 3, Wrote: 4, Local: at(12200), DB: at(12200)})
	h.Writes = append(h.Writes, WriteRow{ID: 100, Table: tableLock, Key: "k0", Op: "w2.1-stale", Old: 2, New: 4, OldToken: 2, NewToken: 9, At: at(12200)})
	h.Final[tableLock]["k0"] = 4
	return h
}

// What an asynchronous failover loses (an acquisition, a write, what a read saw) is
// counted, not blamed on pglock; a synchronous failover loses nothing, and the same
// history breaks the invariants there.
func TestCheckerFailover(t *testing.T) {
	t.Parallel()
	r := check(withFailover(baseline(), failoverAsync, timeline2))
	require.False(t, r.Failed(), "%v", r.Details)
	st := r.Stats.Failover
	require.Equal(t, 1, st.Failovers)
	require.Equal(t, 1, st.AcquisitionsLost)
	require.Equal(t, 1, st.WritesLost)
	require.Equal(t, 1, st.StaleReads)
	require.Equal(t, []time.Duration{100 * time.Millisecond}, st.Overlaps, "w1.1 believed it held k2 beside w2.1 from 12.3 s to 12.4 s")
	require.Equal(t, []time.Duration{400 * time.Millisecond}, st.LostTold, "from the promotion")
	require.Equal(t, []time.Duration{605 * time.Millisecond}, st.LostBelief, "from its last confirmation, sent at 11.895 s")
	require.Equal(t, []time.Duration{300 * time.Millisecond}, st.FirstAcquisition, "from the kill")

	for _, tc := range []struct {
		name   string
		inv    int
		mutate func(h *History)
	}{
		{"SynchronousLosesNoAcquisition", invOverlap, func(h *History) {
			h.Config.Failover = failoverSync
			h.Records = slices.DeleteFunc(h.Records, func(r Record) bool { return r.Op == "w1.1-lost" || r.Op == "w2.1-stale" })
			h.Writes = slices.DeleteFunc(h.Writes, func(w WriteRow) bool { return w.Op == "w2.1-stale" })
			h.Final[tableLock]["k0"] = 2
		}},
		{"SynchronousLosesNoWrite", invCounters, func(h *History) {
			h.Config.Failover = failoverSync
			h.Records = slices.DeleteFunc(h.Records, func(r Record) bool { return r.Key == "k2" || r.Op == "w2.1-stale" })
			h.Writes = slices.DeleteFunc(h.Writes, func(w WriteRow) bool { return w.Op == "w2.1-stale" })
			h.Final[tableLock]["k0"] = 2
		}},
		{"SynchronousLosesNoRead", invCounters, func(h *History) {
			h.Config.Failover = failoverSync
			h.Records = slices.DeleteFunc(h.Records, func(r Record) bool { return r.Key == "k2" || r.Op == "w1.1-lost" })
		}},
		{"TheNextTokenIsNotAbove", invCounters, func(h *History) {
			for i, l := range h.Leases {
				if l.Key == "k2" {
					h.Leases[i].Token = 9
				}
			}
			for i, r := range h.Records {
				if r.Key == "k2" && r.Token == timeline2 {
					h.Records[i].Token = 9
				}
			}
		}},
		{"TheLostHolderToldPastItsBound", invSignal, func(h *History) {
			for i, r := range h.Records {
				if r.F == fCtxLost && r.Token == 10 {
					h.Records[i].Local = at(13000) // its bound: 11.895 + 1 s, plus the slack
				}
			}
		}},
		{"AStaleReadBeforeTheKeptPoint", invCounters, func(h *History) {
			for i, r := range h.Records {
				if r.Op == "w2.1-stale" && r.F == fRead {
					h.Records[i].Local, h.Records[i].DB = at(11700), at(11700)
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := withFailover(baseline(), failoverAsync, timeline2)
			tc.mutate(h)
			r := check(h)
			t.Log(r.Details[tc.inv])
			requireOnly(t, r, tc.inv)
		})
	}
}

// A holder whose renewal an asynchronous failover lost believes past its expiry in the
// log; it must give the key up by its last confirmation plus its ttl, and the next
// holder's overlap is counted until then.
func TestCheckerFailoverLostRenewal(t *testing.T) {
	t.Parallel()
	lostRenewal := func(told int) *History {
		h := withFailover(baseline(), failoverAsync, timeline2)
		// w1.1 holds k3 from 11 s (logged, renewed at 11.3 s); its renewal of 11.6 s, sent
		// at 11.85 s and answered at 11.86 s, was lost: the log says it expired at 12.3 s.
		h.Leases = append(h.Leases, LeaseRow{ID: 102, Key: "k3", Owner: "w1.1/r", Token: 7, ExpiresAt: at(12000), At: at(11000)},
			LeaseRow{ID: 103, Key: "k3", Owner: "w1.1/r", Token: 7, ExpiresAt: at(12300), At: at(11300)},
			LeaseRow{ID: 104, Key: "k3", Owner: "w2.1/r", Token: timeline2 + 1, ExpiresAt: at(13500), At: at(12500)},
			LeaseRow{ID: 105, Key: "k3", Token: timeline2 + 1, ExpiresAt: at(13500), At: at(12700)})
		h.Records = append(h.Records,
			Record{Worker: "w1.1", Type: typeEvent, F: string(pglock.EventAcquired), Key: "k3", Owner: "w1.1/r", Token: 7, Local: at(11001)},
			Record{Worker: "w1.1", Type: typeEvent, F: fCall, Reason: "lock_renew_many", Keys: []string{"k3"}, Owners: []string{"w1.1/r"}, Start: at(11850), Local: at(11860)},
			Record{Worker: "w1.1", Type: typeEvent, F: fCtxLost, Key: "k3", Owner: "w1.1/r", Token: 7, Local: at(told)},
			Record{Worker: "w2.1", Type: typeEvent, F: string(pglock.EventAcquired), Key: "k3", Owner: "w2.1/r", Token: timeline2 + 1, Local: at(12501)},
			Record{Worker: "w2.1", Type: typeInvoke, F: fRelease, Key: "k3", Owner: "w2.1/r", Token: timeline2 + 1, Local: at(12699)})
		return h
	}
	r := check(lostRenewal(12600))
	require.False(t, r.Failed(), "%v", r.Details)
	require.Equal(t, 1, r.Stats.Failover.RenewalsLost)
	require.Contains(t, r.Stats.Failover.Overlaps, 100*time.Millisecond)

	r = check(lostRenewal(13000)) // its bound: 11.85 + 1 s, plus the slack
	requireOnly(t, r, invSignal)
}

// A tick run on the old primary under a job lease an asynchronous failover lost, and run
// again on the new primary under the lease it granted next: the failover's doing,
// counted; a synchronous failover loses no lease, and the same history breaks
// invariant 5 there.
func TestCheckerFailoverTickRunTwice(t *testing.T) {
	t.Parallel()
	twice := func(mode string) *History {
		h := withFailover(baseline(), mode, timeline2)
		rec := func(r Record) { h.Records = append(h.Records, r) }
		// w1.1's lease of token 11, granted at 11.9 s after the point the new primary kept.
		rec(Record{Worker: "w1.1", Type: typeEvent, F: fCall, Reason: "lock_acquire", Key: jobLeaseKey, Owner: "w1.1/j2", Start: at(11895), Local: at(11899)})
		rec(Record{Worker: "w1.1", Type: typeEvent, F: string(pglock.EventAcquired), Key: jobLeaseKey, Owner: "w1.1/j2", Token: 11, Local: at(11900)})
		rec(Record{Worker: "w1.1", Type: typeInvoke, F: fTick, Key: jobLeaseKey, Op: "w1.1-tick", Token: 11, Wrote: 500, Local: at(11950)})
		rec(Record{Worker: "w1.1", Type: typeEvent, F: string(pglock.EventLost), Key: jobLeaseKey, Owner: "w1.1/j2", Token: 11, Local: at(12500)})
		// w2.1's on the new primary, from 12.3 s to 12.4 s: the same tick.
		h.Leases = append(h.Leases, LeaseRow{ID: 110, Key: jobLeaseKey, Owner: "w2.1/j", Token: timeline2 + 2, ExpiresAt: at(13300), At: at(12300)},
			LeaseRow{ID: 111, Key: jobLeaseKey, Token: timeline2 + 2, ExpiresAt: at(13300), At: at(12400)})
		rec(Record{Worker: "w2.1", Type: typeInvoke, F: fRelease, Key: jobLeaseKey, Owner: "w2.1/j", Token: timeline2 + 2, Local: at(12399)})
		rec(Record{Worker: "w2.1", Type: typeEvent, F: string(pglock.EventAcquired), Key: jobLeaseKey, Owner: "w2.1/j", Token: timeline2 + 2, Local: at(12301)})
		rec(Record{Worker: "w2.1", Type: typeInvoke, F: fTick, Key: jobLeaseKey, Op: "w2.1-tick", Token: timeline2 + 2, Wrote: 500, Local: at(12350)})
		return h
	}
	r := check(twice(failoverAsync))
	require.False(t, r.Failed(), "%v", r.Details)
	require.Equal(t, 1, r.Stats.Failover.Ticks)
	r = check(twice(failoverSync))
	t.Log(r.Details[invJob])
	require.NotZero(t, r.Violations[invJob], "a synchronous failover loses no lease: %v", r.Details)
}

// A synchronous failover whose outage outlasts a lease: w1.1 runs a tick under its job
// lease (token 11, last renewed at 11.2 s, so expiring at 12.2 s), the primary dies at
// 12.0 s and the new one takes writes at 12.3 s, and w2.1, whose run of the same tick had
// waited out the outage, takes the lease and runs the tick at 12.35 s. Leases never
// overlapped, and w1.1's ctx was cancelled at 12.25 s, before w2.1's run: allowed, and
// counted. Told after w2.1's run began, or with no fault to cut it off, it is not.
func TestCheckerTickCutOffByAFailover(t *testing.T) {
	t.Parallel()
	cutOff := func(toldAt int, fault bool) *History {
		h := withFailover(baseline(), failoverSync, timeline2)
		if !fault {
			h.Faults = slices.DeleteFunc(h.Faults, func(f Fault) bool { return f.Kind == faultFailover })
		}
		h.Failovers[0].Promoted = at(12300)
		rec := func(r Record) { h.Records = append(h.Records, r) }
		h.Leases = append(h.Leases, LeaseRow{ID: 120, Key: jobLeaseKey, Owner: "w1.1/j2", Token: 11, ExpiresAt: at(12000), At: at(11000)},
			LeaseRow{ID: 121, Key: jobLeaseKey, Owner: "w1.1/j2", Token: 11, ExpiresAt: at(12200), At: at(11200)})
		rec(Record{Worker: "w1.1", Type: typeEvent, F: string(pglock.EventAcquired), Key: jobLeaseKey, Owner: "w1.1/j2", Token: 11, Local: at(11001)})
		rec(Record{Worker: "w1.1", Type: typeInvoke, F: fTick, Key: jobLeaseKey, Op: "w1.1-tick", Token: 11, Wrote: 500, Local: at(11950)})
		rec(Record{Worker: "w1.1", Type: typeEvent, F: fCtxLost, Key: jobLeaseKey, Owner: "w1.1/j2", Token: 11, Local: at(toldAt)})
		h.Leases = append(h.Leases, LeaseRow{ID: 130, Key: jobLeaseKey, Owner: "w2.1/j", Token: timeline2 + 2, ExpiresAt: at(13300), At: at(12300)},
			LeaseRow{ID: 131, Key: jobLeaseKey, Token: timeline2 + 2, ExpiresAt: at(13300), At: at(12400)})
		rec(Record{Worker: "w2.1", Type: typeEvent, F: string(pglock.EventAcquired), Key: jobLeaseKey, Owner: "w2.1/j", Token: timeline2 + 2, Local: at(12301)})
		rec(Record{Worker: "w2.1", Type: typeInvoke, F: fTick, Key: jobLeaseKey, Op: "w2.1-tick", Token: timeline2 + 2, Wrote: 500, Local: at(12350)})
		rec(Record{Worker: "w2.1", Type: typeInvoke, F: fRelease, Key: jobLeaseKey, Owner: "w2.1/j", Token: timeline2 + 2, Local: at(12399)})
		return h
	}
	r := check(cutOff(12250, true))
	require.Zero(t, r.Violations[invJob], "%v", r.Details[invJob])
	require.Equal(t, 1, r.Stats.TickCutOff)
	r = check(cutOff(12400, true))
	require.NotZero(t, r.Violations[invJob], "told after the other run began")
	require.Contains(t, r.Details[invJob][0], "ran on 2 workers with live leases")
	r = check(cutOff(12250, false))
	require.NotZero(t, r.Violations[invJob], "no fault cut the lease off: %v", r.Details[invJob])
}

// A failover run writes its own section of the report file, and a run on one server
// rewrites the rest, keeping the sections.
func TestReportFileKeepsEachRunsSection(t *testing.T) {
	t.Parallel()
	one := check(baseline())
	sync, async := check(withFailover(baseline(), failoverSync, timeline2)), check(withFailover(baseline(), failoverAsync, timeline2))
	file := reportFile("", async)
	require.Contains(t, file, "## Across failovers: asynchronous replication")
	require.NotContains(t, file, "# Reliability: pglock under real faults")
	file = reportFile(file, one)
	require.True(t, strings.HasPrefix(file, "# Reliability: pglock under real faults"))
	file = reportFile(file, sync)
	i, j := strings.Index(file, "## Across failovers: synchronous"), strings.Index(file, "## Across failovers: asynchronous")
	require.True(t, i > 0 && j > i, "the synchronous section, then the asynchronous one")
	require.Equal(t, file, reportFile(file, sync), "writing a section again replaces it")
	require.Equal(t, 1, strings.Count(file, "## How it works"))
	require.True(t, strings.HasSuffix(file, method))

	const byHand = "## A run added by hand\n\nIts numbers.\n"
	file = reportFile(file+"\n"+byHand, async)
	require.True(t, strings.HasSuffix(file, method+"\n"+byHand), "what follows the fixed part stays")
	require.True(t, strings.HasSuffix(reportFile(file, one), method+"\n"+byHand), "and stays when the run on one server is written again")
}
