package main

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// The evidence the workers and the controller record about the machine and about
// pglock's own calls (see trace.go), which the checker weighs before it blames pglock
// for a lock lost under a fenced transaction (invariant 7) or a ghost (invariant 8). A
// loss is excused only when the evidence shows that the machine, not pglock, made it:
// the process whose timers had to act (the worker) or the link (the controller, which
// runs every worker's proxy) did not run, or the server's commits waited on the disk
// (the WAL, a page, a file's extension) or on a synchronous standby, for most of the
// time in which pglock had to act. Anything else is a
// violation, and its detail says what the calls did.

// span is an interval of time.
type span struct{ from, to time.Time }

// overlap returns how much of [from, to] the spans cover (they do not overlap each
// other: see union).
func overlap(spans []span, from, to time.Time) time.Duration {
	var d time.Duration
	for _, s := range spans {
		a, b := maxTime(s.from, from), minTime(s.to, to)
		if b.After(a) {
			d += b.Sub(a)
		}
	}
	return d
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// indexEvidence builds the stalls of each worker and of the controller ("") and the
// pglock calls of each worker.
func (c *checker) indexEvidence() {
	c.stalled = map[string][]span{}
	c.calls = map[string][]Record{}
	c.renewals = map[string][]Record{}
	for _, r := range c.h.Records {
		switch r.F {
		case fStall:
			c.stalled[r.Worker] = append(c.stalled[r.Worker], span{r.Start, r.Local})
		case fCall:
			c.calls[r.Worker] = append(c.calls[r.Worker], r)
		case fRenewal:
			c.renewals[r.Worker] = append(c.renewals[r.Worker], r)
		}
	}
	for _, s := range c.h.Stalls {
		who := ""
		if s.Server {
			who = serverStalls
		}
		c.stalled[who] = append(c.stalled[who], span{s.Due, s.Ran})
	}
	c.waits = map[string][]Wait{}
	c.onDiskAt = map[int32][]time.Time{}
	for _, w := range c.h.Waits {
		c.waits[w.Worker] = append(c.waits[w.Worker], w)
		if onDisk(w) {
			c.onDiskAt[w.PID] = append(c.onDiskAt[w.PID], w.At)
		}
	}
}

// serverStalls is the key of the server's stalls (Stall.Server) in checker.stalled, beside
// the workers' and the controller's ("").
const serverStalls = "(server)"

// leaseCalls are the functions whose statements carry a worker's leases to the
// database: its acquisitions (lock_acquire_or_want among them) and its renewals. A
// lease's deadline counts from the send of the last of them that the database applied.
var leaseCalls = []string{"lock_acquire", "sem_acquire", "lock_renew"}

// onDisk reports whether a sampled wait is on the server's disk or on its synchronous
// standby: any I/O (IO: writing or flushing the WAL, reading a page); the WAL's internal
// locks (LWLock WAL*); a page held by a backend that waits on the same
// (LWLock/BufferContent: held for one page access, never across a round trip to a
// client); a table file's extension (Lock/extend); or the standby's confirmation of a
// commit (IPC/SyncRep). None is a lock that pglock holds for a client.
func onDisk(w Wait) bool {
	switch w.Type {
	case "IO":
		return true
	case "LWLock":
		return strings.HasPrefix(w.Event, "WAL") || w.Event == "BufferContent"
	case "Lock":
		return w.Event == "extend"
	case "IPC":
		return w.Event == "SyncRep"
	}
	return false
}

// isRowLock reports whether a sampled wait is on another transaction's row lock (a
// tuple's lock, or the end of the transaction that holds the row).
func isRowLock(w Wait) bool {
	return w.Type == "Lock" && (w.Event == "tuple" || w.Event == "transactionid")
}

// behindDisk reports whether a row-lock wait's blockers were all seen waiting on the
// disk in the same sample (within waitSample of it): a transaction that holds the row
// while its commit waits for the WAL flush or the standby holds it for the disk's sake.
// A blocker that is idle in its transaction (a fenced transaction, a client that
// paused) is never sampled, so its row lock stays pglock's.
func (c *checker) behindDisk(w Wait) bool {
	if len(w.Blockers) == 0 {
		return false
	}
	for _, pid := range w.Blockers {
		if !slices.ContainsFunc(c.onDiskAt[pid], func(t time.Time) bool {
			d := t.Sub(w.At)
			return d > -waitSample && d < waitSample
		}) {
			return false
		}
	}
	return true
}

// machineDown returns how much of [from, to] the machine held pglock up: the worker or
// the controller did not run (their stall watches' timers ran late), the server did not
// answer (the controller's ping, watchServer, came back late), or the server kept
// the worker's statements calling one of fns waiting on the disk or the synchronous
// standby (onDisk: a commit waits for its flush, and for the standby's); and it says
// which, for a detail.
func (c *checker) machineDown(worker string, fns []string, from, to time.Time, connecting ...span) (time.Duration, string) {
	walSpans := c.diskWaits(worker, fns)
	w, ctl, wal := overlap(c.stalled[worker], from, to), overlap(c.stalled[""], from, to), overlap(walSpans, from, to)
	srv := overlap(union(c.stalled[serverStalls]), from, to)
	// A call needs all of them (the worker, its link, the server's flush, and a
	// connection when its pool has none to spare) to move on: the time any of them was
	// down held it up.
	var all []span
	for _, ss := range [][]span{c.stalled[worker], c.stalled[""], c.stalled[serverStalls], walSpans, connecting} {
		for _, s := range ss {
			if s.to.After(from) && s.from.Before(to) {
				all = append(all, s)
			}
		}
	}
	why := fmt.Sprintf("%s did not run for %v of it, the controller (its proxy) for %v, the server (a ping's answer late) for %v; its %s statements waited on the disk or the standby for %v",
		worker, w.Round(time.Millisecond), ctl.Round(time.Millisecond), srv.Round(time.Millisecond), strings.Join(fns, ", "), wal.Round(time.Millisecond))
	if len(connecting) > 0 {
		why += fmt.Sprintf("; the server took over %v to open a connection for %v of it", slowConnect, overlap(union(connecting), from, to).Round(time.Millisecond))
	}
	return overlap(union(all), from, to), why
}

// slowConnect is how long a new connection may take to open (TCP, start-up,
// authentication, a backend forked) before the server counts as down meanwhile: on this
// machine it takes a few milliseconds; seconds is a server starved of CPU.
const slowConnect = 250 * time.Millisecond

// slowConnects returns the spans in which worker's pool waited over slowConnect for a
// new connection while no fault of its own link or process slowed it (partition, delay,
// slow, restart and failover are pglock's to ride out): a call that found every
// connection busy waited for the server then.
func (c *checker) slowConnects(worker string) []span {
	var out []span
	for _, r := range c.calls[worker] {
		if r.Reason == callConnect && r.Local.Sub(r.Start) > slowConnect &&
			!c.faulted(worker, r.Start, r.Local, faultPartition, faultDelay, faultSlow, faultRestart, faultFailover) {
			out = append(out, span{r.Start.Add(slowConnect), r.Local})
		}
	}
	return union(out)
}

// diskWaits returns, for each statement of worker calling one of fns that the
// controller saw waiting on the disk or the standby (onDisk, or a row lock behind such a
// wait), the span from its first such sample to its last plus the sampling period.
func (c *checker) diskWaits(worker string, fns []string) []span {
	type stmt struct {
		pid   int32
		since time.Time
	}
	spans := map[stmt]*span{}
	var order []stmt
	for _, w := range c.waits[worker] {
		if !slices.ContainsFunc(fns, func(fn string) bool { return strings.Contains(w.Query, "pglock."+fn) }) ||
			!onDisk(w) && !(isRowLock(w) && c.behindDisk(w)) {
			continue
		}
		k := stmt{w.PID, w.Since}
		if s := spans[k]; s != nil {
			s.to = w.At.Add(waitSample)
			continue
		}
		spans[k] = &span{w.At, w.At.Add(waitSample)}
		order = append(order, k)
	}
	out := make([]span, 0, len(order))
	for _, k := range order {
		out = append(out, *spans[k])
	}
	return union(out) // statements of one worker can wait side by side
}

// union returns spans merged where they overlap, in order.
func union(spans []span) []span {
	spans = slices.Clone(spans)
	slices.SortFunc(spans, func(a, b span) int { return a.from.Compare(b.from) })
	merged := spans[:0]
	for _, s := range spans {
		if n := len(merged); n > 0 && !s.from.After(merged[n-1].to) {
			merged[n-1].to = maxTime(merged[n-1].to, s.to)
			continue
		}
		merged = append(merged, s)
	}
	return merged
}

// callHas reports whether call r was about key for owner: a permit's calls name its
// row key (renewals, releases) or its semaphore's key (sem_acquire, sem_release; in a
// hand-back of lock_release_many, followed by U+001F).
func callHas(r Record, key, owner string) bool {
	if (r.Key == key || r.Key == semaphoreOf(key)) && r.Owner == owner {
		return true
	}
	for i, k := range r.Keys {
		if (k == key || isPermit(key) && k == semaphoreOf(key)+"\x1f") && i < len(r.Owners) && r.Owners[i] == owner {
			return true
		}
	}
	return false
}

// sent is when a call asked for its connection: the client's send time.
func sent(r Record) time.Time {
	if !r.Pool.IsZero() {
		return r.Pool
	}
	return r.Start
}

// describeCall says what a call did: when it asked for a connection, when it was sent
// and answered.
func describeCall(r Record) string {
	s := r.Reason
	switch {
	case r.Reason == callPool:
		s = fmt.Sprintf("a call asked the pool for a connection at %s and got none by %s", stamp(r.Pool), stamp(r.Local))
	case !r.Pool.IsZero() && r.Start.Sub(r.Pool) >= time.Millisecond:
		s += fmt.Sprintf(" asked the pool at %s, waited %v for a connection, was sent at %s and answered at %s",
			stamp(r.Pool), r.Start.Sub(r.Pool).Round(time.Millisecond), stamp(r.Start), stamp(r.Local))
	default:
		s += fmt.Sprintf(" was sent at %s and answered at %s", stamp(r.Start), stamp(r.Local))
	}
	if r.Err != "" {
		s += " (" + r.Err + ")"
	}
	return s
}

// connects describes the connections the worker opened in [from, to] and how long each
// took: a call that finds no idle connection in the pool waits for one to open.
func (c *checker) connects(worker string, from, to time.Time) string {
	var ds []string
	for _, r := range c.calls[worker] {
		if r.Reason == callConnect && r.Local.After(from) && r.Start.Before(to) {
			ds = append(ds, r.Local.Sub(r.Start).Round(time.Millisecond).String())
		}
	}
	if len(ds) == 0 {
		return ""
	}
	return fmt.Sprintf("; the pool opened %d connections meanwhile, taking %s", len(ds), strings.Join(ds, ", "))
}

// rowLockWaits returns the sampled waits of worker's renewals on a row lock in [from, to]
// that no disk wait explains (behindDisk): what the old batched renewal did behind a
// fenced transaction.
func (c *checker) rowLockWaits(worker string, from, to time.Time) []Wait {
	var ws []Wait
	for _, w := range c.waits[worker] {
		if isRowLock(w) && !c.behindDisk(w) && strings.Contains(w.Query, "lock_renew") && !w.At.Before(from) && !w.At.After(to) {
			ws = append(ws, w)
		}
	}
	return ws
}

// lossVerdict weighs the evidence on worker's loss of lease l at lostAt. It returns
// excused (the machine, not pglock, made the renewal late) and what the evidence shows.
func (c *checker) lossVerdict(worker string, l *lease, lostAt time.Time) (excused bool, why string) {
	ttl := c.h.Config.TTL
	// The last renewal the database applied (or the acquisition), and the call that
	// sent it: the client's deadline counts from its send.
	confirmed := append([]time.Time{l.start}, l.renewals...)
	var last time.Time
	for _, r := range c.calls[worker] {
		if r.Err != "" || !callHas(r, l.key, l.owner) || r.Local.After(lostAt) {
			continue
		}
		if slices.ContainsFunc(confirmed, func(t time.Time) bool { return !t.Before(r.Start) && !t.After(r.Local) }) {
			last = maxTime(last, sent(r))
		}
	}
	if last.IsZero() {
		last = confirmed[len(confirmed)-1]
	}
	due, deadline := last.Add(ttl/3), last.Add(ttl-ttl/10)
	if ws := c.rowLockWaits(worker, last, lostAt); len(ws) > 0 {
		return false, fmt.Sprintf("its renewal waited on a row lock (%s/%s) held by %q", ws[0].Type, ws[0].Event, ws[0].BlockedBy)
	}
	var calls []string
	for _, r := range c.calls[worker] {
		if (r.Reason == callPool || callHas(r, l.key, l.owner)) && sent(r).After(last) && !sent(r).After(lostAt) &&
			(r.Reason != callPool || c.renewalAt(worker, r.Pool)) {
			calls = append(calls, describeCall(r))
		}
	}
	down, who := c.machineDown(worker, leaseCalls, due, deadline, c.slowConnects(worker)...)
	why = fmt.Sprintf("its last confirmed renewal was sent at %s: the next was due at %s, the deadline %s; %s", stamp(last), stamp(due), stamp(deadline), who)
	if len(calls) == 0 {
		why += "; no renewal of it was sent"
	} else {
		why += "; then " + strings.Join(calls, "; ")
	}
	why += c.connects(worker, last, lostAt)
	if slices.ContainsFunc(c.calls[worker], func(r Record) bool {
		return sent(r).After(last) && sent(r).Before(deadline) && (r.Reason == callPool && c.renewalAt(worker, r.Pool) ||
			callHas(r, l.key, l.owner) && !r.Pool.IsZero() && r.Start.Sub(r.Pool) >= (deadline.Sub(due))/2)
	}) {
		why += "; the renewal waited for a connection of the pool it shares with the application (issue 17 item 8), not on the transaction's row"
	}
	// The renewer had from due to the deadline to renew: the machine made it late when
	// the worker or its link did not run for most of that time.
	return down >= deadline.Sub(due)/2, why
}

// renewalAt reports whether a renewal of worker was sent at t (its renewer asked the
// pool for a connection then): a failed pool acquisition carries no key.
func (c *checker) renewalAt(worker string, t time.Time) bool {
	return slices.ContainsFunc(c.renewals[worker], func(r Record) bool {
		d := r.Start.Sub(t)
		return d > -time.Millisecond && d < time.Millisecond
	})
}

// ghostVerdict weighs the evidence on a ghost lease l that expired: what the client's
// hand-back did, and whether the machine kept it from handing l back.
func (c *checker) ghostVerdict(l *lease) (excused bool, why string) {
	var calls, acquisitions []string
	for _, r := range c.calls[l.worker] {
		switch {
		case !callHas(r, l.key, l.owner):
		case r.Reason == "lock_release_async" || r.Reason == "sem_release" || r.Reason == "lock_release_many":
			if sent(r).Before(l.expires.Add(c.h.Config.TTL)) {
				calls = append(calls, describeCall(r))
			}
		default: // the acquisition that drew the owner
			acquisitions = append(acquisitions, describeCall(r))
		}
	}
	acquire := []string{"lock_acquire"}
	if isPermit(l.key) {
		acquire = []string{"sem_acquire"}
	}
	down, who := c.machineDown(l.worker, acquire, l.start, l.expires, c.slowConnects(l.worker)...)
	why = "granted at " + stamp(l.start) + ", expired at " + stamp(l.expires) + "; " + who
	if len(acquisitions) > 0 { // when the client could have learned of the grant
		why += "; the acquisition: " + strings.Join(acquisitions, "; ")
	}
	if len(calls) == 0 {
		why += "; no hand-back was sent"
	} else {
		why += "; the hand-back: " + strings.Join(calls, "; ")
	}
	why += c.connects(l.worker, l.start, l.expires)
	return down >= l.expires.Sub(l.start)/2, why
}
