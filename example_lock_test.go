package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pglock"
)

// A payment is written under its lock, fenced by the lock's token: the second holder of
// the key writes with a greater token, and a late write from the first holder (paused
// past its lease by a garbage collector, swap or SIGSTOP, then running again) is refused.
func ExampleClient_WithLock() {
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
	client, err := pglock.New(pool)
	if err != nil {
		panic(err)
	}
	defer client.Close(ctx)

	// fencing_token keeps the token of the last write to the row.
	_, err = pool.Exec(ctx, `
		DROP TABLE IF EXISTS payments;
		CREATE TABLE payments (id bigint PRIMARY KEY, status text NOT NULL, fencing_token bigint NOT NULL DEFAULT 0);
		INSERT INTO payments (id, status) VALUES (42, 'pending')`)
	if err != nil {
		panic(err)
	}
	setStatus := func(ctx context.Context, token int64, status string) (rowsWritten int64, err error) {
		return pglock.ExecFenced(ctx, pool, "UPDATE payments SET status = $1 WHERE id = $2",
			"fencing_token", token, status, 42)
	}

	var firstToken int64
	err = client.WithLock(ctx, "payment:42", func(ctx context.Context) error {
		lock, _ := pglock.FromContext(ctx)
		firstToken = lock.Token()
		n, err := setStatus(ctx, lock.Token(), "authorized")
		fmt.Println("first holder: rows written:", n)
		return err
	}, pglock.Wait(5*time.Second))
	if err != nil {
		panic(err)
	}

	err = client.WithLock(ctx, "payment:42", func(ctx context.Context) error {
		lock, _ := pglock.FromContext(ctx)
		n, err := setStatus(ctx, lock.Token(), "paid")
		fmt.Println("next holder: rows written:", n, "greater token:", lock.Token() > firstToken)
		return err
	}, pglock.Wait(5*time.Second))
	if err != nil {
		panic(err)
	}

	n, err := setStatus(ctx, firstToken, "authorized")
	if err != nil {
		panic(err)
	}
	fmt.Println("first holder, late: rows written:", n)

	var status string
	if err := pool.QueryRow(ctx, "SELECT status FROM payments WHERE id = 42").Scan(&status); err != nil {
		panic(err)
	}
	fmt.Println("status:", status)
	// Output:
	// first holder: rows written: 1
	// next holder: rows written: 1 greater token: true
	// first holder, late: rows written: 0
	// status: paid
}

// TryAcquire makes one attempt: a key that a live holder has is ErrNotAcquired.
func ExampleClient_TryAcquire() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	client, err := pglock.New(pool)
	if err != nil {
		panic(err)
	}
	defer client.Close(ctx)

	lock, err := client.TryAcquire(ctx, "invoices:nightly-export")
	if err != nil {
		panic(err)
	}
	fmt.Println("held:", lock.Held())

	// Every acquisition is an owner of its own, even on the same client.
	_, err = client.TryAcquire(ctx, "invoices:nightly-export")
	fmt.Println("second attempt: not acquired:", errors.Is(err, pglock.ErrNotAcquired))

	if err := lock.Release(ctx); err != nil {
		panic(err)
	}
	fmt.Println("held after Release:", lock.Held())
	// Output:
	// held: true
	// second attempt: not acquired: true
	// held after Release: false
}

// Acquire waits for a held key: its holder's release wakes it at once.
func ExampleClient_Acquire() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	client, err := pglock.New(pool)
	if err != nil {
		panic(err)
	}
	defer client.Close(ctx)

	holder, err := client.TryAcquire(ctx, "invoices:nightly-export")
	if err != nil {
		panic(err)
	}
	time.AfterFunc(100*time.Millisecond, func() { _ = holder.Release(ctx) }) // the holder's work ends

	lock, err := client.Acquire(ctx, "invoices:nightly-export", pglock.Wait(time.Minute))
	if err != nil {
		panic(err)
	}
	defer lock.Release(ctx)
	fmt.Println("acquired after the release, with a greater token:", lock.Token() > holder.Token())
	// Output:
	// acquired after the release, with a greater token: true
}
