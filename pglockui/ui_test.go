package pglockui_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/pglockui"
)

// runJob runs a WithoutOverlapping job key once on c with fn, and waits until its run
// is in the history.
func runJob(t *testing.T, c *pglock.Client, key string, fn func(context.Context) error) {
	t.Helper()
	j, err := c.Job(key, fn, pglock.WithoutOverlapping())
	require.NoError(t, err)
	before, err := c.JobRuns(t.Context(), key, 1000)
	require.NoError(t, err)
	_ = j.Run(t.Context())
	require.Eventually(t, func() bool {
		runs, err := c.JobRuns(t.Context(), key, 1000)
		return err == nil && len(runs) > len(before)
	}, 5*time.Second, 10*time.Millisecond, "the run recorded")
}

func TestEveryPageRendersRealData(t *testing.T) {
	t.Parallel()
	pool := newDatabase(t)
	web1 := newClient(t, pool, "web-1")
	web2 := newClient(t, pool, "web-2")
	root := serve(t, web1, pglockui.WithAuthorize(func(*http.Request) bool { return true }))

	held := holder(t, web1, "inventory:feed", time.Minute)
	released := holder(t, web2, "inventory:old", time.Minute)
	require.NoError(t, released.Release(t.Context()))
	runJob(t, web1, "inventory:reconcile", func(context.Context) error { return nil })
	runJob(t, web2, "inventory:reconcile", func(context.Context) error { return errors.New("warehouse said 502") })
	sem, err := web2.Semaphore("exports", 3)
	require.NoError(t, err)
	var permits []*pglock.Lock
	for range 2 {
		l, err := sem.TryAcquire(t.Context())
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Release(context.Background()) })
		permits = append(permits, l)
	}

	for _, path := range []string{"", "locks"} {
		status, body := get(t, root, path)
		require.Equal(t, http.StatusOK, status, path)
		require.Contains(t, body, `<table id="locks"`)
		row := rowOf(t, body, "inventory:feed")
		require.Contains(t, row, `class="held"`)
		require.Contains(t, row, `<td class="instance">web-1</td>`)
		require.Contains(t, row, fmt.Sprintf(`<td class="token">%d</td>`, held.Token()))
		require.Regexp(t, `<td class="countdown" data-expires-at="\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z" data-ttl-ms="\d+">\d+s</td>`, row)
		require.Regexp(t, `<td class="held-for">\d+ms|[\d.]+s</td>`, row)
		require.Contains(t, row, `<button type="button" class="force-release" data-key="inventory:feed"`)
		old := rowOf(t, body, "inventory:old")
		require.Contains(t, old, `class="free"`)
		require.NotContains(t, old, "force-release", "a free key has nothing to release")
		require.Contains(t, body, `<span id="health" class="ready" title="this instance's pglock client: 1 locks held, leading 0 elections">`)
		require.Regexp(t, `<p class="summary" id="summary">\d+ locks, 3 held\.</p>`, body, "the feed and two permits")
		// The semaphore's permits, one row each under its key, with their own tokens.
		for i, l := range permits {
			row := permitRowOf(t, body, "exports", i+1)
			require.Contains(t, row, `class="held"`)
			require.Contains(t, row, fmt.Sprintf(`<span class="permit" title="permit %d of the semaphore exports">permit %d</span>`, i+1, i+1))
			require.Contains(t, row, fmt.Sprintf(`<td class="token">%d</td>`, l.Token()))
			require.Contains(t, row, fmt.Sprintf(`<button type="button" class="force-release" data-key="exports" data-permit="%d"`, i+1))
		}
		require.Equal(t, 2, strings.Count(body, `<tr data-key="exports" data-permit=`))
		require.NotContains(t, rowOf(t, body, "inventory:feed"), "data-permit", "a lock has no permit")
	}
	status, body := get(t, root, "?sort=-token&prefix=exports")
	require.Equal(t, http.StatusOK, status)
	require.Regexp(t, `(?s)data-permit="2".*data-permit="1"`, body, "sorted by token, descending: permit 2 was taken last")

	status, body = get(t, root, "jobs")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, `<table id="jobs">`)
	require.Contains(t, body, `<tr data-job="inventory:reconcile">`)
	require.Contains(t, body, `href="./jobs/inventory:reconcile"`)
	require.Contains(t, body, "warehouse said 502")

	status, body = get(t, root, "jobs/"+url.PathEscape("inventory:reconcile"))
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, `<svg class="timeline"`)
	require.Contains(t, body, `<g class="lane" data-instance="web-1">`)
	require.Contains(t, body, `<g class="lane" data-instance="web-2">`)
	require.Equal(t, 1, strings.Count(body, `<rect class="run ok"`))
	require.Equal(t, 1, strings.Count(body, `<rect class="run error"`))
	require.Contains(t, body, `<table id="runs">`)
	require.Contains(t, body, `<td class="err">warehouse said 502</td>`)
	require.Contains(t, body, `href="../static/console.css"`, "relative to the job's page")

	status, body = get(t, root, "jobs/inventory:reconcile?window=24h")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, `<rect class="run error"`)

	status, body = get(t, root, "elections")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, `<table id="elections">`)

	for _, asset := range []string{"static/console.js", "static/console.css"} {
		status, _ := get(t, root, asset)
		require.Equal(t, http.StatusOK, status, asset)
	}
}

