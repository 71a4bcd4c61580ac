package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Queryer is what the PostgreSQL store needs of pgx: pglock.Queryer, whose doc says
// more.
type Queryer interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// NewPostgres returns a store on the pglock schema through pgx: pglock.NewPostgresStore's,
// whose doc says what it does. With a nil db, every call fails with an error wrapping
// ErrInvalidArgument, which Invalid returns.
func NewPostgres(db Queryer) Store {
	if db == nil || reflect.ValueOf(db).Kind() == reflect.Pointer && reflect.ValueOf(db).IsNil() {
		return invalidStore(invalidArg("NewPostgresStore: nil db"))
	}
	return pgxStore(&pgxCalls{db: db, pooled: new(atomic.Bool)})
}

func pgxStore(calls *pgxCalls) *postgresStore {
	s := retrying(&postgresStore{queryRow: calls.queryRow, queryKeys: calls.queryKeys, queryRows: calls.queryRows, array: func(s []string) any { return s }, inTx: calls.inTransaction}, calls.readCommitted)
	s.pgx = calls
	return s
}

// RenewalConns is how many connections a Client's own pool for renewals opens and keeps:
// the renewer makes one call per ttl group, side by side, and a hand-back may be in
// flight; a second connection keeps another group going while one call waits (on a row
// lock, on a link gone silent). Both are kept open: with one, two groups due together
// made the second wait for a connection to start, over a second on a loaded machine, long
// enough to lose a short lock.
const RenewalConns = 2

// Renewals is the way a Client's renewer reaches the store. On the pgx store on a
// *pgxpool.Pool, a renewal never waits for a connection behind the application's own use
// of that pool (a burst of requests, a slow report, a database that slowed down), where
// every lock of the client would be lost at once: it takes an idle connection of the
// pool at once if there is one (a backend that knows pglock's functions already), and
// otherwise goes through a pool of the client's own, of up to RenewalConns connections,
// made from a copy of the pool's configuration (its hooks, its tracer, PgBouncer or not)
// soon after the client first holds a lock (warmSoon: half-way to its first renewal). The
// own pool opens its connections then, in the background, and keeps them: a renewal waits
// neither for the application nor for a connection to start (a struggling server, or one
// out of connections, starts new ones slowly or not at all). A call that finds the
// application's pool busy before then makes it at once. Any other store is the
// renewer's as it is.
type Renewals struct {
	shared *postgresStore
	pool   *pgxpool.Pool   // shared's
	cfg    *pgxpool.Config // the own pool's; nil: renewals go through the store as it is

	mu     sync.Mutex
	own    *pgxpool.Pool // nil until warm
	soon   *time.Timer   // warmSoon's
	soonAt time.Time     // when soon fires
	closed bool
}

// NewRenewals returns the renewals of a Client on store.
func NewRenewals(store Store) *Renewals {
	s := postgresOf(store)
	if s == nil || s.pgx == nil {
		return &Renewals{}
	}
	pool, ok := s.pgx.db.(*pgxpool.Pool)
	if !ok {
		return &Renewals{}
	}
	cfg := pool.Config()
	cfg.MaxConns, cfg.MinConns, cfg.MinIdleConns = RenewalConns, RenewalConns, 0
	return &Renewals{shared: s, pool: pool, cfg: cfg}
}

// Active reports whether r has a pool to make: else renewals go through the store.
func (r *Renewals) Active() bool { return r.cfg != nil }

// WarmSoon makes the own pool (warm) after ownPoolDelay(ttl), unless it is made or on its
// way: a client's first lock often comes in a burst of its own start (a deploy of many
// instances, a crowd of new clients on one key), where two more connections per client to
// start would slow every statement of the burst on the server (BENCHMARKS.md: own
// connections opened half-way to the first renewal).
func (r *Renewals) WarmSoon(ttl time.Duration) {
	if r.cfg == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.own != nil || r.closed {
		return
	}
	if r.pool.Stat().IdleConns() == 0 {
		// The pool is busy now (a crowd on the key, say): the lock's release would wait
		// behind it, and a waiter for the key with it. Its connections start now.
		r.warmLocked()
		return
	}
	due := time.Now().Add(ownPoolDelay(ttl))
	switch {
	case r.soon == nil:
		r.soon, r.soonAt = time.AfterFunc(ownPoolDelay(ttl), r.Warm), due
	case due.Before(r.soonAt) && r.soon.Stop(): // a shorter ttl's first renewal comes sooner
		r.soon.Reset(ownPoolDelay(ttl))
		r.soonAt = due
	}
}

