package pglock_test

import (
	"database/sql"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/pglocktest"
)

func TestMemoryStoreContract(t *testing.T) {
	t.Parallel()
	clock := pglocktest.NewManualClock(time.Now())
	pglocktest.TestStore(t, func(*testing.T) pglock.Store { return pglock.NewMemoryStore(clock) }, pglocktest.ContractOptions{
		Concurrent:  true,
		AdvanceTime: clock.Advance,
	})
}

func TestPostgresStoreContract(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t) // 20 connections, raced by 32 callers
	pglocktest.TestStore(t, func(*testing.T) pglock.Store { return pglock.NewPostgresStore(pool) }, pglocktest.ContractOptions{
		Concurrent: true,
		Callers:    32,
		RewindTokens: func(t testing.TB) {
			_, err := pool.Exec(t.Context(), "ALTER SEQUENCE pglock.fencing_token_seq RESTART")
			require.NoError(t, err)
		},
	})
}

func TestSQLStoreContract(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("pgx", pglocktest.PostgresURL(t))
	require.NoError(t, err)
	db.SetMaxOpenConns(20)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	pglocktest.TestStore(t, func(*testing.T) pglock.Store { return pglock.NewSQLStore(db) }, pglocktest.ContractOptions{
		Concurrent: true,
		Callers:    32,
	})
}
