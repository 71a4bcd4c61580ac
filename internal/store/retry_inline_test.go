package store_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock/internal/store"
	"github.com/pgfence/pglock/pglocktest"
)

// The retry's one message carries its arguments as literals: whatever a key or an owner
// holds reaches the server as it was, and nothing in it is read as SQL.
func TestRetryMessageCarriesArgumentsAsTheyAre(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t)
	ctx := t.Context()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	one := store.NewOneTrip(conn.Conn())
	texts := []string{
		"plain", "it's", `back\slash`, `\'`, `'; DROP TABLE products; --`, `"quoted"`, "$1 $2 $10",
		"E'x'", "ünïcødé ✓ 鍵", "{a,b}", "NULL", "", " spaced ", "new\nline", `\\'\\`,
	}
	for _, s := range texts {
		var gotText string
		var gotArray []string
		var gotInt int64
		err := one.QueryRow(ctx, `SELECT $1::text, $2::text[], $3::bigint + $4`, s, []string{s, "NULL", s + `"`, "", "{}"}, int64(-7), 7).
			Scan(&gotText, &gotArray, &gotInt)
		require.NoError(t, err, "%q", s)
		require.Equal(t, s, gotText)
		require.Equal(t, []string{s, "NULL", s + `"`, "", "{}"}, gotArray)
		require.Zero(t, gotInt)
		require.Equal(t, byte('I'), conn.Conn().PgConn().TxStatus())
	}
	keys, err := one.QueryKeys(ctx, `SELECT unnest($1::text[])`, texts)
	require.NoError(t, err)
	require.Equal(t, texts, keys)

	// A real call: the key it acquires is the key given.
	key := `o'key\"` + "✓"
	var token int64
	require.NoError(t, one.QueryRow(ctx, `SELECT pglock.lock_acquire($1, $2, $3)`, key, "me'", store.TTLMillis(time.Minute)).Scan(&token))
	h, err := store.NewPostgres(pool).Holder(ctx, key)
	require.NoError(t, err)
	require.Equal(t, store.LockInfo{Key: key, Owner: "me'", Instance: "me'", Token: token, Held: true, ExpiresAt: h.ExpiresAt, ExpiresIn: h.ExpiresIn}, h)

	// The other types the store's statements send: booleans (lock_release_many's async,
	// registry_touch's registering), NULL (job_run_record's error), driver.Valuers
	// (sinceUS, skipsJSON).
	var yes, no, null bool
	var since int64
	var skips string
	require.NoError(t, one.QueryRow(ctx, `SELECT $1::boolean, $2::boolean, $3::text IS NULL, $4::bigint, $5::text`,
		true, false, nil, store.SinceUS(time.Now().Add(-time.Hour)), store.SkipsJSON{{Job: "j'", Reason: "held", Count: 2}}).
		Scan(&yes, &no, &null, &since, &skips))
	require.True(t, yes)
	require.False(t, no)
	require.True(t, null)
	require.InDelta(t, time.Hour.Microseconds(), since, float64(time.Minute.Microseconds()))
	require.Contains(t, skips, `"job":"j'"`)

	// Any other type is an error that says so: not errors.ErrUnsupported, which would
	// send the statement again in the pool's isolation instead.
	_, err = store.Inline(`SELECT $1`, []any{1.5})
	require.ErrorContains(t, err, "a float64 argument")
	require.False(t, errors.Is(err, errors.ErrUnsupported))
}
