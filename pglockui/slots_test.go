package pglockui_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/pglockui"
)

// slotJob is the job of slotHistory: a slot every hour, at least once, catch-up of one.
const slotJob = "stock:count"

// slotHistory is what slotHistory made happen to slotJob, read back from the history.
type slotHistory struct {
	job            *pglock.Job // worker-a's
	current, retry time.Time   // the current slot, and the missed one caught up and retried
	runs           []pglock.JobRun
}

// latest returns the latest attempt of slot in the history.
func (h slotHistory) latest(t *testing.T, slot time.Time) pglock.JobRun {
	t.Helper()
	for _, r := range h.runs { // newest first
		if r.Slot.Equal(slot) {
			return r
		}
	}
	t.Fatalf("no run of slot %v in %+v", slot, h.runs)
	return pglock.JobRun{}
}

// runSlots makes a job with slots that has done everything a console shows of them,
// on two instances, worker-a and worker-b: the fleet last claimed the slot three hours
// ago (a back-dated row); worker-a's tick finds two slots missed since, counts the
// older one missed and catches up the latest (CatchUp(1)), whose first attempt fails
// and is retried (AtLeastOnce), then runs the current slot; worker-b's tick finds the
// current slot claimed.
func runSlots(t *testing.T, pool *pgxpool.Pool) slotHistory {
	t.Helper()
	ctx := t.Context()
	now := awayFromTheHour(t, pool)
	h := slotHistory{current: now.Truncate(time.Hour)}
	h.retry = h.current.Add(-time.Hour)
	_, err := pool.Exec(ctx, `INSERT INTO pglock.job_slots (job, slot, attempt, attempts, fencing_token, owner, claimed_at, ended_at, outcome)
		VALUES ($1, $2::timestamptz, 1, 2, 1, 'a-fleet-long-gone', $2::timestamptz, $2::timestamptz + interval '1 second', 'ok')`, slotJob, h.current.Add(-3*time.Hour))
	require.NoError(t, err)

	var mu sync.Mutex
	calls := map[time.Time]int{}
	fn := func(ctx context.Context) error {
		slot, _ := pglock.SlotFromContext(ctx)
		mu.Lock()
		defer mu.Unlock()
		calls[slot.UTC()]++
		if slot.Equal(h.retry) && calls[slot.UTC()] == 1 {
			return errors.New("the warehouse did not answer")
		}
		return nil
	}
	opts := []pglock.JobOption{pglock.Every(time.Hour), pglock.CatchUp(1), pglock.AtLeastOnce(2, 0)}
	a := newClient(t, pool, "worker-a")
	b := newClient(t, pool, "worker-b")
	ja, err := a.Job(slotJob, fn, opts...)
	require.NoError(t, err)
	jb, err := b.Job(slotJob, fn, opts...)
	require.NoError(t, err)
	h.job = ja
	require.ErrorContains(t, ja.Run(ctx), "the warehouse did not answer")
	require.NoError(t, jb.Run(ctx))

	require.Eventually(t, func() bool {
		h.runs, err = a.JobRuns(ctx, slotJob, 10)
		if err != nil || len(h.runs) != 3 {
			return false
		}
		statuses, err := a.JobStatuses(ctx)
		if err != nil || len(statuses) != 1 || statuses[0].Slots == nil {
			return false
		}
		s := statuses[0]
		return s.Slots.Retried == 1 && s.Slots.OK == 3 &&
			slices.ContainsFunc(s.Skips, func(k pglock.JobSkips) bool { return k.Reason == pglock.SkipSlotClaimed }) &&
			slices.ContainsFunc(s.Skips, func(k pglock.JobSkips) bool { return k.Reason == pglock.SkipSlotMissed })
	}, 15*time.Second, 20*time.Millisecond, "the runs, the retry and the skips in the history")
	return h
}

