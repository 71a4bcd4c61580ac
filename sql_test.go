package pglock_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/schema"
	"github.com/pgfence/pglock/pglocktest"
)

// TestSQLMatchesTheMigrations: the schema that pglock.SQL() creates on a database
// without one is the schema the migrations build, object by object, as the catalogs
// tell it: functions, tables and their columns, constraints, indexes, triggers,
// sequences, privileges and golang-migrate's version. A difference fails the subtest
// named by the object.
func TestSQLMatchesTheMigrations(t *testing.T) {
	t.Parallel()
	migrated := pglocktest.PostgresURL(t)
	fromSQL := pglocktest.PostgresURL(t)
	conn := testConn(t, fromSQL)
	_, err := conn.Exec(t.Context(), "DROP SCHEMA pglock CASCADE")
	require.NoError(t, err)
	_, err = conn.Exec(t.Context(), pglock.SQL())
	require.NoError(t, err)
	requireSameCatalog(t, catalogOf(t, migrated), catalogOf(t, fromSQL), "pglock.SQL()")
}

// TestSQLFilesAreWhatGoGenerateWrites: sql/*.sql are the files the generator renders from
// a database the current migrations built, byte for byte, and no other: nobody edited
// them by hand or forgot to run go generate.
func TestSQLFilesAreWhatGoGenerateWrites(t *testing.T) {
	t.Parallel()
	files, err := schema.Generate(t.Context(), testConn(t, pglocktest.PostgresURL(t)))
	require.NoError(t, err)
	inTree, err := filepath.Glob("sql/*.sql")
	require.NoError(t, err)
	for i := range inTree {
		inTree[i] = filepath.Base(inTree[i])
	}
	require.Equal(t, slices.Sorted(maps.Keys(files)), inTree, "sql/: run go generate")
	for _, name := range inTree {
		got, err := os.ReadFile(filepath.Join("sql", name))
		require.NoError(t, err)
		requireSameText(t, string(files[name]), string(got), "sql/"+name+" is not what go generate writes: run go generate, never edit it")
	}
}

// TestSQLInAnEmptySchemaLeavesMigrateNothingToDo: in a schema pglock created empty (as a
// DBA may, to choose its owner), SQL creates the schema at the latest version, not
// dirty; Migrate then replaces no function, and locks work.
func TestSQLInAnEmptySchemaLeavesMigrateNothingToDo(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := pglocktest.PostgresURL(t)
	conn := testConn(t, url)
	_, err := conn.Exec(ctx, "DROP SCHEMA pglock CASCADE; CREATE SCHEMA pglock")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, pglock.SQL())
	require.NoError(t, err)

	versions, err := schema.Versions(pglock.Migrations())
	require.NoError(t, err)
	var version int
	var dirty bool
	require.NoError(t, conn.QueryRow(ctx, "SELECT version, dirty FROM pglock.schema_migrations").Scan(&version, &dirty))
	require.Equal(t, versions[len(versions)-1], version)
	require.False(t, dirty)

	// A function that a migration creates or replaces gets a new row version (xmin).
	const functions = "SELECT array_agg(xmin::text ORDER BY oid) FROM pg_proc WHERE pronamespace = 'pglock'::regnamespace"
	var before, after []string
	require.NoError(t, conn.QueryRow(ctx, functions).Scan(&before))
	require.NoError(t, pglock.Migrate(ctx, url))
	require.NoError(t, conn.QueryRow(ctx, functions).Scan(&after))
	require.Equal(t, before, after, "Migrate replaced functions")

	var token int64
	require.NoError(t, conn.QueryRow(ctx, "SELECT pglock.lock_acquire('k', 'o', 1000)").Scan(&token))
	require.Positive(t, token)
}

