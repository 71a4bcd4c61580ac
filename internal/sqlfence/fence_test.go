package sqlfence

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// rewriteCases are rewritten with set ", f = $n" (for an UPDATE, unless noSet) and cond
// "ok($n)", where $n follows the query's highest parameter.
var rewriteCases = []struct {
	name  string
	query string
	noSet bool
	want  string
}{
	{
		name:  "appends to SET and ANDs the parenthesized WHERE",
		query: "UPDATE products SET in_stock = $1 WHERE id = $2",
		want:  "UPDATE products SET in_stock = $1, f = $3 WHERE (id = $2) AND ok($3)",
	},
	{
		name:  "adds a WHERE when there is none",
		query: "UPDATE products SET in_stock = $1",
		want:  "UPDATE products SET in_stock = $1, f = $2 WHERE ok($2)",
	},
	{
		name:  "puts a new WHERE before RETURNING",
		query: "UPDATE products SET in_stock = 0 RETURNING id",
		want:  "UPDATE products SET in_stock = 0, f = $1 WHERE ok($1) RETURNING id",
	},
	{
		name:  "keeps RETURNING after the WHERE and wraps an OR",
		query: "UPDATE products SET in_stock = 0 WHERE id = $1 OR id = 2 RETURNING id, in_stock",
		want:  "UPDATE products SET in_stock = 0, f = $2 WHERE (id = $1 OR id = 2) AND ok($2) RETURNING id, in_stock",
	},
	{
		name:  "ends the SET list at FROM",
		query: "UPDATE products p SET in_stock = s.stock FROM suppliers s WHERE s.product_id = p.id",
		want:  "UPDATE products p SET in_stock = s.stock, f = $1 FROM suppliers s WHERE (s.product_id = p.id) AND ok($1)",
	},
	{
		name:  "adds a WHERE after FROM",
		query: "UPDATE products SET in_stock = s.stock FROM suppliers s",
		want:  "UPDATE products SET in_stock = s.stock, f = $1 FROM suppliers s WHERE ok($1)",
	},
	{
		name:  "ignores a WHERE inside a subquery in SET",
		query: "UPDATE products SET in_stock = (SELECT s.stock FROM suppliers s WHERE s.product_id = products.id LIMIT 1) WHERE id = $1",
		want:  "UPDATE products SET in_stock = (SELECT s.stock FROM suppliers s WHERE s.product_id = products.id LIMIT 1), f = $2 WHERE (id = $1) AND ok($2)",
	},
	{
		name:  "ignores keywords in a string",
		query: "UPDATE products SET name = 'it''s where; -- returning' WHERE id = $1",
		want:  "UPDATE products SET name = 'it''s where; -- returning', f = $2 WHERE (id = $1) AND ok($2)",
	},
	{
		name:  "ignores keywords in an escape string",
		query: `UPDATE products SET name = E'it\'s where \\' WHERE id = $1`,
		want:  `UPDATE products SET name = E'it\'s where \\', f = $2 WHERE (id = $1) AND ok($2)`,
	},
	{
		name:  "continues an escape string across a newline",
		query: "UPDATE products SET name = E'a'\n  'b\\' where' WHERE id = $1",
		want:  "UPDATE products SET name = E'a'\n  'b\\' where', f = $2 WHERE (id = $1) AND ok($2)",
	},
	{
		name:  "ignores keywords in quoted identifiers",
		query: `UPDATE products AS "where" SET "name" = 'x' WHERE "where".id = $1`,
		want:  `UPDATE products AS "where" SET "name" = 'x', f = $2 WHERE ("where".id = $1) AND ok($2)`,
	},
	{
		name:  "ignores keywords in a line comment",
		query: "UPDATE products SET in_stock = 1 -- where id = 2; returning\nWHERE id = $1",
		want:  "UPDATE products SET in_stock = 1, f = $2 -- where id = 2; returning\nWHERE (id = $1) AND ok($2)",
	},
	{
		name:  "ignores keywords in nested block comments",
		query: "UPDATE products SET in_stock = 1 /* where /* nested */ returning */ WHERE id = $1 /* ; */",
		want:  "UPDATE products SET in_stock = 1, f = $2 /* where /* nested */ returning */ WHERE (id = $1) AND ok($2) /* ; */",
	},
	{
		name:  "ignores keywords in a dollar-quoted string",
		query: "UPDATE products SET note = $$ where ' $$ WHERE id = $1",
		want:  "UPDATE products SET note = $$ where ' $$, f = $2 WHERE (id = $1) AND ok($2)",
	},
	{
		name:  "ignores keywords in a tagged dollar-quoted string",
		query: "UPDATE products SET note = $x$ where $$ ; $1 $x$ WHERE id = $1",
		want:  "UPDATE products SET note = $x$ where $$ ; $1 $x$, f = $2 WHERE (id = $1) AND ok($2)",
	},
	{
		name:  "numbers after the highest parameter",
		query: "UPDATE products SET in_stock = $10 WHERE id IN ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
		want:  "UPDATE products SET in_stock = $10, f = $11 WHERE (id IN ($1, $2, $3, $4, $5, $6, $7, $8, $9)) AND ok($11)",
	},
	{
		name:  "keeps ONLY",
		query: "UPDATE ONLY products SET in_stock = 1 WHERE id = $1",
		want:  "UPDATE ONLY products SET in_stock = 1, f = $2 WHERE (id = $1) AND ok($2)",
	},
	{
		name:  "keeps an alias",
		query: "UPDATE public.products AS p SET in_stock = 1 WHERE p.id = $1",
		want:  "UPDATE public.products AS p SET in_stock = 1, f = $2 WHERE (p.id = $1) AND ok($2)",
	},
	{
		name:  "keeps a trailing semicolon and comment",
		query: "UPDATE products SET in_stock = 1 WHERE id = $1; -- done\n",
		want:  "UPDATE products SET in_stock = 1, f = $2 WHERE (id = $1) AND ok($2); -- done\n",
	},
	{
		name:  "reads lower case keywords",
		query: "update products set in_stock = 1 where id = $1",
		want:  "update products set in_stock = 1, f = $2 where (id = $1) AND ok($2)",
	},
	{
		name:  "keeps a read-only WITH query",
		query: "WITH s AS (SELECT product_id, stock FROM suppliers WHERE stock > 0) UPDATE products SET in_stock = s.stock FROM s WHERE s.product_id = products.id",
		want:  "WITH s AS (SELECT product_id, stock FROM suppliers WHERE stock > 0) UPDATE products SET in_stock = s.stock, f = $1 FROM s WHERE (s.product_id = products.id) AND ok($1)",
	},
	{
		name:  "keeps a WITH query that locks rows FOR UPDATE",
		query: "WITH RECURSIVE n(id) AS MATERIALIZED (SELECT id FROM products WHERE in_stock = 0 LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED), m AS NOT MATERIALIZED (SELECT 1 FOR UPDATE) UPDATE products SET in_stock = 10 FROM n WHERE products.id = n.id",
		want:  "WITH RECURSIVE n(id) AS MATERIALIZED (SELECT id FROM products WHERE in_stock = 0 LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED), m AS NOT MATERIALIZED (SELECT 1 FOR UPDATE) UPDATE products SET in_stock = 10, f = $1 FROM n WHERE (products.id = n.id) AND ok($1)",
	},
	{
		name:  "reads IS DISTINCT FROM as an expression in SET",
		query: "UPDATE products SET flag = name IS NOT DISTINCT FROM $1 WHERE id = $2",
		want:  "UPDATE products SET flag = name IS NOT DISTINCT FROM $1, f = $3 WHERE (id = $2) AND ok($3)",
	},
	{
		name:  "reads a keyword after a dot as a column",
		query: "UPDATE products SET note = s.from FROM suppliers s WHERE s.product_id = products.id",
		want:  "UPDATE products SET note = s.from, f = $1 FROM suppliers s WHERE (s.product_id = products.id) AND ok($1)",
	},
	{
		name:  "appends after a row assignment",
		query: "UPDATE products SET (in_stock, note) = (1, 'x') WHERE id = $1",
		want:  "UPDATE products SET (in_stock, note) = (1, 'x'), f = $2 WHERE (id = $1) AND ok($2)",
	},
	{
		name:  "keeps a space between the new parameter and a glued keyword",
		query: "UPDATE products SET note = 'x'WHERE id = $1",
		want:  "UPDATE products SET note = 'x', f = $2 WHERE (id = $1) AND ok($2)",
	},
	{
		name:  "leaves an UPDATE's SET list alone when set is empty",
		query: "UPDATE products SET in_stock = $1 WHERE id = $2",
		noSet: true,
		want:  "UPDATE products SET in_stock = $1 WHERE (id = $2) AND ok($3)",
	},
	{
		name:  "adds a WHERE to an UPDATE without set or WHERE",
		query: "UPDATE products SET in_stock = 1 RETURNING id",
		noSet: true,
		want:  "UPDATE products SET in_stock = 1 WHERE ok($1) RETURNING id",
	},
	{
		name:  "ANDs to a DELETE's WHERE before RETURNING",
		query: "DELETE FROM products WHERE id = $1 OR in_stock = 0 RETURNING id",
		want:  "DELETE FROM products WHERE (id = $1 OR in_stock = 0) AND ok($2) RETURNING id",
	},
	{
		name:  "adds a WHERE to a DELETE without one",
		query: "DELETE FROM products",
		want:  "DELETE FROM products WHERE ok($1)",
	},
	{
		name:  "keeps USING",
		query: "DELETE FROM products p USING suppliers s JOIN products q USING (id) WHERE s.product_id = p.id",
		want:  "DELETE FROM products p USING suppliers s JOIN products q USING (id) WHERE (s.product_id = p.id) AND ok($1)",
	},
	{
		name:  "keeps a DELETE's ONLY, alias and trailing semicolon",
		query: "DELETE FROM ONLY products AS p WHERE p.id = $1;",
		want:  "DELETE FROM ONLY products AS p WHERE (p.id = $1) AND ok($2);",
	},
	{
		name:  "ignores keywords in a DELETE's literals and comments",
		query: "DELETE FROM products WHERE note = $$ returning $$ OR name = E'\\' where' -- returning\n",
		want:  "DELETE FROM products WHERE (note = $$ returning $$ OR name = E'\\' where') AND ok($1) -- returning\n",
	},
	{
		name:  "keeps a read-only WITH query before a DELETE",
		query: "WITH gone AS (SELECT product_id FROM suppliers WHERE stock = 0) DELETE FROM products WHERE id IN (SELECT product_id FROM gone)",
		want:  "WITH gone AS (SELECT product_id FROM suppliers WHERE stock = 0) DELETE FROM products WHERE (id IN (SELECT product_id FROM gone)) AND ok($1)",
	},
}

