// Command torture runs pglock under real faults and checks what it promised.
//
// It starts N worker processes (this program, run as "torture worker"), each a pglock
// client on its own pool, connected to PostgreSQL through a TCP proxy of its own on
// 127.0.0.1. Each worker loops: take one of K keys (Acquire and Release, or WithLock),
// read the key's counter in three tables, think, write counter+1 to each (one with a
// column fence, one with a lock fence, one with none); now and then it holds a
// FenceHeld transaction open past the ttl while it holds another lock. Every worker
// also campaigns in one election, runs one OnOneInstance job on every 50 ms tick, which
// records its tick fenced by its lease, takes permits of one semaphore and writes the
// permits' own counters under them as under a key's lock, holds two locks of different
// ttls side by side, and probes keys and the semaphore with TryAcquire on a very short
// ctx. Meanwhile the nemesis pauses
// holders (SIGSTOP past the ttl), kills workers, stops them cleanly in a WithLock
// section, terminates a worker's backends, black-holes or slows its proxy, burns its
// CPU, and restarts PostgreSQL, in an order and with timings drawn from a printed seed.
//
// Every worker appends what it did to its own history file; triggers log, in the
// writes' own transactions, every lease change and every accepted write. The workers
// also record the evidence the checker weighs before it blames pglock for a loss the
// machine may have caused (see evidence.go): pglock's calls on their pools (when each
// asked for a connection, was sent and answered), the connections opened, the renewals,
// and their own stalls; the controller records its stalls and samples the server for
// pglock statements waiting on locks or on the WAL. After the run
// the checker verifies the invariants of issue 7 (see checker.go) and prints a report,
// which the long run writes to RELIABILITY.md:
//
//	go run ./internal/torture -duration 10m     # the long run: every fault, PostgreSQL restarts included
//	go run ./internal/torture -duration 3m -restart=false -report ''   # on a server others use; print only
//	go run ./internal/torture check -dir /tmp/pglock-torture-123    # check a run's histories again
//	go run ./internal/torture -duration 1m -restart=false -report '' -mutate old-close   # must fail invariant 2
//	go run ./internal/torture -duration 30s -restart=false -report '' -faults '' -mutate count-then-take   # must fail invariant 9
//	go run ./internal/torture -duration 30s -restart=false -report '' -mutate slot-reclaim   # must fail invariant 10
//	go run ./internal/torture -duration 10m -failover async   # on a primary and a standby of its own, failed over every ~20 s
//	go run ./internal/torture -duration 1m -failover async -report '' -mutate old-tokens   # must fail invariant 1
//
// The report goes to RELIABILITY.md in the current directory unless -report says
// otherwise; the histories stay in the directory the first line of output names.
//
// The run works in a database of its own, created on the server PGLOCK_TEST_DATABASE_URL
// names (else the libpq defaults') and dropped at the end, unless -db names one. The
// restart fault restarts the whole server (-restart-cmd): leave it off while anything
// else uses that server. With -failover sync or async, the run works instead on a
// primary and a streaming standby of its own (internal/failover: the machine's
// PostgreSQL binaries, as user postgres when run as root), in that replication mode,
// and fails the primary over about every -failover-every (see failover.go); the report
// then goes to a section of its own in -report, the rest of the file kept. The CI
// versions are TestTorture and TestTortureFailover, in this package.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/devdb"
)

// serverEnv names the server the run creates its database on, as for the tests.
const serverEnv = "PGLOCK_TEST_DATABASE_URL"

func main() {
	var err error
	switch {
	case len(os.Args) > 1 && os.Args[1] == "worker":
		err = runWorker(os.Args[2:])
	case len(os.Args) > 1 && os.Args[1] == "check":
		err = runCheck(os.Args[2:], os.Stdout)
	default:
		err = runController(os.Args[1:], os.Stdout)
	}
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "torture:", err)
		os.Exit(1)
	}
}

