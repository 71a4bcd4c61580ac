// Command quickstart shows pglock in a few seconds: two instances of an application
// contend for a lock, one waits for the other's release, and a paused instance loses
// its lock to the other and has its late write refused by the fencing token.
//
// It finds a PostgreSQL server (DATABASE_URL, else the libpq defaults, else an embedded
// PostgreSQL), works in a database of its own (pglock_quickstart, created if missing),
// and migrates the pglock schema there.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/pgserver"
	"github.com/pgfence/pglock/pglocktest"
)

const database = "pglock_quickstart"

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	srv, err := pgserver.Find(ctx, "DATABASE_URL")
	if err != nil {
		return err
	}
	defer srv.Stop()
	fmt.Printf("PostgreSQL: %s\n", srv.How)
	url, err := pgserver.EnsureDatabase(ctx, srv.URL, database)
	if err != nil {
		return err
	}
	if err := pglock.Migrate(ctx, url); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `
		DROP TABLE IF EXISTS quickstart_stock;
		CREATE TABLE quickstart_stock (product text PRIMARY KEY, in_stock int NOT NULL, fencing_token bigint NOT NULL DEFAULT 0);
		INSERT INTO quickstart_stock VALUES ('salmon-kibble-2kg', 12, 0)`); err != nil {
		return err
	}

	// Two instances of one application: two clients on the same database. Lost locks
	// are logged at warn.
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{Level: slog.LevelWarn}))
	pausedClock := pglocktest.NewManualClock(time.Now()) // A's clock moves only when we say: a paused process
	a, err := pglock.New(pool, pglock.WithInstanceName("instance-a"), pglock.WithTTL(time.Second),
		pglock.WithClock(pausedClock), pglock.WithLogger(logger))
	if err != nil {
		return err
	}
	defer a.Close(context.WithoutCancel(ctx))
	b, err := pglock.New(pool, pglock.WithInstanceName("instance-b"), pglock.WithTTL(time.Second), pglock.WithLogger(logger))
	if err != nil {
		return err
	}
	defer b.Close(context.WithoutCancel(ctx))

	step("1. A takes the lock; B finds it held")
	lockA, err := a.TryAcquire(ctx, "invoices:nightly-export", pglock.TTL(time.Minute))
	if err != nil {
		return err
	}
	fmt.Printf("   A holds %q with fencing token %d (owner %s)\n", lockA.Key(), lockA.Token(), lockA.Owner())
	_, err = b.TryAcquire(ctx, "invoices:nightly-export")
	fmt.Printf("   B: %v (errors.Is ErrNotAcquired: %v)\n", err, errors.Is(err, pglock.ErrNotAcquired))

	step("2. B waits; A releases after 500 ms; B gets it with a greater token")
	go func() {
		time.Sleep(500 * time.Millisecond) // A's work
		_ = lockA.Release(ctx)
	}()
	start := time.Now()
	lockB, err := b.Acquire(ctx, "invoices:nightly-export", pglock.Wait(5*time.Second))
	if err != nil {
		return err
	}
	fmt.Printf("   B waited %v and holds it with token %d > %d\n", time.Since(start).Round(10*time.Millisecond), lockB.Token(), lockA.Token())
	if err := lockB.Release(ctx); err != nil {
		return err
	}

	step("3. A takes the stock lock, reads 12 bags, and pauses (GC, swap, SIGSTOP) past its 1 s ttl")
	stockA, err := a.TryAcquire(ctx, "inventory:stock-reconciliation")
	if err != nil {
		return err
	}
	fmt.Printf("   A holds it with token %d\n", stockA.Token())
	time.Sleep(1200 * time.Millisecond) // the database expires A's lease; A, paused, does not renew
	stockB, err := b.TryAcquire(ctx, "inventory:stock-reconciliation")
	if err != nil {
		return err
	}
	fmt.Printf("   1.2 s later B takes it over with token %d; A still believes it holds it: %v\n", stockB.Token(), stockA.Held())
	n, err := pglock.ExecFenced(ctx, pool, "UPDATE quickstart_stock SET in_stock = $1 WHERE product = $2",
		"fencing_token", stockB.Token(), 9, "salmon-kibble-2kg")
	if err != nil {
		return err
	}
	fmt.Printf("   B writes the fresh count, 9 bags: %d row written\n", n)

	step("4. A wakes up and writes its stale count, 12 bags, fenced by its token")
	n, err = pglock.ExecFenced(ctx, pool, "UPDATE quickstart_stock SET in_stock = $1 WHERE product = $2",
		"fencing_token", stockA.Token(), 12, "salmon-kibble-2kg")
	if err != nil {
		return err
	}
	var inStock int
	if err := pool.QueryRow(ctx, "SELECT in_stock FROM quickstart_stock").Scan(&inStock); err != nil {
		return err
	}
	fmt.Printf("   A's write: %d rows written (stale token %d < %d); the shelf says %d bags\n", n, stockA.Token(), stockB.Token(), inStock)

	step("5. A's clock moves: its renewal is refused and its context is cancelled")
	pausedClock.Advance(time.Second)
	var lost *pglock.LockLostError
	if errors.As(context.Cause(stockA.Context()), &lost) {
		fmt.Printf("   A's lock context: %v\n", lost)
	}
	if err := stockB.Release(ctx); err != nil {
		return err
	}
	step("Done. Locks are rows in pglock.locks; see README.md for jobs, leader election and fencing.")
	return nil
}

func step(s string) { fmt.Println("\n" + s) }
