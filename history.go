package pglock

import (
	"cmp"
	"context"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// Run history: what RunHistory records and JobRuns and Jobs read.
const (
	defaultRunRetention = 7 * 24 * time.Hour
	minRunRetention     = time.Second
	maxRunRetention     = 10 * 365 * 24 * time.Hour
	// maxRunErr is how many characters of a run's error the history keeps.
	maxRunErr = 1000
	// maxJobRuns is the most runs JobRuns returns, and the most runs of a job the
	// memory store keeps.
	maxJobRuns = 1000
	// skipFlushEvery is how often, at most, a client writes the skips it counted.
	skipFlushEvery = time.Second
	// maxPendingRuns bounds the runs waiting for the writer: runs that come faster than
	// the store takes them are dropped beyond it (and logged), never queued without end.
	maxPendingRuns = 10000
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
	Err      string // the error's text (a panic's value), at most 1000 characters; "" when none
}

// JobSkips counts the ticks of a job that one instance skipped for one reason.
type JobSkips struct {
	Instance string
	Reason   Reason
	Count    int64     // skipped ticks counted within the retention
	Last     time.Time // the last one counted, on the store's clock
}

// JobStatus is what the run history says of one job.
type JobStatus struct {
	Job         string
	LastRun     *JobRun    // nil when it never ran (within the retention)
	LastFailure *JobRun    // the last run whose Outcome is not OutcomeOK; nil when none
	Skips       []JobSkips // by instance, then reason
}

// historian is a store's capability of keeping job runs and skipped ticks (see
// RunHistory). The PostgreSQL and memory stores have it.
type historian interface {
	// recordRun records one run; retention says how old the job's runs may get.
	recordRun(ctx context.Context, r runRecord, retention time.Duration) error
	// recordSkips adds counts of skipped ticks of instance, one per job and reason.
	recordSkips(ctx context.Context, instance string, skips []skipCount, retention time.Duration) error
	// jobRuns returns the last limit runs of job, newest first.
	jobRuns(ctx context.Context, job string, limit int) ([]JobRun, error)
	// jobs returns every job with runs or skips.
	jobs(ctx context.Context) ([]JobStatus, error)
}

// runRecord is one run waiting to be written. ended is on the real clock of this
// process: the store turns it into its own clock when it writes the run.
type runRecord struct {
	job, instance, owner string
	token                int64
	ended                time.Time
	duration             time.Duration
	outcome              Outcome
	err                  string
}

// skipCount is the skips of one job for one reason counted since the last flush.
type skipCount struct {
	job    string
	reason Reason
	count  int64
	last   time.Time // real clock, as runRecord.ended
}

// RunHistory sets how long the run history keeps job runs: between 1s and 10 years,
// 7 days when not set; 0 turns recording off. With it on and a store of New,
// NewPostgresStore, NewSQLStore or NewMemoryStore, the client records every run of its
// Jobs and of its GocronLockers' jobs (job, instance, owner, token, start and end on
// the store's clock, outcome, error text), and counts the ticks they skip per job,
// instance and reason. Writes happen in the background, one statement per run after
// the run, and skip counts at most once a second, so a run never waits for them; a
// failed write is logged at warn and never fails a run. Close waits for what is
// pending (bounded by its ctx). The store deletes a job's runs older than retention
// now and then as it records them. Client.JobRuns and Client.Jobs read the history
// whatever this option says. It is a ClientOption.
func RunHistory(retention time.Duration) ClientOption {
	return clientOpt{name: "RunHistory", apply: func(s *settings) error {
		if retention != 0 && (retention < minRunRetention || retention > maxRunRetention) {
			return fmt.Errorf("%v: want 0 (off) or %v to %v", retention, minRunRetention, maxRunRetention)
		}
		s.runRetention = retention
		return nil
	}}
}

// JobRuns returns the last runs of job (a Job's key or a gocron job name), newest
// first, at most limit (1 to 1000), from every instance that recorded them. ctx bounds
// the store call. Errors: ErrInvalidKey for a bad job, ErrInvalidArgument for a limit
// out of range, an error wrapping errors.ErrUnsupported on a store that keeps no
// history, or the store's error. It is safe for concurrent use.
func (c *Client) JobRuns(ctx context.Context, job string, limit int) ([]JobRun, error) {
	if err := checkKey(job); err != nil {
		return nil, err
	}
	if limit < 1 || limit > maxJobRuns {
		return nil, invalidArg("JobRuns: limit %d: want 1 to %d", limit, maxJobRuns)
	}
	h, err := c.historian("job runs")
	if err != nil {
		return nil, err
	}
	return h.jobRuns(ctx, job, limit)
}

// Jobs returns every job with history, sorted by job: its last run, its last failure
// and its skips, from every instance. ctx bounds the store call. Errors: an error
// wrapping errors.ErrUnsupported on a store that keeps no history, or the store's
// error. It is safe for concurrent use.
func (c *Client) Jobs(ctx context.Context) ([]JobStatus, error) {
	h, err := c.historian("jobs")
	if err != nil {
		return nil, err
	}
	return h.jobs(ctx)
}

func (c *Client) historian(op string) (historian, error) {
	h, ok := c.store.(historian)
	if !ok {
		return nil, fmt.Errorf("pglock: %s: %T keeps no run history: %w", op, unwatched(c.store), errors.ErrUnsupported)
	}
	return h, nil
}

// jobRan reports a run of job under l that started at start (real clock) and ended
// now with outcome and err: an EventJobRan, and a record for the history.
func (c *Client) jobRan(job string, l *Lock, start time.Time, outcome Outcome, err string) {
	end := time.Now()
	ev := Event{Type: EventJobRan, Key: job, Duration: end.Sub(start), Outcome: outcome, Time: c.clock.Now()}
	if l != nil {
		ev.Owner, ev.Token = l.entry.Owner, l.token
	}
	c.events.emit(ev)
	c.history.record(runRecord{job: job, instance: c.instance, owner: ev.Owner, token: ev.Token,
		ended: end, duration: ev.Duration, outcome: outcome, err: runErrText(err)})
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

// history writes a client's runs and skip counts to its store in the background, on a
// goroutine started at the first record. Its methods do nothing on a nil history
// (recording off, or a store without the capability).
type history struct {
	store     historian
	logger    *slog.Logger
	instance  string
	retention time.Duration
	ctx       context.Context // the writes'; cancelled when Close stops waiting
	cancel    context.CancelFunc

	mu      sync.Mutex
	runs    []runRecord
	dropped int // runs dropped since the last write, maxPendingRuns being reached
	skips   map[skipKey]*skipCount
	flushed time.Time // the last write of skips, real clock
	started bool
	closed  bool
	wake    chan struct{} // buffered 1
	done    chan struct{} // closed when the writer ends
}

type skipKey struct {
	job    string
	reason Reason
}

// newHistory returns the history writer of a client on store, or nil when retention
// is 0 or store keeps no history.
func newHistory(store Store, logger *slog.Logger, instance string, retention time.Duration) *history {
	h, ok := store.(historian)
	if !ok || retention == 0 {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &history{store: h, logger: logger, instance: instance, retention: retention, ctx: ctx, cancel: cancel,
		skips: make(map[skipKey]*skipCount), wake: make(chan struct{}, 1), done: make(chan struct{})}
}

// record queues a run; after Close it is dropped.
func (h *history) record(r runRecord) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		h.logger.Debug("pglock: job run not recorded: the client is closed", slog.String("key", r.job),
			slog.String("owner", r.owner), slog.Int64("token", r.token))
		return
	}
	if len(h.runs) >= maxPendingRuns {
		h.dropped++
		return
	}
	h.runs = append(h.runs, r)
	h.signal()
}

// skip counts a skipped tick of job.
func (h *history) skip(job string, reason Reason) {
	if h == nil {
		return
	}
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	k := skipKey{job, reason}
	s := h.skips[k]
	if s == nil {
		s = &skipCount{job: job, reason: reason}
		h.skips[k] = s
	}
	s.count++
	s.last = now
	h.signal()
}

// signal wakes the writer, starting it the first time. h.mu is held.
func (h *history) signal() {
	if !h.started {
		h.started = true
		go h.write()
	}
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// write is the writer: it writes the runs queued, one statement each, and the skips
// counted once skipFlushEvery has passed since their last write (at once when
// closing), until Close.
func (h *history) write() {
	defer close(h.done)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		h.mu.Lock()
		runs, dropped := h.runs, h.dropped
		h.runs, h.dropped = nil, 0
		closed := h.closed
		var skips []skipCount
		var wait time.Duration
		if len(h.skips) > 0 {
			if due := h.flushed.Add(skipFlushEvery); closed || !time.Now().Before(due) {
				for _, s := range h.skips {
					skips = append(skips, *s)
				}
				clear(h.skips)
				h.flushed = time.Now()
			} else {
				wait = time.Until(due)
			}
		}
		h.mu.Unlock()
		if h.ctx.Err() != nil { // Close gave up waiting: drop the rest
			if n := len(runs); n > 0 {
				h.logger.Warn("pglock: job runs not recorded: Close did not wait for them", slog.Int("runs", n))
			}
			return
		}
		if dropped > 0 {
			h.logger.Warn("pglock: job runs not recorded: they came faster than the store took them",
				slog.Int("runs", dropped))
		}
		for _, r := range runs {
			h.writeRun(r)
		}
		if len(skips) > 0 {
			h.writeSkips(skips)
		}
		if len(runs) > 0 || len(skips) > 0 {
			continue // more may have come meanwhile
		}
		if closed {
			return
		}
		if wait > 0 {
			timer.Reset(wait)
		}
		select {
		case <-h.wake:
		case <-timer.C:
		}
		timer.Stop()
	}
}

func (h *history) writeRun(r runRecord) {
	ctx, cancel := context.WithTimeout(h.ctx, storeTimeout)
	defer cancel()
	if err := h.store.recordRun(ctx, r, h.retention); err != nil {
		h.logger.Warn("pglock: job run not recorded", slog.String("key", r.job), slog.String("owner", r.owner),
			slog.Int64("token", r.token), slog.Any("err", err))
	}
}

func (h *history) writeSkips(skips []skipCount) {
	slices.SortFunc(skips, func(a, b skipCount) int {
		return cmp.Or(strings.Compare(a.job, b.job), strings.Compare(string(a.reason), string(b.reason)))
	})
	ctx, cancel := context.WithTimeout(h.ctx, storeTimeout)
	defer cancel()
	if err := h.store.recordSkips(ctx, h.instance, skips, h.retention); err != nil {
		h.logger.Warn("pglock: skipped job ticks not counted", slog.Int("jobs", len(skips)), slog.Any("err", err))
	}
}

// close is Close's step: it writes what is pending, until ctx ends; then the writes
// in flight are cancelled and the rest dropped.
func (h *history) close(ctx context.Context) error {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	h.closed = true
	started := h.started
	h.mu.Unlock()
	defer h.cancel()
	if !started {
		return nil
	}
	select {
	case h.wake <- struct{}{}:
	default:
	}
	return waitDone(ctx, h.done)
}

// The PostgreSQL store's history: pglock.job_runs and pglock.job_skips (000008). The
// reads return JSON, one value, so that they go through the store's one-row calls with
// every driver; times travel as microseconds since the epoch, whatever the session's
// TimeZone.

func (s *postgresStore) recordRun(ctx context.Context, r runRecord, retention time.Duration) error {
	var errText any
	if r.err != "" {
		errText = r.err
	}
	var id int64
	err := s.queryRow(ctx, `SELECT pglock.job_run_record($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
		r.job, r.instance, r.owner, r.token, sinceUS(r.ended), r.duration.Microseconds(),
		string(r.outcome), errText, ttlMillis(retention)).Scan(&id)
	if err != nil {
		return storeError(err, "record a run of %q", r.job)
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
type skipsJSON []skipCount

func (skips skipsJSON) Value() (driver.Value, error) {
	elems := make([]skipJSON, len(skips))
	for i, k := range skips {
		elems[i] = skipJSON{Job: k.job, Reason: string(k.reason), Count: k.count, AgoUS: max(time.Since(k.last), 0).Microseconds()}
	}
	b, err := json.Marshal(elems)
	return string(b), err
}

func (s *postgresStore) recordSkips(ctx context.Context, instance string, skips []skipCount, retention time.Duration) error {
	var written int
	if err := s.queryRow(ctx, `SELECT pglock.job_skips_record($1, $2, $3)`, instance, skipsJSON(skips), ttlMillis(retention)).
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
}

func (r runJSON) run() JobRun {
	run := JobRun{Job: r.Job, Instance: r.Instance, Owner: r.Owner, Token: r.Token,
		Started: time.UnixMicro(r.StartedUS), Ended: time.UnixMicro(r.EndedUS), Outcome: Outcome(r.Outcome)}
	if r.Err != nil {
		run.Err = *r.Err
	}
	return run
}

// runFields is the JSON object of a run r in the reads.
const runFields = `'job', r.job, 'instance', r.instance, 'owner', r.owner, 'token', r.fencing_token,
	'started_us', round(extract(epoch FROM r.started_at) * 1000000)::bigint,
	'ended_us', round(extract(epoch FROM r.ended_at) * 1000000)::bigint,
	'outcome', r.outcome, 'error', r.error`

func (s *postgresStore) jobRuns(ctx context.Context, job string, limit int) ([]JobRun, error) {
	var out string
	err := s.queryRow(ctx, `SELECT coalesce(json_agg(json_build_object(`+runFields+`)
		ORDER BY r.ended_at DESC, r.id DESC), '[]')::text FROM pglock.job_run_list($1, $2) r`, job, limit).Scan(&out)
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

func (s *postgresStore) jobs(ctx context.Context) ([]JobStatus, error) {
	var out string
	err := s.queryRow(ctx, `SELECT json_build_object(
		'runs', (SELECT coalesce(json_agg(json_build_object('last_failure', r.last_failure, `+runFields+`)), '[]')
			FROM pglock.job_last_runs() r),
		'skips', (SELECT coalesce(json_agg(json_build_object('job', s.job, 'instance', s.instance,
			'reason', s.reason, 'count', s.count, 'last_us', round(extract(epoch FROM s.last_at) * 1000000)::bigint)), '[]')
			FROM pglock.job_skip_list() s))::text`).Scan(&out)
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
		j.Skips = append(j.Skips, JobSkips{Instance: k.Instance, Reason: Reason(k.Reason), Count: k.Count,
			Last: time.UnixMicro(k.LastUS)})
	}
	return st.sorted(), nil
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
			return cmp.Or(strings.Compare(a.Instance, b.Instance), strings.Compare(string(a.Reason), string(b.Reason)))
		})
		out = append(out, *j)
	}
	slices.SortFunc(out, func(a, b JobStatus) int { return strings.Compare(a.Job, b.Job) })
	return out
}

// memoryHistory is the memory store's history: at most maxJobRuns runs a job, pruned
// by retention as they are recorded. Its zero value is ready.
type memoryHistory struct {
	mu    sync.Mutex
	runs  map[string][]JobRun // by job, oldest first
	skips map[memorySkipKey]JobSkips
}

type memorySkipKey struct {
	job, instance string
	reason        Reason
}

func (s *memoryStore) recordRun(_ context.Context, r runRecord, retention time.Duration) error {
	now := s.clock.Now()
	ended := now.Add(-max(time.Since(r.ended), 0))
	run := JobRun{Job: r.job, Instance: r.instance, Owner: r.owner, Token: r.token, Started: ended.Add(-r.duration),
		Ended: ended, Outcome: r.outcome, Err: r.err}
	h := &s.history
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.runs == nil {
		h.runs = make(map[string][]JobRun)
	}
	runs := append(h.runs[r.job], run)
	cut := 0
	for cut < len(runs) && (len(runs)-cut > maxJobRuns || runs[cut].Ended.Before(now.Add(-retention))) {
		cut++
	}
	h.runs[r.job] = runs[cut:]
	return nil
}

func (s *memoryStore) recordSkips(_ context.Context, instance string, skips []skipCount, retention time.Duration) error {
	now := s.clock.Now()
	h := &s.history
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.skips == nil {
		h.skips = make(map[memorySkipKey]JobSkips)
	}
	for _, k := range skips {
		key := memorySkipKey{k.job, instance, k.reason}
		j := h.skips[key]
		j.Instance, j.Reason = instance, k.reason
		j.Count += k.count
		if last := now.Add(-max(time.Since(k.last), 0)); last.After(j.Last) {
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

func (s *memoryStore) jobRuns(_ context.Context, job string, limit int) ([]JobRun, error) {
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

func (s *memoryStore) jobs(context.Context) ([]JobStatus, error) {
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
