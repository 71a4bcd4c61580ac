package pglock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/pglocktest"
)

// A store built on a transaction of the caller's releases inside that transaction: the
// release must not make the caller's commit asynchronous (lock_release_async's
// set_config lasts until the transaction ends). The caller's synchronous_commit is the
// same after Release as before, whether the store has the pgx.Tx or the *pgx.Conn that
// the transaction runs on.
func TestStoreReleaseInTheCallersTransactionKeepsItsCommitDurable(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t)
	for _, tc := range []struct {
		name  string
		store func(tx pgx.Tx) *pglock.Store
	}{
		{"on the pgx.Tx", func(tx pgx.Tx) *pglock.Store { return pglock.NewPostgresStore(tx) }},
		{"on the *pgx.Conn inside its transaction", func(tx pgx.Tx) *pglock.Store { return pglock.NewPostgresStore(tx.Conn()) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			conn, err := pool.Acquire(ctx)
			require.NoError(t, err)
			defer conn.Release()
			tx, err := conn.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
			store := tc.store(tx)

			_, ok, err := pglock.InternalStore(store).Acquire(ctx, "tx:"+tc.name, "me", time.Minute)
			require.NoError(t, err)
			require.True(t, ok)
			var before, after string
			require.NoError(t, tx.QueryRow(ctx, "SHOW synchronous_commit").Scan(&before))
			released, err := pglock.InternalStore(store).Release(ctx, "tx:"+tc.name, "me")
			require.NoError(t, err)
			require.True(t, released)
			require.NoError(t, tx.QueryRow(ctx, "SHOW synchronous_commit").Scan(&after))
			require.Equal(t, before, after, "synchronous_commit of the caller's transaction, which its COMMIT obeys")
			require.NoError(t, tx.Commit(ctx))

			// Outside a transaction the release is a statement of its own, asynchronous,
			// and leaves the connection's setting alone.
			_, ok, err = pglock.InternalStore(store).Acquire(ctx, "tx:after:"+tc.name, "me", time.Minute)
			if tc.name == "on the pgx.Tx" {
				require.Error(t, err, "the transaction is over")
				return
			}
			require.NoError(t, err)
			require.True(t, ok)
			released, err = pglock.InternalStore(store).Release(ctx, "tx:after:"+tc.name, "me")
			require.NoError(t, err)
			require.True(t, released)
			require.NoError(t, conn.QueryRow(ctx, "SHOW synchronous_commit").Scan(&after))
			require.Equal(t, before, after)
		})
	}
}

// Acquire with Fair on a store inside a transaction of the caller's is refused before
// it writes anything: its wait would hold the key's row locked in that transaction (so
// the release it waits for would wait for it) and its polls would make the caller's
// commit asynchronous.
func TestFairOnAStoreInTheCallersTransactionIsUnsupported(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pglocktest.Postgres(t)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	for name, store := range map[string]*pglock.Store{"pgx.Tx": pglock.NewPostgresStore(tx), "*pgx.Conn": pglock.NewPostgresStore(tx.Conn())} {
		c := newClient(t, store, quiet)
		_, err = c.Acquire(ctx, "fair:tx", pglock.Fair())
		require.ErrorIs(t, err, errors.ErrUnsupported, name)
		sem, err := c.Semaphore("fair:txsem", 2)
		require.NoError(t, err)
		_, err = sem.Acquire(ctx, pglock.Fair())
		require.ErrorIs(t, err, errors.ErrUnsupported, name)
	}
	var rows, waiters int
	require.NoError(t, tx.QueryRow(ctx, "SELECT (SELECT count(*) FROM pglock.locks), (SELECT count(*) FROM pglock.waiters)").Scan(&rows, &waiters))
	require.Zero(t, rows+waiters, "a refused fair acquisition wrote")
}
