package sqlfence

import "strings"

// parser walks the top-level tokens of one statement. A bracketed group shows
// at the top level as its two brackets, one right after the other.
type parser struct {
	*lexed
	top []int // indexes in tokens of the top-level tokens, without a trailing ';'
	pos int   // the next index in top
}

// parse lexes query and finds the fence's places in it, or refuses it.
func parse(query string) (*Statement, error) {
	lx, err := lex(query)
	if err != nil {
		return nil, err
	}
	p := &parser{lexed: lx}
	for i, t := range lx.tokens {
		if t.kind == kindPunct && query[t.start] == ';' {
			if t.depth > 0 || i != len(lx.tokens)-1 {
				return nil, refuse("more than one statement (';' at offset %d)", t.start)
			}
			break
		}
		if t.depth == 0 {
			p.top = append(p.top, i)
		}
	}
	if len(p.top) == 0 {
		return nil, refuse("empty query")
	}
	if last := len(p.top) - 1; p.punct(last, '.') {
		// Never valid, and a WHERE added after it would be read as a name: "s. WHERE".
		return nil, refuse("'.' at offset %d ends the statement", p.tok(last).start)
	}
	if p.keyword(0, "WITH") {
		if err := p.with(); err != nil {
			return nil, err
		}
	}
	st := &Statement{lexed: lx, condStart: -1}
	switch {
	case p.keyword(p.pos, "UPDATE"):
		st.verb = Update
		p.pos++
		if err := p.target("SET"); err != nil {
			return nil, err
		}
		if !p.keyword(p.pos, "SET") {
			return nil, refuse("UPDATE without SET after the table")
		}
	case p.keyword(p.pos, "DELETE"):
		st.verb = Delete
		if !p.keyword(p.pos+1, "FROM") {
			return nil, refuse("DELETE without FROM")
		}
		p.pos += 2
		if err := p.target(); err != nil {
			return nil, err
		}
		p.pos-- // clauses starts after a keyword; for a DELETE, after the table
	case p.keyword(p.pos, "INSERT"):
		st.verb = Insert
		if !p.keyword(p.pos+1, "INTO") {
			return nil, refuse("INSERT without INTO")
		}
		p.pos += 2
		return st, p.insert(st)
	case p.pos < len(p.top):
		return nil, refuse("not an UPDATE, DELETE or INSERT statement: %q where the verb belongs", p.text(p.pos))
	default:
		return nil, refuse("WITH without a statement")
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
func (p *parser) clauses(st *Statement) error {
	state := clauseSet
	if st.verb == Delete {
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
			return refuse("a second WHERE at offset %d", p.tok(k).start)
		case state == clauseTable:
			return refuse("%q after the DELETE's table", p.text(k))
		}
		if next == state {
			continue
		}
		if state != clauseTable && starts[state] == k-1 {
			return refuse("empty clause before %q", p.text(k))
		}
		state, starts[next] = next, k
	}
	if state != clauseTable && state != clauseReturning && starts[state] == len(p.top)-1 {
		return refuse("empty clause at the end")
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
	if st.verb == Update {
		st.setEnd = p.tok(end(clauseSet) - 1).end
	}
	if w := starts[clauseWhere]; w >= 0 {
		if p.keyword(w+1, "CURRENT") && p.keyword(w+2, "OF") {
			return refuse("WHERE CURRENT OF names a cursor's row, which a fence cannot guard")
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
func (p *parser) with() error {
	p.pos++
	if p.keyword(p.pos, "RECURSIVE") {
		p.pos++
	}
	for {
		if !p.name(p.pos) {
			return refuse("WITH without a query name")
		}
		p.pos++
		if p.punct(p.pos, '(') {
			p.pos += 2
		}
		if !p.keyword(p.pos, "AS") {
			return refuse("WITH query without AS")
		}
		p.pos++
		if p.keyword(p.pos, "NOT") {
			p.pos++
		}
		if p.keyword(p.pos, "MATERIALIZED") {
			p.pos++
		}
		if !p.punct(p.pos, '(') {
			return refuse("WITH query without a parenthesized body")
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
func (p *parser) readOnly(open, closing int) error {
	word := func(i int, kw string) bool {
		t := p.tokens[i]
		return i > open && t.kind == kindWord && strings.EqualFold(p.query[t.start:t.end], kw)
	}
	for i := open + 1; i < closing; i++ {
		for _, verb := range []string{"INSERT", "UPDATE", "DELETE", "MERGE"} {
			if !word(i, verb) {
				continue
			}
			if verb == "UPDATE" && (word(i-1, "FOR") || word(i-1, "KEY") && word(i-2, "NO") && word(i-3, "FOR")) {
				continue
			}
			return refuse("a WITH query that may write (%s at offset %d) would not be fenced", verb, p.tokens[i].start)
		}
	}
	return nil
}

// target skips an UPDATE's or DELETE's table: [ONLY] name[.name...] or ONLY (name),
// an optional *, and an optional alias that is not one of stops.
func (p *parser) target(stops ...string) error {
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
		return refuse("no table name where one belongs")
	}
	if p.punct(p.pos, '*') {
		p.pos++
	}
	switch {
	case p.keyword(p.pos, "AS"):
		if !p.name(p.pos + 1) {
			return refuse("AS without an alias")
		}
		p.pos += 2
	case p.name(p.pos) && !p.keyword(p.pos, stops...):
		p.pos++
	}
	return nil
}

func (p *parser) tok(k int) token { return p.tokens[p.top[k]] }

func (p *parser) text(k int) string {
	t := p.tok(k)
	return p.query[t.start:t.end]
}

// keyword reports whether top-level token k is an unquoted word equal to one of kws.
// A word right after a dot is a column or field name, whatever it spells: t.where.
func (p *parser) keyword(k int, kws ...string) bool {
	if k < 0 || k >= len(p.top) || p.tok(k).kind != kindWord || p.punct(k-1, '.') {
		return false
	}
	for _, kw := range kws {
		if strings.EqualFold(p.text(k), kw) {
			return true
		}
	}
	return false
}

func (p *parser) punct(k int, c byte) bool {
	if k < 0 || k >= len(p.top) {
		return false
	}
	t := p.tok(k)
	return t.kind == kindPunct && p.query[t.start] == c
}

// name reports whether top-level token k can name a table, an alias or a WITH query.
// Of the reserved words only those that delimit clauses are ruled out.
func (p *parser) name(k int) bool {
	if k < 0 || k >= len(p.top) {
		return false
	}
	switch p.tok(k).kind {
	case kindIdent:
		return true
	case kindWord:
		return !p.keyword(k, "AS", "FROM", "ONLY", "RETURNING", "USING", "WHERE", "WITH")
	}
	return false
}

// distinctFrom reports whether the FROM at k belongs to IS [NOT] DISTINCT FROM, the
// one expression with a FROM outside brackets.
func (p *parser) distinctFrom(k int) bool {
	return p.keyword(k-1, "DISTINCT") && p.keyword(k-2, "IS", "NOT")
}

// insert finds the rows of an INSERT, p.pos at its table: INTO name[.name...] [AS
// alias] [(columns)] [OVERRIDING {SYSTEM | USER} VALUE], then one row of VALUES or a
// query, up to a top-level ON CONFLICT or RETURNING. It refuses DEFAULT VALUES, a
// DEFAULT among the row's values and VALUES of several rows: none can be selected
// WHERE a condition holds (a SELECT of several rows of parameters would leave their
// types unknown).
func (p *parser) insert(st *Statement) error {
	if !p.name(p.pos) {
		return refuse("no table name where one belongs")
	}
	p.pos++
	for p.punct(p.pos, '.') && p.name(p.pos+1) {
		p.pos += 2
	}
	if p.keyword(p.pos, "AS") {
		if !p.name(p.pos + 1) {
			return refuse("AS without an alias")
		}
		p.pos += 2
	}
	if p.punct(p.pos, '(') {
		p.pos += 2
	}
	if p.keyword(p.pos, "OVERRIDING") {
		if !p.keyword(p.pos+1, "SYSTEM", "USER") || !p.keyword(p.pos+2, "VALUE") {
			return refuse("OVERRIDING without SYSTEM VALUE or USER VALUE")
		}
		p.pos += 3
	}
	end := len(p.top)
	for k := p.pos; k < len(p.top); k++ {
		if p.keyword(k, "RETURNING") || p.keyword(k, "ON") && p.keyword(k+1, "CONFLICT") {
			end = k
			break
		}
	}
	switch {
	case p.pos >= end:
		return refuse("INSERT without VALUES or a query")
	case p.keyword(p.pos, "DEFAULT"):
		return refuse("DEFAULT VALUES, which no condition can guard: give a row of VALUES")
	case p.keyword(p.pos, "VALUES"):
		if !p.punct(p.pos+1, '(') || end != p.pos+3 {
			return refuse("VALUES of more than one row: insert one row a statement, or INSERT ... SELECT")
		}
		open, closing := p.top[p.pos+1], p.top[p.pos+2]
		for i := open + 1; i < closing; i++ {
			if t := p.tokens[i]; t.kind == kindWord && strings.EqualFold(p.query[t.start:t.end], "DEFAULT") {
				return refuse("DEFAULT among the VALUES at offset %d, which a SELECT cannot give", t.start)
			}
		}
		st.values = true
		st.srcStart, st.rowStart, st.rowEnd = p.tok(p.pos).start, p.tokens[open].end, p.tokens[closing].start
	case p.keyword(p.pos, "SELECT", "WITH", "TABLE") || p.punct(p.pos, '('):
		st.srcStart = p.tok(p.pos).start
	default:
		return refuse("%q where an INSERT's VALUES or query belongs", p.text(p.pos))
	}
	st.srcEnd = p.tok(end - 1).end
	return nil
}
