package pglockui_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/pglockui"
)

// These tests drive the console in a real headless Chromium (chromium_test.go) against
// the real PostgreSQL, with real pglock clients on both sides: what a user sees, and
// what a click does to the holder of a lock.

// The console's actions are authorized by a session cookie, as an application's login
// would do it, so that the browser sends it on every request, a forged one included.
const (
	adminCookie = "pglock_admin"
	adminSecret = "s3cret"
)

// isAdmin is the authorize function of the tests' consoles.
func isAdmin(r *http.Request) bool {
	c, err := r.Cookie(adminCookie)
	return err == nil && c.Value == adminSecret
}

// js quotes s as a JavaScript string literal (JSON is valid JavaScript).
func js(s string) string { return strconv.Quote(s) }

// row is the CSS selector of the locks table's row of key, as a JavaScript string.
func row(key string) string {
	return js(`#locks tr[data-key="` + cssEscape(key) + `"]`)
}

// cssEscape escapes s for a double-quoted CSS attribute value.
func cssEscape(s string) string {
	out := make([]rune, 0, len(s))
	for _, r := range s {
		if r == '"' || r == '\\' {
			out = append(out, '\\')
		}
		out = append(out, r)
	}
	return string(out)
}

// login gives the browser the admin's session cookie for root's host.
func (tb *tab) login(root string) {
	tb.t.Helper()
	tb.do(5*time.Second, func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		_, err := chromedp.Call(ctx, network.SetCookie, network.SetCookieParams{Name: adminCookie, Value: adminSecret, URL: root})
		return chromedp.Void{}, err
	})
}

// open navigates to url and waits until the console's script has run once.
func (tb *tab) open(url string) {
	tb.t.Helper()
	tb.do(15*time.Second, chromedp.Navigate(url))
	tb.waitFor(5*time.Second, `document.readyState === "complete" && document.getElementById("live") !== null`, "the console's page loaded")
	// Counts the live updates, and marks the document: a reload would lose both.
	eval[chromedp.Void](tb, `window.updates = 0; document.addEventListener("pglockui:updated", () => window.updates++)`)
}

// live waits for n more live updates of the page.
func (tb *tab) live(n int) {
	tb.t.Helper()
	from := eval[int](tb, `window.updates`)
	tb.waitFor(time.Duration(n)*3*time.Second+5*time.Second, fmt.Sprintf(`window.updates >= %d`, from+n), fmt.Sprintf("%d live updates of the page", n))
}

func TestBrowserLockAppearsCountsDownAndGoesWithoutReload(t *testing.T) {
	t.Parallel()
	pool := newDatabase(t)
	console := newClient(t, pool, "web-1")
	worker := newClient(t, pool, "worker-1")
	root := serve(t, console)
	tb := newTab(t)
	tb.open(root)
	tb.waitFor(time.Second, `document.querySelector("#locks tr.empty") !== null`, "an empty table")

	l := holder(t, worker, "orders:42", 30*time.Second)
	taken := time.Now()
	tb.waitFor(2*time.Second, `document.querySelector(`+row("orders:42")+`+".held") !== null`, "the lock taken by another client shows as held")
	t.Logf("the lock showed %v after its acquisition", time.Since(taken).Round(time.Millisecond))
	require.Equal(t, "worker-1", eval[string](tb, `document.querySelector(`+row("orders:42")+`+" td.instance").textContent`))
	require.Equal(t, strconv.FormatInt(l.Token(), 10), eval[string](tb, `document.querySelector(`+row("orders:42")+`+" td.token").textContent`))
	expiresAt := eval[string](tb, `document.querySelector(`+row("orders:42")+`+" td.countdown").dataset.expiresAt`)
	at, err := time.Parse(time.RFC3339Nano, expiresAt)
	require.NoError(t, err, "data-expires-at %q", expiresAt)
	require.WithinDuration(t, taken.Add(30*time.Second), at, 5*time.Second)

	first := eval[string](tb, `document.querySelector(`+row("orders:42")+`+" td.countdown").textContent`)
	require.Regexp(t, `^([12]\d|30)s$`, first, "under the 30 s ttl, seconds left")
	tb.waitFor(2500*time.Millisecond, `(() => { const t = document.querySelector(`+row("orders:42")+`+" td.countdown").textContent; return t !== `+js(first)+` && /^\d/.test(t) })()`, "the countdown moves")

	require.NoError(t, l.Release(t.Context()))
	released := time.Now()
	tb.waitFor(2*time.Second, `(() => { const r = document.querySelector(`+row("orders:42")+`); return r === null || r.classList.contains("free") })()`, "the released lock goes or turns free")
	t.Logf("the release showed %v after it", time.Since(released).Round(time.Millisecond))
	require.Equal(t, "released", eval[string](tb, `document.querySelector(`+row("orders:42")+`+" td.countdown").textContent`))
	require.Positive(t, eval[int](tb, `window.updates`), "live updates, no reload: the page's own state survived")
}