func TestFenceRewrites(t *testing.T) {
	t.Parallel()
	for _, c := range rewriteCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			st, n, err := Check(c.query, params(c.query), 1, Update, Delete)
			require.NoError(t, err)
			p := "$" + strconv.Itoa(n)
			set := ""
			if st.verb == Update && !c.noSet {
				set = ", f = " + p
			}
			require.Equal(t, c.want, st.Rewrite(set, "ok("+p+")"))
		})
	}
}

// unsafeQueries are refused with ErrUnsafe, an UPDATE or a DELETE allowed.
var unsafeQueries = []struct{ name, query string }{
	{"refuses a SELECT", "SELECT * FROM products WHERE id = 1"},
	{"refuses an INSERT", "INSERT INTO products (id) VALUES (1)"},
	{"refuses a MERGE", "MERGE INTO products p USING suppliers s ON s.id = p.id WHEN MATCHED THEN UPDATE SET in_stock = 1"},
	{"refuses EXPLAIN", "EXPLAIN UPDATE products SET in_stock = 1"},
	{"refuses two statements", "UPDATE products SET in_stock = 1; UPDATE products SET in_stock = 2"},
	{"refuses a statement after a WHERE", "UPDATE products SET in_stock = 1 WHERE id = 1; SELECT 1"},
	{"refuses two semicolons", "UPDATE products SET in_stock = 1;;"},
	{"refuses a semicolon in brackets", "UPDATE products SET in_stock = (SELECT 1; SELECT 2)"},
	{"refuses WHERE CURRENT OF", "UPDATE products SET in_stock = 1 WHERE CURRENT OF c"},
	{"refuses an unterminated string", "UPDATE products SET name = 'x WHERE id = 1"},
	{"refuses an escape string left open by a backslash", `UPDATE products SET name = E'x\' WHERE id = 1`},
	{"refuses an unterminated quoted identifier", `UPDATE products SET "name = 1`},
	{"refuses an unterminated comment", "UPDATE products SET in_stock = 1 /* WHERE id = 1"},
	{"refuses an unterminated nested comment", "UPDATE products SET in_stock = 1 /* /* */ WHERE id = 1"},
	{"refuses an unterminated dollar quote", "UPDATE products SET note = $$ x WHERE id = 1"},
	{"refuses a dollar quote closed by another tag", "UPDATE products SET note = $a$ x $b$ WHERE id = 1"},
	{"refuses a stray dollar", "UPDATE products SET in_stock = $ WHERE id = 1"},
	{"refuses $0", "UPDATE products SET in_stock = $0"},
	{"refuses a parameter above 65535", "UPDATE products SET in_stock = $65536"},
	{"refuses a parameter glued to a word", "UPDATE products SET in_stock = $1where id = 1"},
	{"refuses a number glued to a word", "UPDATE products SET in_stock = 1where id = 1"},
	{"refuses a hexadecimal number", "UPDATE products SET in_stock = 0x1F"},
	{"refuses an unclosed bracket", "UPDATE products SET in_stock = (1 WHERE id = 1"},
	{"refuses a stray closing bracket", "UPDATE products SET in_stock = 1) WHERE (id = 1"},
	{"refuses mismatched brackets", "UPDATE products SET in_stock = a[1) WHERE id = 1"},
	{"refuses a vertical tab", "UPDATE products SET in_stock = 1\vWHERE id = 1"},
	{"refuses a NUL byte", "UPDATE products SET in_stock = 1 WHERE id = 1\x00 OR true"},
	{"refuses invalid UTF-8", "UPDATE products SET name = '\xff' WHERE id = 1"},
	{"refuses an empty query", ""},
	{"refuses blanks", " \n\t "},
	{"refuses a lone comment", "-- UPDATE products SET in_stock = 1"},
	{"refuses a lone semicolon", " ; "},
	{"refuses an empty WHERE", "UPDATE products SET in_stock = 1 WHERE"},
	{"refuses an empty WHERE before RETURNING", "DELETE FROM products WHERE RETURNING id"},
	{"refuses a second WHERE", "UPDATE products SET in_stock = 1 WHERE id = 1 WHERE id = 2"},
	{"refuses a WITH query that deletes", "WITH d AS (DELETE FROM suppliers RETURNING product_id) UPDATE products SET in_stock = 0 FROM d WHERE d.product_id = products.id"},
	{"refuses a WITH query that updates", "WITH u AS (UPDATE suppliers SET stock = 0 RETURNING product_id) DELETE FROM products WHERE id IN (SELECT product_id FROM u)"},
	{"refuses an UPDATE inside the WITH of a SELECT", "WITH u AS (UPDATE products SET in_stock = 0 RETURNING id) SELECT * FROM u"},
	{"refuses WITH SEARCH", "WITH RECURSIVE t(n) AS (SELECT 1) SEARCH DEPTH FIRST BY n SET o UPDATE products SET in_stock = 1"},
	{"refuses WITH without a statement", "WITH t AS (SELECT 1)"},
	{"refuses a table-less statement", "UPDATE SET in_stock = 1"},
	{"refuses an UPDATE without SET", "UPDATE products WHERE id = 1"},
	{"refuses an empty SET list", "UPDATE products SET WHERE id = 1"},
	{"refuses an empty FROM list", "UPDATE products SET in_stock = 1 FROM WHERE id = 1"},
	{"refuses a DELETE without FROM", "DELETE products WHERE id = 1"},
	{"refuses words after a DELETE's table", "DELETE FROM products p q WHERE id = 1"},
	{"refuses an empty USING list", "DELETE FROM products USING WHERE id = 1"},
	{"refuses a statement that ends with a dot", "UPDATE products SET in_stock = 1 FROM suppliers s. -- x"},
}

