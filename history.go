package pglock

import (
	"context"
	"fmt"
	"time"
)

// Run history: what RunHistory records and JobRuns and JobStatuses read. The client
// writes it in the background (history_writer.go); the stores keep it
// (store_history.go).
const (
	defaultRunRetention = 7 * 24 * time.Hour
	minRunRetention     = time.Second
	maxRunRetention     = 10 * 365 * 24 * time.Hour
	// maxJobRuns is the most runs JobRuns returns, and the most runs of a job the
	// memory store keeps.
	maxJobRuns = 1000
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
// ErrInvalidKey for a bad job, ErrInvalidArgument for a limit out of range, an error
// wrapping errors.ErrUnsupported on a type that embeds a Store, or the store's error.
func (c *Client) JobRuns(ctx context.Context, job string, limit int) ([]JobRun, error) {
	if err := checkKey(job); err != nil {
		return nil, err
	}
	if limit < 1 || limit > maxJobRuns {
		return nil, invalidArg("JobRuns: limit %d: want 1 to %d", limit, maxJobRuns)
	}
	b, err := c.backend("job runs", "keeps no run history")
	if err != nil {
		return nil, err
	}
	return b.jobRuns(ctx, job, limit)
}

// JobStatuses returns every job registered on any instance or with history, sorted by
// job. ctx bounds the store calls. Errors: an error wrapping errors.ErrUnsupported on a
// type that embeds a Store, or the store's error.
func (c *Client) JobStatuses(ctx context.Context) ([]JobStatus, error) {
	b, err := c.backend("job statuses", "keeps no run history")
	if err != nil {
		return nil, err
	}
	jobs, err := b.jobStatuses(ctx)
	if err != nil {
		return nil, err
	}
	regs, err := b.registrations(ctx, kindJob)
	if err != nil {
		return nil, err
	}
	st := make(statuses, len(jobs))
	for _, j := range jobs {
		st[j.Job] = &j
	}
	for _, r := range regs {
		j := st.of(r.key)
		j.Registrations = append(j.Registrations, r.Registration)
	}
	return st.sorted(), nil
}
