package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pglock"
)

// The counter tables, in the order of Config.Tables.
const (
	tableColumn   = "column_fenced" // FenceUpdate on a token column, the row claimed at read time
	tableLock     = "lock_fenced"   // FenceHeld: pglock.lock_held in the write's WHERE
	tableUnfenced = "unfenced"      // no fence at all: must lose updates under pauses
	tableJob      = "job"           // the OnOneInstance job's ticks, fenced by its lease
)

var counterTables = []string{tableColumn, tableLock, tableUnfenced}

// The keys of the election and the job (the job's lease is jobKey+":owner").
const (
	leaderKey   = "leader"
	jobKey      = "job"
	jobLeaseKey = jobKey + ":owner"
)

// opTimeout bounds each statement of a worker. Statements run on a context detached
// from the lock's: a holder that ignores Lock.Context sends every stale write, so that
// the fences alone must refuse them.
const opTimeout = 5 * time.Second

// workerConfig is what the controller passes to a worker process.
type workerConfig struct {
	id      string
	db      string
	dial    string // host:port of the worker's proxy
	history string
	keys    int
	ttl     time.Duration
	think   time.Duration
	tick    time.Duration
	burn    time.Duration
	seed    uint64
}

func (c workerConfig) args() []string {
	return []string{"worker", "-id", c.id, "-db", c.db, "-dial", c.dial, "-history", c.history,
		"-keys", strconv.Itoa(c.keys), "-ttl", c.ttl.String(), "-think", c.think.String(),
		"-tick", c.tick.String(), "-burn", c.burn.String(), "-seed", strconv.FormatUint(c.seed, 10)}
}

func parseWorkerFlags(args []string) (workerConfig, error) {
	var c workerConfig
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.StringVar(&c.id, "id", "", "the worker's id, its pglock instance name")
	fs.StringVar(&c.db, "db", "", "the database URL")
	fs.StringVar(&c.dial, "dial", "", "host:port to connect to instead of the URL's (the proxy)")
	fs.StringVar(&c.history, "history", "", "the history file")
	fs.IntVar(&c.keys, "keys", 3, "the number of lock keys")
	fs.DurationVar(&c.ttl, "ttl", time.Second, "the locks' ttl")
	fs.DurationVar(&c.think, "think", 50*time.Millisecond, "the most time between the reads and the writes")
	fs.DurationVar(&c.tick, "tick", 50*time.Millisecond, "the job's schedule")
	fs.DurationVar(&c.burn, "burn", time.Second, "how long SIGUSR1 burns the CPU")
	fs.Uint64Var(&c.seed, "seed", 0, "the random seed")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if c.id == "" || c.db == "" || c.dial == "" || c.history == "" || c.keys < 1 {
		return c, errors.New("worker: -id, -db, -dial, -history and -keys >= 1 are required")
	}
	return c, nil
}

// worker is one process of the torture test: a pglock client on its own pool.
type worker struct {
	cfg    workerConfig
	pool   *pgxpool.Pool
	client *pglock.Client
	h      *historyWriter
	rng    *rand.Rand // the lock loop's only
	ops    atomic.Int64
}

// runWorker runs a worker until SIGTERM or SIGINT, then shuts its client down cleanly.
func runWorker(args []string) error {
	cfg, err := parseWorkerFlags(args)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	pcfg, err := pgxpool.ParseConfig(cfg.db)
	if err != nil {
		return err
	}
	host, port, err := net.SplitHostPort(cfg.dial)
	if err != nil {
		return err
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return err
	}
	cc := pcfg.ConnConfig
	cc.Host, cc.Port, cc.TLSConfig, cc.Fallbacks = host, uint16(p), nil, nil
	cc.ConnectTimeout = 2 * time.Second
	cc.RuntimeParams["application_name"] = appName(cfg.id)
	pcfg.MaxConns = 6
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()

	h, err := openHistory(cfg.history, cfg.id)
	if err != nil {
		return err
	}
	w := &worker{cfg: cfg, pool: pool, h: h, rng: rand.New(rand.NewPCG(cfg.seed, 0x7047))}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	w.client, err = pglock.New(pool, pglock.WithTTL(cfg.ttl), pglock.WithInstanceName(cfg.id),
		pglock.WithLogger(logger), pglock.WithEventHandler(w.event))
	if err != nil {
		return errors.Join(err, h.close())
	}
	h.add(Record{Type: typeEvent, F: fStart, Reason: "pid " + strconv.Itoa(os.Getpid())})

	err = w.run(ctx)
	closeCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = errors.Join(err, w.client.Close(closeCtx))
	h.add(Record{Type: typeEvent, F: fStop})
	return errors.Join(err, h.close())
}

func appName(id string) string { return "pglock-torture/" + id }

// run starts the election, the job's ticks, the lock loop and the CPU burner, until
// ctx ends.
func (w *worker) run(ctx context.Context) error {
	if _, err := w.client.Elect(leaderKey, pglock.Leader{OnAcquired: w.onAcquired, OnLost: w.onLost}); err != nil {
		return err
	}
	job, err := w.client.Job(jobKey, w.tickRun, pglock.OnOneInstance())
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	wg.Go(func() { w.ticks(ctx, job) })
	wg.Go(func() { w.burner(ctx) })
	w.lockLoop(ctx)
	wg.Wait()
	return nil
}

