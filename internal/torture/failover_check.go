package main

import (
	"slices"
	"strings"
	"time"

	"github.com/pgfence/pglock"
)

// What the checker makes of failovers (failover.go, issue 19), as the README's "Running
// with a standby" says:
//
//   - With synchronous replication a failover loses nothing a client was told of: every
//     invariant is checked as on one server. A failover counts as a fault of the whole
//     server (as a restart does) where faults excuse (a ghost left to expire, a lock lost
//     under a fenced transaction): every connection breaks.
//   - With asynchronous replication, what the old primary acknowledged after the last
//     point the new one is known to have (Failover.KeptUntil) and before the promotion
//     may be lost: an acquisition, a renewal, a write. Those are counted, not blamed on
//     pglock (lossOf). Fencing must hold all the same: every token the new primary
//     issues for a key is greater than the token of every acquisition the failover lost
//     (invariant 1), and the fenced counters equal their accepted writes, except that a
//     write whose read, on the old primary, saw commits the failover then lost, writes
//     that read's value plus one (counted: the database lost them, not the fence).
//   - A holder whose acquisition or renewal was lost believes it holds the key past
//     what the new primary knows; another holder can overlap it there. That is allowed,
//     and counted, only until its bound: its last confirmation's send plus its ttl (its
//     own deadline, "never more than ttl"); it must be told of the loss by then
//     (invariant 3), and an overlap past it is invariant 2's (or 4's, 5's for the
//     election and the job).
//
// Hook for the confirmation after a reconnect (issue 19, "Learn at once"): once a
// client confirms its locks in one round when its connections come back, a lost
// holder is told within about a round trip of reaching the new primary. Tighten the
// bound then: from its last confirmation plus its ttl to the promotion plus the time
// to reconnect (the failover's first acquisition on the new primary measures that),
// and add a mutation that turns the confirmation off; LostTold below is the figure
// it moves.

// FailoverStats are a failover run's numbers.
type FailoverStats struct {
	Failovers, Detached int
	Outage              []time.Duration // from the kill to the promotion
	FirstAcquisition    []time.Duration // from the kill to the first acquisition the new primary granted
	HeldAtKill          int             // leases a running client believed it held at a kill
	KeptAcross          int             // ... renewed or released on the new primary: the holder kept it
	LostAcross          int             // ... whose acquisition the failover lost
	AcquisitionsLost    int             // acquisitions a client was told of that the failover lost (held at the kill, or given up before it)
	RenewalsLost        int             // leases whose holder believed, on a renewal the failover lost, past their expiry in the log
	WritesLost          int             // writes a client saw succeed that the failover lost
	StaleReads          int             // writes built on a read of commits the failover then lost
	Overlaps            []time.Duration // a lost or cut lease's holder still believing while the key's next holder held it
	LostTold            []time.Duration // from the promotion to the holder of a lost acquisition, held at the kill, giving up
	LostBelief          []time.Duration // ... from its last confirmation: at most its ttl
	LeaderOverlaps      int             // leaders believing at once, one of them on a lost or cut lease, within its bound
	Ticks               int             // job runs on a lost or cut job lease, within its bound
}

// lossOf returns the asynchronous failover that may have lost what a client was told of
// at t: acknowledged after the last point the new primary is known to have, and before
// the controller saw the promotion (a reply of the old primary can be recorded after it
// died; whatever the new primary acknowledged is in its log, so a record missing from
// the log that late is still the old primary's). nil in a synchronous run: there, a
// failover loses nothing a client was told of. Anything on the new primary is after
// Killed: between the kill and the promotion no server takes writes.
func (c *checker) lossOf(t time.Time) *Failover {
	if c.h.Config.Failover != failoverAsync {
		return nil
	}
	for i := range c.h.Failovers {
		if f := &c.h.Failovers[i]; t.After(f.KeptUntil) && !t.After(f.Promoted) {
			return f
		}
	}
	return nil
}

// leaseTTL is the ttl of key's locks: twice the run's for the long lock of each
// worker's pair (twoTTLs), the run's for every other.
func (c *checker) leaseTTL(key string) time.Duration {
	if strings.HasPrefix(key, "long/") {
		return 2 * c.h.Config.TTL
	}
	return c.h.Config.TTL
}

