package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/pglocktest"
)

// A fenced transaction: a transaction that did a FenceHeld write, so that lock_held
// row-locked the lock's row, and that is still open. These tests pin down what that row
// lock must and must not block: under READ COMMITTED it blocks every takeover but no
// renewal (issue path 2); under REPEATABLE READ and SERIALIZABLE it never lets a stale
// snapshot write.

// fencedTxDB returns a pool on a fresh migrated database with a table to write to.
func fencedTxDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := pglocktest.Postgres(t)
	_, err := pool.Exec(t.Context(), `CREATE TABLE stock (id int PRIMARY KEY, n int NOT NULL);
		INSERT INTO stock VALUES (1, 0)`)
	require.NoError(t, err)
	return pool
}

// fencedWrite sets stock row 1 to n, fenced by FenceHeld on key and token, and returns
// how many rows it wrote.
func fencedWrite(ctx context.Context, db pglock.Execer, key string, token int64, n int) (int64, error) {
	q, args, err := pglock.FenceHeld("UPDATE stock SET n = $1 WHERE id = 1", key, token, n)
	if err != nil {
		return 0, err
	}
	tag, err := db.Exec(ctx, q, args...)
	return tag.RowsAffected(), err
}

// stockValue reads stock row 1.
func stockValue(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT n FROM stock WHERE id = 1").Scan(&n))
	return n
}

// TestFencedTxOpenPastTheTTLCostsNoLockItsRenewal is issue path 2: a fenced transaction
// on lock A stays open longer than the ttl. Its row lock must not hold up the client's
// batched renewal, or the batch times out and every lock of the client is lost, B too.
func TestFencedTxOpenPastTheTTLCostsNoLockItsRenewal(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := fencedTxDB(t)
	// The client renews when the test moves its clock; the database keeps its leases
	// however slow the machine.
	const ttl = time.Minute
	clock := pglocktest.NewManualClock(time.Now())
	c := newClient(t, pglock.NewPostgresStore(pool), pglock.TTL(ttl), pglock.WithClock(clock))
	a, err := c.TryAcquire(ctx, "fenced:a")
	require.NoError(t, err)
	b, err := c.TryAcquire(ctx, "fenced:b")
	require.NoError(t, err)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	written, err := fencedWrite(ctx, tx, a.Key(), a.Token(), 5)
	require.NoError(t, err)
	require.EqualValues(t, 1, written)

	requireRenewedThrough(t, pool, clock, ttl, a, b) // renewals fall due while tx is open, past the first ttl
	require.Equal(t, []string{"fenced:a", "fenced:b"}, liveKeys(t, pool), "both renewed while the fenced tx was open")
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, 5, stockValue(t, pool))
	require.NoError(t, a.Release(ctx))
	require.NoError(t, b.Release(ctx))
}

// TestFencedTxOpenRefusesEveryTakeoverUntilItEnds: while the fenced transaction is open
// (and its holder keeps renewing through it) no other client takes the key; after the
// commit and the release, another client does, with a greater token.
func TestFencedTxOpenRefusesEveryTakeoverUntilItEnds(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := fencedTxDB(t)
	store := pglock.NewPostgresStore(pool)
	// The holder renews when the test moves its clock; the database keeps its lease
	// however slow the machine.
	const ttl = time.Minute
	clock := pglocktest.NewManualClock(time.Now())
	holder := newClient(t, store, pglock.TTL(ttl), pglock.WithClock(clock))
	other := newClient(t, store, pglock.TTL(ttl))
	a, err := holder.TryAcquire(ctx, "fenced:a")
	require.NoError(t, err)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	written, err := fencedWrite(ctx, tx, a.Key(), a.Token(), 5)
	require.NoError(t, err)
	require.EqualValues(t, 1, written)

	// Before the holder's renewals, and after them, past its first ttl.
	_, err = other.TryAcquire(ctx, a.Key())
	require.ErrorIs(t, err, pglock.ErrNotAcquired)
	requireRenewedThrough(t, pool, clock, ttl, a)
	_, err = other.TryAcquire(ctx, a.Key())
	require.ErrorIs(t, err, pglock.ErrNotAcquired)
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, a.Release(ctx))
	b, err := other.TryAcquire(ctx, a.Key())
	require.NoError(t, err)
	require.Greater(t, b.Token(), a.Token())
	require.NoError(t, b.Release(ctx))
}

