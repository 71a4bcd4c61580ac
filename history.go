package pglock

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/pgfence/pglock/internal/store"
)

// Run history: what RunHistory records and JobRuns and JobStatuses read. The client
// writes it in the background (store.History); the stores keep it
// (internal/store/history.go).
const (
	// maxRunErr is how many characters of a run's error the history keeps.
	maxRunErr           = 1000
	defaultRunRetention = 7 * 24 * time.Hour
	minRunRetention     = time.Second
	maxRunRetention     = 10 * 365 * 24 * time.Hour
)

// JobRun is one run of a job, as the run history keeps it (see RunHistory).
type JobRun struct {
	Job      string    // the job's key, or the gocron job name of a GocronLocker's run
	Instance string    // the instance it ran on (WithInstanceName)
	Owner    string    // the owner id of the lock it ran under
	Token    int64     // that lock's fencing token
	Started  time.Time // on the store's clock (the database's)
	Ended    time.Time // on the store's clock
	Outcome  Outcome
	Error    string    // the error's text (a panic's value), at most 1000 characters; "" when none
	Slot     time.Time // the slot it stood for (Cron, Every); zero without
	Attempt  int       // the slot's attempt, 1 for the first (AtLeastOnce); 0 without a slot
}

// JobSlots counts the slots of a job with a schedule that the store keeps (see Prune).
type JobSlots struct {
	Last    time.Time // the latest slot claimed, or recorded missed
	OK      int64     // slots that ended in success
	Failed  int64     // slots that ended without, no attempt left
	Running int64     // slots whose attempt runs now
	Lost    int64     // slots whose holder died, no attempt left
	Pending int64     // slots that wait for another attempt (AtLeastOnce)
	Retried int64     // attempts after the first, all slots together
}

// JobSkips counts the ticks of a job that one instance skipped for one reason.
type JobSkips struct {
	Instance string
	Reason   SkipReason
	Count    int64     // skipped ticks counted within the retention
	Last     time.Time // the last one counted, on the store's clock
}

// JobStatus is what the run history and the registry say of one job.
type JobStatus struct {
	Job         string
	LastRun     *JobRun    // nil when it never ran (within the retention)
	LastFailure *JobRun    // the last run whose Outcome is not OutcomeOK; nil when none
	Skips       []JobSkips // by instance, then reason
	Slots       *JobSlots  // nil for a job without slots (Cron, Every)
	// Registrations are the instances that registered the job, by instance, so a job is
	// listed before its first run; empty for a job only the history knows.
	Registrations []Registration
}

// RunHistory sets how long the run history keeps job runs, 1 s to 10 years, 7 days when
// not set; 0 turns recording off. The client records every run of its Jobs and
// GocronLockers' jobs, and counts the ticks they skip, in the background: a run never
// waits for it, and a failed write never fails a run. See the package doc, # Run history
// and registrations.
func RunHistory(retention time.Duration) ClientOption {
	return clientOpt{name: "RunHistory", apply: func(s *settings) error {
		if retention != 0 && (retention < minRunRetention || retention > maxRunRetention) {
			return fmt.Errorf("%v: want 0 (off) or %v to %v", retention, minRunRetention, maxRunRetention)
		}
		s.runRetention = retention
		return nil
	}}
}

// JobRuns returns the last runs of job (a Job's key or a gocron job name), newest first,
// at most limit (1 to 1000), from every instance. ctx bounds the store call. Errors:
// ErrInvalidKey for a bad job, ErrInvalidArgument for a limit out of range, or the
// store's error.
func (c *Client) JobRuns(ctx context.Context, job string, limit int) ([]JobRun, error) {
	if err := store.CheckKey(job); err != nil {
		return nil, err
	}
	if limit < 1 || limit > store.MaxJobRuns {
		return nil, invalidArg("JobRuns: limit %d: want 1 to %d", limit, store.MaxJobRuns)
	}
	runs, err := c.store.JobRuns(ctx, job, limit)
	if err != nil {
		return nil, err
	}
	out := make([]JobRun, len(runs))
	for i, r := range runs {
		out[i] = jobRunOf(r)
	}
	return out, nil
}

// JobStatuses returns every job registered on any instance or with history, sorted by
// job. ctx bounds the store calls. Errors: the store's.
func (c *Client) JobStatuses(ctx context.Context) ([]JobStatus, error) {
	jobs, err := c.store.JobStatuses(ctx)
	if err != nil {
		return nil, err
	}
	regs, err := c.store.Registrations(ctx, store.KindJob)
	if err != nil {
		return nil, err
	}
	all := store.WithRegistrations(jobs, regs)
	out := make([]JobStatus, len(all))
	for i, j := range all {
		out[i] = jobStatusOf(j)
	}
	return out, nil
}

func jobRunOf(r store.JobRun) JobRun {
	return JobRun{Job: r.Job, Instance: r.Instance, Owner: r.Owner, Token: r.Token, Started: r.Started, Ended: r.Ended,
		Outcome: Outcome(r.Outcome), Error: r.Error, Slot: r.Slot, Attempt: r.Attempt}
}

// jobRunRef returns *r as a *JobRun, nil for nil.
func jobRunRef(r *store.JobRun) *JobRun {
	if r == nil {
		return nil
	}
	run := jobRunOf(*r)
	return &run
}

func jobStatusOf(j store.JobStatus) JobStatus {
	s := JobStatus{Job: j.Job, LastRun: jobRunRef(j.LastRun), LastFailure: jobRunRef(j.LastFailure),
		Slots: (*JobSlots)(j.Slots)}
	for _, k := range j.Skips {
		s.Skips = append(s.Skips, JobSkips{Instance: k.Instance, Reason: SkipReason(k.Reason), Count: k.Count, Last: k.Last})
	}
	for _, r := range j.Registrations {
		s.Registrations = append(s.Registrations, registrationOf(r))
	}
	return s
}

// jobRan reports a run of job under l, of slot (zero without a schedule), that started
// at start (real clock) and ended now with outcome and err: an EventJobRan, and a
// record for the history.
func (c *Client) jobRan(job string, l *Lock, slot slotRun, start time.Time, outcome Outcome, err string) {
	end := time.Now()
	ev := Event{Type: EventJobRan, Key: job, Duration: end.Sub(start), Outcome: outcome, Time: c.clock.Now(),
		Slot: slot.slot, Attempt: slot.attempt}
	if l != nil {
		ev.Owner, ev.Token = l.entry.Owner, l.token
	}
	c.events.emit(ev)
	c.history.Record(store.RunRecord{Job: job, Instance: c.instance, Owner: ev.Owner, Token: ev.Token, Slot: slot.slot,
		Attempt: slot.attempt, Ended: end, Duration: ev.Duration, Outcome: string(outcome), Err: runErrText(err)})
}

// runErrText is err as the history keeps it: valid UTF-8 without NUL, at most
// maxRunErr characters.
func runErrText(err string) string {
	err = strings.ReplaceAll(strings.ToValidUTF8(err, "\uFFFD"), "\x00", "")
	if utf8.RuneCountInString(err) <= maxRunErr {
		return err
	}
	runes := []rune(err)
	return string(runes[:maxRunErr])
}
