package pglock_test

import (
	"context"
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
		store func(tx pgx.Tx) pglock.Store
	}{
		{"on the pgx.Tx", func(tx pgx.Tx) pglock.Store { return pglock.NewPostgresStore(tx) }},
		{"on the *pgx.Conn inside its transaction", func(tx pgx.Tx) pglock.Store { return pglock.NewPostgresStore(tx.Conn()) }},
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

			_, ok, err := store.Acquire(ctx, "tx:"+tc.name, "me", time.Minute)
			require.NoError(t, err)
			require.True(t, ok)
			var before, after string
			require.NoError(t, tx.QueryRow(ctx, "SHOW synchronous_commit").Scan(&before))
			released, err := store.Release(ctx, "tx:"+tc.name, "me")
			require.NoError(t, err)
			require.True(t, released)
			require.NoError(t, tx.QueryRow(ctx, "SHOW synchronous_commit").Scan(&after))
			require.Equal(t, before, after, "synchronous_commit of the caller's transaction, which its COMMIT obeys")
			require.NoError(t, tx.Commit(ctx))

			// Outside a transaction the release is a statement of its own, asynchronous,
			// and leaves the connection's setting alone.
			_, ok, err = store.Acquire(ctx, "tx:after:"+tc.name, "me", time.Minute)
			if tc.name == "on the pgx.Tx" {
				require.Error(t, err, "the transaction is over")
				return
			}
			require.NoError(t, err)
			require.True(t, ok)
			released, err = store.Release(ctx, "tx:after:"+tc.name, "me")
			require.NoError(t, err)
			require.True(t, released)
			require.NoError(t, conn.QueryRow(ctx, "SHOW synchronous_commit").Scan(&after))
			require.Equal(t, before, after)
		})
	}
}
