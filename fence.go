package pglock

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pglock/internal/sqlfence"
)

// A lease cannot stop a holder that is paused (GC, SIGSTOP, a slow network) past its
// ttl: another instance takes the key, and when the first wakes up it finishes its
// write. Only the resource can refuse that write. This file holds the two fences that
// make it refuse: a token column on the written rows (FenceUpdate, ExecFenced), and a
// check of the lock row itself in the same statement (FenceHeld).
//
// Both rewrite SQL text with internal/sqlfence, which splits a query the way
// PostgreSQL's own scanner does and refuses what it is not sure of; this file says
// what the fences add and how their errors read.

// Execer is anything with pgx's Exec: *pgxpool.Pool, *pgx.Conn, pgx.Tx.
type Execer interface {
	Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error)
}

// fenceMaxColumnLen is PostgreSQL's identifier limit (NAMEDATALEN-1). A longer name is
// silently truncated by the server and could name another column.
const fenceMaxColumnLen = 63

// FenceUpdate rewrites a single UPDATE so that it writes only rows whose column holds a
// token <= token, or NULL, and records token there. It appends `"column" = $n` to the
// SET list and `AND ("column" IS NULL OR "column" <= $n)` to the WHERE, wrapping the
// original condition in parentheses (or adds that condition as the WHERE when there is
// none), where $n follows the highest parameter of the query, and returns args with
// token appended:
//
//	q, args, err := pglock.FenceUpdate("UPDATE products SET in_stock = $1 WHERE id = $2", "stock_fencing_token", token, count, id)
//	// q == `UPDATE products SET in_stock = $1, "stock_fencing_token" = $3 WHERE (id = $2) AND ("stock_fencing_token" IS NULL OR "stock_fencing_token" <= $3)`
//	// args == []any{count, id, token}
//
// Equal tokens pass, so a holder may write many times; a stale holder's write updates
// no row. column names a column of the UPDATE's target table: declare it bigint NOT
// NULL DEFAULT 0. A nullable column works too: NULL stands for a row no fenced write
// has touched, which any token may write, as it may a 0; the write leaves its token
// there, and from then on the row is fenced like any other. In the WHERE the column
// is not qualified, so it must be unambiguous: with a FROM clause, no FROM table may
// have a column of that name (PostgreSQL then refuses the statement). WITH queries,
// ONLY, aliases, FROM, RETURNING and one trailing semicolon are kept.
//
// Under pgx's simple protocol (pgx v5.12 and later, which this module requires), pgx
// substitutes the arguments into the text itself: dollar-quoted strings holding $n are
// kept as they are, but an unquoted identifier ending in $ and digits (x$1) is not:
// quote it there, or use another mode (ExecFenced refuses it under that protocol).
//
// The query is refused with an error wrapping ErrUnsafeQuery when it cannot be
// rewritten safely (see ErrUnsafeQuery; a DELETE or an INSERT, which a column of the
// rows it writes cannot fence, is refused too: fence those with FenceHeld). An error wrapping
// ErrInvalidArgument reports an empty, over-long or non-UTF-8 column, a token that is
// not positive, or len(args) different from the highest $n in the query. On error the
// query is "" and args nil.
func FenceUpdate(query, column string, token int64, args ...any) (string, []any, error) {
	col, err := fenceColumn(column)
	if err != nil {
		return "", nil, err
	}
	st, n, err := prepareFence(query, token, len(args), 1, sqlfence.Update)
	if err != nil {
		return "", nil, err
	}
	p := "$" + strconv.Itoa(n)
	set := ", " + col + " = " + p
	cond := "(" + col + " IS NULL OR " + col + " <= " + p + ")"
	return st.Rewrite(set, cond), withFenceArgs(args, token), nil
}