// indexFailovers finds, in an asynchronous failover run, the acquisitions that a client
// was told of and that a failover lost (they are in no lease log), and the leases of the
// log whose holder was told of a renewal that a failover lost, with the bound of each.
func (c *checker) indexFailovers() {
	if c.h.Config.Failover != failoverAsync {
		return
	}
	for _, r := range c.h.Records {
		if !(r.Type == typeEvent && r.F == string(pglock.EventAcquired)) && !(r.F == fProbe && r.Type == typeOK) {
			continue
		}
		kt := keyToken{r.Key, r.Token}
		if c.byToken[kt] != nil {
			continue
		}
		f := c.lossOf(r.Local)
		if f == nil {
			continue // overlaps reports a token the database never granted
		}
		l := &lease{key: r.Key, owner: r.Owner, worker: r.Worker, token: r.Token, start: r.Local, lost: f}
		l.bound = c.lastConfirmed(l, r.Local, f).Add(c.leaseTTL(l.key))
		l.expires = l.bound
		c.byToken[kt] = l
		c.lost = append(c.lost, l)
	}
	for _, ls := range c.leases {
		for _, l := range ls {
			for i := range c.h.Failovers {
				f := &c.h.Failovers[i]
				if l.start.After(f.Killed) || l.end().Before(f.KeptUntil.Add(-c.leaseTTL(l.key))) {
					continue
				}
				if last, ok := c.lostRenewal(l, f); ok && last.Add(c.leaseTTL(l.key)).After(l.end()) {
					l.cut, l.bound = f, last.Add(c.leaseTTL(l.key))
				}
			}
		}
	}
}

// lastConfirmed returns the send time of the last call that confirmed lost acquisition
// l to its client before the old primary died: its acquisition, or a renewal answered
// without error (a refused renewal is answered without error too, but a refusal tells
// its client at once); from, when none was traced.
func (c *checker) lastConfirmed(l *lease, from time.Time, f *Failover) time.Time {
	var last time.Time
	for _, r := range c.calls[l.worker] {
		if r.Err == "" && callHas(r, l.key, l.owner) && !r.Local.After(f.Killed) &&
			(strings.HasPrefix(r.Reason, "lock_acquire") || strings.HasPrefix(r.Reason, "lock_renew")) {
			last = maxTime(last, r.Start)
		}
	}
	if last.IsZero() {
		return from
	}
	return last
}

// lostRenewal returns the send time of the last renewal of l, sent to the old primary,
// that its client saw answered without error while f may have lost it, if the log has
// no renewal of l from that call.
func (c *checker) lostRenewal(l *lease, f *Failover) (time.Time, bool) {
	var last time.Time
	for _, r := range c.calls[l.worker] {
		if r.Err != "" || !strings.HasPrefix(r.Reason, "lock_renew") || !callHas(r, l.key, l.owner) ||
			!r.Start.After(l.start) || !r.Start.Before(f.Killed) || c.lossOf(r.Local) != f {
			continue
		}
		if slices.ContainsFunc(l.renewals, func(t time.Time) bool { return !t.Before(r.Start) && !t.After(r.Local) }) {
			continue // the new primary has it
		}
		last = maxTime(last, r.Start)
	}
	return last, !last.IsZero()
}

// staleRead reports whether fenced write w wrote over a value other than the one its
// read saw because an asynchronous failover lost commits the read saw: the read ran on
// the old primary after the point the new one is known to have, the write on the new
// primary, which holds less than the read returned.
func (c *checker) staleRead(w WriteRow) bool {
	read, ok := c.completion(w.Op, fRead)
	if !ok || read.Type != typeOK || read.Read <= w.Old || w.New != read.Read+1 {
		return false
	}
	f := c.lossOf(read.Local)
	return f != nil && w.At.After(f.Killed)
}

// liveAt reports whether l was live at t: in the log, or, for a lease whose acquisition
// or a renewal a failover lost, on the old primary until the kill began. A holder that
// acts on it from then on, beside a holder on the new primary, is what failoverAllows
// weighs.
func (c *checker) liveAt(l *lease, t time.Time) bool {
	switch {
	case l.lost != nil:
		return t.Before(l.lost.Kill)
	case l.cut != nil && t.Before(l.cut.Kill):
		return true
	}
	return t.Before(l.end())
}

// failoverAllows reports whether a holder of key's lease of token believing it held it
// until the given time, beside another holder, is what an asynchronous failover allows:
// a failover lost the lease's acquisition or a renewal, and the belief ended by the
// lease's bound (plus the slack).
func (c *checker) failoverAllows(key string, token int64, until time.Time) bool {
	l := c.byToken[keyToken{key, token}]
	return l != nil && (l.lost != nil || l.cut != nil) && !until.After(l.bound.Add(c.slack))
}

