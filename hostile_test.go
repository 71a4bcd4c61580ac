package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/pglocktest"
)

// TestHostileCallersBreakNoPromise: as the application role README's grants make, two
// hostile callers call every function that role may execute, with arguments drawn at
// random from values a generator of trouble would pick (keys with U+001F anywhere, the
// row keys of permits, empty and huge strings, owners past the bound and other holders'
// owners, ttls and permits out of range, arrays of mismatched lengths with nulls, other
// waiters' tickets, JSON of every shape), while ordinary Go clients of the same role lock
// keys, take permits of a semaphore of 2 and wait in fair queues. After each round it
// checks what the library promises:
//
//   - the semaphore never has more than its 2 live permits;
//   - a key's (a permit's) token never goes back, and grows with each new holder, across
//     releases, expiries, force-releases and prunes;
//   - every held key can be released by its holder and by force-release (each tried in a
//     transaction rolled back, so the round's state stays);
//   - a fair queue that no hostile call names is served in the order it was joined;
//   - a hostile call fails, if it does, only because its input is refused (22023), or
//     because it called an internal helper (42501): never a deadlock, a payload too long,
//     a value out of a type's range, an error of the server's own.
//
// The seed is logged; PGLOCK_HOSTILE_SEED replays one.
func TestHostileCallersBreakNoPromise(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("PGLOCK_HOSTILE_SEED"); s != "" {
		var err error
		seed, err = strconv.ParseUint(s, 10, 64)
		require.NoError(t, err)
	}
	t.Logf("seed %d (PGLOCK_HOSTILE_SEED replays it)", seed)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	dbURL := pglocktest.PostgresURL(t)
	admin := pglocktest.Pool(t, dbURL, 4)
	appURL := newRole(t, dbURL, appGrants...)
	app := pglocktest.Pool(t, appURL, 12)
	fns := grantedFunctions(t, admin, appURL)

	clients := []*pglock.Client{
		newPoolClient(t, app, pglock.WithInstanceName("go-1"), pglock.TTL(3*time.Second)),
		newPoolClient(t, app, pglock.WithInstanceName("go-2"), pglock.TTL(3*time.Second)),
	}
	work, stopWork := context.WithCancel(ctx)
	var workers sync.WaitGroup
	var errs errorList
	for i, c := range clients {
		workers.Go(func() { ordinaryWork(work, c, rand.New(rand.NewPCG(seed, uint64(i+1))), &errs) })
	}
	defer func() {
		stopWork()
		workers.Wait()
	}()

	tokens := map[string]int64{} // the greatest token seen per row key
	owners := map[string]string{}
	const rounds, callsPerRound = 12, 250
	for round := range rounds {
		state := lockRows(t, admin)
		h := hostility{rng: rand.New(rand.NewPCG(seed, uint64(100+round))), owners: state.owners()}
		var wg sync.WaitGroup
		failures := make(chan string, 2*callsPerRound)
		for g := range 2 {
			rng := rand.New(rand.NewPCG(seed, uint64(1000*round+g)))
			wg.Go(func() {
				conn, err := app.Acquire(ctx)
				if err != nil {
					failures <- err.Error()
					return
				}
				defer conn.Release()
				gh := h
				gh.rng = rng
				for range callsPerRound {
					f := fns[rng.IntN(len(fns))]
					q := gh.call(f)
					if _, err := conn.Exec(ctx, q); err != nil {
						if code := pgErrCode(err); code != "22023" && code != "42501" {
							failures <- fmt.Sprintf("%s: %v", truncate(q, 300), err)
						}
					}
				}
			})
		}
		fairOrder(t, ctx, admin, clients, round)
		wg.Wait()
		close(failures)
		for f := range failures {
			t.Errorf("round %d: a hostile call failed for a reason of its own: %s", round, f)
		}

		// The promises, on the state the round left.
		state = lockRows(t, admin)
		live := 0
		for _, r := range state {
			if strings.HasPrefix(r.key, "s\x1f") && r.live {
				live++
			}
			if prev, ok := tokens[r.key]; ok {
				require.GreaterOrEqual(t, r.token, prev, "round %d: the token of %q went back", round, r.key)
				if r.owner != "" && r.owner != owners[r.key] {
					require.Greater(t, r.token, prev, "round %d: %q has a new holder with an old token", round, r.key)
				}
			}
			tokens[r.key] = max(tokens[r.key], r.token)
			owners[r.key] = r.owner
			require.LessOrEqual(t, len([]rune(r.owner)), 255, "round %d: an owner past the bound holds %q", round, r.key)
		}
		require.LessOrEqual(t, live, 2, "round %d: the semaphore of 2 has %d live permits", round, live)
		for _, r := range state {
			if r.live && r.left > 500*time.Millisecond {
				requireReleasable(t, ctx, app, r, round)
			}
		}
	}
	stopWork()
	workers.Wait()
	require.NoError(t, errs.join(), "the ordinary clients")
}

