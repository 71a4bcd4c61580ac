package pglock_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/lib/pq" // the "postgres" database/sql driver
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/store/storetest"
	"github.com/pgfence/pglock/pglocktest"
)

// NewSQLStore and the fences under database/sql, with lib/pq (the most used
// database/sql driver for PostgreSQL) and pgx's stdlib.

var sqlDrivers = []string{"postgres", "pgx"}

func TestLibPQStoreContract(t *testing.T) {
	t.Parallel()
	db := openSQL(t, "postgres", pglocktest.PostgresURL(t))
	testStore(t, func(*testing.T) *pglock.Store { return pglock.NewSQLStore(db) }, storetest.Options{
		Concurrent: true,
		Callers:    32,
		RewindTokens: func(t testing.TB) {
			_, err := db.ExecContext(t.Context(), "ALTER SEQUENCE pglock.fencing_token_seq RESTART")
			require.NoError(t, err)
		},
	})
}

// Over database/sql an application role with README.md's grants passes the contract,
// and one without them gets storeError's advice around the driver's error.
func TestLibPQStoreContractAsAnApplicationRole(t *testing.T) {
	t.Parallel()
	dbURL := pglocktest.PostgresURL(t)
	db := openSQL(t, "postgres", newRole(t, dbURL, appGrants...))
	// Without the races: they run over lib/pq as the owner above, and as the application
	// role over pgx (TestRoleWithReadmeGrantsPassesTheStoreContract).
	testStore(t, func(*testing.T) *pglock.Store { return pglock.NewSQLStore(db) }, storetest.Options{})

	denied := pglock.NewSQLStore(openSQL(t, "postgres", newRole(t, dbURL, appGrants[0])))
	_, _, err := pglock.InternalStore(denied).Acquire(t.Context(), "libpq:k", "o", time.Minute)
	var pqErr *pq.Error
	require.True(t, errors.As(err, &pqErr), "%v", err)
	require.EqualValues(t, "42501", pqErr.Code)
	require.ErrorContains(t, err, "GRANT USAGE ON SCHEMA pglock and EXECUTE ON ALL FUNCTIONS IN SCHEMA pglock")
}

func TestPqAndPgxStdlibFencedWritesThroughDatabaseSQL(t *testing.T) {
	t.Parallel()
	for _, driver := range sqlDrivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			db := openSQL(t, driver, pglocktest.PostgresURL(t))
			_, err := db.ExecContext(ctx, `CREATE TABLE stock (id int PRIMARY KEY, n int NOT NULL, token bigint NOT NULL DEFAULT 0)`)
			require.NoError(t, err)
			_, err = db.ExecContext(ctx, `INSERT INTO stock VALUES (1, 0, 0)`)
			require.NoError(t, err)
			store := pglock.NewSQLStore(db)
			old, ok, err := pglock.InternalStore(store).Acquire(ctx, "sql:fence", "old", time.Minute)
			require.NoError(t, err)
			require.True(t, ok)

			execFenceUpdate := func(ex interface {
				ExecContext(context.Context, string, ...any) (sql.Result, error)
			}, token int64, n int) int64 {
				t.Helper()
				q, args, err := pglock.FenceUpdate("UPDATE stock SET n = $1 WHERE id = $2", "token", token, n, 1)
				require.NoError(t, err)
				res, err := ex.ExecContext(ctx, q, args...)
				require.NoError(t, err)
				rows, err := res.RowsAffected()
				require.NoError(t, err)
				return rows
			}
			execFenceHeld := func(ex interface {
				ExecContext(context.Context, string, ...any) (sql.Result, error)
			}, token int64, n int) int64 {
				t.Helper()
				q, args, err := pglock.FenceHeld("UPDATE stock SET n = $1 WHERE id = $2", "sql:fence", token, n, 1)
				require.NoError(t, err)
				res, err := ex.ExecContext(ctx, q, args...)
				require.NoError(t, err)
				rows, err := res.RowsAffected()
				require.NoError(t, err)
				return rows
			}

			// The holder writes, inside a transaction too; its FOR KEY SHARE keeps the key
			// from any takeover until the transaction ends.
			require.EqualValues(t, 1, execFenceUpdate(db, old, 1))
			tx, err := db.BeginTx(ctx, nil)
			require.NoError(t, err)
			require.EqualValues(t, 1, execFenceHeld(tx, old, 2))
			_, err = db.ExecContext(ctx, "UPDATE pglock.locks SET expires_at = clock_timestamp() WHERE key = 'sql:fence'")
			require.NoError(t, err)
			_, ok, err = pglock.InternalStore(store).Acquire(ctx, "sql:fence", "new", time.Minute)
			require.NoError(t, err)
			require.False(t, ok, "an open fenced transaction keeps even an expired key")
			require.NoError(t, tx.Commit())

			// Taken over: the old holder's writes write nothing, through both fences.
			newer, ok, err := pglock.InternalStore(store).Acquire(ctx, "sql:fence", "new", time.Minute)
			require.NoError(t, err)
			require.True(t, ok)
			require.EqualValues(t, 1, execFenceUpdate(db, newer, 3))
			require.Zero(t, execFenceHeld(db, old, 4))
			require.Zero(t, execFenceUpdate(db, old, 5))
			require.EqualValues(t, 1, execFenceHeld(db, newer, 6))
			var n int
			require.NoError(t, db.QueryRowContext(ctx, "SELECT n FROM stock WHERE id = 1").Scan(&n))
			require.Equal(t, 6, n)
		})
	}
}
