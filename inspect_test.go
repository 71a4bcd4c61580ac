package pglock_test

import (
	"context"
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/pglocktest"
)

// inspectStores are the stores Client.Locks and Client.ForceRelease work on: pgx,
// database/sql and memory. expire makes a lock of ttl expire: real database time for
// PostgreSQL, the manual clock for memory.
type inspectStore struct {
	name   string
	open   func(t *testing.T) (*pglock.Store, []pglock.ClientOption)
	expire func(t *testing.T, ttl time.Duration)
}

func inspectStores() []inspectStore {
	var clock *pglocktest.ManualClock
	sleepOnDatabaseClock := func(_ *testing.T, ttl time.Duration) { time.Sleep(ttl + 5*time.Millisecond) }
	return []inspectStore{
		{"pgx", func(t *testing.T) (*pglock.Store, []pglock.ClientOption) {
			return pglock.NewPostgresStore(pglocktest.Postgres(t)), nil
		}, sleepOnDatabaseClock},
		{"database/sql", func(t *testing.T) (*pglock.Store, []pglock.ClientOption) {
			cfg, err := pgx.ParseConfig(pglocktest.PostgresURL(t))
			require.NoError(t, err)
			db := stdlib.OpenDB(*cfg)
			t.Cleanup(func() { _ = db.Close() })
			return pglock.NewSQLStore(db), nil
		}, sleepOnDatabaseClock},
		{"memory", func(*testing.T) (*pglock.Store, []pglock.ClientOption) {
			clock = pglocktest.NewManualClock(time.Now())
			return pglock.NewMemoryStore(clock), []pglock.ClientOption{pglock.WithClock(clock)}
		}, func(_ *testing.T, ttl time.Duration) { clock.Advance(ttl) }},
	}
}

// lockStates is what Locks says of each key, without the times.
func lockStates(t *testing.T, c *pglock.Client, prefix string) []pglock.LockInfo {
	t.Helper()
	locks, err := c.Locks(t.Context(), prefix)
	require.NoError(t, err)
	for i := range locks {
		locks[i].ExpiresAt, locks[i].ExpiresIn, locks[i].AcquiredAt, locks[i].TTL = time.Time{}, 0, time.Time{}, 0
	}
	return locks
}

func TestLocksListsHeldReleasedAndExpiredLocksByKey(t *testing.T) {
	t.Parallel()
	for _, s := range inspectStores() {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			store, opts := s.open(t)
			c := newClient(t, store, append(opts, quiet, pglock.WithInstanceName("web-1/eu"), pglock.WithoutListener())...)
			p := t.Name() + "/"

			// Straight from the store: a client would renew it.
			expiredToken, ok, err := pglock.InternalStore(store).Acquire(ctx, p+"expired", "web-1/eu/gone", 20*time.Millisecond)
			require.NoError(t, err)
			require.True(t, ok)
			s.expire(t, 20*time.Millisecond)
			held, err := c.TryAcquire(ctx, p+"b-held", pglock.TTL(time.Minute))
			require.NoError(t, err)
			released, err := c.TryAcquire(ctx, p+"a-released")
			require.NoError(t, err)
			require.NoError(t, released.Release(ctx))
			for _, k := range []string{p + "B-upper", p + "x%y", p + "x_y", p + "xzy", "other:" + p} {
				_, err := c.TryAcquire(ctx, k)
				require.NoError(t, err)
			}

			locks, err := c.Locks(ctx, p)
			require.NoError(t, err)
			keys := make([]string, len(locks))
			for i, l := range locks {
				keys[i] = l.Key
			}
			require.Equal(t, []string{p + "B-upper", p + "a-released", p + "b-held", p + "expired", p + "x%y", p + "x_y", p + "xzy"},
				keys, "byte order, held or not, nothing outside the prefix")

			byKey := map[string]pglock.LockInfo{}
			for _, l := range locks {
				byKey[l.Key] = l
			}
			h := byKey[p+"b-held"]
			require.Equal(t, held.Owner(), h.Owner)
			require.Equal(t, "web-1/eu", h.Instance)
			require.Equal(t, held.Token(), h.Token)
			require.True(t, h.Held)
			require.False(t, h.Waiting)
			require.Greater(t, h.ExpiresIn, 50*time.Second)
			require.LessOrEqual(t, h.ExpiresIn, time.Minute)

			r := byKey[p+"a-released"]
			require.Equal(t, pglock.LockInfo{Key: p + "a-released", Token: released.Token(), AcquiredAt: r.AcquiredAt, TTL: r.TTL, ExpiresAt: r.ExpiresAt, ExpiresIn: r.ExpiresIn}, r,
				"released: no owner, not held, the token kept")
			require.LessOrEqual(t, r.ExpiresIn, time.Duration(0))

			e := byKey[p+"expired"]
			require.Equal(t, "web-1/eu/gone", e.Owner, "an expired lock keeps its last owner")
			require.Equal(t, "web-1/eu", e.Instance)
			require.Equal(t, expiredToken, e.Token)
			require.False(t, e.Held)
			require.LessOrEqual(t, e.ExpiresIn, time.Duration(0))
			// ExpiresIn is ExpiresAt less the store's now: the two leases ended and
			// began on the same clock.
			require.True(t, e.ExpiresAt.Before(h.ExpiresAt))

			for prefix, want := range map[string][]string{
				p + "x%": {p + "x%y"}, // % and _ are no wildcards
				p + "x_": {p + "x_y"},
				p + "xz": {p + "xzy"},
				p + "zz": {},
			} {
				got := lockStates(t, c, prefix)
				require.Len(t, got, len(want), prefix)
				for i := range want {
					require.Equal(t, want[i], got[i].Key)
				}
			}
			all, err := c.Locks(ctx, "")
			require.NoError(t, err)
			require.Len(t, all, 8, `"" lists every lock`)
		})
	}
}

