package shop_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/example/shop"
	"github.com/pgfence/pglock/pglocktest"
)

// reconcileUnfenced is the stock reconciliation before pglock: it writes the counts
// it read, whoever else wrote since.
func reconcileUnfenced(ctx context.Context, db *pgxpool.Pool, warehouse shop.WarehouseClient) error {
	counts, err := warehouse.StockCounts(ctx)
	if err != nil {
		return err
	}
	for _, c := range counts {
		if _, err := db.Exec(ctx, "UPDATE products SET in_stock = $1 WHERE id = $2", c.Count, c.ProductID); err != nil {
			return err
		}
	}
	return nil
}

// See the problem: three instances whose schedulers fire the plain jobs on each of them.
func TestWithoutPglockEveryInstanceRunsEveryTick(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.batchSize = 1
	apps := []*instance{w.start(t, "a"), w.start(t, "b"), w.start(t, "c")}

	// Each export claims its orders (FOR UPDATE SKIP LOCKED), so no invoice is booked
	// twice; but without the exports' semaphore (InvoiceExportLimit) the accounting
	// system gets three uploads at once, one more than it takes.
	hold := w.accounting.Hold(3)
	exports := make(chan []error, 1)
	go func() {
		exports <- all(t, 3, func(i int) error { _, err := apps[i].shop.ExportInvoices(t.Context()); return err })
	}()
	wait(t, hold.Arrived(), "three uploads")
	hold.Release()
	requireNoErrors(t, <-exports)
	require.Equal(t, 3, w.accounting.MostAtOnce())
	var booked []string
	for _, b := range w.accounting.Batches() {
		booked = append(booked, b...)
	}
	require.ElementsMatch(t, firstNight, booked)

	requireNoErrors(t, all(t, 3, func(i int) error { return reconcileUnfenced(t.Context(), apps[i].pool, w.warehouse) }))
	require.Equal(t, 3, w.warehouse.Counts())
}

func TestOnOneInstanceBooksEveryInvoiceOnceAndCountsOncePerTick(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	a, b, c := w.start(t, "a"), w.start(t, "b"), w.start(t, "c")

	requireNoErrors(t, tick(t, a.shop.InvoiceExport(), b.shop.InvoiceExport(), c.shop.InvoiceExport()))
	require.Equal(t, [][]string{firstNight}, w.accounting.Batches())
	for range 2 {
		requireNoErrors(t, tick(t, a.shop.StockReconciliation(), b.shop.StockReconciliation(), c.shop.StockReconciliation()))
	}
	require.Equal(t, 2, w.warehouse.Counts())
	require.Equal(t, 2, w.logs.count("shop: reconciled stock", "written=3"))
	require.Equal(t, 1, w.logs.count("pglock: job runs on this instance", "key="+shop.StockReconciliationKey,
		"lease="+shop.StockReconciliationKey+":owner"))
	require.Equal(t, 4, w.logs.count("pglock: skipped job: it runs on another instance", "key="+shop.StockReconciliationKey))
	require.Equal(t, 2, w.logs.count("pglock: skipped job: it runs on another instance", "key="+shop.InvoiceExportKey))
}

func TestTheJobMovesToAnotherInstanceTTLAfterItsOwnerDies(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	w := newWorld(t)
	// The crashed instance's clock stands still: it never renews, as if its process died.
	stopped := pglocktest.NewManualClock(time.Now())
	// Its ttl of 3 s outlasts the survivor's two runs below (over 1 s under load in a
	// fresh-clone CI run, when it was 1 s).
	crashed := w.start(t, "crashed", pglock.WithClock(stopped), pglock.TTL(3*time.Second))
	t.Cleanup(func() { stopped.Advance(3 * time.Second) }) // before its Close: it finds its locks lost
	// The survivor has the default ttl: with a ttl of 1 s, a loaded machine could make
	// its tick skip (the store's confirmation came after 0.9 s).
	survivor := w.start(t, "survivor")

	require.NoError(t, crashed.shop.InvoiceExport().Run(ctx)) // its tick came first: it owns the job
	require.NoError(t, survivor.shop.InvoiceExport().Run(ctx))
	require.Equal(t, [][]string{firstNight}, w.accounting.Batches())
	require.Equal(t, 1, w.logs.count("pglock: job runs on this instance", "instance=crashed", "key="+shop.InvoiceExportKey))

	_, err := w.db.Exec(ctx, `INSERT INTO orders (id, user_id, total, status, placed_at) VALUES ('ord_1005', 'usr_dave', 999, 'placed', now())`)
	require.NoError(t, err)
	require.NoError(t, survivor.shop.InvoiceExport().Run(ctx)) // the lease is still the crashed instance's
	require.Len(t, w.accounting.Batches(), 1)

	require.Eventually(t, func() bool { // database time: the crashed instance's lease expires
		var live bool
		err := w.db.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pglock.locks
			WHERE key = $1 AND owner IS NOT NULL AND expires_at > clock_timestamp())`, shop.InvoiceExportKey+":owner").Scan(&live)
		return err == nil && !live
	}, 10*time.Second, 20*time.Millisecond, "the crashed instance's lease never expired")
	require.NoError(t, survivor.shop.InvoiceExport().Run(ctx))
	require.Equal(t, [][]string{firstNight, {"ord_1005"}}, w.accounting.Batches())
	require.Equal(t, 1, w.logs.count("pglock: job runs on this instance", "instance=survivor", "key="+shop.InvoiceExportKey))
}

func TestWithoutOverlappingSkipsTheTicksDuringALongCountThenRunsTheNext(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	clock := pglocktest.NewManualClock(time.Now())
	owner, other := w.start(t, "owner", pglock.WithClock(clock)), w.start(t, "other", pglock.WithClock(clock))
	t.Cleanup(func() { clock.Advance(time.Second) }) // past the last run's first second, before Close

	hold := w.warehouse.Hold(1) // month end: the count takes longer than five minutes
	first := make(chan error, 1)
	go func() { first <- owner.shop.StockReconciliation().Run(t.Context()) }()
	wait(t, hold.Arrived(), "the first count")
	for range 3 {
		clock.Advance(5 * time.Minute) // the run goes on, its locks renewed
		requireNoErrors(t, tick(t, owner.shop.StockReconciliation(), other.shop.StockReconciliation()))
	}
	require.Equal(t, 1, w.warehouse.Counts())
	require.Equal(t, 3, w.logs.count("pglock: skipped job: a run is still in progress", "instance=owner"))
	require.Equal(t, 3, w.logs.count("pglock: skipped job: it runs on another instance", "instance=other"))

	hold.Release()
	select {
	case err := <-first:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the long count did not end within 10s")
	}
	clock.Advance(5 * time.Minute)
	requireNoErrors(t, tick(t, owner.shop.StockReconciliation(), other.shop.StockReconciliation()))
	require.Equal(t, 2, w.warehouse.Counts())
	require.Equal(t, 2, w.logs.count("shop: reconciled stock", "instance=owner", "written=3"))
}
