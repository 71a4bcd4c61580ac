package pglock

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// A lease cannot stop a holder that is paused (GC, SIGSTOP, a slow network) past its
// ttl: another instance takes the key, and when the first wakes up it finishes its
// write. Only the resource can refuse that write. This file holds the two fences that
// make it refuse: a token column on the written rows (FenceUpdate, ExecFenced), and a
// check of the lock row itself in the same statement (FenceHeld).
//
// Both rewrite SQL text, so both rest on one small lexer that splits a query the way
// PostgreSQL's own scanner does, for the constructs that decide where a keyword is:
// string constants, quoted identifiers, comments, dollar quotes and brackets. Anything
// it is not sure of is refused, never guessed.

// Execer is anything with pgx's Exec: *pgxpool.Pool, *pgx.Conn, pgx.Tx.
type Execer interface {
	Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error)
}

// fenceMaxParams is the most parameters one statement can have: the extended
// protocol counts them in 16 bits.
const fenceMaxParams = 65535

// fenceMaxColumnLen is PostgreSQL's identifier limit (NAMEDATALEN-1). A longer name is
// silently truncated by the server and could name another column.
const fenceMaxColumnLen = 63

// FenceUpdate rewrites a single UPDATE so that it writes only rows whose column holds a
// token <= token, and records token there. It appends `"column" = $n` to the SET list
// and `AND "column" <= $n` to the WHERE, wrapping the original condition in
// parentheses (or adds `WHERE "column" <= $n` when there is none), where $n follows
// the highest parameter of the query, and returns args with token appended:
//
//	q, args, err := pglock.FenceUpdate("UPDATE products SET in_stock = $1 WHERE id = $2", "stock_fencing_token", token, count, id)
//	// q == `UPDATE products SET in_stock = $1, "stock_fencing_token" = $3 WHERE (id = $2) AND "stock_fencing_token" <= $3`
//	// args == []any{count, id, token}
//
// Equal tokens pass, so a holder may write many times; a stale holder's write updates
// no row. column names a column of the UPDATE's target table: declare it bigint NOT
// NULL DEFAULT 0, since a row whose column is NULL is never written. In the WHERE it
// is not qualified, so it must be unambiguous: with a FROM clause, no FROM table may
// have a column of that name (PostgreSQL then refuses the statement). WITH queries,
// ONLY, aliases, FROM, RETURNING and one trailing semicolon are kept.
//
// The query is refused with an error wrapping ErrUnsafeQuery when it cannot be
// rewritten safely (see ErrUnsafeQuery; a DELETE is refused too). An error wrapping
// ErrInvalidArgument reports an empty, over-long or non-UTF-8 column, a token that is
// not positive, or len(args) different from the highest $n in the query. On error the
// query is "" and args nil.
func FenceUpdate(query, column string, token int64, args ...any) (string, []any, error) {
	col, err := fenceColumn(column)
	if err != nil {
		return "", nil, err
	}
	st, n, err := prepareFence(query, token, len(args), 1, "UPDATE")
	if err != nil {
		return "", nil, err
	}
	p := "$" + strconv.Itoa(n)
	return st.rewrite(", "+col+" = "+p, col+" <= "+p), withFenceArgs(args, token), nil
}

// FenceHeld appends AND pglock.lock_held($n, $m) to an UPDATE's or DELETE's WHERE
// (adding WHERE when none), with key and token as the new last two args. The original
// condition is wrapped in parentheses, $n follows the highest parameter of the query,
// and WITH queries, ONLY, aliases, FROM or USING, RETURNING and one trailing semicolon
// are kept. pglock.lock_held comes with the 000002_lock_held
// migration, and the written rows must be in the database that holds pglock.locks.
//
// The guarantee, on the database clock: a write whose statement runs after the lock
// was taken over, released or expired updates nothing (0 rows), because lock_held is
// false for it; a write that commits before the takeover is the old holder's
// legitimate write. lock_held row-locks the lock's row until the write's transaction
// ends, so while that transaction is open no takeover can happen: an acquisition that
// meets the locked row fails at once (Acquire retries), even after the lease expired.
// No new token exists before the write is settled.
//
// Under READ COMMITTED the row lock is FOR KEY SHARE: the holder's renewals (and its
// release) go on while the transaction is open, so a slow transaction costs no lock
// its lease, and lock_held reads the latest committed row at each statement. Under
// REPEATABLE READ or SERIALIZABLE it is FOR SHARE, because the transaction's snapshot
// could not see a takeover otherwise: a takeover committed after the snapshot makes
// the write fail with a serialization error (SQLSTATE 40001) instead of writing, and
// the lock's renewals wait for the transaction, so keep such transactions short.
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
	st, n, err := prepareFence(query, token, len(args), 2, "UPDATE", "DELETE")
	if err != nil {
		return "", nil, err
	}
	cond := "pglock.lock_held($" + strconv.Itoa(n) + ", $" + strconv.Itoa(n+1) + ")"
	return st.rewrite("", cond), withFenceArgs(args, key, token), nil
}