// FenceHeld appends AND pglock.lock_held($n, $m) to an UPDATE's or DELETE's WHERE
// (adding WHERE when none), with key and token as the new last two args. The original
// condition is wrapped in parentheses, $n follows the highest parameter of the query,
// and WITH queries, ONLY, aliases, FROM or USING, RETURNING and one trailing semicolon
// are kept. An INSERT's rows are selected WHERE pglock.lock_held($n, $m): its one row
// of VALUES becomes SELECT <row> WHERE ..., its query SELECT * FROM (<query>) AS
// pglock_fenced WHERE ... (ON CONFLICT and RETURNING kept: cast a parameter that stands
// alone in its select list, $1::int, as in any subquery); DEFAULT VALUES, DEFAULT
// among the values and several rows of VALUES are refused. pglock.lock_held comes with
// the 000002_lock_held migration, and the written rows must be in the database that
// holds pglock.locks.
//
// The guarantee, on the database clock: a write whose statement runs after the lock
// was taken over, released or expired updates nothing (0 rows), because lock_held is
// false for it; a write that commits before the takeover is the old holder's
// legitimate write. lock_held row-locks the lock's row until the write's transaction
// ends, so while that transaction is open no takeover can happen: an acquisition that
// meets the locked row fails at once (Acquire retries), even after the lease expired.
// No new token exists before the write is settled.
//
// The row lock is FOR KEY SHARE at every isolation level: the holder's renewals (and
// its release) go on while the transaction is open, so a slow transaction costs no
// lock its lease. Under READ COMMITTED lock_held reads the latest committed row at each
// statement. Under REPEATABLE READ or SERIALIZABLE the transaction's snapshot could not
// see a takeover, so a row changed after the snapshot makes the write fail with a
// serialization error (SQLSTATE 40001) instead of writing (migration 000011).
//
// As with FenceUpdate, an unquoted identifier ending in $ and digits (x$1) is not safe
// under pgx's simple protocol; dollar-quoted strings are.
//
// The query is refused with an error wrapping ErrUnsafeQuery when it cannot be
// rewritten safely (see ErrUnsafeQuery). An error wrapping ErrInvalidKey reports an
// empty key, invalid UTF-8 or a NUL byte in it; one wrapping ErrInvalidArgument a
// token that is not positive or len(args) different from the highest $n in the query.
// On error the query is "" and args nil.
func FenceHeld(query, key string, token int64, args ...any) (string, []any, error) {
	if err := checkKey(key); err != nil {
		return "", nil, err
	}
	st, n, err := prepareFence(query, token, len(args), 2, sqlfence.Update, sqlfence.Delete, sqlfence.Insert)
	if err != nil {
		return "", nil, err
	}
	cond := "pglock.lock_held($" + strconv.Itoa(n) + ", $" + strconv.Itoa(n+1) + ")"
	return st.Rewrite("", cond), withFenceArgs(args, key, token), nil
}

// ExecFenced rewrites query with FenceUpdate and executes it on db, which must not be
// nil, and returns how many rows it wrote: 0 when the query matches no row or every
// row it matches holds a newer token than token, which means the caller's lock was
// taken over.
//
// As with pgx's Exec, args may start with a pgx.QueryExecMode, which is passed on and
// not counted as a parameter: behind PgBouncer in transaction mode, with a pool in
// pgx's default mode, pass pgx.QueryExecModeExec. Under pgx's simple protocol (that
// mode, or the db's DefaultQueryExecMode when none is given) pgx substitutes the
// arguments into the text itself; it skips literals and dollar-quoted strings as
// PostgreSQL does, but would also substitute a $n that ends an unquoted identifier
// (x$1), which PostgreSQL reads as part of the name: a query with $ and a digit right
// after a letter, digit or underscore, anywhere in its text (quoted or not, to keep the
// check simple), is refused with an error wrapping ErrUnsafeQuery under that protocol
// alone.
//
// ctx bounds only the Exec (the rewrite does no I/O); when it ends first the error
// matches ctx.Err() with errors.Is. Errors from FenceUpdate are returned as they are
// (ErrUnsafeQuery, ErrInvalidArgument); a nil db is ErrInvalidArgument; an error from
// the database is wrapped as "pglock: fenced write: %w", so a *pgconn.PgError stays
// reachable with errors.As.
func ExecFenced(ctx context.Context, db Execer, query, column string, token int64, args ...any) (rowsWritten int64, err error) {
	if db == nil {
		return 0, invalidArg("db is nil")
	}
	var mode []any
	if len(args) > 0 {
		if m, ok := args[0].(pgx.QueryExecMode); ok {
			mode, args = []any{m}, args[1:]
		}
	}
	q, fencedArgs, err := FenceUpdate(query, column, token, args...)
	if err != nil {
		return 0, err
	}
	if at := paramInIdentifier(q); at >= 0 && simpleProtocol(db, mode) {
		return 0, fmt.Errorf("%w: $ and a digit at offset %d end an identifier, which pgx's simple protocol would substitute: rename it or use another pgx.QueryExecMode", ErrUnsafeQuery, at)
	}
	tag, err := db.Exec(ctx, q, append(mode, fencedArgs...)...)
	if err != nil {
		return 0, fmt.Errorf("pglock: fenced write: %w", err)
	}
	return tag.RowsAffected(), nil
}

