// Command quickstart shows pglock in a few seconds: two instances of an application
// contend for a lock, one waits for the other's release, and a paused instance loses
// its lock to the other and has its late write refused by the fencing token.
//
// It finds a PostgreSQL server with pglockdev (DATABASE_URL, else the libpq defaults,
// else an embedded PostgreSQL: for local development only), works in a database of its
// own (pglock_quickstart, created if missing), and migrates the pglock schema there.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/pglockdev"
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
	srv, err := pglockdev.Find(ctx, "DATABASE_URL")
	if err != nil {
		return err
	}
	defer srv.Stop()
	fmt.Printf("PostgreSQL: %s\n", srv.How)
	url, err := srv.Database(ctx, database)
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
	clockA := &pausableClock{} // A can be paused, as a process is by SIGSTOP
	a, err := pglock.New(pool, pglock.WithInstanceName("instance-a"), pglock.TTL(time.Second),
		pglock.WithClock(clockA), pglock.WithLogger(logger))
	if err != nil {
		return err
	}
	defer a.Close(context.WithoutCancel(ctx))
	b, err := pglock.New(pool, pglock.WithInstanceName("instance-b"), pglock.TTL(time.Second), pglock.WithLogger(logger))
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
	clockA.pause()
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

	step("5. A's clock moves on, past its lease's deadline: A counts the lock lost and cancels its context")
	clockA.resume()
	select {
	case <-stockA.Context().Done():
		fmt.Printf("   A's lock context: %v\n", context.Cause(stockA.Context()))
	case <-time.After(5 * time.Second):
		return errors.New("quickstart: the lock context of instance A was not cancelled")
	}
	if err := stockB.Release(ctx); err != nil {
		return err
	}
	step("Done. Locks are rows in pglock.locks; see README.md for jobs, leader election and fencing.")
	return nil
}

func step(s string) { fmt.Println("\n" + s) }

// pausableClock is the real clock for a pglock.Client, except that while it is
// paused its time stands still and the calls that fall due wait for resume: the
// client renews nothing, as in a process stopped by a long GC pause, swapping or
// SIGSTOP. (Tests use pglocktest.ManualClock, which moves only when told to.)
type pausableClock struct {
	mu       sync.Mutex
	pausedAt time.Time // zero while running
	due      []func()  // the calls that fell due while paused, in order
}

func (c *pausableClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.pausedAt.IsZero() {
		return c.pausedAt
	}
	return time.Now()
}

func (c *pausableClock) AfterFunc(d time.Duration, f func()) pglock.Timer {
	return time.AfterFunc(d, func() {
		c.mu.Lock()
		if !c.pausedAt.IsZero() {
			c.due = append(c.due, f)
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		f()
	})
}

func (c *pausableClock) pause() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pausedAt = time.Now()
}

// resume lets time move again and makes the calls that fell due meanwhile.
func (c *pausableClock) resume() {
	c.mu.Lock()
	due := c.due
	c.pausedAt, c.due = time.Time{}, nil
	c.mu.Unlock()
	for _, f := range due {
		f()
	}
}