// ExecFenced rewrites query with FenceUpdate and executes it on db, which must not be
// nil, and returns how many rows it wrote: 0 when the query matches no row or every
// row it matches holds a newer token than token, which means the caller's lock was
// taken over.
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
	q, fencedArgs, err := FenceUpdate(query, column, token, args...)
	if err != nil {
		return 0, err
	}
	tag, err := db.Exec(ctx, q, fencedArgs...)
	if err != nil {
		return 0, fmt.Errorf("pglock: fenced write: %w", err)
	}
	return tag.RowsAffected(), nil
}

func fenceUnsafe(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrUnsafeQuery}, args...)...)
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

// sqlKind is the kind of a sqlToken.
type sqlKind uint8

const (
	sqlWord   sqlKind = iota // unquoted identifier or keyword
	sqlIdent                 // "quoted identifier"
	sqlString                // string constant of any kind, dollar-quoted included
	sqlNumber                // numeric constant
	sqlParam                 // $n
	sqlPunct                 // any other single byte: operator character, bracket, comma, dot, semicolon
)

// sqlToken is one token of a query. Comments and whitespace are not tokens.
type sqlToken struct {
	kind       sqlKind
	start, end int // byte offsets in the query
	// depth is the bracket nesting around the token; an opening or closing bracket
	// has the depth of what surrounds its group, so the top level is depth 0.
	depth int
}

// sqlLexed is a query split into tokens.
type sqlLexed struct {
	query    string
	tokens   []sqlToken
	maxParam int // highest $n, 0 when there is none
}

// sqlQuoteMode is how a string constant's body is scanned. B'...', X'...', N'...' and
// U&'...' need no mode of their own: they take no backslash escapes, and where the
// server ends a bit string at a doubled quote and starts another constant, it splits
// the text at the same places as a standard string's doubled quote.
type sqlQuoteMode uint8

const (
	sqlQuoteStandard sqlQuoteMode = iota // '...': '' is a quote
	sqlQuoteEscape                       // E'...': '' and backslash escapes
)

func sqlSpace(c byte) bool {
	// Not \v: PostgreSQL 15 does not take it for whitespace and later versions may,
	// so outside literals it is refused rather than guessed.
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f'
}

func sqlIdentStart(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c >= 0x80
}

func sqlDigit(c byte) bool { return c >= '0' && c <= '9' }

// sqlIdentCont: PostgreSQL identifiers may contain '$' after their first character.
func sqlIdentCont(c byte) bool { return sqlIdentStart(c) || sqlDigit(c) || c == '$' }

// sqlByteAt returns q[i], or 0 past the end (queries with a NUL byte are refused first).
func sqlByteAt(q string, i int) byte {
	if i < len(q) {
		return q[i]
	}
	return 0
}

