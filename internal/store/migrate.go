package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"github.com/golang-migrate/migrate/v4"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// migrationsTable keeps golang-migrate's bookkeeping in pglock's own schema, so it never
// collides with the application's golang-migrate table.
const migrationsTable = `"pglock"."schema_migrations"`

// Migrate applies migrations (pglock.Migrations) to the database that databaseURL
// names: pglock.Migrate's, whose doc says what it does.
func Migrate(ctx context.Context, databaseURL string, migrations fs.FS) error {
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
	src, err := iofs.New(migrations, ".")
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
