package pglock_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/store/storetest"
	"github.com/pgfence/pglock/pglocktest"
)

// The application's role, granted only what README.md's "Privileges" lists: the
// functions run as their owner (000006), so it can use every part of pglock and write
// neither pglock.locks nor the token sequence.

// appGrants are README.md's GRANTs for an application role, %s being the role.
var appGrants = []string{
	`GRANT USAGE ON SCHEMA pglock TO %s`,
	`GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pglock TO %s`,
}

// newRole creates a LOGIN role with a unique name on the server of dbURL, runs grants
// (fmt verbs %s for the role) in dbURL's database, and returns a URL of that database
// as the role. The role is dropped when the test ends, after the pools opened later.
func newRole(t *testing.T, dbURL string, grants ...string) string {
	t.Helper()
	ctx := t.Context()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "pglock_app_" + hex.EncodeToString(b)
	password := hex.EncodeToString(b) + "pw"
	admin, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer admin.Close(context.WithoutCancel(ctx))
	_, err = admin.Exec(ctx, "CREATE ROLE "+name+" LOGIN PASSWORD '"+password+"'")
	require.NoError(t, err)
	t.Cleanup(func() {
		// Roles are cluster-wide: drop what the role holds in this database, then the role.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		admin, err := pgx.Connect(ctx, dbURL)
		require.NoError(t, err)
		defer admin.Close(ctx)
		_, err = admin.Exec(ctx, "DROP OWNED BY "+name)
		require.NoError(t, err)
		_, err = admin.Exec(ctx, "DROP ROLE "+name)
		require.NoError(t, err)
	})
	for _, g := range grants {
		_, err = admin.Exec(ctx, fmtRole(g, name))
		require.NoError(t, err)
	}
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	u.User = url.UserPassword(name, password)
	return u.String()
}

func fmtRole(stmt, role string) string { return strings.ReplaceAll(stmt, "%s", role) }

// requireSQLState asserts that err is a server error with SQLSTATE code.
func requireSQLState(t *testing.T, err error, code string) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "want SQLSTATE %s, got %v", code, err)
	require.Equal(t, code, pgErr.Code, pgErr.Message)
}

// appRoleDB returns a pool as the admin and one as an application role with only
// appGrants, on a fresh database with a stock table the application may update.
func appRoleDB(t *testing.T) (admin, app *pgxpool.Pool) {
	t.Helper()
	dbURL := pglocktest.PostgresURL(t)
	admin = pglocktest.Pool(t, dbURL, 4)
	_, err := admin.Exec(t.Context(), `CREATE TABLE stock (id int PRIMARY KEY, n int NOT NULL, token bigint NOT NULL DEFAULT 0);
		INSERT INTO stock VALUES (1, 0, 0)`)
	require.NoError(t, err)
	appURL := newRole(t, dbURL, append(appGrants, `GRANT SELECT, UPDATE ON stock TO %s`)...)
	return admin, pglocktest.Pool(t, appURL, 20)
}

func TestRoleWithReadmeGrantsPassesTheStoreContract(t *testing.T) {
	t.Parallel()
	admin, app := appRoleDB(t)
	testStore(t, func(*testing.T) *pglock.Store { return pglock.NewPostgresStore(app) }, storetest.Options{
		Concurrent: true,
		RewindTokens: func(t testing.TB) { // the application itself may not
			_, err := admin.Exec(t.Context(), "ALTER SEQUENCE pglock.fencing_token_seq RESTART")
			require.NoError(t, err)
		},
	})
}

