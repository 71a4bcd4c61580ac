package pglock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/pglocktest"
)

// gonePast is how far back a dead instance's registration is moved on the database:
// past the 6 minutes a registration stays live without a refresh (due every 5).
const gonePast = "6 minutes 1 second"

// registrationStates returns the state of each instance's registration of job, as
// JobStatuses lists them.
func registrationStates(t *testing.T, c *pglock.Client, job string) map[string]pglock.RegistrationState {
	t.Helper()
	jobs, err := c.JobStatuses(t.Context())
	require.NoError(t, err)
	out := map[string]pglock.RegistrationState{}
	for _, j := range jobs {
		if j.Job == job {
			for _, r := range j.Registrations {
				out[r.Instance] = r.State
			}
		}
	}
	return out
}

// The registrations tell an instance that is there from one that left and one that
// died: a client that is open is live; one that was closed is closed, at once; one whose
// process died (its link cut: it writes nothing more, not even at Close) is gone once
// it has not been seen for longer than the refresh period, which the test moves its
// registration back by, on the database, rather than wait 6 minutes.
func TestRegistrationsTellLiveClosedAndGoneInstances(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dbURL := pglocktest.PostgresURL(t)
	admin := pglocktest.Pool(t, dbURL, 4)
	const job = "inventory:stock-reconciliation"
	register := func(c *pglock.Client) {
		t.Helper()
		_, err := c.Job(job, func(context.Context) error { return nil }, pglock.OnOneInstance())
		require.NoError(t, err)
	}
	live := historyClient(t, admin, "live")
	register(live)
	closed := historyClient(t, admin, "closed")
	register(closed)
	cut, proxy := proxiedPool(t, dbURL, 2)
	died := historyClient(t, cut, "died")
	register(died)
	awaitJobs(t, live, 3)
	require.Equal(t, map[string]pglock.RegistrationState{"live": pglock.RegistrationLive, "closed": pglock.RegistrationLive,
		"died": pglock.RegistrationLive}, registrationStates(t, live, job))

	require.NoError(t, closed.Close(ctx))
	proxy.Blackhole() // died's process is gone: nothing of it reaches the database
	_, err := admin.Exec(ctx, `UPDATE pglock.registry SET seen_at = seen_at - interval '`+gonePast+`',
		registered_at = registered_at - interval '`+gonePast+`' WHERE instance = 'died'`)
	require.NoError(t, err)
	require.Equal(t, map[string]pglock.RegistrationState{"live": pglock.RegistrationLive, "closed": pglock.RegistrationClosed,
		"died": pglock.RegistrationGone}, registrationStates(t, live, job))

	// A Close that cannot reach the database leaves the instance gone, not closed.
	closeCtx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	require.Error(t, died.Close(closeCtx))
	require.Equal(t, pglock.RegistrationGone, registrationStates(t, live, job)["died"])
	proxy.Restore() // for the pool's Close

	// A restart under the closed instance's name registers again: live.
	register(historyClient(t, admin, "closed"))
	require.Eventually(t, func() bool { return registrationStates(t, live, job)["closed"] == pglock.RegistrationLive },
		10*time.Second, 10*time.Millisecond)
}

