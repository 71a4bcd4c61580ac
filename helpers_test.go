package pglock_test

// The helpers the package's tests share: clients, pools, logs and events, waits with a
// deadline, what the lock table holds, and stores that fail or hide what they can do.

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/store"
	"github.com/pgfence/pglock/internal/store/storetest"
	"github.com/pgfence/pglock/internal/tcpproxy"
	"github.com/pgfence/pglock/internal/testkit"
)

// quiet discards a client's logs, for the tests that do not read them.
var quiet = pglock.WithLogger(slog.New(slog.DiscardHandler))

// newClient returns a Client on store, closed when the test ends.
func newClient(t testing.TB, store *pglock.Store, opts ...pglock.ClientOption) *pglock.Client {
	t.Helper()
	c, err := pglock.NewWithStore(store, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close(context.Background())) })
	return c
}

// newPoolClient returns a quiet Client of New on pool (so with a listener unless opts
// say otherwise), closed when the test ends.
func newPoolClient(t testing.TB, pool *pgxpool.Pool, opts ...pglock.ClientOption) *pglock.Client {
	t.Helper()
	c, err := pglock.New(pool, append([]pglock.ClientOption{quiet}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close(context.Background())) })
	return c
}

// proxiedPool returns a pool on databaseURL whose connections go through a new TCP
// proxy, with conns connections open already, and the proxy; both are closed when the
// test ends.
func proxiedPool(t *testing.T, databaseURL string, conns int) (*pgxpool.Pool, *tcpproxy.Proxy) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(databaseURL)
	require.NoError(t, err)
	p, err := tcpproxy.New(tcpproxy.To(cfg.ConnConfig.Host, cfg.ConnConfig.Port))
	require.NoError(t, err)
	t.Cleanup(p.Close)
	host, port, err := net.SplitHostPort(p.Addr())
	require.NoError(t, err)
	n, err := strconv.Atoi(port)
	require.NoError(t, err)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(n)
	cfg.ConnConfig.Fallbacks = nil
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false } // a slow link must not stop a statement before it is sent
	cfg.MaxConns = int32(max(conns, 4))
	cfg.MinConns = int32(conns)
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.Eventually(t, func() bool { return pool.Stat().IdleConns() >= int32(conns) }, 5*time.Second, 5*time.Millisecond)
	return pool, p
}

// openSQL returns a database/sql pool of 20 connections on dbURL through driver,
// closed when the test ends.
func openSQL(t *testing.T, driver, dbURL string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, dbURL)
	require.NoError(t, err)
	db.SetMaxOpenConns(20)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	require.NoError(t, db.PingContext(t.Context()))
	return db
}

// newLogger returns a logger writing every level to b.
func newLogger(b *testkit.LogBuffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// logLines counts the lines of logs with message msg and attribute key=key.
func logLines(logs *testkit.LogBuffer, msg, key string) int {
	n := 0
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, `msg="`+msg+`"`) && slices.Contains(strings.Fields(line), "key="+key) {
			n++
		}
	}
	return n
}

// eventLog records a client's events: its record method is the handler.
type eventLog struct {
	mu     sync.Mutex
	events []pglock.Event
}

func (l *eventLog) record(e pglock.Event) {
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
}

// all returns the events recorded so far.
func (l *eventLog) all() []pglock.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.events)
}

// count counts the events of type typ on key with reason (a skip's, or none).
func (l *eventLog) count(typ pglock.EventType, key string, reason pglock.SkipReason) int {
	n := 0
	for _, e := range l.all() {
		if e.Type == typ && e.Key == key && e.SkipReason == reason {
			n++
		}
	}
	return n
}

// awaitCount waits until n events of type typ on key with reason were recorded: the
// client hands events to its handlers on a goroutine of its own.
func (l *eventLog) awaitCount(t testing.TB, typ pglock.EventType, key string, reason pglock.SkipReason, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return l.count(typ, key, reason) == n }, 5*time.Second, 5*time.Millisecond,
		"%d events %s on %q (%s): %+v", n, typ, key, reason, l.all())
}

// leadership lists the leadership events, with their reasons and error.
func (l *eventLog) leadership() []string {
	var out []string
	for _, e := range l.all() {
		if e.Type != pglock.EventLeadershipAcquired && e.Type != pglock.EventLeadershipLost {
			continue
		}
		s := string(e.Type)
		if e.StepDownReason != "" {
			s += ": " + string(e.StepDownReason)
		}
		if e.LostReason != "" {
			s += ": " + string(e.LostReason)
		}
		switch {
		case errors.Is(e.Err, pglock.ErrClosed):
			s += ": ErrClosed"
		case errors.Is(e.Err, pglock.ErrResigned):
			s += ": ErrResigned"
		}
		out = append(out, s)
	}
	return out
}

