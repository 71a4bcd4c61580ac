// Package sqlfence rewrites the text of a single UPDATE, DELETE or INSERT so that a
// fence guards it: an assignment appended to an UPDATE's SET list, a condition ANDed to
// the WHERE, an INSERT's rows selected WHERE the condition holds. pglock's FenceUpdate and FenceHeld are built on it; which assignment and which
// condition they add is theirs to say, and this package knows nothing of tokens or
// locks.
//
// # Lexing
//
// A fence put in the wrong place, a subquery's WHERE for one, guards nothing, and the
// statement still runs. So the query is split the way PostgreSQL's own scanner splits
// it, for the constructs that decide where a keyword is: string constants (escape
// strings and continued ones too), quoted identifiers, nested comments, dollar quotes,
// parameters, numbers and brackets. Anything it is not sure of is refused, never
// guessed: a NUL byte, invalid UTF-8, a control character, a number or parameter that
// runs into a word (versions of PostgreSQL read those differently). It assumes what
// pgx requires of a connection anyway: client_encoding UTF8 and
// standard_conforming_strings on.
//
// # Parsing
//
// Only the top level of the statement is parsed: an optional WITH whose queries do not
// write, the verb, the target table, and the clauses in the order they must come (SET,
// FROM or USING, WHERE, RETURNING). Several statements, WHERE CURRENT OF and empty
// clauses are refused. An INSERT's rows are what follows its table, column list and
// OVERRIDING, up to a top-level ON CONFLICT or RETURNING: one row of VALUES, or a query,
// which the rewrite wraps whole, so that no clause of it (a GROUP BY, an aggregate, a
// UNION) can let a row through. DEFAULT VALUES, a DEFAULT among the values and several
// rows of VALUES are refused: a SELECT cannot give the first two, and a SELECT of
// several rows of parameters would leave their types unknown.
//
// # Errors
//
// Check's errors match ErrUnsafe or ErrParams with errors.Is. Their text is the reason
// alone, with no prefix, for the caller to put its own sentinel before it.
package sqlfence