func (w *worker) op() string {
	return w.cfg.id + "-" + strconv.FormatInt(w.ops.Add(1), 10)
}

// event records the client's lock events: the holder's own view of every lock it
// took, kept and lost, with the time the client emitted it.
func (w *worker) event(ev pglock.Event) {
	switch ev.Type {
	case pglock.EventAcquired, pglock.EventReleased, pglock.EventLost:
		w.h.add(Record{Type: typeEvent, F: string(ev.Type), Key: ev.Key, Owner: ev.Owner, Token: ev.Token,
			Reason: ev.Reason, Local: ev.Time})
	}
}

// lockLoop takes one of the keys, does a read-modify-write of that key's counter in
// the three tables under the lock, and releases it, until ctx ends.
func (w *worker) lockLoop(ctx context.Context) {
	for ctx.Err() == nil {
		key := "k" + strconv.Itoa(w.rng.IntN(w.cfg.keys))
		start := time.Now()
		w.h.add(Record{Type: typeInvoke, F: fAcquire, Key: key, Local: start})
		l, err := w.client.Acquire(ctx, key, pglock.Wait(5*w.cfg.ttl))
		if err != nil {
			w.h.add(Record{Type: typeFail, F: fAcquire, Key: key, Start: start, Err: err.Error()})
			if !errors.Is(err, pglock.ErrNotAcquired) {
				sleep(ctx, 50*time.Millisecond) // the database is away: don't spin
			}
			continue
		}
		w.h.add(Record{Type: typeOK, F: fAcquire, Key: key, Owner: l.Owner(), Token: l.Token(), Start: start})
		unwatch := context.AfterFunc(l.Context(), func() {
			if cause := context.Cause(l.Context()); errors.Is(cause, pglock.ErrLockLost) {
				w.h.add(Record{Type: typeEvent, F: fCtxLost, Key: key, Owner: l.Owner(), Token: l.Token(), Reason: cause.Error()})
			}
		})
		w.critical(l)
		w.h.add(Record{Type: typeInvoke, F: fRelease, Key: key, Owner: l.Owner(), Token: l.Token()})
		if err := l.Release(ctx); err != nil {
			r := Record{Type: typeFail, F: fRelease, Key: key, Owner: l.Owner(), Token: l.Token(), Err: err.Error()}
			var lost *pglock.LockLostError
			if errors.As(err, &lost) {
				r.Reason = lost.Reason
			}
			w.h.add(r)
		} else {
			w.h.add(Record{Type: typeOK, F: fRelease, Key: key, Owner: l.Owner(), Token: l.Token()})
		}
		unwatch()
	}
}

// rmw is one table's read-modify-write in a critical section.
type rmw struct {
	table string
	op    string
	value int64 // read
}

// critical reads key's counter in each table (in a random order), thinks, and writes
// value+1 to each (in another random order). A pause anywhere in the think time
// leaves three stale writes to land after a successor's.
func (w *worker) critical(l *pglock.Lock) {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	var done []rmw
	for _, i := range w.rng.Perm(len(counterTables)) {
		if r, ok := w.read(ctx, l, counterTables[i]); ok {
			done = append(done, r)
		}
	}
	sleep(ctx, time.Duration(w.rng.Int64N(int64(w.cfg.think)+1)))
	w.rng.Shuffle(len(done), func(i, j int) { done[i], done[j] = done[j], done[i] })
	for _, r := range done {
		w.write(ctx, l, r)
	}
}

func (w *worker) read(ctx context.Context, l *pglock.Lock, table string) (rmw, bool) {
	r := rmw{table: table, op: w.op()}
	q, args := "SELECT value, clock_timestamp() FROM torture."+table+" WHERE key = $1", []any{l.Key()}
	if table == tableColumn {
		// The claim: a column fence alone refuses only writes older than the row's last
		// one, so the reader records its token first (see fencing_test.go).
		var err error
		q, args, err = pglock.FenceUpdate("UPDATE torture.column_fenced SET value = value WHERE key = $1 RETURNING value, clock_timestamp()",
			"token", l.Token(), l.Key())
		if err != nil {
			panic(err) // a constant query: a bug
		}
	}
	w.h.add(Record{Type: typeInvoke, F: fRead, Table: table, Key: l.Key(), Op: r.op, Token: l.Token()})
	var at time.Time
	err := w.pool.QueryRow(ctx, q, args...).Scan(&r.value, &at)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		w.h.add(Record{Type: typeFail, F: fRead, Table: table, Key: l.Key(), Op: r.op, Token: l.Token(), Reason: "claim refused"})
		return r, false
	case err != nil:
		w.h.add(Record{Type: typeUnknown, F: fRead, Table: table, Key: l.Key(), Op: r.op, Token: l.Token(), Err: err.Error()})
		return r, false
	}
	w.h.add(Record{Type: typeOK, F: fRead, Table: table, Key: l.Key(), Op: r.op, Token: l.Token(), Read: r.value, DB: at})
	return r, true
}