// TestSQLRefusesADatabaseWithSchemaPglock: on a database with schema pglock, of any
// version, SQL raises duplicate_schema and changes nothing: an upgrade goes through
// Migrate.
func TestSQLRefusesADatabaseWithSchemaPglock(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, version string
		setup         func(t *testing.T, conn *pgx.Conn, url string)
	}{
		{"AtTheLatestVersion", "", func(*testing.T, *pgx.Conn, string) {}},
		{"AtAnOlderVersion", "", func(t *testing.T, _ *pgx.Conn, url string) {
			cfg, err := pgx.ParseConfig(url)
			require.NoError(t, err)
			db := stdlib.OpenDB(*cfg)
			t.Cleanup(func() { _ = db.Close() })
			require.NoError(t, newMigrate(t, db).Steps(-1))
		}},
		{"WithoutAVersion", "unknown", func(t *testing.T, conn *pgx.Conn, _ string) {
			_, err := conn.Exec(t.Context(), "DROP TABLE pglock.schema_migrations")
			require.NoError(t, err)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			url := pglocktest.PostgresURL(t)
			conn := testConn(t, url)
			c.setup(t, conn, url)
			version := c.version
			if version == "" {
				require.NoError(t, conn.QueryRow(t.Context(), "SELECT version::text FROM pglock.schema_migrations").Scan(&version))
			}
			before := catalogOf(t, url)
			_, err := conn.Exec(t.Context(), pglock.SQL())
			requireSQLState(t, err, "42P06") // duplicate_schema
			require.ErrorContains(t, err, "schema pglock exists already, at version "+version+": ")
			require.ErrorContains(t, err, "upgrade with pglock.Migrate")
			requireSameCatalog(t, before, catalogOf(t, url), "the database after SQL")
		})
	}
}

// TestMigrateUpgradesASchemaWithoutVersion: a schema that the sql/pglock.sql of an
// earlier pglock created has no pglock.schema_migrations; Migrate runs every migration
// over it again (each is idempotent) and leaves the schema the migrations build.
func TestMigrateUpgradesASchemaWithoutVersion(t *testing.T) {
	t.Parallel()
	url := pglocktest.PostgresURL(t)
	_, err := testConn(t, url).Exec(t.Context(), "DROP TABLE pglock.schema_migrations")
	require.NoError(t, err)
	require.NoError(t, pglock.Migrate(t.Context(), url))
	requireSameCatalog(t, catalogOf(t, pglocktest.PostgresURL(t)), catalogOf(t, url), "the schema migrated again")
}