// permitRowOf returns the locks table's row of permit of the semaphore key.
func permitRowOf(t *testing.T, body, key string, permit int) string {
	t.Helper()
	m := regexp.MustCompile(`(?s)<tr data-key="` + regexp.QuoteMeta(key) + `" data-permit="` + fmt.Sprint(permit) + `".*?</tr>`).FindString(body)
	require.NotEmpty(t, m, "no row for permit %d of %q", permit, key)
	return m
}

// rowOf returns the locks table's row of key.
func rowOf(t *testing.T, body, key string) string {
	t.Helper()
	m := regexp.MustCompile(`(?s)<tr data-key="` + regexp.QuoteMeta(key) + `".*?</tr>`).FindString(body)
	require.NotEmpty(t, m, "no row for %q", key)
	return m
}

func TestUserDataIsEscaped(t *testing.T) {
	t.Parallel()
	pool := newDatabase(t)
	c := newClient(t, pool, `web"><img src=x onerror=alert(2)>`)
	slotted := "slots:<b>bold</b>"
	sj, err := c.Job(slotted, func(context.Context) error { return errors.New(`<img src=x onerror="alert(4)">`) }, pglock.Every(time.Hour))
	require.NoError(t, err)
	root := serve(t, c, pglockui.WithAuthorize(func(*http.Request) bool { return true }), pglockui.WithJobs(sj))
	key := "<script>alert(1)</script>"
	holder(t, c, key, time.Minute)
	job := "job:<b>bold</b>"
	runJob(t, c, job, func(context.Context) error { return errors.New(`<img src=x onerror="alert(3)"> & </td></tr></table>`) })
	require.Error(t, sj.Run(t.Context()))
	require.Eventually(t, func() bool {
		runs, err := c.JobRuns(t.Context(), slotted, 1)
		return err == nil && len(runs) == 1
	}, 5*time.Second, 10*time.Millisecond, "the slot's run recorded")

	pages := map[string]string{
		"locks": "", "locks under the key as prefix": "?prefix=" + url.QueryEscape(key),
		"jobs": "jobs", "job": "jobs/" + url.PathEscape(job), "job with slots": "jobs/" + url.PathEscape(slotted),
	}
	for name, path := range pages {
		status, body := get(t, root, path)
		require.Equal(t, http.StatusOK, status, name)
		for _, raw := range []string{"<script>alert", "<img", "<b>bold", "</td></tr></table>"} {
			require.NotContains(t, body, raw, "%s: raw %q", name, raw)
		}
	}
	_, body := get(t, root, "")
	require.Contains(t, body, `<code>&lt;script&gt;alert(1)&lt;/script&gt;</code>`)
	require.Contains(t, body, `data-key="&lt;script&gt;alert(1)&lt;/script&gt;"`)
	require.Contains(t, body, `web&#34;&gt;&lt;img src=x onerror=alert(2)&gt;`)
	_, body = get(t, root, "jobs/"+url.PathEscape(job))
	require.Contains(t, body, `&lt;img src=x onerror=&#34;alert(3)&#34;&gt; &amp; &lt;/td&gt;&lt;/tr&gt;&lt;/table&gt;`)
	require.Contains(t, body, `<title>error on web&#34;&gt;&lt;img`, "the bar's tooltip too")
	_, body = get(t, root, "jobs/"+url.PathEscape(slotted))
	require.Contains(t, body, `data-instance="web&#34;&gt;&lt;img src=x onerror=alert(2)&gt;" data-outcome="error"`, "the slot's mark")
	require.Contains(t, body, `: error on web&#34;&gt;&lt;img src=x onerror=alert(2)&gt;, token`, "its tooltip")
	require.Contains(t, body, `<td class="instance">web&#34;&gt;&lt;img src=x onerror=alert(2)&gt;</td>`, "the slots' table")
}

