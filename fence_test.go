package pglock

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// fenceCol is the fence column of the scratch schema's products table, quoted.
const fenceCol = `"stock_fencing_token"`

// fenceCase is a query a fence rewrites into want, with token 7.
type fenceCase struct {
	name  string
	query string
	arg   string // the column or the key, when not the fenceKind's
	args  []any
	want  string
}

// fenceFunc is FenceUpdate or FenceHeld: arg is the column or the key.
type fenceFunc func(query, arg string, token int64, args ...any) (string, []any, error)

// fenceKind is one of the two fences, with its cases.
type fenceKind struct {
	name  string
	fence fenceFunc
	arg   string // the column or the key of the cases that name none
	cases []fenceCase
	extra func(arg string, token int64) []any // the args the fence appends
	types []uint32                            // the types the server gives the fence's parameters
}

var fenceKinds = []fenceKind{
	{
		name: "FenceUpdate", fence: FenceUpdate, arg: "stock_fencing_token", cases: fenceUpdateCases,
		extra: func(_ string, token int64) []any { return []any{token} },
		types: []uint32{pgtype.Int8OID},
	},
	{
		name: "FenceHeld", fence: FenceHeld, arg: "k", cases: fenceHeldCases,
		extra: func(key string, token int64) []any { return []any{key, token} },
		types: []uint32{pgtype.TextOID, pgtype.Int8OID},
	},
}

// argOf returns the column or the key c runs with.
func (k fenceKind) argOf(c fenceCase) string {
	if c.arg != "" {
		return c.arg
	}
	return k.arg
}

// run fences c's query with token.
func (k fenceKind) run(c fenceCase, token int64) (string, []any, error) {
	return k.fence(c.query, k.argOf(c), token, c.args...)
}

// fenceCond is FenceUpdate's condition on fenceCol with parameter p.
func fenceCond(p string) string { return "(" + fenceCol + " IS NULL OR " + fenceCol + " <= " + p + ")" }

// fenceUpdateCases: the column is stock_fencing_token unless arg names another. Where
// the fence goes in every kind of statement is internal/sqlfence's to test; these
// show what FenceUpdate adds.
var fenceUpdateCases = []fenceCase{
	{
		name:  "appends to SET and ANDs the parenthesized WHERE",
		query: "UPDATE products SET in_stock = $1 WHERE id = $2",
		args:  []any{10, 1},
		want:  `UPDATE products SET in_stock = $1, "stock_fencing_token" = $3 WHERE (id = $2) AND ("stock_fencing_token" IS NULL OR "stock_fencing_token" <= $3)`,
	},
	{
		name:  "adds a WHERE when there is none",
		query: "UPDATE products SET in_stock = $1",
		args:  []any{10},
		want:  "UPDATE products SET in_stock = $1, " + fenceCol + " = $2 WHERE " + fenceCond("$2"),
	},
	{
		name:  "puts a new WHERE before RETURNING",
		query: "UPDATE products SET in_stock = 0 RETURNING id",
		want:  "UPDATE products SET in_stock = 0, " + fenceCol + " = $1 WHERE " + fenceCond("$1") + " RETURNING id",
	},
	{
		name:  "keeps RETURNING after the WHERE and wraps an OR",
		query: "UPDATE products SET in_stock = 0 WHERE id = $1 OR id = 2 RETURNING id, in_stock",
		args:  []any{1},
		want:  "UPDATE products SET in_stock = 0, " + fenceCol + " = $2 WHERE (id = $1 OR id = 2) AND " + fenceCond("$2") + " RETURNING id, in_stock",
	},
	{
		name:  "ends the SET list at FROM",
		query: "UPDATE products p SET in_stock = s.stock FROM suppliers s WHERE s.product_id = p.id",
		want:  "UPDATE products p SET in_stock = s.stock, " + fenceCol + " = $1 FROM suppliers s WHERE (s.product_id = p.id) AND " + fenceCond("$1"),
	},
	{
		name:  "numbers after the highest parameter",
		query: "UPDATE products SET in_stock = $10 WHERE id IN ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
		args:  []any{1, 2, 3, 4, 5, 6, 7, 8, 9, 10},
		want:  "UPDATE products SET in_stock = $10, " + fenceCol + " = $11 WHERE (id IN ($1, $2, $3, $4, $5, $6, $7, $8, $9)) AND " + fenceCond("$11"),
	},
	{
		name:  "keeps a space between the new parameter and a glued keyword",
		query: "UPDATE products SET note = 'x'WHERE id = $1",
		args:  []any{1},
		want:  "UPDATE products SET note = 'x', " + fenceCol + " = $2 WHERE (id = $1) AND " + fenceCond("$2"),
	},
	{
		name:  "quotes the column as an identifier",
		query: "UPDATE products SET in_stock = 1",
		arg:   `Fence "Token"`,
		want:  `UPDATE products SET in_stock = 1, "Fence ""Token""" = $1 WHERE ("Fence ""Token""" IS NULL OR "Fence ""Token""" <= $1)`,
	},
}

