//line /work/main/README.md:50
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pglock"
)

func main() {
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(context.Background(), os.Getenv("DATABASE_URL"), logger); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, databaseURL string, logger *slog.Logger) error {
	// Start-up is bounded: a database that never answers is an error after 10 s, not a hang.
	startup, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pglock.Migrate(startup, databaseURL); err != nil { // schema pglock; safe from many instances at once
		return err
	}
	pool, err := pgxpool.New(startup, databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := pool.Ping(startup); err != nil { // the pool's first connection
		return err
	}
	client, err := pglock.New(pool, pglock.WithLogger(logger)) // ttl 30 s, renewed every 10 s
	if err != nil {
		return err
	}
	defer client.Close(context.WithoutCancel(ctx)) // hands every lease back at once

	_, err = pool.Exec(startup, `CREATE TABLE IF NOT EXISTS payments
			(id bigint PRIMARY KEY, status text NOT NULL, fencing_token bigint NOT NULL DEFAULT 0);
		INSERT INTO payments (id, status) VALUES (42, 'due') ON CONFLICT (id) DO NOTHING`)
	if err != nil {
		return err
	}

	// A lock you take yourself: fn's ctx is cancelled if the lock is lost; the token fences the write.
	err = client.WithLock(ctx, "payment:42", func(ctx context.Context) error {
		lock, _ := pglock.FromContext(ctx)
		n, err := pglock.ExecFenced(ctx, pool,
			"UPDATE payments SET status = 'paid' WHERE id = $1", "fencing_token", lock.Token(), 42)
		if err != nil {
			return err
		}
		if n == 0 { // the row carries a greater token: a later holder wrote it, and this write is stale
			return fmt.Errorf("payment 42: write refused: a holder with a token above %d wrote it", lock.Token())
		}
		logger.Info("marked payment 42 paid", "rows_written", n, "token", lock.Token())
		return nil
	}, pglock.Wait(2*time.Second))
	if errors.Is(err, pglock.ErrNotAcquired) {
		logger.Info("payment 42 is being paid elsewhere") // someone else held it for 2 s
		return nil
	}
	return err
}
