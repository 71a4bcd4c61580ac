package sqlfence

import (
	"strings"
	"unicode/utf8"
)

// tokenKind is the kind of a token.
type tokenKind uint8

const (
	kindWord   tokenKind = iota // unquoted identifier or keyword
	kindIdent                   // "quoted identifier"
	kindString                  // string constant of any kind, dollar-quoted included
	kindNumber                  // numeric constant
	kindParam                   // $n
	kindPunct                   // any other single byte: operator character, bracket, comma, dot, semicolon
)

// token is one token of a query. Comments and whitespace are not tokens.
type token struct {
	kind       tokenKind
	start, end int // byte offsets in the query
	// depth is the bracket nesting around the token; an opening or closing bracket
	// has the depth of what surrounds its group, so the top level is depth 0.
	depth int
}

// lexed is a query split into tokens.
type lexed struct {
	query    string
	tokens   []token
	maxParam int // highest $n, 0 when there is none
}

// quoteMode is how a string constant's body is scanned. B'...', X'...', N'...' and
// U&'...' need no mode of their own: they take no backslash escapes, and where the
// server ends a bit string at a doubled quote and starts another constant, it splits
// the text at the same places as a standard string's doubled quote.
type quoteMode uint8

const (
	quoteStandard quoteMode = iota // '...': '' is a quote
	quoteEscape                    // E'...': '' and backslash escapes
)

func isSpace(c byte) bool {
	// Not \v: PostgreSQL 15 does not take it for whitespace and later versions may,
	// so outside literals it is refused rather than guessed.
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f'
}

