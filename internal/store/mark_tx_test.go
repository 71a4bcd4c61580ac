package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock/internal/store"
	"github.com/pgfence/pglock/pglocktest"
)

// A waiter's attempt on a store built on the caller's transaction (acquireOrWant, the
// listener's path) that finds the key held marks it wanted: the mark must not make the
// caller's commit asynchronous, as lock_acquire_or_want's set_config would for the rest
// of the transaction. The caller's synchronous_commit is the same after the attempt as
// before, and the mark is made (the release will notify).
func TestStoreMarkInTheCallersTransactionKeepsItsCommitDurable(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t)
	ctx := t.Context()
	key := "tx-mark/" + t.Name()
	holder := store.NewPostgres(pool)
	_, ok, err := holder.Acquire(ctx, key, "holder", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	marker, ok := store.NewPostgres(tx).(store.Wanter)
	require.True(t, ok, "the PostgreSQL store marks keys")
	var before, after string
	require.NoError(t, tx.QueryRow(ctx, "SHOW synchronous_commit").Scan(&before))
	_, acquired, wanted, err := marker.AcquireOrWant(ctx, key, "waiter", time.Minute)
	require.NoError(t, err)
	require.False(t, acquired, "the key is held")
	require.True(t, wanted, "the held key is marked")
	require.NoError(t, tx.QueryRow(ctx, "SHOW synchronous_commit").Scan(&after))
	require.Equal(t, before, after, "synchronous_commit of the caller's transaction, which its COMMIT obeys")
	require.NoError(t, tx.Commit(ctx))

	var marked bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT wanted_at IS NOT NULL FROM pglock.locks WHERE key = $1", key).Scan(&marked))
	require.True(t, marked, "the mark was committed with the caller's transaction")
}