func TestActionsRefusedChangeNothing(t *testing.T) {
	t.Parallel()
	pool := newDatabase(t)
	c := newClient(t, pool, "web-1")
	l := holder(t, c, "inventory:feed", time.Minute)
	released := holder(t, c, "inventory:old", time.Minute)
	require.NoError(t, released.Release(t.Context()))
	off := serve(t, c)
	admin := serve(t, c, pglockui.WithAuthorize(func(r *http.Request) bool { return r.Header.Get("X-Admin") == "yes" }))
	adminHeader := http.Header{"X-Admin": {"yes"}}

	cases := []struct {
		name   string
		root   string
		header http.Header
	}{
		{"actions off", off, adminHeader},
		{"not authorized", admin, nil},
		{"from another origin", admin, http.Header{"X-Admin": {"yes"}, "Sec-Fetch-Site": {"cross-site"}}},
		{"from another origin, by Origin", admin, http.Header{"X-Admin": {"yes"}, "Sec-Fetch-Site": nil, "Origin": {"https://evil.example"}}},
	}
	for _, tc := range cases {
		status, _ := post(t, tc.root, "locks/release", url.Values{"key": {"inventory:feed"}}, tc.header)
		require.Equal(t, http.StatusForbidden, status, tc.name)
		status, _ = post(t, tc.root, "prune", url.Values{"older_than": {"0s"}}, tc.header)
		require.Equal(t, http.StatusForbidden, status, tc.name)
	}
	locks, err := c.Locks(t.Context(), "inventory:")
	require.NoError(t, err)
	require.Len(t, locks, 2, "nothing pruned")
	require.True(t, locks[0].Held)
	require.Equal(t, l.Token(), locks[0].Token, "nothing released")
	require.NoError(t, l.Context().Err())

	_, body := get(t, off, "")
	require.NotContains(t, body, "force-release", "no buttons without WithAuthorize")
	require.NotContains(t, body, `id="confirm"`)

	status, body := post(t, admin, "prune", url.Values{"older_than": {"0s"}}, adminHeader)
	require.Equal(t, http.StatusOK, status, body)
	require.Contains(t, body, "pruned 1 locks")
}

