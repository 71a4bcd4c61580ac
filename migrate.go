package pglock

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net/url"

	"github.com/golang-migrate/migrate/v4"
	_ "github.com/golang-migrate/migrate/v4/database/pgx/v5" // registers the pgx5:// scheme
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
)

//go:generate go run ./internal/gensql

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations is the schema pglock needs, as golang-migrate migrations
// (NNNNNN_name.up.sql / .down.sql). Migrate applies them; sql/pglock.sql is the same
// schema as one idempotent script for other migration tools.
var Migrations fs.FS = mustSub(migrationFiles, "migrations")

func mustSub(f fs.FS, dir string) fs.FS {
	sub, err := fs.Sub(f, dir)
	if err != nil {
		panic(err) // the embed pattern above guarantees the directory
	}
	return sub
}

// migrationsTable keeps golang-migrate's bookkeeping in pglock's own schema, so it never
// collides with the application's golang-migrate table.
const migrationsTable = `"pglock"."schema_migrations"`

// Migrate brings the pglock schema in the database at databaseURL (a postgres:// or
// postgresql:// URL; empty means the libpq defaults) up to date, with golang-migrate
// and the migrations table pglock.schema_migrations. It is safe to call from many
// instances at once: one migrates, the others wait for it and find nothing to do.
//
// ctx bounds the connection and stops the migration between two steps; a step that
// has started runs to its end. Errors are "pglock: migrate"-prefixed and wrap the
// driver's error.
func Migrate(ctx context.Context, databaseURL string) error {
	u, err := url.Parse(databaseURL)
	if err != nil {
		return fmt.Errorf("pglock: migrate: database URL: %w", err)
	}
	switch u.Scheme {
	case "postgres", "postgresql":
	case "":
		if databaseURL != "" {
			return fmt.Errorf("pglock: migrate: database URL %q: want postgres://", databaseURL)
		}
		u = &url.URL{Scheme: "postgres"}
	default:
		return fmt.Errorf("pglock: migrate: database URL scheme %q: want postgres://", u.Scheme)
	}
	if err := createSchema(ctx, u.String()); err != nil {
		return err
	}

	q := u.Query()
	q.Set("x-migrations-table", migrationsTable)
	q.Set("x-migrations-table-quoted", "true")
	u.RawQuery = q.Encode()
	u.Scheme = "pgx5"

	src, err := iofs.New(Migrations, ".")
	if err != nil {
		return fmt.Errorf("pglock: migrate: %w", err)
	}
	m, err := migrate.NewWithSourceInstance("iofs", src, u.String())
	if err != nil {
		return fmt.Errorf("pglock: migrate: %w", err)
	}
	defer m.Close()
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
func createSchema(ctx context.Context, connString string) error {
	conn, err := pgx.Connect(ctx, connString)
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
