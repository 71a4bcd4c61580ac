package shop_test

import (
	"context"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/example/shop"
	"github.com/pgfence/pglock/pglocktest"
)

// startWithMetrics starts an instance as cmd/shop does: with its telemetry, served at
// /metrics. The test's cleanup stops it in cmd/shop's order.
func (w *world) startWithMetrics(t *testing.T, name string) *instance {
	t.Helper()
	m, err := shop.NewMetrics()
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, m.Shutdown(context.Background())) })
	pool := pglocktest.Pool(t, w.url, 5)
	logger := w.logs.logger(name)
	locks, err := pglock.New(pool, pglock.WithInstanceName(name), pglock.WithLogger(logger), m.EventHandler())
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, locks.Close(context.Background())) })
	s, err := shop.New(shop.Config{Pool: pool, Locks: locks, Accounting: w.accounting, Warehouse: w.warehouse,
		AdminToken: "s3cret", InvoiceExportCron: neverCron, StockReconciliationCron: neverCron, Logger: logger, Metrics: m})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Shutdown(context.Background())) })
	return &instance{name: name, pool: pool, locks: locks, shop: s}
}

// scrape reads GET /metrics as Prometheus would, once the events so far have been
// recorded (they are delivered on the client's own goroutine), that is once want
// matches.
func scrape(t *testing.T, url string, want *regexp.Regexp) string {
	t.Helper()
	var body string
	require.Eventually(t, func() bool {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url+"/metrics", nil)
		require.NoError(t, err)
		req.Header.Set("Accept", "text/plain")
		r := do(t, req, "")
		require.Equal(t, http.StatusOK, r.status)
		body = string(r.raw)
		return want.MatchString(body)
	}, 5*time.Second, 20*time.Millisecond, "want %s in\n%s", want, &body)
	return body
}

func TestMetricsEndpointServesPglockMetricsInPrometheusFormat(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	a := w.startWithMetrics(t, "a")
	base := serve(t, a)
	require.NoError(t, a.shop.StockReconciliation().Run(t.Context()))
	require.Equal(t, http.StatusOK, post(t, base+"/admin/invoice-exports", "s3cret").status)

	body := scrape(t, base, regexp.MustCompile(`(?m)^pglock_job_runs_total\{.*\} 1$`))
	for _, want := range []string{
		// The reconciliation's run: its lease, its run lock, and a permit of the
		// warehouse calls; a permit of the exports.
		`(?m)^pglock_acquisitions_total\{[^}]*kind="lock"[^}]*outcome="acquired"[^}]*\} 2$`,
		`(?m)^pglock_acquisitions_total\{[^}]*kind="permit"[^}]*outcome="acquired"[^}]*\} 2$`,
		`(?m)^pglock_releases_total\{[^}]*kind="lock"[^}]*\} 1$`,
		`(?m)^pglock_releases_total\{[^}]*kind="permit"[^}]*\} 2$`,
		`(?m)^pglock_job_runs_total\{[^}]*outcome="ok"[^}]*pglock_job_name="inventory:stock-reconciliation"[^}]*\} 1$`,
		`(?m)^pglock_job_duration_seconds_count\{[^}]*pglock_job_name="inventory:stock-reconciliation"[^}]*\} 1$`,
		`(?m)^pglock_acquire_duration_seconds_bucket\{[^}]*kind="lock"[^}]*le="\+Inf"[^}]*\} 2$`,
		`(?m)^pglock_acquire_wait_seconds_count\{[^}]*kind="permit"[^}]*outcome="acquired"[^}]*\} 2$`,
		`(?m)^pglock_locks_held\{[^}]*kind="lock"[^}]*\} 1$`, // the reconciliation's lease, kept between ticks
		`(?m)^pglock_locks_held\{[^}]*kind="permit"[^}]*\} 0$`,
		`(?m)^pglock_elections_led\{[^}]*\} 0$`,
		`(?m)^# TYPE pglock_acquisitions_total counter$`,
		`(?m)^# TYPE pglock_acquire_duration_seconds histogram$`,
		`(?m)^target_info\{[^}]*service_name="shop"[^}]*\} 1$`, // not unknown_service
		`(?m)^pglock_locks_lost_total\{[^}]*reason="expired"[^}]*\} 0$`,
		`(?m)^pglock_renewal_failures_total\{[^}]*\} 0$`,
		`(?m)^pglock_job_runs_total\{[^}]*outcome="error"[^}]*pglock_job_name="invoices:nightly-export"[^}]*\} 0$`,
	} {
		require.Regexp(t, want, body)
	}
	// A lock's key is never a label: the export ran outside its job (its series, from
	// its registration, stay at 0).
	require.NotRegexp(t, `(?m)^pglock_job_runs_total\{[^}]*pglock_job_name="`+shop.InvoiceExportKey+`"[^}]*\} [1-9]`, body)
	require.NotRegexp(t, `(?m)^pglock_acquisitions_total\{[^}]*`+shop.InvoiceExportKey, body)
	require.NotContains(t, body, "key=")
}

