package pglock_test

import (
	"context"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pglock"
)

func ExampleFenceUpdate() {
	var token, count, id int64 = 7, 9, 42 // token: the lock's Token()
	query, args, err := pglock.FenceUpdate("UPDATE products SET in_stock = $1 WHERE id = $2",
		"stock_fencing_token", token, count, id)
	if err != nil {
		panic(err)
	}
	fmt.Println(query)
	fmt.Println(args)
	// Output:
	// UPDATE products SET in_stock = $1, "stock_fencing_token" = $3 WHERE (id = $2) AND ("stock_fencing_token" IS NULL OR "stock_fencing_token" <= $3)
	// [9 42 7]
}

// A lock fence needs no token column: the write happens only while the lock is the
// live one, on the database clock.
func ExampleFenceHeld() {
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
	_, err = pool.Exec(ctx, `
		DROP TABLE IF EXISTS shipments;
		CREATE TABLE shipments (id bigint PRIMARY KEY, carrier text NOT NULL);
		INSERT INTO shipments VALUES (7, 'none')`)
	if err != nil {
		panic(err)
	}

	lock, err := client.TryAcquire(ctx, "shipment:7")
	if err != nil {
		panic(err)
	}
	query, args, err := pglock.FenceHeld("UPDATE shipments SET carrier = $1 WHERE id = $2",
		lock.Key(), lock.Token(), "dhl", 7)
	if err != nil {
		panic(err)
	}
	tag, err := pool.Exec(ctx, query, args...)
	if err != nil {
		panic(err)
	}
	fmt.Println("while held: rows written:", tag.RowsAffected())

	if err := lock.Release(ctx); err != nil {
		panic(err)
	}
	tag, err = pool.Exec(ctx, query, args...)
	if err != nil {
		panic(err)
	}
	fmt.Println("after Release: rows written:", tag.RowsAffected())
	// Output:
	// while held: rows written: 1
	// after Release: rows written: 0
}