// failovers checks the leases the failovers lost (lostLeases) and measures each
// failover: its outage, the first acquisition after it, the locks held across it.
func (c *checker) failovers() {
	st := &c.r.Stats.Failover
	c.lostLeases()
	c.cutOverlaps()
	var acquired []Record
	for _, r := range c.h.Records {
		if r.Type == typeEvent && r.F == string(pglock.EventAcquired) {
			acquired = append(acquired, r)
		}
	}
	for _, f := range c.h.Failovers {
		st.Failovers++
		if !f.Detached.IsZero() {
			st.Detached++
		}
		st.Outage = append(st.Outage, f.Promoted.Sub(f.Kill))
		var first time.Time
		for _, ls := range c.leases {
			for _, l := range ls {
				if l.start.After(f.Killed) && (first.IsZero() || l.start.Before(first)) {
					first = l.start
				}
			}
		}
		if !first.IsZero() {
			st.FirstAcquisition = append(st.FirstAcquisition, first.Sub(f.Kill))
		}
		// The locks held across the kill, as their running holders saw them.
		for _, a := range acquired {
			if !a.Local.Before(f.Kill) || !c.alive(a.Worker, f.Kill, f.Kill) {
				continue
			}
			if gave, ok := c.gaveUp(a.Worker, a.Key, a.Token); ok && !gave.After(f.Kill) {
				continue
			}
			st.HeldAtKill++
			switch l := c.byToken[keyToken{a.Key, a.Token}]; {
			case l == nil:
			case l.lost != nil:
				st.LostAcross++
			case l.released.After(f.Killed) || slices.ContainsFunc(l.renewals, func(t time.Time) bool { return t.After(f.Killed) }):
				st.KeptAcross++
			}
		}
	}
}

// lostLeases checks each acquisition a failover lost: every token the new primary
// issued for its key since is greater (invariant 1); its holder gave it up by its bound
// (invariant 3); and a holder of the key on the new primary overlapped it only until
// then (invariant 2; within the bound, counted).
func (c *checker) lostLeases() {
	st := &c.r.Stats.Failover
	for _, l := range c.lost {
		st.AcquisitionsLost++
		for _, n := range c.leases[l.key] {
			if n.start.After(l.lost.Killed) && n.token <= l.token {
				c.r.violate(invCounters, "lease %q: token %d (%s) granted on timeline %d at %s, not above token %d that %s was told it held on timeline %d at %s, lost in that failover: the token went back",
					l.key, n.token, n.worker, l.lost.To, stamp(n.start), l.token, l.worker, l.lost.From, stamp(l.start))
			}
		}
		due := l.bound.Add(c.slack)
		gave, ok := c.gaveUp(l.worker, l.key, l.token)
		switch {
		case !c.alive(l.worker, l.start, due) && (!ok || gave.After(c.lives[l.worker].End)):
			continue // killed, or shut down, before it had to give up
		case c.stoppedAt(l.worker, l.start, due) && (!ok || gave.After(due)):
			c.r.Stats.PausedHolders++
			continue
		case !ok:
			c.r.violate(invSignal, "%s was never told that its lease %q (token %d), acquired at %s and lost in the failover at %s, was gone (due by %s: its last confirmation plus its ttl)",
				l.worker, l.key, l.token, stamp(l.start), stamp(l.lost.Kill), stamp(l.bound))
			continue
		}
		if gave.After(l.lost.Kill) { // held across the kill
			st.LostTold = append(st.LostTold, gave.Sub(l.lost.Promoted))
			st.LostBelief = append(st.LostBelief, gave.Sub(l.bound.Add(-c.leaseTTL(l.key))))
		}
		if gave.After(due) {
			c.r.violate(invSignal, "%s was told at %s that its lease %q (token %d), lost in the failover at %s, was gone: %v after its bound (its last confirmation plus its ttl, %s)",
				l.worker, stamp(gave), l.key, l.token, stamp(l.lost.Kill), gave.Sub(l.bound).Round(time.Millisecond), stamp(l.bound))
		}
		for _, n := range c.leases[l.key] {
			if n.start.Before(l.lost.Killed) || !n.start.Before(gave) {
				continue
			}
			st.Overlaps = append(st.Overlaps, minTime(gave, n.end()).Sub(n.start))
			if end := minTime(gave, n.end()); end.After(due) && watched(l.key) {
				c.r.violate(invOverlap, "%s believed it held %q (token %d, lost in the failover at %s) until %s, beside %s's token %d from %s: past its bound %s",
					l.worker, l.key, l.token, stamp(l.lost.Kill), stamp(gave), n.worker, n.token, stamp(n.start), stamp(l.bound))
			}
		}
	}
}

// cutOverlaps counts the time a holder whose renewal a failover lost went on believing
// it held its key while the key's next holder held it. Its bound is signals' (the
// holder must give up by it) and, for the election and the job, leader's and job's.
func (c *checker) cutOverlaps() {
	for _, ls := range c.leases {
		for i, l := range ls {
			if l.cut == nil || i+1 == len(ls) {
				continue
			}
			gave, ok := c.gaveUp(l.worker, l.key, l.token)
			if n := ls[i+1]; ok && gave.After(n.start) {
				c.r.Stats.Failover.Overlaps = append(c.r.Stats.Failover.Overlaps, minTime(gave, n.end()).Sub(n.start))
			}
		}
	}
}