// GET /healthz reports the pglock client's readiness: ready while its renewals are
// confirmed, unready (503) once it cannot take work, here once it is closed.
func TestHealthzFollowsTheClientsHealth(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	a := w.startWithMetrics(t, "a")
	base := serve(t, a)
	require.NoError(t, a.shop.StockReconciliation().Run(t.Context()))

	r := do(t, get(t, base+"/healthz"), "")
	require.Equal(t, http.StatusOK, r.status)
	require.Equal(t, "ok", r.body["status"])
	require.EqualValues(t, 1, r.body["locksHeld"], "the reconciliation's lease")
	require.NotContains(t, r.body, "lastRenewal", "none yet: the ttl is 30 s")

	require.NoError(t, a.shop.Shutdown(t.Context()))
	require.NoError(t, a.locks.Close(t.Context()))
	r = do(t, get(t, base+"/healthz"), "")
	require.Equal(t, http.StatusServiceUnavailable, r.status)
	require.Equal(t, "unready", r.body["status"])
	require.True(t, strings.Contains(r.body["error"].(string), "closed"), "%v", r.body)
	require.EqualValues(t, 0, r.body["locksHeld"])
}

// GET /healthz answers 503 while the instance cannot reach its database, even holding
// no lock, and names no connection detail (user, host, database) in its body: the
// error, which does, goes to the log.
func TestHealthzShowsNoConnectionDetails(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	cfg, err := pgxpool.ParseConfig(w.url)
	require.NoError(t, err)
	cfg.ConnConfig.Database = "shop_gone_away" // the database went away: every connection fails
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	logger := w.logs.logger("gone")
	locks, err := pglock.New(pool, pglock.WithInstanceName("gone"), pglock.WithLogger(logger))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, locks.Close(context.Background())) })
	s, err := shop.New(shop.Config{Pool: pool, Locks: locks, Accounting: w.accounting, Warehouse: w.warehouse,
		AdminToken: "s3cret", InvoiceExportCron: neverCron, StockReconciliationCron: neverCron, Logger: logger})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Shutdown(context.Background())) })
	base := serve(t, &instance{name: "gone", pool: pool, locks: locks, shop: s})

	require.Error(t, s.StockReconciliation().Run(t.Context()), "the tick cannot reach the database")
	r := do(t, get(t, base+"/healthz"), "")
	require.Equal(t, http.StatusServiceUnavailable, r.status)
	require.Equal(t, "unready", r.body["status"])
	// The tick's acquisition failed; so may, in the background, the client's registration
	// of its jobs (which came last under load, in a fresh-clone CI run).
	require.Contains(t, []any{"acquire", "register"}, r.body["failedCall"])
	for _, detail := range []string{cfg.ConnConfig.Database, cfg.ConnConfig.User, cfg.ConnConfig.Host, "user=", "database="} {
		require.NotContains(t, string(r.raw), detail)
	}
	require.Positive(t, w.logs.count("shop: unready"))
	require.Contains(t, w.logs.String(), cfg.ConnConfig.Database, "the detail is in the log")
}