func isIdentStart(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c >= 0x80
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// isIdentCont: PostgreSQL identifiers may contain '$' after their first character.
func isIdentCont(c byte) bool { return isIdentStart(c) || isDigit(c) || c == '$' }

// byteAt returns q[i], or 0 past the end (queries with a NUL byte are refused first).
func byteAt(q string, i int) byte {
	if i < len(q) {
		return q[i]
	}
	return 0
}

// lex splits query into tokens as PostgreSQL's scanner does, for everything that
// decides where a token starts and ends.
func lex(query string) (*lexed, error) {
	if i := strings.IndexByte(query, 0); i >= 0 {
		// The server reads the query as a C string and would drop what follows.
		return nil, refuse("NUL byte at offset %d", i)
	}
	if !utf8.ValidString(query) {
		return nil, refuse("query is not valid UTF-8")
	}
	lx := &lexed{query: query}
	var open []byte // the brackets open at i
	q := query
	for i := 0; i < len(q); {
		c, start := q[i], i
		kind := kindPunct
		var err error
		switch {
		case isSpace(c):
			i++
			continue
		case c == '-' && byteAt(q, i+1) == '-':
			i = lineCommentEnd(q, i)
			continue
		case c == '/' && byteAt(q, i+1) == '*':
			if i, err = blockCommentEnd(q, i); err != nil {
				return nil, err
			}
			continue
		case c == '\'':
			kind = kindString
			i, err = kindStringEnd(q, i+1, quoteStandard)
		case (c == 'e' || c == 'E') && byteAt(q, i+1) == '\'':
			kind = kindString
			i, err = kindStringEnd(q, i+2, quoteEscape)
		case c == '"':
			kind = kindIdent
			i, err = quotedIdentEnd(q, i+1)
		case c == '$' && isDigit(byteAt(q, i+1)):
			kind = kindParam
			var n int
			if i, n, err = paramEnd(q, i); err == nil {
				lx.maxParam = max(lx.maxParam, n)
			}
		case c == '$':
			kind = kindString
			i, err = dollarQuoteEnd(q, i)
		case isDigit(c) || c == '.' && isDigit(byteAt(q, i+1)):
			kind = kindNumber
			i, err = kindNumberEnd(q, i)
		case isIdentStart(c):
			kind = kindWord
			for i++; i < len(q) && isIdentCont(q[i]); i++ {
			}
		case c < 0x20 || c == 0x7f:
			return nil, refuse("control character %q at offset %d", c, i)
		case c == '(' || c == '[':
			lx.tokens = append(lx.tokens, token{kind: kindPunct, start: i, end: i + 1, depth: len(open)})
			open = append(open, c)
			i++
			continue
		case c == ')' || c == ']':
			want := byte('(')
			if c == ']' {
				want = '['
			}
			if len(open) == 0 || open[len(open)-1] != want {
				return nil, refuse("unbalanced %q at offset %d", c, i)
			}
			open = open[:len(open)-1]
			i++
		default:
			i++
		}
		if err != nil {
			return nil, err
		}
		lx.tokens = append(lx.tokens, token{kind: kind, start: start, end: i, depth: len(open)})
	}
	if len(open) > 0 {
		return nil, refuse("unclosed %q", open[len(open)-1])
	}
	return lx, nil
}

// lineCommentEnd returns the offset of the newline that ends the -- comment at i, or
// len(q).
func lineCommentEnd(q string, i int) int {
	for i < len(q) && q[i] != '\n' && q[i] != '\r' {
		i++
	}
	return i
}

// blockCommentEnd returns the offset just past the /* comment at i. Block comments nest.
func blockCommentEnd(q string, i int) (int, error) {
	start, depth := i, 0
	for i < len(q) {
		switch {
		case q[i] == '/' && byteAt(q, i+1) == '*':
			depth++
			i += 2
		case q[i] == '*' && byteAt(q, i+1) == '/':
			depth--
			i += 2
			if depth == 0 {
				return i, nil
			}
		default:
			i++
		}
	}
	return 0, refuse("unterminated /* comment at offset %d", start)
}

// kindStringEnd returns the offset just past the string constant whose body starts at i.
func kindStringEnd(q string, i int, mode quoteMode) (int, error) {
	start := i
	for {
		for ; i < len(q) && q[i] != '\''; i++ {
			if q[i] == '\\' && mode == quoteEscape {
				i++ // the escaped byte, a quote included
			}
		}
		if i >= len(q) {
			return 0, refuse("unterminated string constant at offset %d", start-1)
		}
		if byteAt(q, i+1) == '\'' {
			i += 2 // '' stands for a quote
			continue
		}
		i++ // the closing quote
		next, ok := kindStringContinues(q, i)
		if !ok {
			return i, nil
		}
		// The continuation is scanned as the same kind of string: an E'' part goes on
		// taking backslash escapes.
		i = next
	}
}

// kindStringContinues reports whether a string constant that closed just before i goes
// on: PostgreSQL joins 'a' and 'b' when only whitespace with at least one newline
// (and -- comments) separates them. It returns the offset just past the opening
// quote of the continuation.
func kindStringContinues(q string, i int) (int, bool) {
	newline := false
	for i < len(q) {
		switch c := q[i]; {
		case c == ' ' || c == '\t' || c == '\f':
			i++
		case c == '\n' || c == '\r':
			newline = true
			i++
		case c == '-' && byteAt(q, i+1) == '-':
			i = lineCommentEnd(q, i)
		case c == '\'':
			return i + 1, newline
		default:
			return 0, false
		}
	}
	return 0, false
}

// quotedIdentEnd returns the offset just past the quoted identifier whose body starts at i.
func quotedIdentEnd(q string, i int) (int, error) {
	start := i
	for i < len(q) {
		if q[i] == '"' {
			if byteAt(q, i+1) != '"' {
				return i + 1, nil
			}
			i++ // "" stands for a double quote
		}
		i++
	}
	return 0, refuse("unterminated quoted identifier at offset %d", start-1)
}

// paramEnd returns the offset just past the parameter $n at i, and n.
func paramEnd(q string, i int) (int, int, error) {
	start, n := i, 0
	for i++; i < len(q) && isDigit(q[i]); i++ {
		n = n*10 + int(q[i]-'0')
		if n > maxParams {
			return 0, 0, refuse("parameter at offset %d is above $%d", start, maxParams)
		}
	}
	switch {
	case n == 0:
		return 0, 0, refuse("$0 at offset %d is not a parameter", start)
	case isIdentCont(byteAt(q, i)):
		// PostgreSQL 15 and later refuse "$1abc"; older versions read $1 and a word.
		return 0, 0, refuse("parameter at offset %d runs into a word", start)
	}
	return i, n, nil
}

// dollarQuoteEnd returns the offset just past the dollar-quoted string at i.
func dollarQuoteEnd(q string, i int) (int, error) {
	start := i
	for i++; i < len(q) && q[i] != '$'; i++ {
		// A tag is an identifier without '$'; its first byte is not a digit, or
		// this would be a parameter.
		if !isIdentStart(q[i]) && !isDigit(q[i]) {
			return 0, refuse("stray '$' at offset %d", start)
		}
	}
	if i >= len(q) {
		return 0, refuse("stray '$' at offset %d", start)
	}
	delim := q[start : i+1]
	// The body ends at the first occurrence of the delimiter: the server examines
	// every '$' of the body as a possible delimiter start.
	end := strings.Index(q[i+1:], delim)
	if end < 0 {
		return 0, refuse("unterminated dollar-quoted string at offset %d", start)
	}
	return i + 1 + end + len(delim), nil
}

// kindNumberEnd returns the offset just past the numeric constant at i: digits, an
// optional fraction and an optional exponent.
func kindNumberEnd(q string, i int) (int, error) {
	start := i
	for i < len(q) && isDigit(q[i]) {
		i++
	}
	// "1..5" is 1 and then "..": the server keeps the second dot off the number.
	if byteAt(q, i) == '.' && byteAt(q, i+1) != '.' {
		for i++; i < len(q) && isDigit(q[i]); i++ {
		}
	}
	if c := byteAt(q, i); c == 'e' || c == 'E' {
		j := i + 1
		if c := byteAt(q, j); c == '+' || c == '-' {
			j++
		}
		if isDigit(byteAt(q, j)) {
			for i = j; i < len(q) && isDigit(q[i]); i++ {
			}
		}
	}
	if isIdentCont(byteAt(q, i)) {
		// Versions disagree on "1where", "0x1F" and "1_000": 15 refuses them, 16
		// takes the last two as numbers, 14 and older read a number and then a word
		// that could be a keyword.
		return 0, refuse("number at offset %d runs into a word", start)
	}
	return i, nil
}
