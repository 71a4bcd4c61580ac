package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/store/storetest"
	"github.com/pgfence/pglock/pglocktest"
)

// Session settings that applications set on their connections or roles. None may
// change what a lock means: acquisition, renewal, release and expiry on the database
// clock, and tokens that only increase.

// raceFails is what the settings may do to calls that race on one key: with a snapshot
// isolation as the default, each call is its own REPEATABLE READ or SERIALIZABLE
// transaction, and one that meets a row changed since its snapshot fails with 40001
// (SERIALIZABLE also fails on read/write dependencies between calls, on any keys); the
// pgx store sends such a call again in a READ COMMITTED transaction (internal/store/retry.go),
// so that few, if any, reach the caller, and only after four tries; with a small
// lock_timeout, a call that has to wait for another one on the same key (an INSERT of
// the same new key, a renewal behind an acquisition's row lock) fails with 55P03. An
// error, never a wrong answer: TestSessionSettingsRacesFailButNeverLie.
var sessionSettings = []struct {
	name      string
	params    map[string]string
	raceFails []string
}{
	{"TimeZone Pacific/Kiritimati (UTC+14)", map[string]string{"TimeZone": "Pacific/Kiritimati"}, nil},
	{"TimeZone America/Adak (UTC-10, with DST)", map[string]string{"TimeZone": "America/Adak"}, nil},
	{"default_transaction_isolation repeatable read", map[string]string{"default_transaction_isolation": "repeatable read"}, []string{"40001"}},
	{"default_transaction_isolation serializable", map[string]string{"default_transaction_isolation": "serializable"}, []string{"40001"}},
	// The statement_timeout is small for a server (the default is none) but above what a
	// durable commit's WAL flush takes on a loaded machine, which can pass 200 ms.
	{"small statement_timeout and lock_timeout", map[string]string{"statement_timeout": "2s", "lock_timeout": "20ms"}, []string{"55P03", "57014"}},
	{"search_path without public", map[string]string{"search_path": "nowhere"}, nil},
}

// sessionPool returns a pool of maxConns connections on dbURL, each with params set at
// connection start, as an application's RuntimeParams (or its role's settings) do.
func sessionPool(t *testing.T, dbURL string, maxConns int32, params map[string]string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dbURL)
	require.NoError(t, err)
	cfg.MaxConns = maxConns
	for k, v := range params {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	for k, v := range params { // the server took it
		var got string
		require.NoError(t, pool.QueryRow(t.Context(), "SELECT current_setting($1)", k).Scan(&got))
		if k != "statement_timeout" && k != "lock_timeout" {
			require.Equal(t, v, got)
		}
	}
	return pool
}

func TestSessionSettingsKeepTheStoreContract(t *testing.T) {
	t.Parallel()
	for _, s := range sessionSettings {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			dbURL := pglocktest.PostgresURL(t)
			admin := pglocktest.Pool(t, dbURL, 2)
			pool := sessionPool(t, dbURL, 20, s.params)
			testStore(t, func(*testing.T) *pglock.Store { return pglock.NewPostgresStore(pool) }, storetest.Options{
				// The store retries what 40001 rolled back: the races run too.
				Concurrent: !slices.Contains(s.raceFails, "55P03"),
				Serial:     slices.Contains(s.raceFails, "55P03"),
				RewindTokens: func(t testing.TB) {
					_, err := admin.Exec(t.Context(), "ALTER SEQUENCE pglock.fencing_token_seq RESTART")
					require.NoError(t, err)
				},
			})
		})
	}
}

