// Command shop runs one instance of the cat-food shop (package shop): its HTTP API,
// its two scheduled jobs and its campaign for the warehouse feed, with fake
// accounting and warehouse systems that log what they are asked.
//
// Usage:
//
//	ADMIN_TOKEN=s3cret go run ./example/shop/cmd/shop [-port 3001]
//
// Each flag defaults to an environment variable:
//
//	-port                       PORT                       HTTP port (3000)
//	-database-url               DATABASE_URL               postgres:// URL of the shop's database
//	-admin-token                ADMIN_TOKEN                the admin endpoints' token; required
//	-invoice-export-cron        INVOICE_EXPORT_CRON        "0 2 * * *", Europe/Warsaw
//	-stock-reconciliation-cron  STOCK_RECONCILIATION_CRON  "*/5 * * * *"; six fields for seconds: "*/10 * * * * *"
//	-ttl                        LOCK_TTL                   the locks' ttl (30s)
//	-invoice-batch-size         INVOICE_BATCH_SIZE         orders per uploaded batch (500)
//	-accounting-delay           ACCOUNTING_DELAY           how long the fake accounting takes per upload (0s)
//	-log-level                  LOG_LEVEL                  debug shows the skipped ticks (info)
//
// Without a database URL it finds a server with pglockdev (for local development only:
// a deployed shop is given DATABASE_URL): the one the libpq defaults reach (PGHOST,
// PGPORT, PGUSER, the local socket) if one answers, else an embedded PostgreSQL it
// starts (downloaded once; offline, point PGLOCK_POSTGRES_BINARIES at a directory with
// PostgreSQL's bin/, lib/ and share/), and works in a database of its own there,
// pglock_shop, created if missing. It logs which database and server it uses. Several
// instances must share one database: give them the same DATABASE_URL.
//
// At start it migrates pglock's schema and the shop's tables and inserts the seed data
// that is missing. On SIGINT or SIGTERM it shuts down in this order: the HTTP server
// (in-flight requests finish), the scheduler (no more ticks) and the feed (it resigns,
// so another instance connects at once), the pglock client (the jobs' leases handed
// back), the pool. A second signal kills it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/example/shop"
	"github.com/pgfence/pglock/pglockdev"
)

// ownDatabase is the database the shop works in when no URL names one.
const ownDatabase = "pglock_shop"

// shutdownTimeout bounds the whole shutdown.
const shutdownTimeout = 30 * time.Second

type config struct {
	port                    int
	databaseURL             string
	databaseFrom            string // where databaseURL came from, for the log
	adminToken              string
	invoiceExportCron       string
	stockReconciliationCron string
	ttl                     time.Duration
	invoiceBatchSize        int
	accountingDelay         time.Duration
	logLevel                slog.Level
}

func main() {
	os.Exit(exitCode(run(os.Args[1:]), os.Stderr))
}

// exitCode is the shop's exit code after run returned err, which it prints: 0 when
// nothing went wrong or -h printed the usage.
func exitCode(err error, stderr io.Writer) int {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fmt.Fprintln(stderr, "shop:", err)
	return 1
}

