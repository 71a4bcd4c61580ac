package main

import (
	"context"
	"flag"
	"fmt"
	"runtime/debug"
	"strings"
)

var versionCommand = &command{
	name:    "version",
	args:    "[-json]",
	summary: "this pglock's version, the schema version it needs, and the database's",
	help: `
Version prints the version of the pglock module this command was built from (as go
install records it; "(devel)" for a build of a checkout), the schema version its
migrations bring the database to, and, when the database answers within -timeout,
the version schema pglock has there. A database that does not answer is reported,
not an error: version exits 0. A database without schema pglock, or with one older
than this pglock, exits 1: run 'pglock migrate'.`,
	example: `
pglock version
pglock version -json | jq .database_schema`,
	connects: true,
	run:      runVersion,
}

// versionJSON is version -json.
type versionJSON struct {
	Module         string `json:"module"`          // the module's version
	Go             string `json:"go"`              // the toolchain it was built with
	Schema         uint   `json:"schema"`          // the schema version its migrations reach
	DatabaseSchema *uint  `json:"database_schema"` // null when the database is unreachable or has no version
	DatabaseError  string `json:"database_error,omitempty"`
}

func runVersion(ctx context.Context, e *env, fs *flag.FlagSet, args []string) error {
	asJSON := fs.Bool("json", false, "print JSON")
	rest, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return usageError("version: unexpected argument %q", rest[0])
	}
	available, err := migrations()
	if err != nil {
		return err
	}
	v := versionJSON{Module: "unknown", Go: "unknown"}
	if bi, ok := debug.ReadBuildInfo(); ok {
		v.Go = bi.GoVersion
		v.Module = bi.Main.Version
		for _, d := range bi.Deps { // built as a dependency of another module
			if d.Path == "github.com/pgfence/pglock" {
				v.Module = d.Version
			}
		}
	}
	v.Schema = available[len(available)-1].Version
	database, fail := "unknown", error(nil)
	if c, err := e.connect(ctx); err != nil {
		v.DatabaseError = err.Error()
		database = strings.TrimPrefix(err.Error(), "pglock: ")
	} else {
		st, err := c.schemaVersion(ctx)
		c.close()
		database = c.names()
		switch {
		case err != nil:
			v.DatabaseError = err.Error()
			database += ": " + strings.TrimPrefix(err.Error(), "pglock: ")
		case !st.Exists:
			fail = c.schemaMissing()
		case !st.Bookkeeping:
			database += ": schema pglock without pglock.schema_migrations (made by hand, or by the sql/pglock.sql of an older pglock): run `pglock migrate`"
		default:
			v.DatabaseSchema = &st.Version
			database += fmt.Sprintf(": schema pglock at version %d", st.Version)
			switch {
			case st.Dirty:
				database += " (dirty: it failed half-way)"
			case st.Version < v.Schema:
				fail = c.schemaBehind(status{Schema: st, Migrations: available}.pending())
			case st.Version > v.Schema:
				database += ": newer than this pglock"
			}
		}
		if fail != nil {
			v.DatabaseError = fail.Error()
		}
	}
	if *asJSON {
		if err := writeJSON(e.stdout, v, false); err != nil {
			return err
		}
		return fail
	}
	fmt.Fprintf(e.stdout, "pglock %s (%s)\nschema: version %d\ndatabase: %s\n", v.Module, v.Go, v.Schema, database)
	return fail
}