func TestLocksSaysSinceWhenAndForWhatTTLAKeyIsHeld(t *testing.T) {
	t.Parallel()
	for _, s := range inspectStores() {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			store, opts := s.open(t)
			c := newClient(t, store, append(opts, quiet, pglock.WithoutListener())...)
			key := t.Name()
			one := func() pglock.LockInfo {
				t.Helper()
				locks, err := c.Locks(ctx, key)
				require.NoError(t, err)
				require.Len(t, locks, 1)
				return locks[0]
			}

			_, ok, err := pglock.InternalStore(store).Acquire(ctx, key, "a/1", time.Minute)
			require.NoError(t, err)
			require.True(t, ok)
			first := one()
			require.False(t, first.AcquiredAt.IsZero())
			require.InDelta(t, time.Minute, first.ExpiresAt.Sub(first.AcquiredAt), float64(time.Second), "on the store's clock")
			require.InDelta(t, time.Minute, first.TTL, float64(time.Second), "the trigger reads the clock after the acquisition")

			s.expire(t, 10*time.Millisecond)
			ok, err = pglock.InternalStore(store).Renew(ctx, key, "a/1", time.Minute)
			require.NoError(t, err)
			require.True(t, ok)
			renewed := one()
			require.True(t, renewed.ExpiresAt.After(first.ExpiresAt))
			require.True(t, renewed.AcquiredAt.Equal(first.AcquiredAt), "a renewal does not move it")
			require.Equal(t, first.TTL, renewed.TTL)

			_, err = c.ForceRelease(ctx, key)
			require.NoError(t, err)
			require.True(t, one().AcquiredAt.Equal(first.AcquiredAt), "nor does a release")

			s.expire(t, 10*time.Millisecond)
			_, ok, err = pglock.InternalStore(store).Acquire(ctx, key, "b/1", 2*time.Minute)
			require.NoError(t, err)
			require.True(t, ok)
			next := one()
			require.True(t, next.AcquiredAt.After(first.AcquiredAt), "the next acquisition does")
			require.InDelta(t, 2*time.Minute, next.TTL, float64(time.Second))
		})
	}
}

func TestLocksShowsAWaiter(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pglocktest.Postgres(t)
	holder := newPoolClient(t, pool)
	waiter := newPoolClient(t, pool)
	key := t.Name()
	l, err := holder.TryAcquire(ctx, key)
	require.NoError(t, err)
	require.False(t, lockStates(t, holder, key)[0].Waiting)

	waitCtx, stop := context.WithCancel(ctx)
	defer stop()
	got := make(chan error, 1)
	go func() {
		_, err := waiter.Acquire(waitCtx, key, pglock.Wait(time.Minute))
		got <- err
	}()
	require.Eventually(t, func() bool { return lockStates(t, holder, key)[0].Waiting }, 10*time.Second, 10*time.Millisecond)
	stop()
	require.ErrorIs(t, <-got, context.Canceled)
	require.NoError(t, l.Release(ctx))
	require.False(t, lockStates(t, holder, key)[0].Waiting, "a released key has no waiter to show")
}

