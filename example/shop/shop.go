package shop

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"
	_ "time/tzdata" // Europe/Warsaw, on machines without a time zone database

	"github.com/go-co-op/gocron/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/pglockui"
)

// The keys of the shop's locks. They never change: a renamed key would let the old
// and the new instances each run a job once during a rolling deploy.
const (
	// InvoiceExportKey is the invoice export's job key: its run lock, which the admin
	// endpoint takes too, and with ":owner" its lease.
	InvoiceExportKey = "invoices:nightly-export"
	// StockReconciliationKey is the stock reconciliation's job key.
	StockReconciliationKey = "inventory:stock-reconciliation"
	// WarehouseFeedKey is the election of the instance that holds the warehouse feed.
	WarehouseFeedKey = "inventory:warehouse-feed"
	// InvoiceExportsKey is the semaphore of the invoice exports in progress: an export,
	// scheduled or by hand, holds one of its InvoiceExportLimit permits.
	InvoiceExportsKey = "invoices:exports"
	// WarehouseCallsKey is the semaphore of the calls to the warehouse's API in
	// progress, across the fleet: a call holds one of its WarehouseCallLimit permits.
	WarehouseCallsKey = "inventory:warehouse-calls"
)

// The limits the external systems set, for the whole shop.
const (
	// InvoiceExportLimit is how many uploads the accounting system takes at once:
	// how many invoice exports run at once, on any instances.
	InvoiceExportLimit = 2
	// WarehouseCallLimit is how many calls the warehouse's API takes at once from the
	// shop: its rate limit is the fleet's, not an instance's.
	WarehouseCallLimit = 3
	// DefaultInvoiceBatchSize is how many orders an export uploads in one batch.
	DefaultInvoiceBatchSize = 500
)

// The schedules, and how long the admin endpoint waits for a running export.
const (
	// DefaultInvoiceExportCron is 02:00 every night, in InvoiceExportTimeZone.
	DefaultInvoiceExportCron = "0 2 * * *"
	// InvoiceExportTimeZone is the invoice export's time zone, unless its cron
	// expression starts with CRON_TZ= or TZ=.
	InvoiceExportTimeZone = "Europe/Warsaw"
	// DefaultStockReconciliationCron is every five minutes.
	DefaultStockReconciliationCron = "*/5 * * * *"
	// ExportWait is how long POST /admin/invoice-exports waits for a permit of the
	// exports (InvoiceExportsKey) before it answers 409.
	ExportWait = 2 * time.Second
)

// ErrInvalidConfig is what New returns, wrapped with the field at fault, for a Config
// it cannot run with.
var ErrInvalidConfig = errors.New("shop: invalid config")

// Config is what one instance of the shop runs with.
type Config struct {
	// Pool is the shop's database, with the shop's tables (Migrate) and pglock's
	// (pglock.Migrate). Required; it stays the caller's.
	Pool *pgxpool.Pool
	// Locks is the instance's pglock client, on the same database as Pool (the admin
	// endpoint lists its locks table). Required; it stays the caller's.
	Locks *pglock.Client
	// Accounting and Warehouse are the external systems. Required.
	Accounting AccountingClient
	Warehouse  WarehouseClient
	// AdminToken guards the admin endpoints (header X-Admin-Token). Required.
	AdminToken string
	// InvoiceExportCron is the export's schedule, five fields or six with seconds first;
	// empty means DefaultInvoiceExportCron. It runs in InvoiceExportTimeZone unless it
	// starts with CRON_TZ= or TZ=.
	InvoiceExportCron string
	// StockReconciliationCron is the reconciliation's schedule, five fields or six with
	// seconds first, in the local time zone; empty means DefaultStockReconciliationCron.
	StockReconciliationCron string
	// InvoiceBatchSize is how many orders an export uploads in one batch; 0 means
	// DefaultInvoiceBatchSize. An export uploads batch after batch until no order is
	// left, and two exports at once take different orders.
	InvoiceBatchSize int
	// Logger is where the shop logs; nil means slog.Default().
	Logger *slog.Logger
	// Metrics, when set, is served at GET /metrics, with the gauges of Locks; Locks
	// must have been created with Metrics.EventHandler. Nil: no /metrics.
	Metrics *Metrics
}

// ExportResult is what one invoice export did.
type ExportResult struct {
	// Exported is how many invoices it uploaded: 0 when no placed order was left
	// without an invoice (or another export in progress had taken them).
	Exported int `json:"exported"`
	// BatchID is the accounting system's batch, when Exported > 0: the last one, when
	// the export uploaded several.
	BatchID string `json:"batchId,omitempty"`
	// Batches is how many batches it uploaded.
	Batches int `json:"batches"`
	// Permit is the permit of InvoiceExportsKey the export held (1 or 2); 0 when it
	// was called without one.
	Permit int `json:"permit,omitempty"`
}

