package pglock

import (
	"errors"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// fenceSeeds seed both fuzzers. Most are valid against fenceTestDB's schema, and
// TestFencedQueriesPrepare prepares their fenced forms; the others are refused.
var fenceSeeds = []string{
	"UPDATE products SET in_stock = $1 WHERE id = $2",
	"UPDATE products SET in_stock = $1",
	"UPDATE products SET in_stock = 0 WHERE id = $1 OR id = 2 RETURNING id, in_stock",
	"UPDATE products p SET in_stock = s.stock FROM suppliers s WHERE s.product_id = p.id RETURNING p.*",
	"UPDATE products SET in_stock = (SELECT s.stock FROM suppliers s WHERE s.product_id = products.id LIMIT 1) WHERE id = $1",
	"UPDATE products SET name = 'it''s where; -- returning' WHERE id = $1",
	`UPDATE products SET name = E'it\'s where \\' WHERE id = $1`,
	"UPDATE products SET name = E'a' -- x\n\n  'b\\' where' WHERE id = $1",
	"UPDATE products SET name = 'a' /* no continuation */ || 'b' WHERE id = $1",
	`UPDATE products AS "where" SET "name" = U&'d\0061t' WHERE "where".id = $1`,
	"UPDATE products SET in_stock = 1 -- where\nWHERE id = $1",
	"UPDATE products SET in_stock = 1 /* where /* nested */ returning */ WHERE id = $1",
	"UPDATE products SET note = $$ where ' $$ WHERE id = $1",
	"UPDATE products SET note = $x$ where $$ ; $1 $x$ WHERE id = $1",
	"UPDATE products SET in_stock = $10 WHERE id IN ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
	"UPDATE ONLY products SET in_stock = 1 WHERE id = $1",
	"UPDATE ONLY (products) AS p SET in_stock = 1 WHERE p.id = $1",
	"UPDATE products * SET in_stock = 1 WHERE id = $1",
	"UPDATE public.products p SET in_stock = 1 WHERE p.id = $1;  -- done",
	"update products set in_stock = 1 where id = $1",
	"WITH s AS (SELECT product_id, stock FROM suppliers) UPDATE products SET in_stock = s.stock FROM s WHERE s.product_id = products.id",
	"WITH n AS (SELECT id FROM products LIMIT 1 FOR UPDATE SKIP LOCKED) UPDATE products SET in_stock = 1 FROM n WHERE products.id = n.id",
	"UPDATE products SET flag = name IS DISTINCT FROM $1 WHERE id = $2",
	"UPDATE products SET note = s.from FROM suppliers s WHERE s.product_id = products.id",
	"UPDATE products SET (in_stock, note) = (1, 'x') WHERE id = $1",
	"UPDATE products SET (in_stock, note) = (SELECT stock, \"from\" FROM suppliers WHERE id = $1) WHERE id = $1",
	"UPDATE products SET note = 'x'WHERE id = $1",
	"UPDATE products SET note = 'x'RETURNING id",
	"UPDATE products SET in_stock = 1.5e3::int, note = $1::text || '.' WHERE id = .5 + 1.",
	"UPDATE products SET note = (ARRAY['a', 'b'])[1] WHERE id = 1",
	"UPDATE products SET in_stock = in_stock - 1 WHERE id = 1 AND in_stock > 0",
	"UPDATE products SET note = CASE WHEN flag THEN 'y' ELSE 'n' END WHERE note IS NOT DISTINCT FROM NULL",
	"DELETE FROM products WHERE id = $1",
	"DELETE FROM products",
	"DELETE FROM ONLY products AS p USING suppliers s WHERE s.product_id = p.id RETURNING p.id;",
	"DELETE FROM products WHERE note = $$ returning $$ -- where\n",
	"WITH gone AS (SELECT product_id FROM suppliers WHERE stock = 0) DELETE FROM products WHERE id IN (SELECT product_id FROM gone)",
	"SELECT * FROM products WHERE id = $1",
	"INSERT INTO products (id) VALUES ($1)",
	"UPDATE products SET in_stock = 1; UPDATE products SET in_stock = 2",
	"UPDATE products SET in_stock = 1 WHERE CURRENT OF c",
	"UPDATE products SET name = 'x WHERE id = 1",
	"UPDATE products SET in_stock = 1 /* WHERE id = 1",
	"UPDATE products SET note = $a$ x WHERE id = 1",
	"WITH d AS (DELETE FROM suppliers RETURNING product_id) UPDATE products SET in_stock = 0 FROM d WHERE d.product_id = products.id",
	"",
}

// fenceFuzzParams returns the highest $n of query as the lexer sees it, 0 when it
// cannot lex it: the args a caller would pass.
func fenceFuzzParams(query string) int {
	lx, err := lexSQL(query)
	if err != nil {
		return 0
	}
	return lx.maxParam
}

func FuzzFenceUpdate(f *testing.F) {
	for _, q := range fenceSeeds {
		f.Add(q, "stock_fencing_token")
	}
	f.Add("UPDATE t SET a = 1", `we"ird`)
	f.Fuzz(func(t *testing.T, query, column string) {
		col := pgx.Identifier{column}.Sanitize()
		p := "$" + strconv.Itoa(fenceFuzzParams(query)+1)
		fenceFuzzOne(t, fenceKinds[0], query, column, []string{",", col, "=", p}, []string{col, "<", "=", p})
	})
}

func FuzzFenceHeld(f *testing.F) {
	for _, q := range fenceSeeds {
		f.Add(q, "k")
	}
	f.Fuzz(func(t *testing.T, query, key string) {
		n := fenceFuzzParams(query)
		fenceFuzzOne(t, fenceKinds[1], query, key, nil, []string{
			"pglock", ".", "lock_held", "(", "$" + strconv.Itoa(n+1), ",", "$" + strconv.Itoa(n+2), ")"})
	})
}

// fenceFuzzOne fences query with k and arg, and checks the outcome: a refusal that
// wraps one of the sentinels with an empty query and nil args, or a rewrite that
// fenceCheck finds sound, with the fence's args appended.
func fenceFuzzOne(t *testing.T, k fenceKind, query, arg string, set, cond []string) {
	args := make([]any, fenceFuzzParams(query))
	out, outArgs, err := k.fence(query, arg, 7, args...)
	if err != nil {
		require.True(t, errors.Is(err, ErrUnsafeQuery) || errors.Is(err, ErrInvalidArgument) || errors.Is(err, ErrInvalidKey), err.Error())
		require.Empty(t, out)
		require.Nil(t, outArgs)
		return
	}
	extra := k.extra(arg, 7)
	fenceCheck(t, query, out, len(extra), set, cond)
	require.Equal(t, append(args, extra...), outArgs)
}

// fenceCheck checks a fenced query out against the query in it came from: re-lexed,
// out is in's token stream with exactly the fence's tokens added (set after the SET
// list, cond ANDed to the WHERE in parentheses or as a new WHERE), none of them
// swallowed by a literal or a comment; and out parses again as one statement of the
// same verb whose highest parameter is the last of the fence's params new ones.
func fenceCheck(t *testing.T, in, out string, params int, set, cond []string) {
	t.Helper()
	st, err := parseFenceable(in)
	require.NoError(t, err, "the input was fenced, so it parses")
	if set != nil {
		require.Equal(t, "UPDATE", st.verb, "only an UPDATE has a SET list")
	}

	type insertion struct {
		at     int
		tokens []string
	}
	var ins []insertion
	if set != nil {
		ins = append(ins, insertion{st.setEnd, set})
	}
	if st.condStart >= 0 {
		ins = append(ins,
			insertion{st.condStart, []string{"("}},
			insertion{st.condEnd, append([]string{")", "AND"}, cond...)})
	} else {
		ins = append(ins, insertion{st.condEnd, append([]string{"WHERE"}, cond...)})
	}
	var want []string
	for _, tok := range st.tokens {
		for len(ins) > 0 && ins[0].at <= tok.start {
			want = append(want, ins[0].tokens...)
			ins = ins[1:]
		}
		want = append(want, in[tok.start:tok.end])
	}
	for _, i := range ins {
		want = append(want, i.tokens...)
	}

	lx, err := lexSQL(out)
	require.NoError(t, err, "the output lexes: %q", out)
	got := make([]string, len(lx.tokens))
	for i, tok := range lx.tokens {
		got[i] = out[tok.start:tok.end]
	}
	require.Equal(t, want, got, "fenced %q\ninto %q", in, out)

	again, err := parseFenceable(out)
	require.NoError(t, err, "the output parses: %q", out)
	require.Equal(t, st.verb, again.verb)
	require.Equal(t, st.maxParam+params, again.maxParam, "the fence's parameters come last")
	require.GreaterOrEqual(t, again.condStart, 0, "the output has a WHERE")
}
