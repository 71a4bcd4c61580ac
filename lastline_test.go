package pglock_test

// The SQL functions are the last line (migration 000027): README lets an application
// role call every one of them, so what that role passes them must not break what the Go
// API promises.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/tcpproxy"
	"github.com/pgfence/pglock/pglocktest"
)

// livePermits counts the live holders of the semaphore key's permits.
func livePermits(t testing.TB, pool *pgxpool.Pool, key string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM pglock.locks
		WHERE key LIKE $1 || chr(31) || '%' AND owner IS NOT NULL AND expires_at > clock_timestamp()`, key).Scan(&n))
	return n
}

// TestSQLNoLockCallMintsAPermit: a semaphore of 2, both permits held; an application
// role asks for a third by its row key through every lock call. Each is refused, the
// semaphore keeps 2 live holders, and its own queue stays free for the Go API's callers.
func TestSQLNoLockCallMintsAPermit(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dbURL := pglocktest.PostgresURL(t)
	admin := pglocktest.Pool(t, dbURL, 2)
	app := pglocktest.Pool(t, newRole(t, dbURL, appGrants...), 4)
	for _, owner := range []string{"a", "b"} {
		var permit *int
		require.NoError(t, app.QueryRow(ctx, "SELECT permit FROM pglock.sem_acquire('s', $1, 60000, 2)", owner).Scan(&permit))
		require.NotNil(t, permit)
	}
	for _, q := range []string{
		"SELECT pglock.lock_acquire('s' || chr(31) || '3', 'rogue', 60000)",
		"SELECT pglock.lock_acquire_or_want('s' || chr(31) || '4', 'rogue', 60000)",
		"SELECT * FROM pglock.queue_acquire('s' || chr(31) || '5', 'rogue', 60000, 0)",
		"SELECT * FROM pglock.queue_acquire('s' || chr(31), 'rogue', 60000, 0)",
	} {
		_, err := app.Exec(ctx, q)
		requireSQLState(t, err, "22023")
	}
	require.Equal(t, 2, livePermits(t, admin, "s"))
	require.Zero(t, queued(t, admin, semQueue("s")), "a lock's waiter in the semaphore's queue")

	// A Go client's fair and plain acquisitions of the semaphore are not held up: each
	// takes the permit a release frees.
	c := newPoolClient(t, app)
	sem, err := c.Semaphore("s", 2)
	require.NoError(t, err)
	var released bool
	require.NoError(t, app.QueryRow(ctx, "SELECT pglock.lock_release('s' || chr(31) || '1', 'a')").Scan(&released))
	require.True(t, released)
	l, err := sem.TryAcquire(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, l.Permit())
	require.NoError(t, app.QueryRow(ctx, "SELECT pglock.lock_release('s' || chr(31) || '2', 'b')").Scan(&released))
	require.True(t, released)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	f, err := sem.Acquire(wctx, pglock.Fair())
	require.NoError(t, err)
	require.Equal(t, 2, f.Permit())
	require.NoError(t, l.Release(ctx))
	require.NoError(t, f.Release(ctx))
}

// TestSQLAWaitersOwnerNeverBlocksARelease: a waiter queued with an owner past the bound
// is refused; one at the bound (255 characters of 4 bytes each) is granted the key when
// its holder releases it, by a release and by a force-release, whose notification
// carries that owner.
func TestSQLAWaitersOwnerNeverBlocksARelease(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dbURL := pglocktest.PostgresURL(t)
	app := pglocktest.Pool(t, newRole(t, dbURL, appGrants...), 4)
	var token int64
	require.NoError(t, app.QueryRow(ctx, "SELECT pglock.lock_acquire('k', 'holder', 60000)").Scan(&token))
	_, err := app.Exec(ctx, "SELECT * FROM pglock.queue_acquire('k', repeat('x', 9000), 60000, 0)")
	requireSQLState(t, err, "22023")

	listener, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer listener.Close(context.WithoutCancel(ctx))
	_, err = listener.Exec(ctx, "LISTEN pglock_granted")
	require.NoError(t, err)
	longest := strings.Repeat("𝄞", 255)
	for _, release := range []string{
		"SELECT pglock.lock_release('k', 'holder')",
		"SELECT owner IS NOT NULL FROM pglock.lock_force_release('k')",
	} {
		var ticket int64
		require.NoError(t, app.QueryRow(ctx, "SELECT ticket FROM pglock.queue_acquire('k', $1, 60000, 0)", longest).Scan(&ticket))
		require.Positive(t, ticket)
		var ok bool
		require.NoError(t, app.QueryRow(ctx, release).Scan(&ok), release)
		require.True(t, ok, release)
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		n, err := listener.WaitForNotification(wctx)
		cancel()
		require.NoError(t, err)
		require.Equal(t, longest, n.Payload)
		var claimed *int64
		require.NoError(t, app.QueryRow(ctx, "SELECT fencing_token FROM pglock.queue_poll('k', $1)", ticket).Scan(&claimed))
		require.NotNil(t, claimed, "the grant claimed")
		// The waiter holds it: hand it to the next round's holder.
		require.NoError(t, app.QueryRow(ctx, "SELECT pglock.lock_release('k', $1)", longest).Scan(&ok))
		require.True(t, ok)
		require.NoError(t, app.QueryRow(ctx, "SELECT pglock.lock_acquire('k', 'holder', 60000)").Scan(&token))
	}
}

// session is a connection of its own, for a test that runs statements side by side, and
// its backend's pid.
func session(t *testing.T, dbURL string) (*pgx.Conn, int32) {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dbURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn, int32(conn.PgConn().PID())
}

// awaitLockWait waits until the backend pid waits for a lock.
func awaitLockWait(t *testing.T, admin *pgxpool.Pool, pid int32) {
	t.Helper()
	require.Eventually(t, func() bool {
		var waiting bool
		err := admin.QueryRow(t.Context(), "SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1", pid).
			Scan(&waiting)
		return err == nil && waiting
	}, 10*time.Second, time.Millisecond, "backend %d waits for a lock", pid)
}

// TestSQLReleasesOfPermitsAndAForceReleaseNeverDeadlock: a semaphore of 2 with a fair
// waiter. One session keeps the waiter's row locked (its poll in an open transaction);
// a second releases both permits in one lock_release_many, and waits for that row to
// grant permit 1; a third force-releases permit 2. Before 000027, the second held the
// semaphore's row and waited for permit 2's, which the third held while it waited for
// the semaphore's row: a deadlock (40P01) once the first committed. In the lock order,
// the third waits for the semaphore's row first, holding nothing.
func TestSQLReleasesOfPermitsAndAForceReleaseNeverDeadlock(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dbURL := pglocktest.PostgresURL(t)
	admin := pglocktest.Pool(t, dbURL, 2)
	for _, owner := range []string{"a", "b"} {
		_, err := admin.Exec(ctx, "SELECT * FROM pglock.sem_acquire('s', $1, 60000, 2)", owner)
		require.NoError(t, err)
	}
	// The sessions first: a waiter not seen for a second is dead, and connecting on a
	// loaded machine can take that long.
	poller, _ := session(t, dbURL)
	releaser, releaserPID := session(t, dbURL)
	breaker, breakerPID := session(t, dbURL)
	var ticket int64
	require.NoError(t, admin.QueryRow(ctx, "SELECT ticket FROM pglock.queue_acquire('s', 'w', 60000, 2)").Scan(&ticket))
	require.Positive(t, ticket)
	tx, err := poller.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "SELECT * FROM pglock.queue_poll('s', $1)", ticket)
	require.NoError(t, err)

	released := make(chan error, 1)
	go func() {
		_, err := releaser.Exec(ctx, "SELECT * FROM pglock.lock_release_many(ARRAY['s' || chr(31) || '1', 's' || chr(31) || '2'], ARRAY['a', 'b'], true)")
		released <- err
	}()
	awaitLockWait(t, admin, releaserPID)
	broken := make(chan error, 1)
	go func() {
		_, err := breaker.Exec(ctx, "SELECT * FROM pglock.lock_force_release('s' || chr(31) || '2')")
		broken <- err
	}()
	awaitLockWait(t, admin, breakerPID)
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, receive(t, released, "the releases"))
	require.NoError(t, receive(t, broken, "the force-release"))

	// Permit 1 went to the waiter, whoever released permit 2 last.
	var owner string
	require.NoError(t, admin.QueryRow(ctx, "SELECT owner FROM pglock.locks WHERE key = 's' || chr(31) || '1'").Scan(&owner))
	require.Equal(t, "w", owner)
}

// TestFairClaimWhoseReplyIsLostIsNotLost: a fair waiter's poll claims the key granted
// to it, and the link breaks before the reply comes back. At its next poll the waiter
// finds its ticket gone and queues again under the same owner: it gets the key its
// lost claim took, with that claim's token, instead of queueing behind itself until
// the ttl (a minute here). The waiter's clock is a ManualClock, so that it polls only
// when the test says.
func TestFairClaimWhoseReplyIsLostIsNotLost(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dbURL := pglocktest.PostgresURL(t)
	admin := pglocktest.Pool(t, dbURL, 2)
	holder := newPoolClient(t, admin, pglock.WithoutListener())
	h, err := holder.TryAcquire(ctx, "k")
	require.NoError(t, err)

	// Each statement in one message (the unnamed statement), so that the one the proxy
	// lets through whole is the one that runs.
	pool, proxy := proxiedPool(t, dbURL+"&default_query_exec_mode=exec", 2)
	clock := pglocktest.NewManualClock(time.Now())
	waiter := newClient(t, pglock.NewPostgresStore(pool), pglock.WithClock(clock), pglock.TTL(time.Minute),
		pglock.WithInstanceName("waiter"), quiet)
	done := fairAcquire(ctx, waiter, "k")
	awaitQueued(t, admin, "k", 1)
	require.NoError(t, h.Release(ctx)) // granted to the waiter, which sleeps on its clock

	claimed := proxy.BlackholeAfter(func(chunk []byte) bool { return strings.Contains(string(chunk), "queue_poll") })
	require.Eventually(t, func() bool { // until its pause began on the clock and ended
		select {
		case <-claimed:
			return true
		default:
			clock.Advance(100 * time.Millisecond)
			return false
		}
	}, 10*time.Second, 5*time.Millisecond, "the waiter's poll sent")
	var token int64
	require.Eventually(t, func() bool {
		err := admin.QueryRow(ctx, `SELECT fencing_token FROM pglock.locks WHERE key = 'k' AND owner LIKE 'waiter/%'
			AND expires_at > clock_timestamp() + interval '30 seconds'`).Scan(&token)
		return err == nil
	}, 10*time.Second, time.Millisecond, "the claim committed")
	require.Zero(t, queued(t, admin, "k"))
	proxy.Drop() // the claim's reply is lost with the link
	proxy.Restore()

	var got acquired
	require.Eventually(t, func() bool {
		select {
		case got = <-done:
			return true
		default:
			clock.Advance(time.Second)
			return false
		}
	}, 10*time.Second, 5*time.Millisecond, "the waiter has the key")
	require.NoError(t, got.err)
	require.Equal(t, token, got.l.Token(), "the token of the lost claim")
	var owner string
	require.NoError(t, admin.QueryRow(ctx, "SELECT owner FROM pglock.locks WHERE key = 'k'").Scan(&owner))
	require.Equal(t, got.l.Owner(), owner)
	require.NoError(t, got.l.Release(ctx))
}

// TestAPermitHandedBackByOwnerGoesToTheQueue: a permit handed back by its owner without
// its number (lock_release_many of the semaphore's key and U+001F: a client's hand-back
// of an acquisition whose reply was lost; sem_release) is granted to the head of the
// semaphore's queue in the same call, as a release of the permit by number is.
func TestAPermitHandedBackByOwnerGoesToTheQueue(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	admin := pglocktest.Postgres(t)
	for i, handBack := range []string{
		"SELECT count(*) = 1 FROM pglock.lock_release_many(ARRAY['s0' || chr(31)], ARRAY['o'], true)",
		"SELECT pglock.sem_release('s1', 'o')",
	} {
		key := "s" + string(rune('0'+i))
		_, err := admin.Exec(ctx, "SELECT * FROM pglock.sem_acquire($1, 'o', 60000, 1)", key)
		require.NoError(t, err)
		var ticket int64
		require.NoError(t, admin.QueryRow(ctx, "SELECT ticket FROM pglock.queue_acquire($1, 'w', 60000, 1)", key).Scan(&ticket))
		require.Positive(t, ticket)
		var ok bool
		require.NoError(t, admin.QueryRow(ctx, handBack).Scan(&ok))
		require.True(t, ok, handBack)
		var owner string
		require.NoError(t, admin.QueryRow(ctx, "SELECT owner FROM pglock.locks WHERE key = $1 || chr(31) || '1'", key).Scan(&owner))
		require.Equal(t, "w", owner, "%s: the permit granted to the queue's head", handBack)
	}
}

// TestPruneSparesASemaphoreWithWaiters: lock_prune deletes a semaphore's row once none
// of its permits has a row left, but not while its queue has waiters; a waiter's poll
// makes the row again if it is gone, so that its take is made under it.
func TestPruneSparesASemaphoreWithWaiters(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	admin := pglocktest.Postgres(t)
	_, err := admin.Exec(ctx, "SELECT * FROM pglock.sem_acquire('s', 'o', 60000, 1)")
	require.NoError(t, err)
	var ticket int64
	require.NoError(t, admin.QueryRow(ctx, "SELECT ticket FROM pglock.queue_acquire('s', 'w', 60000, 1)").Scan(&ticket))
	// The holder's permit row goes (released, pruned), the waiter stays queued.
	_, err = admin.Exec(ctx, "UPDATE pglock.waiters SET granted = NULL")
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "UPDATE pglock.locks SET owner = NULL, expires_at = clock_timestamp() - interval '1 hour'")
	require.NoError(t, err)
	var pruned int64
	require.NoError(t, admin.QueryRow(ctx, "SELECT pglock.lock_prune(0, 100)").Scan(&pruned))
	require.EqualValues(t, 1, pruned)
	var semaphores int
	require.NoError(t, admin.QueryRow(ctx, "SELECT count(*) FROM pglock.semaphores").Scan(&semaphores))
	require.Equal(t, 1, semaphores, "the row of a semaphore with a waiter")

	_, err = admin.Exec(ctx, "DELETE FROM pglock.semaphores") // as an older prune did
	require.NoError(t, err)
	var permit *int
	require.NoError(t, admin.QueryRow(ctx, "SELECT permit FROM pglock.queue_poll('s', $1)", ticket).Scan(&permit))
	require.NotNil(t, permit)
	require.Equal(t, 1, *permit)
	require.NoError(t, admin.QueryRow(ctx, "SELECT count(*) FROM pglock.semaphores WHERE key = 's'").Scan(&semaphores))
	require.Equal(t, 1, semaphores, "the poll made the semaphore's row again")
}

// TestFairSemaphoreGrantsNoPermitAboveTheHeadsNumber: holders of permits 1 to 3 of a
// semaphore of 3, and a fair waiter that asks for a semaphore of 2. The release of
// permit 1 leaves 2 live holders: nothing for the waiter. The release of permit 3 leaves
// 1, but permit 3 is not one of its 2: it must not be handed it, and takes permit 1.
func TestFairSemaphoreGrantsNoPermitAboveTheHeadsNumber(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	pool := pglocktest.Postgres(t)
	c := newPoolClient(t, pool)
	three, err := c.Semaphore("s", 3)
	require.NoError(t, err)
	var held []*pglock.Lock
	for range 3 {
		l, err := three.TryAcquire(ctx)
		require.NoError(t, err)
		held = append(held, l)
	}
	two, err := newPoolClient(t, pool).Semaphore("s", 2)
	require.NoError(t, err)
	done := fairPermit(ctx, two)
	awaitQueued(t, pool, semQueue("s"), 1)
	require.NoError(t, held[0].Release(ctx))
	require.NoError(t, held[2].Release(ctx))
	got := receive(t, done, "the waiter's permit")
	require.NoError(t, got.err)
	require.Equal(t, 1, got.l.Permit(), "a permit within the waiter's 2")
	require.NoError(t, got.l.Release(ctx))
	require.NoError(t, held[1].Release(ctx))
}

// TestFairWaiterTakesAnExpiredKeyPastADeadWaiter: the holder of a key dies (its lease
// expires, nobody releases it), and the head of the key's queue is dead too (queued,
// never polled since). The live waiter behind it must take the key once the dead one
// has not polled for Q, not wait behind it.
func TestFairWaiterTakesAnExpiredKeyPastADeadWaiter(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	pool := pglocktest.Postgres(t)
	var token int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT pglock.lock_acquire('k', 'dead-holder', 500)").Scan(&token))
	var dead int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT ticket FROM pglock.queue_acquire('k', 'dead-waiter', 60000, 0)").Scan(&dead))
	require.Positive(t, dead)
	c := newPoolClient(t, pool)
	done := fairAcquire(ctx, c, "k")
	got := receive(t, done, "the live waiter's lock")
	require.NoError(t, got.err)
	require.Greater(t, got.l.Token(), token)
	require.NoError(t, got.l.Release(ctx))
}

// TestHandBackRetriesAGrantThatCommitsAfterTheError: an acquisition's statement is
// on its way to the server when the link breaks on the client's side: the client gets
// an error, and the statement, held 150 ms on the way, commits its grant after that.
// The hand-back's first release finds nothing; a later one must release the key, long
// before its ttl.
func TestHandBackRetriesAGrantThatCommitsAfterTheError(t *testing.T) {
	// Not parallel: the grant must commit within the hand-back's few seconds of
	// retries, and the 150 ms on the way is the proxy's timer, late on a loaded machine.
	ctx := t.Context()
	dbURL := pglocktest.PostgresURL(t)
	admin := pglocktest.Pool(t, dbURL, 2)
	pool, proxy := proxiedPool(t, dbURL+"&default_query_exec_mode=exec", 2) // one message a statement
	c := newPoolClient(t, pool, pglock.WithoutListener(), pglock.TTL(time.Minute))
	proxy.SetDelay(tcpproxy.ToServer, 150*time.Millisecond)
	sent := proxy.Sent(func(chunk []byte) bool { return strings.Contains(string(chunk), "lock_acquire(") })
	done := make(chan error, 1)
	go func() {
		_, err := c.TryAcquire(context.Background(), "late")
		done <- err
	}()
	await(t, sent)
	proxy.Drop()
	proxy.SetDelay(tcpproxy.ToServer, 0)
	err := receive(t, done, "the acquisition's error")
	require.Error(t, err)
	require.NotErrorIs(t, err, pglock.ErrNotAcquired)
	// The key is new: its row exists only once the grant has committed, and its owner
	// is NULL once that grant is handed back (a poll could miss a grant handed back
	// within a few milliseconds; the row cannot).
	require.Eventually(t, func() bool {
		var released bool
		err := admin.QueryRow(ctx, "SELECT owner IS NULL FROM pglock.locks WHERE key = 'late'").Scan(&released)
		return err == nil && released
	}, 10*time.Second, 2*time.Millisecond, "the grant came and was handed back")
}

// TestTokensStayAboveTheTimelineFloor: on a server whose timeline is 3 (it was
// promoted twice), every token drawn is above the floor of its timeline, 2 << 40, so
// that it is above every token the timelines before it gave: a lock's, a permit's, a
// fair waiter's take. The timeline is stood in by replacing pglock.fencing_timeline in this
// test's database; a promoted server is what .ci/failover tests.
func TestTokensStayAboveTheTimelineFloor(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pglocktest.Postgres(t)
	_, err := pool.Exec(ctx, "CREATE OR REPLACE FUNCTION pglock.fencing_timeline() RETURNS bigint LANGUAGE sql VOLATILE AS 'SELECT 3::bigint'")
	require.NoError(t, err)
	const floor = int64(2) << 40
	c := newPoolClient(t, pool)
	l, err := c.TryAcquire(ctx, "k")
	require.NoError(t, err)
	require.Greater(t, l.Token(), floor)
	require.NoError(t, l.Release(ctx))
	sem, err := c.Semaphore("s", 2)
	require.NoError(t, err)
	p, err := sem.TryAcquire(ctx)
	require.NoError(t, err)
	require.Greater(t, p.Token(), floor)
	f, err := c.Acquire(ctx, "fair", pglock.Fair())
	require.NoError(t, err)
	require.Greater(t, f.Token(), floor)
	again, err := c.TryAcquire(ctx, "k")
	require.NoError(t, err)
	require.Greater(t, again.Token(), l.Token())
	for _, l := range []*pglock.Lock{p, f, again} {
		require.NoError(t, l.Release(ctx))
	}
}

// pgErrCode returns err's SQLSTATE, "" for none.
func pgErrCode(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// TestUpgradeFrom26KeepsHoldersTokensAndQueues: a database at schema 26 with a lock
// held, permits of a semaphore held and fair waiters queued on both is upgraded to the
// latest schema: every holder keeps its key, its token and its lease, every waiter its
// ticket and place; then a release hands each key to the head of its queue, with a
// greater token, as before the upgrade.
func TestUpgradeFrom26KeepsHoldersTokensAndQueues(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dbURL := pglocktest.PostgresURL(t)
	admin := pglocktest.Pool(t, dbURL, 2)
	later := laterMigrations(t, 26)
	for i := len(later) - 1; i >= 0; i-- {
		_, err := admin.Exec(ctx, later[i].down)
		require.NoError(t, err, later[i].name)
	}
	var lockToken int64
	require.NoError(t, admin.QueryRow(ctx, "SELECT pglock.lock_acquire('k', 'holder', 60000)").Scan(&lockToken))
	for _, owner := range []string{"p1", "p2"} {
		_, err := admin.Exec(ctx, "SELECT * FROM pglock.sem_acquire('s', $1, 60000, 2)", owner)
		require.NoError(t, err)
	}
	tickets := map[string]int64{}
	for _, w := range []struct{ key, owner string }{{"k", "w1"}, {"k", "w2"}, {"s", "w3"}, {"s", "w4"}} {
		var ticket int64
		permits := 0
		if w.key == "s" {
			permits = 2
		}
		require.NoError(t, admin.QueryRow(ctx, "SELECT ticket FROM pglock.queue_acquire($1, $2, 60000, $3)", w.key, w.owner, permits).
			Scan(&ticket))
		require.Positive(t, ticket, w.owner)
		tickets[w.owner] = ticket
	}
	type row struct {
		Key, Owner string
		Token      int64
		Expires    time.Time
	}
	snapshot := func() (locks []row, waiters []string) {
		rows, err := admin.Query(ctx, "SELECT key, owner, fencing_token, expires_at FROM pglock.locks ORDER BY key")
		require.NoError(t, err)
		locks, err = pgx.CollectRows(rows, pgx.RowToStructByPos[row])
		require.NoError(t, err)
		rows, err = admin.Query(ctx, "SELECT format('%s %s %s %s', key, ticket, owner, granted) FROM pglock.waiters ORDER BY ticket")
		require.NoError(t, err)
		waiters, err = pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return locks, waiters
	}
	locks, waiters := snapshot()
	for _, m := range later {
		_, err := admin.Exec(ctx, m.up)
		require.NoError(t, err, m.name)
	}
	locksAfter, waitersAfter := snapshot()
	require.Equal(t, locks, locksAfter, "holders, tokens and leases")
	require.Equal(t, waiters, waitersAfter, "the queues")

	var ok bool
	require.NoError(t, admin.QueryRow(ctx, "SELECT pglock.lock_release('k', 'holder')").Scan(&ok))
	require.True(t, ok)
	require.NoError(t, admin.QueryRow(ctx, "SELECT pglock.lock_release('s' || chr(31) || '2', 'p2')").Scan(&ok))
	require.True(t, ok)
	for owner, key := range map[string]string{"w1": "k", "w3": "s"} {
		var token *int64
		require.NoError(t, admin.QueryRow(ctx, "SELECT fencing_token FROM pglock.queue_poll($1, $2)", key, tickets[owner]).Scan(&token))
		require.NotNil(t, token, "%s, the head of %q's queue, claims it", owner, key)
		require.Greater(t, *token, lockToken)
	}
}

// TestLockOrderHoldsUnderARaceOfEverything: fair waiters of a lock and of a semaphore
// queue, poll, claim, take, leave and release, while other sessions force-release the
// key and the permits, renew and release in batches whatever is held, in random orders,
// all as plain SQL calls (no retry hides a failure). In the one lock order of 000027 no
// call ever fails with a deadlock (40P01), nor with anything else.
func TestLockOrderHoldsUnderARaceOfEverything(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	pool := pglocktest.Pool(t, pglocktest.PostgresURL(t), 16)
	var errs errorList
	exec := func(q string, args ...any) pgx.Rows {
		rows, err := pool.Query(ctx, q, args...)
		if err != nil {
			errs.add(fmt.Errorf("%.60s: %w", q, err))
			return nil
		}
		return rows
	}
	collect := func(rows pgx.Rows, q string, dest ...any) bool {
		if rows == nil {
			return false
		}
		defer rows.Close()
		got := false
		for rows.Next() {
			if err := rows.Scan(dest...); err != nil {
				errs.add(err)
				return false
			}
			got = true
		}
		if err := rows.Err(); err != nil && ctx.Err() == nil {
			errs.add(fmt.Errorf("%.60s: %w", q, err))
		}
		return got
	}
	end := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	// Fair waiters: of the lock "L" (permits 0) and of the semaphore "S" of 2.
	for i := range 6 {
		wg.Go(func() {
			key, permits := "L", 0
			if i%2 == 1 {
				key, permits = "S", 2
			}
			for n := 0; time.Now().Before(end); n++ {
				owner := fmt.Sprintf("w%d-%d", i, n)
				var token, ticket *int64
				var permit *int32
				q := "SELECT fencing_token, ticket, permit FROM pglock.queue_acquire($1, $2, 2000, $3)"
				if !collect(exec(q, key, owner, permits), q, &token, &ticket, &permit) {
					return
				}
				for polls := 0; token == nil && ticket != nil && polls < 100; polls++ {
					var queued bool
					q := "SELECT fencing_token, queued, permit FROM pglock.queue_poll($1, $2)"
					if !collect(exec(q, key, *ticket), q, &token, &queued, &permit) {
						return
					}
					if !queued && token == nil {
						break
					}
				}
				switch {
				case token == nil && ticket != nil:
					collect(exec("SELECT pglock.queue_leave($1, $2)", key, *ticket), "queue_leave", new(bool))
				case token != nil && permits > 0 && n%2 == 0:
					collect(exec("SELECT pglock.sem_release($1, $2)", key, owner), "sem_release", new(bool))
				case token != nil && permits > 0:
					row := fmt.Sprintf("%s\x1f%d", key, *permit)
					collect(exec("SELECT * FROM pglock.lock_release_many(ARRAY[$1, 'L'], ARRAY[$2, $2], true)", row, owner), "release many", new(int32))
				case token != nil:
					collect(exec("SELECT pglock.lock_release_async($1, $2)", key, owner), "release", new(bool))
				}
			}
		})
	}
	// Force-releases, and batches over whatever is held.
	wg.Go(func() {
		for time.Now().Before(end) {
			for _, key := range []string{"L", "S\x1f2", "S\x1f1"} {
				var owner *string
				collect(exec("SELECT owner FROM pglock.lock_force_release($1)", key), "force", &owner)
			}
		}
	})
	for g := range 2 {
		wg.Go(func() {
			for time.Now().Before(end) {
				var keys, owners []string
				rows := exec("SELECT key, owner FROM pglock.locks WHERE owner IS NOT NULL ORDER BY random()")
				if rows == nil {
					return
				}
				for rows.Next() {
					var k, o string
					if rows.Scan(&k, &o) == nil {
						keys, owners = append(keys, k), append(owners, o)
					}
				}
				rows.Close()
				if g == 0 {
					collect(exec("SELECT * FROM pglock.lock_renew_many($1::text[], $2::text[], 2000)", keys, owners), "renew many", new(string))
				} else if len(keys) > 0 {
					keys, owners = append(keys, "S\x1f"), append(owners, owners[0])
					collect(exec("SELECT * FROM pglock.lock_release_many($1::text[], $2::text[], false)", keys[1:], owners[1:]), "release many", new(int32))
				}
			}
		})
	}
	wg.Wait()
	require.NoError(t, errs.join())
}
