package pglockui

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/pgfence/pglock"
)

//go:embed assets
var assets embed.FS

// Option configures New.
type Option func(*console) error

// WithAuthorize enables the actions, force-release and prune: a POST is carried out
// only when authorize returns true for it (403 otherwise). Without it both are off
// and their buttons are not shown. authorize is called on the request's goroutine and
// must be safe for concurrent use. A nil authorize makes New return an error wrapping
// pglock.ErrInvalidArgument.
func WithAuthorize(authorize func(r *http.Request) bool) Option {
	return func(c *console) error {
		if authorize == nil {
			return fmt.Errorf("%w: pglockui: WithAuthorize: nil func", pglock.ErrInvalidArgument)
		}
		c.authorize = authorize
		return nil
	}
}

// WithLogger sets the logger for the actions (at Info: key, owner, token) and for
// store errors (at Warn, with err). nil means slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(c *console) error {
		c.logger = l
		return nil
	}
}

// WithJobs gives the console jobs of this process, so that the page of a job with a
// schedule (pglock.Cron, pglock.Every) shows its slot policy: schedule, catch-up,
// deadline and attempts, which the database does not keep. Jobs without a schedule
// change nothing. A nil job makes New return an error wrapping
// pglock.ErrInvalidArgument.
func WithJobs(jobs ...*pglock.Job) Option {
	return func(c *console) error {
		for _, j := range jobs {
			if j == nil {
				return fmt.Errorf("%w: pglockui: WithJobs: nil *pglock.Job", pglock.ErrInvalidArgument)
			}
			if p, ok := j.SlotPolicy(); ok {
				if c.policies == nil {
					c.policies = make(map[string]pglock.SlotPolicy)
				}
				c.policies[j.Key()] = p
			}
		}
		return nil
	}
}

// elections is what the console asks of a client that lists its elections.
type elections interface {
	Elections(ctx context.Context) ([]pglock.LockInfo, error)
}

// queryTimeout bounds the store calls of one page, so that a database that hangs shows
// as the error banner within a poll or two rather than as a page that never loads.
const queryTimeout = 3 * time.Second

type console struct {
	client    *pglock.Client
	authorize func(r *http.Request) bool
	logger    *slog.Logger
	policies  map[string]pglock.SlotPolicy // WithJobs', by job
	pages     map[string]*template.Template
}

// New returns the console for client, an http.Handler serving the pages listed in the
// package doc at its root. Mount it under any prefix with http.StripPrefix. It is
// safe for concurrent use; each request makes its store calls bounded by the
// request's context and a few seconds. A nil client, or an invalid option, is an
// error wrapping pglock.ErrInvalidArgument.
func New(client *pglock.Client, opts ...Option) (http.Handler, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: pglockui: New: nil *pglock.Client: the console needs one to read the locks", pglock.ErrInvalidArgument)
	}
	c := &console{client: client}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: pglockui: New: nil Option", pglock.ErrInvalidArgument)
		}
		if err := o(c); err != nil {
			return nil, err
		}
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	c.pages = pages

	static, err := fs.Sub(assets, "assets/static")
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", c.locks)
	mux.HandleFunc("GET /locks", c.locks)
	mux.HandleFunc("GET /jobs", c.jobs)
	mux.HandleFunc("GET /jobs/{key...}", c.job)
	mux.HandleFunc("GET /elections", c.elections)
	mux.Handle("GET /static/", http.StripPrefix("/static/", staticHandler(static)))
	mux.HandleFunc("POST /locks/release", c.action(c.release))
	mux.HandleFunc("POST /prune", c.action(c.prune))
	mux.HandleFunc("/", c.notFound)
	return http.NewCrossOriginProtection().Handler(c.root(mux)), nil
}

