package pglockui_test

import (
	"context"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/performance"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// BenchmarkBrowserLocksPage10000 measures, with 10,000 locks, how long the locks page
// takes to load in Chromium (navigation start to the load event's end), as a ratio to
// a plain Client.Locks call on the same data, and where the time goes: the server until
// its first byte (the Locks call, then sorting and rendering a page of 100 rows), the
// browser's time before its request and after the response (Navigation Timing), and its
// style, layout and script from the DevTools Performance metrics. A
// benchmark rather than a test: CI runs the tests with -race, which would be measured
// instead. Run it with
//
//	go test ./pglockui -run '^$' -bench BrowserLocksPage -benchtime 5x
func BenchmarkBrowserLocksPage10000(b *testing.B) {
	pool := newDatabase(b)
	c := newClient(b, pool, "web-1")
	root := serve(b, c)
	const n = 10000
	// One statement rather than 10,000 acquisitions: the rows are what lock_acquire
	// writes (the trigger sets acquired_at and ttl_ms), 7 in 10 held by five
	// instances, the others released.
	_, err := pool.Exec(b.Context(), `
		INSERT INTO pglock.locks (key, owner, fencing_token, expires_at)
		SELECT format('tenant-%s:orders:%s', i % 50, i),
		       CASE WHEN i % 10 < 7 THEN format('worker-%s/%s', i % 5, md5(i::text)) END,
		       i, clock_timestamp() + interval '10 minutes'
		FROM generate_series(1, $1::int) i`, n)
	require.NoError(b, err)

	tb := newTab(b)
	ctx, cancel := context.WithTimeout(tb.ctx, time.Minute)
	defer cancel()
	_, err = chromedp.Call(ctx, performance.Enable, performance.EnableParams{})
	require.NoError(b, err)
	metrics := func() map[string]float64 {
		b.Helper()
		res, err := chromedp.Call(ctx, performance.GetMetrics, cdp.Empty{})
		require.NoError(b, err)
		m := map[string]float64{}
		for _, x := range res.Metrics {
			m[x.Name] = x.Value
		}
		return m
	}
	type navTiming struct{ RequestStart, ResponseStart, ResponseEnd, LoadEventEnd float64 }

	var locks, load, before, server, after time.Duration
	var script, layout, style float64
	for b.Loop() {
		start := time.Now()
		ls, err := c.Locks(b.Context(), "")
		locks += time.Since(start)
		require.NoError(b, err)
		require.Len(b, ls, n)

		tb.do(30*time.Second, chromedp.Navigate(root))
		// Chromium counts these from the document's start: a navigation resets them.
		m := metrics()
		script += m["ScriptDuration"]
		layout += m["LayoutDuration"]
		style += m["RecalcStyleDuration"]
		nt := eval[navTiming](tb, `(() => { const e = performance.getEntriesByType("navigation")[0];
			return {RequestStart: e.requestStart, ResponseStart: e.responseStart, ResponseEnd: e.responseEnd, LoadEventEnd: e.loadEventEnd} })()`)
		ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
		load += ms(nt.LoadEventEnd)
		before += ms(nt.RequestStart)
		server += ms(nt.ResponseStart - nt.RequestStart)
		after += ms(nt.LoadEventEnd - nt.ResponseEnd)
	}
	require.Equal(b, 100, eval[int](tb, `document.querySelectorAll("#locks tbody tr[data-key]").length`),
		"the first page of 100 rows; the page says: %s", eval[string](tb, `document.getElementById("live").textContent.slice(0, 300)`))

	per := func(d time.Duration) float64 { return float64(d.Milliseconds()) / float64(b.N) }
	perS := func(s float64) float64 { return s * 1000 / float64(b.N) }
	b.ReportMetric(per(locks), "locks-ms/op")
	b.ReportMetric(per(load), "page-ms/op")
	b.ReportMetric(float64(load)/float64(locks), "page/locks")
	b.ReportMetric(per(before), "to-request-ms/op")
	b.ReportMetric(per(server), "server-ms/op")
	b.ReportMetric(per(after), "after-response-ms/op")
	b.ReportMetric(perS(layout), "layout-ms/op")
	b.ReportMetric(perS(style), "style-ms/op")
	b.ReportMetric(perS(script), "script-ms/op")
}