func TestFenceRefusals(t *testing.T) {
	t.Parallel()
	type refusal struct {
		name          string
		query         string
		nargs, params int
		verbs         []Verb
		want          error
	}
	cases := []refusal{
		{"refuses a verb not asked for", "DELETE FROM products WHERE id = 1", 0, 1, []Verb{Update}, ErrUnsafe},
		{"refuses fewer args than parameters", "UPDATE products SET in_stock = $1 WHERE id = $2", 1, 1, []Verb{Update}, ErrParams},
		{"refuses more args than parameters", "UPDATE products SET in_stock = $1", 2, 1, []Verb{Update}, ErrParams},
		{"refuses args for a query without parameters", "UPDATE products SET in_stock = 1", 1, 1, []Verb{Update}, ErrParams},
		{"refuses no room for one more parameter", "UPDATE products SET in_stock = $65535", 65535, 1, []Verb{Update}, ErrParams},
		{"refuses no room for two more parameters", "DELETE FROM products WHERE id = $65534", 65534, 2, []Verb{Delete}, ErrParams},
	}
	for _, u := range unsafeQueries {
		cases = append(cases, refusal{u.name, u.query, params(u.query), 2, []Verb{Update, Delete}, ErrUnsafe})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			st, n, err := Check(c.query, c.nargs, c.params, c.verbs...)
			require.ErrorIs(t, err, c.want)
			require.NotEmpty(t, err.Error())
			require.False(t, strings.HasPrefix(err.Error(), c.want.Error()), "the caller puts its own prefix: %q", err)
			require.Nil(t, st)
			require.Zero(t, n)
		})
	}
}