// paramInIdentifier returns the offset of the first '$' that follows an identifier
// character and precedes a digit (x$1), or -1. pgx's simple-protocol sanitizer takes it
// for a parameter where PostgreSQL sees one identifier. It looks inside literals and
// comments too: a needless refusal there is cheaper than a lexer of its own.
func paramInIdentifier(q string) int {
	for i := 1; i+1 < len(q); i++ {
		if q[i] == '$' && q[i+1] >= '0' && q[i+1] <= '9' {
			c := q[i-1]
			if c == '_' || c == '$' || c >= 0x80 || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
				return i
			}
		}
	}
	return -1
}

// simpleProtocol reports whether db.Exec would run with pgx's simple protocol: mode,
// the leading pgx.QueryExecMode of the call if any, else the default of db's
// configuration when db is a pgx pool, connection or transaction.
func simpleProtocol(db Execer, mode []any) bool {
	if len(mode) == 1 {
		return mode[0] == pgx.QueryExecModeSimpleProtocol
	}
	var cfg *pgx.ConnConfig
	switch db := db.(type) {
	case *pgxpool.Pool:
		cfg = db.Config().ConnConfig
	case *pgx.Conn:
		cfg = db.Config()
	case pgx.Tx:
		if conn := db.Conn(); conn != nil {
			cfg = conn.Config()
		}
	}
	return cfg != nil && cfg.DefaultQueryExecMode == pgx.QueryExecModeSimpleProtocol
}

// prepareFence checks token, then query with sqlfence.Check, whose refusals it gives
// pglock's sentinels: "pglock: query cannot be fenced safely: <reason>", or
// "pglock: invalid argument: <reason>" for the parameters.
func prepareFence(query string, token int64, nargs, params int, verbs ...sqlfence.Verb) (*sqlfence.Statement, int, error) {
	if token <= 0 {
		return nil, 0, invalidArg("fencing token %d is not positive", token)
	}
	st, n, err := sqlfence.Check(query, nargs, params, verbs...)
	switch {
	case errors.Is(err, sqlfence.ErrParams):
		return nil, 0, invalidArg("%v", err)
	case err != nil:
		return nil, 0, fmt.Errorf("%w: %v", ErrUnsafeQuery, err)
	}
	return st, n, nil
}

func fenceColumn(column string) (string, error) {
	switch {
	case column == "":
		return "", invalidArg("fence column is empty")
	case len(column) > fenceMaxColumnLen:
		// PostgreSQL would truncate it, maybe onto another column's name.
		return "", invalidArg("fence column %q is longer than %d bytes", column, fenceMaxColumnLen)
	case !validText(column):
		// pgx's Sanitize would drop the NUL and name another column.
		return "", invalidArg("fence column %q is not valid UTF-8 or contains a NUL byte", column)
	}
	return pgx.Identifier{column}.Sanitize(), nil
}

// withFenceArgs returns a new slice: appending to args itself could write into the
// caller's backing array.
func withFenceArgs(args []any, fence ...any) []any {
	out := make([]any, 0, len(args)+len(fence))
	return append(append(out, args...), fence...)
}
