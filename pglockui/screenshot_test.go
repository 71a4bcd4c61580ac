package pglockui_test

import (
	"context"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/pglockui"
)

// screenshotsEnv names the directory the README's screenshots are written to,
// relative to the module's root: PGLOCK_SCREENSHOTS=docs go test ./pglockui -run Screenshot
const screenshotsEnv = "PGLOCK_SCREENSHOTS"

// TestScreenshots takes the README's pictures of the console: the locks page and a
// job's timeline, on data that looks like a shop's hour (real clients for the locks,
// back-dated rows for an hour of run history).
func TestScreenshots(t *testing.T) {
	dir := os.Getenv(screenshotsEnv)
	if dir == "" {
		t.Skipf("set %s=docs to write the README's screenshots", screenshotsEnv)
	}
	if !filepath.IsAbs(dir) {
		dir = filepath.Join("..", dir) // the test runs in pglockui/
	}
	pool := newDatabase(t)
	console := newClient(t, pool, "checkout-7d9f-1")
	checkout2 := newClient(t, pool, "checkout-7d9f-2")
	worker := newClient(t, pool, "worker-5c2a")
	root := serve(t, console, pglockui.WithAuthorize(func(*http.Request) bool { return true }))

	holder(t, console, "inventory:stock-reconciliation:owner", 30*time.Second)
	holder(t, checkout2, "orders:checkout:84113", 30*time.Second)
	holder(t, checkout2, "orders:checkout:84120", 30*time.Second)
	holder(t, worker, "billing:invoice-run:2025-06", 10*time.Minute)
	holder(t, worker, "search:reindex:products", 2*time.Minute)
	gone := holder(t, console, "mail:digest", 30*time.Second)
	require.NoError(t, gone.Release(t.Context()))
	// Someone waits for 84120: its Acquire marks the key wanted.
	waitCtx, stopWaiting := context.WithCancel(t.Context())
	waited := make(chan struct{})
	go func() {
		defer close(waited)
		l, err := worker.Acquire(waitCtx, "orders:checkout:84120", pglock.Wait(time.Minute))
		if err == nil {
			_ = l.Release(context.WithoutCancel(waitCtx))
		}
	}()
	t.Cleanup(func() { stopWaiting(); <-waited })
	// Make the table look like an hour of a shop: held for a while, one lease
	// expiring (under a third of its ttl left), one expired.
	_, err := pool.Exec(t.Context(), `
		UPDATE pglock.locks SET acquired_at = now() - CASE key
			WHEN 'inventory:stock-reconciliation:owner' THEN interval '47 minutes'
			WHEN 'billing:invoice-run:2025-06' THEN interval '6 minutes 12 seconds'
			WHEN 'search:reindex:products' THEN interval '1 minute 41 seconds'
			ELSE interval '2 seconds' END
		WHERE owner IS NOT NULL;
		INSERT INTO pglock.locks (key, owner, fencing_token, expires_at) VALUES
			('cache:warm:eu-west', 'worker-5c2a/81c0', 12, now() - interval '3 minutes 5 seconds'),
			('reports:daily-sales', 'worker-5c2a/81c0', 311, now() + interval '9 seconds');
		UPDATE pglock.locks SET ttl_ms = 60000, acquired_at = now() - interval '51 seconds' WHERE key = 'reports:daily-sales';`)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		ls, err := console.Locks(t.Context(), "orders:checkout:84120")
		return err == nil && len(ls) == 1 && ls[0].Waiting
	}, 5*time.Second, 20*time.Millisecond, "the waiter marked the key")

	// An hour of a job's runs: every minute on checkout-1, moved to checkout-2 by a
	// deploy, a run of failures there, a gap, a panic and a lost lock.
	_, err = pool.Exec(t.Context(), `
		INSERT INTO pglock.job_runs (job, instance, owner, fencing_token, started_at, ended_at, outcome, error)
		SELECT 'inventory:stock-reconciliation', r.instance, r.instance || '/a1f3', 1000 - m,
		       now() - make_interval(mins => m), now() - make_interval(mins => m) + make_interval(secs => 4 + (m % 7) * 2.5),
		       r.outcome, r.err
		FROM generate_series(1, 58) m,
		LATERAL (SELECT
			CASE WHEN m > 34 OR m < 12 THEN 'checkout-7d9f-1' ELSE 'checkout-7d9f-2' END AS instance,
			CASE WHEN m BETWEEN 22 AND 26 THEN 'error' WHEN m = 9 THEN 'panicked' WHEN m = 5 THEN 'lost' ELSE 'ok' END AS outcome,
			CASE WHEN m BETWEEN 22 AND 26 THEN 'warehouse API: 502 Bad Gateway'
			     WHEN m = 9 THEN 'runtime error: index out of range [3] with length 3'
			     WHEN m = 5 THEN 'pglock: lock lost (refused): inventory:stock-reconciliation' END AS err) r
		WHERE m NOT BETWEEN 15 AND 19;
		INSERT INTO pglock.job_skips (job, instance, reason, count, last_at) VALUES
			('inventory:stock-reconciliation', 'checkout-7d9f-2', 'other instance', 31, now() - interval '1 minute'),
			('inventory:stock-reconciliation', 'checkout-7d9f-1', 'other instance', 22, now() - interval '13 minutes');`)
	require.NoError(t, err)

	tb := newTab(t)
	shoot := func(path, name string, height int64) {
		t.Helper()
		tb.do(5*time.Second, chromedp.EmulateViewport(1280, height))
		tb.open(root + path)
		tb.live(1)
		ctx, cancel := context.WithTimeout(tb.ctx, 20*time.Second)
		defer cancel()
		png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
		require.NoError(t, err)
		require.NoError(t, os.MkdirAll(dir, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), png, 0o644))
		t.Logf("wrote %s (%d KB)", filepath.Join(dir, name), len(png)/1024)
	}
	shoot("", "console-locks.png", 520)
	shoot("jobs/"+url.PathEscape("inventory:stock-reconciliation"), "console-timeline.png", 640)
}
