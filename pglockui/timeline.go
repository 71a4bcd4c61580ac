package pglockui

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/pgfence/pglock"
)

// The timeline's geometry, in SVG user units: a column of instance names, then the
// plot, one lane per instance.
const (
	tlWidth  = 1000.0
	tlLabel  = 150.0 // where the plot begins
	tlRight  = 990.0 // where it ends
	tlLane   = 30.0  // a lane's height
	tlBar    = 20.0  // a bar's height
	tlAxis   = 24.0  // the axis's height, below the lanes
	tlMinBar = 2.0   // the narrowest bar, so that a run of milliseconds still shows
)

// timeline is a job's runs laid out for the SVG: with slots, a first lane of the
// slots, then one lane per instance.
type timeline struct {
	Width, Height float64
	PlotX, PlotW  float64
	Slots         *slotLane // nil for a job without slots
	Lanes         []lane
	Ticks         []tick
	From, To      time.Time
	Shown, Hidden int // runs in the window, and runs read that ended before it
}

// slotLane is the lane of a job's slots: a mark at each slot's time, in the colour of
// its latest attempt's outcome.
type slotLane struct {
	TextY float64 // its label's baseline; the lane is the first, at y 0
	Marks []slotMark
}

type slotMark struct {
	Row  slotRow
	X, Y float64 // its centre
}

type lane struct {
	Instance string
	Y, TextY float64
	Bars     []bar
	Skips    []skipMark // the slot skips this instance counted, at the last one
}

type bar struct {
	pglock.JobRun
	X, Y, W, H float64
}

// skipMark marks an instance's count of one slot skip reason at its last skip.
type skipMark struct {
	pglock.JobSkips
	X, Y float64 // its centre
}

type tick struct {
	X     float64
	Label string
}

// layoutTimeline places runs that ended after from on lanes by instance (sorted by
// name), x proportional to time between from and to. With slots (non-nil), the first
// lane marks each slot in the window, and an instance's lane marks its counts of
// slot skips whose last one is in the window (an instance that only skipped gets a
// lane too).
func layoutTimeline(runs []pglock.JobRun, slots *slotsData, from, to time.Time) timeline {
	t := timeline{Width: tlWidth, PlotX: tlLabel, PlotW: tlRight - tlLabel, From: from, To: to}
	span := to.Sub(from).Seconds()
	x := func(at time.Time) float64 {
		f := at.Sub(from).Seconds() / span
		return tlLabel + min(max(f, 0), 1)*t.PlotW
	}
	in := func(at time.Time) bool { return at.After(from) && !at.After(to) }
	byInstance := map[string][]pglock.JobRun{}
	for _, r := range runs {
		if !r.Ended.After(from) {
			t.Hidden++
			continue
		}
		byInstance[r.Instance] = append(byInstance[r.Instance], r)
		t.Shown++
	}
	skips := map[string][]pglock.JobSkips{}
	first := 0 // the first instance's lane
	if slots != nil {
		first = 1
		t.Slots = &slotLane{TextY: tlLane/2 + 5}
		for _, r := range slots.Rows {
			if in(r.Slot) {
				t.Slots.Marks = append(t.Slots.Marks, slotMark{Row: r, X: x(r.Slot), Y: tlLane / 2})
			}
		}
		for _, k := range append(slices.Clip(slots.Claimed.By), slots.Missed.By...) {
			if in(k.Last) {
				skips[k.Instance] = append(skips[k.Instance], k)
			}
		}
	}
	names := make([]string, 0, len(byInstance))
	for name := range byInstance {
		names = append(names, name)
	}
	for name := range skips {
		if _, ok := byInstance[name]; !ok {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for i, name := range names {
		y := float64(first+i) * tlLane
		l := lane{Instance: name, Y: y, TextY: y + tlLane/2 + 5}
		rs := byInstance[name]
		slices.SortFunc(rs, func(a, b pglock.JobRun) int { return cmp.Compare(a.Started.UnixNano(), b.Started.UnixNano()) })
		for _, r := range rs {
			x0, x1 := x(r.Started), x(r.Ended)
			w := max(x1-x0, tlMinBar)
			if x0+w > tlRight {
				x0 = tlRight - w
			}
			l.Bars = append(l.Bars, bar{JobRun: r, X: x0, Y: y + (tlLane-tlBar)/2, W: w, H: tlBar})
		}
		for _, k := range skips[name] {
			l.Skips = append(l.Skips, skipMark{JobSkips: k, X: x(k.Last), Y: y + tlLane/2})
		}
		t.Lanes = append(t.Lanes, l)
	}
	t.Height = float64(max(first+len(names), first+1))*tlLane + tlAxis // room for "No runs"
	step := 10 * time.Minute
	if span > 2*3600 {
		step = 3 * time.Hour
	}
	for at := from.Truncate(step).Add(step); at.Before(to); at = at.Add(step) {
		t.Ticks = append(t.Ticks, tick{X: x(at), Label: at.Local().Format("15:04")})
	}
	return t
}

// runClass is a bar's classes: "run", its outcome, and "retry" for a slot's attempt
// after the first.
func runClass(r pglock.JobRun) string {
	if r.Attempt > 1 {
		return "run " + string(r.Outcome) + " retry"
	}
	return "run " + string(r.Outcome)
}

// runTitle is a bar's tooltip: when, where, how long, how it ended and why.
func runTitle(r pglock.JobRun) string {
	s := fmt.Sprintf("%s on %s, %s – %s (%s), token %d", r.Outcome, r.Instance,
		r.Started.Local().Format("15:04:05.000"), r.Ended.Local().Format("15:04:05.000"), human(r.Ended.Sub(r.Started)), r.Token)
	if !r.Slot.IsZero() {
		s += fmt.Sprintf(", slot %s, attempt %d", r.Slot.Local().Format("15:04:05.000"), r.Attempt)
	}
	if r.Error != "" {
		s += ": " + r.Error
	}
	return s
}