func TestForceReleaseThroughTheConsole(t *testing.T) {
	t.Parallel()
	pool := newDatabase(t)
	app := newClient(t, pool, "web-1")
	other := newClient(t, pool, "web-2")
	root := serve(t, other, pglockui.WithAuthorize(func(*http.Request) bool { return true }))
	const ttl = 3 * time.Second
	l := holder(t, app, "inventory:feed", ttl)

	status, body := post(t, root, "locks/release", url.Values{"key": {"inventory:feed"}}, nil)
	released := time.Now()
	require.Equal(t, http.StatusOK, status, body)
	require.Contains(t, body, fmt.Sprintf(`force-released "inventory:feed": it was held by %s with token %d`, l.Owner(), l.Token()))

	select {
	case <-l.Context().Done():
	case <-time.After(ttl/3 + time.Second):
		t.Fatal("the holder's context did not end within ttl/3")
	}
	t.Logf("the holder's ctx ended %v after the force-release", time.Since(released).Round(time.Millisecond))
	var lost *pglock.LockLostError
	require.ErrorAs(t, context.Cause(l.Context()), &lost)
	require.Equal(t, pglock.LostRefused, lost.Reason)

	next := holder(t, other, "inventory:feed", ttl)
	require.Greater(t, next.Token(), l.Token())

	status, body = post(t, root, "locks/release", url.Values{"key": {"inventory:nobody"}}, nil)
	require.Equal(t, http.StatusConflict, status, body)
	require.Contains(t, body, "no live holder")
}

func TestForceReleaseOfAPermitThroughTheConsole(t *testing.T) {
	t.Parallel()
	pool := newDatabase(t)
	app := newClient(t, pool, "web-1")
	other := newClient(t, pool, "web-2")
	root := serve(t, other, pglockui.WithAuthorize(func(*http.Request) bool { return true }))
	sem, err := app.Semaphore("exports", 2)
	require.NoError(t, err)
	first, err := sem.TryAcquire(t.Context(), pglock.TTL(3*time.Second))
	require.NoError(t, err)
	second, err := sem.TryAcquire(t.Context(), pglock.TTL(3*time.Second))
	require.NoError(t, err)
	t.Cleanup(func() { _ = first.Release(context.Background()) })

	status, body := post(t, root, "locks/release", url.Values{"key": {"exports"}, "permit": {"2"}}, nil)
	require.Equal(t, http.StatusOK, status, body)
	require.Contains(t, body, fmt.Sprintf(`force-released permit 2 of "exports": it was held by %s with token %d`, second.Owner(), second.Token()))
	select {
	case <-second.Context().Done():
	case <-time.After(2 * time.Second):
		t.Fatal("the holder of permit 2 did not lose it within ttl/3")
	}
	require.NoError(t, first.Context().Err(), "permit 1 is untouched")

	next, err := other.Semaphore("exports", 2)
	require.NoError(t, err)
	l, err := next.TryAcquire(t.Context())
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Release(context.Background()) })
	require.Equal(t, 2, l.Permit())
	require.Greater(t, l.Token(), second.Token())

	status, body = post(t, root, "locks/release", url.Values{"key": {"exports"}, "permit": {"3"}}, nil)
	require.Equal(t, http.StatusConflict, status, body)
	require.Contains(t, body, `permit 3 of "exports" has no live holder`)
	status, body = post(t, root, "locks/release", url.Values{"key": {"exports"}}, nil)
	require.Equal(t, http.StatusConflict, status, "the semaphore's key is no lock")
	require.Contains(t, body, "no live holder")
	require.NoError(t, first.Context().Err())
}

