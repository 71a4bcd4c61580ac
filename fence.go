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
	"github.com/pgfence/pglock/internal/store"
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
// token <= token, or NULL, and records token there; it returns the query and args with
// token appended. Equal tokens pass, so a holder may write many times; a stale holder's
// write updates no row. Declare column bigint NOT NULL DEFAULT 0, unambiguous in the
// WHERE. An error wrapping ErrUnsafeQuery refuses a query it cannot rewrite safely (a
// DELETE or an INSERT too: fence those with FenceHeld); one wrapping ErrInvalidArgument reports an empty, over-long or non-UTF-8
// column, a token that is not positive, or len(args) different from the highest $n. On
// error the query is "" and args nil. See the package doc, # Fenced writes.
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

// FenceHeld rewrites an UPDATE, a DELETE or an INSERT so that it writes only while the
// lock of key with token is held live, on the database clock, adding AND
// pglock.lock_held($n, $m) to its WHERE (an INSERT's rows are selected WHERE it) and key
// and token to args. The rows must be in the database of pglock.locks;
// no takeover happens while the write's transaction is open. Errors wrap ErrUnsafeQuery
// for a query it cannot rewrite safely, ErrInvalidKey for a bad key, and
// ErrInvalidArgument for a token that is not positive or len(args) different from the
// highest $n; the query is then "" and args nil. See the package doc, # Fenced writes.
func FenceHeld(query, key string, token int64, args ...any) (string, []any, error) {
	if err := store.CheckKey(key); err != nil {
		return "", nil, err
	}
	st, n, err := prepareFence(query, token, len(args), 2, sqlfence.Update, sqlfence.Delete, sqlfence.Insert)
	if err != nil {
		return "", nil, err
	}
	cond := "pglock.lock_held($" + strconv.Itoa(n) + ", $" + strconv.Itoa(n+1) + ")"
	return st.Rewrite("", cond), withFenceArgs(args, key, token), nil
}

// ExecFenced rewrites query with FenceUpdate, executes it on db and returns how many rows
// it wrote: 0 when no row matched or every row matched holds a newer token, the caller's
// lock taken over. args may start with a pgx.QueryExecMode, passed on as pgx's Exec does.
// ctx bounds the Exec. It returns FenceUpdate's errors as they are, ErrInvalidArgument
// for a nil db, ErrUnsafeQuery under pgx's simple protocol for a query with $ and a digit
// right after a letter, digit or underscore, or the database's error, wrapped ("pglock:
// fenced write: %w"). See the package doc, # Fenced writes.
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
	case !store.ValidText(column):
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
