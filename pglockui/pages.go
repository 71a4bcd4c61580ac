package pglockui

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pgfence/pglock"
)

// pageSize is how many locks a page of the locks table shows.
const pageSize = 100

// page is what every page's layout needs.
type page struct {
	Title   string
	Nav     string // "locks", "jobs", "elections": the current section
	Base    string // the relative URL of the console's root from this page: "./" or "../"
	Health  pglock.Health
	Actions bool   // force-release and prune are enabled
	Err     string // the store's error: the banner instead of the data
	Data    any
}

// baseOf is the relative URL of the console's root from r's page: one "../" per
// directory below the root (a job's key is one path-escaped segment).
func baseOf(r *http.Request) string {
	if n := strings.Count(r.URL.EscapedPath(), "/") - 1; n > 0 {
		return strings.Repeat("../", n)
	}
	return "./"
}

func (c *console) newPage(r *http.Request, nav, title string) *page {
	return &page{Title: title, Nav: nav, Base: baseOf(r), Health: c.client.Health(), Actions: c.authorize != nil}
}

// storeFailed makes p the error banner's page for err, and says whether err was one.
func (c *console) storeFailed(r *http.Request, p *page, err error) bool {
	if err == nil {
		return false
	}
	c.logger.LogAttrs(r.Context(), slog.LevelWarn, "pglockui: store call failed", slog.Any("err", err))
	p.Err, p.Data = err.Error(), nil
	return true
}