func TestBrowserForceReleaseAfterConfirmation(t *testing.T) {
	t.Parallel()
	pool := newDatabase(t)
	console := newClient(t, pool, "web-1")
	worker := newClient(t, pool, "worker-1")
	root := serve(t, console, pglockui.WithAuthorize(isAdmin))
	const ttl = 3 * time.Second
	l := holder(t, worker, "orders:42", ttl)

	tb := newTab(t)
	tb.login(root)
	tb.open(root)
	button := js(`button.force-release[data-key="orders:42"]`)
	tb.waitFor(2*time.Second, `document.querySelector(`+button+`) !== null`, "the force-release button")

	// Cancel changes nothing.
	tb.do(5*time.Second, chromedp.Click(chromedp.CSS(`button.force-release[data-key="orders:42"]`)))
	tb.waitFor(time.Second, `document.getElementById("confirm").open`, "the confirmation opens")
	require.Contains(t, eval[string](tb, `document.getElementById("confirm-text").textContent`), "orders:42")
	tb.do(5*time.Second, chromedp.Click(chromedp.ID("confirm-no")))
	tb.waitFor(time.Second, `!document.getElementById("confirm").open`, "cancel closes the confirmation")
	tb.live(1)
	require.NoError(t, l.Context().Err(), "cancelled: the holder keeps its lock")

	tb.do(5*time.Second, chromedp.Click(chromedp.CSS(`button.force-release[data-key="orders:42"]`)))
	tb.waitFor(time.Second, `document.getElementById("confirm").open`, "the confirmation opens")
	tb.do(5*time.Second, chromedp.Click(chromedp.ID("confirm-yes")))
	clicked := time.Now()
	select {
	case <-l.Context().Done():
	case <-time.After(ttl/3 + 2*time.Second):
		t.Fatal("the holder's context did not end within ttl/3 of the confirmation")
	}
	t.Logf("the holder's ctx ended %v after the click on Yes", time.Since(clicked).Round(time.Millisecond))
	var lost *pglock.LockLostError
	require.ErrorAs(t, context.Cause(l.Context()), &lost)
	require.Equal(t, pglock.LostRefused, lost.Reason)

	tb.waitFor(2*time.Second, `document.getElementById("flash").textContent.includes("force-released")`, "the page says what it broke")
	require.Contains(t, eval[string](tb, `document.getElementById("flash").textContent`), strconv.FormatInt(l.Token(), 10))
	tb.waitFor(2*time.Second, `document.querySelector(`+row("orders:42")+`+".free") !== null`, "the row turns free")

	next := holder(t, console, "orders:42", ttl)
	require.Greater(t, next.Token(), l.Token())
	tb.waitFor(2*time.Second, `document.querySelector(`+row("orders:42")+`+".held td.token")?.textContent === `+js(strconv.FormatInt(next.Token(), 10)), "the next holder shows")
}