// fenceHeldCases: the key is "k".
var fenceHeldCases = []fenceCase{
	{
		name:  "ANDs lock_held to an UPDATE's parenthesized WHERE",
		query: "UPDATE products SET in_stock = $1 WHERE id = $2",
		args:  []any{10, 1},
		want:  "UPDATE products SET in_stock = $1 WHERE (id = $2) AND pglock.lock_held($3, $4)",
	},
	{
		name:  "adds a WHERE to an UPDATE without one",
		query: "UPDATE products SET in_stock = 1 RETURNING id",
		want:  "UPDATE products SET in_stock = 1 WHERE pglock.lock_held($1, $2) RETURNING id",
	},
	{
		name:  "ANDs lock_held to a DELETE's WHERE before RETURNING",
		query: "DELETE FROM products WHERE id = $1 OR in_stock = 0 RETURNING id",
		args:  []any{1},
		want:  "DELETE FROM products WHERE (id = $1 OR in_stock = 0) AND pglock.lock_held($2, $3) RETURNING id",
	},
	{
		name:  "adds a WHERE to a DELETE without one",
		query: "DELETE FROM products",
		want:  "DELETE FROM products WHERE pglock.lock_held($1, $2)",
	},
	{
		name:  "keeps USING",
		query: "DELETE FROM products p USING suppliers s JOIN products q USING (id) WHERE s.product_id = p.id",
		want:  "DELETE FROM products p USING suppliers s JOIN products q USING (id) WHERE (s.product_id = p.id) AND pglock.lock_held($1, $2)",
	},
	{
		name:  "numbers after the highest parameter",
		query: "UPDATE products SET in_stock = $10 WHERE id IN ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
		args:  []any{1, 2, 3, 4, 5, 6, 7, 8, 9, 10},
		want:  "UPDATE products SET in_stock = $10 WHERE (id IN ($1, $2, $3, $4, $5, $6, $7, $8, $9)) AND pglock.lock_held($11, $12)",
	},
}

func TestFenceRewrites(t *testing.T) {
	t.Parallel()
	for _, k := range fenceKinds {
		for _, c := range k.cases {
			t.Run(k.name+"/"+c.name, func(t *testing.T) {
				t.Parallel()
				q, args, err := k.run(c, 7)
				require.NoError(t, err)
				require.Equal(t, c.want, q)
				require.Equal(t, append(slices.Clone(c.args), k.extra(k.argOf(c), 7)...), args)
			})
		}
	}
}

func TestFenceUpdateDoesNotWriteIntoCallersArgs(t *testing.T) {
	t.Parallel()
	backing := []any{1, "untouched"}
	_, args, err := FenceUpdate("UPDATE products SET in_stock = $1", "c", 7, backing[:1]...)
	require.NoError(t, err)
	require.Equal(t, []any{1, int64(7)}, args)
	require.Equal(t, "untouched", backing[1])
}

// fenceUnsafeQueries are refused by both fences with ErrUnsafeQuery: a few of the
// kinds internal/sqlfence refuses, from the lexer, the parser and the verb check.
var fenceUnsafeQueries = []struct{ name, query string }{
	{"refuses a SELECT", "SELECT * FROM products WHERE id = 1"},
	{"refuses two statements", "UPDATE products SET in_stock = 1; UPDATE products SET in_stock = 2"},
	{"refuses WHERE CURRENT OF", "UPDATE products SET in_stock = 1 WHERE CURRENT OF c"},
	{"refuses an unterminated string", "UPDATE products SET name = 'x WHERE id = 1"},
	{"refuses a NUL byte", "UPDATE products SET in_stock = 1 WHERE id = 1\x00 OR true"},
	{"refuses a WITH query that deletes", "WITH d AS (DELETE FROM suppliers RETURNING product_id) UPDATE products SET in_stock = 0 FROM d WHERE d.product_id = products.id"},
	{"refuses an empty query", ""},
}