func TestFenceRefusalTexts(t *testing.T) {
	t.Parallel()
	_, _, err := Check("UPDATE t SET a = 1 WHERE b = 2\x00", 0, 1, Update)
	require.EqualError(t, err, "NUL byte at offset 30")
	_, _, err = Check("DELETE FROM t", 0, 1, Update)
	require.EqualError(t, err, "a DELETE, where only UPDATE is fenced")
	_, _, err = Check("SELECT 1", 0, 2, Update, Delete)
	require.EqualError(t, err, `not an UPDATE, DELETE or INSERT statement: "SELECT" where the verb belongs`)
	_, _, err = Check("UPDATE t SET a = $1 WHERE b = $2", 1, 1, Update)
	require.EqualError(t, err, "the query's highest parameter is $2 but 1 args were given")
}

func TestLex(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name     string
		query    string
		want     []string
		maxParam int
	}{
		{"splits words, numbers and operator bytes", "a.b+1<=$2", []string{"a", ".", "b", "+", "1", "<", "=", "$2"}, 2},
		{"keeps $ inside a word", "x$1 y", []string{"x$1", "y"}, 0},
		{"reads the highest parameter", "$10, $2", []string{"$10", ",", "$2"}, 10},
		{"skips comments and whitespace", "a -- c\n b /* x /* y */ */\tc", []string{"a", "b", "c"}, 0},
		{"reads doubled quotes", `"x""y" 'it''s'`, []string{`"x""y"`, `'it''s'`}, 0},
		{"reads backslash escapes only in E strings", `E'a\'b' 'c\'`, []string{`E'a\'b'`, `'c\'`}, 0},
		{"continues a string after a newline only", "'a'\n 'b' 'c'", []string{"'a'\n 'b'", "'c'"}, 0},
		{"reads dollar quotes", "$$a$1$$ $t$ $$ $t$", []string{"$$a$1$$", "$t$ $$ $t$"}, 0},
		{"reads numbers", "1.5e3 .5 1..5", []string{"1.5e3", ".5", "1", ".", ".5"}, 0},
		{"reads U& strings as a word, an operator and a string", `U&'d\0061t'`, []string{"U", "&", `'d\0061t'`}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			lx, err := lex(c.query)
			require.NoError(t, err)
			got := make([]string, len(lx.tokens))
			for i, tok := range lx.tokens {
				got[i] = c.query[tok.start:tok.end]
			}
			require.Equal(t, c.want, got)
			require.Equal(t, c.maxParam, lx.maxParam)
		})
	}
	t.Run("counts the depth of brackets", func(t *testing.T) {
		t.Parallel()
		lx, err := lex("f(a[1]) b")
		require.NoError(t, err)
		var depths []int
		for _, tok := range lx.tokens {
			depths = append(depths, tok.depth)
		}
		require.Equal(t, []int{0, 0, 1, 1, 2, 1, 0, 0}, depths)
	})
}