// lockRow is a row of pglock.locks as the checks read it.
type lockRow struct {
	key, owner string // owner "" when released
	token      int64
	live       bool
	left       time.Duration // to its expiry, when live
}

type lockRowList []lockRow

func (l lockRowList) owners() []string {
	var o []string
	for _, r := range l {
		if r.owner != "" {
			o = append(o, r.owner)
		}
	}
	return o
}

func lockRows(t *testing.T, admin *pgxpool.Pool) lockRowList {
	t.Helper()
	rows, err := admin.Query(t.Context(), `SELECT key, coalesce(owner, ''), fencing_token,
		owner IS NOT NULL AND expires_at > clock_timestamp(),
		greatest(extract(epoch FROM expires_at - clock_timestamp()) * 1e6, 0)::bigint FROM pglock.locks`)
	require.NoError(t, err)
	var out lockRowList
	for rows.Next() {
		var r lockRow
		var us int64
		require.NoError(t, rows.Scan(&r.key, &r.owner, &r.token, &r.live, &us))
		r.left = time.Duration(us) * time.Microsecond
		out = append(out, r)
	}
	require.NoError(t, rows.Err())
	return out
}

// requireReleasable releases r by its holder and force-releases it, each in a
// transaction rolled back, as the application role: both must work.
func requireReleasable(t *testing.T, ctx context.Context, app *pgxpool.Pool, r lockRow, round int) {
	t.Helper()
	for _, q := range []string{
		"SELECT pglock.lock_release($1, $2)",
		"SELECT owner = $2 FROM pglock.lock_force_release($1)",
	} {
		err := pgx.BeginFunc(ctx, app, func(tx pgx.Tx) error {
			var ok *bool
			if err := tx.QueryRow(ctx, q, r.key, r.owner).Scan(&ok); err != nil {
				return err
			}
			if ok == nil || !*ok {
				// The ordinary clients go on meanwhile: fine if the holder let go first.
				var held bool
				if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pglock.lock_list($1) l WHERE l.key = $1 AND l.owner = $2 AND l.held)",
					r.key, r.owner).Scan(&held); err != nil {
					return err
				}
				if held {
					return fmt.Errorf("%s: not done", q)
				}
			}
			return errRollBack
		})
		if !errors.Is(err, errRollBack) {
			t.Fatalf("round %d: %q held by %.40q: %v", round, r.key, r.owner, err)
		}
	}
}

var errRollBack = errors.New("roll back")

// grantedFunction is a function the role may call, with its arguments' names and types.
type grantedFunction struct {
	name string
	args []string // "name type"
}

// grantedFunctions lists the pglock functions the role of roleURL may execute (but
// trigger functions).
func grantedFunctions(t *testing.T, admin *pgxpool.Pool, roleURL string) []grantedFunction {
	t.Helper()
	cfg, err := pgx.ParseConfig(roleURL)
	require.NoError(t, err)
	rows, err := admin.Query(t.Context(), `SELECT p.proname, pg_get_function_identity_arguments(p.oid)
		FROM pg_proc p WHERE p.pronamespace = 'pglock'::regnamespace AND p.prorettype <> 'trigger'::regtype
		  AND has_function_privilege($1, p.oid, 'EXECUTE') ORDER BY 1`, cfg.User)
	require.NoError(t, err)
	var fns []grantedFunction
	for rows.Next() {
		var f grantedFunction
		var args string
		require.NoError(t, rows.Scan(&f.name, &args))
		for _, a := range strings.Split(args, ", ") {
			if a != "" && !strings.HasPrefix(a, "OUT ") {
				f.args = append(f.args, a)
			}
		}
		fns = append(fns, f)
	}
	require.NoError(t, rows.Err())
	require.Greater(t, len(fns), 20, "the functions the role may call")
	return fns
}