// testConn returns a connection to url, closed when the test ends.
func testConn(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// requireSameCatalog fails a subtest named by each object that got lacks or describes
// otherwise than want.
func requireSameCatalog(t *testing.T, want, got map[string]string, gotName string) {
	t.Helper()
	keys := slices.Concat(slices.Collect(maps.Keys(want)), slices.Collect(maps.Keys(got)))
	slices.Sort(keys)
	keys = slices.Compact(keys)
	for _, key := range keys {
		t.Run(key, func(t *testing.T) {
			w, inWant := want[key]
			g, inGot := got[key]
			require.True(t, inWant, "%s has %s, the migrations do not", gotName, key)
			require.True(t, inGot, "%s lacks %s", gotName, key)
			requireSameText(t, w, g, key+": the migrations' (-) and "+gotName+"'s (+)")
		})
	}
}

// requireSameText fails with the lines of want that got lacks (-) and those it adds
// (+), numbered, by a longest common subsequence of lines.
func requireSameText(t *testing.T, want, got, msg string) {
	t.Helper()
	if want == got {
		return
	}
	a, b := strings.Split(want, "\n"), strings.Split(got, "\n")
	lcs := make([][]int, len(a)+1) // lcs[i][j]: the longest common subsequence of a[i:] and b[j:]
	for i := range lcs {
		lcs[i] = make([]int, len(b)+1)
	}
	for i := len(a) - 1; i >= 0; i-- {
		for j := len(b) - 1; j >= 0; j-- {
			if a[i] == b[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var diff strings.Builder
	for i, j := 0, 0; i < len(a) || j < len(b); {
		switch {
		case i < len(a) && j < len(b) && a[i] == b[j]:
			i, j = i+1, j+1
		case i < len(a) && (j == len(b) || lcs[i+1][j] >= lcs[i][j+1]):
			fmt.Fprintf(&diff, "\n-%d: %s", i+1, a[i])
			i++
		default:
			fmt.Fprintf(&diff, "\n+%d: %s", j+1, b[j])
			j++
		}
	}
	t.Fatalf("%s:%s", msg, diff.String())
}

// privileges is SQL for the privileges in acl (or PostgreSQL's default for objects of
// kind, an expression, when NULL) of the roles other than owner, PUBLIC included.
func privileges(acl, kind, owner string) string {
	return fmt.Sprintf(`(SELECT coalesce(string_agg(g, ', ' ORDER BY g COLLATE "C"), '') FROM (
		SELECT CASE a.grantee WHEN 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END || ' ' || a.privilege_type
			|| CASE WHEN a.is_grantable THEN ' with grant option' ELSE '' END AS g
		FROM aclexplode(coalesce(%s, acldefault((%s)::"char", %s))) a WHERE a.grantee <> %[3]s) p)`, acl, kind, owner)
}

// catalogQuery describes each object of schema pglock in one text, by a key that names
// it. It leaves out what differs between two databases built alike: oids, owners and
// grantors, dropped columns and column numbers, the names of PostgreSQL 18's NOT NULL
// constraints (the columns' NOT NULL says it), and a note some builds keep on every
// column (attoptions pg_attver).
var catalogQuery = `
SELECT 'schema pglock', concat_ws(E'\n',
    'privileges: ' || ` + privileges("n.nspacl", "'n'", "n.nspowner") + `,
    'comment: ' || coalesce(obj_description(n.oid, 'pg_namespace'), ''))
FROM pg_namespace n WHERE n.nspname = 'pglock'
UNION ALL
SELECT CASE c.relkind WHEN 'r' THEN 'table ' WHEN 'S' THEN 'sequence ' WHEN 'i' THEN 'index ' ELSE 'relation ' END
    || c.oid::regclass::text, concat_ws(E'\n',
    'kind: ' || c.relkind::text || ', persistence: ' || c.relpersistence::text,
    'options: ' || coalesce(array_to_string(ARRAY(SELECT o FROM unnest(c.reloptions) o ORDER BY o COLLATE "C"), ', '), ''),
    'row security: ' || c.relrowsecurity || ', forced: ' || c.relforcerowsecurity || ', replica identity: ' || c.relreplident::text,
    'privileges: ' || ` + privileges("c.relacl", "CASE c.relkind WHEN 'S' THEN 's' ELSE 'r' END", "c.relowner") + `,
    'comment: ' || coalesce(obj_description(c.oid, 'pg_class'), ''),
    CASE c.relkind WHEN 'i' THEN (SELECT pg_get_indexdef(i.indexrelid) || E'\nunique: ' || i.indisunique || ', primary: ' || i.indisprimary
        || ', immediate: ' || i.indimmediate || ', valid: ' || i.indisvalid || ', clustered: ' || i.indisclustered
        FROM pg_index i WHERE i.indexrelid = c.oid) END,
    CASE c.relkind WHEN 'S' THEN (SELECT 'type: ' || s.seqtypid::regtype::text || ', start: ' || s.seqstart || ', increment: '
        || s.seqincrement || ', min: ' || s.seqmin || ', max: ' || s.seqmax || ', cache: ' || s.seqcache || ', cycle: ' || s.seqcycle
        || ', owned by: ' || coalesce((SELECT string_agg(d.refobjid::regclass::text || '.' || quote_ident(a.attname) || ' (' || d.deptype::text || ')', ', ')
            FROM pg_depend d JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
            WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')), '')
        FROM pg_sequence s WHERE s.seqrelid = c.oid) END,
    CASE WHEN c.relkind IN ('v', 'm') THEN pg_get_viewdef(c.oid) END,
    (SELECT string_agg('column ' || quote_ident(a.attname) || ' ' || format_type(a.atttypid, a.atttypmod)
        || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
        || coalesce(' default ' || pg_get_expr(ad.adbin, ad.adrelid), '')
        || ', generated: ' || a.attgenerated::text || ', identity: ' || a.attidentity::text
        || ', collation: ' || CASE a.attcollation WHEN 0 THEN '-' ELSE a.attcollation::regcollation::text END
        || ', storage: ' || a.attstorage::text || ', compression: ' || coalesce(to_jsonb(a) ->> 'attcompression', '')
        || ', statistics: ' || coalesce(to_jsonb(a) ->> 'attstattarget', '-1')
        || ', options: ' || coalesce(array_to_string(ARRAY(SELECT o FROM unnest(a.attoptions) o WHERE o NOT LIKE 'pg\_attver=%' ORDER BY o COLLATE "C"), ', '), '')
        || ', privileges: ' || ` + privileges("a.attacl", "'c'", "c.relowner") + `
        || ', comment: ' || coalesce(col_description(c.oid, a.attnum), ''),
        E'\n' ORDER BY a.attnum)
     FROM pg_attribute a LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
     WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND c.relkind IN ('r', 'p', 'v', 'm', 'f')))
FROM pg_class c WHERE c.relnamespace = 'pglock'::regnamespace AND c.relkind <> 't'
UNION ALL
SELECT 'constraint ' || quote_ident(k.conname) || ' on ' || k.conrelid::regclass::text,
    pg_get_constraintdef(k.oid) || E'\ndeferrable: ' || k.condeferrable || ', deferred: ' || k.condeferred || ', validated: ' || k.convalidated
FROM pg_constraint k WHERE k.connamespace = 'pglock'::regnamespace AND k.contype <> 'n'
UNION ALL
SELECT 'trigger ' || quote_ident(t.tgname) || ' on ' || t.tgrelid::regclass::text,
    pg_get_triggerdef(t.oid) || E'\nenabled: ' || t.tgenabled::text
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
WHERE c.relnamespace = 'pglock'::regnamespace AND NOT t.tgisinternal
UNION ALL
SELECT 'function ' || p.oid::regprocedure::text, concat_ws(E'\n',
    CASE WHEN p.prokind <> 'a' THEN pg_get_functiondef(p.oid) END,
    'kind: ' || p.prokind::text || ', language: ' || l.lanname || ', returns set: ' || p.proretset,
    'security definer: ' || p.prosecdef || ', config: ' || coalesce(array_to_string(p.proconfig, '; '), ''),
    'volatility: ' || p.provolatile::text || ', strict: ' || p.proisstrict || ', leakproof: ' || p.proleakproof
        || ', parallel: ' || p.proparallel::text || ', cost: ' || p.procost || ', rows: ' || p.prorows,
    'privileges: ' || ` + privileges("p.proacl", "'f'", "p.proowner") + `,
    'comment: ' || coalesce(obj_description(p.oid, 'pg_proc'), ''))
FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang WHERE p.pronamespace = 'pglock'::regnamespace
UNION ALL
SELECT 'type ' || t.oid::regtype::text, 'type: ' || t.typtype::text || ', of relation: ' || coalesce(t.typrelid::regclass::text, '-')
FROM pg_type t WHERE t.typnamespace = 'pglock'::regnamespace
UNION ALL
SELECT 'policy ' || quote_ident(p.polname) || ' on ' || p.polrelid::regclass::text, coalesce(pg_get_expr(p.polqual, p.polrelid), '')
FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid WHERE c.relnamespace = 'pglock'::regnamespace
UNION ALL
SELECT 'rule ' || quote_ident(r.rulename) || ' on ' || r.ev_class::regclass::text, pg_get_ruledef(r.oid)
FROM pg_rewrite r JOIN pg_class c ON c.oid = r.ev_class WHERE c.relnamespace = 'pglock'::regnamespace
UNION ALL
SELECT 'rows of pglock.schema_migrations', coalesce(string_agg('version ' || m.version || ', dirty: ' || m.dirty, E'\n'), '')
FROM pglock.schema_migrations m`

// catalogOf returns catalogQuery's descriptions of the database at url.
func catalogOf(t *testing.T, url string) map[string]string {
	t.Helper()
	ctx := t.Context()
	conn := testConn(t, url)
	_, err := conn.Exec(ctx, "SET search_path = pg_catalog, pg_temp") // qualified names, as in the files
	require.NoError(t, err)
	query := catalogQuery
	var exists bool
	require.NoError(t, conn.QueryRow(ctx, "SELECT to_regclass('pglock.schema_migrations') IS NOT NULL").Scan(&exists))
	if !exists { // the last part would not plan
		query = query[:strings.LastIndex(query, "UNION ALL")]
	}
	rows, err := conn.Query(ctx, query)
	require.NoError(t, err)
	out := map[string]string{}
	var key, text string
	_, err = pgx.ForEachRow(rows, []any{&key, &text}, func() error {
		require.NotContains(t, out, key)
		out[key] = text
		return nil
	})
	require.NoError(t, err)
	return out
}

// laterMigration changes what the generator renders in ways a later migration may: a
// column dropped, an index dropped, an index and a column added, and what no migration
// uses yet (an unlogged table, identity and serial columns, a foreign key, a collation,
// a quoted name, a counting-down sequence, PUBLIC's grants, a procedure, a trigger of
// another schema's function).
const laterMigration = `
ALTER TABLE pglock.waiters DROP COLUMN granted;
DROP INDEX pglock.locks_semaphore_of;
CREATE INDEX locks_expires_at ON pglock.locks (expires_at) WITH (fillfactor = 70);
ALTER TABLE pglock.locks ADD COLUMN note text COLLATE "C" DEFAULT 'none' NOT NULL;
CREATE UNLOGGED TABLE pglock."Odd Name" (
    id integer GENERATED BY DEFAULT AS IDENTITY (START WITH 10 INCREMENT BY 5) PRIMARY KEY,
    lock_key text REFERENCES pglock.locks (key) ON DELETE CASCADE DEFERRABLE,
    n serial,
    UNIQUE (lock_key, n)
) WITH (autovacuum_enabled = false);
CREATE SEQUENCE pglock.countdown AS integer INCREMENT BY -1 CACHE 10 CYCLE;
GRANT SELECT ON pglock."Odd Name" TO PUBLIC;
GRANT USAGE ON SCHEMA pglock TO PUBLIC;
CREATE FUNCTION pglock.job_touch() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$;
CREATE TRIGGER odd_touch BEFORE UPDATE ON pglock."Odd Name" FOR EACH ROW EXECUTE FUNCTION pglock.job_touch();
CREATE TRIGGER odd_same BEFORE UPDATE ON pglock."Odd Name" FOR EACH ROW EXECUTE FUNCTION suppress_redundant_updates_trigger();
CREATE PROCEDURE pglock.registry_sweep() LANGUAGE sql AS $$ SELECT 1 $$;
REVOKE EXECUTE ON PROCEDURE pglock.registry_sweep() FROM PUBLIC;
UPDATE pglock.schema_migrations SET version = version + 1`

// TestSQLGeneratorRendersWhatLaterMigrationsMayChange: after laterMigration, the files
// Generate renders make, through Script, the schema that migration left; and it
// refuses, naming it, what it cannot place or render.
func TestSQLGeneratorRendersWhatLaterMigrationsMayChange(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	t.Run("Renders", func(t *testing.T) {
		t.Parallel()
		migrated := pglocktest.PostgresURL(t)
		_, err := testConn(t, migrated).Exec(ctx, laterMigration)
		require.NoError(t, err)
		files, err := schema.Generate(ctx, testConn(t, migrated))
		require.NoError(t, err)
		require.Contains(t, string(files["jobs.sql"]), "CREATE TRIGGER odd_touch ")
		require.Contains(t, string(files[schema.SchemaFile]), "CREATE TRIGGER odd_same ")
		dir := t.TempDir()
		for name, body := range files {
			require.NoError(t, os.WriteFile(filepath.Join(dir, name), body, 0o644))
		}
		script, err := schema.Script(os.DirFS(dir))
		require.NoError(t, err)

		fromSQL := pglocktest.PostgresURL(t)
		conn := testConn(t, fromSQL)
		_, err = conn.Exec(ctx, "DROP SCHEMA pglock CASCADE")
		require.NoError(t, err)
		_, err = conn.Exec(ctx, script)
		require.NoError(t, err)
		requireSameCatalog(t, catalogOf(t, migrated), catalogOf(t, fromSQL), "the script of the files")
	})
	for _, c := range []struct{ name, ddl, err string }{
		{"RefusesAFunctionOfNoArea", "CREATE FUNCTION pglock.widget_spin() RETURNS int LANGUAGE sql AS 'SELECT 1'",
			`function pglock.widget_spin: no area holds the functions named widget_*`},
		{"RefusesAView", "CREATE VIEW pglock.held AS SELECT key FROM pglock.locks", "relation pglock.held of relkind v"},
		{"RefusesAComment", "COMMENT ON TABLE pglock.locks IS 'the locks'", "comment on table pglock.locks"},
		{"RefusesAGrantToARole", "GRANT SELECT ON pglock.locks TO pg_monitor", "table pglock.locks: GRANT SELECT for role pg_monitor"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			url := pglocktest.PostgresURL(t)
			_, err := testConn(t, url).Exec(ctx, c.ddl)
			require.NoError(t, err)
			_, err = schema.Generate(ctx, testConn(t, url))
			require.ErrorContains(t, err, c.err)
		})
	}
}

// A fair waiter whose queueing commits between lock_acquire's read of the key's row and
// its statement that takes the key wins: the key's lease ended (its holder died), the
// read found it free and no waiter queued, and the statement, which waits here for the
// waiter's transaction (a table lock it holds), finds the row queued.
func TestSQLAPlainAcquisitionLosesToAWaiterThatQueuedAfterItsRead(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dbURL := pglocktest.PostgresURL(t)
	pool := pglocktest.Pool(t, dbURL, 4)
	var token int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT pglock.lock_acquire('k', 'died', 300)").Scan(&token))

	waiter, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer waiter.Rollback(context.WithoutCancel(ctx))
	_, err = waiter.Exec(ctx, "LOCK TABLE pglock.locks IN SHARE MODE")
	require.NoError(t, err)
	var ticket int64
	require.NoError(t, waiter.QueryRow(ctx, "SELECT ticket FROM pglock.queue_acquire('k', 'fair', 60000, 0)").Scan(&ticket))
	require.Positive(t, ticket, "queued behind the holder")

	var expired bool // on the database clock: the holder's lease ends
	require.NoError(t, pool.QueryRow(ctx, "SELECT pg_sleep(0.35), NOT EXISTS (SELECT FROM pglock.lock_holder('k') WHERE owner IS NOT NULL)").Scan(nil, &expired))
	require.True(t, expired)

	plain := make(chan *int64, 1)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	var pid int32
	require.NoError(t, conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	go func() {
		var got *int64
		assert.NoError(t, conn.QueryRow(ctx, "SELECT pglock.lock_acquire('k', 'plain', 60000)").Scan(&got))
		plain <- got
	}()
	// The plain acquisition has read the row (the committed one: free, not queued) and
	// waits for the table lock to take it.
	require.Eventually(t, func() bool {
		var waiting bool
		err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_locks WHERE pid = $1 AND NOT granted AND relation = 'pglock.locks'::regclass)", pid).Scan(&waiting)
		return err == nil && waiting
	}, 10*time.Second, time.Millisecond)
	require.NoError(t, waiter.Commit(ctx))

	require.Nil(t, <-plain, "a plain acquisition took a key a fair waiter had queued for")
	var claimed *int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT fencing_token FROM pglock.queue_poll('k', $1)", ticket).Scan(&claimed))
	require.NotNil(t, claimed, "the waiter takes the key at its poll")
	require.Greater(t, *claimed, token)
}
