package shop

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/golang-migrate/migrate/v4"
	_ "github.com/golang-migrate/migrate/v4/database/pgx/v5" // registers the pgx5:// scheme
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pglock"
)

//go:embed migrations/*.sql
var migrations embed.FS

// MigrationsTable is the golang-migrate table of the shop's own migrations, apart from
// pglock's (pglock.schema_migrations).
const MigrationsTable = "shop_schema_migrations"

// Migrate brings the shop's tables (orders, products) in the database at databaseURL,
// a postgres:// URL, up to date with golang-migrate. Run pglock.Migrate too: the shop
// needs both. It is safe to call from many instances at once. ctx bounds the
// connection. Errors are "shop: migrate"-prefixed and wrap golang-migrate's.
func Migrate(ctx context.Context, databaseURL string) error {
	u, err := url.Parse(databaseURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return fmt.Errorf("shop: migrate: database URL %q: want postgres://", databaseURL)
	}
	q := u.Query()
	q.Set("x-migrations-table", MigrationsTable)
	u.RawQuery, u.Scheme = q.Encode(), "pgx5"
	src, err := iofs.New(migrations, "migrations")
	if err != nil {
		return fmt.Errorf("shop: migrate: %w", err)
	}
	m, err := migrate.NewWithSourceInstance("iofs", src, u.String())
	if err != nil {
		return fmt.Errorf("shop: migrate: %w", err)
	}
	defer m.Close()
	done := make(chan error, 1)
	go func() { done <- m.Up() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		m.GracefulStop <- true // the step in progress runs to its end
		err = errors.Join(<-done, context.Cause(ctx))
	}
	if err != nil && !errors.Is(err, migrate.ErrNoChange) {
		return fmt.Errorf("shop: migrate: %w", err)
	}
	return nil
}

type seedOrder struct {
	id, userID, items string
	total             int
	status            string
	placedAgo         time.Duration
}

type seedProduct struct {
	id, name       string
	price, inStock int
}

// The seed data: three placed orders (ord_1003 was cancelled), three products.
var (
	seedOrders = []seedOrder{
		{"ord_1001", "usr_alice", `[{"productId":"salmon-kibble-2kg","quantity":2}]`, 4998, "placed", 3 * time.Hour},
		{"ord_1002", "usr_bob", `[{"productId":"tuna-pate-12x85g","quantity":1}]`, 1599, "placed", 2 * time.Hour},
		{"ord_1003", "usr_carol", `[{"productId":"feather-wand","quantity":1}]`, 699, "cancelled", 90 * time.Minute},
		{"ord_1004", "usr_alice", `[{"productId":"feather-wand","quantity":2}]`, 1398, "placed", time.Hour},
	}
	seedProducts = []seedProduct{
		{"salmon-kibble-2kg", "Salmon kibble, 2 kg", 2499, 12},
		{"tuna-pate-12x85g", "Tuna pâté, 12 × 85 g", 1599, 30},
		{"feather-wand", "Feather wand", 699, 25},
	}
)

// Seed inserts the seed orders (ord_1001 to ord_1004, three of them placed and none
// invoiced) and products (salmon-kibble-2kg with 12 in stock, tuna-pate-12x85g,
// feather-wand) that are missing, leaving the rows that exist alone, so it is safe at
// every start of every instance. ctx bounds the statements; errors are the database's,
// wrapped.
func Seed(ctx context.Context, db pglock.Execer) error {
	for _, o := range seedOrders {
		if _, err := db.Exec(ctx, `INSERT INTO orders (id, user_id, items, total, status, placed_at)
			VALUES ($1, $2, $3, $4, $5, now() - $6 * interval '1 second') ON CONFLICT (id) DO NOTHING`,
			o.id, o.userID, o.items, o.total, o.status, o.placedAgo.Seconds()); err != nil {
			return fmt.Errorf("shop: seed order %s: %w", o.id, err)
		}
	}
	for _, p := range seedProducts {
		if _, err := db.Exec(ctx, `INSERT INTO products (id, name, price, in_stock) VALUES ($1, $2, $3, $4)
			ON CONFLICT (id) DO NOTHING`, p.id, p.name, p.price, p.inStock); err != nil {
			return fmt.Errorf("shop: seed product %s: %w", p.id, err)
		}
	}
	return nil
}

// Reset deletes every order and product and puts the seed data back, in one
// transaction: the state the tutorial starts from. ctx bounds it; errors are the
// database's, wrapped.
func Reset(ctx context.Context, pool *pgxpool.Pool) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "TRUNCATE orders, products"); err != nil {
			return fmt.Errorf("shop: reset: %w", err)
		}
		return Seed(ctx, tx)
	})
}