// lexSQL splits query into tokens as PostgreSQL's scanner does, for everything that
// decides where a token starts and ends.
func lexSQL(query string) (*sqlLexed, error) {
	if i := strings.IndexByte(query, 0); i >= 0 {
		// The server reads the query as a C string and would drop what follows.
		return nil, fenceUnsafe("NUL byte at offset %d", i)
	}
	if !utf8.ValidString(query) {
		return nil, fenceUnsafe("query is not valid UTF-8")
	}
	lx := &sqlLexed{query: query}
	var open []byte // the brackets open at i
	q := query
	for i := 0; i < len(q); {
		c, start := q[i], i
		kind := sqlPunct
		var err error
		switch {
		case sqlSpace(c):
			i++
			continue
		case c == '-' && sqlByteAt(q, i+1) == '-':
			i = sqlLineCommentEnd(q, i)
			continue
		case c == '/' && sqlByteAt(q, i+1) == '*':
			if i, err = sqlBlockCommentEnd(q, i); err != nil {
				return nil, err
			}
			continue
		case c == '\'':
			kind = sqlString
			i, err = sqlStringEnd(q, i+1, sqlQuoteStandard)
		case (c == 'e' || c == 'E') && sqlByteAt(q, i+1) == '\'':
			kind = sqlString
			i, err = sqlStringEnd(q, i+2, sqlQuoteEscape)
		case c == '"':
			kind = sqlIdent
			i, err = sqlQuotedIdentEnd(q, i+1)
		case c == '$' && sqlDigit(sqlByteAt(q, i+1)):
			kind = sqlParam
			var n int
			if i, n, err = sqlParamEnd(q, i); err == nil {
				lx.maxParam = max(lx.maxParam, n)
			}
		case c == '$':
			kind = sqlString
			i, err = sqlDollarQuoteEnd(q, i)
		case sqlDigit(c) || c == '.' && sqlDigit(sqlByteAt(q, i+1)):
			kind = sqlNumber
			i, err = sqlNumberEnd(q, i)
		case sqlIdentStart(c):
			kind = sqlWord
			for i++; i < len(q) && sqlIdentCont(q[i]); i++ {
			}
		case c < 0x20 || c == 0x7f:
			return nil, fenceUnsafe("control character %q at offset %d", c, i)
		case c == '(' || c == '[':
			lx.tokens = append(lx.tokens, sqlToken{kind: sqlPunct, start: i, end: i + 1, depth: len(open)})
			open = append(open, c)
			i++
			continue
		case c == ')' || c == ']':
			want := byte('(')
			if c == ']' {
				want = '['
			}
			if len(open) == 0 || open[len(open)-1] != want {
				return nil, fenceUnsafe("unbalanced %q at offset %d", c, i)
			}
			open = open[:len(open)-1]
			i++
		default:
			i++
		}
		if err != nil {
			return nil, err
		}
		lx.tokens = append(lx.tokens, sqlToken{kind: kind, start: start, end: i, depth: len(open)})
	}
	if len(open) > 0 {
		return nil, fenceUnsafe("unclosed %q", open[len(open)-1])
	}
	return lx, nil
}

// sqlLineCommentEnd returns the offset of the newline that ends the -- comment at i, or
// len(q).
func sqlLineCommentEnd(q string, i int) int {
	for i < len(q) && q[i] != '\n' && q[i] != '\r' {
		i++
	}
	return i
}

// sqlBlockCommentEnd returns the offset just past the /* comment at i. Block comments nest.
func sqlBlockCommentEnd(q string, i int) (int, error) {
	start, depth := i, 0
	for i < len(q) {
		switch {
		case q[i] == '/' && sqlByteAt(q, i+1) == '*':
			depth++
			i += 2
		case q[i] == '*' && sqlByteAt(q, i+1) == '/':
			depth--
			i += 2
			if depth == 0 {
				return i, nil
			}
		default:
			i++
		}
	}
	return 0, fenceUnsafe("unterminated /* comment at offset %d", start)
}

// sqlStringEnd returns the offset just past the string constant whose body starts at i.
func sqlStringEnd(q string, i int, mode sqlQuoteMode) (int, error) {
	start := i
	for {
		for ; i < len(q) && q[i] != '\''; i++ {
			if q[i] == '\\' && mode == sqlQuoteEscape {
				i++ // the escaped byte, a quote included
			}
		}
		if i >= len(q) {
			return 0, fenceUnsafe("unterminated string constant at offset %d", start-1)
		}
		if sqlByteAt(q, i+1) == '\'' {
			i += 2 // '' stands for a quote
			continue
		}
		i++ // the closing quote
		next, ok := sqlStringContinues(q, i)
		if !ok {
			return i, nil
		}
		// The continuation is scanned as the same kind of string: an E'' part goes on
		// taking backslash escapes.
		i = next
	}
}

