// Package schedule is the arithmetic of a job's slots (pglock's Cron and Every): the
// times a cron expression or an interval aligned to the Unix epoch names, the same on
// every instance. It knows nothing of gocron, of the database or of the client.
package schedule

import (
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

const (
	// MaxEarly bounds how far ahead of a slot, on the database clock, a tick may claim
	// it: half the gap to the next slot, a second at most.
	MaxEarly = time.Second
	// MaxMissedCounted bounds the slots a tick enumerates between the last claimed and
	// its own: a longer gap counts as this many.
	MaxMissedCounted = 100000
)

// Schedule is a job's schedule: a cron expression, or an interval aligned to the epoch.
type Schedule struct {
	Expr  string        // the cron expression as gocron gets it, its zone first; "" for Every
	cron  cron.Schedule // nil for Every
	Every time.Duration // the interval; 0 for a cron expression
}

// IsCron reports whether s is a cron expression's.
func (s *Schedule) IsCron() bool { return s.cron != nil }

// cronParser parses as gocron.CronJob(expr, true) does, so that both name the same times.
var cronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// ParseCron parses expr as gocron.CronJob(expr, true) does, in UTC unless it starts
// with TZ= or CRON_TZ=; it refuses @every and an expression that names no time to
// come.
func ParseCron(expr string) (*Schedule, error) {
	zoned := strings.TrimSpace(expr)
	if !strings.HasPrefix(zoned, "TZ=") && !strings.HasPrefix(zoned, "CRON_TZ=") {
		zoned = "CRON_TZ=UTC " + zoned
	}
	if strings.Contains(expr, "@every") {
		return nil, fmt.Errorf("%q: @every counts from a start of its own, not slots every instance names: use Every", expr)
	}
	sc, err := cronParser.Parse(zoned)
	if err != nil {
		return nil, fmt.Errorf("%q: %v", expr, err)
	}
	if sc.Next(time.Now()).IsZero() {
		return nil, fmt.Errorf("%q: it names no time to come", expr)
	}
	return &Schedule{Expr: zoned, cron: sc}, nil
}

// Next returns the schedule's first slot after t, or the zero time when none.
func (s *Schedule) Next(t time.Time) time.Time {
	if s.cron != nil {
		return s.cron.Next(t)
	}
	return s.Prev(t).Add(s.Every)
}

// Prev returns the schedule's last slot at or before t, or the zero time when none.
func (s *Schedule) Prev(t time.Time) time.Time {
	if s.cron == nil {
		ms, every := t.UnixMilli(), s.Every.Milliseconds()
		return time.UnixMilli(ms - ms%every)
	}
	for back := time.Minute; back <= 20*365*24*time.Hour; back *= 2 {
		x := s.cron.Next(t.Add(-back))
		if x.IsZero() {
			return x
		}
		if x.After(t) {
			continue
		}
		for {
			n := s.cron.Next(x)
			if n.IsZero() || n.After(t) {
				return x
			}
			x = n
		}
	}
	return time.Time{}
}

// Early is how far ahead of slot, whose next slot is next, a tick may claim it.
func Early(slot, next time.Time) time.Duration {
	return min(next.Sub(slot)/2, MaxEarly)
}

// Current returns the slot a tick at now stands for, and the one after it: the last
// slot at or before now plus its early tolerance. job_slot_claim checks the same on
// the database clock.
func (s *Schedule) Current(now time.Time) (slot, next time.Time) {
	slot = s.Prev(now.Add(MaxEarly))
	for !slot.IsZero() {
		next = s.Next(slot)
		if !slot.After(now.Add(Early(slot, next))) {
			return slot, next
		}
		slot = s.Prev(slot.Add(-time.Millisecond))
	}
	return time.Time{}, time.Time{}
}

// Between returns the schedule's slots after from and before to, oldest first, at
// most MaxMissedCounted.
func (s *Schedule) Between(from, to time.Time) []time.Time {
	var out []time.Time
	for t := s.Next(from); !t.IsZero() && t.Before(to) && len(out) < MaxMissedCounted; t = s.Next(t) {
		out = append(out, t)
	}
	return out
}
