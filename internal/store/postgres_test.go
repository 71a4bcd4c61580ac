package store_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock/internal/store"
	"github.com/pgfence/pglock/pglocktest"
)

// recordingQueryer passes every statement on to its Queryer and keeps the arguments of
// the last one.
type recordingQueryer struct {
	store.Queryer
	mu   sync.Mutex
	last []any
}

func (r *recordingQueryer) record(args []any) {
	if len(args) > 0 {
		if _, ok := args[0].(pgx.QueryExecMode); ok {
			args = args[1:] // the store's exec mode, not a statement argument
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last = args
}

func (r *recordingQueryer) lastArg(i int) any {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last[i]
}

func (r *recordingQueryer) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	r.record(args)
	return r.Queryer.QueryRow(ctx, sql, args...)
}

func (r *recordingQueryer) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	r.record(args)
	return r.Queryer.Query(ctx, sql, args...)
}

// TestSQLFunctionsGetTheTTLRoundedUp: the SQL functions count ttl in whole
// milliseconds; truncating would make the lock expire on the database before its
// holder's deadline (ttl - ttl/10 after the send): 1.5 ms sent as 1 ms, the deadline at
// 1.35 ms.
func TestSQLFunctionsGetTheTTLRoundedUp(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pglocktest.Postgres(t)
	rec := &recordingQueryer{Queryer: pool}
	s := store.NewPostgres(rec)
	for _, c := range []struct {
		ttl  time.Duration
		want int64
	}{
		{time.Millisecond, 1},
		{time.Millisecond + time.Nanosecond, 2},
		{1500 * time.Microsecond, 2},
		{2*time.Millisecond - time.Nanosecond, 2},
		{time.Hour, 3_600_000},
		{7 * 24 * time.Hour, 604_800_000},
	} {
		t.Run(c.ttl.String(), func(t *testing.T) {
			key := "ttl:" + c.ttl.String()
			_, ok, err := s.Acquire(ctx, key, "o", c.ttl)
			require.NoError(t, err)
			require.True(t, ok)
			require.Equal(t, c.want, rec.lastArg(2), "Acquire")
			_, err = s.Renew(ctx, key, "o", c.ttl)
			require.NoError(t, err)
			require.Equal(t, c.want, rec.lastArg(2), "Renew")
			_, err = s.RenewMany(ctx, []string{key}, []string{"o"}, c.ttl)
			require.NoError(t, err)
			require.Equal(t, c.want, rec.lastArg(2), "RenewMany")
		})
	}

	t.Run("a lock outlives its ttl on the database clock", func(t *testing.T) {
		var before time.Time
		require.NoError(t, pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&before))
		_, ok, err := s.Acquire(ctx, "ttl:database", "o", 1500*time.Microsecond)
		require.NoError(t, err)
		require.True(t, ok)
		var lives time.Duration
		require.NoError(t, pool.QueryRow(ctx, "SELECT expires_at - $1::timestamptz FROM pglock.locks WHERE key = 'ttl:database'", before).
			Scan(&lives))
		require.GreaterOrEqual(t, lives, 1500*time.Microsecond)
	})
}