func TestFenceRefusals(t *testing.T) {
	t.Parallel()
	update, held := fenceKinds[0], fenceKinds[1]
	type refusal struct {
		name       string
		kind       fenceKind
		query, arg string
		token      int64
		args       []any
		want       error
	}
	cases := []refusal{
		{"refuses a DELETE", update, "DELETE FROM products WHERE id = 1", "c", 7, nil, ErrUnsafeQuery},
		{"refuses fewer args than parameters", update, "UPDATE products SET in_stock = $1 WHERE id = $2", "c", 7, []any{1}, ErrInvalidArgument},
		{"refuses more args than parameters", update, "UPDATE products SET in_stock = $1", "c", 7, []any{1, 2}, ErrInvalidArgument},
		{"refuses args for a query without parameters", update, "UPDATE products SET in_stock = 1", "c", 7, []any{1}, ErrInvalidArgument},
		{"refuses an empty column", update, "UPDATE products SET in_stock = 1", "", 7, nil, ErrInvalidArgument},
		{"refuses a column PostgreSQL would truncate", update, "UPDATE products SET in_stock = 1", strings.Repeat("c", 64), 7, nil, ErrInvalidArgument},
		{"refuses a column with a NUL byte", update, "UPDATE products SET in_stock = 1", "c\x00", 7, nil, ErrInvalidArgument},
		{"refuses a column that is not UTF-8", update, "UPDATE products SET in_stock = 1", "c\xff", 7, nil, ErrInvalidArgument},
		{"refuses token 0", update, "UPDATE products SET in_stock = 1", "c", 0, nil, ErrInvalidArgument},
		{"refuses a negative token", update, "UPDATE products SET in_stock = 1", "c", -1, nil, ErrInvalidArgument},
		{"refuses fewer args than parameters", held, "DELETE FROM products WHERE id = $1", "k", 7, nil, ErrInvalidArgument},
		{"refuses more args than parameters", held, "DELETE FROM products WHERE id = $1", "k", 7, []any{1, 2}, ErrInvalidArgument},
		{"refuses no room for two more parameters", held, "DELETE FROM products WHERE id = $65534", "k", 7, make([]any, 65534), ErrInvalidArgument},
		{"refuses an empty key", held, "DELETE FROM products", "", 7, nil, ErrInvalidKey},
		{"refuses a key that is not UTF-8", held, "DELETE FROM products", "k\xff", 7, nil, ErrInvalidKey},
		{"refuses a key with a NUL byte", held, "DELETE FROM products", "k\x00", 7, nil, ErrInvalidKey},
		{"refuses token 0", held, "DELETE FROM products", "k", 0, nil, ErrInvalidArgument},
		{"refuses a negative token", held, "DELETE FROM products", "k", -1, nil, ErrInvalidArgument},
	}
	for _, u := range fenceUnsafeQueries {
		for _, k := range fenceKinds {
			cases = append(cases, refusal{u.name, k, u.query, k.arg, 7, nil, ErrUnsafeQuery})
		}
	}
	for _, c := range cases {
		t.Run(c.kind.name+"/"+c.name, func(t *testing.T) {
			t.Parallel()
			q, args, err := c.kind.fence(c.query, c.arg, c.token, c.args...)
			require.ErrorIs(t, err, c.want)
			require.True(t, strings.HasPrefix(err.Error(), "pglock: "), err.Error())
			require.Empty(t, q)
			require.Nil(t, args)
		})
	}
}

// TestFenceErrorTexts: internal/sqlfence's reasons read as pglock's errors.
func TestFenceErrorTexts(t *testing.T) {
	t.Parallel()
	_, _, err := FenceUpdate("UPDATE t SET a = 1 WHERE b = 2\x00", "c", 7)
	require.EqualError(t, err, "pglock: query cannot be fenced safely: NUL byte at offset 30")
	_, _, err = FenceUpdate("DELETE FROM t", "c", 7)
	require.EqualError(t, err, "pglock: query cannot be fenced safely: a DELETE, where only UPDATE is fenced")
	_, _, err = FenceHeld("UPDATE t SET a = $1 WHERE b = $2", "k", 7, 1)
	require.EqualError(t, err, "pglock: invalid argument: the query's highest parameter is $2 but 1 args were given")
	_, _, err = FenceHeld("DELETE FROM t WHERE id = $65534", "k", 7, make([]any, 65534)...)
	require.EqualError(t, err, "pglock: invalid argument: the query has 65534 parameters, which leaves no room for the fence's 2")
}

func TestExecFencedRefusesBeforeTheDatabase(t *testing.T) {
	t.Parallel()
	n, err := ExecFenced(context.Background(), nil, "UPDATE products SET in_stock = 1", "c", 7)
	require.ErrorIs(t, err, ErrInvalidArgument)
	require.Zero(t, n)
	// A database that fails the test if it is reached.
	var db fenceFailExecer = func() { t.Error("ExecFenced reached the database") }
	n, err = ExecFenced(context.Background(), db, "SELECT 1", "c", 7)
	require.ErrorIs(t, err, ErrUnsafeQuery)
	require.Zero(t, n)
	n, err = ExecFenced(context.Background(), db, "UPDATE products SET in_stock = 1", "c", 0)
	require.ErrorIs(t, err, ErrInvalidArgument)
	require.Zero(t, n)
}

type fenceFailExecer func()

func (f fenceFailExecer) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	f()
	return pgconn.CommandTag{}, nil
}

// fencePrepare prepares query on the server and returns the types of its parameters.
func fencePrepare(ctx context.Context, pool *pgxpool.Pool, query string) ([]uint32, error) {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer c.Release()
	sd, err := c.Conn().PgConn().Prepare(ctx, "", query, nil)
	if err != nil {
		return nil, err
	}
	return sd.ParamOIDs, nil
}

