package pglock_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/pglocktest"
)

// The fuzzers of the entry points that take user input (the rewriting behind
// FenceUpdate and FenceHeld has its own, FuzzRewrite in internal/sqlfence). Each input
// either works, round-tripping through PostgreSQL exactly, or returns a "pglock:"
// error that says which input was wrong; nothing panics. `go test` runs the seeds;
// `go test -fuzz FuzzKeys` explores.

// requirePglockError checks the shape of an error for bad input: prefixed, and
// matching target.
func requirePglockError(t *testing.T, err, target error) {
	t.Helper()
	require.ErrorIs(t, err, target)
	require.True(t, strings.HasPrefix(err.Error(), "pglock: "), "error %q lacks the pglock: prefix", err)
}

// FuzzKeys takes a key under an instance name through both PostgreSQL stores: the key
// must come back exactly (no normalisation, quoting or truncation, also through the
// database/sql store's array literal), or be refused as ErrInvalidKey before any
// statement runs.
func FuzzKeys(f *testing.F) {
	for _, s := range [][2]string{
		{"payment:42", "api-1"}, {"Zażółć gęślą jaźń", "węzeł/7"}, {"", "x"}, {"a\x00b", "x"}, {"\xff", "x"},
		{`{"a",b}\`, `NULL`}, {"NULL", "}{"}, {" lead ", " "}, {strings.Repeat("é", pglock.MaxKeyLength), "x"},
		{strings.Repeat("k", pglock.MaxKeyLength+1), "x"}, {"job", strings.Repeat("n", 201)}, {"k", ""}, {"k", "a\x00"},
		{"🔒\u200d\U0010FFFF", "\t"}, {"'; DROP TABLE pglock.locks; --", "$1"}, {"exports\x1f1", "x"}, {"\x1f", "x"},
	} {
		f.Add(s[0], s[1])
	}
	pool := pglocktest.Postgres(f)
	db := stdlib.OpenDBFromPool(pool)
	f.Cleanup(func() { require.NoError(f, db.Close()) })
	sqlStore := pglock.NewSQLStore(db)
	store := pglock.NewPostgresStore(pool)
	f.Fuzz(func(t *testing.T, key, instance string) {
		ctx := t.Context()
		c, err := pglock.NewWithStore(store, pglock.WithInstanceName(instance), pglock.WithoutListener())
		if instance == "" || utf8.RuneCountInString(instance) > 200 || !utf8.ValidString(instance) || strings.ContainsRune(instance, 0) {
			requirePglockError(t, err, pglock.ErrInvalidArgument)
			require.Nil(t, c)
			return
		}
		require.NoError(t, err)
		defer func() { require.NoError(t, c.Close(context.WithoutCancel(ctx))) }()

		l, err := c.TryAcquire(ctx, key)
		if key == "" || utf8.RuneCountInString(key) > pglock.MaxKeyLength || !utf8.ValidString(key) || strings.ContainsRune(key, 0) ||
			strings.ContainsRune(key, '\x1f') {
			requirePglockError(t, err, pglock.ErrInvalidKey)
			_, _, err = pglock.InternalStore(store).Acquire(ctx, key, "o", time.Minute)
			requirePglockError(t, err, pglock.ErrInvalidKey)
			_, err = storeHolder(ctx, store, key)
			requirePglockError(t, err, pglock.ErrInvalidKey)
			_, err = c.Job(key, func(context.Context) error { return nil }, pglock.OnOneInstance())
			requirePglockError(t, err, pglock.ErrInvalidKey)
			return
		}
		require.NoError(t, err)
		require.Equal(t, key, l.Key())
		require.True(t, strings.HasPrefix(l.Owner(), instance+"/"), "owner %q", l.Owner())

		h, err := storeHolder(ctx, store, key)
		require.NoError(t, err)
		require.Equal(t, pglock.LockInfo{Key: key, Owner: l.Owner(), Instance: instance, Token: l.Token(), Held: true, ExpiresAt: h.ExpiresAt, ExpiresIn: h.ExpiresIn}, h)
		renewed, err := storeRenewMany(ctx, sqlStore, []string{key}, []string{l.Owner()}, time.Minute)
		require.NoError(t, err)
		require.Equal(t, []string{key}, renewed, "the database/sql store's array literal changed the key")

		_, err = c.TryAcquire(ctx, key)
		require.ErrorIs(t, err, pglock.ErrNotAcquired, "the key is held, under exactly this spelling")
		require.NoError(t, l.Release(ctx))
		h, err = storeHolder(ctx, store, key)
		require.NoError(t, err)
		require.False(t, h.Held)
	})
}

// FuzzTTL gives a ttl and a wait to every option and call that takes one: out of
// range, each returns ErrInvalidArgument naming it; in range, the lease the database
// holds lives no longer than the ttl.
func FuzzTTL(f *testing.F) {
	for _, d := range []time.Duration{0, -1, 1, time.Millisecond - 1, time.Millisecond, 1500 * time.Microsecond,
		time.Second, pglock.MaxTTL, pglock.MaxTTL + 1, -1 << 63, 1<<63 - 1} {
		f.Add(int64(d), int64(d))
	}
	pool := pglocktest.Postgres(f)
	store := pglock.NewPostgresStore(pool)
	f.Fuzz(func(t *testing.T, ttlNS, waitNS int64) {
		ctx := t.Context()
		ttl, wait := time.Duration(ttlNS), time.Duration(waitNS)
		valid := ttl >= pglock.MinTTL && ttl <= pglock.MaxTTL
		quiet := pglock.WithLogger(slog.New(slog.DiscardHandler)) // a 1 ms lease is lost, and says so, all the time
		c, err := pglock.NewWithStore(store, pglock.TTL(ttl), pglock.WithoutListener(), quiet)
		if !valid {
			requirePglockError(t, err, pglock.ErrInvalidArgument)
			require.Contains(t, err.Error(), "NewWithStore: TTL")
			c, err = pglock.NewWithStore(store, pglock.WithoutListener(), quiet)
		}
		require.NoError(t, err)
		defer func() { require.NoError(t, c.Close(context.WithoutCancel(ctx))) }()

		_, err = c.Elect("fuzz-leader", pglock.LeaderCallbacks{OnAcquired: func(context.Context, *pglock.Lock) error { return nil }}, pglock.TTL(ttl))
		if !valid {
			requirePglockError(t, err, pglock.ErrInvalidArgument)
		} else {
			require.NoError(t, err)
		}
		_, err = c.Job("fuzz-job", func(context.Context) error { return nil }, pglock.OnOneInstance(), pglock.TTL(ttl))
		if !valid {
			requirePglockError(t, err, pglock.ErrInvalidArgument)
		} else {
			require.NoError(t, err)
		}

		actx, cancel := context.WithTimeout(ctx, 10*time.Second) // the key is free: no wait, however long, is needed
		defer cancel()
		l, err := c.Acquire(actx, "fuzz-ttl", pglock.TTL(ttl), pglock.Wait(wait))
		switch {
		case !valid:
			requirePglockError(t, err, pglock.ErrInvalidArgument)
			return
		case wait < 0:
			requirePglockError(t, err, pglock.ErrInvalidArgument)
			require.Contains(t, err.Error(), "Wait")
			return
		}
		// A ttl of a few seconds is within what a loaded machine can take to answer a
		// call (an acquisition, a renewal): its confirmation may come too late to
		// trust, its lock be lost before its release.
		const loadedMachine = 5 * time.Second
		if errors.Is(err, pglock.ErrNotAcquired) && ttl < loadedMachine {
			return // the confirmation came too late to trust
		}
		require.NoError(t, err)
		h, err := storeHolder(ctx, store, "fuzz-ttl")
		require.NoError(t, err)
		if h.Held { // a ttl of a few ms may be over already
			require.Equal(t, l.Token(), h.Token)
			require.LessOrEqual(t, h.ExpiresIn, ttl)
		}
		if err := l.Release(ctx); err != nil {
			require.True(t, errors.Is(err, pglock.ErrLockLost) && ttl < loadedMachine, "release after a ttl of %v: %v", ttl, err)
		}
	})
}
