package testdb

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// A copy of the template costs the server about half a second (CREATE DATABASE writes
// every page of the copy to the WAL, and waits for its flush), and a test process
// makes hundreds. So a database its test leaves as the template made it, but for the
// rows of its tables and its sequences, is emptied and kept for the process's next
// test: giveBack checks that no session is left on it and that its catalog is a fresh
// copy's (state), then empties its tables, restarts its sequences and resets its
// statistics. A database with a table, a function, a grant or a setting of its test's,
// or a session that outlived the test, is dropped as before.

// state is what a database's catalog says of it, to tell a database that is still the
// template's from one its test changed, and the rows of its migrations table.
type state struct {
	catalog    string // a digest of the catalog outside pg_catalog (catalogQuery)
	migrations string // the rows of pglock.schema_migrations, or "" without one
}

// catalogQuery digests every part of a database's catalog that a test could change and
// that a later test could meet: schemas, relations, columns, functions, triggers,
// constraints, types, sequences' definitions, rules, policies, the database's settings,
// limits and privileges, default privileges, extensions, event triggers, publications,
// large objects, prepared transactions, comments and security labels, and the count of
// the rarer objects (operators, collations, casts, languages, statistics, foreign
// servers ...). Temporary schemas are left out: a session's
// pg_temp_N stays after it, empty.
const catalogQuery = `WITH ns AS (
	SELECT oid, nspname FROM pg_namespace
	WHERE nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast') AND nspname !~ '^pg_(toast_)?temp_'
), rel AS (
	SELECT c.* FROM pg_class c JOIN ns ON ns.oid = c.relnamespace
)
SELECT md5(coalesce(string_agg(x, E'\n' ORDER BY x), '')) FROM (
	SELECT format('n %s %s %s', n.nspname, n.nspowner, n.nspacl) FROM pg_namespace n JOIN ns USING (oid)
	UNION ALL SELECT format('c %s %s %s %s %s %s %s', oid::regclass, relkind, relowner, relacl, reloptions,
		relrowsecurity, relpersistence) FROM rel
	UNION ALL SELECT format('a %s %s %s %s %s %s %s', attrelid::regclass, attname, atttypid, attnotnull, atthasdef,
		attisdropped, attacl) FROM pg_attribute JOIN rel ON rel.oid = attrelid WHERE attnum > 0
	UNION ALL SELECT format('d %s %s %s', adrelid::regclass, adnum, pg_get_expr(adbin, adrelid))
		FROM pg_attrdef JOIN rel ON rel.oid = adrelid
	UNION ALL SELECT format('p %s %s %s %s %s %s', p.oid::regprocedure, md5(p.prosrc), p.proconfig, p.proacl,
		p.prosecdef, p.proowner) FROM pg_proc p JOIN ns ON ns.oid = p.pronamespace
	UNION ALL SELECT format('t %s %s %s', tgrelid::regclass, tgname, tgenabled) FROM pg_trigger WHERE NOT tgisinternal
	UNION ALL SELECT format('k %s %s %s', conrelid::regclass, conname, pg_get_constraintdef(c.oid))
		FROM pg_constraint c JOIN ns ON ns.oid = c.connamespace
	UNION ALL SELECT format('y %s', t.oid::regtype) FROM pg_type t JOIN ns ON ns.oid = t.typnamespace
	UNION ALL SELECT format('s %s %s %s %s %s %s %s', seqrelid::regclass, seqtypid, seqstart, seqincrement, seqmax,
		seqmin, seqcycle) FROM pg_sequence
	UNION ALL SELECT format('r %s %s', ev_class::regclass, rulename) FROM pg_rewrite JOIN rel ON rel.oid = ev_class
	UNION ALL SELECT format('o %s %s', polrelid::regclass, polname) FROM pg_policy
	UNION ALL SELECT format('g %s %s', setrole, setconfig) FROM pg_db_role_setting
		WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
	UNION ALL SELECT format('D %s %s %s %s', datconnlimit, datallowconn, datacl, datdba) FROM pg_database
		WHERE datname = current_database()
	UNION ALL SELECT format('A %s %s %s', defaclrole, defaclobjtype, defaclacl) FROM pg_default_acl
	UNION ALL SELECT format('e %s %s', extname, extversion) FROM pg_extension
	UNION ALL SELECT format('v %s', evtname) FROM pg_event_trigger
	UNION ALL SELECT format('P %s', pubname) FROM pg_publication
	UNION ALL SELECT format('L %s', count(*)) FROM pg_largeobject_metadata
	UNION ALL SELECT format('X %s', gid) FROM pg_prepared_xacts WHERE database = current_database()
	UNION ALL SELECT format('C %s %s %s %s', classoid, objoid, objsubid, md5(description)) FROM pg_description
		WHERE objoid >= 16384
	UNION ALL SELECT format('l %s %s %s', classoid, objoid, label) FROM pg_seclabel
	UNION ALL SELECT format('u %s', ARRAY[
		(SELECT count(*) FROM pg_operator WHERE oid >= 16384), (SELECT count(*) FROM pg_collation WHERE oid >= 16384),
		(SELECT count(*) FROM pg_opclass WHERE oid >= 16384), (SELECT count(*) FROM pg_opfamily WHERE oid >= 16384),
		(SELECT count(*) FROM pg_cast WHERE oid >= 16384), (SELECT count(*) FROM pg_language WHERE oid >= 16384),
		(SELECT count(*) FROM pg_am WHERE oid >= 16384), (SELECT count(*) FROM pg_conversion WHERE oid >= 16384),
		(SELECT count(*) FROM pg_ts_config WHERE oid >= 16384), (SELECT count(*) FROM pg_ts_dict WHERE oid >= 16384),
		(SELECT count(*) FROM pg_statistic_ext), (SELECT count(*) FROM pg_transform),
		(SELECT count(*) FROM pg_foreign_data_wrapper), (SELECT count(*) FROM pg_foreign_server),
		(SELECT count(*) FROM pg_user_mapping)])
) s(x)`

