package main

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/pgfence/pglock"
)

// The invariants, numbered as in issue 7, then 7 and 8 of the issue "Keep the lease's
// promise on every path", then 9 of issue 20 (semaphores), then 10 of issue 35 (slots); 0 collects problems of the run itself (a worker that exited
// on its own, a fault that failed), which fail it too.
const (
	invRun       = 0
	invCounters  = 1
	invOverlap   = 2
	invSignal    = 3
	invLeader    = 4
	invJob       = 5
	invBlind     = 6
	invRenew     = 7
	invGhost     = 8
	invSemaphore = 9
	invSlots     = 10
	invariants   = 11
)

var invariantNames = [invariants]string{
	invRun:       "the run itself: no worker exits on its own, every fault is injected",
	invCounters:  "fenced counters equal their accepted writes (no lost update); tokens never go back",
	invOverlap:   "fenced critical sections never overlap on the database clock; nor do a key's leases; a WithLock section ends before its key is handed back",
	invSignal:    "every lost lock is signalled (context cancelled) by its expiry on the database clock, when its holder runs, whatever the ttls of its other locks",
	invLeader:    "at most one leader with a live lease at any instant; OnLost only after OnAcquired",
	invJob:       "the OnOneInstance job runs each tick at most once across the workers",
	invBlind:     "the unfenced table loses updates under pauses (else the checker is blind)",
	invRenew:     "a fenced transaction held open past the ttl costs its client no lock (neither its own nor another)",
	invGhost:     "an acquisition abandoned in flight leaves no ghost: what the database granted is handed back, not left to expire",
	invSemaphore: "never more than N holders of a semaphore at any instant on the database clock",
	invSlots:     "no slot of a job with a schedule runs under two claims (at most once); every slot an at-least-once job claimed ends in a success or its attempts spent, each attempt with a greater token",
}

// maxDetails bounds the violations kept per invariant; all are counted.
const maxDetails = 20

// Result is the checker's verdict on a history, with the numbers of the report.
type Result struct {
	Config     Config
	Violations [invariants]int
	Details    [invariants][]string
	// Excused says, for the first maxDetails of them, which losses (7) and ghosts (8)
	// the evidence showed to be the machine's doing, and what it showed.
	Excused []string
	Stats   Stats
	// Failovers are the run's failovers (failover runs), for the report.
	Failovers []Failover
}

func (r *Result) excuse(format string, args ...any) {
	if len(r.Excused) < maxDetails {
		r.Excused = append(r.Excused, fmt.Sprintf(format, args...))
	}
}

// Failed reports whether the run broke an invariant, or could not show that the
// checker sees a lost update.
func (r *Result) Failed() bool {
	for _, n := range r.Violations {
		if n > 0 {
			return true
		}
	}
	return false
}

func (r *Result) violate(inv int, format string, args ...any) {
	r.Violations[inv]++
	if len(r.Details[inv]) < maxDetails {
		r.Details[inv] = append(r.Details[inv], fmt.Sprintf(format, args...))
	}
}

// Stats are the run's numbers.
type Stats struct {
	Records, Workers, Kills int
	AcquireOK, AcquireBusy  int // busy: not acquired within the wait
	AcquireErr              int
	ReleaseOK, ReleaseLost  int
	Tables                  map[string]*TableStats
	TickRuns                int            // job runs, on the clients
	TickZombies             int            // runs by an owner whose lease had expired (paused), refused by the fence
	TickCutOff              int            // runs whose lease a fault let expire under them before another worker ran the tick
	TickSkips               map[string]int // ticks skipped on a worker, by the reason of its EventJobSkipped
	TicksNowhere            int            // ticks, from the first to the last a worker reached, that no worker ran
	TicksNowhereInDoubt     int            // ... of those, skipped on a worker as lease-in-doubt (the price of that rule)
	LeaderTerms             int
	SlotRuns                int            // runs of the slotted jobs, on the clients (retries included)
	SlotRetries             int            // at-least-once attempts after a slot's first, on the clients
	Slots                   map[string]int // slots claimed, by job (pglock.job_slots at the end)
	SlotsMissed             int            // slots recorded missed
	SlotsPendingAtEnd       int            // at-least-once slots claimed too near the end for all their attempts
	Faults                  map[string]int
	LostSignals             map[string]int // by reason
	PausedHolders           int            // expired leases whose holder was stopped: no signal owed
	LateStalled             int            // signals later than the slack, excused: the worker did not run meanwhile
	Lateness                []time.Duration
	LostUpdates             int // unfenced increments lost
	UnfencedOverlaps        int // unfenced critical sections that overlapped another
	LeaderPausedExcess      time.Duration
	Handover                map[string][]time.Duration

	Sections         int            // WithLock sections that returned
	SectionCancels   map[string]int // sections whose ctx was cancelled, by cause (closed, lost, other)
	StoppedInSection int            // stop faults that landed in a WithLock section
	SectionTail      time.Duration  // the longest a section ran on after its ctx was cancelled by Close
	LongTxs          int            // fenced transactions held open past the ttl, to their end
	LongTxsExcused   int            // ... with a fault on their worker meanwhile: a lost lock is no finding
	LongTxsRenewed   int            // ... whose fenced lock the database renewed while the transaction was open
	LongTxsStarved   int            // ... that lost a lock, excused: the evidence shows the machine kept the renewal from being sent or answered in time
	Probes           [3]int         // TryAcquire on a short ctx: ok, not acquired, gave up (an error: ctx, the link)
	Ghosts           int            // leases no client knew it held
	GhostsExpired    int            // ... left to expire rather than handed back
	GhostsExcused    int            // ... of those, with their worker dead, paused, cut off or killed meanwhile
	GhostsStarved    int            // ... of those, excused: the evidence shows the machine kept the hand-back from running in time
	GhostTime        []time.Duration
	Failover         FailoverStats // failover runs (failover_check.go)

	// The semaphore's (semaphore.go).
	Permits       [3]int        // permit acquisitions (Acquire, WithPermit): ok, waited out their Wait, failed on an error
	PermitWrites  [2]int        // fenced writes under a permit: ok, refused
	PermitLeases  int           // permit leases in the database
	MaxHolders    int           // the most live holders of the semaphore at once, on the database clock
	SemaphoreFull time.Duration // how long all its permits (or more) were held
}

