package pglock_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/pglocktest"
)

// setStock is the code under test: it writes a product's stock count, fenced by the
// token of the lock its caller holds.
func setStock(ctx context.Context, db pglock.Execer, token int64, product string, count int) (rowsWritten int64, err error) {
	return pglock.ExecFenced(ctx, db, "UPDATE stock SET in_stock = $1 WHERE product = $2",
		"fencing_token", token, count, product)
}

// testPausedInstanceWriteIsRefused is a test of yours, TestPausedInstanceWriteIsRefused
// in your _test.go file. Instance A stands for a paused process: its clock moves only
// when the test says so, so it does not renew its lock. The database expires the lock
// after its ttl, instance B takes it over, and A's late write is refused.
func testPausedInstanceWriteIsRefused(t *testing.T) {
	ctx := context.Background()
	pool := pglocktest.Postgres(t) // a fresh database with the pglock schema, dropped when the test ends
	_, err := pool.Exec(ctx, `
		CREATE TABLE stock (product text PRIMARY KEY, in_stock int NOT NULL, fencing_token bigint NOT NULL DEFAULT 0);
		INSERT INTO stock VALUES ('salmon-kibble-2kg', 12)`)
	require.NoError(t, err)

	clock := pglocktest.NewManualClock(time.Now())
	a := newTestClient(t, pool, pglock.WithClock(clock), pglock.TTL(200*time.Millisecond))
	b := newTestClient(t, pool)

	lockA, err := a.TryAcquire(ctx, "inventory:salmon-kibble-2kg")
	require.NoError(t, err)
	var lockB *pglock.Lock
	require.Eventually(t, func() bool { // the database expires A's lock after 200 ms
		lockB, err = b.TryAcquire(ctx, "inventory:salmon-kibble-2kg")
		return err == nil
	}, 5*time.Second, 20*time.Millisecond)

	n, err := setStock(ctx, pool, lockB.Token(), "salmon-kibble-2kg", 9)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	n, err = setStock(ctx, pool, lockA.Token(), "salmon-kibble-2kg", 12) // A runs again
	require.NoError(t, err)
	require.Zero(t, n, "the paused instance's write must be refused")

	clock.Advance(time.Second) // A's clock moves: its renewal is refused, its lock is lost
	require.ErrorIs(t, context.Cause(lockA.Context()), pglock.ErrLockLost)
}

// newTestClient returns a client on pool, closed when the test ends.
func newTestClient(t *testing.T, pool *pgxpool.Pool, opts ...pglock.ClientOption) *pglock.Client {
	t.Helper()
	client, err := pglock.New(pool, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, client.Close(context.Background())) })
	return client
}

// This file is a test file of yours: pglocktest.Postgres gives each test a fresh
// database with the pglock schema on the server in PGLOCK_TEST_DATABASE_URL (else the
// libpq defaults, else an embedded PostgreSQL), and a pglocktest.ManualClock makes a
// client a paused process. In your file, testPausedInstanceWriteIsRefused is a Test
// function (go doc shows a file as one example only when it has no Test function).
func Example_pglocktest() {}