// TestFencedTxKeepsAnExpiredLockFromAnAcquire: the lock of an open fenced transaction is
// renewed (a new row version, which carries the transaction's row lock) and then
// expires. An acquisition meets the locked row and loses at once, without waiting for
// the transaction; once it commits, the key is taken with a greater token.
func TestFencedTxKeepsAnExpiredLockFromAnAcquire(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := fencedTxDB(t)
	store := pglock.NewPostgresStore(pool)
	// A clock that never moves: the holder's renewer stays out of the way.
	holder := newClient(t, store, pglock.TTL(time.Minute), pglock.WithClock(pglocktest.NewManualClock(time.Now())))
	other := newClient(t, store, pglock.TTL(time.Minute))
	a, err := holder.TryAcquire(ctx, "fenced:a")
	require.NoError(t, err)
	start := time.Now()
	_, err = other.TryAcquire(ctx, a.Key()) // a like call with nothing to wait for
	require.ErrorIs(t, err, pglock.ErrNotAcquired)
	ref := time.Since(start)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	written, err := fencedWrite(ctx, tx, a.Key(), a.Token(), 5)
	require.NoError(t, err)
	require.EqualValues(t, 1, written)

	renewCtx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	renewed, err := pglock.InternalStore(store).Renew(renewCtx, a.Key(), a.Owner(), 50*time.Millisecond)
	require.NoError(t, err, "the renewal waited for the fenced tx")
	require.True(t, renewed)
	require.Eventually(t, func() bool { return len(liveKeys(t, pool)) == 0 }, 5*time.Second, 10*time.Millisecond,
		"the lease expires on the database clock")

	tryCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	start = time.Now()
	_, err = other.TryAcquire(tryCtx, a.Key())
	require.ErrorIs(t, err, pglock.ErrNotAcquired, "the row of an open fenced tx is not taken, even expired")
	require.NotErrorIs(t, err, context.DeadlineExceeded, "the acquisition waited for the fenced tx")
	requirePrompt(t, time.Since(start), time.Second, ref, "the acquisition waited for the fenced tx")

	written, err = fencedWrite(ctx, tx, a.Key(), a.Token(), 6)
	require.NoError(t, err)
	require.Zero(t, written, "an expired lock writes nothing")
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, 5, stockValue(t, pool))
	b, err := other.TryAcquire(ctx, a.Key())
	require.NoError(t, err)
	require.Greater(t, b.Token(), a.Token())
	require.NoError(t, b.Release(ctx))
}

// TestFencedTxReadsTheDatabaseClockAtEachWrite: in one READ COMMITTED transaction
// opened while the lock was live, a fenced write after the lock expired on the database
// clock writes nothing. lock_held on now(), the transaction's start, would let it write.
func TestFencedTxReadsTheDatabaseClockAtEachWrite(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := fencedTxDB(t)
	// The first write must come while the lease is live on the database clock, however
	// slow the machine: a ttl of a minute, the lease ended by the test after the write.
	holder := newClient(t, pglock.NewPostgresStore(pool), pglock.TTL(time.Minute),
		pglock.WithClock(pglocktest.NewManualClock(time.Now()))) // never renews: a paused holder
	a, err := holder.TryAcquire(ctx, "fenced:a")
	require.NoError(t, err)

	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	written, err := fencedWrite(ctx, tx, a.Key(), a.Token(), 5)
	require.NoError(t, err)
	require.EqualValues(t, 1, written, "the live holder writes")

	pglock.EndLease(t, pool, a.Key()) // after the transaction's start: now() is before the lease's end
	written, err = fencedWrite(ctx, tx, a.Key(), a.Token(), 6)
	require.NoError(t, err)
	require.Zero(t, written, "a write after the lease's end, in the same transaction, writes nothing")
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, 5, stockValue(t, pool))
}

