// Command tryit runs the tutorial's "Try it" in one command: three instances of the
// shop (example/shop/cmd/shop) on ports 3001 to 3003, on one database, and the story
// of a job and a feed that move between them, step by step:
//
//  1. The first instance leads the warehouse feed and owns the stock reconciliation
//     (every 10 s here); the other two skip every tick.
//  2. The locks table; the admin endpoint's 403 without the token; three exports at once
//     on three instances: two run and share the invoices (the accounting system takes
//     two uploads at once: a semaphore of 2 permits), the third answers 409.
//  3. kill -9 the owner: nothing moves while its leases live (up to ttl), then the feed
//     and the job move to another instance.
//  4. SIGTERM the new owner: it hands both over at once. Then stop the last one.
//
// It ends with a table of every step (expected, seen, ok) and exits with status 1 if
// one did not behave. The instances' log lines are shown compacted, one line each.
//
//	go run ./example/tryit             # ttl 30 s, about a minute
//	go run ./example/tryit -ttl 5s     # quicker
//	go run ./example/tryit -keep       # then three instances again, until Ctrl+C
//
// With -keep it then resets the orders and starts three instances again, the first
// alone until it leads the feed and owns the reconciliation, prints their ports and
// pids, and the commands for the tutorial's steps by hand (the locks table, two
// exports, kill -9 the one that runs both, psql), and keeps them running until Ctrl+C.
//
// It finds PostgreSQL with pglockdev (DATABASE_URL, else the libpq defaults if a server
// answers, else an embedded PostgreSQL; offline, PGLOCK_POSTGRES_BINARIES names local
// binaries), and works in a database of its own there, pglock_shop_demo, created
// if missing, whose URL it gives the instances in DATABASE_URL: it resets the shop's
// orders and products there, and never creates, drops or truncates anything in another
// database. It needs the go command, to build the shop once.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// options are tryit's flags.
type options struct {
	serverURL  string        // a server to use; "" finds one with pglockdev
	database   string        // the demo's own database on it
	ttl        time.Duration // the shop's lock ttl
	every      time.Duration // the reconciliation's interval: whole seconds, 1 to 59
	basePort   int           // the instances listen on basePort to basePort+2
	keep       bool          // keep three instances running after the story
	buildFlags []string      // extra flags for go build (the test adds -race)
}

func main() {
	var o options
	flag.StringVar(&o.database, "database", "pglock_shop_demo", "created if missing; its orders and products are reset")
	flag.DurationVar(&o.ttl, "ttl", 30*time.Second, "the locks' ttl: how long a killed instance keeps its job and the feed")
	flag.DurationVar(&o.every, "every", 10*time.Second, "how often the stock reconciliation runs (whole seconds, 1s to 59s)")
	flag.IntVar(&o.basePort, "base-port", 3001, "the three instances listen on this port and the next two")
	flag.BoolVar(&o.keep, "keep", false, "after the story, reset the orders and keep three instances running until Ctrl+C")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "Usage: go run ./example/tryit [flags]")
		flag.PrintDefaults()
	}
	flag.Parse()
	o.serverURL = os.Getenv("DATABASE_URL")

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ok, err := run(ctx, o, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tryit:", err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}

// run walks the story with o, writing to out, and reports whether every step behaved.
// An error means the story could not be walked (no server, a failed build, ctx ended).
// Every instance it started is stopped when it returns.
func run(ctx context.Context, o options, out io.Writer) (ok bool, err error) {
	if o.every < time.Second || o.every > 59*time.Second || o.every%time.Second != 0 {
		return false, fmt.Errorf("-every %v: want whole seconds from 1s to 59s", o.every)
	}
	if o.ttl < 100*time.Millisecond {
		return false, fmt.Errorf("-ttl %v: want at least 100ms", o.ttl)
	}
	d, err := newDemo(ctx, o, out)
	if err != nil {
		return false, err
	}
	defer d.close()
	if err := d.story(ctx); err != nil {
		return false, err
	}
	ok = d.summary()
	if o.keep {
		return ok, d.keepRunning(ctx)
	}
	return ok, nil
}