// sqlStringContinues reports whether a string constant that closed just before i goes
// on: PostgreSQL joins 'a' and 'b' when only whitespace with at least one newline
// (and -- comments) separates them. It returns the offset just past the opening
// quote of the continuation.
func sqlStringContinues(q string, i int) (int, bool) {
	newline := false
	for i < len(q) {
		switch c := q[i]; {
		case c == ' ' || c == '\t' || c == '\f':
			i++
		case c == '\n' || c == '\r':
			newline = true
			i++
		case c == '-' && sqlByteAt(q, i+1) == '-':
			i = sqlLineCommentEnd(q, i)
		case c == '\'':
			return i + 1, newline
		default:
			return 0, false
		}
	}
	return 0, false
}

// sqlQuotedIdentEnd returns the offset just past the quoted identifier whose body starts at i.
func sqlQuotedIdentEnd(q string, i int) (int, error) {
	start := i
	for i < len(q) {
		if q[i] == '"' {
			if sqlByteAt(q, i+1) != '"' {
				return i + 1, nil
			}
			i++ // "" stands for a double quote
		}
		i++
	}
	return 0, fenceUnsafe("unterminated quoted identifier at offset %d", start-1)
}

// sqlParamEnd returns the offset just past the parameter $n at i, and n.
func sqlParamEnd(q string, i int) (int, int, error) {
	start, n := i, 0
	for i++; i < len(q) && sqlDigit(q[i]); i++ {
		n = n*10 + int(q[i]-'0')
		if n > fenceMaxParams {
			return 0, 0, fenceUnsafe("parameter at offset %d is above $%d", start, fenceMaxParams)
		}
	}
	switch {
	case n == 0:
		return 0, 0, fenceUnsafe("$0 at offset %d is not a parameter", start)
	case sqlIdentCont(sqlByteAt(q, i)):
		// PostgreSQL 15 and later refuse "$1abc"; older versions read $1 and a word.
		return 0, 0, fenceUnsafe("parameter at offset %d runs into a word", start)
	}
	return i, n, nil
}

// sqlDollarQuoteEnd returns the offset just past the dollar-quoted string at i.
func sqlDollarQuoteEnd(q string, i int) (int, error) {
	start := i
	for i++; i < len(q) && q[i] != '$'; i++ {
		// A tag is an identifier without '$'; its first byte is not a digit, or
		// this would be a parameter.
		if !sqlIdentStart(q[i]) && !sqlDigit(q[i]) {
			return 0, fenceUnsafe("stray '$' at offset %d", start)
		}
	}
	if i >= len(q) {
		return 0, fenceUnsafe("stray '$' at offset %d", start)
	}
	delim := q[start : i+1]
	// The body ends at the first occurrence of the delimiter: the server examines
	// every '$' of the body as a possible delimiter start.
	end := strings.Index(q[i+1:], delim)
	if end < 0 {
		return 0, fenceUnsafe("unterminated dollar-quoted string at offset %d", start)
	}
	return i + 1 + end + len(delim), nil
}

// sqlNumberEnd returns the offset just past the numeric constant at i: digits, an
// optional fraction and an optional exponent.
func sqlNumberEnd(q string, i int) (int, error) {
	start := i
	for i < len(q) && sqlDigit(q[i]) {
		i++
	}
	// "1..5" is 1 and then "..": the server keeps the second dot off the number.
	if sqlByteAt(q, i) == '.' && sqlByteAt(q, i+1) != '.' {
		for i++; i < len(q) && sqlDigit(q[i]); i++ {
		}
	}
	if c := sqlByteAt(q, i); c == 'e' || c == 'E' {
		j := i + 1
		if c := sqlByteAt(q, j); c == '+' || c == '-' {
			j++
		}
		if sqlDigit(sqlByteAt(q, j)) {
			for i = j; i < len(q) && sqlDigit(q[i]); i++ {
			}
		}
	}
	if sqlIdentCont(sqlByteAt(q, i)) {
		// Versions disagree on "1where", "0x1F" and "1_000": 15 refuses them, 16
		// takes the last two as numbers, 14 and older read a number and then a word
		// that could be a keyword.
		return 0, fenceUnsafe("number at offset %d runs into a word", start)
	}
	return i, nil
}

