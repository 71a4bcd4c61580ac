package store_test

import (
	"database/sql"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib" // and the "pgx" database/sql driver
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/store"
	"github.com/pgfence/pglock/internal/store/storetest"
	"github.com/pgfence/pglock/pglocktest"
)

func TestMemoryStoreContract(t *testing.T) {
	t.Parallel()
	clock := pglocktest.NewManualClock(time.Now())
	storetest.Run(t, func(*testing.T) storetest.Store { return store.NewMemory(clock) }, storetest.Options{
		Concurrent:  true,
		AdvanceTime: clock.Advance,
	})
}

func TestPostgresStoreContract(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t) // 20 connections, raced by 32 callers
	storetest.Run(t, func(*testing.T) storetest.Store { return store.NewPostgres(pool) }, storetest.Options{
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
	storetest.Run(t, func(*testing.T) storetest.Store { return store.NewSQL(db) }, storetest.Options{
		Concurrent: true,
		Callers:    32,
	})
}

// Every store refuses bad input to its batched renewal and to its holder read before it
// asks the database anything, with the error that names what is wrong, and renews
// nothing of a batch that holds one bad entry.
func TestStoresRefuseBadBatchesAndHolderReads(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pglocktest.Postgres(t)
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	long := strings.Repeat("k", pglock.MaxKeyLength+1)
	renewals := []struct {
		name         string
		keys, owners []string
		ttl          time.Duration
		want         error
		text         string
	}{
		{"more keys than owners", []string{"held", "b"}, []string{"o"}, time.Hour, pglock.ErrInvalidArgument, "2 keys and 1 owners"},
		{"more owners than keys", nil, []string{"o"}, time.Hour, pglock.ErrInvalidArgument, "0 keys and 1 owners"},
		{"an empty key", []string{"held", ""}, []string{"o", "o"}, time.Hour, pglock.ErrInvalidKey, "empty"},
		{"a key with NUL", []string{"held", "a\x00"}, []string{"o", "o"}, time.Hour, pglock.ErrInvalidKey, "NUL"},
		{"a key not UTF-8", []string{"held", "\xff"}, []string{"o", "o"}, time.Hour, pglock.ErrInvalidKey, "UTF-8"},
		{"a key too long", []string{"held", long}, []string{"o", "o"}, time.Hour, pglock.ErrInvalidKey, "501 characters"},
		{"an empty owner", []string{"held", "b"}, []string{"o", ""}, time.Hour, pglock.ErrInvalidArgument, "owner"},
		{"an owner with NUL", []string{"held", "b"}, []string{"o", "o\x00"}, time.Hour, pglock.ErrInvalidArgument, "owner"},
		{"a zero ttl", []string{"held"}, []string{"o"}, 0, pglock.ErrInvalidArgument, "ttl 0s"},
		{"a negative ttl", []string{"held"}, []string{"o"}, -time.Second, pglock.ErrInvalidArgument, "ttl -1s"},
		{"a ttl over the most", []string{"held"}, []string{"o"}, pglock.MaxTTL + time.Second, pglock.ErrInvalidArgument, "ttl"},
	}
	holders := []struct {
		name, key, text string
	}{
		{"an empty key", "", "empty"},
		{"a key with NUL", "a\x00", "NUL"},
		{"a key not UTF-8", "\xff", "UTF-8"},
		{"a key too long", long, "501 characters"},
	}
	for name, store := range map[string]store.Store{
		"Postgres": store.NewPostgres(pool),
		"SQL":      store.NewSQL(db),
		"Memory":   store.NewMemory(nil),
	} {
		t.Run(name, func(t *testing.T) {
			held := name + ":held"
			_, ok, err := store.Acquire(ctx, held, "o", time.Minute)
			require.NoError(t, err)
			require.True(t, ok)
			for _, tc := range renewals {
				t.Run("RenewMany/"+tc.name, func(t *testing.T) {
					keys := slices.Clone(tc.keys)
					if len(keys) > 0 {
						keys[0] = held
					}
					renewed, err := store.RenewMany(ctx, keys, tc.owners, tc.ttl)
					require.ErrorIs(t, err, tc.want)
					require.ErrorContains(t, err, tc.text)
					require.True(t, strings.HasPrefix(err.Error(), "pglock: "), err.Error())
					require.Nil(t, renewed)
					h, err := store.Holder(ctx, held)
					require.NoError(t, err)
					require.True(t, h.Held)
					require.LessOrEqual(t, h.ExpiresIn, time.Minute, "a batch with a bad entry renewed its good one")
				})
			}
			for _, tc := range holders {
				t.Run("Holder/"+tc.name, func(t *testing.T) {
					h, err := store.Holder(ctx, tc.key)
					require.ErrorIs(t, err, pglock.ErrInvalidKey)
					require.ErrorContains(t, err, tc.text)
					require.True(t, strings.HasPrefix(err.Error(), "pglock: "), err.Error())
					require.Zero(t, h)
				})
			}
		})
	}
}