func (w *worker) write(ctx context.Context, l *pglock.Lock, r rmw) {
	const update = "UPDATE torture.%s SET value = $1, token = $2, op = $3 WHERE key = $4 RETURNING clock_timestamp()"
	q, args := fmt.Sprintf(update, r.table), []any{r.value + 1, l.Token(), r.op, l.Key()}
	var err error
	switch r.table {
	case tableColumn:
		q, args, err = pglock.FenceUpdate("UPDATE torture.column_fenced SET value = $1, op = $2 WHERE key = $3 RETURNING clock_timestamp()",
			"token", l.Token(), r.value+1, r.op, l.Key())
	case tableLock:
		q, args, err = pglock.FenceHeld(q, l.Key(), l.Token(), args...)
	}
	if err != nil {
		panic(err) // constant queries: a bug
	}
	base := Record{F: fWrite, Table: r.table, Key: l.Key(), Op: r.op, Token: l.Token(), Read: r.value, Wrote: r.value + 1}
	w.h.add(with(base, typeInvoke, time.Time{}, nil))
	w.h.add(w.exec(ctx, base, q, args))
}

// exec runs a write that returns its clock_timestamp() and gives base's completion:
// ok, fail (the fence refused it: no row) or unknown (an error: it may have landed).
func (w *worker) exec(ctx context.Context, base Record, q string, args []any) Record {
	var at time.Time
	err := w.pool.QueryRow(ctx, q, args...).Scan(&at)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return with(base, typeFail, at, nil)
	case err != nil:
		return with(base, typeUnknown, at, err)
	}
	return with(base, typeOK, at, nil)
}

func with(r Record, typ string, db time.Time, err error) Record {
	r.Type, r.DB = typ, db
	if err != nil {
		r.Err = err.Error()
	}
	return r
}

type tickKey struct{}

// ticks runs the job on every multiple of the tick on the wall clock, the same
// schedule in every worker, so a tick's number names it across workers. Missed ticks
// are not caught up.
func (w *worker) ticks(ctx context.Context, job *pglock.Job) {
	for {
		next := time.Now().Truncate(w.cfg.tick).Add(w.cfg.tick)
		if !sleep(ctx, time.Until(next)) {
			return
		}
		n := next.UnixNano() / int64(w.cfg.tick)
		if err := job.Run(context.WithValue(ctx, tickKey{}, n)); err != nil && ctx.Err() == nil {
			w.h.add(Record{Type: typeFail, F: fTick, Wrote: n, Err: err.Error()})
		}
	}
}

// tickRun is the job: it records the tick in the job's row, fenced by its lease.
func (w *worker) tickRun(ctx context.Context) error {
	n, _ := ctx.Value(tickKey{}).(int64)
	l, ok := pglock.FromContext(ctx)
	if !ok {
		return errors.New("torture: the job's ctx carries no lock")
	}
	op := w.op()
	q, args, err := pglock.FenceHeld("UPDATE torture.job SET value = $1, token = $2, op = $3 WHERE key = 'tick' RETURNING clock_timestamp()",
		l.Key(), l.Token(), n, l.Token(), op)
	if err != nil {
		return err
	}
	base := Record{F: fTick, Key: l.Key(), Op: op, Owner: l.Owner(), Token: l.Token(), Wrote: n}
	w.h.add(with(base, typeInvoke, time.Time{}, nil))
	octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
	defer cancel()
	w.h.add(w.exec(octx, base, q, args))
	return nil
}

func (w *worker) onAcquired(ctx context.Context, l *pglock.Lock) error {
	w.h.add(Record{Type: typeEvent, F: fLead, Key: l.Key(), Owner: l.Owner(), Token: l.Token()})
	context.AfterFunc(ctx, func() {
		w.h.add(Record{Type: typeEvent, F: fUnlead, Key: l.Key(), Owner: l.Owner(), Token: l.Token(),
			Reason: context.Cause(ctx).Error()})
	})
	return nil // lead until ctx ends
}

func (w *worker) onLost(l *pglock.Lock) {
	w.h.add(Record{Type: typeEvent, F: fOnLost, Key: l.Key(), Owner: l.Owner(), Token: l.Token()})
}

// burner slows the worker's event loop on SIGUSR1: one spinning goroutine per P for
// the burn duration, so the scheduler, the renewer's timers included, runs late.
func (w *worker) burner(ctx context.Context) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR1)
	defer signal.Stop(sig)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-sig:
		}
		w.h.add(Record{Type: typeEvent, F: fSlow, Reason: w.cfg.burn.String()})
		until := time.Now().Add(w.cfg.burn)
		for range runtime.GOMAXPROCS(0) {
			wg.Go(func() {
				for x := uint64(1); time.Now().Before(until) && ctx.Err() == nil; {
					for range 1 << 16 {
						x = x*6364136223846793005 + 1442695040888963407
					}
				}
			})
		}
	}
}

// sleep waits d or until ctx ends, and reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