// defaultConfig is the long run's configuration (the issue's), without its database.
func defaultConfig() Config {
	return Config{
		Workers: 5, Keys: 3, Permits: 2, TTL: time.Second, Duration: 10 * time.Minute,
		Think: 50 * time.Millisecond, Tick: 50 * time.Millisecond, Burn: time.Second,
		Gap: 3 * time.Second, Slack: 100 * time.Millisecond,
		Faults: []string{faultPause, faultKill, faultStop, faultTerminate, faultPartition, faultDelay, faultSlow},
	}
}

func runController(args []string, out io.Writer) error {
	cfg := defaultConfig()
	fs := flag.NewFlagSet("torture", flag.ContinueOnError)
	fs.IntVar(&cfg.Workers, "workers", cfg.Workers, "worker processes")
	fs.IntVar(&cfg.Keys, "keys", cfg.Keys, "lock keys")
	fs.IntVar(&cfg.Permits, "permits", cfg.Permits, "the semaphore's permits")
	fs.DurationVar(&cfg.TTL, "ttl", cfg.TTL, "the ttl of every lock, election and job lease")
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "how long the nemesis runs")
	fs.DurationVar(&cfg.Think, "think", cfg.Think, "the most a critical section waits between its reads and its writes")
	fs.DurationVar(&cfg.Tick, "tick", cfg.Tick, "the OnOneInstance job's schedule")
	fs.DurationVar(&cfg.Burn, "burn", cfg.Burn, "how long the slow fault burns a worker's CPU")
	fs.DurationVar(&cfg.Gap, "gap", cfg.Gap, "the most time between two faults")
	fs.DurationVar(&cfg.Slack, "slack", cfg.Slack, "how late after its lease's expiry a running holder may learn of the loss (scheduling delay)")
	fs.Uint64Var(&cfg.Seed, "seed", 0, "the seed of the fault schedule (0: a random one, printed)")
	faults := fs.String("faults", strings.Join(cfg.Faults, ","), "the faults to inject, besides restart")
	restart := fs.Bool("restart", true, "also restart PostgreSQL (the whole server: never while others use it)")
	fs.StringVar(&cfg.Failover, "failover", "", "run on a primary and a streaming standby of the run's own, replicating sync or async, and fail it over (instead of restart)")
	fs.DurationVar(&cfg.FailoverEvery, "failover-every", 20*time.Second, "the mean time between two failovers (with -failover)")
	fs.StringVar(&cfg.RestartCommand, "restart-cmd", "", "the command that restarts PostgreSQL (default: pg_ctlcluster for the one cluster in /etc/postgresql)")
	dbURL := fs.String("db", "", "an existing database with the pglock schema to run in (default: a fresh one, dropped at the end)")
	fs.StringVar(&cfg.Dir, "dir", "", "where to keep the histories (default: a new temporary directory)")
	report := fs.String("report", "RELIABILITY.md", "where to write the report (empty: only print it)")
	fs.StringVar(&cfg.Note, "note", "", "a note for the report: why a fault was left out, what else ran on the machine")
	fs.StringVar(&cfg.Mutate, "mutate", "", "restore an old behaviour in the workers, to see the checker fail: "+
		strings.Join(slices.Sorted(maps.Keys(mutations)), ", ")+" (never with the default -report)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.Faults = nil
	for _, f := range strings.Split(*faults, ",") {
		if f = strings.TrimSpace(f); f != "" && f != faultRestart && f != faultFailover {
			cfg.Faults = append(cfg.Faults, f)
		}
	}
	if cfg.Failover != "" {
		// The failover takes the restart's place: the pair is the run's own.
		asked := false
		fs.Visit(func(f *flag.Flag) { asked = asked || f.Name == "restart" })
		if asked && *restart {
			return errors.New("torture: -restart restarts the system's server: not with -failover")
		}
		*restart = false
		cfg.Faults = append(cfg.Faults, faultFailover)
	}
	if *restart {
		cfg.Faults = append(cfg.Faults, faultRestart)
		if cfg.RestartCommand == "" {
			cmd, err := defaultRestartCommand()
			if err != nil {
				return err
			}
			cfg.RestartCommand = cmd
		}
	}
	for cfg.Seed == 0 {
		var b [8]byte
		_, _ = rand.Read(b[:])
		for _, x := range b {
			cfg.Seed = cfg.Seed<<8 | uint64(x)
		}
	}
	cfg.Command = "go run ./internal/torture " + strings.Join(args, " ")
	cfg.Log = out
	var err error
	if cfg.WorkerBin, err = os.Executable(); err != nil {
		return err
	}
	if cfg.Dir == "" {
		if cfg.Dir, err = os.MkdirTemp("", "pglock-torture-"); err != nil {
			return err
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg.DatabaseURL = *dbURL
	if cfg.DatabaseURL == "" && cfg.Failover == "" {
		url, drop, err := freshDatabase(ctx, *restart)
		if err != nil {
			return err
		}
		defer drop()
		cfg.DatabaseURL = url
	}
	res, err := run(ctx, cfg)
	if err != nil {
		return err
	}
	return finish(res, out, *report)
}

// finish prints the report, writes it to path unless path is empty, and returns an
// error when the run failed.
func finish(res *Result, out io.Writer, path string) error {
	fmt.Fprint(out, markdown(res))
	if path != "" {
		old, err := os.ReadFile(path)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if err := os.WriteFile(path, []byte(reportFile(string(old), res)), 0o644); err != nil {
			return err
		}
		fmt.Fprintln(out, "torture: report written to", path)
	}
	if res.Failed() {
		return errors.New("invariants violated: see the report")
	}
	return nil
}

func runCheck(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	dir := fs.String("dir", "", "the run's directory")
	report := fs.String("report", "", "where to write the report (empty: only print it)")
	note := fs.String("note", "", "replaces the run's note in the report")
	if err := fs.Parse(args); err != nil {
		return err
	}
	h, err := loadHistory(*dir)
	if err != nil {
		return err
	}
	if *note != "" {
		h.Config.Note = *note
	}
	return finish(check(h), out, *report)
}

// defaultRestartCommand restarts the one PostgreSQL cluster of a Debian-style install.
func defaultRestartCommand() (string, error) {
	versions, err := filepath.Glob("/etc/postgresql/*/main")
	if err != nil || len(versions) != 1 {
		return "", fmt.Errorf("no single cluster in /etc/postgresql/*/main (found %d): pass -restart-cmd or -restart=false", len(versions))
	}
	return "pg_ctlcluster --skip-systemctl-redirect " + filepath.Base(filepath.Dir(versions[0])) + " main restart", nil
}

// freshDatabase creates a database with the pglock schema on the server the tests
// would use, and returns its URL and a function that drops it.
func freshDatabase(ctx context.Context, restart bool) (string, func(), error) {
	srv, err := devdb.Find(ctx, serverEnv)
	if err != nil {
		return "", nil, err
	}
	stopServer := func() { _ = srv.Stop() }
	if restart && srv.Embedded {
		stopServer()
		return "", nil, errors.New("the restart fault needs the system's PostgreSQL, not an embedded one: pass -restart=false")
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "pglock_torture_" + hex.EncodeToString(b)
	admin := func(sql string) error {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, srv.URL)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, sql)
		return err
	}
	if err := admin("CREATE DATABASE " + name); err != nil {
		stopServer()
		return "", nil, err
	}
	drop := func() {
		if err := admin("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)"); err != nil {
			fmt.Fprintln(os.Stderr, "torture: drop database:", err)
		}
		stopServer()
	}
	url, err := devdb.WithDatabase(srv.URL, name)
	if err == nil {
		err = pglock.Migrate(ctx, url)
	}
	if err != nil {
		drop()
		return "", nil, err
	}
	return url, drop, nil
}
