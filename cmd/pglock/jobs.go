package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pgfence/pglock"
)

var jobsCommand = &command{
	name:    "jobs",
	args:    "[-json] [-n N] [JOB]",
	summary: "every job's last run, failure and skips, from its registration; or a job's runs",
	help: `
Jobs lists every job registered (by a running client, on any instance: listed
before its first run) or with a run history: its last run (when, on which
instance, how long, the outcome), its last failure, and the ticks it skipped by
reason. With JOB (the job's key, which GocronOptions(job.Key()) makes its gocron
name too), it lists that job's last runs, newest first, its skipped ticks by
instance, and the instances that registered it, each in a state: live (its client
is open: seen within the last 6 minutes, as a refresh is due every 5), closed (its
client was closed) or gone (neither: its process died or was killed, or it lost
the database).

Outcomes: ok, error, panicked, lost (the lock was lost mid-run). Skip reasons:
other-instance (another instance owns the job: OnOneInstance), run-in-progress (a
run still holds the run lock: WithoutOverlapping), limit-reached (AtMost's permits
are all held), lease-in-doubt (the job's lease was taken or renewed too late to
vouch that no other instance ran the tick), slot-claimed (a job with a schedule:
another tick claimed the slot) and slot-missed (slots no tick ran, counted
each). A job with a schedule lists each run's slot and attempt, and what its
slots came to: ok, failed (no attempt left), running, lost (its holder died),
pending (another attempt to come), retried (attempts after the first). Times are
on the database's clock. Clients record runs unless RunHistory(0); runs are kept
7 days by default.`,
	example: `
pglock jobs
pglock jobs -n 5 inventory:stock-reconciliation
pglock jobs -json | jq -r '.[] | select(.last_run.outcome != "ok") | .job'`,
	connects: true,
	run:      runJobs,
}

func runJobs(ctx context.Context, e *env, fs *flag.FlagSet, args []string) error {
	asJSON := fs.Bool("json", false, "print JSON")
	n := fs.Int("n", 20, "with JOB: how many runs to list, 1 to 1000")
	rest, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 1 {
		return usageError("jobs: want at most one JOB, got %d arguments (pglock jobs -h)", len(rest))
	}
	if *n < 1 || *n > 1000 {
		return usageError("jobs: -n %d: want 1 to 1000", *n)
	}
	c, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer c.close()
	sctx, cancel := c.statementContext(ctx)
	defer cancel()
	now, err := c.now(sctx)
	if err != nil {
		return c.explain(ctx, "jobs", err)
	}
	jobs, err := c.client.JobStatuses(sctx)
	if err != nil {
		return c.explain(ctx, "jobs", err)
	}
	if len(rest) == 0 {
		if *asJSON {
			out := make([]jobJSON, len(jobs))
			for i, j := range jobs {
				out[i] = toJobJSON(j)
			}
			return writeJSON(e.stdout, out, false)
		}
		fmt.Fprintln(e.stdout, c.reached())
		printJobs(e.stdout, jobs, now, e.width)
		return nil
	}
	job := rest[0]
	runs, err := c.client.JobRuns(sctx, job, *n)
	if err != nil {
		return c.explain(ctx, "jobs", err)
	}
	var status pglock.JobStatus
	for _, j := range jobs {
		if j.Job == job {
			status = j
		}
	}
	if len(runs) == 0 && len(status.Skips) == 0 && len(status.Registrations) == 0 {
		if *asJSON {
			_ = writeJSON(e.stdout, jobRunsJSON{Job: job, Runs: []runJSON{}, Skips: []skipJSON{}, Registrations: []registrationJSON{}}, false)
		}
		return notFoundError("jobs: no job %q registered or recorded (within the retention)%s", job, didYouMean(jobs, job))
	}
	if *asJSON {
		out := jobRunsJSON{Job: job, Runs: make([]runJSON, len(runs)), Skips: skipsJSON(status.Skips),
			Registrations: registrationsJSON(status.Registrations), Slots: toSlotsJSON(status.Slots)}
		for i, r := range runs {
			out.Runs[i] = toRunJSON(r)
		}
		return writeJSON(e.stdout, out, false)
	}
	fmt.Fprintln(e.stdout, c.reached())
	printRuns(e.stdout, runs, status, now, e.width)
	return nil
}

// didYouMean names the jobs whose key ends with ":name" or "/name", for a name that is
// not a job's key: a gocron job named other than its pglock job's key.
func didYouMean(jobs []pglock.JobStatus, name string) string {
	var keys []string
	for _, j := range jobs {
		if strings.HasSuffix(j.Job, ":"+name) || strings.HasSuffix(j.Job, "/"+name) {
			keys = append(keys, strconv.Quote(j.Job))
		}
	}
	if len(keys) == 0 {
		return ": pglock jobs lists them"
	}
	return ": did you mean " + strings.Join(keys, " or ") + "? (a job is named by its key)"
}