// TestFencedQueriesPrepare has the server parse every fenced query of the tables, and
// of internal/sqlfence's test queries and fuzz corpus: a rewrite that PostgreSQL reads
// differently than the lexer does would mostly fail here.
func TestFencedQueriesPrepare(t *testing.T) {
	t.Parallel()
	pool := fenceTestDB(t)
	ctx := context.Background()
	// check prepares fenced and checks that the server gives the fence's parameters,
	// the last ones, the types of what they stand for: the bigint fence column, or the
	// text key and bigint token of lock_held.
	check := func(t *testing.T, query, fenced string, params int, fence ...uint32) {
		t.Helper()
		types, err := fencePrepare(ctx, pool, fenced)
		require.NoError(t, err, "%s\nfenced from\n%s", fenced, query)
		require.Len(t, types, params, fenced)
		require.Equal(t, fence, types[params-len(fence):], fenced)
	}
	for _, k := range fenceKinds {
		for _, c := range k.cases {
			q, args, err := k.run(c, 7)
			require.NoError(t, err, c.name)
			check(t, c.query, q, len(args), k.types...)
		}
	}
	queries := fenceQueries(t)
	queries = append(queries, fenceCorpus(t)...)
	var fenced int
	for _, query := range queries {
		// Only queries the server takes as they are say something about the rewrite.
		types, err := fencePrepare(ctx, pool, query)
		if err != nil {
			t.Logf("not fenced, invalid as it is: %q: %v", query, err)
			continue
		}
		args := make([]any, len(types)) // as many as the server counts
		for _, k := range fenceKinds {
			q, fencedArgs, err := k.fence(query, k.arg, 7, args...)
			if err != nil {
				// The lexer may refuse a valid query, but must count its parameters as
				// the server does.
				require.ErrorIs(t, err, ErrUnsafeQuery, query)
				continue
			}
			check(t, query, q, len(fencedArgs), k.types...)
			fenced++
		}
	}
	require.Greater(t, fenced, len(queries)/2, "most test queries are valid statements that fence")
}

// fenceSQLTestdata is internal/sqlfence's testdata.
var fenceSQLTestdata = filepath.Join("internal", "sqlfence", "testdata")

// fenceQueries reads internal/sqlfence's test queries: one Go-quoted string a line,
// # comments.
func fenceQueries(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(fenceSQLTestdata, "queries.txt"))
	require.NoError(t, err)
	var queries []string
	for _, line := range strings.Split(string(data), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		q, err := strconv.Unquote(line)
		require.NoError(t, err, line)
		queries = append(queries, q)
	}
	return queries
}

// fenceCorpus reads the queries of internal/sqlfence's FuzzRewrite corpus.
func fenceCorpus(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(fenceSQLTestdata, "fuzz", "FuzzRewrite", "*"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	var inputs []string
	for _, file := range files {
		data, err := os.ReadFile(file)
		require.NoError(t, err)
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		require.Equal(t, "go test fuzz v1", lines[0], file)
		// The first value is the query; the second is the column.
		v, ok := strings.CutPrefix(lines[1], "string(")
		require.True(t, ok, file)
		s, err := strconv.Unquote(strings.TrimSuffix(v, ")"))
		require.NoError(t, err, file)
		inputs = append(inputs, s)
	}
	return inputs
}

func TestLockHeld(t *testing.T) {
	t.Parallel()
	pool := fenceTestDB(t)
	ctx := context.Background()
	var live, expiring, released int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT pglock.lock_acquire('live', 'a', 60000)").Scan(&live))
	require.NoError(t, pool.QueryRow(ctx, "SELECT pglock.lock_acquire('expiring', 'a', 50)").Scan(&expiring))
	require.NoError(t, pool.QueryRow(ctx, "SELECT pglock.lock_acquire('released', 'a', 60000)").Scan(&released))
	_, err := pool.Exec(ctx, "SELECT pglock.lock_release('released', 'a'), pg_sleep(0.1)")
	require.NoError(t, err)
	for _, c := range []struct {
		name  string
		key   string
		token int64
		want  *bool
	}{
		{"is true for the live holder's token", "live", live, fenceBool(true)},
		{"is false for another token", "live", live + 100, fenceBool(false)},
		{"is false for another key", "other", live, fenceBool(false)},
		{"is false once released", "released", released, fenceBool(false)},
		{"is false once expired", "expiring", expiring, fenceBool(false)},
	} {
		t.Run(c.name, func(t *testing.T) {
			var held *bool
			require.NoError(t, pool.QueryRow(ctx, "SELECT pglock.lock_held($1, $2)", c.key, c.token).Scan(&held))
			require.Equal(t, c.want, held)
		})
	}
	t.Run("is null, so false in a WHERE, for a null argument", func(t *testing.T) {
		var held *bool
		require.NoError(t, pool.QueryRow(ctx, "SELECT pglock.lock_held(NULL, $1)", live).Scan(&held))
		require.Nil(t, held)
	})
}

func fenceBool(b bool) *bool { return &b }

// takeOver is a takeover as lock_acquire makes one: row-lock the lock row FOR UPDATE,
// then give it another owner and a greater token. (An UPDATE that locks no row first
// would not wait for a fenced write under READ COMMITTED: see 000005's lock_held.)
const takeOver = `SELECT 1 FROM pglock.locks WHERE key = 'k' FOR UPDATE;
	UPDATE pglock.locks SET owner = 'b', fencing_token = fencing_token + 1 WHERE key = 'k'`

// TestLockHeldRowLockBlocksTakeover: the writer's row lock makes a takeover wait for the
// writer's transaction, but not a renewal: renewals of a lock under a fenced write must
// go on (issue path 2).
func TestLockHeldRowLockBlocksTakeover(t *testing.T) {
	t.Parallel()
	pool := fenceTestDB(t)
	ctx := context.Background()
	var token int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT pglock.lock_acquire('k', 'a', 60000)").Scan(&token))

	writer, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = writer.Rollback(ctx) }()
	var held bool
	require.NoError(t, writer.QueryRow(ctx, "SELECT pglock.lock_held('k', $1)", token).Scan(&held))
	require.True(t, held)

	// within runs query in a transaction that gives up after 200 ms of waiting for a lock.
	within := func(query string) error {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '200ms'"); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, query); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	require.NoError(t, within("SELECT pglock.lock_renew('k', 'a', 60000)"), "the renewal waited for the writer")
	require.NoError(t, within("SELECT pglock.lock_renew_many('{k}', '{a}', 60000)"), "the batched renewal waited for the writer")
	err = within(takeOver)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "55P03", pgErr.Code, "lock_not_available: the takeover waited for the writer")

	require.NoError(t, writer.Commit(ctx))
	require.NoError(t, within(takeOver), "the takeover goes through once the writer committed")
	require.NoError(t, pool.QueryRow(ctx, "SELECT pglock.lock_held('k', $1)", token).Scan(&held))
	require.False(t, held)
}