func TestRoleWithReadmeGrantsRunsJobsElectionsPrunesAndFences(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	admin, app := appRoleDB(t)

	t.Run("a job", func(t *testing.T) {
		c := newPoolClient(t, app)
		ran := make(chan int64, 1)
		job, err := c.Job("role:job", func(ctx context.Context) error {
			l, _ := pglock.FromContext(ctx)
			ran <- l.Token()
			return nil
		}, pglock.OnOneInstance())
		require.NoError(t, err)
		require.NoError(t, job.Run(ctx))
		require.Positive(t, <-ran)
	})

	t.Run("an election hands over", func(t *testing.T) {
		f := newFeed(t, 2)
		// The first must lead in one term until its Close, not lose its lease to a renewal
		// answered late on a loaded machine: a ttl of 5 s. The hand-over at Close does
		// not wait for it.
		first := newPoolClient(t, app, pglock.TTL(5*time.Second))
		second := newPoolClient(t, app, pglock.TTL(5*time.Second))
		_, err := first.Elect("role:leader", f.leader(0))
		require.NoError(t, err)
		a := receive(t, f.acquired, "leader")
		require.Equal(t, 0, a.who)
		_, err = second.Elect("role:leader", f.leader(1))
		require.NoError(t, err)
		require.NoError(t, first.Close(ctx))
		b := receive(t, f.acquired, "new leader")
		require.Equal(t, 1, b.who)
		require.Greater(t, b.lock.Token(), a.lock.Token())
	})

	t.Run("FenceUpdate and FenceHeld", func(t *testing.T) {
		c := newPoolClient(t, app)
		l, err := c.TryAcquire(ctx, "role:fence", pglock.TTL(time.Minute))
		require.NoError(t, err)
		n, err := pglock.ExecFenced(ctx, app, "UPDATE stock SET n = $1 WHERE id = 1", "token", l.Token(), 7)
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		n, err = pglock.ExecFenced(ctx, app, "UPDATE stock SET n = $1 WHERE id = 1", "token", l.Token()-1, 8)
		require.NoError(t, err)
		require.Zero(t, n, "a stale token writes nothing")

		// lock_held's row lock, taken as the functions' owner, holds for the
		// application's transaction: no takeover while it is open.
		tx, err := app.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		written, err := fencedWrite(ctx, tx, "role:fence", l.Token(), 9)
		require.NoError(t, err)
		require.EqualValues(t, 1, written)
		_, err = admin.Exec(ctx, "UPDATE pglock.locks SET expires_at = clock_timestamp() WHERE key = 'role:fence'")
		require.NoError(t, err, "a renewal-like UPDATE does not wait for FOR KEY SHARE")
		_, ok, err := pglock.InternalStore(pglock.NewPostgresStore(app)).Acquire(ctx, "role:fence", "intruder", time.Minute)
		require.NoError(t, err)
		require.False(t, ok, "the expired lock stays with the open fenced transaction")
		require.NoError(t, tx.Commit(ctx))
		written, err = fencedWrite(ctx, app, "role:fence", l.Token(), 10)
		require.NoError(t, err)
		require.Zero(t, written, "expired: FenceHeld writes nothing")
	})

	t.Run("run history", func(t *testing.T) {
		c := newPoolClient(t, app, pglock.WithInstanceName("role-app"))
		job, err := c.Job("role:history", func(context.Context) error { return nil }, pglock.OnOneInstance())
		require.NoError(t, err)
		require.NoError(t, job.Run(ctx))
		other := newPoolClient(t, app)
		skipped, err := other.Job("role:history", func(context.Context) error { return nil }, pglock.OnOneInstance())
		require.NoError(t, err)
		require.NoError(t, skipped.Run(ctx))
		require.NoError(t, other.Close(ctx))
		require.NoError(t, c.Close(ctx))
		runs, err := c.JobRuns(ctx, "role:history", 10)
		require.NoError(t, err)
		require.Len(t, runs, 1)
		require.Equal(t, "role-app", runs[0].Instance)
		jobs, err := c.JobStatuses(ctx)
		require.NoError(t, err)
		i := slices.IndexFunc(jobs, func(s pglock.JobStatus) bool { return s.Job == "role:history" })
		require.GreaterOrEqual(t, i, 0)
		require.Equal(t, pglock.OutcomeOK, jobs[i].LastRun.Outcome)
		require.Len(t, jobs[i].Skips, 1)
		require.Len(t, jobs[i].Registrations, 2, "the registry, written at Close at the latest")
		elections, err := c.Elections(ctx)
		require.NoError(t, err)
		require.True(t, slices.ContainsFunc(elections, func(l pglock.LockInfo) bool { return l.Key == "role:leader" }))
	})

	t.Run("Prune", func(t *testing.T) {
		store := pglock.NewPostgresStore(app)
		_, ok, err := pglock.InternalStore(store).Acquire(ctx, "role:prune", "o", time.Minute)
		require.NoError(t, err)
		require.True(t, ok)
		released, err := pglock.InternalStore(store).Release(ctx, "role:prune", "o")
		require.NoError(t, err)
		require.True(t, released)
		c := newPoolClient(t, app)
		deleted, err := c.Prune(ctx, 0)
		require.NoError(t, err)
		require.Positive(t, deleted)
	})

	t.Run("Locks and ForceRelease", func(t *testing.T) {
		c := newPoolClient(t, app)
		l, err := c.TryAcquire(ctx, "role:inspect")
		require.NoError(t, err)
		locks, err := c.Locks(ctx, "role:inspect")
		require.NoError(t, err)
		require.Len(t, locks, 1)
		require.Equal(t, l.Owner(), locks[0].Owner)
		broken, err := c.ForceRelease(ctx, "role:inspect")
		require.NoError(t, err)
		require.Equal(t, l.Token(), broken.Token)
	})
}