// fenceStmt is a query that holds a single UPDATE or DELETE, with the places a fence
// goes.
type fenceStmt struct {
	*sqlLexed
	verb      string // "UPDATE" or "DELETE"
	setEnd    int    // UPDATE: offset just past the last token of the SET list
	condStart int    // offset of the WHERE condition's first token; -1 without WHERE
	// condEnd is the offset just past the WHERE condition, or without WHERE just past
	// the last token before RETURNING or the end of the statement.
	condEnd int
}

// fenceParser walks the top-level tokens of one statement. A bracketed group shows
// at the top level as its two brackets, one right after the other.
type fenceParser struct {
	*sqlLexed
	top []int // indexes in tokens of the top-level tokens, without a trailing ';'
	pos int   // the next index in top
}

// parseFenceable lexes query and finds the fence's places in it, or refuses it.
func parseFenceable(query string) (*fenceStmt, error) {
	lx, err := lexSQL(query)
	if err != nil {
		return nil, err
	}
	p := &fenceParser{sqlLexed: lx}
	for i, t := range lx.tokens {
		if t.kind == sqlPunct && query[t.start] == ';' {
			if t.depth > 0 || i != len(lx.tokens)-1 {
				return nil, fenceUnsafe("more than one statement (';' at offset %d)", t.start)
			}
			break
		}
		if t.depth == 0 {
			p.top = append(p.top, i)
		}
	}
	if len(p.top) == 0 {
		return nil, fenceUnsafe("empty query")
	}
	if p.keyword(0, "WITH") {
		if err := p.with(); err != nil {
			return nil, err
		}
	}
	st := &fenceStmt{sqlLexed: lx, condStart: -1}
	switch {
	case p.keyword(p.pos, "UPDATE"):
		st.verb = "UPDATE"
		p.pos++
		if err := p.target("SET"); err != nil {
			return nil, err
		}
		if !p.keyword(p.pos, "SET") {
			return nil, fenceUnsafe("UPDATE without SET after the table")
		}
	case p.keyword(p.pos, "DELETE"):
		st.verb = "DELETE"
		if !p.keyword(p.pos+1, "FROM") {
			return nil, fenceUnsafe("DELETE without FROM")
		}
		p.pos += 2
		if err := p.target(); err != nil {
			return nil, err
		}
		p.pos-- // clauses starts after a keyword; for a DELETE, after the table
	case p.pos < len(p.top):
		return nil, fenceUnsafe("not an UPDATE or DELETE statement: %q where the verb belongs", p.text(p.pos))
	default:
		return nil, fenceUnsafe("WITH without a statement")
	}
	return st, p.clauses(st)
}

// Clause positions of an UPDATE or DELETE, in the order they must come.
const (
	clauseSet       = iota // UPDATE's SET list
	clauseTable            // DELETE: after the table nothing but a clause may come
	clauseFrom             // UPDATE's FROM or DELETE's USING list
	clauseWhere            // the WHERE condition
	clauseReturning        // RETURNING
)

