package store

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A statement of the store that PostgreSQL rolled back for a serialization failure
// (SQLSTATE 40001) or a deadlock (40P01) did nothing: it ran in an implicit transaction
// of its own, which is gone, so sending it again is safe. A serialization failure comes
// from a pool whose default_transaction_isolation is repeatable read or serializable:
// pglock's functions are written for READ COMMITTED, and under SSI two calls on
// different keys that read the same page refuse each other. A deadlock comes from two
// lock_renew_many calls whose keys overlap in different orders (not from one Client,
// whose keys are its own). The pgx store on a pool or a connection sends such a
// statement again in a READ COMMITTED transaction of its own, where neither failure
// comes from the pool's setting, in one message with its BEGIN and COMMIT (see
// readCommitted); another store (database/sql's, one inside the caller's transaction, a
// Queryer of another type) sends it again as it was. Up to rolledBackTries times in all, after a
// pause of up to 1, 2, then 4 ms, while ctx lasts; then it returns the error.
const rolledBackTries = 4

// rolledBack reports whether err is such a failure (pgx's *pgconn.PgError and lib/pq's
// *pq.Error both tell their SQLSTATE).
func rolledBack(err error) bool {
	return SQLState(err) == "40001" || SQLState(err) == "40P01"
}

// SQLState returns err's SQLSTATE (pgx's *pgconn.PgError and lib/pq's *pq.Error both
// tell it), or "".
func SQLState(err error) string {
	var pgErr interface{ SQLState() string }
	if errors.As(err, &pgErr) {
		return pgErr.SQLState()
	}
	return ""
}

// storeCalls are the statements of a store, bound to a pool or to a transaction.
type storeCalls struct {
	queryRow  func(ctx context.Context, q string, args ...any) scanner
	queryKeys func(ctx context.Context, q string, args ...any) ([]string, error)
}

// readCommitted runs call on calls bound to a READ COMMITTED transaction, committed
// when call returns nil. errors.ErrUnsupported means it could not begin one.
type readCommitted func(ctx context.Context, call func(storeCalls) error) error

// retryRolledBack runs call(plain), and again, in a READ COMMITTED transaction where rc
// can begin one, while it fails with a rolled-back statement. A retry that meets an
// aborted transaction (25P02: the store was given a transaction of the caller's, not a
// pool) returns the first error.
func retryRolledBack(ctx context.Context, plain storeCalls, rc readCommitted, call func(context.Context, storeCalls) error) error {
	err := call(ctx, plain)
	if rolledBack(err) {
		// An acquisition made on its caller's goroutine (SendMark.Abandon) sends its
		// retries as other statements go, bounded by its caller's ctx too.
		if m := sendMarkOf(ctx); m != nil && m.Abandon != nil {
			var stop func()
			ctx, stop = m.bound(ctx)
			defer stop()
		}
	}
	for try := 1; try < rolledBackTries && rolledBack(err); try++ {
		t := time.NewTimer(rand.N(time.Millisecond << (try - 1)))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		}
		again := errors.ErrUnsupported
		if rc != nil {
			again = rc(ctx, func(c storeCalls) error { return call(ctx, c) })
		}
		if errors.Is(again, errors.ErrUnsupported) {
			again = call(ctx, plain)
		}
		if SQLState(again) == "25P02" {
			return err
		}
		err = again
	}
	return err
}

// retryingRow is a row of a retrying store's queryRow: its Scan sends the statement
// again when it was rolled back.
type retryingRow struct {
	ctx   context.Context
	q     string
	args  []any
	plain storeCalls
	rc    readCommitted
}

func (r retryingRow) Scan(dest ...any) error {
	return retryRolledBack(r.ctx, r.plain, r.rc, func(ctx context.Context, c storeCalls) error {
		return c.queryRow(ctx, r.q, r.args...).Scan(dest...)
	})
}

// retrying returns s with its statements sent again when rolled back (rc may be nil).
func retrying(s *postgresStore, rc readCommitted) *postgresStore {
	plain := storeCalls{queryRow: s.queryRow, queryKeys: s.queryKeys}
	s.queryRow = func(ctx context.Context, q string, args ...any) scanner {
		return retryingRow{ctx: ctx, q: q, args: args, plain: plain, rc: rc}
	}
	s.queryKeys = func(ctx context.Context, q string, args ...any) (keys []string, err error) {
		err = retryRolledBack(ctx, plain, rc, func(ctx context.Context, c storeCalls) (err error) {
			keys, err = c.queryKeys(ctx, q, args...)
			return err
		})
		return keys, err
	}
	return s
}

// readCommitted is the pgx store's: the statement sent in one simple-protocol message,
// "BEGIN ISOLATION LEVEL READ COMMITTED; statement; COMMIT", on a connection of the
// pool (or the store's connection). The server reads a message whole before it runs any
// of it and commits before it answers, so it never holds the statement's row locks while
// it waits on the client: with BEGIN, the statement and COMMIT in three round trips, a
// client that paused or whose link went silent before its COMMIT left the rows locked,
// and the renewals of other clients' locks queued behind them until those locks expired.
// Nothing is prepared, so it works behind PgBouncer in transaction mode. A statement that
// fails there leaves the block aborted (holding no lock): it is rolled back before the
// connection is used again. Inside a transaction of the caller's, or on a Queryer that is
// neither a pool nor a connection, it returns errors.ErrUnsupported.
func (p *pgxCalls) readCommitted(ctx context.Context, call func(storeCalls) error) error {
	if p.inTransaction() {
		return errors.ErrUnsupported // a savepoint would not change the isolation
	}
	var conn *pgx.Conn
	switch db := p.db.(type) {
	case *pgxpool.Pool:
		c, err := db.Acquire(ctx)
		if err != nil {
			return err
		}
		defer c.Release()
		conn = c.Conn()
	case *pgx.Conn:
		conn = db
	default:
		return errors.ErrUnsupported
	}
	one := oneTrip{conn}
	return call(storeCalls{queryRow: one.queryRow, queryKeys: one.queryKeys})
}