// now reads the database's clock, which the history's times are on.
func (c *conn) now(ctx context.Context) (time.Time, error) {
	var now time.Time
	err := c.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now)
	return now, err
}

// printJobs writes one line per job, in width columns.
func printJobs(w io.Writer, jobs []pglock.JobStatus, now time.Time, width int) {
	if len(jobs) == 0 {
		fmt.Fprintln(w, "no jobs registered or recorded (clients record runs unless RunHistory(0); they are kept 7 days by default)")
		return
	}
	t := newTable(w, width, "JOB", "LAST RUN", "ON", "TOOK", "OUTCOME", "LAST FAILURE", "SKIPPED").
		clip(5, 24).clip(6, 12).clip(0, 16)
	for _, j := range jobs {
		cells := []string{text(j.Job), "never", "-", "-", "-"}
		if r := j.LastRun; r != nil {
			cells = []string{text(j.Job), relative(r.Started.Sub(now)), text(r.Instance), span(r.Ended.Sub(r.Started)), string(r.Outcome)}
		}
		failure := "-"
		if f := j.LastFailure; f != nil {
			failure = relative(f.Started.Sub(now)) + " on " + text(f.Instance) + ", " + string(f.Outcome)
			if f.Error != "" {
				failure += ": " + text(f.Error)
			}
		}
		t.row(append(cells, failure, skipSummary(j.Skips))...)
	}
	t.flush()
}

// skipSummary sums skips by reason: "other-instance 12, run-in-progress 1".
func skipSummary(skips []pglock.JobSkips) string {
	if len(skips) == 0 {
		return "-"
	}
	by := map[pglock.SkipReason]int64{}
	var reasons []string
	for _, s := range skips {
		if by[s.Reason] == 0 {
			reasons = append(reasons, string(s.Reason))
		}
		by[s.Reason] += s.Count
	}
	sort.Strings(reasons)
	parts := make([]string, len(reasons))
	for i, r := range reasons {
		parts[i] = r + " " + strconv.FormatInt(by[pglock.SkipReason(r)], 10)
	}
	return strings.Join(parts, ", ")
}

// printRuns writes one job's runs, its skips and its registrations, in width columns.
func printRuns(w io.Writer, runs []pglock.JobRun, j pglock.JobStatus, now time.Time, width int) {
	switch {
	case len(runs) == 0:
		fmt.Fprintln(w, "no runs recorded (within the retention)")
	case runs[0].Slot.IsZero():
		t := newTable(w, width, "STARTED (UTC)", "ON", "TOKEN", "TOOK", "OUTCOME", "ERROR").clip(5, 12).clip(1, 12)
		for _, r := range runs {
			t.row(stamp(r.Started), text(r.Instance), strconv.FormatInt(r.Token, 10), span(r.Ended.Sub(r.Started)),
				string(r.Outcome), text(r.Error))
		}
		t.flush()
	default:
		t := newTable(w, width, "SLOT (UTC)", "ATTEMPT", "STARTED", "ON", "TOKEN", "TOOK", "OUTCOME", "ERROR").clip(7, 12).clip(3, 12)
		for _, r := range runs {
			slot, attempt := "-", "-"
			if !r.Slot.IsZero() {
				slot, attempt = stamp(r.Slot), strconv.Itoa(r.Attempt)
			}
			t.row(slot, attempt, relative(r.Started.Sub(now)), text(r.Instance), strconv.FormatInt(r.Token, 10),
				span(r.Ended.Sub(r.Started)), string(r.Outcome), text(r.Error))
		}
		t.flush()
	}
	if s := j.Slots; s != nil {
		fmt.Fprintf(w, "\nslots up to %s: ok %d, failed %d, running %d, lost %d, pending %d, retried %d\n",
			stamp(s.Last), s.OK, s.Failed, s.Running, s.Lost, s.Pending, s.Retried)
	}
	if len(j.Skips) > 0 {
		fmt.Fprintln(w)
		t := newTable(w, width, "SKIPPED ON", "REASON", "TICKS", "LAST").clip(0, 12)
		for _, s := range j.Skips {
			t.row(text(s.Instance), string(s.Reason), strconv.FormatInt(s.Count, 10), relative(s.Last.Sub(now)))
		}
		t.flush()
	}
	if len(j.Registrations) > 0 {
		fmt.Fprintln(w)
		t := newTable(w, width, "REGISTERED ON", "STATE", "REGISTERED", "LAST SEEN").clip(0, 12)
		for _, r := range j.Registrations {
			t.row(text(r.Instance), string(r.State), relative(r.Registered.Sub(now)), relative(r.Seen.Sub(now)))
		}
		t.flush()
	}
}

