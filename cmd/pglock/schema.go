package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
	"time"

	"github.com/golang-migrate/migrate/v4/source"
	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pglock"
)

var migrateCommand = &command{
	name:    "migrate",
	args:    "[-json] [up|status]",
	summary: "apply pglock's migrations (up, the default), or list them (status)",
	help: `
Migrate up (the default) brings schema pglock up to date with this pglock's
migrations, with golang-migrate, keeping its bookkeeping in
pglock.schema_migrations; it is what pglock.Migrate does, and it is safe to run
from many places at once. Migrate status lists the migrations, applied or pending,
and changes nothing; it exits 1 while some are pending (no schema pglock included).

The role needs CREATE on the database the first time. 'pglock sql' prints the
schema as one script that creates it.`,
	example: `
pglock migrate status
DATABASE_URL=postgres://owner@db.internal/shop pglock migrate`,
	connects: true,
	run:      runMigrate,
}

func runMigrate(ctx context.Context, e *env, fs *flag.FlagSet, args []string) error {
	asJSON := fs.Bool("json", false, "print JSON")
	rest, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	action := "up"
	switch len(rest) {
	case 0:
	case 1:
		action = rest[0]
	default:
		return usageError("migrate: want up or status, got %d arguments", len(rest))
	}
	if action != "up" && action != "status" {
		return usageError("migrate: unknown action %q: want up or status", action)
	}
	available, err := migrations()
	if err != nil {
		return err
	}
	c, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer c.close()
	before, err := c.schemaVersion(ctx)
	if err != nil {
		return err
	}
	if action == "status" {
		st := status{Schema: before, Migrations: available}
		if *asJSON {
			if err := writeJSON(e.stdout, st.json(), false); err != nil {
				return err
			}
		} else {
			fmt.Fprintln(e.stdout, c.reached())
			st.print(e)
		}
		switch {
		case before.Dirty:
			return fmt.Errorf("pglock: migrate status: migration %d is dirty: it failed half-way; fix the schema by hand, then set pglock.schema_migrations' version", before.Version)
		case !before.Exists:
			return c.schemaMissing()
		case before.Bookkeeping && st.pending() > 0:
			return c.schemaBehind(st.pending())
		}
		return nil
	}
	if err := pglock.Migrate(ctx, c.url); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("pglock: migrate: interrupted: %w", err)
		}
		return err
	}
	after, err := c.schemaVersion(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(e.stdout, map[string]any{"from": before.Version, "to": after.Version}, false)
	}
	fmt.Fprintln(e.stdout, c.reached())
	if before.Version == after.Version {
		fmt.Fprintf(e.stdout, "schema pglock is up to date: version %d\n", after.Version)
	} else {
		fmt.Fprintf(e.stdout, "migrated schema pglock from version %d to %d\n", before.Version, after.Version)
	}
	return nil
}

// migration is one of this pglock's migrations.
type migration struct {
	Version uint   `json:"version"`
	Name    string `json:"name"`
}

// migrations lists pglock.Migrations, in order, parsed as golang-migrate parses them.
func migrations() ([]migration, error) {
	names, err := fs.Glob(pglock.Migrations(), "*.up.sql")
	if err != nil {
		return nil, fmt.Errorf("pglock: migrations: %w", err)
	}
	out := make([]migration, 0, len(names))
	for _, name := range names {
		m, err := source.DefaultParse(name)
		if err != nil {
			return nil, fmt.Errorf("pglock: migration %s: %w", name, err)
		}
		out = append(out, migration{Version: m.Version, Name: m.Identifier})
	}
	return out, nil
}

// schemaState is what the database says of schema pglock.
type schemaState struct {
	Exists      bool // schema pglock exists
	Bookkeeping bool // pglock.schema_migrations exists (golang-migrate applied it)
	Version     uint // 0: none
	Dirty       bool
}

// schemaVersion reads schema pglock's state, within -timeout, without changing it.
func (c *conn) schemaVersion(ctx context.Context) (schemaState, error) {
	ctx, cancel := c.statementContext(ctx)
	defer cancel()
	var st schemaState
	err := c.pool.QueryRow(ctx, `SELECT to_regnamespace('pglock') IS NOT NULL,
		to_regclass('pglock.schema_migrations') IS NOT NULL`).Scan(&st.Exists, &st.Bookkeeping)
	if err != nil {
		return st, fmt.Errorf("pglock: read schema pglock's version: %w", err)
	}
	if !st.Bookkeeping {
		return st, nil
	}
	var version int64
	err = c.pool.QueryRow(ctx, `SELECT version, dirty FROM pglock.schema_migrations LIMIT 1`).Scan(&version, &st.Dirty)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return st, nil
	case err != nil:
		return st, fmt.Errorf("pglock: read schema pglock's version: %w", err)
	}
	st.Version = uint(max(version, 0))
	return st, nil
}

type status struct {
	Schema     schemaState
	Migrations []migration
}

func (s status) pending() int {
	n := 0
	for _, m := range s.Migrations {
		if m.Version > s.Schema.Version {
			n++
		}
	}
	return n
}