// An election's registration is marked closed when its instance resigns, and a job's
// when its client closes; the registry's rows say when (closed_at, seen_at).
func TestResignAndCloseMarkRegistrationsClosed(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pglocktest.Postgres(t)
	c := historyClient(t, pool, "a")
	e, err := c.Elect("billing:leader", pglock.LeaderCallbacks{OnAcquired: func(ctx context.Context, _ *pglock.Lock) error {
		<-ctx.Done()
		return nil
	}})
	require.NoError(t, err)
	_, err = c.Job("reports:nightly", func(context.Context) error { return nil }, pglock.WithoutOverlapping())
	require.NoError(t, err)
	awaitJobs(t, c, 1)
	awaitElections(t, c, 1)
	require.Equal(t, map[string]bool{"election billing:leader": false, "job reports:nightly": false}, closedRows(t, pool))

	require.NoError(t, e.Resign(ctx))
	require.Eventually(t, func() bool { return closedRows(t, pool)["election billing:leader"] }, 10*time.Second,
		10*time.Millisecond, "the resignation is written in the background")
	require.False(t, closedRows(t, pool)["job reports:nightly"])
	require.NoError(t, c.Close(ctx))
	require.Equal(t, map[string]bool{"election billing:leader": true, "job reports:nightly": true}, closedRows(t, pool),
		"Close writes it before it returns")
	var stamped bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT bool_and(closed_at = seen_at AND closed_at >= registered_at)
		FROM pglock.registry`).Scan(&stamped))
	require.True(t, stamped, "closed_at is when it left, which is when it was last seen")
}

// closedRows says, for each registration, whether it is closed.
func closedRows(t *testing.T, pool *pgxpool.Pool) map[string]bool {
	t.Helper()
	rows, err := pool.Query(t.Context(), `SELECT kind || ' ' || key, closed_at IS NOT NULL FROM pglock.registry`)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var k string
		var closed bool
		require.NoError(t, rows.Scan(&k, &closed))
		out[k] = closed
	}
	require.NoError(t, rows.Err())
	return out
}

// The memory store tells the states apart too, on its clock.
func TestRegistrationStatesOnTheMemoryStore(t *testing.T) {
	t.Parallel()
	clock := pglocktest.NewManualClock(time.Now())
	store := pglock.NewMemoryStore(clock)
	const job = "reports:nightly"
	register := func(c *pglock.Client) {
		t.Helper()
		_, err := c.Job(job, func(context.Context) error { return nil }, pglock.WithoutOverlapping())
		require.NoError(t, err)
	}
	died := newClient(t, store, pglock.WithClock(clock), pglock.WithInstanceName("died"))
	register(died)
	closed := newClient(t, store, pglock.WithClock(clock), pglock.WithInstanceName("closed"))
	register(closed)
	awaitJobs(t, died, 2)
	require.NoError(t, closed.Close(t.Context()))
	clock.Advance(6*time.Minute + time.Second) // died's process stopped: it refreshes nothing
	live := newClient(t, store, pglock.WithClock(clock), pglock.WithInstanceName("live"))
	register(live)
	awaitJobs(t, live, 3)
	require.Equal(t, map[string]pglock.RegistrationState{"live": pglock.RegistrationLive, "closed": pglock.RegistrationClosed,
		"died": pglock.RegistrationGone}, registrationStates(t, live, job))
}

// registry_touch, registry_close, registry_states and their check refuse bad input, as
// a role with README's grants calls them: invalid_parameter_value (22023), a message naming the
// argument, and nothing written. The limits themselves pass.
func TestRegistryFunctionsRefuseBadInput(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dbURL := pglocktest.PostgresURL(t)
	admin := pglocktest.Pool(t, dbURL, 2)
	app := pglocktest.Pool(t, newRole(t, dbURL, appGrants...), 2)
	_, err := app.Exec(ctx, `SELECT pglock.registry_touch('job', '{k}', 'a', true)`) // a row a bad call must not touch
	require.NoError(t, err)
	before := registrySnapshot(t, admin)

	long := strings.Repeat("é", 200) // characters, not bytes
	many := make([]string, 1001)
	for i := range many {
		many[i] = "k"
	}
	touch := `SELECT pglock.registry_touch($1, $2, $3, true)`
	closeQ := `SELECT pglock.registry_close($1, $2, $3)`
	for _, tc := range []struct {
		name, sql string
		args      []any
		want      string
	}{
		{"touch of an unknown kind", touch, []any{"lock", keys("k"), "a"}, `pglock.registry_touch: kind 'lock': want job or election`},
		{"touch by an instance of 201 characters", touch, []any{"job", keys("k"), long + "é"}, `pglock.registry_touch: instance of 201 characters: want 1 to 200`},
		{"touch of a key with U+001F", touch, []any{"job", keys("k\x1f1"), "a"}, `pglock.registry_touch: keys: want up to 1000 keys of 1 to 500 characters without U+001F, not 1 keys`},
		{"close of an unknown kind", closeQ, []any{"lock", keys("k"), "a"}, `pglock.registry_close: kind 'lock': want job or election`},
		{"close by an empty instance", closeQ, []any{"job", keys("k"), ""}, `pglock.registry_close: instance of 0 characters: want 1 to 200`},
		{"close by an instance of 201 characters", closeQ, []any{"job", keys("k"), long + "é"}, `pglock.registry_close: instance of 201 characters: want 1 to 200`},
		{"close of an empty key", closeQ, []any{"job", keys("k", ""), "a"}, `pglock.registry_close: keys: `},
		{"close of a null key", closeQ, []any{"job", []*string{nil}, "a"}, `pglock.registry_close: keys: `},
		{"close of a key of 501 characters", closeQ, []any{"job", keys(strings.Repeat("k", 501)), "a"}, `pglock.registry_close: keys: `},
		{"close of a key with U+001F", closeQ, []any{"election", keys("k\x1f1"), "a"}, `pglock.registry_close: keys: `},
		{"close of 1001 keys", closeQ, []any{"job", keys(many...), "a"}, `pglock.registry_close: keys: want up to 1000 keys of 1 to 500 characters without U+001F, not 1001 keys`},
		{"check for another function", `SELECT pglock.registry_check($1, 'job', '{k}', 'a')`, []any{"lock_acquire"}, `pglock.registry_check: fn 'lock_acquire': want registry_touch or registry_close`},
		{"check of a null kind", `SELECT pglock.registry_check('registry_close', $1, '{k}', 'a')`, []any{nil}, `pglock.registry_close: kind NULL: want job or election`},
		{"states of an unknown kind", `SELECT * FROM pglock.registry_states($1)`, []any{"lock"}, `pglock.registry_states: kind 'lock': want job or election`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := app.Exec(ctx, tc.sql, tc.args...)
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr)
			require.Equal(t, "22023", pgErr.Code, pgErr.Message)
			require.True(t, strings.HasPrefix(pgErr.Message, tc.want), "%q does not start with %q", pgErr.Message, tc.want)
			require.Equal(t, before, registrySnapshot(t, admin), "nothing written")
		})
	}

	key := strings.Repeat("é", 500)
	for _, q := range []string{touch, closeQ} {
		var n int
		require.NoError(t, app.QueryRow(ctx, q, "job", keys(key), long).Scan(&n), q)
		require.Equal(t, 1, n, "%s: the limits pass", q)
	}
}

// registrySnapshot returns every registry row as text.
func registrySnapshot(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(t.Context(), `SELECT r::text FROM pglock.registry r ORDER BY kind, key, instance`)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}