// root redirects the mount point without its slash ("/admin/pglock", which
// StripPrefix turns into "") to the same with a slash, so that the pages' relative
// URLs resolve under it.
func (c *console) root(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "" {
			base := path.Base(strings.SplitN(r.RequestURI, "?", 2)[0])
			if base == "/" || base == "." {
				base = ""
			}
			// Not http.Redirect, which would resolve it against the stripped path.
			w.Header().Set("Location", base+"/")
			w.WriteHeader(http.StatusMovedPermanently)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func staticHandler(static fs.FS) http.Handler {
	files := http.FileServerFS(static)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
}

func (c *console) notFound(w http.ResponseWriter, r *http.Request) {
	c.fail(w, r, http.StatusNotFound, "no page at "+r.URL.Path)
}

// action wraps a POST handler: 403 unless the actions are enabled and authorize
// passes.
func (c *console) action(h func(w http.ResponseWriter, r *http.Request)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if c.authorize == nil {
			http.Error(w, "actions are disabled: the console was mounted without pglockui.WithAuthorize", http.StatusForbidden)
			return
		}
		if !c.authorize(r) {
			http.Error(w, "not authorized", http.StatusForbidden)
			return
		}
		h(w, r)
	}
}

// release force-releases the lock key, or with permit (1 to pglock.MaxPermits; "" or
// "0" for a lock) the permit of the semaphore key.
func (c *console) release(w http.ResponseWriter, r *http.Request) {
	key := r.PostFormValue("key")
	permit := 0
	if p := r.PostFormValue("permit"); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 || n > pglock.MaxPermits {
			http.Error(w, fmt.Sprintf("permit %q: want a permit's number, 1 to %d (0 or none for a lock)", p, pglock.MaxPermits), http.StatusBadRequest)
			return
		}
		permit = n
	}
	what := strconv.Quote(key)
	if permit > 0 {
		what = fmt.Sprintf("permit %d of %q", permit, key)
	}
	ctx, cancel := context.WithTimeout(r.Context(), queryTimeout)
	defer cancel()
	info, err := c.forceRelease(ctx, key, permit)
	switch {
	case errors.Is(err, pglock.ErrInvalidKey), errors.Is(err, pglock.ErrInvalidArgument):
		http.Error(w, err.Error(), http.StatusBadRequest)
	case errors.Is(err, pglock.ErrNotHeld):
		http.Error(w, err.Error(), http.StatusConflict)
	case err != nil:
		c.logger.LogAttrs(r.Context(), slog.LevelWarn, "pglockui: force release failed", slog.String("key", key),
			slog.Int("permit", permit), slog.Any("err", err))
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
	default:
		c.logger.LogAttrs(r.Context(), slog.LevelInfo, "pglockui: force-released", slog.String("key", key),
			slog.Int("permit", permit), slog.String("owner", info.Owner), slog.Int64("token", info.Token))
		fmt.Fprintf(w, "force-released %s: it was held by %s with token %d, its lease had %s left\n",
			what, info.Owner, info.Token, info.ExpiresIn.Round(time.Millisecond))
	}
}

// forceRelease breaks the lock key, or permit of the semaphore key when permit > 0.
func (c *console) forceRelease(ctx context.Context, key string, permit int) (pglock.LockInfo, error) {
	if permit == 0 {
		return c.client.ForceRelease(ctx, key)
	}
	// The semaphore's number of permits matters only to an acquisition: any will do.
	s, err := c.client.Semaphore(key, pglock.MaxPermits)
	if err != nil {
		return pglock.LockInfo{}, err
	}
	return s.ForceRelease(ctx, permit)
}

func (c *console) prune(w http.ResponseWriter, r *http.Request) {
	olderThan, err := time.ParseDuration(r.PostFormValue("older_than"))
	if err != nil {
		http.Error(w, fmt.Sprintf("older_than %q: want a Go duration such as 1h or 30m", r.PostFormValue("older_than")), http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), queryTimeout)
	defer cancel()
	n, err := c.client.Prune(ctx, olderThan)
	switch {
	case errors.Is(err, pglock.ErrInvalidArgument):
		http.Error(w, err.Error(), http.StatusBadRequest)
	case err != nil:
		c.logger.LogAttrs(r.Context(), slog.LevelWarn, "pglockui: prune failed", slog.Any("err", err))
		http.Error(w, fmt.Sprintf("pruned %d locks, then: %v", n, err), http.StatusServiceUnavailable)
	default:
		c.logger.LogAttrs(r.Context(), slog.LevelInfo, "pglockui: pruned", slog.Int64("pruned", n), slog.Duration("older_than", olderThan))
		fmt.Fprintf(w, "pruned %d locks whose lease ended more than %s ago\n", n, olderThan)
	}
}