// render writes p with the template name, status 503 when p holds a store error.
func (c *console) render(w http.ResponseWriter, r *http.Request, name string, p *page) {
	var b bytes.Buffer
	if err := c.pages[name].ExecuteTemplate(&b, "layout", p); err != nil {
		c.logger.LogAttrs(r.Context(), slog.LevelError, "pglockui: render", slog.Any("err", err))
		http.Error(w, "pglockui: render "+name+": "+err.Error(), http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Security-Policy", "default-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'self'")
	h.Set("X-Content-Type-Options", "nosniff")
	if p.Err != "" {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_, _ = w.Write(b.Bytes())
}

// fail writes a page with only a message: 400 for bad input, 404 for no page.
func (c *console) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	p := c.newPage(r, "", http.StatusText(status))
	p.Data = msg
	var b bytes.Buffer
	if err := c.pages["message"].ExecuteTemplate(&b, "layout", p); err != nil {
		http.Error(w, msg, status)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

func queryContext(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), queryTimeout)
}

// lockRow is one row of the locks table.
type lockRow struct {
	pglock.LockInfo
	State   string        // "held", "expiring" or "free"
	HeldFor time.Duration // 0 when unknown or free
	Expires string        // ExpiresAt in RFC 3339 with ms, for the script's countdown
}

type sortColumn struct {
	Name, Label string
	Sort        string // the sort parameter its button asks for
	Aria        string // aria-sort: "ascending", "descending" or "none"
}

type locksData struct {
	Prefix    string
	Sort      string
	Columns   []sortColumn
	Rows      []lockRow
	Total     int
	HeldCount int // rows whose lock is Held
	Page      int
	Pages     int
	First     int // 1-based index of the first row shown
	Last      int
	Now       string // the store's clock when it read the locks (RFC 3339, ms)
	Prev      string // URLs of the previous and next pages; "" when none
	Next      string
	SortQuery string // the prefix as a query, for the sort buttons' form
}

var lockColumns = []struct{ name, label string }{
	{"key", "Key"}, {"instance", "Instance"}, {"token", "Token"}, {"held", "Held for"}, {"expires", "Expires in"}, {"waiting", "Waiting"},
}

// lockOrder orders locks by a column, key then permit breaking ties; now is the store's clock.
func lockOrder(col string, desc bool, now time.Time) func(a, b pglock.LockInfo) int {
	heldFor := func(l pglock.LockInfo) time.Duration {
		if !l.Held || l.AcquiredAt.IsZero() {
			return 0
		}
		return now.Sub(l.AcquiredAt)
	}
	by := func(a, b pglock.LockInfo) int {
		switch col {
		case "instance":
			return strings.Compare(a.Instance, b.Instance)
		case "token":
			return cmp.Compare(a.Token, b.Token)
		case "held":
			return cmp.Compare(heldFor(a), heldFor(b))
		case "expires":
			return cmp.Compare(a.ExpiresIn, b.ExpiresIn)
		case "waiting":
			return cmp.Compare(boolInt(a.Waiting), boolInt(b.Waiting))
		}
		return 0
	}
	return func(a, b pglock.LockInfo) int {
		c := by(a, b)
		if c == 0 {
			c = cmp.Or(strings.Compare(a.Key, b.Key), cmp.Compare(a.Permit, b.Permit))
		}
		if desc {
			return -c
		}
		return c
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (c *console) locks(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	prefix := q.Get("prefix")
	sortBy := cmp.Or(q.Get("sort"), "key")
	col, desc := strings.CutPrefix(sortBy, "-")
	if !slices.ContainsFunc(lockColumns, func(c struct{ name, label string }) bool { return c.name == col }) {
		c.fail(w, r, http.StatusBadRequest, fmt.Sprintf("sort %q: want one of key, instance, token, held, expires, waiting, with - before it for descending", sortBy))
		return
	}
	pageNo := 1
	if s := q.Get("page"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			c.fail(w, r, http.StatusBadRequest, fmt.Sprintf("page %q: want a whole number from 1", s))
			return
		}
		pageNo = n
	}
	p := c.newPage(r, "locks", "Locks")
	ctx, cancel := queryContext(r)
	defer cancel()
	infos, err := c.client.Locks(ctx, prefix)
	if errors.Is(err, pglock.ErrInvalidArgument) {
		c.fail(w, r, http.StatusBadRequest, "prefix: "+strings.TrimPrefix(err.Error(), "pglock: invalid argument: "))
		return
	}
	if c.storeFailed(r, p, err) {
		c.render(w, r, "locks", p)
		return
	}
	d := locksData{Prefix: prefix, Sort: sortBy, Total: len(infos)}
	now := time.Now()
	if len(infos) > 0 { // the store's clock, as it read the locks
		now = infos[0].ExpiresAt.Add(-infos[0].ExpiresIn)
	}
	for _, l := range infos {
		if l.Held {
			d.HeldCount++
		}
	}
	d.Now = stamp(now)
	if col != "key" || desc {
		slices.SortFunc(infos, lockOrder(col, desc, now))
	}
	d.Pages = max(1, (len(infos)+pageSize-1)/pageSize)
	d.Page = min(pageNo, d.Pages)
	from := (d.Page - 1) * pageSize
	for _, l := range infos[from:min(from+pageSize, len(infos))] {
		d.Rows = append(d.Rows, lockRowOf(l))
	}
	d.First, d.Last = from+1, from+len(d.Rows)
	link := func(n int) string {
		v := url.Values{}
		if prefix != "" {
			v.Set("prefix", prefix)
		}
		if sortBy != "key" {
			v.Set("sort", sortBy)
		}
		if n > 1 {
			v.Set("page", strconv.Itoa(n))
		}
		return "?" + v.Encode()
	}
	if d.Page > 1 {
		d.Prev = link(d.Page - 1)
	}
	if d.Page < d.Pages {
		d.Next = link(d.Page + 1)
	}
	for _, lc := range lockColumns {
		sc := sortColumn{Name: lc.name, Label: lc.label, Sort: lc.name, Aria: "none"}
		if lc.name == col {
			sc.Aria = "ascending"
			sc.Sort = "-" + lc.name
			if desc {
				sc.Aria, sc.Sort = "descending", lc.name
			}
		}
		d.Columns = append(d.Columns, sc)
	}
	p.Data = d
	c.render(w, r, "locks", p)
}

func lockRowOf(l pglock.LockInfo) lockRow {
	row := lockRow{LockInfo: l, State: "free", Expires: stamp(l.ExpiresAt)}
	if l.Held {
		row.State = "held"
		if l.TTL > 0 && l.ExpiresIn < l.TTL/3 {
			row.State = "expiring"
		}
		if !l.AcquiredAt.IsZero() {
			row.HeldFor = l.ExpiresAt.Add(-l.ExpiresIn).Sub(l.AcquiredAt)
		}
	}
	return row
}

// stamp is t in RFC 3339 with milliseconds, in UTC.
func stamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z07:00") }

// jobRow is one row of the jobs table.
type jobRow struct {
	pglock.JobStatus
	Owner string // the instance holding its OnOneInstance lease, or its run lock; "" when none
}

func (c *console) jobs(w http.ResponseWriter, r *http.Request) {
	p := c.newPage(r, "jobs", "Jobs")
	ctx, cancel := queryContext(r)
	defer cancel()
	statuses, err := c.client.JobStatuses(ctx)
	if c.storeFailed(r, p, err) {
		c.render(w, r, "jobs", p)
		return
	}
	// One read of the locks for every job's owner: a job's lease is its key with
	// ":owner" after it (OnOneInstance), its run lock its key (WithoutOverlapping).
	locks, err := c.client.Locks(ctx, "")
	if c.storeFailed(r, p, err) {
		c.render(w, r, "jobs", p)
		return
	}
	held := make(map[string]string, len(locks))
	for _, l := range locks {
		if l.Held {
			held[l.Key] = l.Instance
		}
	}
	rows := make([]jobRow, len(statuses))
	for i, s := range statuses {
		rows[i] = jobRow{JobStatus: s, Owner: cmp.Or(held[s.Job+":owner"], held[s.Job])}
	}
	p.Data = rows
	c.render(w, r, "jobs", p)
}

// windows are the timeline's spans a job's page offers.
var windows = map[string]time.Duration{"1h": time.Hour, "24h": 24 * time.Hour}

type jobData struct {
	Job      string
	Window   string
	Windows  []string
	Timeline timeline
	Runs     []pglock.JobRun
	Slots    *slotsData // nil for a job without slots
}

// runsLimit is how many runs a job's page reads: the most JobRuns returns.
const runsLimit = 1000

func (c *console) job(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	window := cmp.Or(r.URL.Query().Get("window"), "1h")
	span, ok := windows[window]
	if !ok {
		c.fail(w, r, http.StatusBadRequest, fmt.Sprintf("window %q: want 1h or 24h", window))
		return
	}
	p := c.newPage(r, "jobs", "Job "+key)
	ctx, cancel := queryContext(r)
	defer cancel()
	runs, err := c.client.JobRuns(ctx, key, runsLimit)
	if errors.Is(err, pglock.ErrInvalidKey) || errors.Is(err, pglock.ErrInvalidArgument) {
		c.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	if c.storeFailed(r, p, err) {
		c.render(w, r, "job", p)
		return
	}
	// The job's slot counts and skips: JobStatuses reads every job's, in one statement.
	statuses, err := c.client.JobStatuses(ctx)
	if c.storeFailed(r, p, err) {
		c.render(w, r, "job", p)
		return
	}
	var status *pglock.JobStatus
	if i := slices.IndexFunc(statuses, func(s pglock.JobStatus) bool { return s.Job == key }); i >= 0 {
		status = &statuses[i]
	}
	var policy *pglock.SlotPolicy
	if sp, ok := c.policies[key]; ok {
		policy = &sp
	}
	slots := slotsOf(runs, status, policy)
	now := time.Now()
	if len(runs) > 0 && runs[0].Ended.After(now) { // the store's clock ahead of ours
		now = runs[0].Ended
	}
	p.Data = jobData{Job: key, Window: window, Windows: []string{"1h", "24h"},
		Timeline: layoutTimeline(runs, slots, now.Add(-span), now), Runs: runs, Slots: slots}
	c.render(w, r, "job", p)
}

type electionsData struct {
	Listed bool // the client lists its elections
	Rows   []lockRow
}

func (c *console) elections(w http.ResponseWriter, r *http.Request) {
	p := c.newPage(r, "elections", "Elections")
	lister, ok := any(c.client).(elections)
	if !ok {
		p.Data = electionsData{}
		c.render(w, r, "elections", p)
		return
	}
	ctx, cancel := queryContext(r)
	defer cancel()
	infos, err := lister.Elections(ctx)
	if c.storeFailed(r, p, err) {
		c.render(w, r, "elections", p)
		return
	}
	d := electionsData{Listed: true}
	for _, l := range infos {
		d.Rows = append(d.Rows, lockRowOf(l))
	}
	p.Data = d
	c.render(w, r, "elections", p)
}

// human formats d for a person: "2h03m", "4m05s", "12.3s", "850ms".
func human(d time.Duration) string {
	neg := d < 0
	if neg {
		d = -d
	}
	var s string
	switch {
	case d >= 24*time.Hour:
		s = fmt.Sprintf("%dd%02dh", d/(24*time.Hour), d%(24*time.Hour)/time.Hour)
	case d >= time.Hour:
		s = fmt.Sprintf("%dh%02dm", d/time.Hour, d%time.Hour/time.Minute)
	case d >= time.Minute:
		s = fmt.Sprintf("%dm%02ds", d/time.Minute, d%time.Minute/time.Second)
	case d >= 10*time.Second:
		s = fmt.Sprintf("%ds", d/time.Second)
	case d >= time.Second:
		s = fmt.Sprintf("%.1fs", d.Seconds())
	default:
		s = fmt.Sprintf("%dms", d/time.Millisecond)
	}
	if neg {
		return "-" + s
	}
	return s
}

var funcs = template.FuncMap{
	"human":      human,
	"stamp":      stamp,
	"clock":      func(t time.Time) string { return t.Local().Format("15:04:05") },
	"ms":         func(d time.Duration) int64 { return d.Milliseconds() },
	"path":       url.PathEscape,
	"sub":        func(a, b time.Time) time.Duration { return a.Sub(b) },
	"sub2":       func(a, b float64) float64 { return a - b },
	"runTitle":   runTitle,
	"runClass":   runClass,
	"slotTitle":  slotTitle,
	"skipTitle":  skipTitle,
	"slotCounts": slotCounts,
}

// parsePages parses each page's template with the layout.
func parsePages() (map[string]*template.Template, error) {
	pages := map[string]*template.Template{}
	for _, name := range []string{"locks", "jobs", "job", "elections", "message"} {
		t, err := template.New(name).Funcs(funcs).ParseFS(assets, "assets/templates/layout.html", "assets/templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("pglockui: template %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}
