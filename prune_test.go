package pglock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/pglocktest"
)

// pruneDB is a fresh database seen through one of the two forms of the PostgreSQL
// store; pool reaches the same database for setup and checks.
type pruneDB struct {
	pool   *pgxpool.Pool
	store  *pglock.Store
	client *pglock.Client // for Prune; its clock never moves, so it renews nothing
}

// pruneForms returns a constructor per form of the PostgreSQL store.
func pruneForms() map[string]func(t *testing.T) pruneDB {
	client := func(t *testing.T, store *pglock.Store) *pglock.Client {
		return newClient(t, store, pglock.WithClock(pglocktest.NewManualClock(time.Now())))
	}
	return map[string]func(t *testing.T) pruneDB{
		"pgx": func(t *testing.T) pruneDB {
			pool := pglocktest.Postgres(t)
			store := pglock.NewPostgresStore(pool)
			return pruneDB{pool, store, client(t, store)}
		},
		"database/sql": func(t *testing.T) pruneDB {
			url := pglocktest.PostgresURL(t)
			db, err := sql.Open("pgx", url)
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, db.Close()) })
			store := pglock.NewSQLStore(db)
			return pruneDB{pglocktest.Pool(t, url, 4), store, client(t, store)}
		},
	}
}

// acquire takes key on store for owner "o" and returns its token.
func acquire(t *testing.T, store *pglock.Store, key string, ttl time.Duration) int64 {
	t.Helper()
	token, ok, err := pglock.InternalStore(store).Acquire(t.Context(), key, "o", ttl)
	require.NoError(t, err)
	require.True(t, ok, key)
	return token
}

// released takes key on store and releases it, and returns its token.
func released(t *testing.T, store *pglock.Store, key string) int64 {
	t.Helper()
	token := acquire(t, store, key, time.Minute)
	ok, err := pglock.InternalStore(store).Release(t.Context(), key, "o")
	require.NoError(t, err)
	require.True(t, ok, key)
	return token
}

// endedAnHourAgo moves the end of key's lease an hour back on the database clock.
func endedAnHourAgo(t *testing.T, pool *pgxpool.Pool, key string) {
	t.Helper()
	tag, err := pool.Exec(t.Context(), "UPDATE pglock.locks SET expires_at = clock_timestamp() - interval '1 hour' WHERE key = $1", key)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
}

func TestPruneDeletesOnlyLocksDeadLongerThanTheAge(t *testing.T) {
	t.Parallel()
	for form, open := range pruneForms() {
		t.Run(form, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			db := open(t)
			acquire(t, db.store, "live", time.Minute)
			released(t, db.store, "released-long-ago")
			endedAnHourAgo(t, db.pool, "released-long-ago")
			acquire(t, db.store, "expired-long-ago", time.Minute)
			endedAnHourAgo(t, db.pool, "expired-long-ago")
			released(t, db.store, "released-now")
			acquire(t, db.store, "expired-now", time.Millisecond)
			time.Sleep(5 * time.Millisecond) // database time: expired-now expires

			var endedAtRelease bool
			require.NoError(t, db.pool.QueryRow(ctx, "SELECT expires_at <= clock_timestamp() FROM pglock.locks WHERE key = 'released-now'").
				Scan(&endedAtRelease))
			require.True(t, endedAtRelease, "a release ends the lease: expires_at is the release")

			n, err := db.client.Prune(ctx, 10*time.Minute)
			require.NoError(t, err)
			require.EqualValues(t, 2, n)
			require.Equal(t, []string{"expired-now", "live", "released-now"}, lockKeys(t, db.pool))

			n, err = db.client.Prune(ctx, 0)
			require.NoError(t, err)
			require.EqualValues(t, 2, n)
			require.Equal(t, []string{"live"}, lockKeys(t, db.pool), "a live lock is never pruned")

			n, err = db.client.Prune(ctx, 0)
			require.NoError(t, err)
			require.Zero(t, n)
		})
	}
}

