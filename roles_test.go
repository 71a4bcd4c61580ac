package pglock_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io/fs"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
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
	pglocktest.TestStore(t, func(*testing.T) pglock.Store { return pglock.NewPostgresStore(app) }, pglocktest.ContractOptions{
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
		first := newPoolClient(t, app, pglock.TTL(time.Second))
		second := newPoolClient(t, app, pglock.TTL(time.Second))
		_, err := first.Elect("role:leader", f.leader(0))
		require.NoError(t, err)
		a := next(t, f.acquired, "leader")
		require.Equal(t, 0, a.who)
		_, err = second.Elect("role:leader", f.leader(1))
		require.NoError(t, err)
		require.NoError(t, first.Close(ctx))
		b := next(t, f.acquired, "new leader")
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
		_, ok, err := pglock.NewPostgresStore(app).Acquire(ctx, "role:fence", "intruder", time.Minute)
		require.NoError(t, err)
		require.False(t, ok, "the expired lock stays with the open fenced transaction")
		require.NoError(t, tx.Commit(ctx))
		written, err = fencedWrite(ctx, app, "role:fence", l.Token(), 10)
		require.NoError(t, err)
		require.Zero(t, written, "expired: FenceHeld writes nothing")
	})

	t.Run("Prune", func(t *testing.T) {
		store := pglock.NewPostgresStore(app)
		_, ok, err := store.Acquire(ctx, "role:prune", "o", time.Minute)
		require.NoError(t, err)
		require.True(t, ok)
		released, err := store.Release(ctx, "role:prune", "o")
		require.NoError(t, err)
		require.True(t, released)
		c := newPoolClient(t, app)
		deleted, err := c.Prune(ctx, 0)
		require.NoError(t, err)
		require.Positive(t, deleted)
	})
}

func TestRoleWithReadmeGrantsCannotWriteTheLocksOrTheSequence(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, app := appRoleDB(t)
	token, ok, err := pglock.NewPostgresStore(app).Acquire(ctx, "role:victim", "holder", time.Minute)
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
	} {
		_, err := app.Exec(ctx, q)
		requireSQLState(t, err, "42501") // insufficient_privilege
	}
	h, err := pglock.NewPostgresStore(app).(pglock.HolderReader).Holder(ctx, "role:victim")
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
			_, _, err := store.Acquire(ctx, "role:k", "o", time.Minute)
			requireSQLState(t, err, "42501")
			require.ErrorContains(t, err, "GRANT USAGE ON SCHEMA pglock and EXECUTE ON ALL FUNCTIONS IN SCHEMA pglock")
			_, err = store.Renew(ctx, "role:k", "o", time.Minute)
			requireSQLState(t, err, "42501")
			_, err = store.Release(ctx, "role:k", "o")
			requireSQLState(t, err, "42501")
			_, err = store.(pglock.HolderReader).Holder(ctx, "role:k")
			requireSQLState(t, err, "42501")
			_, err = store.(pglock.BatchRenewer).RenewMany(ctx, []string{"role:k"}, []string{"o"}, time.Minute)
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
		`GRANT USAGE, UPDATE ON SEQUENCE pglock.fencing_token_seq TO %s`)
	app := pglocktest.Pool(t, appURL, 2)
	store := pglock.NewPostgresStore(app)
	_, ok, err := store.Acquire(ctx, "role:before", "o", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	_, err = admin.Exec(ctx, string(up))
	require.NoError(t, err)
	released, err := store.Release(ctx, "role:before", "o")
	require.NoError(t, err)
	require.True(t, released)
	_, ok, err = store.Acquire(ctx, "role:before", "o", time.Minute)
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