func TestBrowserForceReleaseOfAPermit(t *testing.T) {
	t.Parallel()
	pool := newDatabase(t)
	console := newClient(t, pool, "web-1")
	worker := newClient(t, pool, "worker-1")
	root := serve(t, console, pglockui.WithAuthorize(isAdmin))
	sem, err := worker.Semaphore("exports", 2)
	require.NoError(t, err)
	var permits []*pglock.Lock
	for range 2 {
		l, err := sem.TryAcquire(t.Context(), pglock.TTL(3*time.Second))
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Release(context.Background()) })
		permits = append(permits, l)
	}
	lock := holder(t, worker, "orders:42", time.Minute)

	tb := newTab(t)
	tb.login(root)
	tb.open(root)
	button := `button.force-release[data-key="exports"][data-permit="2"]`
	tb.waitFor(2*time.Second, `document.querySelector(`+js(button)+`) !== null`, "the permit's force-release button")
	tb.do(5*time.Second, chromedp.Click(chromedp.CSS(button)))
	tb.waitFor(time.Second, `document.getElementById("confirm").open`, "the confirmation opens")
	require.Contains(t, eval[string](tb, `document.getElementById("confirm-text").textContent`), "Force-release permit 2 of exports?")
	tb.do(5*time.Second, chromedp.Click(chromedp.ID("confirm-yes")))
	select {
	case <-permits[1].Context().Done():
	case <-time.After(3 * time.Second):
		t.Fatal("the holder of permit 2 did not lose it within ttl/3 of the confirmation")
	}
	require.NoError(t, permits[0].Context().Err(), "permit 1 is untouched")
	require.NoError(t, lock.Context().Err(), "the lock is untouched")
	tb.waitFor(2*time.Second, `document.getElementById("flash").textContent.includes("force-released permit 2 of \"exports\"")`, "the page says what it broke")
	tb.waitFor(2*time.Second, `document.querySelector('tr[data-key="exports"][data-permit="2"].free') !== null`, "the permit's row turns free")
	require.True(t, eval[bool](tb, `document.querySelector('tr[data-key="exports"][data-permit="1"].held') !== null`))
}

func TestBrowserForgedOrUnauthorizedPostChangesNothing(t *testing.T) {
	t.Parallel()
	pool := newDatabase(t)
	console := newClient(t, pool, "web-1")
	worker := newClient(t, pool, "worker-1")
	var authorizeCalls atomic.Int64
	root := serve(t, console, pglockui.WithAuthorize(func(r *http.Request) bool {
		authorizeCalls.Add(1)
		return isAdmin(r)
	}))
	l := holder(t, worker, "orders:42", time.Minute)
	gone := holder(t, worker, "orders:old", time.Minute)
	require.NoError(t, gone.Release(t.Context()))

	tb := newTab(t)
	tb.login(root)
	tb.open(root)

	// The page's own POSTs, from its origin, without the session cookie.
	for _, post := range []string{
		`fetch("locks/release", {method: "POST", credentials: "omit", body: new URLSearchParams({key: "orders:42"})})`,
		`fetch("prune", {method: "POST", credentials: "omit", body: new URLSearchParams({older_than: "0s"})})`,
	} {
		status := eval[int](tb, post+`.then(r => r.status)`)
		require.Equal(t, http.StatusForbidden, status, post)
	}
	require.EqualValues(t, 2, authorizeCalls.Load(), "both were refused by authorize")

	// A page of another origin (another port: same site, so the browser sends the
	// cookie) posts the same form: http.CrossOriginProtection refuses it before
	// authorize sees it.
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `<!doctype html><form method="post" action="%slocks/release"><input name="key" value="orders:42"></form>`, root)
	}))
	t.Cleanup(evil.Close)
	tb.do(15*time.Second, chromedp.Navigate(evil.URL))
	ctx, cancel := context.WithTimeout(tb.ctx, 10*time.Second)
	defer cancel()
	res, err := chromedp.RunResponse(ctx, chromedp.Evaluate[chromedp.Void](`document.forms[0].submit()`))
	require.NoError(t, err)
	require.Equal(t, root+"locks/release", res.URL)
	require.EqualValues(t, http.StatusForbidden, res.Status)
	require.EqualValues(t, 2, authorizeCalls.Load(), "the forged POST never reached authorize")
	require.Contains(t, eval[string](tb, `document.body.textContent`), "cross-origin")

	locks, err := console.Locks(t.Context(), "orders:")
	require.NoError(t, err)
	require.Len(t, locks, 2, "nothing pruned")
	require.True(t, locks[0].Held, "nothing released")
	require.Equal(t, l.Token(), locks[0].Token)
	require.NoError(t, l.Context().Err())
}