// TestPruneKeepsTheTokenRule: a pruned key acquired again gets a token greater than any
// it had, also when its last token came from the row's floor, above the sequence.
func TestPruneKeepsTheTokenRule(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pruneForms()["pgx"](t)
	for _, c := range []struct {
		name  string
		setUp string // run after the release, before the prune; $1 is the key
	}{
		{"after a release", ""},
		{"when the row's token is above the sequence", "UPDATE pglock.locks SET fencing_token = 1000000 WHERE key = $1"},
		{"when the sequence went back below the row's token", "SELECT setval('pglock.fencing_token_seq', 1) WHERE $1 <> ''"},
		{"when the restarted sequence's next value is the row's token", // the sequence is not called yet
			"UPDATE pglock.locks SET fencing_token = 1 WHERE key = $1; ALTER SEQUENCE pglock.fencing_token_seq RESTART"},
	} {
		t.Run(c.name, func(t *testing.T) {
			key := "token-rule:" + c.name
			released(t, db.store, key)
			if c.setUp != "" {
				conn, err := db.pool.Acquire(ctx)
				require.NoError(t, err)
				// A simple-protocol Exec runs both statements of a set-up; $1 is quoted in.
				_, err = conn.Conn().Exec(ctx, c.setUp, pgx.QueryExecModeSimpleProtocol, key)
				conn.Release()
				require.NoError(t, err)
			}
			var last int64
			require.NoError(t, db.pool.QueryRow(ctx, "SELECT fencing_token FROM pglock.locks WHERE key = $1", key).Scan(&last))
			n, err := db.client.Prune(ctx, 0)
			require.NoError(t, err)
			require.EqualValues(t, 1, n)
			require.NotContains(t, lockKeys(t, db.pool), key)
			require.Greater(t, acquire(t, db.store, key, time.Minute), last) // and kept: the next case prunes only its own
		})
	}
}