func TestSessionSettingsKeepALocksMeaning(t *testing.T) {
	t.Parallel()
	for _, s := range sessionSettings {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			dbURL := pglocktest.PostgresURL(t)
			admin := pglocktest.Pool(t, dbURL, 2) // UTC, read committed, defaults
			pool := sessionPool(t, dbURL, 4, s.params)
			store := pglock.NewPostgresStore(pool)

			// The expiry is ttl from now on the database clock, read from a default session.
			t1, ok, err := pglock.InternalStore(store).Acquire(ctx, "session:k", "a", 2*time.Second)
			require.NoError(t, err)
			require.True(t, ok)
			var left time.Duration
			require.NoError(t, admin.QueryRow(ctx,
				"SELECT expires_at - clock_timestamp() FROM pglock.locks WHERE key = 'session:k'").Scan(&left))
			require.Greater(t, left, time.Second)
			require.LessOrEqual(t, left, 2*time.Second)
			h, err := storeHolder(ctx, store, "session:k")
			require.NoError(t, err)
			require.Equal(t, "a", h.Owner)
			require.Greater(t, h.ExpiresIn, time.Second)
			require.LessOrEqual(t, h.ExpiresIn, 2*time.Second)

			renewed, err := pglock.InternalStore(store).Renew(ctx, "session:k", "a", 300*time.Millisecond)
			require.NoError(t, err)
			require.True(t, renewed)
			_, ok, err = pglock.InternalStore(store).Acquire(ctx, "session:k", "b", time.Minute)
			require.NoError(t, err)
			require.False(t, ok, "held")
			awaitExpiry(t, admin, "session:k") // past the renewed expiry
			renewed, err = pglock.InternalStore(store).Renew(ctx, "session:k", "a", time.Minute)
			require.NoError(t, err)
			require.False(t, renewed, "expired")
			t2, ok, err := pglock.InternalStore(store).Acquire(ctx, "session:k", "b", time.Minute)
			require.NoError(t, err)
			require.True(t, ok, "taken over after the expiry")
			require.Greater(t, t2, t1)
			released, err := pglock.InternalStore(store).Release(ctx, "session:k", "b")
			require.NoError(t, err)
			require.True(t, released)
			t3, ok, err := pglock.InternalStore(store).Acquire(ctx, "session:k", "c", time.Minute)
			require.NoError(t, err)
			require.True(t, ok)
			require.Greater(t, t3, t2)

			// A client on the pool: a lock, a prune of what was released.
			c := newPoolClient(t, pool)
			l, err := c.TryAcquire(ctx, "session:client", pglock.TTL(time.Minute))
			require.NoError(t, err)
			require.Greater(t, l.Token(), t3)
			require.NoError(t, l.Release(ctx))
			deleted, err := c.Prune(ctx, 0)
			require.NoError(t, err)
			require.EqualValues(t, 1, deleted)
			l, err = c.TryAcquire(ctx, "session:client", pglock.TTL(time.Minute))
			require.NoError(t, err)
			require.Greater(t, l.Token(), t3, "a pruned key gets a greater token")
		})
	}
}

// Fenced writes in transactions whose isolation is the session default, set on the
// application's role. Under REPEATABLE READ and SERIALIZABLE a write whose snapshot
// predates a takeover fails with 40001 (FenceHeld's FOR SHARE, or the column fence's
// UPDATE of a row the new holder wrote); a write of the live holder writes.
func TestSessionDefaultIsolationFencedWrites(t *testing.T) {
	t.Parallel()
	for _, iso := range []string{"read committed", "repeatable read", "serializable"} {
		t.Run(iso, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			dbURL := pglocktest.PostgresURL(t)
			admin := pglocktest.Pool(t, dbURL, 4)
			_, err := admin.Exec(ctx, `CREATE TABLE stock (id int PRIMARY KEY, n int NOT NULL, token bigint NOT NULL DEFAULT 0);
				INSERT INTO stock VALUES (1, 0, 0)`)
			require.NoError(t, err)
			appURL := newRole(t, dbURL, append(appGrants, `GRANT SELECT, UPDATE ON stock TO %s`,
				`ALTER ROLE %s SET default_transaction_isolation = '`+iso+`'`)...)
			app := pglocktest.Pool(t, appURL, 4)
			var got string
			require.NoError(t, app.QueryRow(ctx, "SHOW default_transaction_isolation").Scan(&got))
			require.Equal(t, iso, got)
			other := pglock.NewPostgresStore(admin)
			store := pglock.NewPostgresStore(app)

			old, ok, err := pglock.InternalStore(store).Acquire(ctx, "session:fence", "old", time.Minute)
			require.NoError(t, err)
			require.True(t, ok)

			// The live holder writes, through both fences.
			tx, err := app.Begin(ctx)
			require.NoError(t, err)
			written, err := fencedWrite(ctx, tx, "session:fence", old, 1)
			require.NoError(t, err)
			require.EqualValues(t, 1, written)
			n, err := pglock.ExecFenced(ctx, tx, "UPDATE stock SET n = n + 1 WHERE id = 1", "token", old)
			require.NoError(t, err)
			require.EqualValues(t, 1, n)
			require.NoError(t, tx.Commit(ctx))
			require.Equal(t, 2, stockValue(t, admin))

			// Transactions whose snapshots predate a takeover and the new holder's write.
			begin := func() pgx.Tx {
				tx, err := app.Begin(ctx)
				require.NoError(t, err)
				t.Cleanup(func() { _ = tx.Rollback(context.WithoutCancel(ctx)) })
				var seen int
				require.NoError(t, tx.QueryRow(ctx, "SELECT n FROM stock WHERE id = 1").Scan(&seen))
				return tx
			}
			staleHeld, staleColumn := begin(), begin()
			released, err := pglock.InternalStore(store).Release(ctx, "session:fence", "old")
			require.NoError(t, err)
			require.True(t, released)
			newer, ok, err := pglock.InternalStore(other).Acquire(ctx, "session:fence", "new", time.Minute)
			require.NoError(t, err)
			require.True(t, ok)
			n, err = pglock.ExecFenced(ctx, admin, "UPDATE stock SET n = 100 WHERE id = 1", "token", newer)
			require.NoError(t, err)
			require.EqualValues(t, 1, n)
			staleAfter := begin() // sees the new holder's write and token

			written, err = fencedWrite(ctx, staleHeld, "session:fence", old, 3)
			staleRefused(t, iso, written, err, "40001")
			n, err = pglock.ExecFenced(ctx, staleColumn, "UPDATE stock SET n = 4 WHERE id = 1", "token", old)
			staleRefused(t, iso, n, err, "40001")
			n, err = pglock.ExecFenced(ctx, staleAfter, "UPDATE stock SET n = 5 WHERE id = 1", "token", old)
			staleRefused(t, iso, n, err, "") // the row it sees has the newer token: no row matches
			written, err = fencedWrite(ctx, staleAfter, "session:fence", old, 6)
			staleRefused(t, iso, written, err, "")
			require.Equal(t, 100, stockValue(t, admin))
		})
	}
}

