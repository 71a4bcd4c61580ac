package sqlfence

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

var (
	// ErrUnsafe is matched by the errors of a query that cannot be rewritten safely.
	ErrUnsafe = errors.New("query cannot be fenced safely")
	// ErrParams is matched by the errors of a query whose parameters do not match the
	// args given for it, or leave no room for the fence's.
	ErrParams = errors.New("the query's parameters do not match its args")
)

// maxParams is the most parameters one statement can have: the extended protocol
// counts them in 16 bits.
const maxParams = 65535

// Verb is the command of a statement that can be fenced.
type Verb string

// The verbs a fence can guard.
const (
	Update Verb = "UPDATE"
	Delete Verb = "DELETE"
	Insert Verb = "INSERT"
)

// Statement is a query that holds a single UPDATE, DELETE or INSERT, with the places a
// fence goes. It is immutable, so safe for concurrent use.
type Statement struct {
	*lexed
	verb      Verb
	setEnd    int // UPDATE: offset just past the last token of the SET list
	condStart int // offset of the WHERE condition's first token; -1 without WHERE
	// condEnd is the offset just past the WHERE condition, or without WHERE just past
	// the last token before RETURNING or the end of the statement.
	condEnd int
	// An INSERT's rows: a row of VALUES (values true: srcStart at VALUES, rowStart and
	// rowEnd inside its brackets) or a query (srcStart at its first token); srcEnd is
	// just past them, before ON CONFLICT, RETURNING or the end.
	values                             bool
	srcStart, srcEnd, rowStart, rowEnd int
}

// Check parses query and checks that it is a single statement of one of verbs whose
// highest parameter is $nargs, with room for params more. It returns the statement and
// the number of the first of those new parameters, nargs+1.
//
// An error matching ErrUnsafe says why the query cannot be rewritten safely; one
// matching ErrParams, that nargs is not the query's highest parameter or that params
// more would pass the protocol's limit of 65535.
func Check(query string, nargs, params int, verbs ...Verb) (*Statement, int, error) {
	st, err := parse(query)
	if err != nil {
		return nil, 0, err
	}
	if !slices.Contains(verbs, st.verb) {
		names := make([]string, len(verbs))
		for i, v := range verbs {
			names[i] = string(v)
		}
		article := "a"
		if st.verb == Insert {
			article = "an"
		}
		return nil, 0, refuse("%s %s, where only %s is fenced", article, st.verb, strings.Join(names, " or "))
	}
	if nargs != st.maxParam {
		return nil, 0, refuseParams("the query's highest parameter is $%d but %d args were given", st.maxParam, nargs)
	}
	if st.maxParam+params > maxParams {
		return nil, 0, refuseParams("the query has %d parameters, which leaves no room for the fence's %d", st.maxParam, params)
	}
	return st, st.maxParam + 1, nil
}

// Rewrite returns the query with set appended to the SET list (unless it is empty;
// set starts with its comma) and cond ANDed to the WHERE condition, which it wraps in
// parentheses, or added as the WHERE. cond must be a single operand of AND: put an OR
// in parentheses. An INSERT's rows become a SELECT of them WHERE cond: its row of
// VALUES "SELECT <row> WHERE cond", its query "SELECT * FROM (<query>) AS
// pglock_fenced WHERE cond"; set is not used.
func (st *Statement) Rewrite(set, cond string) string {
	q := st.query
	if st.verb == Insert {
		if st.values {
			return joinTokens(q[:st.srcStart], "SELECT ", q[st.rowStart:st.rowEnd], " WHERE ", cond, q[st.srcEnd:])
		}
		return joinTokens(q[:st.srcStart], "SELECT * FROM (", q[st.srcStart:st.srcEnd], ") AS pglock_fenced WHERE ", cond, q[st.srcEnd:])
	}
	var b strings.Builder
	b.Grow(len(q) + len(set) + len(cond) + len(" WHERE () AND ") + 1)
	last := 0
	insert := func(at int, text string) {
		b.WriteString(q[last:at])
		b.WriteString(text)
		last = at
		// "'x'WHERE" is legal SQL, "$3WHERE" is not.
		if isIdentCont(text[len(text)-1]) && isIdentCont(byteAt(q, at)) {
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

// refusal is an error of Check: kind is ErrUnsafe or ErrParams.
type refusal struct {
	kind   error
	reason string
}

func (e *refusal) Error() string { return e.reason }

func (e *refusal) Is(target error) bool { return target == e.kind }

func refuse(format string, args ...any) error {
	return &refusal{ErrUnsafe, fmt.Sprintf(format, args...)}
}

func refuseParams(format string, args ...any) error {
	return &refusal{ErrParams, fmt.Sprintf(format, args...)}
}

// joinTokens joins parts, with a space between two that would otherwise run into one
// token ("$3RETURNING").
func joinTokens(parts ...string) string {
	var b strings.Builder
	for _, p := range parts {
		if p == "" {
			continue
		}
		if s := b.String(); s != "" && isIdentCont(s[len(s)-1]) && isIdentCont(p[0]) {
			b.WriteByte(' ')
		}
		b.WriteString(p)
	}
	return b.String()
}