// awayFromTheHour waits, if the database's clock is within seconds of an hour, until
// it is past it, so that a test's slots every hour do not move under it; it returns the
// database's now.
func awayFromTheHour(t *testing.T, pool *pgxpool.Pool) time.Time {
	t.Helper()
	for {
		var now time.Time
		require.NoError(t, pool.QueryRow(t.Context(), "SELECT clock_timestamp()").Scan(&now))
		left := now.Truncate(time.Hour).Add(time.Hour).Sub(now)
		if left > 30*time.Second {
			return now
		}
		time.Sleep(left + 2*time.Second)
	}
}

// element returns the first element of body that the regular expression expr (with
// (?s)) matches, failing t when none does.
func element(t *testing.T, body, expr string) string {
	t.Helper()
	m := regexp.MustCompile(`(?s)` + expr).FindString(body)
	require.NotEmpty(t, m, "nothing matches %s", expr)
	return m
}

func TestJobPageShowsEachSlotWhoRanItAndWhatBecameOfIt(t *testing.T) {
	t.Parallel()
	pool := newDatabase(t)
	h := runSlots(t, pool)
	root := serve(t, newClient(t, pool, "web-1"), pglockui.WithJobs(h.job))
	current, retried := h.latest(t, h.current), h.latest(t, h.retry)
	require.Equal(t, "worker-a", current.Instance, "worker-a claimed the current slot; worker-b found it claimed")
	require.Equal(t, 2, retried.Attempt)
	first := h.runs[slices.IndexFunc(h.runs, func(r pglock.JobRun) bool { return r.Slot.Equal(h.retry) && r.Attempt == 1 })]
	stamp := func(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z07:00") }

	status, body := get(t, root, "jobs/"+url.PathEscape(slotJob)+"?window=24h")
	require.Equal(t, http.StatusOK, status)
	t.Run("TheSlotsLaneMarksEachSlotThatRanWithItsLatestAttempt", func(t *testing.T) {
		lane := element(t, body, `<g class="slots">.*?</g>`)
		require.Contains(t, lane, `<text class="instance" x="4" y="20">slots</text>`)
		require.Len(t, regexp.MustCompile(`<circle class="slot `).FindAllString(lane, -1), 2, "the back-dated slot has no run: no mark")
		mark := element(t, lane, `<circle class="slot ok" [^>]*data-slot="`+stamp(h.current)+`"[^>]*>`)
		require.Contains(t, mark, `data-instance="worker-a" data-outcome="ok" data-attempt="1"`)
		require.Contains(t, lane, fmt.Sprintf(`ok on worker-a, token %d, attempt 1;`, current.Token))
		mark = element(t, lane, `<circle class="slot ok retry" [^>]*data-slot="`+stamp(h.retry)+`"[^>]*>`)
		require.Contains(t, mark, fmt.Sprintf(`data-instance="%s" data-outcome="ok" data-attempt="2"`, retried.Instance))
		require.Contains(t, lane, fmt.Sprintf(`ok on %s, token %d, attempt 2 (retried)`, retried.Instance, retried.Token))
	})
	t.Run("AnInstanceLaneShowsItsRunsRetriesAndSkips", func(t *testing.T) {
		a := element(t, body, `<g class="lane" data-instance="worker-a">.*?</g>`)
		require.Contains(t, a, `<rect class="run error"`, "the caught-up slot's first attempt")
		require.Contains(t, a, `<circle class="skip slot-missed" `)
		require.Contains(t, a, `data-reason="slot-missed" data-count="1"><title>worker-a: 1 × a slot missed (no tick ran it), the last counted at`)
		b := element(t, body, `<g class="lane" data-instance="worker-b">.*?</g>`)
		require.Contains(t, b, `<circle class="skip slot-claimed" `)
		require.Contains(t, b, `data-count="1"><title>worker-b: 1 × a tick that found its slot claimed by another, the last at`)
		require.Contains(t, body, `<rect class="run ok retry"`, "the retry, on whichever instance took it")
		require.Contains(t, body, fmt.Sprintf("slot %s, attempt 2", h.retry.Local().Format("15:04:05.000")), "a bar's title names its slot")
	})
	t.Run("TheSlotsTableSaysWhoRanEachSlotWithWhichToken", func(t *testing.T) {
		row := element(t, body, `<tr class="ok" data-slot="`+stamp(h.current)+`">.*?</tr>`)
		require.Contains(t, row, `<td class="instance">worker-a</td>`)
		require.Contains(t, row, fmt.Sprintf(`<td class="token">%d</td>`, current.Token))
		require.Contains(t, row, `<td class="attempt">1</td>`)
		require.Contains(t, row, `<span class="outcome ok">ok</span>`)
		require.Contains(t, row, `<td class="earlier">—</td>`)
		row = element(t, body, `<tr class="ok" data-slot="`+stamp(h.retry)+`">.*?</tr>`)
		require.Contains(t, row, fmt.Sprintf(`<td class="instance">%s</td>`, retried.Instance))
		require.Contains(t, row, fmt.Sprintf(`<td class="token">%d</td>`, retried.Token))
		require.Contains(t, row, `<td class="attempt">2 <span class="retried">retried</span></td>`)
		require.Contains(t, row, fmt.Sprintf(`1: <span class="outcome error">error</span> on worker-a, token %d: <span class="err">the warehouse did not answer</span>`, first.Token))
		require.Greater(t, retried.Token, first.Token, "each attempt a greater token")
		require.Regexp(t, `<td class="delay">1h\d\dm</td>`, row, "caught up an hour or more after its slot")
	})
	t.Run("TheSummarySaysThePolicyCountsSkipsAndMisses", func(t *testing.T) {
		dl := element(t, body, `<dl class="slots">.*?</dl>`)
		for _, want := range []string{
			`<dd class="schedule"><code>every 1h00m</code></dd>`,
			`<dd class="attempts">at least once: up to 2 attempts, each after one that did not succeed</dd>`,
			`<dd class="counts">3 ok, 1 retried; the latest <time datetime="` + stamp(h.current) + `">`,
			`<dd class="claimed"><span class="skip" data-instance="worker-b">worker-b ×1, the last at`,
			`<dd class="missed"><span class="skip" data-instance="worker-a">worker-a counted 1, the last at`,
			`<dd class="catch-up">CatchUp(1): the latest missed slot runs once, before the tick&#39;s own</dd>`,
			`<dd class="deadline">none: a slot may start until the next one comes</dd>`,
		} {
			require.Contains(t, dl, want)
		}
	})
	t.Run("TheRunsTableNamesEachRunsSlotAndAttempt", func(t *testing.T) {
		runs := element(t, body, `<table id="runs">.*?</table>`)
		require.Contains(t, runs, `<th scope="col">Slot</th><th scope="col">Attempt</th>`)
		require.Equal(t, 3, len(regexp.MustCompile(`<td class="slot"><time datetime=`).FindAllString(runs, -1)))
	})
	t.Run("TheOneHourWindowLeavesOutTheOlderSlot", func(t *testing.T) {
		_, body := get(t, root, "jobs/"+url.PathEscape(slotJob))
		lane := element(t, body, `<g class="slots">.*?</g>`)
		require.Contains(t, lane, `data-slot="`+stamp(h.current)+`"`)
		require.NotContains(t, lane, `data-slot="`+stamp(h.retry)+`"`, "an hour before the current slot, at or before the window's start")
		require.Contains(t, body, `data-slot="`+stamp(h.retry)+`"`, "the table lists it still")
	})
	t.Run("TheJobsPageCountsTheSlots", func(t *testing.T) {
		_, body := get(t, root, "jobs")
		require.Contains(t, element(t, body, `<tr data-job="stock:count">.*?</tr>`), `<td class="slots">3 ok, 1 retried</td>`)
	})
	t.Run("AConsoleNotGivenTheJobSaysItsPolicyIsUnknown", func(t *testing.T) {
		_, body := get(t, serve(t, newClient(t, pool, "web-2")), "jobs/"+url.PathEscape(slotJob))
		require.Contains(t, body, `<dd class="policy-unknown">not known to this console`)
		require.NotContains(t, body, `class="catch-up"`)
		require.Contains(t, body, `<dd class="missed"><span class="skip" data-instance="worker-a">`, "the counts come from the database all the same")
	})
}

func TestJobPageSaysTheSlotPolicyInWords(t *testing.T) {
	t.Parallel()
	pool := newDatabase(t)
	c := newClient(t, pool, "worker-a")
	nop := func(context.Context) error { return nil }
	cases := []struct {
		name string
		opts []pglock.JobOption
		want map[string]string // dd class: its text
	}{
		{"EveryAtMostOnceWithoutCatchUp", []pglock.JobOption{pglock.Every(5 * time.Minute)}, map[string]string{
			"schedule": "<code>every 5m00s</code>",
			"attempts": "at most once: a claimed slot never runs again",
			"catch-up": "none: each missed slot is counted, none runs",
			"deadline": "none: a slot may start until the next one comes",
		}},
		{"CronCatchingUpTheLatest", []pglock.JobOption{pglock.Cron("0 2 * * *"), pglock.CatchUp(1)}, map[string]string{
			"schedule": "<code>cron CRON_TZ=UTC 0 2 * * *</code>",
			"catch-up": "CatchUp(1): the latest missed slot runs once, before the tick&#39;s own",
		}},
		{"CatchingUpSeveralWithADeadline", []pglock.JobOption{pglock.Every(time.Minute), pglock.CatchUp(5), pglock.Deadline(30 * time.Second)}, map[string]string{
			"catch-up": "CatchUp(5): the latest 5 missed slots run, oldest first, before the tick&#39;s own; older ones are counted missed",
			"deadline": "a slot not started within 30s of its time counts as missed",
		}},
		{"ZonedCronAtLeastOnceWithBackoff", []pglock.JobOption{pglock.Cron("CRON_TZ=Europe/Paris 30 6 * * 1-5"), pglock.AtLeastOnce(3, 10*time.Second)}, map[string]string{
			"schedule": "<code>cron CRON_TZ=Europe/Paris 30 6 * * 1-5</code>",
			"attempts": "at least once: up to 3 attempts, each after one that did not succeed, 10s later, doubling each time",
		}},
	}
	var jobs []*pglock.Job
	for _, tc := range cases {
		j, err := c.Job("policy:"+tc.name, nop, tc.opts...)
		require.NoError(t, err)
		jobs = append(jobs, j)
	}
	plain, err := c.Job("policy:none", nop, pglock.WithoutOverlapping())
	require.NoError(t, err)
	root := serve(t, c, pglockui.WithJobs(append(jobs, plain)...))
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, body := get(t, root, "jobs/"+url.PathEscape("policy:"+tc.name))
			require.Equal(t, http.StatusOK, status)
			require.Contains(t, body, `<g class="slots">`, "a slots lane before any run")
			require.Contains(t, body, `<td colspan="7">No run of a slot recorded.</td>`)
			require.Contains(t, body, `<dd class="counts">none</dd>`)
			for class, text := range tc.want {
				require.Contains(t, body, `<dd class="`+class+`">`+text+`</dd>`)
			}
		})
	}
	t.Run("AJobWithoutAScheduleHasNoSlots", func(t *testing.T) {
		status, body := get(t, root, "jobs/policy:none")
		require.Equal(t, http.StatusOK, status)
		require.NotContains(t, body, `class="slots"`)
		require.NotContains(t, body, `<th scope="col">Slot</th>`)
	})
}
