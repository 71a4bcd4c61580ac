package store

import (
	"cmp"
	"context"
	"database/sql/driver"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// The stores' side of the run history (pglock's history.go, and history_writer.go).

// The PostgreSQL store's history: pglock.Job_runs and pglock.Job_skips (000008). The
// reads return JSON, one value, so that they go through the store's one-row calls with
// every driver; times travel as microseconds since the epoch, whatever the session's
// TimeZone.

func (s *postgresStore) RecordRun(ctx context.Context, r RunRecord, retention time.Duration) error {
	var errText any
	if r.Err != "" {
		errText = r.Err
	}
	var id int64
	var err error
	if r.Attempt == 0 {
		err = s.queryRow(ctx, `SELECT pglock.Job_run_record($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
			r.Job, r.Instance, r.Owner, r.Token, sinceUS(r.Ended), r.Duration.Microseconds(),
			r.Outcome, errText, ttlMillis(retention)).Scan(&id)
	} else {
		err = s.queryRow(ctx, `SELECT pglock.Job_run_record($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`,
			r.Job, r.Instance, r.Owner, r.Token, sinceUS(r.Ended), r.Duration.Microseconds(),
			r.Outcome, errText, ttlMillis(retention), slotMillis(r.Slot), r.Attempt).Scan(&id)
	}
	if err != nil {
		return storeError(err, "record a run of %q", r.Job)
	}
	return nil
}

// sinceUS is the microseconds since t, as a statement's argument: the drivers take its
// Value when they encode the statement, with a connection in hand and the statement
// prepared, so that the time a connection takes to open does not shift the run's end
// on the database clock.
type sinceUS time.Time

func (t sinceUS) Value() (driver.Value, error) {
	return max(time.Since(time.Time(t)), 0).Microseconds(), nil
}

// skipJSON is one element of job_skips_record's skips.
type skipJSON struct {
	Job    string `json:"job"`
	Reason string `json:"reason"`
	Count  int64  `json:"count"`
	AgoUS  int64  `json:"ago_us"`
}

// skipsJSON is job_skips_record's skips argument, written when the driver takes its
// Value, as sinceUS.
type skipsJSON []SkipCount

func (skips skipsJSON) Value() (driver.Value, error) {
	elems := make([]skipJSON, len(skips))
	for i, k := range skips {
		elems[i] = skipJSON{Job: k.Job, Reason: k.Reason, Count: k.Count, AgoUS: max(time.Since(k.Last), 0).Microseconds()}
	}
	b, err := json.Marshal(elems)
	return string(b), err
}

func (s *postgresStore) RecordSkips(ctx context.Context, instance string, skips []SkipCount, retention time.Duration) error {
	var written int
	if err := s.queryRow(ctx, `SELECT pglock.Job_skips_record($1, $2, $3)`, instance, skipsJSON(skips), ttlMillis(retention)).
		Scan(&written); err != nil {
		return storeError(err, "count skipped ticks")
	}
	return nil
}

// runJSON is a run as the reads return it.
type runJSON struct {
	LastFailure bool    `json:"last_failure"`
	Job         string  `json:"job"`
	Instance    string  `json:"instance"`
	Owner       string  `json:"owner"`
	Token       int64   `json:"token"`
	StartedUS   int64   `json:"started_us"`
	EndedUS     int64   `json:"ended_us"`
	Outcome     string  `json:"outcome"`
	Err         *string `json:"error"`
	SlotMS      *int64  `json:"slot_ms"`
	Attempt     int     `json:"attempt"`
}

func (r runJSON) run() JobRun {
	run := JobRun{Job: r.Job, Instance: r.Instance, Owner: r.Owner, Token: r.Token,
		Started: time.UnixMicro(r.StartedUS), Ended: time.UnixMicro(r.EndedUS), Outcome: r.Outcome,
		Attempt: r.Attempt}
	if r.Err != nil {
		run.Error = *r.Err
	}
	if r.SlotMS != nil {
		run.Slot = time.UnixMilli(*r.SlotMS)
	}
	return run
}

// runFields is the JSON object of a run r in the reads.
const runFields = `'job', r.Job, 'instance', r.Instance, 'owner', r.Owner, 'token', r.fencing_token,
	'started_us', round(extract(epoch FROM r.started_at) * 1000000)::bigint,
	'ended_us', round(extract(epoch FROM r.Ended_at) * 1000000)::bigint,
	'outcome', r.Outcome, 'error', r.Error`

func (s *postgresStore) JobRuns(ctx context.Context, job string, limit int) ([]JobRun, error) {
	var out string
	err := s.queryRow(ctx, `SELECT coalesce(json_agg(json_build_object(`+runFields+`,
		'slot_ms', round(extract(epoch FROM r.slot) * 1000)::bigint, 'attempt', coalesce(r.attempt, 0))
		ORDER BY r.Ended_at DESC, r.id DESC), '[]')::text FROM pglock.Job_run_list($1, $2) r`, job, limit).Scan(&out)
	if err != nil {
		return nil, storeError(err, "read the runs of %q", job)
	}
	var rows []runJSON
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		return nil, fmt.Errorf("pglock: read the runs of %q: %w", job, err)
	}
	runs := make([]JobRun, len(rows))
	for i, r := range rows {
		runs[i] = r.run()
	}
	return runs, nil
}

func (s *postgresStore) JobStatuses(ctx context.Context) ([]JobStatus, error) {
	var out string
	err := s.queryRow(ctx, `SELECT json_build_object(
		'runs', (SELECT coalesce(json_agg(json_build_object('last_failure', r.last_failure, `+runFields+`,
			'slot_ms', x.slot_ms, 'attempt', coalesce(x.attempt, 0))), '[]')
			FROM pglock.Job_last_runs() r CROSS JOIN LATERAL pglock.Job_run_slot(r.id) x),
		'skips', (SELECT coalesce(json_agg(json_build_object('job', s.job, 'instance', s.instance,
			'reason', s.reason, 'count', s.count, 'last_us', round(extract(epoch FROM s.last_at) * 1000000)::bigint)), '[]')
			FROM pglock.Job_skip_list() s),
		'slots', (SELECT coalesce(json_agg(json_build_object('job', t.job,
			'last_ms', round(extract(epoch FROM t.last_slot) * 1000)::bigint, 'ok', t.ok, 'failed', t.failed,
			'running', t.running, 'lost', t.lost, 'pending', t.pending, 'retried', t.retried)), '[]')
			FROM pglock.Job_slot_stats() t))::text`).Scan(&out)
	if err != nil {
		return nil, storeError(err, "read the jobs")
	}
	var v struct {
		Runs  []runJSON `json:"runs"`
		Skips []struct {
			Job      string `json:"job"`
			Instance string `json:"instance"`
			Reason   string `json:"reason"`
			Count    int64  `json:"count"`
			LastUS   int64  `json:"last_us"`
		} `json:"skips"`
		Slots []struct {
			Job     string `json:"job"`
			LastMS  int64  `json:"last_ms"`
			OK      int64  `json:"ok"`
			Failed  int64  `json:"failed"`
			Running int64  `json:"running"`
			Lost    int64  `json:"lost"`
			Pending int64  `json:"pending"`
			Retried int64  `json:"retried"`
		} `json:"slots"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		return nil, fmt.Errorf("pglock: read the jobs: %w", err)
	}
	st := make(statuses)
	for _, r := range v.Runs {
		run := r.run()
		if r.LastFailure {
			st.of(r.Job).LastFailure = &run
		} else {
			st.of(r.Job).LastRun = &run
		}
	}
	for _, k := range v.Skips {
		j := st.of(k.Job)
		j.Skips = append(j.Skips, JobSkips{Instance: k.Instance, Reason: k.Reason, Count: k.Count,
			Last: time.UnixMicro(k.LastUS)})
	}
	for _, k := range v.Slots {
		st.of(k.Job).Slots = &JobSlots{Last: time.UnixMilli(k.LastMS), OK: k.OK, Failed: k.Failed, Running: k.Running,
			Lost: k.Lost, Pending: k.Pending, Retried: k.Retried}
	}
	return st.sorted(), nil
}

// MaxJobRuns is the most runs JobRuns returns, and the most runs of a job the memory
// store keeps.
const MaxJobRuns = 1000

// memoryHistory is the memory store's history: at most MaxJobRuns runs a job, pruned
// by retention as they are recorded. Its zero value is ready.
type memoryHistory struct {
	mu    sync.Mutex
	runs  map[string][]JobRun // by job, oldest first
	skips map[memorySkipKey]JobSkips
}

type memorySkipKey struct {
	job, instance string
	reason        string
}

func (s *memoryStore) RecordRun(_ context.Context, r RunRecord, retention time.Duration) error {
	now := s.clock.Now()
	ended := now.Add(-max(time.Since(r.Ended), 0))
	run := JobRun{Job: r.Job, Instance: r.Instance, Owner: r.Owner, Token: r.Token, Started: ended.Add(-r.Duration),
		Ended: ended, Outcome: r.Outcome, Error: r.Err, Slot: r.Slot, Attempt: r.Attempt}
	h := &s.history
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.runs == nil {
		h.runs = make(map[string][]JobRun)
	}
	runs := append(h.runs[r.Job], run)
	cut := 0
	for cut < len(runs) && (len(runs)-cut > MaxJobRuns || runs[cut].Ended.Before(now.Add(-retention))) {
		cut++
	}
	h.runs[r.Job] = runs[cut:]
	return nil
}

func (s *memoryStore) RecordSkips(_ context.Context, instance string, skips []SkipCount, retention time.Duration) error {
	now := s.clock.Now()
	h := &s.history
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.skips == nil {
		h.skips = make(map[memorySkipKey]JobSkips)
	}
	for _, k := range skips {
		key := memorySkipKey{k.Job, instance, k.Reason}
		j := h.skips[key]
		j.Instance, j.Reason = instance, k.Reason
		j.Count += k.Count
		if last := now.Add(-max(time.Since(k.Last), 0)); last.After(j.Last) {
			j.Last = last
		}
		h.skips[key] = j
	}
	for key, j := range h.skips {
		if j.Last.Before(now.Add(-retention)) {
			delete(h.skips, key)
		}
	}
	return nil
}

func (s *memoryStore) JobRuns(_ context.Context, job string, limit int) ([]JobRun, error) {
	h := &s.history
	h.mu.Lock()
	defer h.mu.Unlock()
	runs := h.runs[job]
	out := make([]JobRun, 0, min(limit, len(runs)))
	for i := len(runs) - 1; i >= 0 && len(out) < limit; i-- {
		out = append(out, runs[i])
	}
	return out, nil
}

func (s *memoryStore) JobStatuses(context.Context) ([]JobStatus, error) {
	h := &s.history
	h.mu.Lock()
	defer h.mu.Unlock()
	st := make(statuses)
	for job, runs := range h.runs {
		if len(runs) == 0 {
			continue
		}
		last := runs[len(runs)-1]
		st.of(job).LastRun = &last
		for i := len(runs) - 1; i >= 0; i-- {
			if runs[i].Outcome != OutcomeOK {
				failure := runs[i]
				st.of(job).LastFailure = &failure
				break
			}
		}
	}
	for key, j := range h.skips {
		st.of(key.job).Skips = append(st.of(key.job).Skips, j)
	}
	return st.sorted(), nil
}

// WithRegistrations returns jobs with the registrations of jobs regs added, a job that
// only regs know listed too, sorted by job (see pglock.Client.JobStatuses).
func WithRegistrations(jobs []JobStatus, regs []RegistryRow) []JobStatus {
	st := make(statuses, len(jobs))
	for _, j := range jobs {
		st[j.Job] = &j
	}
	for _, r := range regs {
		j := st.of(r.Key)
		j.Registrations = append(j.Registrations, r.Registration)
	}
	return st.sorted()
}

// statuses gathers JobStatus values by job.
type statuses map[string]*JobStatus

func (st statuses) of(job string) *JobStatus {
	j := st[job]
	if j == nil {
		j = &JobStatus{Job: job}
		st[job] = j
	}
	return j
}

func (st statuses) sorted() []JobStatus {
	out := make([]JobStatus, 0, len(st))
	for _, j := range st {
		slices.SortFunc(j.Skips, func(a, b JobSkips) int {
			return cmp.Or(strings.Compare(a.Instance, b.Instance), strings.Compare(a.Reason, b.Reason))
		})
		out = append(out, *j)
	}
	slices.SortFunc(out, func(a, b JobStatus) int { return strings.Compare(a.Job, b.Job) })
	return out
}