// ownPoolDelay is how long after a client's first lock of ttl its own pool is made: half
// the time to the lock's first renewal (a third of the ttl), so that its connections are
// up by then.
func ownPoolDelay(ttl time.Duration) time.Duration { return ttl / 6 }

// Warm makes the own pool, once; its first connection opens in the background.
func (r *Renewals) Warm() {
	if r.cfg == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.warmLocked()
}

// warmLocked is warm with r.mu held.
func (r *Renewals) warmLocked() {
	if r.own != nil || r.closed {
		return
	}
	if own, err := pgxpool.NewWithConfig(context.Background(), r.cfg); err == nil { // a copy of a working pool's configuration: no error seen
		r.own = own
	}
}

// with calls f with a store for one renewal call: the application's pool while it has
// an idle connection (which it hands out at once, unless the application takes the last
// one in between); else the first connection that the own pool or the application's
// hands out (firstConn): the call may wait for a connection of its own to start or to
// come back from another renewal, never behind the application's use of a busy pool.
// The first call that finds no idle connection before warmSoon's time makes the own
// pool. (Taking every idle connection to keep one, as AcquireAllIdle does, cost each
// release a few microseconds per connection of the pool, and held up the application's
// calls meanwhile.)
func (r *Renewals) with(ctx context.Context, f func(*postgresStore) error) error {
	if r.pool.Stat().IdleConns() > 0 {
		return f(r.shared)
	}
	r.Warm() // now, if warmSoon has not yet
	r.mu.Lock()
	own := r.own
	r.mu.Unlock()
	if own == nil { // closed, or no pool could be made
		return f(r.shared)
	}
	conn, err := firstConn(ctx, own, r.pool)
	if err != nil {
		return fmt.Errorf("pglock: no connection for the call: %w", err)
	}
	defer conn.Release()
	return f(pgxStore(&pgxCalls{db: conn.Conn(), pooled: r.shared.pgx.pooled}))
}

// firstConn returns a connection of own or of app, whichever pool hands one out first,
// and puts back the other's if it comes too: a call waits for its own pool's connections
// (a renewal of another ttl group, a connection starting), never for the application, but
// takes one of the application's that comes back sooner, since over a slow link both can
// be busy for longer than a lease. It returns the first error when neither gave one.
func firstConn(ctx context.Context, own, app *pgxpool.Pool) (*pgxpool.Conn, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type got struct {
		conn *pgxpool.Conn
		err  error
	}
	got2 := make(chan got, 2)
	for _, p := range []*pgxpool.Pool{own, app} {
		go func() {
			c, err := p.Acquire(ctx)
			got2 <- got{c, err}
		}()
	}
	var first got
	for range 2 {
		g := <-got2
		switch {
		case g.err != nil:
			if first.conn == nil && first.err == nil {
				first.err = g.err
			}
		case first.conn != nil:
			g.conn.Release()
		default:
			first = got{conn: g.conn}
			cancel()
		}
	}
	return first.conn, first.err
}

// ReleaseMany makes a hand-back's call (handBacks) as a renewal is made: on an idle
// connection of the application's pool, else on the own pool's, never behind the
// application's use of its pool. A hand-back must land before its grant expires, and a
// pool filled by open fenced transactions can hold a call past that.
func (r *Renewals) ReleaseMany(ctx context.Context, keys, owners []string) (released []int, err error) {
	err = r.with(ctx, func(s *postgresStore) (err error) {
		released, err = s.ReleaseMany(ctx, keys, owners)
		return err
	})
	return released, err
}

// Release makes a Release's call as a renewal is made (see Client.releaseDetached).
func (r *Renewals) Release(ctx context.Context, key, owner string) (ok bool, err error) {
	err = r.with(ctx, func(s *postgresStore) (err error) {
		ok, err = s.Release(ctx, key, owner)
		return err
	})
	return ok, err
}