// hostility draws a call's arguments.
type hostility struct {
	rng    *rand.Rand
	owners []string // live holders' owners, other callers' capabilities
}

// fairOrderKey is the queue the order check uses: no hostile call names it.
const fairOrderKey = "fair-order"

func (h hostility) pick(vs ...string) string { return vs[h.rng.IntN(len(vs))] }

func (h hostility) key() string {
	switch h.rng.IntN(4) {
	case 0: // the keys of the ordinary clients and of the semaphore
		return h.pick("k0", "k1", "k2", "k3", "s", "job", "el")
	case 1: // its permits' row keys and its queue's key
		return "s\x1f" + h.pick("1", "2", "3", "4", "", "01", "0", "1001", "x", "1\x1f2")
	}
	return h.pick("", "\x1f", "\x1fk0", "k0\x1f", "k\x1f0", strings.Repeat("k", 500), strings.Repeat("k", 501),
		strings.Repeat("é", 496)+"\x1f1", strings.Repeat("s", 495)+"\x1f1000", "job:owner", "é", "'; --")
}

func (h hostility) owner() string {
	if len(h.owners) > 0 && h.rng.IntN(3) == 0 {
		return h.owners[h.rng.IntN(len(h.owners))]
	}
	return h.pick("o", "hostile/1", "", strings.Repeat("o", 255), strings.Repeat("𝄞", 255), strings.Repeat("o", 256),
		strings.Repeat("x", 9000), strings.Repeat("x", 9000), "go-1/x", "\x1f")
}

func (h hostility) text(name string) string {
	switch {
	case strings.Contains(name, "key"), name == "prefix", name == "sem", name == "job":
		return h.key()
	case strings.Contains(name, "owner"), name == "instance":
		return h.owner()
	case name == "kind":
		return h.pick("job", "election", "", "lock")
	case name == "outcome":
		return h.pick("ok", "error", "panicked", "lost", "", "won", "skipped", "missed")
	}
	return h.pick("", "x", strings.Repeat("y", 2000), "\x1f", "ok")
}

func (h hostility) number(name string) string {
	switch {
	case name == "slot_ms" || name == "next_ms": // slots of the epoch, of now, of the year 9999 and past it
		now := time.Now().UnixMilli()
		return h.pick("0", "1000", "-1", strconv.FormatInt(now-now%1000, 10), strconv.FormatInt(now-now%1000+1000, 10),
			strconv.FormatInt(now-60000, 10), "253402300799999", "253402300800000", "9223372036854775807")
	case name == "attempts":
		return h.pick("1", "2", "3", "100", "0", "101", "-1")
	case strings.HasSuffix(name, "_ms"):
		return h.pick("1", "1000", "60000", "3000", "0", "-1", "31536000000", "31536000001", "9223372036855", "9223372036854775807")
	case name == "ticket":
		return strconv.Itoa(h.rng.IntN(400) + 1) // other waiters' tickets, fresh database
	case name == "permits":
		return h.pick("2", "0", "0", "-1", "1001", "2147483647")
	case strings.HasSuffix(name, "_us"):
		return h.pick("0", "1", "-1", "3155760000000000", "3155760000000001", "9223372036854775807")
	}
	return h.pick("0", "1", "2", "-1", "1000", "9223372036854775807", "-9223372036854775808")
}