// Shop is one instance of the cat-food shop: its two scheduled jobs, its HTTP API and
// its part in the election of the warehouse feed's holder. Its methods are safe for
// concurrent use.
type Shop struct {
	pool       *pgxpool.Pool
	locks      *pglock.Client
	accounting AccountingClient
	warehouse  WarehouseClient
	logger     *slog.Logger
	adminToken string
	metrics    *Metrics
	unobserve  func()       // stops Metrics reading Locks' health
	console    http.Handler // pglockui, under /admin/console/
	batchSize  int
	exports    *pglock.Semaphore // InvoiceExportsKey
	calls      *pglock.Semaphore // WarehouseCallsKey

	scheduler gocron.Scheduler
	export    *pglock.Job
	reconcile *pglock.Job

	mu       sync.Mutex
	started  bool
	election *pglock.Election

	shutdown    sync.Once
	shutdownErr error
}

// New returns an instance of the shop: it registers the invoice export (OnOneInstance
// and WithoutOverlapping on InvoiceExportKey) and the stock reconciliation (the same on
// StockReconciliationKey) with cfg.Locks and with a gocron scheduler of its own, which
// Start starts, and makes the semaphores of the exports and the warehouse calls. It
// returns an error wrapping ErrInvalidConfig, naming the field, for a missing
// dependency, an empty AdminToken, a negative InvoiceBatchSize or a cron expression
// gocron refuses, and pglock's error when cfg.Locks refuses a job (its keys are taken
// by another Shop on the same client, or it is closed).
func New(cfg Config) (*Shop, error) {
	switch {
	case cfg.Pool == nil:
		return nil, fmt.Errorf("%w: Pool is nil", ErrInvalidConfig)
	case cfg.Locks == nil:
		return nil, fmt.Errorf("%w: Locks is nil", ErrInvalidConfig)
	case cfg.Accounting == nil:
		return nil, fmt.Errorf("%w: Accounting is nil", ErrInvalidConfig)
	case cfg.Warehouse == nil:
		return nil, fmt.Errorf("%w: Warehouse is nil", ErrInvalidConfig)
	case cfg.AdminToken == "":
		return nil, fmt.Errorf("%w: AdminToken is empty: the admin endpoints would be open to anyone", ErrInvalidConfig)
	}
	s := &Shop{pool: cfg.Pool, locks: cfg.Locks, accounting: cfg.Accounting, warehouse: cfg.Warehouse,
		logger: orDefault(cfg.Logger), adminToken: cfg.AdminToken, metrics: cfg.Metrics, unobserve: func() {},
		batchSize: cmp.Or(cfg.InvoiceBatchSize, DefaultInvoiceBatchSize)}
	if cfg.InvoiceBatchSize < 0 {
		return nil, fmt.Errorf("%w: InvoiceBatchSize %d: want 1 or more (0: %d)", ErrInvalidConfig, cfg.InvoiceBatchSize, DefaultInvoiceBatchSize)
	}
	var err error
	if s.exports, err = s.locks.Semaphore(InvoiceExportsKey, InvoiceExportLimit); err != nil {
		return nil, err
	}
	if s.calls, err = s.locks.Semaphore(WarehouseCallsKey, WarehouseCallLimit); err != nil {
		return nil, err
	}
	// Every request to the console passed the admin check (Handler), so its actions
	// are the admin's.
	if s.console, err = pglockui.New(cfg.Locks, pglockui.WithLogger(s.logger),
		pglockui.WithAuthorize(func(*http.Request) bool { return true })); err != nil {
		return nil, fmt.Errorf("shop: console: %w", err)
	}
	if s.scheduler, err = gocron.NewScheduler(); err != nil {
		return nil, fmt.Errorf("shop: scheduler: %w", err)
	}
	// The gocron jobs first: a cron expression it refuses must leave the pglock
	// client's keys unregistered. The tasks reach the pglock jobs once they exist; no
	// tick comes before Start.
	exportCron := cmp.Or(cfg.InvoiceExportCron, DefaultInvoiceExportCron)
	if !strings.HasPrefix(exportCron, "CRON_TZ=") && !strings.HasPrefix(exportCron, "TZ=") {
		exportCron = "CRON_TZ=" + InvoiceExportTimeZone + " " + exportCron
	}
	crons := []struct {
		field, expr, name string
		run               func(ctx context.Context) error
	}{
		{"InvoiceExportCron", exportCron, InvoiceExportKey, func(ctx context.Context) error { return s.export.Run(ctx) }},
		{"StockReconciliationCron", cmp.Or(cfg.StockReconciliationCron, DefaultStockReconciliationCron), StockReconciliationKey,
			func(ctx context.Context) error { return s.reconcile.Run(ctx) }},
	}
	for _, c := range crons {
		// withSeconds: gocron's parser then takes an optional sixth field, seconds, first.
		if _, err := s.scheduler.NewJob(gocron.CronJob(c.expr, true), gocron.NewTask(c.run), pglock.GocronOptions(c.name)...); err != nil {
			_ = s.scheduler.Shutdown()
			return nil, fmt.Errorf("%w: %s %q: %w", ErrInvalidConfig, c.field, c.expr, err)
		}
	}
	s.export, err = s.locks.Job(InvoiceExportKey, s.exportJob, pglock.OnOneInstance(), pglock.WithoutOverlapping())
	if err == nil {
		s.reconcile, err = s.locks.Job(StockReconciliationKey, s.ReconcileStock, pglock.OnOneInstance(), pglock.WithoutOverlapping())
	}
	if err != nil {
		_ = s.scheduler.Shutdown()
		return nil, err
	}
	if s.metrics != nil {
		s.unobserve = s.metrics.pglock.Observe(s.locks)
	}
	return s, nil
}