// TestPruneRacingAcquisitionsKeepsEveryKeysTokensIncreasing: 8 goroutines prune every
// lock not held, as fast as they can, while 8 others take and release 16 keys. The
// tokens each key was acquired with, in the order of its acquisitions (one holder at a
// time, so the order in which holders record them), strictly increase.
func TestPruneRacingAcquisitionsKeepsEveryKeysTokensIncreasing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pruneForms()["pgx"](t)
	const pruners, workers, rounds, keys = 8, 8, 100, 16
	var mu sync.Mutex
	tokens := map[string][]int64{}
	var pruned, acquired, lost atomic.Int64
	stop := make(chan struct{})
	var pruning sync.WaitGroup
	for range pruners {
		pruning.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				n, err := db.client.Prune(ctx, 0)
				if err != nil {
					t.Error(err)
					return
				}
				pruned.Add(n)
			}
		})
	}
	var working sync.WaitGroup
	for range workers {
		c := newClient(t, db.store, pglock.TTL(time.Minute))
		working.Go(func() {
			for range rounds {
				key := fmt.Sprintf("race:%d", rand.IntN(keys))
				l, err := c.TryAcquire(ctx, key)
				if errors.Is(err, pglock.ErrNotAcquired) {
					lost.Add(1) // to another worker, or to a prune that had the row locked
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				acquired.Add(1)
				mu.Lock()
				tokens[key] = append(tokens[key], l.Token())
				mu.Unlock()
				if err := l.Release(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	working.Wait()
	close(stop)
	pruning.Wait()
	for key, ts := range tokens {
		for i := 1; i < len(ts); i++ {
			require.Greater(t, ts[i], ts[i-1], "%s: tokens %v", key, ts)
		}
	}
	require.Positive(t, pruned.Load(), "nothing was pruned: the test proved nothing")
	require.Greater(t, acquired.Load(), int64(workers*rounds/4), "too few acquisitions raced the prunes")
	t.Logf("%d acquisitions, %d lost, %d rows pruned", acquired.Load(), lost.Load(), pruned.Load())
}

// TestPruneDuringAStalledFirstAcquisitionKeepsTheTokenRule: an acquisition of a key
// without a row stalls inside its INSERT (a trigger waits for an advisory lock the test
// holds, as a descheduled backend would stall). Another acquisition of the key is
// refused meanwhile: a key being created is held (000024; before, the other took the
// key, released it and a prune deleted its row, all while the first stalled). A token
// drawn meanwhile (another key, released and pruned) must still be older than the
// stalled acquisition's once it inserts: PostgreSQL evaluates an INSERT's VALUES before
// the trigger and the conflict check, so a token drawn there would be the older one.
func TestPruneDuringAStalledFirstAcquisitionKeepsTheTokenRule(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pruneForms()["pgx"](t)
	_, err := db.pool.Exec(ctx, `
		CREATE FUNCTION public.stall() RETURNS trigger LANGUAGE plpgsql AS
			$$ BEGIN PERFORM pg_advisory_xact_lock(42); RETURN NEW; END $$;
		CREATE TRIGGER stall BEFORE INSERT ON pglock.locks FOR EACH ROW
			WHEN (NEW.owner = 'stalled') EXECUTE FUNCTION public.stall()`)
	require.NoError(t, err)
	stall, err := db.pool.Begin(ctx) // holds the advisory lock until the prune is done
	require.NoError(t, err)
	defer func() { _ = stall.Rollback(context.WithoutCancel(ctx)) }()
	_, err = stall.Exec(ctx, "SELECT pg_advisory_xact_lock(42)")
	require.NoError(t, err)

	type result struct {
		token int64
		ok    bool
		err   error
	}
	stalled := make(chan result, 1)
	go func() {
		token, ok, err := pglock.InternalStore(db.store).Acquire(ctx, "k", "stalled", time.Minute)
		stalled <- result{token, ok, err}
	}()
	require.Eventually(t, func() bool {
		var stalled bool
		err := db.pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event = 'advisory')`).Scan(&stalled)
		return err == nil && stalled
	}, 5*time.Second, 5*time.Millisecond, "the acquisition stalls in its INSERT")

	_, ok, err := pglock.InternalStore(db.store).Acquire(ctx, "k", "o", time.Minute)
	require.NoError(t, err)
	require.False(t, ok, "a key being created is held")
	other := released(t, db.store, "k2")
	n, err := db.client.Prune(ctx, 0)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.NoError(t, stall.Rollback(ctx)) // the stalled acquisition goes on

	r := <-stalled
	require.NoError(t, r.err)
	require.True(t, r.ok, "the key was free")
	require.Greater(t, r.token, other, "the stalled acquisition got a token older than one drawn while it stalled")
}

// TestPruneSkipsTheRowOfAnOpenFencedTx: an expired lock whose row an open fenced
// transaction has locked is neither pruned nor waited for.
func TestPruneSkipsTheRowOfAnOpenFencedTx(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pruneForms()["pgx"](t)
	_, err := db.pool.Exec(ctx, "CREATE TABLE stock (id int PRIMARY KEY, n int NOT NULL); INSERT INTO stock VALUES (1, 0)")
	require.NoError(t, err)
	token := acquire(t, db.store, "fenced:a", time.Minute)
	released(t, db.store, "old:b")
	endedAnHourAgo(t, db.pool, "old:b")

	tx, err := db.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	written, err := fencedWrite(ctx, tx, "fenced:a", token, 5)
	require.NoError(t, err)
	require.EqualValues(t, 1, written)
	endedAnHourAgo(t, db.pool, "fenced:a") // not blocked: the fenced tx's lock lets the row change

	pruneCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	start := time.Now()
	n, err := db.client.Prune(pruneCtx, 0)
	require.NoError(t, err)
	took := time.Since(start)
	require.EqualValues(t, 1, n)
	require.Equal(t, []string{"fenced:a"}, lockKeys(t, db.pool))

	require.NoError(t, tx.Commit(ctx))
	start = time.Now()
	n, err = db.client.Prune(ctx, 0) // a like prune, with nothing to wait for
	require.NoError(t, err)
	requirePrompt(t, took, time.Second, time.Since(start), "the prune waited for the fenced tx")
	require.EqualValues(t, 1, n)
	require.Empty(t, lockKeys(t, db.pool))
	require.Greater(t, acquire(t, db.store, "fenced:a", time.Minute), token)
}

// TestPruneReturnsAtOnceWhileAnotherPruneRuns: prunes take turns without waiting.
func TestPruneReturnsAtOnceWhileAnotherPruneRuns(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pruneForms()["pgx"](t)
	released(t, db.store, "a")
	released(t, db.store, "b")
	// Two connections open already: the prune that must not wait would otherwise wait
	// for a new one, over a second on a loaded machine.
	c1, err := db.pool.Acquire(ctx)
	require.NoError(t, err)
	c2, err := db.pool.Acquire(ctx)
	require.NoError(t, err)
	c1.Release()
	c2.Release()

	other, err := db.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = other.Rollback(context.WithoutCancel(ctx)) }()
	var n int64
	require.NoError(t, other.QueryRow(ctx, "SELECT pglock.lock_prune(0, 1)").Scan(&n))
	require.EqualValues(t, 1, n)

	pruneCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	start := time.Now()
	n, err = db.client.Prune(pruneCtx, 0)
	require.NoError(t, err)
	took := time.Since(start)
	require.Zero(t, n, "a prune ran while another was running")

	require.NoError(t, other.Commit(ctx))
	start = time.Now()
	n, err = db.client.Prune(ctx, 0) // a like prune, with nothing to wait for
	require.NoError(t, err)
	requirePrompt(t, took, time.Second, time.Since(start), "the prune waited for the other")
	require.EqualValues(t, 1, n)
	require.Empty(t, lockKeys(t, db.pool))
}

// TestPruneDeletesInBatchesUntilDone: 2,500 dead rows take three statements.
func TestPruneDeletesInBatchesUntilDone(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pruneForms()["pgx"](t)
	_, err := db.pool.Exec(ctx, `INSERT INTO pglock.locks (key, owner, fencing_token, expires_at)
		SELECT 'dead:' || g, NULL, g, clock_timestamp() - interval '1 hour' FROM generate_series(1, 2500) g`)
	require.NoError(t, err)
	acquire(t, db.store, "live", time.Minute)
	n, err := db.client.Prune(ctx, time.Minute)
	require.NoError(t, err)
	require.EqualValues(t, 2500, n)
	require.Equal(t, []string{"live"}, lockKeys(t, db.pool))
	require.Greater(t, acquire(t, db.store, "dead:2500", time.Minute), int64(2500))
}

func TestPruneRefusesBadInputAndTouchesNothing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pruneForms()["pgx"](t)
	released(t, db.store, "dead")
	endedAnHourAgo(t, db.pool, "dead")

	n, err := db.client.Prune(ctx, -time.Nanosecond)
	require.ErrorIs(t, err, pglock.ErrInvalidArgument)
	require.ErrorContains(t, err, "olderThan")
	require.Zero(t, n)

	canceled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = db.client.Prune(canceled, 0)
	require.ErrorIs(t, err, context.Canceled)

	for _, args := range [][2]int64{{-1, 10}, {0, 0}, {0, -1}} {
		_, err := db.pool.Exec(ctx, "SELECT pglock.lock_prune($1, $2)", args[0], args[1])
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, "lock_prune(%d, %d)", args[0], args[1])
		require.Equal(t, "22023", pgErr.Code, "invalid_parameter_value")
	}
	require.Equal(t, []string{"dead"}, lockKeys(t, db.pool))
}

func TestPruneOnTheMemoryStore(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	clock := pglocktest.NewManualClock(time.Now())
	store := pglock.NewMemoryStore(clock)
	c := newClient(t, store)
	acquire(t, store, "live", time.Hour)
	old := released(t, store, "released")
	acquire(t, store, "expired", time.Minute)
	for i := range 2500 {
		released(t, store, fmt.Sprintf("dead:%d", i))
	}
	clock.Advance(10 * time.Minute)
	released(t, store, "released-now")

	n, err := c.Prune(ctx, 5*time.Minute)
	require.NoError(t, err)
	require.EqualValues(t, 2502, n)
	clock.Advance(time.Millisecond)
	n, err = c.Prune(ctx, 0)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "released-now")
	holder, err := storeHolder(ctx, store, "live")
	require.NoError(t, err)
	require.True(t, holder.Held, "a live lock is never pruned")
	require.Greater(t, acquire(t, store, "released", time.Minute), old)
}

// Prune deletes what dead fair waiters and emptied semaphores leave behind: a waiter
// row not polled for a minute, and the row of a semaphore none of whose permits has a
// row left; never a waiter polled within the minute nor a semaphore with a permit row.
// A semaphore pruned so is taken again as before, its tokens still growing.
func TestPruneDeletesWhatDeadWaitersAndEmptySemaphoresLeave(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	d := pruneForms()["pgx"](t)
	empty, err := d.client.Semaphore("sem:empty", 2)
	require.NoError(t, err)
	l, err := empty.TryAcquire(ctx)
	require.NoError(t, err)
	first := l.Token()
	require.NoError(t, l.Release(ctx))
	held, err := d.client.Semaphore("sem:held", 2)
	require.NoError(t, err)
	_, err = held.TryAcquire(ctx)
	require.NoError(t, err)
	_, err = d.pool.Exec(ctx, `INSERT INTO pglock.waiters (key, owner, ttl_ms, seen_at) VALUES
		('dead', 'o', 1000, clock_timestamp() - interval '61 seconds'),
		('alive', 'o', 1000, clock_timestamp() - interval '50 seconds')`)
	require.NoError(t, err)

	n, err := d.client.Prune(ctx, 0)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "the released permit's row")
	rows := func(q string) []string {
		r, err := d.pool.Query(ctx, q)
		require.NoError(t, err)
		keys, err := pgx.CollectRows(r, pgx.RowTo[string])
		require.NoError(t, err)
		return keys
	}
	require.Equal(t, []string{"sem:held"}, rows("SELECT key FROM pglock.semaphores ORDER BY key"))
	require.Equal(t, []string{"alive"}, rows("SELECT key FROM pglock.waiters ORDER BY key"))

	l, err = empty.TryAcquire(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, l.Permit())
	require.Greater(t, l.Token(), first)
}