// requireEvents waits for n events (they are delivered on the client's own goroutine).
func requireEvents(t *testing.T, l *eventLog, n int, typ pglock.EventType, key string, reason pglock.SkipReason) {
	t.Helper()
	require.Eventually(t, func() bool { return l.count(typ, key, reason) == n }, 5*time.Second, 5*time.Millisecond,
		"want %d %q events of %q (reason %q), have %d", n, typ, key, reason, l.count(typ, key, reason))
}

// receive returns the next value of ch, failing the test after 10 s; what, if given,
// names the value in the failure.
func receive[T any](t testing.TB, ch <-chan T, what ...string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("no %s within 10s", cmp.Or(strings.Join(what, " "), "value received"))
		panic("unreachable")
	}
}

// await waits until ch is closed, or the test ends: a failed test must not hang in its
// cleanup on a run that never ends.
func await(t *testing.T, ch <-chan struct{}) {
	select {
	case <-ch:
	case <-t.Context().Done():
	}
}

// stallWatch records when the test's process did not run (testkit.WatchStalls): a
// stall delays every timer of the process alike, the renewer's included.
type stallWatch struct {
	mu     sync.Mutex
	stalls [][2]time.Time // due, ran
}

// watchStalls starts a stallWatch, stopped when the test ends.
func watchStalls(t testing.TB) *stallWatch {
	w := &stallWatch{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		testkit.WatchStalls(ctx, func(due, ran time.Time) {
			w.mu.Lock()
			w.stalls = append(w.stalls, [2]time.Time{due, ran})
			w.mu.Unlock()
		})
	}()
	return w
}

// longest returns the longest stall that overlapped [from, to].
func (w *stallWatch) longest(from, to time.Time) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	var d time.Duration
	for _, s := range w.stalls {
		if s[1].After(from) && s[0].Before(to) {
			d = max(d, s[1].Sub(s[0]))
		}
	}
	return d
}

// requireCancelledBefore fails t unless the ctx of what, a lock of ttl, cancelled at at,
// was cancelled before the database's expiry, or after it by no more than a stall of
// the process around its deadline (a tenth of the ttl before the expiry) lasted: no
// timer fires while its process does not run, which is the machine's doing. A late
// cancellation while the process ran is pglock's.
func (w *stallWatch) requireCancelledBefore(t testing.TB, what string, ttl time.Duration, at, expires time.Time) {
	t.Helper()
	if at.Before(expires) {
		return
	}
	late := at.Sub(expires)
	stall := w.longest(expires.Add(-ttl/10), at)
	require.GreaterOrEqual(t, stall, late, "%s's ctx was cancelled %v after the database expired it, "+
		"and the process ran meanwhile (its longest stall around the deadline: %v)", what, late, stall)
	t.Logf("%s's ctx was cancelled %v after the database expired it, through a stall of the process of %v", what, late, stall)
}

// requirePrompt fails t unless a call that must not wait, which took took, returned
// within limit, or, on a machine slow enough for that to be more, within ten times ref:
// how long a like call took that had nothing to wait for. A call that waits (for a
// transaction, a ttl, a clock) waits until what it waits for ends, past either.
func requirePrompt(t testing.TB, took, limit, ref time.Duration, msgAndArgs ...any) {
	t.Helper()
	require.Less(t, took, max(limit, 10*ref), msgAndArgs...)
}

// lockKeys lists the keys that have a row, live or not.
func lockKeys(t testing.TB, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(t.Context(), "SELECT key FROM pglock.locks ORDER BY key")
	require.NoError(t, err)
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return keys
}

// liveKeys lists the keys held live on the database clock.
func liveKeys(t testing.TB, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(t.Context(),
		"SELECT key FROM pglock.locks WHERE owner IS NOT NULL AND expires_at > clock_timestamp() ORDER BY key")
	require.NoError(t, err)
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return keys
}