// TestFenceRewritesInserts: an INSERT's rows become a SELECT of them WHERE the fence
// holds, whatever comes before and after them.
func TestFenceRewritesInserts(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, query, want string }{
		{"a row of VALUES", "INSERT INTO ledger (slot, amount) VALUES ($1, $2)",
			"INSERT INTO ledger (slot, amount) SELECT $1, $2 WHERE ok($3)"},
		{"a row of expressions", "INSERT INTO ledger VALUES ($1, now(), (SELECT max(n) + 1 FROM ledger), 'a ) WHERE')",
			"INSERT INTO ledger SELECT $1, now(), (SELECT max(n) + 1 FROM ledger), 'a ) WHERE' WHERE ok($2)"},
		{"a schema, an alias, OVERRIDING, ON CONFLICT and RETURNING",
			"insert into app.ledger as l (id, n) overriding system value values ($1, $2) on conflict (id) do update set n = l.n + excluded.n where l.n < 9 returning id;",
			"insert into app.ledger as l (id, n) overriding system value SELECT $1, $2 WHERE ok($3) on conflict (id) do update set n = l.n + excluded.n where l.n < 9 returning id;"},
		{"RETURNING right after the row", "INSERT INTO ledger (n) VALUES ($1)RETURNING id",
			"INSERT INTO ledger (n) SELECT $1 WHERE ok($2)RETURNING id"},
		{"a query", "INSERT INTO ledger (id, n) SELECT id, count(*) FROM orders WHERE day = $1 GROUP BY id ON CONFLICT DO NOTHING",
			"INSERT INTO ledger (id, n) SELECT * FROM (SELECT id, count(*) FROM orders WHERE day = $1 GROUP BY id) AS pglock_fenced WHERE ok($2) ON CONFLICT DO NOTHING"},
		{"a query that joins", "INSERT INTO ledger SELECT o.id FROM orders o JOIN lines l ON l.order_id = o.id RETURNING *",
			"INSERT INTO ledger SELECT * FROM (SELECT o.id FROM orders o JOIN lines l ON l.order_id = o.id) AS pglock_fenced WHERE ok($1) RETURNING *"},
		{"a read-only WITH before it", "WITH d AS (SELECT 1 AS n) INSERT INTO ledger (n) SELECT n FROM d",
			"WITH d AS (SELECT 1 AS n) INSERT INTO ledger (n) SELECT * FROM (SELECT n FROM d) AS pglock_fenced WHERE ok($1)"},
		{"a query in brackets", "INSERT INTO ledger (n) (SELECT 1 UNION SELECT 2)",
			"INSERT INTO ledger (n) SELECT * FROM ((SELECT 1 UNION SELECT 2)) AS pglock_fenced WHERE ok($1)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			st, n, err := Check(c.query, params(c.query), 1, Insert)
			require.NoError(t, err)
			require.Equal(t, c.want, st.Rewrite("", "ok($"+strconv.Itoa(n)+")"))
			_, err = parse(st.Rewrite("", "ok($"+strconv.Itoa(n)+")"))
			require.NoError(t, err, "the rewrite parses again")
		})
	}
}