// TableStats counts one table's writes: as the clients saw them, and as the database
// applied them.
type TableStats struct {
	OK, Refused, Unknown, ClaimRefused, Applied int
}

// Handover kinds.
const (
	handoverRelease    = "after release (locks)"
	handoverKillLock   = "after kill (locks)"
	handoverKillLeader = "after kill (leader)"
	handoverKillJob    = "after kill (job lease)"
)

var handoverKinds = []string{handoverRelease, handoverKillLock, handoverKillLeader, handoverKillJob}

// lease is one acquisition of a key as the database logged it.
type lease struct {
	key, owner, worker string
	token              int64
	start, expires     time.Time
	released           time.Time   // zero unless handed back while live
	renewals           []time.Time // on the database clock
	// In an asynchronous failover run (failover_check.go): lost is the failover that lost
	// this acquisition, which its client was told of (it is in no lease log: start is
	// when its client learned of it); cut is the failover that lost a renewal its client
	// was told of (its expiry in the log is earlier than its holder's belief). bound is,
	// for both, the latest its holder may believe it holds it: its last confirmation's
	// send plus its ttl, the README's "never more than ttl".
	lost, cut *Failover
	bound     time.Time
}

// end is when the lease stopped being live: its release or its expiry.
func (l *lease) end() time.Time {
	if !l.released.IsZero() && l.released.Before(l.expires) {
		return l.released
	}
	return l.expires
}

type workerToken struct {
	worker string
	token  int64
}

type keyToken struct {
	key   string
	token int64
}

// checker holds a history's indexes while it is checked.
type checker struct {
	h       *History
	r       *Result
	slack   time.Duration
	lives   map[string]Life
	stops   map[string][]Fault // pauses by worker
	faults  map[string][]Fault // every fault by target; the server's under ""
	leases  map[string][]*lease
	byToken map[keyToken]*lease // the lost ones too (lease.lost)
	lost    []*lease            // acquisitions a failover lost (failover_check.go)
	told    toldIndex           // when each client learned it held a lease, and lost it
	recs    map[string][]Record // by worker, in file order
	ops     map[string][]Record // by op, in file order

	// The evidence (see evidence.go).
	stalled  map[string][]span     // when each worker, and the controller (""), did not run
	calls    map[string][]Record   // pglock's calls, by worker
	renewals map[string][]Record   // EventRenewal, by worker
	waits    map[string][]Wait     // pglock statements seen waiting in the server, by worker
	onDiskAt map[int32][]time.Time // when each server process was seen waiting on the disk (onDisk)
}

// check verifies the invariants on h.
func check(h *History) *Result {
	c := &checker{h: h, r: &Result{Config: h.Config, Failovers: h.Failovers}, slack: h.Config.Slack,
		lives: map[string]Life{}, stops: map[string][]Fault{}, faults: map[string][]Fault{}, leases: map[string][]*lease{},
		byToken: map[keyToken]*lease{}, recs: map[string][]Record{}, ops: map[string][]Record{}}
	c.r.Stats = Stats{Records: len(h.Records), Workers: len(h.Lives), Tables: map[string]*TableStats{},
		Faults: map[string]int{}, LostSignals: map[string]int{}, Handover: map[string][]time.Duration{},
		SectionCancels: map[string]int{}, Slots: map[string]int{}}
	c.index()
	c.indexEvidence()
	c.indexTold()
	c.indexFailovers()
	c.run()
	c.counters()
	c.overlaps()
	c.sections()
	c.signals()
	c.leader()
	c.job()
	c.longTxs()
	c.ghosts()
	c.semaphores()
	c.slots()
	c.handovers()
	c.failovers()
	return c.r
}

func (c *checker) index() {
	for _, l := range c.h.Lives {
		c.lives[l.ID] = l
	}
	for _, f := range c.h.Faults {
		c.r.Stats.Faults[f.Kind]++
		c.faults[f.Target] = append(c.faults[f.Target], f)
		if f.Kind == faultStop && f.Detail != "" {
			c.r.Stats.StoppedInSection++
		}
		if f.Kind == faultPause {
			c.stops[f.Target] = append(c.stops[f.Target], f)
		}
		if f.Kind == faultKill {
			c.r.Stats.Kills++
		}
	}
	for _, r := range c.h.Records {
		c.recs[r.Worker] = append(c.recs[r.Worker], r)
		if r.Op != "" {
			c.ops[r.Op] = append(c.ops[r.Op], r)
		}
	}
	cur := map[string]*lease{}
	for _, row := range visible(c.h.Leases) { // in id order: per key, the order of the row lock
		l := cur[row.Key]
		switch {
		case row.Owner != "" && (l == nil || l.token != row.Token || !l.released.IsZero()):
			l = &lease{key: row.Key, owner: row.Owner, worker: workerOf(row.Owner), token: row.Token, start: row.At, expires: row.ExpiresAt}
			cur[row.Key] = l
			c.leases[row.Key] = append(c.leases[row.Key], l)
			c.byToken[keyToken{row.Key, row.Token}] = l
		case row.Owner != "": // a renewal
			l.expires = row.ExpiresAt
			l.renewals = append(l.renewals, row.At)
		case l != nil && l.token == row.Token: // a release
			l.released = row.At
		}
	}
}

