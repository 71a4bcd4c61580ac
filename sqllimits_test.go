package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/pglocktest"
)

// The SQL functions are the last line for every caller, a role granted only EXECUTE as
// much as the Go API: they refuse what the Go API refuses (a key of 1 to MaxKeyLength
// characters, an owner, a ttl from MinTTL to MaxTTL), with lock_prune's SQLSTATE,
// invalid_parameter_value, and write nothing.

// TestSQLFunctionsRefuseWhatTheGoAPIRefuses calls each function that writes or row-locks
// with each argument out of range, as an application role with README's grants.
func TestSQLFunctionsRefuseWhatTheGoAPIRefuses(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dbURL := pglocktest.PostgresURL(t)
	admin := pglocktest.Pool(t, dbURL, 2)
	app := pglocktest.Pool(t, newRole(t, dbURL, appGrants...), 2)
	long := strings.Repeat("é", pglock.MaxKeyLength+1) // characters, not bytes
	maxTTL := int64(pglock.MaxTTL / time.Millisecond)
	type call struct {
		name string
		sql  string
		args []any
	}
	var calls []call
	for _, f := range []string{"lock_acquire", "lock_acquire_or_want", "lock_renew"} {
		q := "SELECT pglock." + f + "($1, $2, $3)"
		calls = append(calls,
			call{f + " of an empty key", q, []any{"", "o", 1000}},
			call{f + " of a key too long", q, []any{long, "o", 1000}},
			call{f + " with an empty owner", q, []any{"k", "", 1000}},
			call{f + " with a ttl of 0", q, []any{"k", "o", 0}},
			call{f + " with a negative ttl", q, []any{"k", "o", -1}},
			call{f + " with a ttl over a year", q, []any{"k", "o", maxTTL + 1}},
			call{f + " with a ttl past an interval's range", q, []any{"k", "o", int64(1<<63 - 1)}},
		)
	}
	many := "SELECT * FROM pglock.lock_renew_many($1::text[], $2::text[], $3)"
	calls = append(calls,
		call{"lock_renew_many of an empty key", many, []any{[]string{"k", ""}, []string{"o", "o"}, 1000}},
		call{"lock_renew_many of a key too long", many, []any{[]string{long}, []string{"o"}, 1000}},
		call{"lock_renew_many with an empty owner", many, []any{[]string{"k"}, []string{""}, 1000}},
		call{"lock_renew_many with a null key", many, []any{[]*string{nil}, []string{"o"}, 1000}},
		call{"lock_renew_many with more keys than owners", many, []any{[]string{"k", "l"}, []string{"o"}, 1000}},
		call{"lock_renew_many with a ttl of 0", many, []any{[]string{"k"}, []string{"o"}, 0}},
		call{"lock_renew_many with a ttl past an interval's range", many, []any{[]string{"k"}, []string{"o"}, int64(1<<63 - 1)}},
	)
	releaseMany := "SELECT * FROM pglock.lock_release_many($1::text[], $2::text[], true)"
	calls = append(calls,
		call{"lock_release_many of an empty key", releaseMany, []any{[]string{"k", ""}, []string{"o", "o"}}},
		call{"lock_release_many of a key too long", releaseMany, []any{[]string{long}, []string{"o"}}},
		call{"lock_release_many with an empty owner", releaseMany, []any{[]string{"k"}, []string{""}}},
		call{"lock_release_many with a null key", releaseMany, []any{[]*string{nil}, []string{"o"}}},
		call{"lock_release_many with more keys than owners", releaseMany, []any{[]string{"k", "l"}, []string{"o"}}},
		call{"lock_release_many of over 1000 keys", releaseMany, []any{make([]string, 1001), make([]string, 1001)}},
		call{"lock_release_many of a semaphore's key too long", releaseMany, []any{[]string{strings.Repeat("s", 496) + "\x1f"}, []string{"o"}}},
	)
	for _, f := range []string{"lock_release", "lock_release_async"} {
		q := "SELECT pglock." + f + "($1, $2)"
		calls = append(calls,
			call{f + " of an empty key", q, []any{"", "o"}},
			call{f + " of a key too long", q, []any{long, "o"}},
			call{f + " with an empty owner", q, []any{"k", ""}},
		)
	}
	for f, q := range map[string]string{
		"lock_want":          "SELECT pglock.lock_want($1)",
		"lock_held":          "SELECT pglock.lock_held($1, 1)",
		"lock_force_release": "SELECT * FROM pglock.lock_force_release($1)",
		"job_run_record":     "SELECT pglock.job_run_record($1, 'i', 'o', 1, 0, 0, 'ok', NULL, 60000)",
	} {
		calls = append(calls,
			call{f + " of an empty key", q, []any{""}},
			call{f + " of a key too long", q, []any{long}},
		)
	}
	// Since 000027: no lock call takes a permit's row key, owners and instance names are
	// bounded, and every function checks every argument.
	permitKey, longOwner := "s\x1f1", strings.Repeat("o", 256)
	for _, f := range []string{"lock_acquire", "lock_acquire_or_want"} {
		q := "SELECT pglock." + f + "($1, $2, $3)"
		calls = append(calls,
			call{f + " of a permit's row key", q, []any{permitKey, "o", 1000}},
			call{f + " of a key with U+001F", q, []any{"a\x1fb", "o", 1000}},
			call{f + " with an owner too long", q, []any{"k", longOwner, 1000}},
		)
	}
	queue := "SELECT * FROM pglock.queue_acquire($1, $2, $3, $4)"
	calls = append(calls,
		call{"queue_acquire of a lock with a permit's row key", queue, []any{permitKey, "o", 1000, 0}},
		call{"queue_acquire of a lock with a semaphore's queue key", queue, []any{"s\x1f", "o", 1000, 0}},
		call{"queue_acquire with an owner too long", queue, []any{"k", strings.Repeat("x", 9000), 1000, 0}},
		call{"queue_acquire of a semaphore with an owner too long", queue, []any{"s", longOwner, 1000, 2}},
		call{"queue_acquire with permits over 1000", queue, []any{"s", "o", 1000, 1001}},
		call{"queue_poll of a key with U+001F", "SELECT * FROM pglock.queue_poll($1, 1)", []any{"s\x1f"}},
		call{"queue_poll of ticket 0", "SELECT * FROM pglock.queue_poll($1, 0)", []any{"k"}},
		call{"queue_leave of a key with U+001F", "SELECT pglock.queue_leave($1, 1)", []any{"s\x1f"}},
		call{"lock_want of a permit's row key", "SELECT pglock.lock_want($1)", []any{permitKey}},
		call{"lock_held of a permit's row key", "SELECT pglock.lock_held($1, 1)", []any{permitKey}},
		call{"lock_holder of an empty key", "SELECT * FROM pglock.lock_holder($1)", []any{""}},
		call{"lock_holder of a permit's row key", "SELECT * FROM pglock.lock_holder($1)", []any{permitKey}},
		call{"sem_acquire with an owner too long", "SELECT * FROM pglock.sem_acquire('s', $1, 1000, 2)", []any{longOwner}},
		call{"sem_release with an owner too long", "SELECT pglock.sem_release('s', $1)", []any{longOwner}},
	)
	for _, key := range []string{"s\x1f0", "s\x1f01", "s\x1f1001", "s\x1f1\x1f2", "\x1f1", "s\x1f", "s\x1fx"} {
		for f, q := range map[string]string{
			"lock_renew":         "SELECT pglock.lock_renew($1, 'o', 1000)",
			"lock_release":       "SELECT pglock.lock_release($1, 'o')",
			"lock_release_async": "SELECT pglock.lock_release_async($1, 'o')",
			"lock_force_release": "SELECT * FROM pglock.lock_force_release($1)",
			"lock_renew_many":    "SELECT * FROM pglock.lock_renew_many(ARRAY[$1], ARRAY['o'], 1000)",
		} {
			calls = append(calls, call{fmt.Sprintf("%s of %q, no permit's row key", f, key), q, []any{key}})
		}
	}
	for f, q := range map[string]string{
		"lock_renew":        "SELECT pglock.lock_renew('k', $1, 1000)",
		"lock_release":      "SELECT pglock.lock_release('k', $1)",
		"lock_renew_many":   "SELECT * FROM pglock.lock_renew_many(ARRAY['k'], ARRAY[$1], 1000)",
		"lock_release_many": "SELECT * FROM pglock.lock_release_many(ARRAY['k'], ARRAY[$1], true)",
		"job_run_record":    "SELECT pglock.job_run_record('j', 'i', $1, 1, 0, 0, 'ok', NULL, 60000)",
	} {
		calls = append(calls, call{f + " with an owner too long", q, []any{longOwner}})
	}
	calls = append(calls,
		call{"lock_release_many of a semaphore's key with U+001F", releaseMany, []any{[]string{"a\x1fb\x1f"}, []string{"o"}}},
		call{"job_run_record with an instance too long", "SELECT pglock.job_run_record('j', $1, 'o', 1, 0, 0, 'ok', NULL, 60000)", []any{strings.Repeat("i", 201)}},
		call{"job_run_record with a null instance", "SELECT pglock.job_run_record('j', NULL, 'o', 1, 0, 0, 'ok', NULL, 60000)", nil},
		call{"job_run_record with token 0", "SELECT pglock.job_run_record('j', 'i', 'o', 0, 0, 0, 'ok', NULL, 60000)", nil},
		call{"job_run_record with an outcome of none", "SELECT pglock.job_run_record('j', 'i', 'o', 1, 0, 0, 'none', NULL, 60000)", nil},
		call{"job_run_record ended millennia ago", "SELECT pglock.job_run_record('j', 'i', 'o', 1, 9e17::bigint, 0, 'ok', NULL, 60000)", nil},
		call{"job_run_record of a job with U+001F", "SELECT pglock.job_run_record($1, 'i', 'o', 1, 0, 0, 'ok', NULL, 60000)", []any{"j\x1f1"}},
	)
	skips := "SELECT pglock.job_skips_record($1, $2::json, 60000)"
	for name, args := range map[string][]any{
		"an instance too long":             {strings.Repeat("i", 201), "[]"},
		"an empty instance":                {"", "[]"},
		"skips not an array":               {"i", `{"job": "j"}`},
		"a job too long":                   {"i", `[{"job": "` + strings.Repeat("j", 501) + `", "reason": "other-instance", "count": 1, "ago_us": 0}]`},
		"a job with U+001F":                {"i", `[{"job": "j\u001f1", "reason": "other-instance", "count": 1, "ago_us": 0}]`},
		"no job":                           {"i", `[{"reason": "other-instance", "count": 1, "ago_us": 0}]`},
		"a reason that is not a word":      {"i", `[{"job": "j", "reason": "Other Instance!", "count": 1, "ago_us": 0}]`},
		"a count of 0":                     {"i", `[{"job": "j", "reason": "other-instance", "count": 0, "ago_us": 0}]`},
		"a negative count":                 {"i", `[{"job": "j", "reason": "other-instance", "count": -1, "ago_us": 0}]`},
		"a count that is not a number":     {"i", `[{"job": "j", "reason": "other-instance", "count": "1", "ago_us": 0}]`},
		"an age past a timestamp's range":  {"i", `[{"job": "j", "reason": "other-instance", "count": 1, "ago_us": 900000000000000000}]`},
		"a negative age":                   {"i", `[{"job": "j", "reason": "other-instance", "count": 1, "ago_us": -1}]`},
		"an element that is not an object": {"i", `[1]`},
	} {
		calls = append(calls, call{"job_skips_record with " + name, skips, args})
	}
	registry := "SELECT pglock.registry_touch('job', $1::text[], $2, true)"
	calls = append(calls,
		call{"registry_touch with an instance too long", registry, []any{[]string{"j"}, strings.Repeat("i", 201)}},
		call{"registry_touch of a key with U+001F", registry, []any{[]string{"j\x1f1"}, "i"}},
		call{"registry_touch of a null key", registry, []any{[]*string{nil}, "i"}},
	)
	// Since 000030: the slots' functions check every argument too.
	claim := "SELECT * FROM pglock.job_slot_claim($1, $2, $3, $4, $5, $6, $7)"
	slotKeyTooLong := strings.Repeat("j", pglock.MaxKeyLength-len(":slot:")-12)
	for name, args := range map[string][]any{
		"an empty job":                      {"", 1000, nil, "o", 1000, 1, 0},
		"a job too long":                    {long, 1000, nil, "o", 1000, 1, 0},
		"a job with U+001F":                 {"j\x1f1", 1000, nil, "o", 1000, 1, 0},
		"a job too long for its slot's key": {slotKeyTooLong, 1000000000000, nil, "o", 1000, 1, 0},
		"a null job":                        {nil, 1000, nil, "o", 1000, 1, 0},
		"a negative slot":                   {"j", -1, nil, "o", 1000, 1, 0},
		"a slot past the year 9999":         {"j", int64(253402300800000), nil, "o", 1000, 1, 0},
		"a null slot":                       {"j", nil, nil, "o", 1000, 1, 0},
		"a next slot before the slot":       {"j", 2000, 1000, "o", 1000, 1, 0},
		"a next slot equal to the slot":     {"j", 2000, 2000, "o", 1000, 1, 0},
		"a next slot past the year 9999":    {"j", 2000, int64(253402300800000), "o", 1000, 1, 0},
		"an empty owner":                    {"j", 1000, nil, "", 1000, 1, 0},
		"an owner too long":                 {"j", 1000, nil, longOwner, 1000, 1, 0},
		"a ttl of 0":                        {"j", 1000, nil, "o", 0, 1, 0},
		"a ttl over a year":                 {"j", 1000, nil, "o", maxTTL + 1, 1, 0},
		"0 attempts":                        {"j", 1000, nil, "o", 1000, 0, 0},
		"101 attempts":                      {"j", 1000, nil, "o", 1000, 101, 0},
		"null attempts":                     {"j", 1000, nil, "o", 1000, nil, 0},
		"a negative deadline":               {"j", 1000, nil, "o", 1000, 1, -1},
		"a deadline over a year":            {"j", 1000, nil, "o", 1000, 1, maxTTL + 1},
		"a null deadline":                   {"j", 1000, nil, "o", 1000, 1, nil},
	} {
		calls = append(calls, call{"job_slot_claim with " + name, claim, args})
	}
	end := "SELECT pglock.job_slot_end($1, $2, $3, $4, $5, $6)"
	for name, args := range map[string][]any{
		"an empty job":                      {"", 1000, "o", 1, "ok", 0},
		"a job with U+001F":                 {"j\x1f1", 1000, "o", 1, "ok", 0},
		"a job too long for its slot's key": {slotKeyTooLong, 1000000000000, "o", 1, "ok", 0},
		"a negative slot":                   {"j", -1, "o", 1, "ok", 0},
		"an owner too long":                 {"j", 1000, longOwner, 1, "ok", 0},
		"token 0":                           {"j", 1000, "o", 0, "ok", 0},
		"an outcome of none":                {"j", 1000, "o", 1, "none", 0},
		"an outcome of missed":              {"j", 1000, "o", 1, "missed", 0},
		"a null outcome":                    {"j", 1000, "o", 1, nil, 0},
		"a negative backoff":                {"j", 1000, "o", 1, "ok", -1},
		"a backoff over a day":              {"j", 1000, "o", 1, "ok", 86400001},
	} {
		calls = append(calls, call{"job_slot_end with " + name, end, args})
	}
	retry := "SELECT * FROM pglock.job_slot_retry($1, $2, $3)"
	calls = append(calls,
		call{"job_slot_retry of an empty job", retry, []any{"", "o", 1000}},
		call{"job_slot_retry of a job with U+001F", retry, []any{"j\x1f1", "o", 1000}},
		call{"job_slot_retry with an owner too long", retry, []any{"j", longOwner, 1000}},
		call{"job_slot_retry with a ttl of 0", retry, []any{"j", "o", 0}},
		call{"job_slot_prune with a negative age", "SELECT pglock.job_slot_prune(-1, 1000)", nil},
		call{"job_slot_prune of 0 rows", "SELECT pglock.job_slot_prune(0, 0)", nil},
	)
	record := "SELECT pglock.job_run_record('j', 'i', 'o', 1, 0, 0, 'ok', NULL, 60000, $1, $2)"
	for name, args := range map[string][]any{
		"a slot without an attempt": {1000, nil},
		"an attempt without a slot": {nil, 1},
		"attempt 0":                 {1000, 0},
		"attempt 101":               {1000, 101},
		"a negative slot":           {-1, 1},
		"a slot past the year 9999": {int64(253402300800000), 1},
	} {
		calls = append(calls, call{"job_run_record with " + name, record, args})
	}
	for _, c := range calls {
		_, err := app.Exec(ctx, c.sql, c.args...)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "%s: want invalid_parameter_value, got %v", c.name, err)
		require.Equal(t, "22023", pgErr.Code, "%s: %s", c.name, pgErr.Message)
	}
	var rows, runs, others int
	require.NoError(t, admin.QueryRow(ctx, `SELECT (SELECT count(*) FROM pglock.locks), (SELECT count(*) FROM pglock.job_runs),
		(SELECT count(*) FROM pglock.job_skips) + (SELECT count(*) FROM pglock.registry) + (SELECT count(*) FROM pglock.waiters)
		+ (SELECT count(*) FROM pglock.semaphores)`).Scan(&rows, &runs, &others))
	require.Zero(t, rows, "a refused call wrote a lock")
	require.Zero(t, runs, "a refused call wrote a run")
	require.Zero(t, others, "a refused call wrote a skip, a registration, a waiter or a semaphore")
	var slots int
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM pglock.job_slots`).Scan(&slots))
	require.Zero(t, slots, "a refused call wrote a slot")
}

// TestSQLFunctionsTakeWhatTheGoAPITakes: the limits themselves are allowed: a key of
// MaxKeyLength characters (more bytes), a ttl of MinTTL and of MaxTTL.
func TestSQLFunctionsTakeWhatTheGoAPITakes(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dbURL := pglocktest.PostgresURL(t)
	app := pglocktest.Pool(t, newRole(t, dbURL, appGrants...), 2)
	key := strings.Repeat("é", pglock.MaxKeyLength)
	maxTTL := int64(pglock.MaxTTL / time.Millisecond)
	var token int64
	require.NoError(t, app.QueryRow(ctx, "SELECT pglock.lock_acquire($1, 'o', $2)", key, maxTTL).Scan(&token))
	require.Positive(t, token)
	rows, err := app.Query(ctx, "SELECT * FROM pglock.lock_renew_many($1::text[], $2::text[], $3)",
		[]string{key}, []string{"o"}, maxTTL)
	require.NoError(t, err)
	renewed, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{key}, renewed)
	var ok bool
	require.NoError(t, app.QueryRow(ctx, "SELECT pglock.lock_held($1, $2)", key, token).Scan(&ok))
	require.True(t, ok)
	require.NoError(t, app.QueryRow(ctx, "SELECT pglock.lock_renew($1, 'o', 1)", key).Scan(&ok))
	require.True(t, ok)
}

// TestSQLRenewManyOverOverlappingKeysNeverDeadlocks: two lock_renew_many calls over the
// same keys, in opposite orders, again and again at once. Each locks the rows in key
// order, so neither ever waits for a row while holding one the other waits for (40P01).
func TestSQLRenewManyOverOverlappingKeysNeverDeadlocks(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pglocktest.Postgres(t)
	var keys, owners []string
	for i := range 40 {
		key := fmt.Sprintf("renew-many/%02d", i)
		var token int64
		require.NoError(t, pool.QueryRow(ctx, "SELECT pglock.lock_acquire($1, 'o', 60000)", key).Scan(&token))
		keys, owners = append(keys, key), append(owners, "o")
	}
	reversed := make([]string, len(keys))
	for i, k := range keys {
		reversed[len(keys)-1-i] = k
	}
	// A deadlock is found after deadlock_timeout (1 s): give each round the chance.
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for g, order := range [][]string{keys, reversed} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pool.Acquire(ctx)
			if err != nil {
				errs[g] = err
				return
			}
			defer conn.Release()
			for end := time.Now().Add(2 * time.Second); time.Now().Before(end); {
				rows, err := conn.Query(ctx, "SELECT * FROM pglock.lock_renew_many($1::text[], $2::text[], 60000)", order, owners)
				if err == nil {
					var renewed []string
					renewed, err = pgx.CollectRows(rows, pgx.RowTo[string])
					if err == nil && len(renewed) != len(keys) {
						err = fmt.Errorf("renewed %d of %d", len(renewed), len(keys))
					}
				}
				if err != nil {
					errs[g] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
}

// TestSQLJobRunRecordPrunesInBoundedBatches: a job whose history past retention is long
// (a retention shortened, runs recorded while nothing pruned) is pruned a bounded batch
// at a time, the oldest first, by the runs recorded after it, not all in one run's
// statement.
func TestSQLJobRunRecordPrunesInBoundedBatches(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pglocktest.Postgres(t)
	const old = 1000
	// Runs that ended an hour ago, recorded with a day's retention: none pruned.
	_, err := pool.Exec(ctx, `SELECT pglock.job_run_record('export', 'i', 'o', 1, 3600000000, 0, 'ok', NULL, 86400000)
		FROM generate_series(1, $1)`, old)
	require.NoError(t, err)
	count := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pglock.job_runs WHERE job = 'export'").Scan(&n))
		return n
	}
	require.Equal(t, old, count())

	// Then a minute's retention: the runs of the next 16 prune once.
	for range 16 {
		_, err := pool.Exec(ctx, "SELECT pglock.job_run_record('export', 'i', 'o', 1, 0, 0, 'ok', NULL, 60000)")
		require.NoError(t, err)
	}
	pruned := old + 16 - count()
	require.Positive(t, pruned, "the 16th run prunes")
	require.LessOrEqual(t, pruned, 64, "one run prunes a bounded batch")
	var newest int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pglock.job_runs
		WHERE job = 'export' AND ended_at > clock_timestamp() - interval '1 minute'`).Scan(&newest))
	require.Equal(t, 16, newest, "the runs within retention stay")

	// Runs keep coming: the old history goes, a batch at a time. (The runs within
	// retention stay, so the loop ends on the stale ones.)
	stale := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pglock.job_runs
			WHERE job = 'export' AND ended_at < clock_timestamp() - interval '1 minute'`).Scan(&n))
		return n
	}
	for i := 0; stale() > 0 && i < 2*old; i++ {
		_, err := pool.Exec(ctx, "SELECT pglock.job_run_record('export', 'i', 'o', 1, 0, 0, 'ok', NULL, 60000)")
		require.NoError(t, err)
	}
	require.Zero(t, stale(), "the history past retention is pruned in the end")
}