// TestFenceRefusesInsertsItCannotGuard: what no condition can guard, or the rewriter is
// not sure of, is refused.
func TestFenceRefusesInsertsItCannotGuard(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, query string }{
		{"DEFAULT VALUES", "INSERT INTO ledger DEFAULT VALUES"},
		{"a DEFAULT among the values", "INSERT INTO ledger (id, n) VALUES (DEFAULT, $1)"},
		{"several rows", "INSERT INTO ledger (n) VALUES ($1), ($2)"},
		{"no rows", "INSERT INTO ledger (n) RETURNING id"},
		{"no INTO", "INSERT ledger VALUES (1)"},
		{"no table", "INSERT INTO (n) VALUES (1)"},
		{"a bad OVERRIDING", "INSERT INTO ledger OVERRIDING VALUE VALUES (1)"},
		{"something else where the rows belong", "INSERT INTO ledger (n) EXECUTE p"},
		{"a writing WITH", "WITH d AS (DELETE FROM orders RETURNING id) INSERT INTO ledger SELECT id FROM d"},
		{"two statements", "INSERT INTO ledger VALUES (1); DELETE FROM ledger"},
		{"a row of VALUES then more", "INSERT INTO ledger VALUES (1) x"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			st, _, err := Check(c.query, params(c.query), 1, Insert)
			require.ErrorIs(t, err, ErrUnsafe)
			require.Nil(t, st)
		})
	}
	_, _, err := Check("INSERT INTO ledger VALUES (1)", 0, 1, Update, Delete)
	require.EqualError(t, err, "an INSERT, where only UPDATE or DELETE is fenced")
}