// awaitExpiry waits until key's lease has ended on the database clock, for a holder
// that does not renew (a paused one): the test's wait is the database's own expiry,
// however slow the machine, and no longer.
func awaitExpiry(t testing.TB, pool *pgxpool.Pool, key string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var live bool
		err := pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT FROM pglock.locks
			WHERE key = $1 AND owner IS NOT NULL AND expires_at > clock_timestamp())`, key).Scan(&live)
		return err == nil && !live
	}, 10*time.Second, 5*time.Millisecond, "the lease of %q never ended on the database clock", key)
}

// expiresAt returns when key's lease ends on the database clock.
func expiresAt(t testing.TB, pool *pgxpool.Pool, key string) time.Time {
	t.Helper()
	var at time.Time
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT expires_at FROM pglock.locks WHERE key = $1", key).Scan(&at))
	return at
}

// databaseTimeReached reports whether the database clock has reached at.
func databaseTimeReached(t testing.TB, pool *pgxpool.Pool, at time.Time) bool {
	t.Helper()
	var reached bool
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT clock_timestamp() >= $1", at).Scan(&reached))
	return reached
}

// awaitDatabaseTime waits until the database clock has reached at, failing the test if
// it has not 10 s past at on this machine's clock.
func awaitDatabaseTime(t testing.TB, pool *pgxpool.Pool, at time.Time) {
	t.Helper()
	for deadline := at.Add(10 * time.Second); !databaseTimeReached(t, pool, at); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the database clock never reached %v", at)
		}
	}
}

// wanted reports whether a waiter has marked key (false on any error: it is polled).
func wanted(pool *pgxpool.Pool, key string) bool {
	var marked bool
	err := pool.QueryRow(context.Background(), "SELECT wanted_at IS NOT NULL FROM pglock.locks WHERE key = $1", key).Scan(&marked)
	return err == nil && marked
}

// failingStore fails every renewal while failing is set.
type failingStore struct {
	store.Store
	failing atomic.Bool
}

var errStoreDown = errors.New("store down")

func (s *failingStore) Renew(ctx context.Context, key, owner string, ttl time.Duration) (bool, error) {
	if s.failing.Load() {
		return false, errStoreDown
	}
	return s.Store.Renew(ctx, key, owner, ttl)
}

func (s *failingStore) RenewMany(ctx context.Context, keys, owners []string, ttl time.Duration) ([]string, error) {
	if s.failing.Load() {
		return nil, errStoreDown
	}
	return s.Store.RenewMany(ctx, keys, owners, ttl)
}

// badInput is a call with bad input, for a table test: it must fail with want, its
// text pglock-prefixed, and leave key (when not "") free to register.
type badInput struct {
	name string
	key  string // registered by the bad call if it had gone through; "" when none
	call func(t *testing.T, c *pglock.Client) error
	want error
}

// requireBadInputRefused runs each case on a new client on store; register registers
// a job of the key a refused call left free.
func requireBadInputRefused(t *testing.T, store *pglock.Store, cases []badInput, register func(c *pglock.Client, key string) error) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newClient(t, store, quiet)
			err := tc.call(t, c)
			require.ErrorIs(t, err, tc.want)
			require.True(t, strings.HasPrefix(err.Error(), "pglock: "), err.Error())
			if tc.key != "" { // the key is still free
				require.NoError(t, register(c, tc.key))
			}
		})
	}
}

// leaseOf is the LockInfo that a read of l's key returns while l holds it, with h's
// times (on the store's clock).
func leaseOf(l *pglock.Lock, h pglock.LockInfo) pglock.LockInfo {
	return pglock.LockInfo{Key: l.Key(), Owner: l.Owner(), Instance: instanceOf(l), Token: l.Token(), Held: true,
		ExpiresAt: h.ExpiresAt, ExpiresIn: h.ExpiresIn}
}

// instanceOf is the instance-name part of l's owner id.
func instanceOf(l *pglock.Lock) string {
	return l.Owner()[:strings.LastIndexByte(l.Owner(), '/')]
}

// testStore runs the store contract (storetest.Run) on the stores of newStore.
func testStore(t *testing.T, newStore func(t *testing.T) *pglock.Store, opts storetest.Options) {
	t.Helper()
	storetest.Run(t, func(t *testing.T) storetest.Store { return pglock.InternalStore(newStore(t)) }, opts)
}

// storeHolder reads key's live lease from s, as Election.Leader does.
func storeHolder(ctx context.Context, s *pglock.Store, key string) (pglock.LockInfo, error) {
	h, err := pglock.InternalStore(s).Holder(ctx, key)
	return pglock.LockInfo{Key: h.Key, Permit: h.Permit, Owner: h.Owner, Instance: h.Instance, Token: h.Token, Held: h.Held,
		AcquiredAt: h.AcquiredAt, TTL: h.TTL, ExpiresAt: h.ExpiresAt, ExpiresIn: h.ExpiresIn, Waiting: h.Waiting}, err
}

// storeRenewMany renews many locks of one ttl in one call of s, as the renewer does.
func storeRenewMany(ctx context.Context, s *pglock.Store, keys, owners []string, ttl time.Duration) ([]string, error) {
	return pglock.InternalStore(s).RenewMany(ctx, keys, owners, ttl)
}

// storeReleaseMany releases keys[i] for owners[i] in one call of s, as the client's
// hand-backs do, and returns the indexes of those released.
func storeReleaseMany(ctx context.Context, s *pglock.Store, keys, owners []string) ([]int, error) {
	return pglock.InternalStore(s).ReleaseMany(ctx, keys, owners)
}