// Renew makes a renewal's call (see with).
func (r *Renewals) Renew(ctx context.Context, key, owner string, ttl time.Duration) (ok bool, err error) {
	err = r.with(ctx, func(s *postgresStore) (err error) {
		ok, err = s.Renew(ctx, key, owner, ttl)
		return err
	})
	return ok, err
}

// RenewMany makes a batched renewal's call (see with).
func (r *Renewals) RenewMany(ctx context.Context, keys, owners []string, ttl time.Duration) (renewed []string, err error) {
	err = r.with(ctx, func(s *postgresStore) (err error) {
		renewed, err = s.RenewMany(ctx, keys, owners, ttl)
		return err
	})
	return renewed, err
}

// Close closes the own pool once the renewer has stopped; ctx bounds the wait for a
// call that the renewer gave up on to hand its connection back.
func (r *Renewals) Close(ctx context.Context) error {
	r.mu.Lock()
	r.closed = true
	own := r.own
	if r.soon != nil {
		r.soon.Stop()
	}
	r.mu.Unlock()
	if own == nil {
		return nil
	}
	closed := make(chan struct{})
	go func() {
		own.Close()
		close(closed)
	}()
	return WaitDone(ctx, closed)
}

// inTransaction reports whether a statement sent on the Queryer now runs inside a
// transaction of the caller's: a pgx.Tx, or a *pgx.Conn on which one is open. The
// store then neither begins a transaction of its own nor changes a setting that would
// outlast its statement.
func (p *pgxCalls) inTransaction() bool {
	switch db := p.db.(type) {
	case pgx.Tx:
		return true
	case *pgx.Conn:
		return db.PgConn().TxStatus() != 'I'
	}
	return false
}

// pgxCalls runs the pgx store's statements in the pool's own query mode (by default
// prepared once per connection and cached: the fastest), until the server answers
// that a prepared statement is missing or already exists (SQLSTATE 26000, 42P05): the
// server connections are then shared by a pooler such as PgBouncer in transaction
// mode, and from then on every statement runs with pgx.QueryExecModeExec (the unnamed
// statement, nothing kept on a connection; the server plans it at every call). The
// statement that met the error never ran (the server refuses it at Parse or Bind,
// before executing anything), so it is sent again at once, in that mode.
type pgxCalls struct {
	db     Queryer
	pooled *atomic.Bool // a pooler was met: use pgx.QueryExecModeExec
}

// args returns args as the call sends them, and whether in pgx.QueryExecModeExec.
func (p *pgxCalls) args(args []any) ([]any, bool) {
	if p.pooled.Load() {
		return withExecMode(args), true
	}
	return args, false
}

// retry reports whether a call made without pgx.QueryExecModeExec (exec false) failed
// because a pooler shares the server connections, and switches the mode if so.
func (p *pgxCalls) retry(err error, exec bool) bool {
	var pgErr *pgconn.PgError
	if exec || !errors.As(err, &pgErr) || pgErr.Code != "26000" && pgErr.Code != "42P05" {
		return false
	}
	p.pooled.Store(true)
	return true
}

func (p *pgxCalls) queryRow(ctx context.Context, q string, args ...any) scanner {
	sent, exec := p.args(args)
	var db interface {
		QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	} = p.db
	var release func()
	if pool, ok := p.db.(*pgxpool.Pool); ok {
		if m := sendMarkOf(ctx); m != nil {
			conn, err := m.conn(ctx, pool)
			if err != nil {
				return errScanner{err}
			}
			if m.Abandon != nil {
				return &flightRow{p: p, ctx: ctx, m: m, conn: conn, q: q, args: args}
			}
			db, release = conn, conn.Release
		}
	}
	return &pgxRow{p: p, ctx: ctx, q: q, args: args, exec: exec, row: db.QueryRow(ctx, q, sent...), release: release}
}