// TestFencedTxWithAnOlderSnapshotNeverWrites: under REPEATABLE READ and SERIALIZABLE a
// fenced write whose snapshot predates a takeover sees the old holder live in its
// snapshot. It must fail with a serialization error (or write nothing), never write:
// after a release and an acquisition, and after a forced takeover, an UPDATE of the
// owner and the token that locks no row first (FOR KEY SHARE would miss that one).
func TestFencedTxWithAnOlderSnapshotNeverWrites(t *testing.T) {
	t.Parallel()
	takeovers := []struct {
		name string
		take func(ctx context.Context, pool *pgxpool.Pool, store *pglock.Store) error
	}{
		{"after a release and an acquisition", func(ctx context.Context, _ *pgxpool.Pool, store *pglock.Store) error {
			if released, err := pglock.InternalStore(store).Release(ctx, "fenced:a", "old"); err != nil || !released {
				return fmt.Errorf("release: %v, %w", released, err)
			}
			if _, ok, err := pglock.InternalStore(store).Acquire(ctx, "fenced:a", "new", time.Minute); err != nil || !ok {
				return fmt.Errorf("acquire: %v, %w", ok, err)
			}
			return nil
		}},
		{"after a forced takeover", func(ctx context.Context, pool *pgxpool.Pool, _ *pglock.Store) error {
			_, err := pool.Exec(ctx, `UPDATE pglock.locks SET owner = 'new',
				fencing_token = nextval('pglock.fencing_token_seq') WHERE key = 'fenced:a'`)
			return err
		}},
	}
	for _, iso := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
		t.Run(string(iso), func(t *testing.T) {
			t.Parallel()
			t.Run("writes while the lock is ours", func(t *testing.T) {
				t.Parallel()
				ctx := t.Context()
				pool := fencedTxDB(t)
				token, ok, err := pglock.InternalStore(pglock.NewPostgresStore(pool)).Acquire(ctx, "fenced:a", "old", time.Minute)
				require.NoError(t, err)
				require.True(t, ok)
				tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
				require.NoError(t, err)
				defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
				var n int
				require.NoError(t, tx.QueryRow(ctx, "SELECT n FROM stock WHERE id = 1").Scan(&n)) // the snapshot
				written, err := fencedWrite(ctx, tx, "fenced:a", token, 5)
				require.NoError(t, err)
				require.EqualValues(t, 1, written)
				require.NoError(t, tx.Commit(ctx))
				require.Equal(t, 5, stockValue(t, pool))
			})
			for _, takeover := range takeovers {
				t.Run("never writes "+takeover.name+" its snapshot does not see", func(t *testing.T) {
					t.Parallel()
					ctx := t.Context()
					pool := fencedTxDB(t)
					store := pglock.NewPostgresStore(pool)
					old, ok, err := pglock.InternalStore(store).Acquire(ctx, "fenced:a", "old", time.Minute)
					require.NoError(t, err)
					require.True(t, ok)
					tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
					require.NoError(t, err)
					defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
					var n int
					require.NoError(t, tx.QueryRow(ctx, "SELECT n FROM stock WHERE id = 1").Scan(&n)) // the snapshot

					require.NoError(t, takeover.take(ctx, pool, store))
					holder, err := storeHolder(ctx, store, "fenced:a")
					require.NoError(t, err)
					require.Equal(t, "new", holder.Owner)
					require.Greater(t, holder.Token, old)

					written, err := fencedWrite(ctx, tx, "fenced:a", old, 6)
					if err == nil && written > 0 {
						err = tx.Commit(ctx) // SERIALIZABLE may refuse only at commit
					}
					if err != nil {
						var pgErr *pgconn.PgError
						require.True(t, errors.As(err, &pgErr), "%v", err)
						require.Equal(t, "40001", pgErr.Code, "serialization_failure: %v", err)
					} else {
						require.Zero(t, written)
					}
					require.Zero(t, stockValue(t, pool), "the stale snapshot wrote")
				})
			}
		})
	}
}
