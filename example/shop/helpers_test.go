package shop_test

import (
	"bytes"
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/example/shop"
	"github.com/pgfence/pglock/pglocktest"
)

// neverCron is February 29th at 3 AM: the real schedules must not fire during a test,
// which runs the ticks itself.
const neverCron = "0 3 29 2 *"

// The orders the first export books: every placed order, oldest first.
var firstNight = []string{"ord_1001", "ord_1002", "ord_1004"}

// world is what the instances of a test share: one database, the accounting system,
// the warehouse, and the log.
type world struct {
	url        string
	db         *pgxpool.Pool // the test's own reads and writes
	accounting *shop.FakeAccounting
	warehouse  *shop.FakeWarehouse
	logs       *logs
	batchSize  int // Config.InvoiceBatchSize of the instances started from now on
}

func newWorld(t *testing.T) *world {
	t.Helper()
	url := pglocktest.PostgresURL(t)
	require.NoError(t, shop.Migrate(t.Context(), url))
	db := pglocktest.Pool(t, url, 4)
	require.NoError(t, shop.Seed(t.Context(), db))
	l := &logs{}
	logger := l.logger("external")
	return &world{url: url, db: db, accounting: shop.NewFakeAccounting(logger), warehouse: shop.NewFakeWarehouse(logger), logs: l}
}

// instance is one instance of the shop: its own pool, pglock client and Shop.
type instance struct {
	name  string
	pool  *pgxpool.Pool
	locks *pglock.Client
	shop  *shop.Shop
}

// start starts an instance named name (its client's instance name, and the log's
// instance attribute) with the client options opts. The test's cleanup stops it as
// cmd/shop does: the scheduler, then the client, then the pool.
func (w *world) start(t *testing.T, name string, opts ...pglock.ClientOption) *instance {
	t.Helper()
	pool := pglocktest.Pool(t, w.url, 5)
	logger := w.logs.logger(name)
	locks, err := pglock.New(pool, append([]pglock.ClientOption{pglock.WithInstanceName(name), pglock.WithLogger(logger)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, locks.Close(context.Background())) })
	s, err := shop.New(shop.Config{Pool: pool, Locks: locks, Accounting: w.accounting, Warehouse: w.warehouse,
		AdminToken: "s3cret", InvoiceExportCron: neverCron, StockReconciliationCron: neverCron, Logger: logger,
		InvoiceBatchSize: w.batchSize})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Shutdown(context.Background())) })
	return &instance{name: name, pool: pool, locks: locks, shop: s}
}

// kibble is the salmon kibble in stock, as the products table says.
func (w *world) kibble(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, w.db.QueryRow(t.Context(), "SELECT in_stock FROM products WHERE id = 'salmon-kibble-2kg'").Scan(&n))
	return n
}

// logs is the instances' log, in slog's text format, safe for concurrent use.
type logs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *logs) logger(instance string) *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug})).With(slog.String("instance", instance))
}

// count returns how many lines have the message msg and every one of attrs
// ("key=value", as slog's text handler writes them).
func (l *logs) count(msg string, attrs ...string) int {
	text := l.String()
	n := 0
	for line := range strings.Lines(text) {
		fields := strings.Fields(line)
		if !strings.Contains(line, `msg="`+msg+`"`) {
			continue
		}
		all := true
		for _, a := range attrs {
			all = all && slices.Contains(fields, a)
		}
		if all {
			n++
		}
	}
	return n
}

// tick fires one tick of each job at once, as the instances' schedulers do at the same
// second, and returns their errors once all have returned.
func tick(t *testing.T, jobs ...*pglock.Job) []error {
	t.Helper()
	return all(t, len(jobs), func(i int) error { return jobs[i].Run(t.Context()) })
}

// all runs f(0) to f(n-1) at once and returns their errors, failing the test if one
// has not returned within 20 s.
func all(t *testing.T, n int, f func(i int) error) []error {
	t.Helper()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = f(i) })
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("a call did not return within 20s")
	}
	return errs
}

// requireNoErrors fails the test on the first non-nil error of errs.
func requireNoErrors(t *testing.T, errs []error) {
	t.Helper()
	for _, err := range errs {
		require.NoError(t, err)
	}
}

// wait returns once ch is closed, failing the test after 10 s.
func wait(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not within 10s", what)
	}
}