// conn takes a connection of pool for an acquisition's call, waiting no longer than
// the call's ctx and the caller's (m.Wait), and marks the time it was taken.
func (m *SendMark) conn(ctx context.Context, pool *pgxpool.Pool) (*pgxpool.Conn, error) {
	if m.Wait != nil {
		var stop func()
		ctx, stop = m.bound(ctx)
		defer stop()
	}
	conn, err := pool.Acquire(ctx)
	if m.Wait != nil && m.Wait.Err() != nil {
		// The caller gave up first; the cancellation above runs on a goroutine of its
		// own, and a connection freed before it ran was handed out all the same.
		if err == nil {
			conn.Release()
		}
		return nil, notSentError{context.Cause(m.Wait)}
	}
	if err != nil {
		return nil, err
	}
	m.Sent = m.Now()
	return conn, nil
}

// pgxRow is a row of pgxCalls.queryRow: its error comes at Scan, and so does the retry.
type pgxRow struct {
	p       *pgxCalls
	ctx     context.Context
	q       string
	args    []any
	exec    bool
	row     pgx.Row
	release func() // the connection queryRow took for row; nil: none
}

func (r *pgxRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	if r.release != nil {
		r.release()
	}
	if err != nil && r.p.retry(err, r.exec) {
		return r.p.db.QueryRow(r.ctx, r.q, withExecMode(r.args)...).Scan(dest...)
	}
	return err
}

func (p *pgxCalls) queryKeys(ctx context.Context, q string, args ...any) ([]string, error) {
	sent, exec := p.args(args)
	keys, err := p.collectKeys(ctx, q, sent)
	if err != nil && p.retry(err, exec) {
		return p.collectKeys(ctx, q, withExecMode(args))
	}
	return keys, err
}

