package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/pglocktest"
)

// The tutorial's pause: A reads the shelves (salmon kibble: 12) and pauses past its
// ttl; the shelves change; B takes the reconciliation over and writes 9; A resumes.

type shop struct {
	pool         *pgxpool.Pool
	clockA       *pglocktest.ManualClock
	a, b         *pglock.Client
	lockA, lockB *pglock.Lock
	countsA      map[string]int // what A read before its pause
}

const reconciliation = "inventory:stock-reconciliation"

// pausedTTL is the ttl of A's lock: A does nothing while it holds it, and its lease
// ends when the test says.
const pausedTTL = time.Minute

func pauseAWhileBTakesOver(t *testing.T, write func(s *shop, token int64, counts map[string]int) (written int64)) *shop {
	t.Helper()
	pool := pglocktest.Postgres(t)
	_, err := pool.Exec(t.Context(), `
		CREATE TABLE products (id text PRIMARY KEY, in_stock int NOT NULL, stock_fencing_token bigint NOT NULL DEFAULT 0);
		INSERT INTO products (id, in_stock) VALUES ('salmon-kibble-2kg', 12), ('tuna-pate-85g', 40), ('catnip-mouse', 7)`)
	require.NoError(t, err)
	store := pglock.NewPostgresStore(pool)
	s := &shop{pool: pool, clockA: pglocktest.NewManualClock(time.Now())}
	s.a = newClient(t, store, pglock.TTL(pausedTTL), pglock.WithClock(s.clockA))
	// B's acquisition must be confirmed within nine tenths of its ttl, and its lock held
	// when it writes: 5 s, as a loaded machine may answer over a second late.
	s.b = newClient(t, store, pglock.TTL(5*time.Second))

	s.lockA, err = s.a.TryAcquire(t.Context(), reconciliation)
	require.NoError(t, err)
	s.countsA = map[string]int{"salmon-kibble-2kg": 12, "tuna-pate-85g": 40, "catnip-mouse": 7}

	pglock.EndLease(t, pool, reconciliation) // while A is paused
	s.lockB, err = s.b.TryAcquire(t.Context(), reconciliation)
	require.NoError(t, err)
	require.Greater(t, s.lockB.Token(), s.lockA.Token())
	countsB := map[string]int{"salmon-kibble-2kg": 9, "tuna-pate-85g": 38, "catnip-mouse": 7}
	require.EqualValues(t, 3, write(s, s.lockB.Token(), countsB))
	return s
}

func (s *shop) kibble(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, s.pool.QueryRow(t.Context(), "SELECT in_stock FROM products WHERE id = 'salmon-kibble-2kg'").Scan(&n))
	return n
}

func writeUnfenced(t *testing.T) func(*shop, int64, map[string]int) int64 {
	return func(s *shop, _ int64, counts map[string]int) (written int64) {
		for id, n := range counts {
			tag, err := s.pool.Exec(t.Context(), "UPDATE products SET in_stock = $1 WHERE id = $2", n, id)
			require.NoError(t, err)
			written += tag.RowsAffected()
		}
		return written
	}
}

func writeColumnFenced(t *testing.T) func(*shop, int64, map[string]int) int64 {
	return func(s *shop, token int64, counts map[string]int) (written int64) {
		for id, n := range counts {
			w, err := pglock.ExecFenced(t.Context(), s.pool, "UPDATE products SET in_stock = $1 WHERE id = $2",
				"stock_fencing_token", token, n, id)
			require.NoError(t, err)
			written += w
		}
		return written
	}
}

func writeLockFenced(t *testing.T) func(*shop, int64, map[string]int) int64 {
	return func(s *shop, token int64, counts map[string]int) (written int64) {
		for id, n := range counts {
			q, args, err := pglock.FenceHeld("UPDATE products SET in_stock = $1 WHERE id = $2", reconciliation, token, n, id)
			require.NoError(t, err)
			tag, err := s.pool.Exec(t.Context(), q, args...)
			require.NoError(t, err)
			written += tag.RowsAffected()
		}
		return written
	}
}