// TestLockHeldWaitsForTakeoverInFlight: a write that starts while a takeover's
// transaction is open waits for it and then sees that the lock is gone.
func TestLockHeldWaitsForTakeoverInFlight(t *testing.T) {
	t.Parallel()
	pool := fenceTestDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var token int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT pglock.lock_acquire('k', 'a', 60000)").Scan(&token))
	_, err := pool.Exec(ctx, "INSERT INTO products (id, in_stock, stock_fencing_token) VALUES (1, 0, 0)")
	require.NoError(t, err)

	takeover, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = takeover.Rollback(ctx) }()
	_, err = takeover.Exec(ctx, takeOver)
	require.NoError(t, err)

	q, args, err := FenceHeld("UPDATE products SET in_stock = $1 WHERE id = $2", "k", token, 99, 1)
	require.NoError(t, err)
	type result struct {
		tag pgconn.CommandTag
		err error
	}
	done := make(chan result, 1)
	go func() {
		tag, err := pool.Exec(ctx, q, args...)
		done <- result{tag, err}
	}()
	// The write is blocked on the lock row until the takeover ends.
	for {
		var waiting int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting))
		if waiting > 0 {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("the write did not wait for the takeover: %v, %v", r.tag, r.err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	require.NoError(t, takeover.Commit(ctx))
	r := <-done
	require.NoError(t, r.err)
	require.Zero(t, r.tag.RowsAffected(), "the stale write wrote nothing")
	var inStock int
	require.NoError(t, pool.QueryRow(ctx, "SELECT in_stock FROM products WHERE id = 1").Scan(&inStock))
	require.Zero(t, inStock)
}

// TestLockHeldDuringAReleaseInFlightKeepsTheKeyUntilTheWriteEnds: a fenced write that
// meets the holder's own release in flight (Close while a fenced transaction runs)
// still writes, as the holder it was; its row lock passes to the released row version,
// so that nobody takes the key, nor prunes it, before the write's transaction ends.
func TestLockHeldDuringAReleaseInFlightKeepsTheKeyUntilTheWriteEnds(t *testing.T) {
	t.Parallel()
	pool := fenceTestDB(t)
	ctx := context.Background()
	var token int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT pglock.lock_acquire('k', 'a', 60000)").Scan(&token))
	_, err := pool.Exec(ctx, "INSERT INTO products (id, in_stock) VALUES (1, 0)")
	require.NoError(t, err)

	release, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = release.Rollback(ctx) }()
	var released bool
	require.NoError(t, release.QueryRow(ctx, "SELECT pglock.lock_release('k', 'a')").Scan(&released))
	require.True(t, released)

	writer, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = writer.Rollback(ctx) }()
	q, args, err := FenceHeld("UPDATE products SET in_stock = $1 WHERE id = $2", "k", token, 10, 1)
	require.NoError(t, err)
	tag, err := writer.Exec(ctx, q, args...)
	require.NoError(t, err, "the write did not wait for the release")
	require.EqualValues(t, 1, tag.RowsAffected())
	require.NoError(t, release.Commit(ctx))

	var taken *int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT pglock.lock_acquire('k', 'b', 60000)").Scan(&taken))
	require.Nil(t, taken, "the key was taken while the write's transaction was open")
	var pruned int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT pglock.lock_prune(0, 10)").Scan(&pruned))
	require.Zero(t, pruned)

	require.NoError(t, writer.Commit(ctx))
	require.NoError(t, pool.QueryRow(ctx, "SELECT pglock.lock_acquire('k', 'b', 60000)").Scan(&taken))
	require.NotNil(t, taken)
	require.Greater(t, *taken, token)
}