func TestRoleWithReadmeGrantsCannotWriteTheLocksOrTheSequence(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, app := appRoleDB(t)
	token, ok, err := pglock.InternalStore(pglock.NewPostgresStore(app)).Acquire(ctx, "role:victim", "holder", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	for _, q := range []string{
		"UPDATE pglock.locks SET owner = 'forger', fencing_token = 1 WHERE key = 'role:victim'",
		"INSERT INTO pglock.locks (key, owner, fencing_token, expires_at) VALUES ('role:forged', 'forger', 1, 'infinity')",
		"DELETE FROM pglock.locks",
		"SELECT setval('pglock.fencing_token_seq', 1)",
		"SELECT nextval('pglock.fencing_token_seq')",
		"SELECT * FROM pglock.locks",
		"ALTER SEQUENCE pglock.fencing_token_seq RESTART",
		"SELECT * FROM pglock.schema_migrations",
		"SELECT * FROM pglock.job_runs",
		"INSERT INTO pglock.job_runs (job, instance, owner, fencing_token, started_at, ended_at, outcome) VALUES ('j', 'i', 'o', 1, now(), now(), 'ok')",
		"DELETE FROM pglock.job_runs",
		"UPDATE pglock.job_skips SET count = 0",
	} {
		_, err := app.Exec(ctx, q)
		requireSQLState(t, err, "42501") // insufficient_privilege
	}
	h, err := storeHolder(ctx, pglock.NewPostgresStore(app), "role:victim")
	require.NoError(t, err)
	require.Equal(t, "holder", h.Owner)
	require.Equal(t, token, h.Token)
}

func TestRoleWithoutGrantsGetsAnErrorThatSaysWhatToGrant(t *testing.T) {
	t.Parallel()
	dbURL := pglocktest.PostgresURL(t)
	for _, tc := range []struct {
		name   string
		grants []string
	}{
		{"no grant at all", nil},
		{"USAGE without EXECUTE", appGrants[:1]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			pool := pglocktest.Pool(t, newRole(t, dbURL, tc.grants...), 2)
			store := pglock.NewPostgresStore(pool)
			_, _, err := pglock.InternalStore(store).Acquire(ctx, "role:k", "o", time.Minute)
			requireSQLState(t, err, "42501")
			require.ErrorContains(t, err, "GRANT USAGE ON SCHEMA pglock and EXECUTE ON ALL FUNCTIONS IN SCHEMA pglock")
			_, err = pglock.InternalStore(store).Renew(ctx, "role:k", "o", time.Minute)
			requireSQLState(t, err, "42501")
			_, err = pglock.InternalStore(store).Release(ctx, "role:k", "o")
			requireSQLState(t, err, "42501")
			_, err = storeHolder(ctx, store, "role:k")
			requireSQLState(t, err, "42501")
			_, err = storeRenewMany(ctx, store, []string{"role:k"}, []string{"o"}, time.Minute)
			requireSQLState(t, err, "42501")
			c := newClient(t, store, quiet, pglock.WithoutListener())
			_, err = c.Locks(ctx, "")
			requireSQLState(t, err, "42501")
			require.ErrorContains(t, err, "GRANT USAGE ON SCHEMA pglock and EXECUTE ON ALL FUNCTIONS IN SCHEMA pglock")
			_, err = c.ForceRelease(ctx, "role:k")
			requireSQLState(t, err, "42501")
			// What FenceHeld adds to the application's own statement: the server's error.
			_, err = pool.Exec(ctx, "SELECT pglock.lock_held('role:k', 1)")
			requireSQLState(t, err, "42501")
		})
	}
}