func TestFencingUnfencedPausedWriterOverwritesFreshCount(t *testing.T) {
	t.Parallel()
	write := writeUnfenced(t)
	s := pauseAWhileBTakesOver(t, write)
	require.EqualValues(t, 3, write(s, s.lockA.Token(), s.countsA)) // A wakes up and writes what it read
	require.Equal(t, 12, s.kibble(t), "the bug: three bags the shop doesn't have")
}

func TestFencingColumnFenceRefusesPausedWriter(t *testing.T) {
	t.Parallel()
	write := writeColumnFenced(t)
	s := pauseAWhileBTakesOver(t, write)
	written := write(s, s.lockA.Token(), s.countsA)
	require.Zero(t, written)
	require.Equal(t, 3, len(s.countsA)-int(written), "the caller learns how many writes were stale")
	require.Equal(t, 9, s.kibble(t))
	var tokens []int64
	rows, err := s.pool.Query(t.Context(), "SELECT DISTINCT stock_fencing_token FROM products")
	require.NoError(t, err)
	for rows.Next() {
		var tok int64
		require.NoError(t, rows.Scan(&tok))
		tokens = append(tokens, tok)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []int64{s.lockB.Token()}, tokens, "every product carries B's token")
}

func TestFencingLockFenceRefusesPausedWriter(t *testing.T) {
	t.Parallel()
	write := writeLockFenced(t)
	s := pauseAWhileBTakesOver(t, write)
	require.Zero(t, write(s, s.lockA.Token(), s.countsA))
	require.Equal(t, 9, s.kibble(t))
}

func TestFencingWriterThatNoticesItsLossWritesNothing(t *testing.T) {
	t.Parallel()
	write := writeColumnFenced(t)
	s := pauseAWhileBTakesOver(t, write)
	s.clockA.Advance(pausedTTL / 3) // A's clock moves before it writes: its renewal is refused
	ctx := s.lockA.Context()
	require.Error(t, ctx.Err())
	var lost *pglock.LockLostError
	require.ErrorAs(t, context.Cause(ctx), &lost)
	require.Equal(t, pglock.LostRefused, lost.Reason)
	_, err := pglock.ExecFenced(ctx, s.pool, "UPDATE products SET in_stock = $1 WHERE id = $2",
		"stock_fencing_token", s.lockA.Token(), 12, "salmon-kibble-2kg")
	require.ErrorIs(t, err, context.Canceled, "a write on the lock's context does not even start")
	require.Equal(t, 9, s.kibble(t))
}

