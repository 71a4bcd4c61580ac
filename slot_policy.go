package pglock

import "time"

// SlotPolicy is what a job with a schedule does with its slots, as the options given
// to Client.Job set it. The store does not keep it: a console or a report that shows
// it gets it from the Job. See the package doc, # Slots.
type SlotPolicy struct {
	Cron     string        // Cron's expression, its zone first ("CRON_TZ=UTC 0 2 * * *"); "" with Every
	Every    time.Duration // Every's gap between slots; 0 with Cron
	CatchUp  int           // CatchUp's n; 0: every missed slot is counted and none runs
	Deadline time.Duration // Deadline's; 0: a slot may start until the next one comes
	Attempts int           // AtLeastOnce's attempts; 1: at most once
	Backoff  time.Duration // AtLeastOnce's backoff before the second attempt; 0 without it
}

// SlotPolicy returns the slot policy of j, and false for a job without a schedule
// (Cron or Every).
func (j *Job) SlotPolicy() (SlotPolicy, bool) {
	s := j.slots
	if s == nil {
		return SlotPolicy{}, false
	}
	return SlotPolicy{Cron: s.sched.Expr, Every: s.sched.Every, CatchUp: s.catchUp, Deadline: s.deadline,
		Attempts: s.attempts, Backoff: s.backoff}, true
}