// The proof an operator needs before breaking a lock: a holder that is paused (it
// holds the lock and has not written yet) is broken; the next holder gets a greater
// token; the paused holder's late fenced writes write nothing, and its ctx is
// cancelled at its next renewal, which comes when the test moves its clock.
func TestForceReleaseBreaksAPausedHolder(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := fencedTxDB(t)
	_, err := pool.Exec(ctx, `ALTER TABLE stock ADD COLUMN token bigint NOT NULL DEFAULT 0`)
	require.NoError(t, err)
	// Leases the database keeps however slow the machine.
	const ttl = time.Minute
	key := t.Name()
	clock := pglocktest.NewManualClock(time.Now())
	paused := newPoolClient(t, pool, pglock.TTL(ttl), pglock.WithInstanceName("paused"), pglock.WithClock(clock))
	next := newPoolClient(t, pool, pglock.TTL(ttl))
	operator := newPoolClient(t, pool)
	tokenWrite := func(token int64, n int) int64 {
		t.Helper()
		written, err := pglock.ExecFenced(ctx, pool, "UPDATE stock SET n = $1 WHERE id = 1", "token", token, n)
		require.NoError(t, err)
		return written
	}
	heldWrite := func(token int64, n int) int64 {
		t.Helper()
		written, err := fencedWrite(ctx, pool, key, token, n)
		require.NoError(t, err)
		return written
	}

	old, err := paused.TryAcquire(ctx, key)
	require.NoError(t, err)
	// The next holder waits for the key, as a standby would.
	acquired := make(chan *pglock.Lock, 1)
	go func() {
		l, err := next.Acquire(ctx, key, pglock.Wait(time.Minute))
		if err != nil {
			t.Errorf("the next holder: %v", err)
		}
		acquired <- l
	}()
	require.Eventually(t, func() bool { return lockStates(t, operator, key)[0].Waiting }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, old.Context().Err(), "the holder still holds it before the break")

	broken, err := operator.ForceRelease(ctx, key)
	require.NoError(t, err)
	require.Equal(t, old.Owner(), broken.Owner)
	require.Equal(t, "paused", broken.Instance)
	require.Equal(t, old.Token(), broken.Token)
	require.True(t, broken.Held)
	require.True(t, broken.Waiting)
	require.Positive(t, broken.ExpiresIn)

	require.Zero(t, heldWrite(old.Token(), 1), "FenceHeld refuses the broken holder at once")

	var lock *pglock.Lock
	select {
	case lock = <-acquired: // woken by the break, as by a release
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting holder did not get the key")
	}
	require.Greater(t, lock.Token(), old.Token())
	require.EqualValues(t, 1, tokenWrite(lock.Token(), 2))
	require.EqualValues(t, 1, heldWrite(lock.Token(), 3))

	// The paused holder wakes up and writes, late.
	require.Zero(t, tokenWrite(old.Token(), 4), "FenceUpdate refuses the broken token")
	require.Zero(t, heldWrite(old.Token(), 5), "FenceHeld refuses the broken token")
	require.Equal(t, 3, stockValue(t, pool))

	clock.Advance(ttl / 3) // its next renewal
	require.Error(t, old.Context().Err(), "the broken holder's ctx was not cancelled")
	var lost *pglock.LockLostError
	require.ErrorAs(t, context.Cause(old.Context()), &lost)
	require.Equal(t, pglock.LostRefused, lost.Reason, "its renewal was refused, before its lease would have expired")
	require.True(t, lock.Held())

	_, err = operator.ForceRelease(ctx, key+"-never-used")
	require.ErrorIs(t, err, pglock.ErrNotHeld)
}

