package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/example/shop"
	"github.com/pgfence/pglock/pglockdev"
)

// adminToken is the demo instances' admin token.
const adminToken = "s3cret"

// shopPackage is what tryit builds once and runs three times.
const shopPackage = "github.com/pgfence/pglock/example/shop/cmd/shop"

// demo is one run of the story: the database, the shop binary, the instances and
// the steps seen so far.
type demo struct {
	o       options
	out     *output
	dbURL   string
	db      *pgxpool.Pool  // the shop's tables
	locks   *pglock.Client // tryit's own reads of the locks (Client.Locks); it takes none
	bin     string
	closers []func() // what newDemo took, released in reverse order

	instances []*instance // every instance started, running or not
	steps     []step
}

// step is a row of the summary.
type step struct {
	name, expected, seen string
	ok                   bool
}

// newDemo finds the server, prepares the demo's database and builds the shop.
func newDemo(ctx context.Context, o options, w io.Writer) (_ *demo, err error) {
	d := &demo{o: o, out: newOutput(w)}
	defer func() {
		if err != nil {
			d.close()
		}
	}()
	srv := &pglockdev.Server{URL: o.serverURL, How: "the server in DATABASE_URL"}
	if o.serverURL == "" {
		if srv, err = pglockdev.Find(ctx, "DATABASE_URL"); err != nil {
			return nil, err
		}
		d.closers = append(d.closers, func() { _ = srv.Stop() })
	}
	d.out.say("PostgreSQL: %s.\nThe demo works in its database there, %s; the instances get its URL in DATABASE_URL.",
		srv.How, o.database)
	if d.dbURL, err = srv.Database(ctx, o.database); err != nil {
		return nil, err
	}
	if err := pglock.Migrate(ctx, d.dbURL); err != nil {
		return nil, err
	}
	if err := shop.Migrate(ctx, d.dbURL); err != nil {
		return nil, err
	}
	if d.db, err = pgxpool.New(ctx, d.dbURL); err != nil {
		return nil, err
	}
	d.closers = append(d.closers, d.db.Close)
	if d.locks, err = pglock.New(d.db, pglock.WithoutListener(), pglock.WithLogger(slog.New(slog.DiscardHandler))); err != nil {
		return nil, err
	}
	d.closers = append(d.closers, func() { _ = d.locks.Close(context.Background()) })
	if err := d.waitForAnEarlierRun(ctx); err != nil {
		return nil, err
	}
	if err := shop.Reset(ctx, d.db); err != nil {
		return nil, err
	}
	d.out.say("Reset the orders (ord_1001 to ord_1004, three placed) and the products (salmon kibble: 12).")

	dir, err := os.MkdirTemp("", "pglock-tryit-")
	if err != nil {
		return nil, err
	}
	d.closers = append(d.closers, func() { _ = os.RemoveAll(dir) })
	d.bin = filepath.Join(dir, "shop")
	d.out.say("Building %s ...", shopPackage)
	args := append(append([]string{"build"}, o.buildFlags...), "-o", d.bin, shopPackage)
	if b, err := exec.CommandContext(ctx, "go", args...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, b)
	}
	return d, nil
}

// waitForAnEarlierRun waits for the locks of an earlier run's instances to expire (a
// run that was killed), and fails if they are still renewed (its instances still run).
func (d *demo) waitForAnEarlierRun(ctx context.Context) error {
	// held counts the held locks and the longest time one has left.
	held := func() (n int, left time.Duration, err error) {
		locks, err := d.locks.Locks(ctx, "")
		for _, l := range locks {
			if l.Held {
				n, left = n+1, max(left, l.ExpiresIn)
			}
		}
		return n, left, err
	}
	n, left, err := held()
	if err != nil || n == 0 {
		return err
	}
	wait := left + 2*time.Second
	d.out.say("%d locks of an earlier run are still held; waiting up to %v for them to expire...", n, wait.Round(time.Second))
	_, ok, err := d.waitUntil(ctx, wait, func() (bool, error) {
		n, _, err = held()
		return n == 0, err
	})
	if err == nil && !ok {
		err = fmt.Errorf("%d locks in %s are still renewed: stop the shop instances that hold them first", n, d.o.database)
	}
	return err
}

// close stops every instance still running and releases what newDemo took.
func (d *demo) close() {
	for _, i := range d.instances {
		i.stop(10 * time.Second)
	}
	httpClient.CloseIdleConnections()
	for j := len(d.closers) - 1; j >= 0; j-- {
		d.closers[j]()
	}
}

// start starts instance n (0 to 2) and waits until it answers.
func (d *demo) start(ctx context.Context, n int) (*instance, error) {
	port := d.o.basePort + n
	env := []string{
		"PORT=" + strconv.Itoa(port),
		"DATABASE_URL=" + d.dbURL,
		"ADMIN_TOKEN=" + adminToken,
		fmt.Sprintf("STOCK_RECONCILIATION_CRON=*/%d * * * * *", int(d.o.every/time.Second)),
		"LOCK_TTL=" + d.o.ttl.String(),
		"LOG_LEVEL=debug",
		// Two orders a batch, each upload 2.5 s: two exports at once share the three
		// orders, and both run longer than the third waits for a permit (ExportWait).
		"INVOICE_BATCH_SIZE=2",
		"ACCOUNTING_DELAY=2500ms",
	}
	i, err := start(d.bin, port, env, d.out)
	if err != nil {
		return nil, err
	}
	d.instances = append(d.instances, i)
	d.out.say("   started port %d: pid %d", port, i.cmd.Process.Pid)
	return i, i.ready(ctx, time.Minute)
}