func (p *pgxCalls) collectKeys(ctx context.Context, q string, args []any) ([]string, error) {
	rows, err := p.db.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// withExecMode returns args behind pgx.QueryExecModeExec, in a new slice.
func withExecMode(args []any) []any {
	return append(append(make([]any, 0, len(args)+1), pgx.QueryExecModeExec), args...)
}

// NewSQL returns a store on the pglock schema for database/sql: pglock.NewSQLStore's.
// With a nil db, every call fails with an error wrapping ErrInvalidArgument, which
// Invalid returns.
func NewSQL(db *sql.DB) Store {
	if db == nil {
		return invalidStore(invalidArg("NewSQLStore: nil db"))
	}
	return retrying(&postgresStore{
		queryRow: func(ctx context.Context, q string, args ...any) scanner { return db.QueryRowContext(ctx, q, args...) },
		queryKeys: func(ctx context.Context, q string, args ...any) ([]string, error) {
			rows, err := db.QueryContext(ctx, q, args...)
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			var keys []string
			for rows.Next() {
				var k string
				if err := rows.Scan(&k); err != nil {
					return nil, err
				}
				keys = append(keys, k)
			}
			return keys, rows.Err()
		},
		queryRows: func(ctx context.Context, q string, args []any, row func(scanner) error) error {
			return sqlRows(ctx, db, q, args, row)
		},
		array: arrayLiteral, // database/sql drivers differ on []string; a literal works with all
	}, nil)
}

type scanner interface{ Scan(dest ...any) error }

// postgresStore calls the SQL functions; the two constructors differ only in how a
// statement reaches the server.
type postgresStore struct {
	queryRow  func(ctx context.Context, q string, args ...any) scanner
	queryKeys func(ctx context.Context, q string, args ...any) ([]string, error)
	queryRows func(ctx context.Context, q string, args []any, row func(scanner) error) error // row is called for each row
	array     func([]string) any
	inTx      func() bool // whether statements run in a transaction of the caller's; nil: never
	pgx       *pgxCalls   // the pgx store's; nil for database/sql's
	invalid   error       // the constructor's argument was unusable: every call fails with it
}

// invalidStore is the store a constructor returns for an unusable argument.
func invalidStore(err error) *postgresStore {
	return &postgresStore{
		queryRow:  func(context.Context, string, ...any) scanner { return errScanner{err} },
		queryKeys: func(context.Context, string, ...any) ([]string, error) { return nil, err },
		queryRows: func(context.Context, string, []any, func(scanner) error) error { return err },
		array:     func(s []string) any { return s },
		invalid:   err,
	}
}

type errScanner struct{ err error }

func (e errScanner) Scan(...any) error { return e.err }

func (s *postgresStore) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (int64, bool, error) {
	if err := checkAcquire(key, owner, ttl); err != nil {
		return 0, false, err
	}
	var token sql.NullInt64
	tokenColumn(ctx, 1)
	if err := s.queryRow(ctx, `SELECT pglock.lock_acquire($1, $2, $3)`, key, owner, ttlMillis(ttl)).Scan(&token); err != nil {
		return 0, false, storeError(err, "acquire %q", key)
	}
	return token.Int64, token.Valid, nil
}

func (s *postgresStore) AcquireOrWant(ctx context.Context, key, owner string, ttl time.Duration) (int64, bool, bool, error) {
	if err := checkAcquire(key, owner, ttl); err != nil {
		return 0, false, false, err
	}
	if s.inTx != nil && s.inTx() {
		// lock_acquire_or_want's losing mark sets synchronous_commit off for its whole
		// transaction: in the caller's, that would be the caller's commit. Two
		// statements instead, the mark as durable as the caller's commit.
		token, acquired, err := s.Acquire(ctx, key, owner, ttl)
		if err != nil || acquired {
			return token, acquired, false, err
		}
		wanted, err := s.MarkWanted(ctx, key)
		return 0, false, wanted, err
	}
	var token int64
	tokenColumn(ctx, 1)
	if err := s.queryRow(ctx, `SELECT pglock.lock_acquire_or_want($1, $2, $3)`, key, owner, ttlMillis(ttl)).Scan(&token); err != nil {
		return 0, false, false, storeError(err, "acquire %q", key)
	}
	return max(token, 0), token > 0, token == 0, nil
}

func (s *postgresStore) Renew(ctx context.Context, key, owner string, ttl time.Duration) (bool, error) {
	if err := checkCall(key, owner, ttl); err != nil {
		return false, err
	}
	var ok bool
	if err := s.queryRow(ctx, `SELECT pglock.lock_renew($1, $2, $3)`, key, owner, ttlMillis(ttl)).Scan(&ok); err != nil {
		return false, storeError(err, "renew %q", key)
	}
	return ok, nil
}

func (s *postgresStore) Release(ctx context.Context, key, owner string) (bool, error) {
	if err := checkCall(key, owner, time.Millisecond); err != nil {
		return false, err
	}
	// lock_release_async makes its whole transaction's commit asynchronous: only where
	// that transaction is the statement's own. In the caller's, the release is durable.
	q := `SELECT pglock.lock_release_async($1, $2)`
	if s.inTx != nil && s.inTx() {
		q = `SELECT pglock.lock_release($1, $2)`
	}
	var ok bool
	if err := s.queryRow(ctx, q, key, owner).Scan(&ok); err != nil {
		return false, storeError(err, "release %q", key)
	}
	return ok, nil
}

// Invalid returns the error that every call of s fails with when its constructor's
// argument was unusable (a nil db), or nil.
func Invalid(s Store) error {
	if p, ok := s.(*postgresStore); ok {
		return p.invalid
	}
	return nil
}

// InCallerTx reports whether s is a PostgreSQL store whose statements run inside a
// transaction of the caller's (a pgx.Tx, or a *pgx.Conn with one open).
func InCallerTx(s Store) bool {
	p, ok := s.(*postgresStore)
	return ok && p.inTx != nil && p.inTx()
}

// postgresOf returns the PostgreSQL store that s is or wraps, or nil, for NewRenewals: a
// wrapper with an Unwrap method (the crowd benchmark's counting store) gives its store,
// so that its clients renew and release as New's do.
func postgresOf(s Store) *postgresStore {
	for {
		switch v := s.(type) {
		case *postgresStore:
			return v
		case interface{ Unwrap() Store }:
			s = v.Unwrap()
		default:
			return nil
		}
	}
}

func (s *postgresStore) QueueAcquire(ctx context.Context, t Target, owner string, ttl time.Duration) (int, int64, int64, int, error) {
	if err := checkQueueCall(t, owner, ttl); err != nil {
		return 0, 0, 0, 0, err
	}
	var token, ticket sql.NullInt64
	var permit, ahead sql.NullInt32
	if err := s.queryRow(ctx, `SELECT q.fencing_token, q.ticket, q.permit, q.ahead FROM pglock.queue_acquire($1, $2, $3, $4) q`,
		t.Key, owner, ttlMillis(ttl), t.Permits).Scan(&token, &ticket, &permit, &ahead); err != nil {
		return 0, 0, 0, 0, storeError(err, "acquire %q in its queue", t.Key)
	}
	return int(permit.Int32), token.Int64, ticket.Int64, int(ahead.Int32), nil
}

func (s *postgresStore) QueuePoll(ctx context.Context, key string, ticket int64) (int, int64, bool, int, error) {
	if err := checkTicket(key, ticket); err != nil {
		return 0, 0, false, 0, err
	}
	var token sql.NullInt64
	var permit, ahead sql.NullInt32
	var queued bool
	if err := s.queryRow(ctx, `SELECT q.fencing_token, q.queued, q.permit, q.ahead FROM pglock.queue_poll($1, $2) q`,
		key, ticket).Scan(&token, &queued, &permit, &ahead); err != nil {
		return 0, 0, false, 0, storeError(err, "poll the queue of %q", key)
	}
	return int(permit.Int32), token.Int64, queued, int(ahead.Int32), nil
}

func (s *postgresStore) QueueLeave(ctx context.Context, key string, ticket int64) (bool, error) {
	if err := checkTicket(key, ticket); err != nil {
		return false, err
	}
	var left bool
	if err := s.queryRow(ctx, `SELECT pglock.queue_leave($1, $2)`, key, ticket).Scan(&left); err != nil {
		return false, storeError(err, "leave the queue of %q", key)
	}
	return left, nil
}

func (s *postgresStore) RenewMany(ctx context.Context, keys, owners []string, ttl time.Duration) ([]string, error) {
	if err := checkRenewMany(keys, owners, ttl); err != nil {
		return nil, err
	}
	renewed, err := s.queryKeys(ctx, `SELECT pglock.lock_renew_many($1::text[], $2::text[], $3)`,
		s.array(keys), s.array(owners), ttlMillis(ttl))
	if err != nil {
		return nil, storeError(err, "renew %d locks", len(keys))
	}
	return renewed, nil
}

func (s *postgresStore) Holder(ctx context.Context, key string) (LockInfo, error) {
	if err := CheckKey(key); err != nil {
		return LockInfo{}, err
	}
	var owner sql.NullString
	var token, expiresInUS sql.NullInt64
	var readAt time.Time
	// lock_holder reads the clock once more than this statement does: ExpiresAt is
	// off by the microseconds between the two readings.
	err := s.queryRow(ctx, `SELECT h.owner, h.fencing_token, h.expires_in_us, clock_timestamp() FROM pglock.lock_holder($1) h`, key).
		Scan(&owner, &token, &expiresInUS, &readAt)
	if err != nil {
		return LockInfo{}, storeError(err, "read the holder of %q", key)
	}
	if !owner.Valid {
		return LockInfo{Key: key}, nil
	}
	in := time.Duration(expiresInUS.Int64) * time.Microsecond
	return LockInfo{Key: key, Owner: owner.String, Instance: instanceOf(owner.String), Token: token.Int64, Held: true,
		ExpiresAt: readAt.Add(in), ExpiresIn: in}, nil
}

func (s *postgresStore) MarkWanted(ctx context.Context, key string) (bool, error) {
	var wanted bool
	if err := s.queryRow(ctx, `SELECT pglock.lock_want($1)`, key).Scan(&wanted); err != nil {
		return false, storeError(err, "mark %q wanted", key)
	}
	return wanted, nil
}

func (s *postgresStore) SemAcquire(ctx context.Context, key, owner string, ttl time.Duration, permits int) (int, int64, bool, error) {
	if err := checkSemCall(key, owner, ttl, permits); err != nil {
		return 0, 0, false, err
	}
	var permit sql.NullInt32
	var token sql.NullInt64
	tokenColumn(ctx, 2)
	if err := s.queryRow(ctx, `SELECT permit, fencing_token FROM pglock.sem_acquire($1, $2, $3, $4)`,
		key, owner, ttlMillis(ttl), permits).Scan(&permit, &token); err != nil {
		return 0, 0, false, storeError(err, "acquire a permit of %q", key)
	}
	return int(permit.Int32), token.Int64, permit.Valid && token.Valid, nil
}

func (s *postgresStore) SemWant(ctx context.Context, key string, permits int) (bool, error) {
	if err := CheckSemaphore(key, permits); err != nil {
		return false, err
	}
	var wanted bool
	if err := s.queryRow(ctx, `SELECT pglock.sem_want($1, $2)`, key, permits).Scan(&wanted); err != nil {
		return false, storeError(err, "mark the permits of %q wanted", key)
	}
	return wanted, nil
}

func (s *postgresStore) ReleaseMany(ctx context.Context, keys, owners []string) ([]int, error) {
	if err := checkReleaseMany(keys, owners); err != nil {
		return nil, err
	}
	// Asynchronous, as Release, only where the transaction is the statement's own.
	async := s.inTx == nil || !s.inTx()
	// Read as text through queryKeys, whose rows are read whole and read again when
	// the statement is sent again after a rollback (retry.go): a statement that
	// changes rows must be retried as Release is.
	positions, err := s.queryKeys(ctx, `SELECT i::text FROM pglock.lock_release_many($1::text[], $2::text[], $3) AS i`,
		s.array(keys), s.array(owners), async)
	if err != nil {
		return nil, storeError(err, "release %d locks", len(keys))
	}
	released := make([]int, 0, len(positions))
	for _, p := range positions {
		i, err := strconv.Atoi(p)
		if err != nil {
			return nil, storeError(err, "release %d locks: read position %q", len(keys), p)
		}
		released = append(released, i-1)
	}
	return released, nil
}

// Prune deletes up to limit rows released or expired more than olderThan ago (see
// Client.Prune and pglock.lock_prune).
func (s *postgresStore) Prune(ctx context.Context, olderThan time.Duration, limit int) (int64, error) {
	var deleted int64
	if err := s.queryRow(ctx, `SELECT pglock.lock_prune($1, $2)`, ttlMillis(olderThan), limit).Scan(&deleted); err != nil {
		return 0, storeError(err, "prune")
	}
	return deleted, nil
}

// storeError wraps err, from the store call that format and args describe, with %w so
// that a driver's error stays reachable with errors.As. When the server says the pglock
// schema or one of its functions does not exist, it says what to do as well: a
// database nobody migrated, or migrated by an older pglock. When the role may not call
// them, it says what to grant.
func storeError(err error, format string, args ...any) error {
	op := fmt.Sprintf(format, args...)
	// pgx's *pgconn.PgError and lib/pq's *pq.Error both tell their SQLSTATE so.
	var pgErr interface{ SQLState() string }
	if errors.As(err, &pgErr) {
		switch pgErr.SQLState() {
		case "3F000", // invalid_schema_name: no pglock schema
			"42883": // undefined_function: a schema older than this library
			return fmt.Errorf("pglock: %s: the pglock schema is missing or out of date: run pglock.Migrate: %w", op, err)
		case "42501": // insufficient_privilege: a role not granted what README.md lists
			return fmt.Errorf("pglock: %s: this role may not call pglock's functions: as the role that migrated, GRANT USAGE ON SCHEMA pglock and EXECUTE ON ALL FUNCTIONS IN SCHEMA pglock to it (README.md, Privileges): %w", op, err)
		}
	}
	return fmt.Errorf("pglock: %s: %w", op, err)
}

// ttlMillis returns d in whole milliseconds, the SQL functions' unit, rounded up: a lock
// must live on the database at least as long as its holder counts (1.5 ms truncated to
// 1 would expire before the holder's deadline of 1.35 ms), and a prune's age must not
// shrink. d is not negative.
func ttlMillis(d time.Duration) int64 {
	ms := int64(d / time.Millisecond)
	if d%time.Millisecond != 0 {
		ms++
	}
	return ms
}

// arrayLiteral writes s as a PostgreSQL text[] literal, every element quoted.
func arrayLiteral(s []string) any {
	var b strings.Builder
	b.WriteByte('{')
	for i, e := range s {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		for _, r := range e {
			if r == '"' || r == '\\' {
				b.WriteByte('\\')
			}
			b.WriteRune(r)
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

// SendMark rides on the ctx of an acquisition's store call (WithSendMark) to the pgx
// store on a *pgxpool.Pool, which takes a connection of the pool itself before it sends
// the statement (SendMark.conn): the lease counts from when the call had its connection,
// not from before a wait for a busy pool (which made the client refuse, and hand back,
// grants it could have kept), and a call whose caller gave up while it waited for a
// connection is never sent, so that nothing is granted to be handed back (on a pool
// opening connections over a slow link, both left keys held by nobody until their
// expiry). Other stores leave sent as it was, the time before the call.
type SendMark struct {
	Wait context.Context  // the caller's ctx, which a detached call's wait for a connection ends with; nil: none
	Now  func() time.Time // the client's clock
	Sent time.Time        // read once the call has returned

	// Abandon, when set (CanAbandon's stores only), makes the call on the caller's
	// goroutine and bounds its wait for the reply by Wait too (see flightRow): when Wait
	// ends first, Abandon is called there and then. With ok, the call returns
	// ErrAbandoned and reads the rest of its reply on a goroutine of its own, bounded by
	// rest, then calls finish: granted when the reply's row holds a fencing token (in
	// column Token), else the call's error, if any; without ok, it reads the reply on the
	// caller's goroutine, bounded by the call's ctx.
	Abandon func() (rest context.Context, finish func(granted bool, err error), ok bool)
	// Token is set by the store's acquisitions: the column of their row (from 1) that
	// holds a grant's fencing token, positive, and NULL or not positive otherwise.
	Token int

	calls  *Calls  // the Calls that observe the call, set by its begin
	flight *flight // its record there, which an abandoned call ends with its outcome
}

// CanAbandon reports whether s makes an acquisition whose SendMark has Abandon as that
// says: the pgx store on a *pgxpool.Pool in a query mode of the extended protocol.
func CanAbandon(s Store) bool {
	p := postgresOf(s)
	if p == nil || p.pgx == nil {
		return false
	}
	pool, ok := p.pgx.db.(*pgxpool.Pool)
	return ok && flightMode(pool)
}

// tokenColumn sets the mark of ctx's call, if any: its row's fencing token is in column
// col (from 1).
func tokenColumn(ctx context.Context, col int) {
	if m := sendMarkOf(ctx); m != nil {
		m.Token = col
	}
}

type sendMarkKey struct{}

// WithSendMark returns ctx carrying m, for an acquisition's store call.
func WithSendMark(ctx context.Context, m *SendMark) context.Context {
	return context.WithValue(ctx, sendMarkKey{}, m)
}

// bound returns ctx ended also when the caller's ctx (m.Wait, not nil) ends, with its
// cause; stop lets go of both.
func (m *SendMark) bound(ctx context.Context) (_ context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	unwatch := context.AfterFunc(m.Wait, func() { cancel(context.Cause(m.Wait)) })
	return ctx, func() {
		unwatch()
		cancel(nil)
	}
}

func sendMarkOf(ctx context.Context) *SendMark {
	m, _ := ctx.Value(sendMarkKey{}).(*SendMark)
	return m
}

// notSentError is a call that gave up waiting for a connection, its caller gone: nothing
// reached the server (SafeToRetry, so mayHaveReached says false).
type notSentError struct{ cause error }

func (e notSentError) Error() string     { return e.cause.Error() }
func (e notSentError) Unwrap() error     { return e.cause }
func (e notSentError) SafeToRetry() bool { return true }

// WaitDone waits until done is closed, or until ctx ends (returning its cause); done
// wins when both are.
func WaitDone(ctx context.Context, done <-chan struct{}) error {
	select {
	case <-done:
		return nil
	default:
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Own returns r's own pool, nil until it is made.
func (r *Renewals) Own() *pgxpool.Pool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.own
}