func (h hostility) literal(name, typ string) string {
	if h.rng.IntN(20) == 0 {
		return "NULL::" + typ
	}
	switch typ {
	case "text":
		return quote(h.text(name)) + "::text"
	case "bigint":
		return quote(h.number(name)) + "::bigint"
	case "integer":
		n := h.number(name)
		if v, err := strconv.ParseInt(n, 10, 64); err != nil || v != int64(int32(v)) {
			n = h.pick("2147483647", "-2147483648")
		}
		return quote(n) + "::integer"
	case "boolean":
		return h.pick("true", "false")
	case "text[]":
		var elems []string
		for range h.rng.IntN(4) {
			if h.rng.IntN(8) == 0 {
				elems = append(elems, "NULL")
			} else {
				elems = append(elems, quote(h.text(strings.TrimSuffix(name, "s"))))
			}
		}
		return "ARRAY[" + strings.Join(elems, ", ") + "]::text[]"
	case "json":
		return quote(h.pick(`[]`, `{}`, `1`, `null`, `[1]`, `[{}]`,
			`[{"job": "j", "reason": "other-instance", "count": 1, "ago_us": 0}]`,
			`[{"job": "j", "reason": "other-instance", "count": 1, "ago_us": 0}, {"job": "j", "reason": "other-instance", "count": 2, "ago_us": 0}]`,
			`[{"job": "j", "reason": "other-instance", "count": 9223372036854775807, "ago_us": 0}]`,
			`[{"job": "j", "reason": "x", "count": 1.5, "ago_us": 0}]`,
			`[{"job": "", "reason": "x", "count": 1, "ago_us": 0}]`,
			`[{"job": "j\u001f1", "reason": "x", "count": 1, "ago_us": 0}]`,
			`[{"job": "j", "reason": "x", "count": 1, "ago_us": 9223372036854775807}]`)) + "::json"
	}
	panic("no literal for type " + typ)
}

// call returns a statement that calls f with hostile arguments.
func (h hostility) call(f grantedFunction) string {
	lits := make([]string, len(f.args))
	for i, a := range f.args {
		name, typ, _ := strings.Cut(a, " ")
		lits[i] = h.literal(name, typ)
	}
	return "SELECT * FROM pglock." + f.name + "(" + strings.Join(lits, ", ") + ")"
}

// quote writes s as a SQL string literal.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// ordinaryWork is an ordinary client's use until ctx ends: locks, permits of the
// semaphore of 2, fair waits. Losing a lock or a permit to a hostile caller who
// released it is allowed; any other error is recorded.
func ordinaryWork(ctx context.Context, c *pglock.Client, rng *rand.Rand, errs *errorList) {
	sem, err := c.Semaphore("s", 2)
	if err != nil {
		errs.add(err)
		return
	}
	for ctx.Err() == nil {
		var l *pglock.Lock
		var err error
		switch rng.IntN(3) {
		case 0:
			l, err = c.TryAcquire(ctx, fmt.Sprintf("k%d", rng.IntN(4)))
		case 1:
			l, err = sem.TryAcquire(ctx)
		case 2:
			wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			l, err = c.Acquire(wctx, "k2", pglock.Fair())
			cancel()
		}
		if err != nil {
			if !errors.Is(err, pglock.ErrNotAcquired) && ctx.Err() == nil {
				errs.add(err)
			}
			continue
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(rng.IntN(20)) * time.Millisecond):
		}
		if err := l.Release(context.WithoutCancel(ctx)); err != nil && !errors.Is(err, pglock.ErrLockLost) {
			errs.add(err)
		}
	}
}

// fairOrder queues three fair waiters of the ordinary clients on fairOrderKey one after
// another, behind a holder, and checks they are served in that order.
func fairOrder(t *testing.T, ctx context.Context, admin *pgxpool.Pool, clients []*pglock.Client, round int) {
	t.Helper()
	holder, err := clients[0].TryAcquire(ctx, fairOrderKey)
	require.NoError(t, err)
	stale := heartbeats(t, admin, fairOrderKey)
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() {
			l, err := clients[i%len(clients)].Acquire(ctx, fairOrderKey, pglock.Fair())
			if err != nil {
				t.Errorf("round %d: fair waiter %d: %v", round, i, err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			if err := l.Release(ctx); err != nil {
				t.Errorf("round %d: fair waiter %d's release: %v", round, i, err)
			}
		})
		awaitQueued(t, admin, fairOrderKey, i+1)
	}
	require.NoError(t, holder.Release(ctx))
	wg.Wait()
	if late := stale(); late < lateHeartbeat {
		require.Equal(t, []int{0, 1, 2}, order, "round %d: the fair queue's order", round)
	}
}

// errorList collects errors from goroutines.
type errorList struct {
	mu   sync.Mutex
	errs []error
}

func (l *errorList) add(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.errs) < 20 && !slices.ContainsFunc(l.errs, func(e error) bool { return e.Error() == err.Error() }) {
		l.errs = append(l.errs, err)
	}
}

func (l *errorList) join() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return errors.Join(l.errs...)
}