// visible returns the lease log without the rows that a later row of the same key
// overwrote in the same transaction (an acquisition that writes a placeholder token,
// then the real one): what other transactions could see.
func visible(rows []LeaseRow) []LeaseRow {
	out := make([]LeaseRow, 0, len(rows))
	next := map[string]LeaseRow{} // the next row of each key, going backwards
	for i := len(rows) - 1; i >= 0; i-- {
		row := rows[i]
		if n, ok := next[row.Key]; ok && row.Xact != 0 && n.Xact == row.Xact && n.Owner == row.Owner {
			continue
		}
		next[row.Key] = row
		out = append(out, row)
	}
	slices.Reverse(out)
	return out
}

// stoppedAt reports whether worker was paused at some moment of [from, to].
func (c *checker) stoppedAt(worker string, from, to time.Time) bool {
	for _, f := range c.stops[worker] {
		if !f.Start.After(to) && !f.End.Before(from) {
			return true
		}
	}
	return false
}

// stoppedForGood reports whether worker was paused at some moment of [from, to] (when
// it owed a signal) and, once resumed, did not live for the slack (the run's end
// stopped it): it could not notice anything after that pause. A pause at 59.9 s of a
// 60 s run, just after a lease's expiry, left a fresh-clone CI run's worker no time.
func (c *checker) stoppedForGood(worker string, from, to time.Time) bool {
	for _, f := range c.stops[worker] {
		if !f.Start.After(to) && !f.End.Before(from) && (f.End.IsZero() || !c.alive(worker, f.End, f.End.Add(c.slack))) {
			return true
		}
	}
	return false
}

// faulted reports whether a fault of one of kinds hit worker, or the whole server, at
// some moment of [from, to].
func (c *checker) faulted(worker string, from, to time.Time, kinds ...string) bool {
	for _, f := range append(slices.Clone(c.faults[worker]), c.faults[""]...) {
		if slices.Contains(kinds, f.Kind) && !f.Start.After(to) && !f.End.Before(from) {
			return true
		}
	}
	return false
}

// alive reports whether worker's process ran through [from, to].
func (c *checker) alive(worker string, from, to time.Time) bool {
	l, ok := c.lives[worker]
	return ok && !l.Start.After(from) && (l.End.IsZero() || l.End.After(to))
}

func (c *checker) run() {
	for _, l := range c.h.Lives {
		if l.Exit != "" {
			c.r.violate(invRun, "%s (pid %d) exited on its own: %s; see %s", l.ID, l.PID, l.Exit, l.Stderr)
		}
		// A worker killed before it opened its history (the nemesis may pick a worker
		// that a loaded machine is still starting) did nothing to check.
		if len(c.recs[l.ID]) == 0 && !(l.Killed && l.End.Sub(l.Start) < time.Second) {
			c.r.violate(invRun, "%s (pid %d) left no history", l.ID, l.PID)
		}
	}
	for _, f := range c.h.Faults {
		if f.Err != "" {
			c.r.violate(invRun, "%s %s at %s failed: %s", f.Kind, f.Target, stamp(f.Start), f.Err)
		}
	}
	for _, r := range c.h.Records {
		switch {
		case r.F == fAcquire && semaphoreOf(r.Key) == semKey: // semaphores counts them
		case r.F == fAcquire && r.Type == typeOK:
			c.r.Stats.AcquireOK++
		case r.F == fAcquire && r.Type == typeFail && strings.HasPrefix(r.Err, pglock.ErrNotAcquired.Error()):
			c.r.Stats.AcquireBusy++
		case r.F == fAcquire && r.Type == typeFail:
			c.r.Stats.AcquireErr++
		case r.F == fRelease && r.Type == typeOK:
			c.r.Stats.ReleaseOK++
		case r.F == fRelease && r.Type == typeFail:
			c.r.Stats.ReleaseLost++
		case r.F == fLead:
			c.r.Stats.LeaderTerms++
		case r.F == string(pglock.EventLost):
			c.r.Stats.LostSignals[r.Reason]++
		}
	}
}

