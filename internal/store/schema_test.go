package store_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock/internal/store"
	"github.com/pgfence/pglock/pglocktest"
)

// TestStoreWithoutSchema: on a database nobody migrated, or migrated by an older
// pglock, every call of both PostgreSQL stores says to run Migrate, and the server's
// error stays reachable with errors.As.
func TestStoreWithoutSchema(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, setup, code string
	}{
		{"SaysToMigrateWhenTheSchemaIsMissing", "DROP SCHEMA pglock CASCADE", "3F000"},
		{"SaysToMigrateWhenTheFunctionsAreMissing", "DROP SCHEMA pglock CASCADE; CREATE SCHEMA pglock", "42883"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			pool := pglocktest.Pool(t, pglocktest.PostgresURL(t), 4)
			_, err := pool.Exec(ctx, c.setup)
			require.NoError(t, err)
			db := stdlib.OpenDBFromPool(pool)
			t.Cleanup(func() { require.NoError(t, db.Close()) })

			for name, s := range map[string]store.Store{"pgx": store.NewPostgres(pool), "database/sql": store.NewSQL(db)} {
				calls := []struct {
					op   string
					call func(context.Context) error
				}{
					{`acquire "k"`, func(ctx context.Context) error {
						_, _, err := s.Acquire(ctx, "k", "o", time.Minute)
						return err
					}},
					{`renew "k"`, func(ctx context.Context) error {
						_, err := s.Renew(ctx, "k", "o", time.Minute)
						return err
					}},
					{`release "k"`, func(ctx context.Context) error {
						_, err := s.Release(ctx, "k", "o")
						return err
					}},
					{"renew 1 locks", func(ctx context.Context) error {
						_, err := s.RenewMany(ctx, []string{"k"}, []string{"o"}, time.Minute)
						return err
					}},
					{`read the holder of "k"`, func(ctx context.Context) error {
						_, err := s.Holder(ctx, "k")
						return err
					}},
				}
				for _, call := range calls {
					err := call.call(ctx)
					want := "pglock: " + call.op + ": the pglock schema is missing or out of date: run pglock.Migrate: ERROR: "
					require.True(t, strings.HasPrefix(err.Error(), want), "%s: %v", name, err)
					var pgErr *pgconn.PgError
					require.ErrorAs(t, err, &pgErr, name)
					require.Equal(t, c.code, pgErr.Code, name)
				}
			}
		})
	}
}
