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

// timeline is a job's runs laid out for the SVG.
type timeline struct {
	Width, Height float64
	PlotX, PlotW  float64
	Lanes         []lane
	Ticks         []tick
	From, To      time.Time
	Shown, Hidden int // runs in the window, and runs read that ended before it
}

type lane struct {
	Instance string
	Y, TextY float64
	Bars     []bar
}

type bar struct {
	pglock.JobRun
	X, Y, W, H float64
}

type tick struct {
	X     float64
	Label string
}

// layoutTimeline places runs that ended after from on lanes by instance (sorted by
// name), x proportional to time between from and to.
func layoutTimeline(runs []pglock.JobRun, from, to time.Time) timeline {
	t := timeline{Width: tlWidth, PlotX: tlLabel, PlotW: tlRight - tlLabel, From: from, To: to}
	span := to.Sub(from).Seconds()
	x := func(at time.Time) float64 {
		f := at.Sub(from).Seconds() / span
		return tlLabel + min(max(f, 0), 1)*t.PlotW
	}
	byInstance := map[string][]pglock.JobRun{}
	for _, r := range runs {
		if !r.Ended.After(from) {
			t.Hidden++
			continue
		}
		byInstance[r.Instance] = append(byInstance[r.Instance], r)
		t.Shown++
	}
	names := make([]string, 0, len(byInstance))
	for name := range byInstance {
		names = append(names, name)
	}
	slices.Sort(names)
	for i, name := range names {
		y := float64(i) * tlLane
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
		t.Lanes = append(t.Lanes, l)
	}
	t.Height = float64(max(len(names), 1))*tlLane + tlAxis
	step := 10 * time.Minute
	if span > 2*3600 {
		step = 3 * time.Hour
	}
	for at := from.Truncate(step).Add(step); at.Before(to); at = at.Add(step) {
		t.Ticks = append(t.Ticks, tick{X: x(at), Label: at.Local().Format("15:04")})
	}
	return t
}

// runTitle is a bar's tooltip: when, where, how long, how it ended and why.
func runTitle(r pglock.JobRun) string {
	s := fmt.Sprintf("%s on %s, %s – %s (%s), token %d", r.Outcome, r.Instance,
		r.Started.Local().Format("15:04:05.000"), r.Ended.Local().Format("15:04:05.000"), human(r.Ended.Sub(r.Started)), r.Token)
	if r.Err != "" {
		s += ": " + r.Err
	}
	return s
}