func TestBrowserUserDataShowsAsText(t *testing.T) {
	t.Parallel()
	pool := newDatabase(t)
	const (
		scriptKey    = `<script>alert(1)</script>`
		attrKey      = `orders:"><img src=x onerror=alert(2)>`
		instance     = `web<img src=x onerror=alert(3)>`
		job          = `report:<svg onload=alert(4)>`
		errText      = `<img src=x onerror=alert(5)> & </td></tr></table><b>bold</b>`
		userElements = `#live script, #live img, #live b, #live svg svg, #live iframe, #confirm img, #confirm script`
	)
	console := newClient(t, pool, "web-1")
	evil := newClient(t, pool, instance, pglock.RunHistory(time.Hour))
	root := serve(t, console, pglockui.WithAuthorize(isAdmin))
	holder(t, evil, scriptKey, time.Minute)
	holder(t, evil, attrKey, time.Minute)
	runJob(t, evil, job, func(context.Context) error { return errors.New(errText) })

	tb := newTab(t)
	tb.login(root)
	tb.open(root)
	tb.live(2) // the first page, then the live updates' path (DOMParser, replaceWith)
	for _, key := range []string{scriptKey, attrKey} {
		require.Equal(t, key, eval[string](tb, `document.querySelector(`+row(key)+`+" td.key").textContent`))
		require.Equal(t, instance, eval[string](tb, `document.querySelector(`+row(key)+`+" td.instance").textContent`))
	}
	require.Zero(t, eval[int](tb, `document.querySelectorAll(`+js(userElements)+`).length`), "no element made of user data")

	// The confirmation quotes the key as text too.
	tb.do(5*time.Second, chromedp.Click(chromedp.CSS(`button.force-release[data-key="`+cssEscape(attrKey)+`"]`)))
	tb.waitFor(time.Second, `document.getElementById("confirm").open`, "the confirmation opens")
	require.Contains(t, eval[string](tb, `document.getElementById("confirm-text").textContent`), attrKey)
	require.Zero(t, eval[int](tb, `document.getElementById("confirm-text").children.length`))
	tb.do(5*time.Second, chromedp.Click(chromedp.ID("confirm-no")))

	tb.open(root + "jobs")
	tb.live(1)
	require.Equal(t, job, eval[string](tb, `document.querySelector("#jobs tr[data-job] td.job").textContent`))
	require.Contains(t, eval[string](tb, `document.querySelector("#jobs tr[data-job] td.last-failure").textContent`), errText)
	require.Zero(t, eval[int](tb, `document.querySelectorAll(`+js(userElements)+`).length`))

	ctx, cancel := context.WithTimeout(tb.ctx, 15*time.Second)
	defer cancel()
	res, err := chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(`#jobs td.job a`)))
	require.NoError(t, err)
	require.EqualValues(t, http.StatusOK, res.Status, "the job's link, its key path-escaped: %s", res.URL)
	require.Equal(t, errText, eval[string](tb, `document.querySelector("#runs td.err").textContent`))
	require.Equal(t, instance, eval[string](tb, `document.querySelector("svg.timeline g.lane").dataset.instance`))
	require.Contains(t, eval[string](tb, `document.querySelector("svg.timeline rect.run title").textContent`), errText)
	require.Zero(t, eval[int](tb, `document.querySelectorAll(`+js(userElements)+`).length`))
	// The tab's cleanup fails the test if any alert opened meanwhile.
}