// clauses finds the clauses after the SET keyword of an UPDATE (p.pos is at SET) or
// the table of a DELETE (p.pos is at the table's last token), and fills st's places.
func (p *fenceParser) clauses(st *fenceStmt) error {
	state := clauseSet
	if st.verb == "DELETE" {
		state = clauseTable
	}
	// starts[s] is the index in top of the keyword that opened state s, -1 if absent.
	starts := []int{-1, -1, -1, -1, -1}
	starts[state] = p.pos
	for k := p.pos + 1; k < len(p.top); k++ {
		next := state
		switch {
		case state == clauseSet && p.keyword(k, "FROM") && !p.distinctFrom(k),
			state == clauseTable && p.keyword(k, "USING"):
			next = clauseFrom
		case state < clauseWhere && p.keyword(k, "WHERE"):
			next = clauseWhere
		case state < clauseReturning && p.keyword(k, "RETURNING"):
			next = clauseReturning
		case state == clauseWhere && p.keyword(k, "WHERE"):
			return fenceUnsafe("a second WHERE at offset %d", p.tok(k).start)
		case state == clauseTable:
			return fenceUnsafe("%q after the DELETE's table", p.text(k))
		}
		if next == state {
			continue
		}
		if state != clauseTable && starts[state] == k-1 {
			return fenceUnsafe("empty clause before %q", p.text(k))
		}
		state, starts[next] = next, k
	}
	if state != clauseTable && state != clauseReturning && starts[state] == len(p.top)-1 {
		return fenceUnsafe("empty clause at the end")
	}
	// end is the index in top just past the clause that begins at starts[s].
	end := func(s int) int {
		for _, k := range starts[s+1:] {
			if k >= 0 {
				return k
			}
		}
		return len(p.top)
	}
	if st.verb == "UPDATE" {
		st.setEnd = p.tok(end(clauseSet) - 1).end
	}
	if w := starts[clauseWhere]; w >= 0 {
		if p.keyword(w+1, "CURRENT") && p.keyword(w+2, "OF") {
			return fenceUnsafe("WHERE CURRENT OF names a cursor's row, which a fence cannot guard")
		}
		st.condStart = p.tok(w + 1).start
		st.condEnd = p.tok(end(clauseWhere) - 1).end
		return nil
	}
	last := len(p.top)
	if r := starts[clauseReturning]; r >= 0 {
		last = r
	}
	st.condEnd = p.tok(last - 1).end
	return nil
}

// with skips a WITH clause: WITH [RECURSIVE] name [(columns)] AS [[NOT] MATERIALIZED]
// (query) [, ...]. It refuses the SEARCH and CYCLE clauses, and any WITH query that
// writes, since the fence would not guard that write.
func (p *fenceParser) with() error {
	p.pos++
	if p.keyword(p.pos, "RECURSIVE") {
		p.pos++
	}
	for {
		if !p.name(p.pos) {
			return fenceUnsafe("WITH without a query name")
		}
		p.pos++
		if p.punct(p.pos, '(') {
			p.pos += 2
		}
		if !p.keyword(p.pos, "AS") {
			return fenceUnsafe("WITH query without AS")
		}
		p.pos++
		if p.keyword(p.pos, "NOT") {
			p.pos++
		}
		if p.keyword(p.pos, "MATERIALIZED") {
			p.pos++
		}
		if !p.punct(p.pos, '(') {
			return fenceUnsafe("WITH query without a parenthesized body")
		}
		if err := p.readOnly(p.top[p.pos], p.top[p.pos+1]); err != nil {
			return err
		}
		p.pos += 2
		if !p.punct(p.pos, ',') {
			return nil
		}
		p.pos++
	}
}

// readOnly refuses the group between the tokens open and closing if it holds a
// data-modifying statement. It looks for the verbs at every depth, so it refuses more
// than it must, a column named "insert" for one; only FOR [NO KEY] UPDATE, a row lock,
// is let through: no data-modifying UPDATE follows the reserved word FOR.
func (p *fenceParser) readOnly(open, closing int) error {
	word := func(i int, kw string) bool {
		t := p.tokens[i]
		return i > open && t.kind == sqlWord && strings.EqualFold(p.query[t.start:t.end], kw)
	}
	for i := open + 1; i < closing; i++ {
		for _, verb := range []string{"INSERT", "UPDATE", "DELETE", "MERGE"} {
			if !word(i, verb) {
				continue
			}
			if verb == "UPDATE" && (word(i-1, "FOR") || word(i-1, "KEY") && word(i-2, "NO") && word(i-3, "FOR")) {
				continue
			}
			return fenceUnsafe("a WITH query that may write (%s at offset %d) would not be fenced", verb, p.tokens[i].start)
		}
	}
	return nil
}

// target skips an UPDATE's or DELETE's table: [ONLY] name[.name...] or ONLY (name),
// an optional *, and an optional alias that is not one of stops.
func (p *fenceParser) target(stops ...string) error {
	only := p.keyword(p.pos, "ONLY")
	if only {
		p.pos++
	}
	switch {
	case only && p.punct(p.pos, '('):
		p.pos += 2
	case p.name(p.pos):
		p.pos++
		for p.punct(p.pos, '.') && p.name(p.pos+1) {
			p.pos += 2
		}
	default:
		return fenceUnsafe("no table name where one belongs")
	}
	if p.punct(p.pos, '*') {
		p.pos++
	}
	switch {
	case p.keyword(p.pos, "AS"):
		if !p.name(p.pos + 1) {
			return fenceUnsafe("AS without an alias")
		}
		p.pos += 2
	case p.name(p.pos) && !p.keyword(p.pos, stops...):
		p.pos++
	}
	return nil
}

