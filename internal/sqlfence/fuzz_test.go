package sqlfence

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// queries returns the queries of testdata/queries.txt.
func queries(tb testing.TB) []string {
	tb.Helper()
	f, err := os.Open(filepath.Join("testdata", "queries.txt"))
	require.NoError(tb, err)
	defer f.Close()
	var qs []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		q, err := strconv.Unquote(line)
		require.NoError(tb, err, line)
		qs = append(qs, q)
	}
	require.NoError(tb, sc.Err())
	return qs
}

// params returns the highest $n of query as the lexer sees it, 0 when it cannot lex
// it: the args a caller would pass.
func params(query string) int {
	lx, err := lex(query)
	if err != nil {
		return 0
	}
	return lx.maxParam
}

// FuzzRewrite rewrites each query as pglock's two fences do (the texts are those of
// fence.go): FenceUpdate's token column, named by column, for an UPDATE; FenceHeld's
// lock_held for an UPDATE or a DELETE. checkRewrite checks each outcome.
func FuzzRewrite(f *testing.F) {
	for _, q := range queries(f) {
		f.Add(q, "stock_fencing_token")
	}
	for _, u := range unsafeQueries {
		f.Add(u.query, "stock_fencing_token")
	}
	f.Add("UPDATE t SET a = 1", `we"ird`)
	f.Fuzz(func(t *testing.T, query, column string) {
		n := params(query)
		p, p2 := "$"+strconv.Itoa(n+1), "$"+strconv.Itoa(n+2)
		// FenceUpdate refuses the other columns before it rewrites.
		if column != "" && utf8.ValidString(column) && !strings.ContainsRune(column, 0) {
			col := pgx.Identifier{column}.Sanitize()
			checkRewrite(t, query, n, 1, []Verb{Update},
				", "+col+" = "+p, "("+col+" IS NULL OR "+col+" <= "+p+")",
				[]string{",", col, "=", p}, []string{"(", col, "IS", "NULL", "OR", col, "<", "=", p, ")"})
		}
		checkRewrite(t, query, n, 2, []Verb{Update, Delete},
			"", "pglock.lock_held("+p+", "+p2+")",
			nil, []string{"pglock", ".", "lock_held", "(", p, ",", p2, ")"})
	})
}

// checkRewrite checks query with nargs args and params new parameters, and rewrites
// it with set and cond, whose tokens are setTokens and condTokens. A refusal matches
// ErrUnsafe or ErrParams and returns no statement. A rewrite, re-lexed, is the query's
// token stream with exactly the fence's tokens added (set after the SET list, cond
// ANDed to the WHERE in parentheses or as a new WHERE), none of them swallowed by a
// literal or a comment; and it parses again as one statement of the same verb whose
// highest parameter is the last of the new ones.
func checkRewrite(t *testing.T, query string, nargs, params int, verbs []Verb, set, cond string, setTokens, condTokens []string) {
	t.Helper()
	st, n, err := Check(query, nargs, params, verbs...)
	if err != nil {
		require.True(t, errors.Is(err, ErrUnsafe) || errors.Is(err, ErrParams), err.Error())
		require.Nil(t, st)
		require.Zero(t, n)
		return
	}
	require.Contains(t, verbs, st.verb)
	require.Equal(t, nargs+1, n)
	if set != "" {
		require.Equal(t, Update, st.verb, "only an UPDATE has a SET list")
	}
	out := st.Rewrite(set, cond)

	type insertion struct {
		at     int
		tokens []string
	}
	var ins []insertion
	if set != "" {
		ins = append(ins, insertion{st.setEnd, setTokens})
	}
	if st.condStart >= 0 {
		ins = append(ins,
			insertion{st.condStart, []string{"("}},
			insertion{st.condEnd, append([]string{")", "AND"}, condTokens...)})
	} else {
		ins = append(ins, insertion{st.condEnd, append([]string{"WHERE"}, condTokens...)})
	}
	var want []string
	for _, tok := range st.tokens {
		for len(ins) > 0 && ins[0].at <= tok.start {
			want = append(want, ins[0].tokens...)
			ins = ins[1:]
		}
		want = append(want, query[tok.start:tok.end])
	}
	for _, i := range ins {
		want = append(want, i.tokens...)
	}

	lx, err := lex(out)
	require.NoError(t, err, "the output lexes: %q", out)
	got := make([]string, len(lx.tokens))
	for i, tok := range lx.tokens {
		got[i] = out[tok.start:tok.end]
	}
	require.Equal(t, want, got, "rewrote %q\ninto %q", query, out)

	again, err := parse(out)
	require.NoError(t, err, "the output parses: %q", out)
	require.Equal(t, st.verb, again.verb)
	require.Equal(t, st.maxParam+params, again.maxParam, "the fence's parameters come last")
	require.GreaterOrEqual(t, again.condStart, 0, "the output has a WHERE")
}