// holders returns the port of the live holder of every held key, from Client.Locks.
func (d *demo) holders(ctx context.Context) (map[string]int, error) {
	locks, err := d.locks.Locks(ctx, "")
	if err != nil {
		return nil, err
	}
	h := map[string]int{}
	for _, l := range locks {
		if l.Held {
			h[l.Key] = ownerPort(l.Owner)
		}
	}
	return h, nil
}

// ownerPort reads the port in an owner id ("host:3001/random"; cmd/shop's instance
// name is host:port), or 0.
func ownerPort(owner string) int {
	instance, _, _ := strings.Cut(owner, "/")
	port, _ := strconv.Atoi(instance[strings.LastIndexByte(instance, ':')+1:])
	return port
}

// waitUntil polls cond every 50 ms until it is true, d passes, or ctx ends, and returns
// how long it waited and whether cond came true.
func (d *demo) waitUntil(ctx context.Context, timeout time.Duration, cond func() (bool, error)) (time.Duration, bool, error) {
	start := time.Now()
	for {
		ok, err := cond()
		if err != nil || ok {
			return time.Since(start), ok, err
		}
		if time.Since(start) > timeout {
			return time.Since(start), false, nil
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return time.Since(start), false, err
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// record adds a step to the summary and prints it.
func (d *demo) record(name, expected, seen string, ok bool) {
	d.steps = append(d.steps, step{name, expected, seen, ok})
	if ok {
		d.out.say("   ✔ %s: %s", name, seen)
	} else {
		d.out.say("   ✘ %s: %s (expected %s)", name, seen, expected)
	}
}

// summary prints the table of steps and reports whether every one behaved.
func (d *demo) summary() bool {
	rows := [][]string{{"STEP", "EXPECTED", "SEEN", "OK"}}
	all := true
	for _, s := range d.steps {
		mark := "ok"
		if !s.ok {
			mark, all = "FAILED", false
		}
		rows = append(rows, []string{s.name, s.expected, s.seen, mark})
	}
	d.out.say("\nSummary (ttl %v, reconciliation every %v):", d.o.ttl, d.o.every)
	d.out.raw(table("", rows))
	if all {
		d.out.say("Every step behaved.")
	} else {
		d.out.say("Some steps did not behave: see above.")
	}
	return all
}

// keepRunning sets the stage for the tutorial's steps by hand and keeps it until ctx
// ends (Ctrl+C): the orders reset, so that an export has three to export, and three
// instances again, the first started alone until it leads the feed and owns the
// reconciliation, so that one instance runs both.
func (d *demo) keepRunning(ctx context.Context) error {
	d.out.say("\n== Three instances again, for the tutorial's steps by hand, until Ctrl+C")
	for _, i := range d.instances {
		i.stop(10 * time.Second)
	}
	if err := shop.Reset(ctx, d.db); err != nil {
		return err
	}
	d.out.say("Reset the orders and the products: an export has three orders to export again.")
	first, err := d.start(ctx, 0)
	if err != nil {
		return err
	}
	var h map[string]int
	_, _, err = d.waitUntil(ctx, d.o.ttl+d.o.every+5*time.Second, func() (bool, error) {
		var err error
		h, err = d.holders(ctx)
		return h[shop.WarehouseFeedKey] == first.port && h[leaseKey] == first.port, err
	})
	if err != nil {
		return err
	}
	running := []*instance{first}
	for n := 1; n < 3; n++ {
		i, err := d.start(ctx, n)
		if err != nil {
			return err
		}
		running = append(running, i)
	}
	if h, err = d.holders(ctx); err != nil {
		return err
	}
	var rows [][]string
	owner := first // of the feed, the one to kill first
	for _, i := range running {
		var holds []string
		if h[shop.WarehouseFeedKey] == i.port {
			holds, owner = append(holds, "leads the warehouse feed"), i
		}
		if h[leaseKey] == i.port {
			holds = append(holds, "owns the stock reconciliation")
		}
		rows = append(rows, []string{fmt.Sprintf("port %d", i.port), fmt.Sprintf("pid %d", i.cmd.Process.Pid),
			strings.Join(holds, ", ")})
	}
	d.out.raw(table("  ", rows))
	p, curl := d.o.basePort, fmt.Sprintf("curl -s -H 'X-Admin-Token: %s'", adminToken)
	d.out.raw(fmt.Sprintf(`The console (user any, password %[9]s): http://localhost:%[2]d/admin/console/
Try the tutorial's steps:
  %[1]s localhost:%[2]d/admin/locks
  %[1]s -X POST localhost:%[3]d/admin/invoice-exports &
  %[1]s -X POST localhost:%[4]d/admin/invoice-exports &
  %[1]s -X POST localhost:%[10]d/admin/invoice-exports  # 2 run, 1: 409
  kill -9 %[5]d    # port %[6]d: what it holds moves after up to %[7]v, the ttl
  kill <pid>      # SIGTERM the new owner (/admin/locks): it hands both over at once
  psql '%[8]s' \
    -c 'SELECT key, owner, fencing_token, expires_at - now() AS expires_in FROM pglock.locks'
Ctrl+C stops them.
`, curl, p+1, p+1, p+2, owner.cmd.Process.Pid, owner.port, d.o.ttl, d.psqlConninfo(), adminToken, p))
	<-ctx.Done()
	d.out.say("Stopping the instances...")
	return nil
}

// psqlConninfo returns the demo's database in libpq's key=value form, which is shorter
// than its URL when the host is a socket directory.
func (d *demo) psqlConninfo() string {
	cfg, err := pgconn.ParseConfig(d.dbURL)
	if err != nil {
		return d.dbURL
	}
	s := fmt.Sprintf("host=%s port=%d user=%s dbname=%s", cfg.Host, cfg.Port, cfg.User, cfg.Database)
	if cfg.Password != "" {
		s += " password=" + cfg.Password
	}
	return s
}
