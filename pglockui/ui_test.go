package pglockui_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
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
		require.Contains(t, body, `<span id="health" class="ready"`)
	}

	status, body := get(t, root, "jobs")
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

// rowOf returns the locks table's row of key.
func rowOf(t *testing.T, body, key string) string {
	t.Helper()
	m := regexp.MustCompile(`(?s)<tr data-key="` + regexp.QuoteMeta(key) + `".*?</tr>`).FindString(body)
	require.NotEmpty(t, m, "no row for %q", key)
	return m
}