func TestBadRequests(t *testing.T) {
	t.Parallel()
	pool := newDatabase(t)
	c := newClient(t, pool, "web-1")
	root := serve(t, c, pglockui.WithAuthorize(func(*http.Request) bool { return true }))
	l := holder(t, c, "inventory:feed", time.Minute)
	sem, err := c.Semaphore("exports", 2)
	require.NoError(t, err)
	p, err := sem.TryAcquire(t.Context())
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Release(context.Background()) })

	gets := []struct {
		path   string
		status int
		says   string
	}{
		{"nope", http.StatusNotFound, "no page at /nope"},
		{"locks/nope", http.StatusNotFound, "no page"},
		{"static/nope.js", http.StatusNotFound, ""},
		{"?prefix=%ff", http.StatusBadRequest, "prefix"},
		{"?prefix=a%00b", http.StatusBadRequest, "prefix"},
		{"?prefix=" + strings.Repeat("k", 501), http.StatusBadRequest, "prefix has 501 characters"},
		{"?page=0", http.StatusBadRequest, `page &#34;0&#34;: want a whole number from 1`},
		{"?page=-1", http.StatusBadRequest, "page"},
		{"?page=two", http.StatusBadRequest, "page"},
		{"?page=99999999999999999999", http.StatusBadRequest, "page"},
		{"?sort=owner", http.StatusBadRequest, "sort"},
		{"jobs/x?window=2h", http.StatusBadRequest, "window"},
		{"jobs/a%00b", http.StatusBadRequest, "pglock: invalid key"},
	}
	for _, g := range gets {
		status, body := get(t, root, g.path)
		require.Equal(t, g.status, status, g.path)
		require.Contains(t, body, g.says, g.path)
	}
	posts := []struct {
		path string
		form url.Values
		says string
	}{
		{"locks/release", url.Values{}, "invalid key"},
		{"locks/release", url.Values{"key": {"a\x00b"}}, "invalid key"},
		{"locks/release", url.Values{"key": {"exports"}, "permit": {"-1"}}, `permit "-1": want a permit's number, 1 to 1000`},
		{"locks/release", url.Values{"key": {"exports"}, "permit": {"1001"}}, `permit "1001"`},
		{"locks/release", url.Values{"key": {"exports"}, "permit": {"two"}}, `permit "two"`},
		{"locks/release", url.Values{"key": {strings.Repeat("k", pglock.MaxKeyLength-4)}, "permit": {"1"}}, "invalid key"},
		{"locks/release", url.Values{"key": {"a\x1fb"}, "permit": {"1"}}, "invalid key"},
		{"prune", url.Values{}, "older_than"},
		{"prune", url.Values{"older_than": {"soon"}}, "older_than"},
		{"prune", url.Values{"older_than": {"-1h"}}, "negative"},
	}
	for _, p := range posts {
		status, body := post(t, root, p.path, p.form, nil)
		require.Equal(t, http.StatusBadRequest, status, "%s %v", p.path, p.form)
		require.Contains(t, body, p.says)
	}
	require.NoError(t, l.Context().Err(), "still held")
	require.NoError(t, p.Context().Err(), "still held")
}

func TestNewRefusesBadInput(t *testing.T) {
	t.Parallel()
	pool := newDatabase(t)
	c := newClient(t, pool, "web-1")
	cases := []struct {
		name   string
		client *pglock.Client
		opts   []pglockui.Option
		says   string
	}{
		{"nil client", nil, nil, "pglockui: New: nil *pglock.Client"},
		{"nil option", c, []pglockui.Option{nil}, "nil Option"},
		{"nil authorize", c, []pglockui.Option{pglockui.WithAuthorize(nil)}, "WithAuthorize: nil func"},
		{"nil job", c, []pglockui.Option{pglockui.WithJobs(nil)}, "WithJobs: nil *pglock.Job"},
	}
	for _, tc := range cases {
		h, err := pglockui.New(tc.client, tc.opts...)
		require.ErrorIs(t, err, pglock.ErrInvalidArgument, tc.name)
		require.ErrorContains(t, err, tc.says, tc.name)
		require.Nil(t, h)
	}
}

func TestMountedUnderAPrefixWithoutItsSlash(t *testing.T) {
	t.Parallel()
	pool := newDatabase(t)
	h, err := pglockui.New(newClient(t, pool, "web-1"), pglockui.WithLogger(quiet))
	require.NoError(t, err)
	// Mounted as a router that, unlike ServeMux, does not add the slash itself.
	srv := httptest.NewServer(http.StripPrefix("/admin/pglock", h))
	t.Cleanup(srv.Close)
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := noFollow.Get(srv.URL + "/admin/pglock")
	require.NoError(t, err)
	require.NoError(t, res.Body.Close())
	require.Equal(t, http.StatusMovedPermanently, res.StatusCode)
	require.Equal(t, "pglock/", res.Header.Get("Location"), "relative, so that it holds behind a proxy")
	status, body := get(t, srv.URL, "/admin/pglock/")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, `<table id="locks"`)
}