func TestBrowserTimelineLanesAndFailureColour(t *testing.T) {
	t.Parallel()
	pool := newDatabase(t)
	web1 := newClient(t, pool, "web-1", pglock.RunHistory(time.Hour))
	web2 := newClient(t, pool, "web-2", pglock.RunHistory(time.Hour))
	root := serve(t, web1)
	const job = "inventory:reconcile"
	j1, err := web1.Job(job, func(context.Context) error { return nil }, pglock.WithoutOverlapping())
	require.NoError(t, err)
	j2, err := web2.Job(job, func(context.Context) error { return errors.New("warehouse said 502") }, pglock.WithoutOverlapping())
	require.NoError(t, err)
	require.NoError(t, j1.Run(t.Context()))
	require.Error(t, j2.Run(t.Context()))
	require.NoError(t, j1.Run(t.Context()))
	require.Eventually(t, func() bool {
		runs, err := web1.JobRuns(t.Context(), job, 10)
		return err == nil && len(runs) == 3
	}, 5*time.Second, 10*time.Millisecond, "the three runs recorded")

	tb := newTab(t)
	tb.open(root + "jobs/" + url.PathEscape(job))
	tb.waitFor(2*time.Second, `document.querySelectorAll("svg.timeline rect.run").length === 3`, "three bars")
	type lane struct {
		Instance string   `json:"instance"`
		Classes  []string `json:"classes"`
		Fills    []string `json:"fills"`
		Widths   []float64
	}
	lanes := eval[[]lane](tb, `[...document.querySelectorAll("svg.timeline g.lane")].map(g => ({
		instance: g.dataset.instance,
		classes: [...g.querySelectorAll("rect.run")].map(r => r.getAttribute("class")),
		fills: [...g.querySelectorAll("rect.run")].map(r => getComputedStyle(r).fill),
		Widths: [...g.querySelectorAll("rect.run")].map(r => r.getBoundingClientRect().width),
	}))`)
	require.Len(t, lanes, 2, "a lane per instance")
	require.Equal(t, "web-1", lanes[0].Instance)
	require.Equal(t, []string{"run ok", "run ok"}, lanes[0].Classes)
	require.Equal(t, "web-2", lanes[1].Instance)
	require.Equal(t, []string{"run error"}, lanes[1].Classes)
	for _, l := range lanes {
		for _, w := range l.Widths {
			require.GreaterOrEqual(t, w, 1.0, "a run of milliseconds still shows")
		}
	}
	okFill, errFill := lanes[0].Fills[0], lanes[1].Fills[0]
	require.NotEqual(t, okFill, errFill)
	legend := eval[string](tb, `getComputedStyle(document.querySelector("figcaption .outcome.error")).backgroundColor`)
	require.Equal(t, legend, errFill, "the failed run in the legend's failure colour")
	var r, g, b int
	_, err = fmt.Sscanf(errFill, "rgb(%d, %d, %d)", &r, &g, &b)
	require.NoError(t, err, errFill)
	require.True(t, r > 2*g && r > 2*b, "the failure colour is a red: %s", errFill)
	t.Logf("ok runs fill %s, failed runs %s", okFill, errFill)

	require.Equal(t, "warehouse said 502", eval[string](tb, `document.querySelector("#runs tr.error td.err").textContent`))
}