func (s status) print(e *env) {
	w := e.stdout
	latest := uint(0)
	if len(s.Migrations) > 0 {
		latest = s.Migrations[len(s.Migrations)-1].Version
	}
	switch {
	case !s.Schema.Exists:
		fmt.Fprintf(w, "schema pglock not found: %s pending\n", plural(s.pending(), "migration"))
	case !s.Schema.Bookkeeping:
		fmt.Fprintln(w, "schema pglock exists without pglock.schema_migrations (made by hand, or by the sql/pglock.sql of an older pglock): its version is unknown; `pglock migrate` runs every migration over it")
	default:
		dirty := ""
		if s.Schema.Dirty {
			dirty = " (dirty: it failed half-way)"
		}
		fmt.Fprintf(w, "schema pglock at version %d of %d%s, %s pending\n", s.Schema.Version, latest, dirty, plural(s.pending(), "migration"))
	}
	fmt.Fprintln(w)
	t := newTable(w, 0, "VERSION", "NAME", "STATE")
	for _, m := range s.Migrations {
		state := "pending"
		switch {
		case m.Version < s.Schema.Version, m.Version == s.Schema.Version && !s.Schema.Dirty:
			state = "applied"
		case m.Version == s.Schema.Version:
			state = "dirty"
		case s.Schema.Exists && !s.Schema.Bookkeeping:
			state = "unknown"
		}
		t.row(strconv.FormatUint(uint64(m.Version), 10), m.Name, state)
	}
	t.flush()
}

func (s status) json() any {
	type migrationJSON struct {
		migration
		Applied bool `json:"applied"`
	}
	ms := make([]migrationJSON, len(s.Migrations))
	for i, m := range s.Migrations {
		ms[i] = migrationJSON{m, m.Version <= s.Schema.Version && s.Schema.Version > 0}
	}
	return map[string]any{
		"schema_exists": s.Schema.Exists,
		"version":       s.Schema.Version,
		"dirty":         s.Schema.Dirty,
		"pending":       s.pending(),
		"migrations":    ms,
	}
}

var sqlCommand = &command{
	name:    "sql",
	args:    "",
	summary: "print the SQL script that creates schema pglock on a database without it",
	help: `
SQL prints schema pglock as it is now, as one script in one transaction, each
function defined once (the files of sql/ in pglock's source): for a review, or to
create the schema with psql. It records the latest migration in
pglock.schema_migrations, so 'pglock migrate' later finds nothing to do. On a
database that has schema pglock, of any version, it fails and changes nothing:
upgrade with 'pglock migrate'. It does not connect.`,
	example: `
pglock sql > pglock.sql
pglock sql | psql -v ON_ERROR_STOP=1 "$DATABASE_URL"`,
	run: func(ctx context.Context, e *env, fs *flag.FlagSet, args []string) error {
		rest, err := e.parse(fs, args)
		if err != nil {
			return err
		}
		if len(rest) > 0 {
			return usageError("sql: unexpected argument %q", rest[0])
		}
		_, err = fmt.Fprint(e.stdout, pglock.SQL())
		return err
	},
}

var pruneCommand = &command{
	name:    "prune",
	args:    "-older-than D [-json]",
	summary: "delete the rows of locks released or expired more than D ago",
	help: `
Prune deletes the locks whose lease ended, released or expired, more than D ago:
pglock keeps a row per key ever used until it is pruned. It never deletes a live
lock, nor a row that an acquisition, a renewal or an open fenced transaction has
locked, and a pruned key acquired again still gets a greater token. It deletes in
batches of 1000 rows until done (or Ctrl+C). D is a duration: 90m, 24h, 7d.`,
	example: `
pglock prune -older-than 24h`,
	connects: true,
	run:      runPrune,
}

func runPrune(ctx context.Context, e *env, fs *flag.FlagSet, args []string) error {
	olderThan := durationFlag{d: -1}
	fs.Var(&olderThan, "older-than", "delete the locks whose lease ended more than `D` ago (required: 90m, 24h, 7d)")
	asJSON := fs.Bool("json", false, "print JSON")
	rest, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return usageError("prune: unexpected argument %q", rest[0])
	}
	if olderThan.d < 0 {
		return usageError("prune: -older-than is required, for example -older-than 24h")
	}
	c, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer c.close()
	n, err := c.client.Prune(ctx, olderThan.d)
	if err != nil {
		err = c.explain(ctx, "prune", err)
		if n > 0 {
			err = fmt.Errorf("%w (%d deleted before)", err, n)
		}
		return err
	}
	if *asJSON {
		return writeJSON(e.stdout, map[string]any{"deleted": n, "older_than_seconds": olderThan.d.Seconds()}, false)
	}
	fmt.Fprintln(e.stdout, c.reached())
	fmt.Fprintf(e.stdout, "deleted %s released or expired more than %s ago\n", plural(int(n), "lock"), olderThan.String())
	return nil
}

// durationFlag is a time.Duration flag that also takes days ("7d"). It rejects a
// negative duration.
type durationFlag struct {
	d time.Duration
	s string // as given
}

func (f *durationFlag) String() string { return f.s }

func (f *durationFlag) Set(s string) error {
	var d time.Duration
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseUint(days, 10, 16)
		if err != nil {
			return fmt.Errorf("want a duration such as 90m, 24h or 7d")
		}
		d = time.Duration(n) * 24 * time.Hour
	} else {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			return fmt.Errorf("want a duration such as 90m, 24h or 7d")
		}
	}
	if d < 0 {
		return fmt.Errorf("negative")
	}
	f.d, f.s = d, s
	return nil
}
