package shop_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/example/shop"
	"github.com/pgfence/pglock/pglocktest"
)

func TestNewRefusesABadConfigAndRegistersNothing(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	pool := pglocktest.Pool(t, w.url, 2)
	locks, err := pglock.New(pool, pglock.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, locks.Close(context.Background())) })
	valid := func() shop.Config {
		return shop.Config{Pool: pool, Locks: locks, Accounting: w.accounting, Warehouse: w.warehouse, AdminToken: "s3cret"}
	}
	cases := []struct {
		name   string
		change func(*shop.Config)
		want   string
	}{
		{"nil pool", func(c *shop.Config) { c.Pool = nil }, "Pool"},
		{"nil locks", func(c *shop.Config) { c.Locks = nil }, "Locks"},
		{"nil accounting", func(c *shop.Config) { c.Accounting = nil }, "Accounting"},
		{"nil warehouse", func(c *shop.Config) { c.Warehouse = nil }, "Warehouse"},
		{"empty admin token", func(c *shop.Config) { c.AdminToken = "" }, "AdminToken"},
		{"bad export cron", func(c *shop.Config) { c.InvoiceExportCron = "at two" }, "InvoiceExportCron"},
		{"bad reconciliation cron", func(c *shop.Config) { c.StockReconciliationCron = "61 * * * *" }, "StockReconciliationCron"},
		{"negative batch size", func(c *shop.Config) { c.InvoiceBatchSize = -1 }, "InvoiceBatchSize -1"},
		{"seven fields", func(c *shop.Config) { c.StockReconciliationCron = "0 0 */5 * * * *" }, "StockReconciliationCron"},
	}
	for _, c := range cases {
		cfg := valid()
		c.change(&cfg)
		s, err := shop.New(cfg)
		require.ErrorIs(t, err, shop.ErrInvalidConfig, c.name)
		require.ErrorContains(t, err, c.want, c.name)
		require.Nil(t, s)
	}

	// Nothing was registered: a valid config takes the job keys on the same client,
	// with a six-field cron (seconds first) and an explicit time zone.
	cfg := valid()
	cfg.StockReconciliationCron = "0 " + neverCron
	cfg.InvoiceExportCron = "CRON_TZ=UTC " + neverCron
	s, err := shop.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Shutdown(context.Background())) })
	_, err = shop.New(valid())
	require.ErrorIs(t, err, pglock.ErrInvalidArgument, "the job keys are this client's already")

	// A second Start is refused; the reconciliation refuses to write unfenced.
	require.NoError(t, s.Start())
	require.ErrorContains(t, s.Start(), "already started")
	require.ErrorContains(t, s.ReconcileStock(t.Context()), "needs a lock")
	require.Equal(t, 0, w.warehouse.Counts())
}