// migrationsQuery lists the rows of pglock.schema_migrations, "" without the table.
const migrationsQuery = `SELECT CASE WHEN to_regclass('pglock.schema_migrations') IS NULL THEN ''
	ELSE (SELECT coalesce(string_agg(format('%s %s', version, dirty), ',' ORDER BY version), '-')
		FROM pglock.schema_migrations) END`

// readState reads the state of the database conn is on.
func readState(ctx context.Context, conn *pgx.Conn) (state, error) {
	var st state
	if err := conn.QueryRow(ctx, catalogQuery).Scan(&st.catalog); err != nil {
		return state{}, fmt.Errorf("read the catalog: %w", err)
	}
	if err := conn.QueryRow(ctx, migrationsQuery).Scan(&st.migrations); err != nil {
		return state{}, fmt.Errorf("read the migrations: %w", err)
	}
	return st, nil
}

// emptyQuery empties every table outside pglock.schema_migrations that has a row
// (TRUNCATE, so that a reused database has no dead rows either), restarts every
// sequence at its start, and resets the database's statistics.
const emptyQuery = `DO $$
DECLARE
	t regclass;
	nonempty boolean;
BEGIN
	FOR t IN SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
			AND n.nspname !~ '^pg_(toast_)?temp_' AND c.oid <> 'pglock.schema_migrations'::regclass
	LOOP
		EXECUTE format('SELECT EXISTS (SELECT FROM %s)', t) INTO nonempty;
		IF nonempty THEN
			EXECUTE format('TRUNCATE %s CASCADE', t);
		END IF;
	END LOOP;
	PERFORM setval(seqrelid, seqstart, false) FROM pg_sequence;
	PERFORM pg_stat_reset();
END $$`

// take returns a database that giveBack emptied, if there is one.
func (s *sharedServer) take() (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.free) == 0 {
		return "", false
	}
	name := s.free[len(s.free)-1]
	s.free = s.free[:len(s.free)-1]
	return name, true
}

// learn reads the state of a fresh copy of the template, databaseURL's, the first time
// it is called for a template: what giveBack compares a used database with.
func (s *sharedServer) learn(ctx context.Context, databaseURL string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fresh != nil {
		return nil
	}
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return fmt.Errorf("connect to a new database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	st, err := readState(ctx, conn)
	if err != nil {
		return err
	}
	s.fresh = &st
	return nil
}

// giveBack empties the database name, at databaseURL, and keeps it for a later test,
// when no other session is left on it and its state is a fresh copy's. It reports
// whether it did; the caller drops a database it did not keep.
func (s *sharedServer) giveBack(databaseURL, name string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s.mu.Lock()
	fresh := s.fresh
	s.mu.Unlock()
	if fresh == nil {
		return false
	}
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return false
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if !sessionsGone(ctx, conn) {
		return false
	}
	if st, err := readState(ctx, conn); err != nil || st != *fresh {
		return false
	}
	if _, err := conn.Exec(ctx, emptyQuery); err != nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fresh != fresh { // the server's last user left meanwhile: its databases went
		return false
	}
	s.free = append(s.free, name)
	return true
}

// sessionsGone waits up to a second for the other sessions on conn's database to end
// (a session a client closed may take a moment to leave pg_stat_activity), and reports
// whether they did.
func sessionsGone(ctx context.Context, conn *pgx.Conn) bool {
	for deadline := time.Now().Add(time.Second); ; time.Sleep(10 * time.Millisecond) {
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()").Scan(&n); err != nil {
			return false
		}
		if n == 0 {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}