// applied returns the database's accepted writes to table, by key, in commit order.
func (c *checker) applied(table string) (map[string][]WriteRow, []string) {
	byKey := map[string][]WriteRow{}
	for _, w := range c.h.Writes {
		if w.Table == table {
			byKey[w.Key] = append(byKey[w.Key], w)
		}
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return byKey, keys
}

// completion returns the completion record of op's function f (the last one that is
// not an invoke), if the client wrote one.
func (c *checker) completion(op, f string) (Record, bool) {
	rs := c.ops[op]
	for i := len(rs) - 1; i >= 0; i-- {
		if rs[i].F == f && rs[i].Type != typeInvoke {
			return rs[i], true
		}
	}
	return Record{}, false
}

// counters checks invariant 1 on the fenced tables and measures invariant 6's lost
// updates on the unfenced one.
func (c *checker) counters() {
	for _, table := range counterTables {
		st := &TableStats{}
		c.r.Stats.Tables[table] = st
		fenced := table != tableUnfenced
		byKey, keys := c.applied(table)
		inDB := map[string]bool{}
		for _, k := range keys {
			ws := byKey[k]
			st.Applied += len(ws)
			stale := int64(0) // what writes built on reads a failover lost added beyond 1 each
			for i, w := range ws {
				inDB[w.Op] = true
				if w.New != w.Old+1 && fenced && c.staleRead(w) {
					c.r.Stats.Failover.StaleReads++
					stale += w.New - w.Old - 1
				} else if w.New != w.Old+1 && fenced {
					c.r.violate(invCounters, "%s[%s]: op %s wrote %d over %d (token %d): a lost update", table, k, w.Op, w.New, w.Old, w.NewToken)
				}
				if i > 0 && w.NewToken < ws[i-1].NewToken && fenced {
					c.r.violate(invCounters, "%s[%s]: op %s wrote token %d after %d: the token went back", table, k, w.Op, w.NewToken, ws[i-1].NewToken)
				}
				if r, ok := c.completion(w.Op, fWrite); ok && r.Type == typeFail {
					c.r.violate(invCounters, "%s[%s]: op %s was refused by the database as the client saw it, yet applied", table, k, w.Op)
				}
			}
			final := c.h.Final[table][k]
			switch {
			case !fenced:
				c.r.Stats.LostUpdates += len(ws) - int(final)
			case final != int64(len(ws))+stale:
				c.r.violate(invCounters, "%s[%s] = %d after %d accepted writes", table, k, final, len(ws))
			}
		}
		for _, r := range c.h.Records {
			if r.Table != table {
				continue
			}
			switch {
			case r.F == fRead && r.Type == typeFail:
				st.ClaimRefused++
			case r.F == fWrite && r.Type == typeOK:
				st.OK++
				if !inDB[r.Op] && c.lossOf(r.Local) != nil {
					c.r.Stats.Failover.WritesLost++
				} else if !inDB[r.Op] {
					c.r.violate(invCounters, "%s[%s]: op %s (token %d) was acknowledged but is not in the database", table, r.Key, r.Op, r.Token)
				}
			case r.F == fWrite && r.Type == typeFail:
				st.Refused++
			case r.F == fWrite && r.Type == typeUnknown:
				st.Unknown++
			}
		}
		for _, k := range slices.Sorted(maps.Keys(c.h.Final[table])) {
			if len(byKey[k]) == 0 && c.h.Final[table][k] != 0 {
				c.r.violate(invCounters, "%s[%s] = %d with no write logged", table, k, c.h.Final[table][k])
			}
		}
	}
	if c.r.Stats.LostUpdates <= 0 {
		c.r.violate(invBlind, "the unfenced table lost no update (%d applied writes): the pauses never hit a critical section, so this run could not have seen a broken fence either",
			c.r.Stats.Tables[tableUnfenced].Applied)
	}
}

// overlaps checks invariant 2: on each fenced table, every accepted write's critical
// section (from its read, or claim, to its write, on the database clock) starts after
// the previous accepted write of the key; and a key's leases never overlap (the
// leader's and the job's count for invariants 4 and 5). The unfenced table's overlaps
// are counted, not violations.
func (c *checker) overlaps() {
	for _, table := range counterTables {
		byKey, keys := c.applied(table)
		for _, k := range keys {
			ws := byKey[k]
			for i, w := range ws {
				read, ok := c.completion(w.Op, fRead)
				if !ok || read.Type != typeOK {
					if table != tableUnfenced {
						c.r.violate(invOverlap, "%s[%s]: op %s was applied but its read is not in the history", table, k, w.Op)
					}
					continue
				}
				if i == 0 || read.DB.After(ws[i-1].At) {
					continue
				}
				if table == tableUnfenced {
					c.r.Stats.UnfencedOverlaps++
					continue
				}
				c.r.violate(invOverlap, "%s[%s]: op %s (token %d) read at %s, before op %s (token %d) wrote at %s",
					table, k, w.Op, w.NewToken, stamp(read.DB), ws[i-1].Op, ws[i-1].NewToken, stamp(ws[i-1].At))
			}
		}
	}
	for _, key := range slices.Sorted(maps.Keys(c.leases)) {
		ls := c.leases[key]
		inv := invOverlap
		switch key {
		case leaderKey:
			inv = invLeader
		case jobLeaseKey:
			inv = invJob
		}
		for i := 1; i < len(ls); i++ {
			if ls[i].token <= ls[i-1].token {
				c.r.violate(invCounters, "lease %q: token %d granted after token %d: the fencing token went back", key, ls[i].token, ls[i-1].token)
			}
			if ls[i].start.Before(ls[i-1].end()) {
				c.r.violate(inv, "lease %q: token %d (%s) from %s while token %d (%s) was live until %s",
					key, ls[i].token, ls[i].worker, stamp(ls[i].start), ls[i-1].token, ls[i-1].worker, stamp(ls[i-1].end()))
			}
		}
	}
	for _, r := range c.h.Records {
		if r.Type == typeEvent && r.F == string(pglock.EventAcquired) && c.byToken[keyToken{r.Key, r.Token}] == nil {
			c.r.violate(invOverlap, "%s acquired %q with token %d, which the database never granted", r.Worker, r.Key, r.Token)
		}
	}
}

// sections checks the WithLock part of invariant 2: a section runs, on the worker's
// clock (the machine's, as the database's), from its fn's start to its return, after
// its ctx was cancelled too; its lock must not be handed back before that. An expired
// lock is invariant 3's: only the fences stop a section that outlives its lease.
func (c *checker) sections() {
	cancelled := map[workerToken]Record{}
	for _, r := range c.h.Records {
		if r.F == fCancel {
			c.r.Stats.SectionCancels[r.Reason]++
			cancelled[workerToken{r.Worker, r.Token}] = r
		}
	}
	for _, r := range c.h.Records {
		if r.F != fSection || r.Type != typeOK {
			continue
		}
		c.r.Stats.Sections++
		if cr, ok := cancelled[workerToken{r.Worker, r.Token}]; ok && cr.Reason == cancelClosed {
			c.r.Stats.SectionTail = max(c.r.Stats.SectionTail, r.Local.Sub(cr.Local))
		}
		l := c.byToken[keyToken{r.Key, r.Token}]
		if l == nil || l.released.IsZero() || !l.released.Before(l.expires) || !r.Local.After(l.released) {
			continue // overlaps reports a token never granted
		}
		next := ""
		for _, n := range c.leases[r.Key] {
			if n.start.After(l.start) && n.start.Before(r.Local) {
				next = fmt.Sprintf("; token %d (%s) held the key from %s", n.token, n.worker, stamp(n.start))
				break
			}
		}
		c.r.violate(invOverlap, "%s's WithLock section on %q (token %d) ran until %s, %v after its lock was handed back at %s%s",
			r.Worker, r.Key, r.Token, stamp(r.Local), r.Local.Sub(l.released).Round(time.Microsecond), stamp(l.released), next)
	}
}

// signals checks invariant 3: a lease that expired (rather than being released) while
// the client that knew it held it was running must have been signalled lost, or let go
// (a Release call, whatever its outcome), by its expiry plus the slack. For the locks a
// worker took itself (watched), the signal is the cancellation of the lock's Context,
// which the worker records; for the election's and the job's, the first sign of any.
func (c *checker) signals() {
	acquired, signal, ctxLost, releasing := c.told.acquired, c.told.signal, c.told.ctxLost, c.told.releasing
	for _, key := range slices.Sorted(maps.Keys(c.leases)) {
		for _, l := range c.leases[key] {
			k := workerToken{l.worker, l.token}
			known, ok := acquired[k]
			if !ok || l.end().Before(l.expires) {
				continue // unknown to its client, or handed back live
			}
			// Due by the expiry, or at once when the acquisition's reply came after it (a
			// partition held it back): a client cannot be told before it knows. When an
			// asynchronous failover lost a renewal its client was told of, the client
			// believes past the expiry in the log: due by its bound (failover_check.go).
			e := l.expires
			if known.After(e) {
				e = known
			}
			if l.cut != nil && l.bound.After(e) {
				e = l.bound
				c.r.Stats.Failover.RenewalsLost++
			}
			if !c.alive(l.worker, e, e.Add(c.slack)) {
				continue // killed, or shut down, before it could notice
			}
			if c.stoppedAt(l.worker, e.Add(-c.slack), e) {
				c.r.Stats.PausedHolders++
				continue
			}
			s, ok := signal[k]
			if watched(key) {
				s, ok = ctxLost[k]
			}
			if rel, let := releasing[k]; let && (!ok || rel.Before(s)) {
				if !rel.After(e.Add(c.slack)) {
					continue // it let go (a release that failed, or came too late) in time
				}
				s, ok = rel, true // it held on past the expiry: its release is the first sign of the loss
			}
			switch {
			case !ok && watched(key) && !signal[k].IsZero():
				c.r.violate(invSignal, "%s's lock %q (token %d) was lost (signalled at %s) without its Context being cancelled with a *LockLostError",
					l.worker, key, l.token, stamp(signal[k]))
				continue
			case !ok && c.stoppedForGood(l.worker, e, e.Add(c.slack)):
				c.r.Stats.PausedHolders++
				continue
			case !ok:
				c.r.violate(invSignal, "%s never noticed that its lease %q (token %d) expired (due by %s)", l.worker, key, l.token, stamp(e))
				continue
			}
			c.r.Stats.Lateness = append(c.r.Stats.Lateness, s.Sub(e))
			// Later than the slack because the worker did not run (its stall watch ran
			// late from before the expiry to the signal): the machine's doing.
			if down := overlap(c.stalled[l.worker], e.Add(-c.slack), s); s.After(e.Add(c.slack)) && !s.After(e.Add(c.slack+down)) {
				c.r.Stats.LateStalled++
				c.r.excuse("(3) %s was told at %s that its lease %q (token %d) was lost, %v after it was due (by %s): it did not run for %v of that time",
					l.worker, stamp(s), key, l.token, s.Sub(e).Round(time.Microsecond), stamp(e), down.Round(time.Millisecond))
				continue
			}
			if s.After(e.Add(c.slack)) {
				c.r.violate(invSignal, "%s was told at %s that its lease %q (token %d) was lost, %v after it was due (by %s)",
					l.worker, stamp(s), key, l.token, s.Sub(e).Round(time.Microsecond), stamp(e))
			}
		}
	}
}

// toldIndex says, per worker and token, when the client learned that it held a lease
// (its acquired event), and the first signs that it no longer did: a loss signalled
// (any sign; and the lock's Context cancelled with a *LockLostError), or a Release
// called (the last such call; for the election's lease, its first step-down at Close or
// Resign, whose hand-back is the client's own and may land late or not at all).
type toldIndex struct {
	acquired, signal, ctxLost, releasing map[workerToken]time.Time
}

func (c *checker) indexTold() {
	t := toldIndex{acquired: map[workerToken]time.Time{}, signal: map[workerToken]time.Time{},
		ctxLost: map[workerToken]time.Time{}, releasing: map[workerToken]time.Time{}}
	first := func(m map[workerToken]time.Time, k workerToken, at time.Time) {
		if s, ok := m[k]; !ok || at.Before(s) {
			m[k] = at
		}
	}
	for _, r := range c.h.Records {
		k := workerToken{r.Worker, r.Token}
		switch {
		case r.Type == typeEvent && r.F == string(pglock.EventAcquired):
			t.acquired[k] = r.Local
		case r.F == string(pglock.EventLost):
			first(t.signal, k, r.Local)
		case r.F == fCtxLost:
			first(t.ctxLost, k, r.Local)
			first(t.signal, k, r.Local)
		case r.F == fUnlead && strings.Contains(r.Reason, "lost"):
			first(t.signal, k, r.Local)
		case r.F == fUnlead: // Close or Resign: it stepped down, as a Release call lets go
			first(t.releasing, k, r.Local)
		case r.F == fRelease && r.Type == typeInvoke:
			t.releasing[k] = r.Local
		}
	}
	c.told = t
}

// gaveUp returns when worker stopped believing that it held key's lease of token: the
// first sign of its loss (for the locks it took itself, its Context's cancellation), or
// its Release call when that came first.
func (c *checker) gaveUp(worker, key string, token int64) (time.Time, bool) {
	k := workerToken{worker, token}
	s, ok := c.told.signal[k]
	if watched(key) {
		s, ok = c.told.ctxLost[k]
	}
	if rel, let := c.told.releasing[k]; let && (!ok || rel.Before(s)) {
		return rel, true
	}
	return s, ok
}

// watched reports whether the worker records the cancellation of key's locks' Context:
// every lock it takes itself, not the election's, the job's nor its slots' jobs'.
func watched(key string) bool {
	return key != leaderKey && key != jobLeaseKey && !strings.HasPrefix(key, slotOnceKey+":slot:") &&
		!strings.HasPrefix(key, slotAtLeastKey+":slot:")
}

// term is one leadership as its leader saw it.
type term struct {
	worker     string
	token      int64
	start, end time.Time
}

// leader checks invariant 4: OnLost only after OnAcquired, once, on the same worker;
// and no two running leaders believing they lead at the same time beyond the slack (a
// paused leader's belief counts only until its lease's expiry: that is what no lease
// can prevent, and what fencing is for).
func (c *checker) leader() {
	var terms []term
	for _, w := range slices.Sorted(maps.Keys(c.recs)) {
		open := map[int64]*term{}
		lost := map[int64]int{}
		var mine []*term
		for _, r := range c.recs[w] {
			if r.Key != leaderKey {
				continue
			}
			switch r.F {
			case fLead:
				t := &term{worker: w, token: r.Token, start: r.Local}
				open[r.Token] = t
				mine = append(mine, t)
			case fUnlead:
				if t := open[r.Token]; t != nil && t.end.IsZero() {
					t.end = r.Local
				}
			case fOnLost:
				if open[r.Token] == nil {
					c.r.violate(invLeader, "%s: OnLost for token %d without OnAcquired", w, r.Token)
				}
				if lost[r.Token]++; lost[r.Token] == 2 {
					c.r.violate(invLeader, "%s: OnLost twice for token %d", w, r.Token)
				}
			}
		}
		for _, t := range mine {
			if t.end.IsZero() { // the process died leading
				t.end = c.lives[w].End
			}
			if l := c.byToken[keyToken{leaderKey, t.token}]; l != nil && t.end.After(l.end()) &&
				c.stoppedAt(w, l.end().Add(-c.slack), l.end()) {
				c.r.Stats.LeaderPausedExcess = max(c.r.Stats.LeaderPausedExcess, t.end.Sub(l.end()))
				t.end = l.end()
			}
			terms = append(terms, *t)
		}
	}
	slices.SortFunc(terms, func(a, b term) int { return a.start.Compare(b.start) })
	for i, t := range terms {
		for _, u := range terms[:i] {
			if d := minTime(t.end, u.end).Sub(t.start); d > c.slack && u.worker != t.worker {
				if c.failoverAllows(leaderKey, u.token, minTime(t.end, u.end)) {
					c.r.Stats.Failover.LeaderOverlaps++
					continue
				}
				c.r.violate(invLeader, "%s (token %d) and %s (token %d) both led for %v from %s",
					u.worker, u.token, t.worker, t.token, d.Round(time.Microsecond), stamp(t.start))
			}
		}
	}
}

// cutOffInRun reports whether tick run r, begun under live lease l, lost l to a fault:
// l expired (it was not released) before the tick's last run began at lastRun, a fault
// hit r's worker or the server between r and l's expiry, and the worker was told of the
// loss (its ctx cancelled, or EventLost) by lastRun.
func (c *checker) cutOffInRun(r Record, l *lease, lastRun time.Time) bool {
	if !l.end().Equal(l.expires) || !l.expires.Before(lastRun) || !c.faulted(r.Worker, r.Local, l.expires, allFaults...) {
		return false
	}
	return slices.ContainsFunc(c.recs[r.Worker], func(e Record) bool {
		return (e.F == fCtxLost || e.F == string(pglock.EventLost)) && e.Token == l.token && !e.Local.After(lastRun)
	})
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// job checks invariant 5: in the database, no tick was recorded twice and the job's
// tokens never went back; on the clients, a tick ran on two workers only when all but
// one were owners whose lease had expired while they were paused, or whose lease a
// fault let expire during their run, and who were told before the last run began
// (cutOffInRun).
func (c *checker) job() {
	byKey, _ := c.applied(tableJob)
	seen := map[int64]string{}
	var last int64
	for _, w := range byKey["tick"] {
		if op, ok := seen[w.New]; ok {
			c.r.violate(invJob, "tick %d was recorded twice: ops %s and %s", w.New, op, w.Op)
		}
		seen[w.New] = w.Op
		if w.NewToken < last {
			c.r.violate(invJob, "tick %d: op %s wrote token %d after %d", w.New, w.Op, w.NewToken, last)
		}
		last = max(last, w.NewToken)
	}
	runs := map[int64][]Record{}
	for _, r := range c.h.Records {
		if r.F == fTick && r.Type == typeInvoke {
			c.r.Stats.TickRuns++
			runs[r.Wrote] = append(runs[r.Wrote], r)
		}
	}
	c.tickSkips(runs)
	for _, n := range slices.Sorted(maps.Keys(runs)) {
		rs := runs[n]
		lastRun := slices.MaxFunc(rs, func(a, b Record) int { return a.Local.Compare(b.Local) }).Local
		live, cut := 0, 0 // cut: live on the old primary, on a lease a failover lost
		cutOff := 0       // live, then cut off by a fault and told so before the last run began
		for _, r := range rs {
			l := c.byToken[keyToken{jobLeaseKey, r.Token}]
			switch {
			case l == nil:
				c.r.violate(invJob, "%s ran tick %d under token %d, which the database never granted", r.Worker, n, r.Token)
			case c.liveAt(l, r.Local):
				live++
				if c.failoverAllows(jobLeaseKey, r.Token, r.Local) {
					cut++
				} else if c.cutOffInRun(r, l, lastRun) {
					cutOff++
				}
			case c.failoverAllows(jobLeaseKey, r.Token, r.Local):
				c.r.Stats.Failover.Ticks++
			case c.stoppedAt(r.Worker, l.end().Add(-c.slack), r.Local):
				c.r.Stats.TickZombies++
			case len(rs) > 1:
				c.r.violate(invJob, "%s ran tick %d at %s, after its lease (token %d) expired at %s, without a pause", r.Worker, n, stamp(r.Local), r.Token, stamp(l.end()))
			}
		}
		switch {
		case live > 1 && live-cut-cutOff <= 1:
			// The run on the old primary under a lease an asynchronous failover lost (its
			// acquisition or a renewal), and the tick again on the new primary, which
			// lacks that run's lease: what the failover allows (README, "Asynchronous
			// replication"). Or a run whose lease a fault let expire under it (the
			// server down for longer than the ttl: a failover's outage), whose ctx was
			// cancelled before another worker, whose own run had been held up by the same
			// outage, took the lease and ran the tick: leases never overlapped, and the
			// first run knew it had lost before the second began.
			c.r.Stats.Failover.Ticks += cut
			c.r.Stats.TickCutOff += cutOff
		case live > 1:
			c.r.violate(invJob, "tick %d ran on %d workers with live leases", n, live)
		}
	}
}

// tickSkips counts the job's skipped ticks by reason, each skip matched to the
// EventJobSkipped emitted during its Run call on its worker ("unknown" when none was
// recorded: a dropped event, a worker killed first), and the ticks that no worker ran
// (runs: the ticks run, by tick), from the first tick a worker reached to the last:
// a skip as lease-in-doubt among a tick's is what the lease's rule cost (a tick its
// owner would have run on a lease it could not vouch for).
func (c *checker) tickSkips(runs map[int64][]Record) {
	st := &c.r.Stats
	st.TickSkips = map[string]int{}
	reasons := map[int64][]string{} // by tick
	var first, last int64
	reached := func(n int64) {
		if first == 0 || n < first {
			first = n
		}
		last = max(last, n)
	}
	for n := range runs {
		reached(n)
	}
	for _, recs := range c.recs {
		var events []Record
		for _, r := range recs {
			if r.F == fSkipped && r.Key == jobKey {
				events = append(events, r)
			}
		}
		for _, r := range recs {
			if r.F != fSkip {
				continue
			}
			reached(r.Wrote)
			reason := "unknown"
			if i := slices.IndexFunc(events, func(e Record) bool { return !e.Local.Before(r.Start) && !e.Local.After(r.Local) }); i >= 0 {
				reason = events[i].Reason
			}
			st.TickSkips[reason]++
			reasons[r.Wrote] = append(reasons[r.Wrote], reason)
		}
	}
	for n := first; first != 0 && n <= last; n++ {
		if len(runs[n]) > 0 {
			continue
		}
		st.TicksNowhere++
		if slices.Contains(reasons[n], string(pglock.SkipLeaseInDoubt)) {
			st.TicksNowhereInDoubt++
		}
	}
}

// longTxs checks invariant 7: while a worker kept a fenced transaction open past the
// ttl on one lock, neither that lock nor the other it held was lost, unless a fault hit
// the worker (or the server) from a ttl before to the end, or the evidence shows that
// the machine kept the renewal from being sent or answered in time (lossVerdict). The
// database's renewals of the fenced lock while the transaction was open are counted.
func (c *checker) longTxs() {
	type episode struct {
		worker     string
		locks      []keyToken
		start, end time.Time
	}
	episodes := map[string]*episode{}
	lost := map[workerToken]Record{}
	for _, r := range c.h.Records {
		switch {
		case r.F == fLongTx && r.Type == typeInvoke:
			e := episodes[r.Op]
			if e == nil {
				e = &episode{worker: r.Worker, start: r.Local}
				episodes[r.Op] = e
			}
			e.locks = append(e.locks, keyToken{r.Key, r.Token})
		case r.F == fLongTx && r.Type == typeOK:
			if e := episodes[r.Op]; e != nil {
				e.end = r.Local
			}
		case r.F == fCtxLost || r.F == string(pglock.EventLost):
			k := workerToken{r.Worker, r.Token}
			if p, ok := lost[k]; !ok || r.Local.Before(p.Local) {
				lost[k] = r
			}
		}
	}
	for _, op := range slices.Sorted(maps.Keys(episodes)) {
		e := episodes[op]
		if e.end.IsZero() {
			continue // its worker died in it
		}
		c.r.Stats.LongTxs++
		if l := c.byToken[e.locks[0]]; l != nil && slices.ContainsFunc(l.renewals, func(t time.Time) bool {
			return t.After(e.start) && t.Before(e.end)
		}) {
			c.r.Stats.LongTxsRenewed++
		}
		if c.faulted(e.worker, e.start.Add(-c.h.Config.TTL), e.end, allFaults...) {
			c.r.Stats.LongTxsExcused++
			continue
		}
		starved := false
		for i, kt := range e.locks {
			r, ok := lost[workerToken{e.worker, kt.token}]
			l := c.byToken[kt]
			if !ok || l == nil || r.Local.Before(e.start) {
				continue // kept, or lost before the transaction began (while the worker waited for its key)
			}
			excused, why := c.lossVerdict(e.worker, l, r.Local)
			if excused {
				starved = true
				c.r.excuse("(7) %s lost %q (token %d) at %s under its fenced transaction on %q: %s",
					e.worker, kt.key, kt.token, stamp(r.Local), e.locks[0].key, why)
				continue
			}
			which := "its other lock"
			if i == 0 {
				which = "the transaction's own lock"
			}
			c.r.violate(invRenew, "%s lost %s %q (token %d) at %s (%s) while its fenced transaction on %q stayed open (%s to %s), with no fault on it: %s",
				e.worker, which, kt.key, kt.token, stamp(r.Local), r.F, e.locks[0].key, stamp(e.start), stamp(e.end), why)
		}
		if starved {
			c.r.Stats.LongTxsStarved++
		}
	}
}

// ghosts checks invariant 8: a lease that no client learned it held (an acquisition
// whose ctx ended while its statement was in flight, or whose reply came too late) must
// be handed back by the client, in the background, rather than hold the key until it
// expires; unless its worker died, or was paused, cut off, killed, stopped or lost its
// backends (or the server restarted) before it could, or the server was killed soon
// after its hand-back (handBackLostWithTheServer), or the evidence shows that the
// machine kept the hand-back from running (ghostVerdict). A slow link is no excuse.
func (c *checker) ghosts() {
	known := map[workerToken]bool{}
	for _, r := range c.h.Records {
		if (r.Type == typeEvent && r.F == string(pglock.EventAcquired)) || (r.F == fProbe && r.Type == typeOK) {
			known[workerToken{r.Worker, r.Token}] = true
		}
		if r.F == fProbe {
			switch {
			case r.Type == typeOK:
				c.r.Stats.Probes[0]++
			case r.Type == typeFail && strings.HasPrefix(r.Err, pglock.ErrNotAcquired.Error()):
				c.r.Stats.Probes[1]++
			case r.Type == typeFail:
				c.r.Stats.Probes[2]++
			}
		}
	}
	for _, key := range slices.Sorted(maps.Keys(c.leases)) {
		for _, l := range c.leases[key] {
			if known[workerToken{l.worker, l.token}] {
				continue
			}
			c.r.Stats.Ghosts++
			c.r.Stats.GhostTime = append(c.r.Stats.GhostTime, l.end().Sub(l.start))
			if l.end().Before(l.expires) {
				continue // handed back
			}
			c.r.Stats.GhostsExpired++
			if !c.alive(l.worker, l.start, l.expires) ||
				c.faulted(l.worker, l.start.Add(-c.h.Config.TTL), l.expires, faultPause, faultPartition, faultKill, faultStop, faultTerminate, faultRestart, faultFailover) {
				c.r.Stats.GhostsExcused++
				continue
			}
			if c.handBackLostWithTheServer(l) {
				c.r.Stats.GhostsExcused++
				continue
			}
			excused, why := c.ghostVerdict(l)
			if excused {
				c.r.Stats.GhostsStarved++
				c.r.excuse("(8) %q granted to %s (token %d), a ghost until it expired: %s", key, l.owner, l.token, why)
				continue
			}
			c.r.violate(invGhost, "%q was granted to %s (token %d) at %s, which never knew it held it nor handed it back: a ghost held the key until it expired at %s: %s",
				key, l.owner, l.token, stamp(l.start), stamp(l.expires), why)
		}
	}
}

// asyncReleaseLoss is how long before a server's kill an acknowledged release may still
// be lost with it: a release commits asynchronously, on purpose, and PostgreSQL flushes
// such commits within three wal_writer_delay periods (600 ms by default) when its WAL
// writer gets to run, later on a loaded machine.
const asyncReleaseLoss = 2 * time.Second

// handBackLostWithTheServer reports whether l's hand-back was answered before l expired
// and a restart or failover killed the server at most asyncReleaseLoss after: the
// release may have been lost with the old server's WAL, and the key then stays held
// until its expiry, as with any release that a crash loses (an asynchronous failover
// run's ghost, in a fresh-clone CI run: answered 1 s before its expiry, the server
// killed about then). Or an asynchronous failover lost it with the rest of what the old
// primary acknowledged after the point the new one kept (lossOf), however long before
// the kill: in another such run, a hand-back answered 41 ms after that point, 3.1 s
// before the kill.
func (c *checker) handBackLostWithTheServer(l *lease) bool {
	for _, r := range c.calls[l.worker] {
		release := r.Reason == "lock_release_async" || r.Reason == "sem_release" || r.Reason == "lock_release_many"
		if !release || r.Err != "" || !callHas(r, l.key, l.owner) || !r.Local.Before(l.expires) {
			continue
		}
		if c.lossOf(r.Local) != nil {
			return true
		}
		for _, f := range c.faults[""] {
			if (f.Kind == faultRestart || f.Kind == faultFailover) && !f.Start.Before(r.Local) && f.Start.Sub(r.Local) <= asyncReleaseLoss {
				return true
			}
		}
	}
	return false
}

// handovers measures how long a key stayed without a holder: from a release to the
// next acquisition by a waiter that was already waiting, and from a kill to the next
// acquisition of what the killed worker held.
func (c *checker) handovers() {
	waitingSince := map[workerToken]time.Time{}
	for _, r := range c.h.Records {
		if r.F == fAcquire && r.Type == typeOK {
			waitingSince[workerToken{r.Worker, r.Token}] = r.Start
		}
	}
	hs := c.r.Stats.Handover
	for key, ls := range c.leases {
		if !strings.HasPrefix(key, "k") {
			continue
		}
		for i := 1; i < len(ls); i++ {
			prev, next := ls[i-1], ls[i]
			since, ok := waitingSince[workerToken{next.worker, next.token}]
			if prev.released.IsZero() || !prev.released.Before(prev.expires) || !ok || !since.Before(prev.released) {
				continue
			}
			hs[handoverRelease] = append(hs[handoverRelease], next.start.Sub(prev.released))
		}
	}
	for _, f := range c.h.Faults {
		if f.Kind != faultKill {
			continue
		}
		for key, ls := range c.leases {
			for i, l := range ls {
				if l.worker != f.Target || l.start.After(f.Start) || !l.end().After(f.Start) || i+1 == len(ls) {
					continue
				}
				next := ls[i+1]
				switch {
				case key == leaderKey:
					hs[handoverKillLeader] = append(hs[handoverKillLeader], next.start.Sub(f.Start))
				case key == jobLeaseKey:
					hs[handoverKillJob] = append(hs[handoverKillJob], next.start.Sub(f.Start))
				default:
					if since, ok := waitingSince[workerToken{next.worker, next.token}]; ok && since.Before(l.end()) {
						hs[handoverKillLock] = append(hs[handoverKillLock], next.start.Sub(f.Start))
					}
				}
			}
		}
	}
}

func stamp(t time.Time) string { return t.Format("15:04:05.000000") }

// percentile returns the p-th percentile (0..100) of ds by the nearest rank.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.SortFunc(s, cmp.Compare)
	i := int(p/100*float64(len(s))+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}