// Start starts the scheduler and the instance's campaign for the warehouse feed. It
// returns an error when called twice, or pglock's error when the election cannot start
// (the client is closed, its key is taken).
func (s *Shop) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return errors.New("shop: already started")
	}
	e, err := s.locks.Elect(WarehouseFeedKey, pglock.LeaderCallbacks{OnAcquired: s.connectFeed, OnLost: s.disconnectFeed})
	if err != nil {
		return err
	}
	s.started, s.election = true, e
	s.scheduler.Start()
	return nil
}

// Shutdown stops the scheduler (no tick starts from now on; the runs in progress are
// cancelled, as gocron cancels their ctx, and waited for) and resigns from the feed's
// election, so that another instance connects to the feed at once. ctx bounds both.
// Then close, in this order, the pglock client (it hands the jobs' leases back) and the
// pool. It returns gocron's or the resignation's error, or ctx's when it ends first;
// later calls return what the first did.
func (s *Shop) Shutdown(ctx context.Context) error {
	s.shutdown.Do(func() {
		err := s.scheduler.ShutdownWithContext(ctx)
		s.mu.Lock()
		e := s.election
		s.mu.Unlock()
		if e != nil {
			err = errors.Join(err, e.Resign(ctx))
		}
		s.unobserve()
		s.shutdownErr = err
	})
	return s.shutdownErr
}

// InvoiceExport returns the scheduled invoice export: Run runs one tick of it.
func (s *Shop) InvoiceExport() *pglock.Job { return s.export }

// StockReconciliation returns the scheduled stock reconciliation: Run runs one tick
// of it.
func (s *Shop) StockReconciliation() *pglock.Job { return s.reconcile }

// LeadsWarehouseFeed reports whether this instance holds the warehouse feed now, as far
// as it knows (see pglock.Election.IsLeader).
func (s *Shop) LeadsWarehouseFeed() bool {
	s.mu.Lock()
	e := s.election
	s.mu.Unlock()
	return e != nil && e.IsLeader()
}

func (s *Shop) exportJob(ctx context.Context) error {
	_, err := s.exportLimited(ctx)
	return err
}

// exportLimited runs ExportInvoices under a permit of InvoiceExportsKey, waiting for
// one while InvoiceExportLimit exports run, for as long as ctx (and the options) let
// it: pglock.ErrNotAcquired when none came free.
func (s *Shop) exportLimited(ctx context.Context, opts ...pglock.AcquireOption) (ExportResult, error) {
	var res ExportResult
	err := s.exports.WithPermit(ctx, func(ctx context.Context) error {
		var err error
		res, err = s.ExportInvoices(ctx)
		if l, ok := pglock.FromContext(ctx); ok {
			res.Permit = l.Permit()
		}
		return err
	}, opts...)
	return res, err
}

// ExportInvoices uploads every placed order that has no invoice yet, in batches of
// Config.InvoiceBatchSize, and marks each batch's orders with its batch id. It takes
// every pending order, not "yesterday's", so a night it did not run is caught up the
// next night. A batch's orders stay row-locked (FOR UPDATE SKIP LOCKED) from their
// read to their mark, in one transaction: two exports at once take different orders,
// and a batch whose upload or mark fails is left for the next export. Call it under a
// permit of InvoiceExportsKey, as the scheduled job and the admin endpoint do, so that
// the accounting system never gets more than InvoiceExportLimit uploads at once: it
// does not take one itself. ctx bounds the reads, the uploads and the writes; errors
// are the database's or the accounting system's, wrapped, with what was exported
// before.
func (s *Shop) ExportInvoices(ctx context.Context) (ExportResult, error) {
	var res ExportResult
	for {
		n, batch, err := s.exportBatch(ctx)
		if err != nil || n == 0 {
			return res, err
		}
		res.Exported += n
		res.BatchID = batch
		res.Batches++
	}
}