// TestFencingUnderRandomPauses: 16 writers × 100 read-modify-writes, each under its own
// acquisition, some holders paused past their ttl before they write. For both fences no
// update is lost and no accepted write carries a token lower than one written before.
//
// A column fence alone only refuses a write older than one the row has seen: a paused
// holder whose successor has read but not yet written would still land, and the
// successor's write, computed from the same read, would then lose it. So the
// column-fenced writer claims the row with its token when it reads (a fenced no-op
// UPDATE ... RETURNING), which the lock fence does not need.
func TestFencingUnderRandomPauses(t *testing.T) {
	t.Parallel()
	pool := pglocktest.Postgres(t)
	const writers, writes, keys = 16, 100, 8
	const ttl = 50 * time.Millisecond
	tables := [2]string{"column_fenced", "lock_fenced"}
	for _, table := range tables {
		_, err := pool.Exec(t.Context(), `CREATE TABLE `+table+` (key text PRIMARY KEY, value int NOT NULL DEFAULT 0,
			token bigint NOT NULL DEFAULT 0, version int NOT NULL DEFAULT 0);
			INSERT INTO `+table+` (key) SELECT 'k' || i FROM generate_series(0, 7) i`)
		require.NoError(t, err)
	}
	store := pglock.NewPostgresStore(pool)

	type write struct {
		key     string
		version int
		token   int64
	}
	var mu sync.Mutex
	var history [2][]write
	var pauses [2]atomic.Int64
	var wg sync.WaitGroup
	for w := range writers {
		// A clock that never moves: no renewals, so a holder that takes longer than ttl
		// has lost its lock, as a paused process would.
		c := newClient(t, store, pglock.TTL(ttl), pglock.WithClock(pglocktest.NewManualClock(time.Now())))
		wg.Go(func() {
			for i := range writes {
				if err := fencedIncrement(t.Context(), pool, c, i%2, tables[i%2], fmt.Sprintf("k%d", (w+i)%keys), ttl,
					func(key string, version int, token int64) {
						mu.Lock()
						history[i%2] = append(history[i%2], write{key, version, token})
						mu.Unlock()
					}, &pauses[i%2]); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	for fence, table := range tables {
		var sum int64
		require.NoError(t, pool.QueryRow(t.Context(), "SELECT sum(value) FROM "+table).Scan(&sum))
		require.EqualValues(t, len(history[fence]), sum, "%s lost an update", table)
		stale := 0
		byKey := map[string][]write{}
		for _, w := range history[fence] {
			byKey[w.key] = append(byKey[w.key], w)
		}
		for _, ws := range byKey {
			tokens := make([]int64, len(ws)+1) // by version: the order the writes committed
			for _, w := range ws {
				tokens[w.version] = w.token
			}
			for v := 2; v < len(tokens); v++ {
				if tokens[v] < tokens[v-1] {
					stale++
				}
			}
		}
		require.Zero(t, stale, "%s accepted a stale write: its token went back", table)
		require.Positive(t, pauses[fence].Load(), "no holder paused: the test proved nothing")
		t.Logf("%s: %d writes accepted, %d refused, %d holders paused", table, len(history[fence]),
			writers*writes/2-len(history[fence]), pauses[fence].Load())
	}
}

// fencedIncrement takes key's lock on c, reads the counter, sometimes pauses past ttl,
// and writes counter+1 fenced (fence 0: column, 1: lock), reporting an accepted write.
func fencedIncrement(ctx context.Context, pool *pgxpool.Pool, c *pglock.Client, fence int, table, key string,
	ttl time.Duration, accepted func(key string, version int, token int64), pauses *atomic.Int64) error {
	lockKey := table + ":" + key
	var l *pglock.Lock
	for {
		var err error
		if l, err = c.TryAcquire(ctx, lockKey); err == nil {
			break
		} else if !errors.Is(err, pglock.ErrNotAcquired) {
			return err
		}
		time.Sleep(time.Millisecond) // database time: the holder's release or expiry
	}
	defer l.Release(ctx)

	read, args, err := pglock.FenceUpdate("UPDATE column_fenced SET value = value WHERE key = $1 RETURNING value", "token", l.Token(), key)
	if fence == 1 {
		read, args = "SELECT value FROM lock_fenced WHERE key = $1", []any{key}
	}
	if err != nil {
		return err
	}
	var value int
	if err := pool.QueryRow(ctx, read, args...).Scan(&value); errors.Is(err, pgx.ErrNoRows) {
		return nil // a newer holder claimed the row: this one is stale already
	} else if err != nil {
		return err
	}
	if rand.N(12) == 0 { // about 65 pauses a fence, as many as 200 writes each had at 1 in 25
		pauses.Add(1)
		time.Sleep(ttl + 20*time.Millisecond) // paused past the lease
	}
	const write = "UPDATE %s SET value = $1, token = $2, version = version + 1 WHERE key = $3 RETURNING version"
	q, args, err := pglock.FenceUpdate("UPDATE column_fenced SET value = $1, version = version + 1 WHERE key = $2 RETURNING version",
		"token", l.Token(), value+1, key)
	if fence == 1 {
		q, args, err = pglock.FenceHeld(fmt.Sprintf(write, table), lockKey, l.Token(), value+1, l.Token(), key)
	}
	if err != nil {
		return err
	}
	var version int
	if err := pool.QueryRow(ctx, q, args...).Scan(&version); errors.Is(err, pgx.ErrNoRows) {
		return nil // refused
	} else if err != nil {
		return err
	}
	accepted(key, version, l.Token())
	return nil
}