func (p *fenceParser) tok(k int) sqlToken { return p.tokens[p.top[k]] }

func (p *fenceParser) text(k int) string {
	t := p.tok(k)
	return p.query[t.start:t.end]
}

// keyword reports whether top-level token k is an unquoted word equal to one of kws.
// A word right after a dot is a column or field name, whatever it spells: t.where.
func (p *fenceParser) keyword(k int, kws ...string) bool {
	if k < 0 || k >= len(p.top) || p.tok(k).kind != sqlWord || p.punct(k-1, '.') {
		return false
	}
	for _, kw := range kws {
		if strings.EqualFold(p.text(k), kw) {
			return true
		}
	}
	return false
}

func (p *fenceParser) punct(k int, c byte) bool {
	if k < 0 || k >= len(p.top) {
		return false
	}
	t := p.tok(k)
	return t.kind == sqlPunct && p.query[t.start] == c
}

// name reports whether top-level token k can name a table, an alias or a WITH query.
// Of the reserved words only those that delimit clauses are ruled out.
func (p *fenceParser) name(k int) bool {
	if k < 0 || k >= len(p.top) {
		return false
	}
	switch p.tok(k).kind {
	case sqlIdent:
		return true
	case sqlWord:
		return !p.keyword(k, "AS", "FROM", "ONLY", "RETURNING", "USING", "WHERE", "WITH")
	}
	return false
}

// distinctFrom reports whether the FROM at k belongs to IS [NOT] DISTINCT FROM, the
// one expression with a FROM outside brackets.
func (p *fenceParser) distinctFrom(k int) bool {
	return p.keyword(k-1, "DISTINCT") && p.keyword(k-2, "IS", "NOT")
}

// prepareFence checks token, parses query, checks that it is one of verbs and that
// its parameters are exactly the nargs args, and returns it with the number of the
// first of the fence's params new parameters.
func prepareFence(query string, token int64, nargs, params int, verbs ...string) (*fenceStmt, int, error) {
	if token <= 0 {
		return nil, 0, invalidArg("fencing token %d is not positive", token)
	}
	st, err := parseFenceable(query)
	if err != nil {
		return nil, 0, err
	}
	if !slices.Contains(verbs, st.verb) {
		return nil, 0, fenceUnsafe("a %s, where only %s is fenced", st.verb, strings.Join(verbs, " or "))
	}
	if nargs != st.maxParam {
		return nil, 0, invalidArg("the query's highest parameter is $%d but %d args were given", st.maxParam, nargs)
	}
	if st.maxParam+params > fenceMaxParams {
		return nil, 0, invalidArg("the query has %d parameters, which leaves no room for the fence's %d", st.maxParam, params)
	}
	return st, st.maxParam + 1, nil
}

// rewrite returns the query with set appended to the SET list (unless it is empty)
// and cond ANDed to the WHERE condition, or added as the WHERE.
func (st *fenceStmt) rewrite(set, cond string) string {
	q := st.query
	var b strings.Builder
	b.Grow(len(q) + len(set) + len(cond) + len(" WHERE () AND ") + 1)
	last := 0
	insert := func(at int, text string) {
		b.WriteString(q[last:at])
		b.WriteString(text)
		last = at
		// "'x'WHERE" is legal SQL, "$3WHERE" is not.
		if sqlIdentCont(text[len(text)-1]) && sqlIdentCont(sqlByteAt(q, at)) {
			b.WriteByte(' ')
		}
	}
	if set != "" {
		insert(st.setEnd, set)
	}
	if st.condStart >= 0 {
		insert(st.condStart, "(")
		insert(st.condEnd, ") AND "+cond)
	} else {
		insert(st.condEnd, " WHERE "+cond)
	}
	b.WriteString(q[last:])
	return b.String()
}