// exportBatch uploads and marks one batch of pending orders that no other export has
// taken; 0 when none is left.
func (s *Shop) exportBatch(ctx context.Context) (int, string, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return 0, "", fmt.Errorf("shop: export: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rows, _ := tx.Query(ctx, `SELECT id, user_id, total, placed_at FROM orders
		WHERE status = 'placed' AND invoiced_at IS NULL ORDER BY placed_at LIMIT $1 FOR UPDATE SKIP LOCKED`, s.batchSize)
	pending, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Invoice])
	if err != nil {
		return 0, "", fmt.Errorf("shop: pending orders: %w", err)
	}
	if len(pending) == 0 {
		return 0, "", tx.Commit(ctx)
	}
	ids := make([]string, len(pending))
	for i, inv := range pending {
		ids[i] = inv.OrderID
	}
	batch, err := s.accounting.UploadInvoices(ctx, pending)
	if err != nil {
		return 0, "", fmt.Errorf("shop: upload invoices: %w", err)
	}
	if _, err := tx.Exec(ctx, "UPDATE orders SET invoiced_at = now(), invoice_batch = $1 WHERE id = ANY($2)", batch, ids); err != nil {
		return 0, "", fmt.Errorf("shop: mark orders invoiced in batch %s: %w", batch, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, "", fmt.Errorf("shop: mark orders invoiced in batch %s: %w", batch, err)
	}
	s.logger.Info("shop: exported invoices", slog.Int("exported", len(pending)), slog.String("batch", batch))
	return len(pending), batch, nil
}

// ReconcileStock asks the warehouse for a full count and writes it to the products
// table, fenced by the token of the lock ctx runs under (pglock.FromContext: the
// scheduled job's run lock): a product that a newer run (a greater token) already
// wrote is left alone, and those stale writes are logged at warn. Pass it ctx, which
// pglock cancels when the run's lock is lost; the count then stops. It returns an
// error when ctx carries no lock, or the warehouse's or the database's error, wrapped
// (a lost lock is a *pglock.LockLostError).
func (s *Shop) ReconcileStock(ctx context.Context) error {
	lock, ok := pglock.FromContext(ctx)
	if !ok {
		return errors.New("shop: ReconcileStock needs a lock in ctx: run it as the scheduled job")
	}
	// The warehouse's rate limit is the fleet's: a call holds a permit of
	// WarehouseCallsKey. The call writes nothing; the products are written below,
	// fenced by the run lock's token (a permit's token grows per permit, not per
	// product, so it cannot fence rows that every permit writes). A permit lost during
	// the call (a pause) is not an error: the count is still the warehouse's answer,
	// and the fence decides whether it may be written.
	permit, err := s.calls.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("shop: stock counts: %w", err)
	}
	counts, err := s.warehouse.StockCounts(ctx)
	_ = permit.Release(ctx)
	if err != nil {
		return fmt.Errorf("shop: stock counts: %w", err)
	}
	ids, units := make([]string, len(counts)), make([]int, len(counts))
	for i, c := range counts {
		ids[i], units[i] = c.ProductID, c.Count
	}
	written, err := pglock.ExecFenced(ctx, s.pool, `UPDATE products SET in_stock = c.count
		FROM unnest($1::text[], $2::int[]) AS c(id, count) WHERE products.id = c.id`,
		"stock_fencing_token", lock.Token(), ids, units)
	if err != nil {
		return fmt.Errorf("shop: write stock: %w", err)
	}
	if stale := int64(len(counts)) - written; stale > 0 {
		s.logger.Warn("shop: skipped stale stock writes: a newer run wrote those products",
			slog.Int64("stale", stale), slog.Int64("token", lock.Token()))
	}
	s.logger.Info("shop: reconciled stock", slog.Int64("written", written), slog.Int64("token", lock.Token()))
	return nil
}

// connectFeed holds the warehouse feed for as long as this instance leads.
func (s *Shop) connectFeed(ctx context.Context, lock *pglock.Lock) error {
	s.logger.Info("shop: connected to the warehouse feed", slog.Int64("token", lock.Token()))
	return s.warehouse.Subscribe(ctx, func(a LowStockAlert) {
		s.logger.Warn("shop: low stock", slog.String("product", a.ProductID), slog.Int("left", a.Count))
	})
}

func (s *Shop) disconnectFeed(lock *pglock.Lock) {
	s.logger.Info("shop: disconnected from the warehouse feed", slog.Int64("token", lock.Token()))
}