// staleRefused asserts that a stale fenced write wrote nothing: 0 rows under READ
// COMMITTED, and under the snapshot isolations the error code, or 0 rows when code is "".
func staleRefused(t *testing.T, iso string, written int64, err error, code string) {
	t.Helper()
	if iso == "read committed" || code == "" {
		require.NoError(t, err)
		require.Zero(t, written)
		return
	}
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "want 40001, got %v (%d rows)", err, written)
	require.Equal(t, code, pgErr.Code, pgErr.Message)
}

// The application's lock_timeout bounds pglock's calls too. An open fenced transaction,
// at any isolation level (FOR KEY SHARE, migration 000011), holds up no renewal, so it
// passes under a small lock_timeout; an acquisition loses at once. (The statement_timeout
// only keeps a call from hanging: at 200 ms, a first acquisition on a loaded machine,
// its commit waiting for the WAL flush, passed it.)
func TestSessionLockTimeoutAndAnOpenFencedTransaction(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := fencedTxDB(t)
	timeouts := sessionPool(t, pool.Config().ConnString(), 4, map[string]string{"lock_timeout": "20ms", "statement_timeout": "2s"})
	store := pglock.NewPostgresStore(timeouts)
	token, ok, err := pglock.InternalStore(store).Acquire(ctx, "fenced:a", "owner", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)

	for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable} {
		tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // a failure must not leave it open
		written, err := fencedWrite(ctx, tx, "fenced:a", token, 1)
		require.NoError(t, err)
		require.EqualValues(t, 1, written)

		_, ok, err := pglock.InternalStore(store).Acquire(ctx, "fenced:a", "intruder", time.Minute)
		require.NoError(t, err, iso)
		require.False(t, ok, iso)
		renewed, err := pglock.InternalStore(store).Renew(ctx, "fenced:a", "owner", time.Minute)
		require.NoError(t, err, iso)
		require.True(t, renewed, iso)
		require.NoError(t, tx.Commit(ctx))
		renewed, err = pglock.InternalStore(store).Renew(ctx, "fenced:a", "owner", time.Minute)
		require.NoError(t, err, iso)
		require.True(t, renewed, iso)
	}
}