// An open fenced transaction of the holder row-locks the lock's row FOR KEY SHARE:
// ForceRelease waits for it, so the write it holds is settled before the key changes
// hands, and the holder's next write after the break writes nothing.
func TestForceReleaseWaitsForAnOpenFencedTransaction(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := fencedTxDB(t)
	key := t.Name()
	holder := newPoolClient(t, pool)
	operator := newPoolClient(t, pool)
	l, err := holder.TryAcquire(ctx, key)
	require.NoError(t, err)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	written, err := fencedWrite(ctx, tx, key, l.Token(), 7)
	require.NoError(t, err)
	require.EqualValues(t, 1, written)

	type result struct {
		info pglock.LockInfo
		err  error
	}
	done := make(chan result, 1)
	go func() {
		info, err := operator.ForceRelease(ctx, key)
		done <- result{info, err}
	}()
	// The break waits on the row lock.
	require.Eventually(t, func() bool {
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%lock_force_release%')`).Scan(&waiting)
		return err == nil && waiting
	}, 10*time.Second, 5*time.Millisecond)
	select {
	case r := <-done:
		t.Fatalf("ForceRelease did not wait for the fenced transaction: %+v", r)
	default:
	}
	require.NoError(t, tx.Commit(ctx))
	r := <-done
	require.NoError(t, r.err)
	require.Equal(t, l.Token(), r.info.Token)
	require.Equal(t, 7, stockValue(t, pool), "the write committed before the break is the holder's")
	written, err = fencedWrite(ctx, pool, key, l.Token(), 8)
	require.NoError(t, err)
	require.Zero(t, written)
	require.Equal(t, 7, stockValue(t, pool))
}

func TestForceReleaseOnTheMemoryStore(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	clock := pglocktest.NewManualClock(time.Now())
	store := pglock.NewMemoryStore(clock)
	holder := newClient(t, store, quiet, pglock.WithClock(clock), pglock.TTL(time.Second))
	next := newClient(t, store, quiet, pglock.WithClock(clock))
	key := t.Name()
	old, err := holder.TryAcquire(ctx, key)
	require.NoError(t, err)
	broken, err := next.ForceRelease(ctx, key)
	require.NoError(t, err)
	require.Equal(t, pglock.LockInfo{Key: key, Owner: old.Owner(), Instance: old.Owner()[:strings.LastIndexByte(old.Owner(), '/')],
		Token: old.Token(), Held: true, ExpiresAt: clock.Now().Add(time.Second), ExpiresIn: time.Second}, broken)
	l, err := next.TryAcquire(ctx, key)
	require.NoError(t, err)
	require.Greater(t, l.Token(), old.Token())
	require.NoError(t, old.Context().Err())
	clock.Advance(time.Second / 3) // the holder's next renewal
	var lost *pglock.LockLostError
	require.ErrorAs(t, context.Cause(old.Context()), &lost)
	require.Equal(t, pglock.LostRefused, lost.Reason)
}

func TestLocksAndForceReleaseRefuseBadInputAndChangeNothing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pglocktest.Postgres(t)
	c := newPoolClient(t, pool, pglock.WithoutListener())
	p := t.Name() + "/"
	held, err := c.TryAcquire(ctx, p+"held")
	require.NoError(t, err)
	released, err := c.TryAcquire(ctx, p+"released")
	require.NoError(t, err)
	require.NoError(t, released.Release(ctx))
	_, ok, err := pglock.InternalStore(pglock.NewPostgresStore(pool)).Acquire(ctx, p+"expired", "o/1", time.Millisecond)
	require.NoError(t, err)
	require.True(t, ok)
	time.Sleep(5 * time.Millisecond) // database time: the 1 ms lease ends
	before := lockStates(t, c, "")

	long := strings.Repeat("k", pglock.MaxKeyLength+1)
	for _, tc := range []struct {
		name string
		call func() error
		want error
		text string
	}{
		{"Locks: NUL in prefix", func() error { _, err := c.Locks(ctx, "a\x00"); return err }, pglock.ErrInvalidArgument, "prefix"},
		{"Locks: prefix not UTF-8", func() error { _, err := c.Locks(ctx, "\xff"); return err }, pglock.ErrInvalidArgument, "prefix"},
		{"Locks: prefix too long", func() error { _, err := c.Locks(ctx, long); return err }, pglock.ErrInvalidArgument, "501 characters"},
		{"ForceRelease: empty key", func() error { _, err := c.ForceRelease(ctx, ""); return err }, pglock.ErrInvalidKey, "empty"},
		{"ForceRelease: NUL in key", func() error { _, err := c.ForceRelease(ctx, "a\x00"); return err }, pglock.ErrInvalidKey, "NUL"},
		{"ForceRelease: key not UTF-8", func() error { _, err := c.ForceRelease(ctx, "\xff"); return err }, pglock.ErrInvalidKey, "UTF-8"},
		{"ForceRelease: key too long", func() error { _, err := c.ForceRelease(ctx, long); return err }, pglock.ErrInvalidKey, "501 characters"},
		{"ForceRelease: never used", func() error { _, err := c.ForceRelease(ctx, p+"never"); return err }, pglock.ErrNotHeld, "no live holder"},
		{"ForceRelease: released", func() error { _, err := c.ForceRelease(ctx, p+"released"); return err }, pglock.ErrNotHeld, "no live holder"},
		{"ForceRelease: expired", func() error { _, err := c.ForceRelease(ctx, p+"expired"); return err }, pglock.ErrNotHeld, "no live holder"},
		{"ForceRelease: ctx ended", func() error {
			ended, cancel := context.WithCancel(ctx)
			cancel()
			_, err := c.ForceRelease(ended, p+"held")
			return err
		}, context.Canceled, "force release"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			require.ErrorIs(t, err, tc.want)
			require.ErrorContains(t, err, tc.text)
			require.True(t, strings.HasPrefix(err.Error(), "pglock: "), "%q", err)
			require.Equal(t, before, lockStates(t, c, ""), "nothing changed")
			require.True(t, held.Held())
		})
	}
}

