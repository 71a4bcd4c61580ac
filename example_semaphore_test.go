package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pglock"
)

// Three instances start an invoice export at once; the semaphore lets two in. Each
// permit fences its writes by its own slot and token: a late write from a paused
// holder is refused once its permit has a newer holder.
func ExampleClient_Semaphore() {
	ctx := context.Background()
	databaseURL := os.Getenv("DATABASE_URL")
	if err := pglock.Migrate(ctx, databaseURL); err != nil {
		panic(err)
	}
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	_, err = pool.Exec(ctx, `
		DROP TABLE IF EXISTS export_slots;
		CREATE TABLE export_slots (slot int PRIMARY KEY, batch text, fencing_token bigint NOT NULL DEFAULT 0);
		INSERT INTO export_slots (slot) VALUES (1), (2)`)
	if err != nil {
		panic(err)
	}

	var permits []*pglock.Lock
	for _, instance := range []string{"api-1", "api-2", "api-3"} {
		client, err := pglock.New(pool, pglock.WithInstanceName(instance))
		if err != nil {
			panic(err)
		}
		defer client.Close(ctx)
		exports, err := client.Semaphore("invoice-export", 2)
		if err != nil {
			panic(err)
		}
		permit, err := exports.TryAcquire(ctx)
		if errors.Is(err, pglock.ErrNotAcquired) {
			fmt.Printf("%s: both permits are taken\n", instance)
			continue
		}
		if err != nil {
			panic(err)
		}
		n, err := pglock.ExecFenced(ctx, pool, "UPDATE export_slots SET batch = $1 WHERE slot = $2",
			"fencing_token", permit.Token(), "batch of "+instance, permit.Permit())
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s: exports with permit %d of %q (rows written: %d)\n", instance, permit.Permit(), permit.Key(), n)
		permits = append(permits, permit)
	}
	for _, p := range permits {
		if err := p.Release(ctx); err != nil {
			panic(err)
		}
	}
	// Output:
	// api-1: exports with permit 1 of "invoice-export" (rows written: 1)
	// api-2: exports with permit 2 of "invoice-export" (rows written: 1)
	// api-3: both permits are taken
}
