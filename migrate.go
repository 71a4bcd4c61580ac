package pglock

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sync"

	"github.com/golang-migrate/migrate/v4"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgfence/pglock/internal/schema"
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

// migrationsTable keeps golang-migrate's bookkeeping in pglock's own schema, so it never
// collides with the application's golang-migrate table.
const migrationsTable = `"pglock"."schema_migrations"`

// Migrate brings the pglock schema in the database that databaseURL names up to date,
// with golang-migrate and the table pglock.schema_migrations. databaseURL is anything pgx
// accepts, "" meaning the libpq defaults (PGHOST, PGDATABASE...), so Migrate(ctx,
// os.Getenv("DATABASE_URL")) works with or without the variable. It is safe to call from
// many instances at once. ctx bounds the connection and stops the migration between two
// steps. Errors are "pglock: migrate"-prefixed and wrap the driver's error.
func Migrate(ctx context.Context, databaseURL string) error {
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return fmt.Errorf("pglock: migrate: connection string: %w", err)
	}
	if err := createSchema(ctx, cfg); err != nil {
		return err
	}
	db := stdlib.OpenDB(*cfg)
	driver, err := migratepgx.WithInstance(db, &migratepgx.Config{
		MigrationsTable:       migrationsTable,
		MigrationsTableQuoted: true,
	})
	if err != nil {
		_ = db.Close()
		return fmt.Errorf("pglock: migrate: %w", err)
	}
	src, err := iofs.New(Migrations(), ".")
	if err != nil {
		_ = driver.Close()
		return fmt.Errorf("pglock: migrate: %w", err)
	}
	m, err := migrate.NewWithInstance("iofs", src, "pgx5", driver)
	if err != nil {
		_ = driver.Close()
		return fmt.Errorf("pglock: migrate: %w", err)
	}
	defer m.Close() // closes the driver and db
	stop := context.AfterFunc(ctx, func() { m.GracefulStop <- true })
	defer stop()
	if err := m.Up(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
		return fmt.Errorf("pglock: migrate: %w", err)
	}
	return ctx.Err()
}

// createSchema creates the schema golang-migrate keeps its table in. Concurrent
// CREATE SCHEMA IF NOT EXISTS can still collide on the catalog's unique index, so the
// callers take turns on a transaction-scoped advisory lock.
func createSchema(ctx context.Context, cfg *pgx.ConnConfig) error {
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("pglock: migrate: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('pglock.create_schema'))`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS pglock`)
		return err
	})
	if err != nil {
		return fmt.Errorf("pglock: migrate: create schema: %w", err)
	}
	return nil
}