// On a database migrated before 000007 the error says to migrate.
func TestLocksOnAnOlderSchemaSaysToMigrate(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pglocktest.Postgres(t)
	down, err := fs.ReadFile(pglock.Migrations(), "000007_inspect.down.sql")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, string(down))
	require.NoError(t, err)
	c := newPoolClient(t, pool, pglock.WithoutListener())
	_, err = c.Locks(ctx, "")
	requireSQLState(t, err, "42883")
	require.ErrorContains(t, err, "pglock: list locks: the pglock schema is missing or out of date: run pglock.Migrate")
	_, err = c.ForceRelease(ctx, "k")
	requireSQLState(t, err, "42883")
	require.ErrorContains(t, err, "run pglock.Migrate")
}

// Through PgBouncer in transaction mode, on a pool in pgx's default query mode.
func TestPgBouncerLocksAndForceRelease(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	bouncerURL, _ := behindPgBouncer(t)
	pool := bouncerPool(t, bouncerURL, 4)
	c := newPoolClient(t, pool, pglock.WithoutListener())
	for i := range 20 { // enough statements to meet a server connection without them
		l, err := c.TryAcquire(ctx, t.Name()+"/"+strings.Repeat("k", i+1))
		require.NoError(t, err)
		require.Len(t, lockStates(t, c, t.Name()+"/"), i+1)
		_, err = c.ForceRelease(ctx, l.Key())
		require.NoError(t, err)
	}
}

// README.md's read-only role: USAGE and EXECUTE on lock_list alone lists the locks,
// and may break none.
func TestReadOnlyRoleListsLocksAndBreaksNone(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dbURL := pglocktest.PostgresURL(t)
	admin := newPoolClient(t, pglocktest.Pool(t, dbURL, 2))
	l, err := admin.TryAcquire(ctx, t.Name())
	require.NoError(t, err)
	viewer := newPoolClient(t, pglocktest.Pool(t, newRole(t, dbURL,
		`GRANT USAGE ON SCHEMA pglock TO %s`,
		`GRANT EXECUTE ON FUNCTION pglock.lock_list(text) TO %s`), 2), pglock.WithoutListener())
	locks, err := viewer.Locks(ctx, "")
	require.NoError(t, err)
	require.Len(t, locks, 1)
	require.Equal(t, l.Owner(), locks[0].Owner)
	_, err = viewer.ForceRelease(ctx, t.Name())
	requireSQLState(t, err, "42501")
	require.True(t, l.Held())
	_, err = viewer.TryAcquire(ctx, t.Name()+"-other")
	requireSQLState(t, err, "42501")
}

// A pooler's lost prepared statement (here DEALLOCATE ALL, as a server connection
// handed over by PgBouncer looks): Locks sends its statement again, in exec mode.
func TestLocksSurvivesALostPreparedStatement(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pglocktest.Pool(t, pglocktest.PostgresURL(t), 1)
	c := newPoolClient(t, pool, pglock.WithoutListener())
	_, err := c.TryAcquire(ctx, t.Name())
	require.NoError(t, err)
	require.Len(t, lockStates(t, c, t.Name()), 1)
	_, err = pool.Exec(ctx, "DEALLOCATE ALL")
	require.NoError(t, err)
	require.Len(t, lockStates(t, c, t.Name()), 1)
}