// oneTrip sends each statement in a READ COMMITTED transaction of its own, in one
// message (see readCommitted).
type oneTrip struct{ conn *pgx.Conn }

// scanFunc is a scanner whose Scan runs the statement.
type scanFunc func(dest ...any) error

func (f scanFunc) Scan(dest ...any) error { return f(dest...) }

func (o oneTrip) queryRow(ctx context.Context, q string, args ...any) scanner {
	return scanFunc(func(dest ...any) error {
		return o.run(ctx, q, args, func(rows pgx.Rows) error {
			if !rows.Next() {
				if err := rows.Err(); err != nil {
					return err
				}
				return pgx.ErrNoRows
			}
			return rows.Scan(dest...)
		})
	})
}

func (o oneTrip) queryKeys(ctx context.Context, q string, args ...any) (keys []string, err error) {
	err = o.run(ctx, q, args, func(rows pgx.Rows) (err error) {
		keys, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	return keys, err
}

// rollbackTimeout bounds the ROLLBACK of a block that a failed statement left aborted.
const rollbackTimeout = 5 * time.Second

// run sends q with args written into it between BEGIN and COMMIT, and has read read the
// statement's rows.
func (o oneTrip) run(ctx context.Context, q string, args []any, read func(pgx.Rows) error) error {
	stmt, err := inline(q, args)
	if err != nil {
		return err
	}
	pg := o.conn.PgConn()
	results := pg.Exec(ctx, "BEGIN ISOLATION LEVEL READ COMMITTED;\n"+stmt+";\nCOMMIT")
	var readErr error
	for i := 0; results.NextResult(); i++ {
		if i == 1 { // BEGIN's, the statement's, COMMIT's
			rows := pgx.RowsFromResultReader(o.conn.TypeMap(), results.ResultReader())
			readErr = read(rows)
			rows.Close()
			if readErr == nil {
				readErr = rows.Err()
			}
		}
	}
	err = results.Close()
	if pg.TxStatus() != 'I' && !pg.IsClosed() {
		// The statement failed and the rest of the message was skipped. pgxpool would
		// destroy the connection; a lone *pgx.Conn would fail every statement after.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		_ = pg.Exec(rctx, "ROLLBACK").Close()
		cancel()
	}
	if err != nil {
		return err
	}
	return readErr
}

// inline writes args into q in place of $1, $2, …, as SQL literals: strings as escape
// string constants (E'…', which mean the same whatever standard_conforming_strings
// says), []string as such a constant holding an array literal, integers in decimal,
// booleans, nil as NULL, and a driver.Valuer as its value. Keys and owners hold no NUL
// (checkCall); the connection's encoding is UTF8 (pgx's). Another type of argument is
// an error, not errors.ErrUnsupported: a statement of the store that the retry cannot
// send is a bug to see, not a reason to send it again in the pool's isolation, where
// the failure it is retried for comes back (ReleaseMany's bool did that on a
// serializable pool; see TestStoreRetriesEveryWriteRolledBackBy40001).
func inline(q string, args []any) (string, error) {
	var b strings.Builder
	for i := 0; i < len(q); i++ {
		if q[i] != '$' {
			b.WriteByte(q[i])
			continue
		}
		j := i + 1
		for j < len(q) && '0' <= q[j] && q[j] <= '9' {
			j++
		}
		n, err := strconv.Atoi(q[i+1 : j])
		if err != nil || n < 1 || n > len(args) {
			return "", fmt.Errorf("pglock: inline %q: no argument for parameter $%s", q, q[i+1:j])
		}
		if err := literal(&b, args[n-1]); err != nil {
			return "", fmt.Errorf("pglock: inline %q: parameter $%d: %w", q, n, err)
		}
		i = j - 1
	}
	return b.String(), nil
}

// literal writes a as a SQL literal (see inline).
func literal(b *strings.Builder, a any) error {
	switch a := a.(type) {
	case nil:
		b.WriteString("NULL")
	case string:
		quoteLiteral(b, a)
	case []string:
		quoteLiteral(b, arrayLiteral(a).(string))
	case int64:
		b.WriteString("(" + strconv.FormatInt(a, 10) + ")")
	case int:
		b.WriteString("(" + strconv.Itoa(a) + ")")
	case bool:
		b.WriteString(strconv.FormatBool(a))
	case driver.Valuer:
		v, err := a.Value()
		if err != nil {
			return err
		}
		if _, again := v.(driver.Valuer); again {
			return fmt.Errorf("a %T whose value is a driver.Valuer", a)
		}
		return literal(b, v)
	default:
		return fmt.Errorf("a %T argument, which the retry's message cannot carry", a)
	}
	return nil
}

// quoteLiteral writes s as an escape string constant.
func quoteLiteral(b *strings.Builder, s string) {
	b.WriteString("E'")
	for i := 0; i < len(s); i++ { // bytes: no byte of a multi-byte UTF-8 character is ASCII
		switch s[i] {
		case '\\':
			b.WriteString(`\\`)
		case '\'':
			b.WriteString("''")
		default:
			b.WriteByte(s[i])
		}
	}
	b.WriteByte('\'')
}
