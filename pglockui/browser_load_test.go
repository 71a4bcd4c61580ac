package pglockui_test

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/performance"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// TestBrowserLocksPageLoad10000 measures, with 10,000 locks, how long the locks page
// takes to load in the browser, as a ratio to a plain Client.Locks call on the same
// data, and logs where the time goes: the database, the server's rendering, the
// transfer, the browser's parsing, style, layout and script. It asserts no timing (the
// machine is shared); it asserts what was measured is the real page.
func TestBrowserLocksPageLoad10000(t *testing.T) {
	if testing.Short() {
		t.Skip("a measurement: not in -short")
	}
	t.Parallel()
	pool := newDatabase(t)
	c := newClient(t, pool, "web-1")
	root := serve(t, c)
	const n = 10000
	// One statement rather than 10,000 acquisitions: the rows are what lock_acquire
	// writes (the trigger sets acquired_at and ttl_ms), 7 in 10 held by five
	// instances, the others released.
	_, err := pool.Exec(t.Context(), `
		INSERT INTO pglock.locks (key, owner, fencing_token, expires_at)
		SELECT format('tenant-%s:orders:%s', i % 50, i),
		       CASE WHEN i % 10 < 7 THEN format('worker-%s/%s', i % 5, md5(i::text)) END,
		       i, clock_timestamp() + interval '10 minutes'
		FROM generate_series(1, $1::int) i`, n)
	require.NoError(t, err)

	median := func(f func()) time.Duration {
		var ds []time.Duration
		for range 3 {
			start := time.Now()
			f()
			ds = append(ds, time.Since(start))
		}
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	locks := median(func() {
		ls, err := c.Locks(t.Context(), "")
		require.NoError(t, err)
		require.Len(t, ls, n)
	})
	var size int
	get := median(func() {
		res, err := http.Get(root)
		require.NoError(t, err)
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, res.StatusCode)
		size = len(body)
	})

	tb := newTab(t)
	metrics := func() map[string]float64 {
		t.Helper()
		ctx, cancel := context.WithTimeout(tb.ctx, 10*time.Second)
		defer cancel()
		_, err := chromedp.Call(ctx, performance.Enable, performance.EnableParams{})
		require.NoError(t, err)
		res, err := chromedp.Call(ctx, performance.GetMetrics, cdp.Empty{})
		require.NoError(t, err)
		m := map[string]float64{}
		for _, x := range res.Metrics {
			m[x.Name] = x.Value
		}
		return m
	}
	type navTiming struct {
		RequestStart, ResponseStart, ResponseEnd, DomInteractive, DomContentLoadedEventEnd, LoadEventEnd float64
		TransferSize                                                                                     float64
	}
	var loads []navTiming
	var before, after map[string]float64
	for i := range 3 {
		if i == 0 {
			before = metrics()
		}
		tb.do(20*time.Second, chromedp.Navigate(root))
		tb.waitFor(5*time.Second, `document.readyState === "complete"`, "the page loaded")
		if i == 0 {
			after = metrics()
		}
		nt := eval[navTiming](tb, `(() => { const e = performance.getEntriesByType("navigation")[0];
			return {RequestStart: e.requestStart, ResponseStart: e.responseStart, ResponseEnd: e.responseEnd,
				DomInteractive: e.domInteractive, DomContentLoadedEventEnd: e.domContentLoadedEventEnd,
				LoadEventEnd: e.loadEventEnd, TransferSize: e.transferSize} })()`)
		loads = append(loads, nt)
	}
	require.Equal(t, 100, eval[int](tb, `document.querySelectorAll("#locks tbody tr[data-key]").length`), "the first page of 100 rows")
	require.Contains(t, eval[string](tb, `document.getElementById("summary").textContent`), "10000 locks")
	slices.SortFunc(loads, func(a, b navTiming) int { return int(a.LoadEventEnd - b.LoadEventEnd) })
	m := loads[len(loads)/2]
	ms := func(f float64) time.Duration {
		return time.Duration(f * float64(time.Millisecond)).Round(100 * time.Microsecond)
	}
	load := ms(m.LoadEventEnd)
	t.Logf("%d locks: Client.Locks %v (median of 3); GET of the page from Go %v, %d bytes", n, locks.Round(100*time.Microsecond), get.Round(100*time.Microsecond), size)
	t.Logf("browser load (navigation start to load event end, median of 3) %v = %.1f x Client.Locks", load, float64(load)/float64(locks))
	t.Logf("  of which: server until the first byte %v, transfer %v, parse to DOM interactive %v, to load end %v",
		ms(m.ResponseStart-m.RequestStart), ms(m.ResponseEnd-m.ResponseStart), ms(m.DomInteractive-m.ResponseEnd), ms(m.LoadEventEnd-m.DomInteractive))
	d := func(name string) time.Duration {
		return time.Duration((after[name] - before[name]) * float64(time.Second)).Round(100 * time.Microsecond)
	}
	t.Logf("  DevTools Performance metrics of the first load: script %v, layout %v, style %v, all tasks %v",
		d("ScriptDuration"), d("LayoutDuration"), d("RecalcStyleDuration"), d("TaskDuration"))

	// The live update repeats the GET every second: how long its fetch takes.
	tb.open(root)
	tb.live(1)
	fetches := eval[[]float64](tb, `performance.getEntriesByType("resource").filter(e => e.initiatorType === "fetch").map(e => e.duration)`)
	require.NotEmpty(t, fetches)
	var parts []string
	for _, f := range fetches {
		parts = append(parts, ms(f).String())
	}
	t.Logf("  a live update's fetch of the same page: %s", strings.Join(parts, ", "))
}
