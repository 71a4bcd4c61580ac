package pglockui

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/pgfence/pglock"
)

// slotsData is what a job's page shows of its slots (a job with pglock.Cron or
// pglock.Every): its policy, what its slots came to, the ticks that found a slot
// claimed, the slots missed, and each slot that ran.
type slotsData struct {
	Policy  *policyText      // nil when the console was not given the job (WithJobs)
	Counts  *pglock.JobSlots // nil when the store keeps none for the job
	Claimed skipsOf          // ticks that found their slot claimed by another tick, by instance
	Missed  skipsOf          // slots no tick ran, by the instance that counted them
	Rows    []slotRow        // each slot of the runs read, newest first
}

// skipsOf is one skip reason's counts, by instance.
type skipsOf struct {
	By    []pglock.JobSkips
	Total int64
}

// slotRow is one slot of the runs read: its latest attempt, and those before it.
type slotRow struct {
	Slot    time.Time
	Last    pglock.JobRun   // its latest attempt recorded
	Earlier []pglock.JobRun // the attempts before it that the history kept, latest first
}

// Retried reports whether the slot ran more than once.
func (r slotRow) Retried() bool { return r.Last.Attempt > 1 }

// Delay is how long after its slot its latest attempt started: a caught-up slot's is
// a gap or more.
func (r slotRow) Delay() time.Duration { return r.Last.Started.Sub(r.Slot) }

// policyText is a SlotPolicy in words.
type policyText struct {
	Schedule, CatchUp, Deadline, Attempts string
}

func describePolicy(p pglock.SlotPolicy) *policyText {
	t := &policyText{Schedule: "every " + human(p.Every)}
	if p.Cron != "" {
		t.Schedule = "cron " + p.Cron
	}
	switch p.CatchUp {
	case 0:
		t.CatchUp = "none: each missed slot is counted, none runs"
	case 1:
		t.CatchUp = "CatchUp(1): the latest missed slot runs once, before the tick's own"
	default:
		t.CatchUp = fmt.Sprintf("CatchUp(%d): the latest %d missed slots run, oldest first, before the tick's own; older ones are counted missed", p.CatchUp, p.CatchUp)
	}
	t.Deadline = "none: a slot may start until the next one comes"
	if p.Deadline > 0 {
		t.Deadline = "a slot not started within " + human(p.Deadline) + " of its time counts as missed"
	}
	t.Attempts = "at most once: a claimed slot never runs again"
	if p.Attempts > 1 {
		t.Attempts = fmt.Sprintf("at least once: up to %d attempts, each after one that did not succeed", p.Attempts)
		if p.Backoff > 0 {
			t.Attempts += fmt.Sprintf(", %s later, doubling each time", human(p.Backoff))
		}
	}
	return t
}

// slotsOf gathers what the job's page shows of its slots, or nil for a job that shows
// no sign of having any: no slot in its runs, no slot counts, no slot skips, no policy.
func slotsOf(runs []pglock.JobRun, status *pglock.JobStatus, policy *pglock.SlotPolicy) *slotsData {
	d := &slotsData{}
	if policy != nil {
		d.Policy = describePolicy(*policy)
	}
	if status != nil {
		d.Counts = status.Slots
		for _, k := range status.Skips {
			switch k.Reason {
			case pglock.SkipSlotClaimed:
				d.Claimed.By, d.Claimed.Total = append(d.Claimed.By, k), d.Claimed.Total+k.Count
			case pglock.SkipSlotMissed:
				d.Missed.By, d.Missed.Total = append(d.Missed.By, k), d.Missed.Total+k.Count
			}
		}
	}
	bySlot := map[time.Time][]pglock.JobRun{}
	for _, r := range runs {
		if !r.Slot.IsZero() {
			s := r.Slot.UTC()
			bySlot[s] = append(bySlot[s], r)
		}
	}
	for slot, rs := range bySlot {
		slices.SortFunc(rs, func(a, b pglock.JobRun) int { // the latest attempt first
			return cmp.Or(cmp.Compare(b.Attempt, a.Attempt), b.Started.Compare(a.Started))
		})
		d.Rows = append(d.Rows, slotRow{Slot: slot, Last: rs[0], Earlier: rs[1:]})
	}
	slices.SortFunc(d.Rows, func(a, b slotRow) int { return b.Slot.Compare(a.Slot) })
	if d.Policy == nil && d.Counts == nil && len(d.Claimed.By) == 0 && len(d.Missed.By) == 0 && len(d.Rows) == 0 {
		return nil
	}
	return d
}

// slotTitle is a slot mark's tooltip: the slot, and how its latest attempt went.
func slotTitle(r slotRow) string {
	var b strings.Builder
	fmt.Fprintf(&b, "slot %s: %s on %s, token %d, attempt %d", r.Slot.Local().Format("15:04:05.000"), r.Last.Outcome,
		r.Last.Instance, r.Last.Token, r.Last.Attempt)
	if r.Retried() {
		b.WriteString(" (retried)")
	}
	fmt.Fprintf(&b, "; started %s after its slot", human(r.Delay()))
	if r.Last.Error != "" {
		b.WriteString(": " + r.Last.Error)
	}
	return b.String()
}

// skipTitle is a skip mark's tooltip.
func skipTitle(k pglock.JobSkips) string {
	if k.Reason == pglock.SkipSlotMissed {
		return fmt.Sprintf("%s: %d × a slot missed (no tick ran it), the last counted at %s", k.Instance, k.Count, k.Last.Local().Format("15:04:05"))
	}
	return fmt.Sprintf("%s: %d × a tick that found its slot claimed by another, the last at %s", k.Instance, k.Count, k.Last.Local().Format("15:04:05"))
}

// slotCounts is a job's JobSlots in words, its zero counts left out.
func slotCounts(s *pglock.JobSlots) string {
	if s == nil {
		return ""
	}
	var parts []string
	for _, c := range []struct {
		n    int64
		what string
	}{{s.OK, "ok"}, {s.Failed, "failed"}, {s.Running, "running"}, {s.Lost, "lost"}, {s.Pending, "pending"}, {s.Retried, "retried"}} {
		if c.n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", c.n, c.what))
		}
	}
	if len(parts) == 0 {
		return "none ended yet"
	}
	return strings.Join(parts, ", ")
}