func TestFenceHeldWrites(t *testing.T) {
	t.Parallel()
	pool := fenceTestDB(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, "INSERT INTO products (id, in_stock) VALUES (1, 0), (2, 0)")
	require.NoError(t, err)
	var old int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT pglock.lock_acquire('k', 'a', 60000)").Scan(&old))
	exec := fenceHeldExec(t, pool, "k")
	require.EqualValues(t, 1, exec("UPDATE products SET in_stock = $1 WHERE id = $2", old, 10, 1), "the holder writes")

	// The lock expires on the database clock: no timing games with a short ttl.
	_, err = pool.Exec(ctx, "UPDATE pglock.locks SET expires_at = clock_timestamp() WHERE key = 'k'")
	require.NoError(t, err)
	require.EqualValues(t, 0, exec("UPDATE products SET in_stock = $1 WHERE id = $2", old, 20, 1), "an expired lock writes nothing")

	var current int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT pglock.lock_acquire('k', 'b', 60000)").Scan(&current))
	require.Greater(t, current, old)
	require.EqualValues(t, 0, exec("DELETE FROM products WHERE id = $1", old, 1), "the old holder deletes nothing")
	require.EqualValues(t, 2, exec("UPDATE products SET in_stock = 30", current), "the new holder writes")
	require.EqualValues(t, 1, exec("DELETE FROM products WHERE id = $1 RETURNING id", current, 2), "the new holder deletes")

	var inStock int
	require.NoError(t, pool.QueryRow(ctx, "SELECT in_stock FROM products WHERE id = 1").Scan(&inStock))
	require.Equal(t, 30, inStock)
}

// TestFenceHeldInserts: an INSERT fenced by the lock writes its rows only while the
// lock is the live one: a row of VALUES, ON CONFLICT and RETURNING kept, and a query
// whose aggregate would give a row even where its WHERE gave none.
func TestFenceHeldInserts(t *testing.T) {
	t.Parallel()
	pool := fenceTestDB(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `CREATE TABLE ledger (id bigint PRIMARY KEY, amount int NOT NULL, at timestamptz)`)
	require.NoError(t, err)
	var old int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT pglock.lock_acquire('k', 'a', 60000)").Scan(&old))
	exec := fenceHeldExec(t, pool, "k")
	// The query becomes a subquery: a parameter alone in its select list needs a cast.
	count := "INSERT INTO ledger (id, amount) SELECT 100 + count(*), $1::int FROM ledger WHERE amount < 0"
	require.EqualValues(t, 1, exec("INSERT INTO ledger (id, amount, at) VALUES ($1, $2, now())", old, 1, 10), "the holder inserts")
	require.EqualValues(t, 1, exec(count, old, 5), "the holder inserts what a query selects")

	_, err = pool.Exec(ctx, "UPDATE pglock.locks SET expires_at = clock_timestamp() WHERE key = 'k'")
	require.NoError(t, err)
	require.EqualValues(t, 0, exec("INSERT INTO ledger (id, amount) VALUES ($1, $2)", old, 2, 20), "an expired lock inserts nothing")
	var current int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT pglock.lock_acquire('k', 'b', 60000)").Scan(&current))
	require.EqualValues(t, 0, exec("INSERT INTO ledger (id, amount) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET amount = excluded.amount RETURNING id", old, 1, 30),
		"the old holder neither inserts nor updates on conflict")
	require.EqualValues(t, 0, exec(count, old, 6), "the old holder's aggregate inserts nothing")
	require.EqualValues(t, 1, exec("INSERT INTO ledger (id, amount) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET amount = excluded.amount RETURNING id", current, 1, 40),
		"the new holder writes")

	var rows, sum int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*), sum(amount) FROM ledger").Scan(&rows, &sum))
	require.Equal(t, 2, rows)
	require.Equal(t, 45, sum)
}

// fenceHeldExec returns a function that runs query fenced by FenceHeld with key and
// token, and returns the rows it wrote.
func fenceHeldExec(t *testing.T, pool *pgxpool.Pool, key string) func(query string, token int64, args ...any) int64 {
	return func(query string, token int64, args ...any) int64 {
		t.Helper()
		q, fencedArgs, err := FenceHeld(query, key, token, args...)
		require.NoError(t, err)
		tag, err := pool.Exec(context.Background(), q, fencedArgs...)
		require.NoError(t, err, q)
		return tag.RowsAffected()
	}
}