// TestSessionSettingsRacesFailButNeverLie: callers race on one key under the settings
// whose races fail (see sessionSettings). Every failure is the expected error; at most
// one caller wins each round, and the tokens of the winners increase.
func TestSessionSettingsRacesFailButNeverLie(t *testing.T) {
	t.Parallel()
	for _, s := range sessionSettings {
		if s.raceFails == nil {
			continue
		}
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			pool := sessionPool(t, pglocktest.PostgresURL(t), 16, s.params)
			store := pglock.NewPostgresStore(pool)
			var last int64
			failed := map[string]int{}
			for round := range 20 {
				type result struct {
					owner string
					token int64
					ok    bool
					err   error
				}
				results := make(chan result, 16)
				for i := range 16 {
					go func() {
						owner := fmt.Sprintf("owner-%d-%d", round, i)
						token, ok, err := pglock.InternalStore(store).Acquire(ctx, "session:race", owner, time.Minute)
						results <- result{owner, token, ok, err}
					}()
				}
				var winners []result
				for range 16 {
					r := <-results
					if r.err != nil {
						var pgErr *pgconn.PgError
						require.True(t, errors.As(r.err, &pgErr), "%v", r.err)
						require.Contains(t, s.raceFails, pgErr.Code, r.err.Error())
						failed[pgErr.Code]++
						continue
					}
					if r.ok {
						winners = append(winners, r)
					}
				}
				require.LessOrEqual(t, len(winners), 1, "round %d", round)
				for _, w := range winners {
					require.Greater(t, w.token, last)
					last = w.token
					for {
						released, err := pglock.InternalStore(store).Release(ctx, "session:race", w.owner)
						if err == nil {
							require.True(t, released)
							break
						}
						var pgErr *pgconn.PgError
						require.True(t, errors.As(err, &pgErr), "%v", err)
						require.Contains(t, s.raceFails, pgErr.Code, err.Error())
					}
				}
			}
			t.Logf("failed calls by SQLSTATE: %v", failed)
		})
	}
}

// lock_prune under a snapshot isolation as the default, while other keys are acquired
// and released: it row-locks its rows FOR UPDATE SKIP LOCKED, so a row changed since
// its snapshot fails it with 40001 (reported, not a wrong count); it never deletes a
// live lock, and tokens still increase.
func TestSessionSnapshotIsolationPruneRacingReleases(t *testing.T) {
	t.Parallel()
	for _, iso := range []string{"repeatable read", "serializable"} {
		t.Run(iso, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			pool := sessionPool(t, pglocktest.PostgresURL(t), 8, map[string]string{"default_transaction_isolation": iso})
			store := pglock.NewPostgresStore(pool)
			c := newPoolClient(t, pool)
			live, ok, err := pglock.InternalStore(store).Acquire(ctx, "session:live", "keeper", time.Minute)
			require.NoError(t, err)
			require.True(t, ok)
			stop := time.Now().Add(time.Second)
			var pruned, pruneFailed, churnFailed atomic.Int64
			var wg sync.WaitGroup
			for g := range 4 {
				wg.Go(func() {
					for i := 0; time.Now().Before(stop); i++ {
						key := fmt.Sprintf("session:churn:%d", i%8)
						owner := fmt.Sprintf("o%d", g)
						if _, ok, err := pglock.InternalStore(store).Acquire(ctx, key, owner, time.Minute); err != nil {
							churnFailed.Add(1)
						} else if ok {
							if _, err := pglock.InternalStore(store).Release(ctx, key, owner); err != nil {
								churnFailed.Add(1)
							}
						}
					}
				})
			}
			wg.Go(func() {
				for time.Now().Before(stop) {
					n, err := c.Prune(ctx, 0)
					if err != nil {
						var pgErr *pgconn.PgError
						if !errors.As(err, &pgErr) || pgErr.Code != "40001" {
							t.Errorf("prune: %v", err)
						}
						pruneFailed.Add(1)
						continue
					}
					pruned.Add(n)
				}
			})
			wg.Wait()
			t.Logf("pruned %d rows; prunes failed with 40001: %d; acquire/release failed: %d", pruned.Load(), pruneFailed.Load(), churnFailed.Load())
			h, err := storeHolder(ctx, store, "session:live")
			require.NoError(t, err)
			require.Equal(t, live, h.Token, "a live lock is never pruned")
		})
	}
}

// TestSessionSerializableDistinctKeysNeverFail: with serializable as the pool's default,
// SSI can refuse calls on different keys (40001) that read the same index page, and a
// store call is rolled back then; the store sends it again, so that callers on distinct
// keys never see such an error.
func TestSessionSerializableDistinctKeysNeverFail(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := sessionPool(t, pglocktest.PostgresURL(t), 16, map[string]string{"default_transaction_isolation": "serializable"})
	store := pglock.NewPostgresStore(pool)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 16 {
		wg.Go(func() {
			key, owner := fmt.Sprintf("session:distinct:%d", g), fmt.Sprintf("owner-%d", g)
			for range 40 {
				if _, ok, err := pglock.InternalStore(store).Acquire(ctx, key, owner, time.Minute); err != nil || !ok {
					errs <- fmt.Errorf("acquire %s: %v, %v", key, ok, err)
					return
				}
				if ok, err := pglock.InternalStore(store).Release(ctx, key, owner); err != nil || !ok {
					errs <- fmt.Errorf("release %s: %v, %v", key, ok, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