// Before 000006 an application role was granted the table and the sequence; 000006
// grants such a role USAGE and EXECUTE, so that an upgrade does not lock it out.
func TestRoleGrantedTheTableBefore000006KeepsWorkingAfterIt(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dbURL := pglocktest.PostgresURL(t)
	admin := pglocktest.Pool(t, dbURL, 2)
	down, err := fs.ReadFile(pglock.Migrations(), "000006_security_definer.down.sql")
	require.NoError(t, err)
	up, err := fs.ReadFile(pglock.Migrations(), "000006_security_definer.up.sql")
	require.NoError(t, err)
	_, err = admin.Exec(ctx, string(down))
	require.NoError(t, err)
	appURL := newRole(t, dbURL,
		`GRANT USAGE ON SCHEMA pglock TO %s`,
		`GRANT SELECT, INSERT, UPDATE ON pglock.locks TO %s`,
		`GRANT USAGE, UPDATE ON SEQUENCE pglock.fencing_token_seq TO %s`,
		// lock_acquire reads the fair queue since 000014, which this test's schema keeps
		// while it takes 000006 back.
		`GRANT SELECT ON pglock.waiters TO %s`)
	app := pglocktest.Pool(t, appURL, 2)
	store := pglock.NewPostgresStore(app)
	_, ok, err := pglock.InternalStore(store).Acquire(ctx, "role:before", "o", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	_, err = admin.Exec(ctx, string(up))
	require.NoError(t, err)
	released, err := pglock.InternalStore(store).Release(ctx, "role:before", "o")
	require.NoError(t, err)
	require.True(t, released)
	_, ok, err = pglock.InternalStore(store).Acquire(ctx, "role:before", "o", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
}

// The role of these tests is granted exactly what README.md lists.
func TestRoleGrantsAreTheReadmes(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	for _, g := range appGrants {
		require.Contains(t, string(readme), "\n"+fmtRole(g, "app")+";\n")
	}
}

// internalHelpers are the functions that only pglock's own functions call, with no
// argument check of their own: they run as their caller (000022).
var internalHelpers = []string{
	"pglock.fencing_token_next()",
	"pglock.lock_take(text,text,bigint)",
	"pglock.queue_grant(text)",
	"pglock.sem_grant(text,text)",
	"pglock.sem_live(text)",
	"pglock.sem_lock(text,integer)",
	"pglock.sem_take(text,text,bigint,integer)",
	"pglock.sem_waiting(text,bigint)",
	"pglock.lock_release_key(text,text)",
	"pglock.lock_release_slow(text,text)",
	"pglock.sem_release_permits(text,text[],text[])",
	"pglock.lock_refuse(text,text,text,text)",
	"pglock.job_slot_due(text)",
}

// inlinedHelpers are the helpers the planner inlines into their callers' expressions
// (000027): LANGUAGE sql, run as their caller, with no SET clause (one would stop the
// inlining) and every name in them schema-qualified instead.
var inlinedHelpers = []string{
	"pglock.lock_key_ok(text)",
	"pglock.lock_owner_ok(text)",
	"pglock.lock_row_key_ok(text)",
	"pglock.sem_key_ok(text)",
	"pglock.fencing_timeline()",
	"pglock.lock_ttl_ok(bigint)",
	"pglock.job_slot_key(text,bigint)",
}

// TestEveryFunctionRunsAsItsOwnerWithItsSearchPathPinned: every function of the schema,
// whichever migration added it, follows 000006: SECURITY DEFINER, search_path pinned to
// pg_catalog then pg_temp, no EXECUTE for PUBLIC; but the internal helpers, which run as
// their caller (SECURITY INVOKER), so as the owner when pglock's functions call them,
// and the inlined helpers, which have no SET clause and are LANGUAGE sql.
func TestEveryFunctionRunsAsItsOwnerWithItsSearchPathPinned(t *testing.T) {
	t.Parallel()
	admin := pglocktest.Pool(t, pglocktest.PostgresURL(t), 2)
	rows, err := admin.Query(t.Context(), `SELECT p.oid::regprocedure::text, p.prosecdef, coalesce(p.proconfig, '{}'),
			has_function_privilege('public', p.oid, 'EXECUTE'), l.lanname
		FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
		WHERE p.pronamespace = 'pglock'::regnamespace ORDER BY 1`)
	require.NoError(t, err)
	defer rows.Close()
	n := 0
	for rows.Next() {
		var name, language string
		var definer, public bool
		var config []string
		require.NoError(t, rows.Scan(&name, &definer, &config, &public, &language))
		signature := strings.ReplaceAll(name, ", ", ",")
		require.False(t, public, "PUBLIC may execute %s", name)
		n++
		if slices.Contains(inlinedHelpers, signature) {
			require.False(t, definer, "%s: SECURITY DEFINER", name)
			require.Empty(t, config, "%s: a SET clause stops its inlining", name)
			require.Equal(t, "sql", language, name)
			continue
		}
		require.Equal(t, !slices.Contains(internalHelpers, signature), definer, "%s: SECURITY DEFINER", name)
		want := []string{"search_path=pg_catalog, pg_temp"}
		if strings.HasPrefix(name, "pglock.lock_renew_many(") || strings.HasPrefix(name, "pglock.sem_want(") {
			// their lock order is their plan's (000011, 000013)
			want = append(want, "enable_hashjoin=off", "enable_mergejoin=off")
		}
		require.Equal(t, want, config, name)
	}
	require.NoError(t, rows.Err())
	require.GreaterOrEqual(t, n, 16, "the schema's functions")
}

// TestAnApplicationRoleCannotCallTheInternalHelpers: a role with README's grants that
// calls a helper directly (lock_take, which checks no argument, with a key far past the
// limit) gets insufficient_privilege and writes nothing; through lock_acquire, which
// calls lock_take as the owner, the same role takes a key.
func TestAnApplicationRoleCannotCallTheInternalHelpers(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dbURL := pglocktest.PostgresURL(t)
	admin := pglocktest.Pool(t, dbURL, 2)
	app := pglocktest.Pool(t, newRole(t, dbURL, appGrants...), 2)
	long := strings.Repeat("k", 100000)
	for _, q := range []string{
		"SELECT pglock.lock_take('" + long + "', 'o', 1000)",
		"SELECT pglock.fencing_token_next()",
		"SELECT pglock.queue_grant('k')",
		"SELECT * FROM pglock.sem_take('s', 'o', 1000, 2)",
		"SELECT pglock.sem_grant('s', 's' || chr(31) || '1')",
		"SELECT pglock.sem_lock('s', 2)",
		"SELECT pglock.sem_live('s')",
		"SELECT pglock.sem_waiting('s', 1)",
		"SELECT pglock.lock_release_key('k', 'o')",
		"SELECT * FROM pglock.sem_release_permits('s', ARRAY[NULL::text], ARRAY['o'])",
	} {
		_, err := app.Exec(ctx, q)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "%.60s: want insufficient_privilege, got %v", q, err)
		require.Equal(t, "42501", pgErr.Code, "%.60s: %s", q, pgErr.Message)
	}
	var rows, semaphores int
	require.NoError(t, admin.QueryRow(ctx, "SELECT (SELECT count(*) FROM pglock.locks), (SELECT count(*) FROM pglock.semaphores)").
		Scan(&rows, &semaphores))
	require.Zero(t, rows+semaphores, "a refused helper wrote")
	var token int64
	require.NoError(t, app.QueryRow(ctx, "SELECT pglock.lock_acquire('k', 'o', 1000)").Scan(&token))
	require.Positive(t, token)
}

// TestRoleGrantedBeforeAnUpgradeMayCallWhatItAdds: a role granted README's privileges on
// the schema of 000006 (EXECUTE on every function there was) may execute every function
// that the later migrations add: each grants its new functions to the roles that may
// call lock_acquire, so that an upgrade locks no application out.
func TestRoleGrantedBeforeAnUpgradeMayCallWhatItAdds(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dbURL := pglocktest.PostgresURL(t)
	admin := pglocktest.Pool(t, dbURL, 2)
	later := laterMigrations(t, 6)
	for i := len(later) - 1; i >= 0; i-- {
		_, err := admin.Exec(ctx, later[i].down)
		require.NoError(t, err, later[i].name)
	}
	role := newRole(t, dbURL, appGrants...)
	for _, m := range later {
		_, err := admin.Exec(ctx, m.up)
		require.NoError(t, err, m.name)
	}
	u, err := url.Parse(role)
	require.NoError(t, err)
	rows, err := admin.Query(ctx, `SELECT p.oid::regprocedure::text FROM pg_proc p
		WHERE p.pronamespace = 'pglock'::regnamespace AND NOT has_function_privilege($1, p.oid, 'EXECUTE')`,
		u.User.Username())
	require.NoError(t, err)
	missing, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Empty(t, missing, "functions the role may not execute after the upgrade")

	app := newPoolClient(t, pglocktest.Pool(t, role, 2), pglock.WithoutListener())
	l, err := app.TryAcquire(ctx, t.Name())
	require.NoError(t, err)
	locks, err := app.Locks(ctx, t.Name())
	require.NoError(t, err)
	require.Len(t, locks, 1)
	require.NoError(t, l.Release(ctx))
}

type migrationFiles struct{ name, up, down string }

// laterMigrations returns the migrations after version after, in order.
func laterMigrations(t *testing.T, after int) []migrationFiles {
	t.Helper()
	ups, err := fs.Glob(pglock.Migrations(), "*.up.sql")
	require.NoError(t, err)
	var out []migrationFiles
	for _, up := range ups {
		var version int
		_, err := fmt.Sscanf(up, "%06d_", &version)
		require.NoError(t, err, up)
		if version <= after {
			continue
		}
		name := strings.TrimSuffix(up, ".up.sql")
		upSQL, err := fs.ReadFile(pglock.Migrations(), up)
		require.NoError(t, err)
		downSQL, err := fs.ReadFile(pglock.Migrations(), name+".down.sql")
		require.NoError(t, err)
		out = append(out, migrationFiles{name: name, up: string(upSQL), down: string(downSQL)})
	}
	require.NotEmpty(t, out)
	return out
}