func TestExecFenced(t *testing.T) {
	t.Parallel()
	pool := fenceTestDB(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, "INSERT INTO products (id, in_stock) VALUES (1, 0)")
	require.NoError(t, err)
	const update = "UPDATE products SET in_stock = $1 WHERE id = $2"
	for _, step := range []struct {
		name        string
		token       int64
		value       int
		wantWritten int64
		wantValue   int
		wantToken   int64
	}{
		{"writes with a first token", 5, 50, 1, 50, 5},
		{"refuses a stale token", 3, 30, 0, 50, 5},
		{"writes again with the same token", 5, 55, 1, 55, 5},
		{"writes with a newer token", 7, 70, 1, 70, 7},
	} {
		n, err := ExecFenced(ctx, pool, update, "stock_fencing_token", step.token, step.value, 1)
		require.NoError(t, err, step.name)
		require.Equal(t, step.wantWritten, n, step.name)
		var value int
		var token int64
		require.NoError(t, pool.QueryRow(ctx, "SELECT in_stock, stock_fencing_token FROM products WHERE id = 1").Scan(&value, &token))
		require.Equal(t, step.wantValue, value, step.name)
		require.Equal(t, step.wantToken, token, step.name)
	}

	t.Run("wraps the database's error", func(t *testing.T) {
		_, err := ExecFenced(ctx, pool, "UPDATE products SET in_stock = 1", "no_such_column", 7)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, "42703", pgErr.Code)
		require.True(t, strings.HasPrefix(err.Error(), "pglock: fenced write: "), err.Error())
	})
	t.Run("returns the context's error", func(t *testing.T) {
		canceled, cancel := context.WithCancel(ctx)
		cancel()
		_, err := ExecFenced(canceled, pool, update, "stock_fencing_token", 9, 1, 1)
		require.True(t, errors.Is(err, context.Canceled), err)
	})
}

// TestFenceNullableColumn: a NULL in a nullable fence column is a row no fenced write
// has touched. Any token writes it and leaves itself there, after which the column
// fences as a NOT NULL one does, the claim of a read-modify-write included.
func TestFenceNullableColumn(t *testing.T) {
	t.Parallel()
	pool := fenceTestDB(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `
		CREATE TABLE counters (id bigint PRIMARY KEY, value int NOT NULL, fence bigint);
		INSERT INTO counters (id, value) VALUES (1, 0), (2, 0)`)
	require.NoError(t, err)
	const write = "UPDATE counters SET value = $1 WHERE id = $2"
	row := func(t *testing.T, id int) (value int, fence *int64) {
		t.Helper()
		require.NoError(t, pool.QueryRow(ctx, "SELECT value, fence FROM counters WHERE id = $1", id).Scan(&value, &fence))
		return value, fence
	}
	for _, step := range []struct {
		name        string
		token       int64
		value       int
		wantWritten int64
		wantValue   int
		wantFence   int64
	}{
		{"writes a NULL row and leaves its token", 5, 50, 1, 50, 5},
		{"then refuses a stale token", 3, 30, 0, 50, 5},
		{"writes again with the same token", 5, 55, 1, 55, 5},
		{"writes with a newer token", 7, 70, 1, 70, 7},
	} {
		n, err := ExecFenced(ctx, pool, write, "fence", step.token, step.value, 1)
		require.NoError(t, err, step.name)
		require.Equal(t, step.wantWritten, n, step.name)
		value, fence := row(t, 1)
		require.Equal(t, step.wantValue, value, step.name)
		require.NotNil(t, fence, step.name)
		require.Equal(t, step.wantFence, *fence, step.name)
	}
	_, fence := row(t, 2)
	require.Nil(t, fence, "a row the WHERE left out keeps its NULL")

	t.Run("a claim at read time refuses the paused holder", func(t *testing.T) {
		// A read-modify-write as README's Fencing section has it: the paused holder
		// (token 8) and its successor (9) read row 2, still NULL; the successor
		// claims it; the paused holder's write, from its stale read, is refused.
		claim := "UPDATE counters SET value = value WHERE id = $1 RETURNING value"
		read := func(token int64) int {
			t.Helper()
			q, args, err := FenceUpdate(claim, "fence", token, 2)
			require.NoError(t, err)
			var value int
			require.NoError(t, pool.QueryRow(ctx, q, args...).Scan(&value))
			return value
		}
		paused := read(8)
		successor := read(9)
		n, err := ExecFenced(ctx, pool, write, "fence", 8, paused+1, 2)
		require.NoError(t, err)
		require.Zero(t, n, "the paused holder's write is refused")
		n, err = ExecFenced(ctx, pool, write, "fence", 9, successor+1, 2)
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		value, fence := row(t, 2)
		require.Equal(t, 1, value)
		require.Equal(t, int64(9), *fence)
	})
}

