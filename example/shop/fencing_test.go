package shop_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/example/shop"
	"github.com/pgfence/pglock/pglocktest"
)

// paused is instance A of the fencing tests, paused in the middle of a reconciliation
// while B took the job over.
type paused struct {
	w      *world
	clockA *pglocktest.ManualClock
	hold   *shop.Hold
	result chan error // A's run, once it returns
}

// pauseAWhileBTakesOver starts A on a clock that stands still (it never renews) with a
// ttl of 1 s, and runs runA on it: A reads the shelves (salmon kibble: 12) and its count
// is held there, as if A paused. Three bags are sold; 1.2 s later A's locks have
// expired in the database, and B, on the real clock, runs the reconciliation and
// writes 9. B has the default ttl: with a ttl of 1 s, a loaded machine could make its
// run skip (the store's confirmation came after 0.9 s) or lose its lock.
func pauseAWhileBTakesOver(t *testing.T, runA func(ctx context.Context, w *world, a *instance) error) *paused {
	t.Helper()
	p := &paused{w: newWorld(t), clockA: pglocktest.NewManualClock(time.Now()), result: make(chan error, 1)}
	a := p.w.start(t, "a", pglock.WithClock(p.clockA), pglock.TTL(time.Second))
	t.Cleanup(func() { p.clockA.Advance(time.Second) }) // before A's Close: it finds its locks lost
	b := p.w.start(t, "b")

	p.hold = p.w.warehouse.Hold(1)
	t.Cleanup(p.hold.Release)
	go func() { p.result <- runA(t.Context(), p.w, a) }()
	wait(t, p.hold.Arrived(), "A's count")
	p.w.warehouse.SetStock("salmon-kibble-2kg", 9)
	time.Sleep(1200 * time.Millisecond) // database time: A's locks expire
	require.NoError(t, b.shop.StockReconciliation().Run(t.Context()))
	require.Equal(t, 9, p.w.kibble(t))
	return p
}

// resultA waits for A's run to return.
func (p *paused) resultA(t *testing.T) error {
	t.Helper()
	select {
	case err := <-p.result:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("A's run did not return within 10s")
		return nil
	}
}

func TestFencingUnfencedPausedInstanceOverwritesTheFreshCount(t *testing.T) {
	t.Parallel()
	p := pauseAWhileBTakesOver(t, func(ctx context.Context, w *world, a *instance) error {
		return a.locks.WithLock(ctx, shop.StockReconciliationKey, func(ctx context.Context) error {
			return reconcileUnfenced(ctx, a.pool, w.warehouse)
		})
	})
	p.hold.Release() // A wakes up and writes what it read before the pause
	err := p.resultA(t)
	require.ErrorIs(t, err, pglock.ErrLockLost, "only its release finds out")
	require.Equal(t, 12, p.w.kibble(t), "three bags the shop does not have")
}

func TestFencingTheDatabaseRefusesThePausedInstancesStaleWrite(t *testing.T) {
	t.Parallel()
	p := pauseAWhileBTakesOver(t, func(ctx context.Context, _ *world, a *instance) error {
		return a.shop.StockReconciliation().Run(ctx)
	})
	p.hold.Release() // A wakes up before it noticed it lost its locks, and writes
	err := p.resultA(t)
	var lost *pglock.LockLostError
	require.ErrorAs(t, err, &lost) // its run lock's release is refused: B has it
	require.Equal(t, pglock.LostReleaseRefused, lost.Reason)
	require.Equal(t, 9, p.w.kibble(t))
	require.Equal(t, 1, p.w.logs.count("shop: skipped stale stock writes: a newer run wrote those products", "instance=a", "stale=3"))
	var tokens int
	require.NoError(t, p.w.db.QueryRow(t.Context(), "SELECT count(DISTINCT stock_fencing_token) FROM products").Scan(&tokens))
	require.Equal(t, 1, tokens, "every product carries B's token")
}

func TestFencingARunThatNoticesItLostItsLockStopsBeforeWriting(t *testing.T) {
	t.Parallel()
	p := pauseAWhileBTakesOver(t, func(ctx context.Context, _ *world, a *instance) error {
		return a.shop.StockReconciliation().Run(ctx)
	})
	p.clockA.Advance(time.Second) // A's clock moves: its next renewal is refused
	err := p.resultA(t)
	require.ErrorIs(t, err, pglock.ErrLockLost)
	p.hold.Release()
	require.Equal(t, 9, p.w.kibble(t))
	require.Positive(t, p.w.logs.count("pglock: lost lock", "instance=a"))
	require.Equal(t, 0, p.w.logs.count("shop: reconciled stock", "instance=a"))
}