// runJSON is a job run in -json output.
type runJSON struct {
	Job             string     `json:"job"`
	Instance        string     `json:"instance"`
	Owner           string     `json:"owner"`
	Token           int64      `json:"token"`
	Started         time.Time  `json:"started"`
	Ended           time.Time  `json:"ended"`
	DurationSeconds float64    `json:"duration_seconds"`
	Outcome         string     `json:"outcome"`
	Error           string     `json:"error,omitempty"`
	Slot            *time.Time `json:"slot,omitempty"`    // a job with a schedule's
	Attempt         int        `json:"attempt,omitempty"` // with a slot: 1, more for a retry
}

func toRunJSON(r pglock.JobRun) runJSON {
	out := runJSON{Job: r.Job, Instance: r.Instance, Owner: r.Owner, Token: r.Token,
		Started: r.Started.UTC(), Ended: r.Ended.UTC(), DurationSeconds: r.Ended.Sub(r.Started).Seconds(),
		Outcome: string(r.Outcome), Error: r.Error, Attempt: r.Attempt}
	if !r.Slot.IsZero() {
		slot := r.Slot.UTC()
		out.Slot = &slot
	}
	return out
}

// slotsJSON is what a job's slots came to, in -json output.
type slotsJSON struct {
	Last    time.Time `json:"last"`
	OK      int64     `json:"ok"`
	Failed  int64     `json:"failed"`
	Running int64     `json:"running"`
	Lost    int64     `json:"lost"`
	Pending int64     `json:"pending"`
	Retried int64     `json:"retried"`
}

func toSlotsJSON(s *pglock.JobSlots) *slotsJSON {
	if s == nil {
		return nil
	}
	return &slotsJSON{Last: s.Last.UTC(), OK: s.OK, Failed: s.Failed, Running: s.Running, Lost: s.Lost,
		Pending: s.Pending, Retried: s.Retried}
}

type skipJSON struct {
	Instance string    `json:"instance"`
	Reason   string    `json:"reason"`
	Count    int64     `json:"count"`
	Last     time.Time `json:"last"`
}

func skipsJSON(skips []pglock.JobSkips) []skipJSON {
	out := make([]skipJSON, len(skips))
	for i, s := range skips {
		out[i] = skipJSON{Instance: s.Instance, Reason: string(s.Reason), Count: s.Count, Last: s.Last.UTC()}
	}
	return out
}

// registrationJSON is a job's registration by an instance.
type registrationJSON struct {
	Instance   string    `json:"instance"`
	State      string    `json:"state"` // live, closed or gone
	Registered time.Time `json:"registered"`
	Seen       time.Time `json:"seen"` // its last refresh, or its close
}

func registrationsJSON(regs []pglock.Registration) []registrationJSON {
	out := make([]registrationJSON, len(regs))
	for i, r := range regs {
		out[i] = registrationJSON{Instance: r.Instance, State: string(r.State), Registered: r.Registered.UTC(), Seen: r.Seen.UTC()}
	}
	return out
}

// jobJSON is a job in jobs -json.
type jobJSON struct {
	Job           string             `json:"job"`
	LastRun       *runJSON           `json:"last_run"`     // null when none within the retention
	LastFailure   *runJSON           `json:"last_failure"` // null when none
	Skips         []skipJSON         `json:"skips"`
	Registrations []registrationJSON `json:"registrations"`   // the instances that registered it
	Slots         *slotsJSON         `json:"slots,omitempty"` // a job with a schedule's
}

func toJobJSON(j pglock.JobStatus) jobJSON {
	out := jobJSON{Job: j.Job, Skips: skipsJSON(j.Skips), Registrations: registrationsJSON(j.Registrations),
		Slots: toSlotsJSON(j.Slots)}
	if j.LastRun != nil {
		r := toRunJSON(*j.LastRun)
		out.LastRun = &r
	}
	if j.LastFailure != nil {
		r := toRunJSON(*j.LastFailure)
		out.LastFailure = &r
	}
	return out
}

// jobRunsJSON is jobs JOB -json.
type jobRunsJSON struct {
	Job           string             `json:"job"`
	Runs          []runJSON          `json:"runs"`
	Skips         []skipJSON         `json:"skips"`
	Registrations []registrationJSON `json:"registrations"`
	Slots         *slotsJSON         `json:"slots,omitempty"`
}