// TestFenceKeepsTheStatementsMeaning runs generated statements, full of the lexer's
// traps, as they are and fenced: with every row's fence older than the token or NULL
// (or the lock held) the fenced statement writes exactly the rows the original writes,
// and with every row's fence newer (or the lock taken over) it writes none. A fence
// put in the wrong place, a subquery's WHERE for one, fails it.
func TestFenceKeepsTheStatementsMeaning(t *testing.T) {
	t.Parallel()
	pool := fenceTestDB(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `
		INSERT INTO products (id, in_stock, name, note, flag) VALUES
			(1, 0, 'where', NULL, true), (2, 5, 'x', 'x', false), (3, 1, NULL, 'returning', NULL), (4, 0, 'y', NULL, true);
		INSERT INTO suppliers (id, product_id, stock, "from") VALUES (1, 1, 3, 'a'), (2, 2, 0, 'b'), (3, 2, 1, NULL)`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "ALTER TABLE products ALTER COLUMN stock_fencing_token DROP NOT NULL")
	require.NoError(t, err)
	var token int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT pglock.lock_acquire('k', 'a', 600000)").Scan(&token))

	// written runs query in a transaction it rolls back, after setting every row's
	// fence column to fence (nil: NULL), and returns how many rows it wrote. The four
	// statements go in one batch: one round trip.
	written := func(query string, fence any, args ...any) int64 {
		t.Helper()
		b := &pgx.Batch{}
		b.Queue("BEGIN")
		b.Queue("UPDATE products SET stock_fencing_token = $1", fence)
		b.Queue(query, args...)
		b.Queue("ROLLBACK")
		results := pool.SendBatch(ctx, b)
		defer func() { require.NoError(t, results.Close()) }()
		_, err := results.Exec()
		require.NoError(t, err)
		_, err = results.Exec()
		require.NoError(t, err)
		tag, err := results.Exec()
		require.NoError(t, err, query)
		_, err = results.Exec()
		require.NoError(t, err)
		return tag.RowsAffected()
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	pick := func(options ...string) string { return options[rnd.IntN(len(options))] }
	gap := func() string {
		return pick(" ", "\n", "\t", " /* where; */ ", " -- returning;\n", " /* /* from */ */\n")
	}
	for i := range 300 {
		ref, target := "products", pick("products", "ONLY products", "public.products")
		if rnd.IntN(2) == 0 {
			ref = "p"
			target += pick(" p", " AS p", ` AS "p"`)
		}
		expand := func(s string) string { return strings.ReplaceAll(s, "{t}", ref) }
		var q strings.Builder
		if rnd.IntN(4) == 0 {
			q.WriteString("WITH w AS (SELECT 1 AS one WHERE true FOR UPDATE)" + gap())
		}
		update := rnd.IntN(3) > 0
		if update {
			q.WriteString("UPDATE" + gap() + target + gap() + "SET" + gap())
			// One assignment from each of one to three groups: each group writes its
			// own columns.
			groups := [][]string{
				{"in_stock = in_stock + 1", "in_stock = (SELECT count(*) FROM suppliers s WHERE s.product_id = {t}.id)", "in_stock = 1.5e1::int"},
				{"name = 'it''s where; returning'", `name = E'a\'b where'`, "name = E'a'\n  'b\\' from'"},
				{"note = $$ where $$", "note = $q$ returning $$ $q$", "note = CASE WHEN flag THEN 'then' ELSE 'where' END", `note = U&'d\0061t'`, "note = 'a'/* where */||'b'"},
				{"flag = name IS DISTINCT FROM 'x'", "flag = note IS NOT DISTINCT FROM NULL", "(flag) = ROW(NULL)"},
			}
			for j, g := range rnd.Perm(len(groups))[:1+rnd.IntN(3)] {
				if j > 0 {
					q.WriteString("," + gap())
				}
				q.WriteString(expand(pick(groups[g]...)))
			}
		} else {
			q.WriteString("DELETE FROM" + gap() + target)
		}
		join := rnd.IntN(3) == 0
		if join {
			q.WriteString(gap() + map[bool]string{true: "FROM", false: "USING"}[update] + gap() + "suppliers s")
		}
		var conds []string
		if join {
			conds = append(conds, expand("s.product_id = {t}.id"))
		}
		if rnd.IntN(4) > 0 {
			conds = append(conds, expand(pick(
				"{t}.id <> 3",
				"{t}.id = 2 OR name = 'where'",
				"note IS DISTINCT FROM 'x'",
				"{t}.id IN (SELECT product_id FROM suppliers WHERE stock > 0)",
				"true",
				"name = $$where$$ -- returning\n",
				"flag",
			)))
		}
		if len(conds) > 0 {
			q.WriteString(gap() + "WHERE" + gap() + strings.Join(conds, " AND "))
		}
		if rnd.IntN(3) == 0 {
			q.WriteString(gap() + expand(pick("RETURNING {t}.id", "RETURNING *", "RETURNING 'where' AS w")))
		}
		q.WriteString(pick("", ";", "; -- done", " ;\n"))
		query := q.String()

		original := written(query, 0)
		if update {
			fenced, args, err := FenceUpdate(query, "stock_fencing_token", 7)
			require.NoError(t, err, "%d: %s", i, query)
			require.Equal(t, original, written(fenced, 7, args...), "%d: %s\nfenced: %s", i, query, fenced)
			require.Equal(t, original, written(fenced, nil, args...), "%d: %s\nfenced: %s", i, query, fenced)
			require.Zero(t, written(fenced, 8, args...), "%d: %s\nfenced: %s", i, query, fenced)
		}
		fenced, args, err := FenceHeld(query, "k", token)
		require.NoError(t, err, "%d: %s", i, query)
		require.Equal(t, original, written(fenced, 0, args...), "%d: %s\nfenced: %s", i, query, fenced)
		_, stale, err := FenceHeld(query, "k", token+1)
		require.NoError(t, err)
		require.Zero(t, written(fenced, 0, stale...), "%d: %s\nfenced: %s", i, query, fenced)
	}
}