func TestBrowserSlotLaneShowsWhoRanEachSlotAndHow(t *testing.T) {
	t.Parallel()
	pool := newDatabase(t)
	h := runSlots(t, pool)
	root := serve(t, newClient(t, pool, "web-1"), pglockui.WithJobs(h.job))
	current, retried := h.latest(t, h.current), h.latest(t, h.retry)
	stamp := func(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z07:00") }

	tb := newTab(t)
	tb.open(root + "jobs/" + url.PathEscape(slotJob) + "?window=24h")
	tb.live(1) // what the user sees after a live update too
	tb.waitFor(2*time.Second, `document.querySelectorAll("svg.timeline g.slots circle.slot").length === 2`, "a mark for each slot that ran")
	require.Equal(t, "slots", eval[string](tb, `document.querySelector("svg.timeline g.slots text.instance").textContent`))
	require.True(t, eval[bool](tb, `document.querySelector("svg.timeline g.slots").getBoundingClientRect().bottom <=
		document.querySelector("svg.timeline g.lane").getBoundingClientRect().top + 1`), "the slots' lane above the instances'")

	type mark struct {
		Instance string  `json:"instance"`
		Outcome  string  `json:"outcome"`
		Attempt  string  `json:"attempt"`
		Class    string  `json:"class"`
		Title    string  `json:"title"`
		Width    float64 `json:"width"`
		Fill     string  `json:"fill"`
	}
	markOf := func(slot time.Time) mark {
		t.Helper()
		return eval[mark](tb, `(() => { const c = document.querySelector(`+js(`svg.timeline g.slots circle.slot[data-slot="`+stamp(slot)+`"]`)+`);
			return c && {instance: c.dataset.instance, outcome: c.dataset.outcome, attempt: c.dataset.attempt, class: c.getAttribute("class"),
				title: c.querySelector("title").textContent, width: c.getBoundingClientRect().width, fill: getComputedStyle(c).fill} })()`)
	}
	okFill := eval[string](tb, `getComputedStyle(document.querySelector("figcaption .outcome.ok")).backgroundColor`)

	m := markOf(h.current)
	require.Equal(t, mark{Instance: "worker-a", Outcome: "ok", Attempt: "1", Class: "slot ok", Title: m.Title, Width: m.Width, Fill: okFill}, m)
	require.Contains(t, m.Title, fmt.Sprintf("ok on worker-a, token %d, attempt 1", current.Token))
	require.GreaterOrEqual(t, m.Width, 5.0, "a mark one can see")

	m = markOf(h.retry)
	require.Equal(t, retried.Instance, m.Instance, "the instance of the slot's latest attempt")
	require.Equal(t, "ok", m.Outcome)
	require.Equal(t, "2", m.Attempt)
	require.Equal(t, "slot ok retry", m.Class)
	require.Equal(t, okFill, m.Fill)
	require.Contains(t, m.Title, fmt.Sprintf("token %d, attempt 2 (retried)", retried.Token))

	// worker-b ran nothing here but found the slot claimed: it has a lane, with a mark.
	require.Positive(t, eval[float64](tb, `document.querySelector('svg.timeline g.lane[data-instance="worker-b"] circle.skip.slot-claimed').getBoundingClientRect().width`))

	// The same, as text: the slots' table and summary.
	cell := func(slot time.Time, class string) string {
		t.Helper()
		return eval[string](tb, `document.querySelector(`+js(`#slots tr[data-slot="`+stamp(slot)+`"] td.`+class)+`).innerText`)
	}
	require.Equal(t, "worker-a", cell(h.current, "instance"))
	require.Equal(t, strconv.FormatInt(current.Token, 10), cell(h.current, "token"))
	require.Equal(t, "ok", cell(h.current, "outcome"))
	require.Equal(t, "2 retried", cell(h.retry, "attempt"))
	require.Contains(t, cell(h.retry, "earlier"), "1: error on worker-a")
	require.Contains(t, eval[string](tb, `document.querySelector("dl.slots dd.catch-up").innerText`), "CatchUp(1): the latest missed slot runs once")
	require.Contains(t, eval[string](tb, `document.querySelector("dl.slots dd.missed").innerText`), "worker-a counted 1")
	require.Contains(t, eval[string](tb, `document.querySelector("dl.slots dd.claimed").innerText`), "worker-b ×1")
}
