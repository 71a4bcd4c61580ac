package pglock

import (
	"context"
	"embed"
	"io/fs"
	"sync"

	"github.com/pgfence/pglock/internal/schema"
	"github.com/pgfence/pglock/internal/store"
)

//go:generate go run ./internal/gensql

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations returns the schema pglock needs, as golang-migrate migrations
// (NNNNNN_name.up.sql / .down.sql), for a migration tool of your own. Migrate applies
// them; SQL returns the schema they build as one script.
func Migrations() fs.FS {
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		panic(err) // the embed pattern above guarantees the directory
	}
	return sub
}

//go:embed sql/*.sql
var sqlFiles embed.FS

var sqlScript = sync.OnceValue(func() string {
	dir, err := fs.Sub(sqlFiles, "sql")
	if err == nil {
		var script string
		if script, err = schema.Script(dir); err == nil {
			return script
		}
	}
	panic(err) // go generate writes every file Script reads
})

// SQL returns the schema that Migrations builds as one script (psql -f, a DBA's review),
// which creates it in one transaction on a database without schema pglock and records the
// latest migration, so a later Migrate has nothing to do. On a database with schema
// pglock it raises an error (SQLSTATE 42P06) and changes nothing: upgrade with Migrate or
// Migrations.
func SQL() string { return sqlScript() }

// Migrate brings the pglock schema in the database that databaseURL names up to date,
// with golang-migrate and the table pglock.schema_migrations. databaseURL is anything pgx
// accepts, "" meaning the libpq defaults (PGHOST, PGDATABASE...), so Migrate(ctx,
// os.Getenv("DATABASE_URL")) works with or without the variable. It is safe to call from
// many instances at once. ctx bounds the connection and stops the migration between two
// steps. Errors are "pglock: migrate"-prefixed and wrap the driver's error.
func Migrate(ctx context.Context, databaseURL string) error {
	return store.Migrate(ctx, databaseURL, Migrations())
}