func parse(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("shop", flag.ContinueOnError)
	port, err := strconv.Atoi(env("PORT", "3000"))
	if err != nil {
		return c, fmt.Errorf("PORT: %w", err)
	}
	ttl, err := time.ParseDuration(env("LOCK_TTL", "30s"))
	if err != nil {
		return c, fmt.Errorf("LOCK_TTL: %w", err)
	}
	batchSize, err := strconv.Atoi(env("INVOICE_BATCH_SIZE", "0"))
	if err != nil {
		return c, fmt.Errorf("INVOICE_BATCH_SIZE: %w", err)
	}
	delay, err := time.ParseDuration(env("ACCOUNTING_DELAY", "0s"))
	if err != nil {
		return c, fmt.Errorf("ACCOUNTING_DELAY: %w", err)
	}
	if err := c.logLevel.UnmarshalText([]byte(env("LOG_LEVEL", "info"))); err != nil {
		return c, fmt.Errorf("LOG_LEVEL: %w", err)
	}
	fs.IntVar(&c.port, "port", port, "HTTP port (env PORT)")
	fs.StringVar(&c.databaseURL, "database-url", os.Getenv("DATABASE_URL"), "postgres:// URL of the shop's database (env DATABASE_URL)")
	fs.StringVar(&c.adminToken, "admin-token", os.Getenv("ADMIN_TOKEN"), "the admin endpoints' token (env ADMIN_TOKEN); required")
	fs.StringVar(&c.invoiceExportCron, "invoice-export-cron", os.Getenv("INVOICE_EXPORT_CRON"), "the invoice export's schedule (env INVOICE_EXPORT_CRON)")
	fs.StringVar(&c.stockReconciliationCron, "stock-reconciliation-cron", os.Getenv("STOCK_RECONCILIATION_CRON"), "the stock reconciliation's schedule (env STOCK_RECONCILIATION_CRON)")
	fs.DurationVar(&c.ttl, "ttl", ttl, "the locks' ttl (env LOCK_TTL)")
	fs.IntVar(&c.invoiceBatchSize, "invoice-batch-size", batchSize, "orders per uploaded batch; 0: 500 (env INVOICE_BATCH_SIZE)")
	fs.DurationVar(&c.accountingDelay, "accounting-delay", delay, "how long the fake accounting system takes per upload (env ACCOUNTING_DELAY)")
	fs.TextVar(&c.logLevel, "log-level", c.logLevel, "debug, info, warn or error (env LOG_LEVEL)")
	fs.SetOutput(io.Discard) // a bad flag is one line, from main
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(os.Stdout, "Usage: shop [flags]\n\nThe example shop: an HTTP API on pglock's locks, jobs and election (see its README).\n\nFlags:\n")
			fs.SetOutput(os.Stdout)
			fs.PrintDefaults()
		}
		return c, err
	}
	c.databaseFrom = "DATABASE_URL"
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "database-url" {
			c.databaseFrom = "-database-url"
		}
	})
	if c.ttl < pglock.MinTTL || c.ttl > pglock.MaxTTL {
		return c, fmt.Errorf("ttl %v: want %v to %v", c.ttl, pglock.MinTTL, pglock.MaxTTL)
	}
	if c.adminToken == "" {
		return c, errors.New("ADMIN_TOKEN is empty: the admin endpoints would be open to anyone; set it (ADMIN_TOKEN=s3cret)")
	}
	return c, nil
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func run(args []string) (err error) {
	cfg, err := parse(args)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.logLevel})).
		With(slog.Int("port", cfg.port))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	// What to close at the end, in reverse order of opening: the documented order.
	var closers []closer
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		for i := len(closers) - 1; i >= 0; i-- {
			if cerr := closers[i].close(ctx); cerr != nil {
				logger.Error("shop: shutdown step failed", slog.String("step", closers[i].name), slog.Any("err", cerr))
				err = errors.Join(err, cerr)
			}
		}
		logger.Info("shop: stopped")
	}()

	dbURL, err := database(ctx, cfg, logger, &closers)
	if err != nil {
		return err
	}
	if err := pglock.Migrate(ctx, dbURL); err != nil {
		return err
	}
	if err := shop.Migrate(ctx, dbURL); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	closers = append(closers, closer{"pool", func(context.Context) error { pool.Close(); return nil }})
	if err := shop.Seed(ctx, pool); err != nil {
		return err
	}
	metrics, err := shop.NewMetrics() // GET /metrics
	if err != nil {
		return err
	}
	closers = append(closers, closer{"metrics", metrics.Shutdown})
	host, _ := os.Hostname()
	locks, err := pglock.New(pool, pglock.TTL(cfg.ttl), pglock.WithLogger(logger),
		pglock.WithInstanceName(fmt.Sprintf("%s:%d", host, cfg.port)), metrics.EventHandler())
	if err != nil {
		return err
	}
	closers = append(closers, closer{"pglock client", locks.Close})
	accounting := shop.NewFakeAccounting(logger)
	accounting.SetDelay(cfg.accountingDelay)
	s, err := shop.New(shop.Config{
		Pool:                    pool,
		Locks:                   locks,
		Accounting:              accounting,
		Warehouse:               shop.NewFakeWarehouse(logger),
		AdminToken:              cfg.adminToken,
		InvoiceExportCron:       cfg.invoiceExportCron,
		StockReconciliationCron: cfg.stockReconciliationCron,
		InvoiceBatchSize:        cfg.invoiceBatchSize,
		Logger:                  logger,
		Metrics:                 metrics,
	})
	if err != nil {
		return err
	}
	closers = append(closers, closer{"scheduler and feed", s.Shutdown})
	ln, err := net.Listen("tcp", fmt.Sprintf(":%d", cfg.port))
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	closers = append(closers, closer{"http server", func(ctx context.Context) error {
		err := srv.Shutdown(ctx)
		if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
			err = errors.Join(err, serr)
		}
		return err
	}})
	if err := s.Start(); err != nil {
		return err
	}
	logger.Info("shop: listening", slog.String("addr", ln.Addr().String()), slog.Duration("ttl", cfg.ttl))

	select {
	case <-ctx.Done():
		stop() // a second signal kills the process
		logger.Info("shop: shutting down")
		return nil
	case err := <-served:
		served <- err // for the http server's closer
		return fmt.Errorf("http server: %w", err)
	}
}

// closer is one step of the shutdown.
type closer struct {
	name  string
	close func(context.Context) error
}

// database returns the URL of the shop's database: the one configured, else its own
// database on the server pglockdev finds, which it may have to start (and adds to
// closers to stop). It logs which, in the words of pglockdev.Server.How.
func database(ctx context.Context, cfg config, logger *slog.Logger, closers *[]closer) (string, error) {
	if url := cfg.databaseURL; url != "" {
		logger.Info("shop: database", slog.String("name", databaseName(url)),
			slog.String("server", "the server in "+cfg.databaseFrom))
		return url, nil
	}
	srv, err := pglockdev.Find(ctx, "DATABASE_URL")
	if err != nil {
		return "", err
	}
	*closers = append(*closers, closer{"embedded postgres", func(context.Context) error { return srv.Stop() }})
	logger.Info("shop: database", slog.String("name", ownDatabase), slog.String("server", srv.How))
	return srv.Database(ctx, ownDatabase)
}

// databaseName returns the database a URL names, for a log line that must not show
// the password.
func databaseName(databaseURL string) string {
	cfg, err := pgconn.ParseConfig(databaseURL)
	if err != nil {
		return "?"
	}
	return cfg.Database
}
