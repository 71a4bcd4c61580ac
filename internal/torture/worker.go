package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
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
	dial    string // host:port of the worker's proxy; one per host of db, in its order
	history string
	keys    int
	permits int // the semaphore's
	ttl     time.Duration
	think   time.Duration
	tick    time.Duration
	burn    time.Duration
	seed    uint64
	mutate  string // an old behaviour to restore, to show the checker catches it (see mutations)
	readyFD int    // a pipe to close once SIGTERM and SIGUSR1 are handled; 0 for none
}

func (c workerConfig) args() []string {
	return []string{"worker", "-id", c.id, "-db", c.db, "-dial", c.dial, "-history", c.history,
		"-keys", strconv.Itoa(c.keys), "-permits", strconv.Itoa(c.permits), "-ttl", c.ttl.String(), "-think", c.think.String(),
		"-tick", c.tick.String(), "-burn", c.burn.String(), "-seed", strconv.FormatUint(c.seed, 10), "-mutate", c.mutate,
		"-ready-fd", strconv.Itoa(c.readyFD)}
}

func parseWorkerFlags(args []string) (workerConfig, error) {
	var c workerConfig
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.StringVar(&c.id, "id", "", "the worker's id, its pglock instance name")
	fs.StringVar(&c.db, "db", "", "the database URL")
	fs.StringVar(&c.dial, "dial", "", "host:port to connect to instead of the URL's (the proxy); a comma-separated list, one per host of the URL, in its order")
	fs.StringVar(&c.history, "history", "", "the history file")
	fs.IntVar(&c.keys, "keys", 3, "the number of lock keys")
	fs.IntVar(&c.permits, "permits", 2, "the semaphore's permits")
	fs.DurationVar(&c.ttl, "ttl", time.Second, "the locks' ttl")
	fs.DurationVar(&c.think, "think", 50*time.Millisecond, "the most time between the reads and the writes")
	fs.DurationVar(&c.tick, "tick", 50*time.Millisecond, "the job's schedule")
	fs.DurationVar(&c.burn, "burn", time.Second, "how long SIGUSR1 burns the CPU")
	fs.Uint64Var(&c.seed, "seed", 0, "the random seed")
	fs.StringVar(&c.mutate, "mutate", "", "an old behaviour to restore (see -mutate of the controller)")
	fs.IntVar(&c.readyFD, "ready-fd", 0, "a file descriptor to close once the worker handles SIGTERM and SIGUSR1")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if c.id == "" || c.db == "" || c.dial == "" || c.history == "" || c.keys < 1 || c.permits < 1 {
		return c, errors.New("worker: -id, -db, -dial, -history, -keys >= 1 and -permits >= 1 are required")
	}
	if err := checkMutation(c.mutate); err != nil {
		return c, err
	}
	return c, nil
}

// worker is one process of the torture test: a pglock client on its own pool.
type worker struct {
	cfg    workerConfig
	pool   *pgxpool.Pool
	client *pglock.Client
	h      *historyWriter
	slow   <-chan os.Signal // SIGUSR1: burn the CPU
	rng    *rand.Rand       // the lock loop's only
	sem    *pglock.Semaphore
	ops    atomic.Int64
	// inSection is the lock of the WithLock section running now, if any: the one the
	// old-close mutation hands back under it.
	inSection atomic.Pointer[pglock.Lock]
	// ran is the tick the job last ran, set by tickRun on the ticks goroutine (Run calls
	// the job on its caller's goroutine).
	ran int64
	// slotMu guards the at-least-once slot job's rng: its retries run on goroutines of
	// the client's.
	slotMu sync.Mutex
}

// runWorker runs a worker until SIGTERM or SIGINT, then shuts its client down cleanly.
func runWorker(args []string) error {
	cfg, err := parseWorkerFlags(args)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	slow := make(chan os.Signal, 1)
	signal.Notify(slow, syscall.SIGUSR1)
	defer signal.Stop(slow)
	// Until now SIGTERM and SIGUSR1 killed the process: the controller sends neither
	// before this pipe closes.
	if cfg.readyFD > 0 {
		if err := os.NewFile(uintptr(cfg.readyFD), "ready").Close(); err != nil {
			return fmt.Errorf("worker: -ready-fd: %w", err)
		}
	}

	pcfg, err := pgxpool.ParseConfig(cfg.db)
	if err != nil {
		return err
	}
	cc := pcfg.ConnConfig
	if err := dialThrough(&cc.Config, cfg.dial); err != nil {
		return err
	}
	cc.ConnectTimeout = 2 * time.Second
	cc.RuntimeParams["application_name"] = appName(cfg.id)
	// One connection per loop that runs statements (the lock loop, whose fenced
	// transaction holds one, the semaphore loop, the two-ttl pair, the probes, the
	// ticks), and room for the client's renewals and hand-backs.
	pcfg.MaxConns = 7
	h, err := openHistory(cfg.history, cfg.id)
	if err != nil {
		return err
	}
	cc.Tracer = &callTracer{h: h}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return errors.Join(err, h.close())
	}
	defer pool.Close()
	stallCtx, stopStalls := context.WithCancel(context.Background())
	stalls := make(chan struct{})
	go func() {
		defer close(stalls)
		watchStalls(stallCtx, func(due, ran time.Time) { h.add(Record{Type: typeEvent, F: fStall, Start: due, Local: ran}) })
	}()
	closeHistory := func() error {
		stopStalls()
		<-stalls
		return h.close()
	}
	w := &worker{cfg: cfg, pool: pool, h: h, slow: slow, rng: rand.New(rand.NewPCG(cfg.seed, 0x7047))}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	w.client, err = pglock.New(pool, pglock.TTL(cfg.ttl), pglock.WithInstanceName(cfg.id),
		pglock.WithLogger(logger), pglock.WithEventHandler(w.event))
	if err != nil {
		return errors.Join(err, closeHistory())
	}
	h.add(Record{Type: typeEvent, F: fStart, Reason: "pid " + strconv.Itoa(os.Getpid())})

	err = w.run(ctx)
	h.add(Record{Type: typeEvent, F: fStop})
	return errors.Join(err, closeHistory())
}

func appName(id string) string { return "pglock-torture/" + id }

// closeTimeout bounds the worker's Client.Close.
const closeTimeout = 10 * time.Second

// run starts the election, the job's ticks, the lock loop, the semaphore loop, the
// two-ttl holder, the probes and the CPU burner. When ctx ends it closes the client while they still run,
// as a service does on SIGTERM (a WithLock section may be half done: Close must wait
// for it), then waits for them.
func (w *worker) run(ctx context.Context) error {
	if _, err := w.client.Elect(leaderKey, pglock.LeaderCallbacks{OnAcquired: w.onAcquired, OnLost: w.onLost}); err != nil {
		return errors.Join(err, w.close(ctx))
	}
	job, err := w.client.Job(jobKey, w.tickRun, pglock.OnOneInstance())
	if err != nil {
		return errors.Join(err, w.close(ctx))
	}
	if w.sem, err = w.client.Semaphore(semKey, w.cfg.permits); err != nil {
		return errors.Join(err, w.close(ctx))
	}
	once, atLeast, err := w.slotJobs()
	if err != nil {
		return errors.Join(err, w.close(ctx))
	}
	var wg sync.WaitGroup
	wg.Go(func() { w.ticks(ctx, job) })
	wg.Go(func() { w.slotTicks(ctx, once, atLeast) })
	wg.Go(func() { w.burner(ctx) })
	wg.Go(func() { w.lockLoop(ctx) })
	wg.Go(func() { w.semLoop(ctx) })
	wg.Go(func() { w.twoTTLs(ctx) })
	wg.Go(func() { w.probes(ctx) })
	<-ctx.Done()
	w.mutateOnClose()
	err = w.close(ctx)
	wg.Wait()
	return err
}

func (w *worker) close(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
	defer cancel()
	return w.client.Close(ctx)
}

// mutateOnClose, under the old-close mutation, hands back the key of the WithLock
// section in progress, as Close did before it waited for the section to return.
func (w *worker) mutateOnClose() {
	l := w.inSection.Load()
	if w.cfg.mutate != mutOldClose || l == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	var ok bool
	err := w.pool.QueryRow(ctx, "SELECT pglock.lock_release($1, $2)", rowKey(l), l.Owner()).Scan(&ok)
	w.h.add(with(Record{Type: typeEvent, F: fMutate, Key: rowKey(l), Owner: l.Owner(), Token: l.Token(),
		Reason: mutOldClose + ": handed back under a running section: " + strconv.FormatBool(ok)}, typeEvent, time.Time{}, err))
}

func (w *worker) op() string {
	return w.cfg.id + "-" + strconv.FormatInt(w.ops.Add(1), 10)
}

// event records the client's lock events: the holder's own view of every lock it
// took, kept and lost, with the time the client emitted it.
func (w *worker) event(ev pglock.Event) {
	switch ev.Type {
	case pglock.EventAcquired, pglock.EventReleased, pglock.EventLost:
		w.h.add(Record{Type: typeEvent, F: string(ev.Type), Key: permitRowKey(ev.Key, ev.Permit), Owner: ev.Owner, Token: ev.Token,
			Reason: string(ev.LostReason), Local: ev.Time})
	case pglock.EventJobSkipped:
		w.h.add(Record{Type: typeEvent, F: fSkipped, Key: ev.Key, Reason: string(ev.SkipReason), Local: ev.Time})
	case pglock.EventRenewal:
		r := Record{Type: typeEvent, F: fRenewal, Start: ev.Time.Add(-ev.Duration), Local: ev.Time}
		if ev.Err != nil {
			r.Err = ev.Err.Error()
		}
		w.h.add(r)
	}
}

// lockLoop takes one of the keys and does read-modify-writes of that key's counter in
// the three tables under the lock, until ctx ends: with Acquire and Release, or in a
// WithLock section; and every 4 to 8 ttl in a fenced transaction held open past the ttl.
func (w *worker) lockLoop(ctx context.Context) {
	longTx := time.Now().Add(between(w.rng, 2*w.cfg.ttl, 6*w.cfg.ttl))
	for ctx.Err() == nil {
		key := "k" + strconv.Itoa(w.rng.IntN(w.cfg.keys))
		switch {
		case time.Now().After(longTx):
			w.longTx(ctx, key)
			longTx = time.Now().Add(between(w.rng, 4*w.cfg.ttl, 8*w.cfg.ttl))
		case w.rng.IntN(2) == 0:
			w.withLock(ctx, w.rng, key, func(ctx context.Context, fn func(context.Context) error) error {
				return w.client.WithLock(ctx, key, fn, pglock.Wait(5*w.cfg.ttl))
			})
		default:
			w.acquireRelease(ctx, w.rng, key, func() (*pglock.Lock, error) {
				return w.client.Acquire(ctx, key, pglock.Wait(5*w.cfg.ttl))
			})
		}
	}
}

// acquire takes key with Acquire and records the attempt.
func (w *worker) acquire(ctx context.Context, key string, opts ...pglock.AcquireOption) (*pglock.Lock, error) {
	return w.take(ctx, key, func() (*pglock.Lock, error) { return w.client.Acquire(ctx, key, opts...) })
}

// take records an acquisition of key (a lock's, or a semaphore's) by acquire: its
// completion names the lock by its row key (rowKey).
func (w *worker) take(ctx context.Context, key string, acquire func() (*pglock.Lock, error)) (*pglock.Lock, error) {
	start := time.Now()
	w.h.add(Record{Type: typeInvoke, F: fAcquire, Key: key, Local: start})
	l, err := acquire()
	if err != nil {
		w.acquireFailed(ctx, key, start, err)
		return nil, err
	}
	w.h.add(Record{Type: typeOK, F: fAcquire, Key: rowKey(l), Owner: l.Owner(), Token: l.Token(), Start: start})
	return l, nil
}

func (w *worker) acquireFailed(ctx context.Context, key string, start time.Time, err error) {
	w.h.add(Record{Type: typeFail, F: fAcquire, Key: key, Start: start, Err: err.Error()})
	if !errors.Is(err, pglock.ErrNotAcquired) {
		sleep(ctx, 50*time.Millisecond) // the database is away: don't spin
	}
}

// release gives l back and records it.
func (w *worker) release(l *pglock.Lock) {
	w.h.add(Record{Type: typeInvoke, F: fRelease, Key: rowKey(l), Owner: l.Owner(), Token: l.Token()})
	w.h.add(released(l, l.Release(context.Background())))
}

// released is the completion record of l's release, which returned err.
func released(l *pglock.Lock, err error) Record {
	r := Record{Type: typeOK, F: fRelease, Key: rowKey(l), Owner: l.Owner(), Token: l.Token()}
	if err != nil {
		r.Type, r.Err = typeFail, err.Error()
		var lost *pglock.LockLostError
		if errors.As(err, &lost) {
			r.Reason = string(lost.Reason)
		}
	}
	return r
}

// watch records when l's Context is cancelled for a loss (a *LockLostError): the
// moment the holder learns of it, which the checker holds against the lease's expiry.
func (w *worker) watch(l *pglock.Lock) (stop func() bool) {
	return context.AfterFunc(l.Context(), func() { w.lostCtx(l) })
}

func (w *worker) lostCtx(l *pglock.Lock) {
	if cause := context.Cause(l.Context()); errors.Is(cause, pglock.ErrLockLost) {
		w.h.add(Record{Type: typeEvent, F: fCtxLost, Key: rowKey(l), Owner: l.Owner(), Token: l.Token(), Reason: cause.Error()})
	}
}

// acquireRelease is a critical section between an acquisition of key (a lock's, or a
// semaphore's) by acquire and Release.
func (w *worker) acquireRelease(ctx context.Context, rng *rand.Rand, key string, acquire func() (*pglock.Lock, error)) {
	l, err := w.take(ctx, key, acquire)
	if err != nil {
		return
	}
	unwatch := w.watch(l)
	w.critical(rng, l)
	w.release(l)
	unwatch()
}

// withLock runs a section (see section) under key (a lock's, or a semaphore's) by run:
// WithLock, or WithPermit. Its ctx is not the worker's: only Close, or a loss, cancels
// the section, as in a service whose work in hand outlives the signal that starts its
// shutdown.
func (w *worker) withLock(ctx context.Context, rng *rand.Rand, key string, run func(ctx context.Context, fn func(context.Context) error) error) {
	start := time.Now()
	w.h.add(Record{Type: typeInvoke, F: fAcquire, Key: key, Local: start})
	var (
		l       *pglock.Lock
		unwatch = func() bool { return false }
	)
	err := run(context.WithoutCancel(ctx), func(ctx context.Context) error {
		l, _ = pglock.FromContext(ctx)
		w.h.add(Record{Type: typeOK, F: fAcquire, Key: rowKey(l), Owner: l.Owner(), Token: l.Token(), Start: start})
		unwatch = w.watch(l)
		w.section(ctx, rng, l)
		return nil
	})
	if l == nil {
		w.acquireFailed(ctx, key, start, err)
		return
	}
	w.h.add(released(l, err))
	unwatch()
}

// section is a WithLock function: one to three read-modify-writes. When its ctx is
// cancelled on the way (Close, a loss), it records why and goes on working for ttl/5 to
// ttl/3 more, as a function finishing the work in hand does before it returns; the
// fences refuse its writes once the lock is gone. The lock must not be handed back
// before it returns (invariant 2): its last record is the section's end.
func (w *worker) section(ctx context.Context, rng *rand.Rand, l *pglock.Lock) {
	base := Record{F: fSection, Key: rowKey(l), Owner: l.Owner(), Token: l.Token()}
	w.h.add(with(base, typeInvoke, time.Time{}, nil))
	w.inSection.Store(l)
	for range 1 + rng.IntN(3) {
		if ctx.Err() != nil {
			break
		}
		w.critical(rng, l)
	}
	if ctx.Err() != nil {
		cause := context.Cause(ctx)
		r := with(base, typeEvent, time.Time{}, cause)
		r.F, r.Reason = fCancel, causeKind(cause)
		w.h.add(r)
		for until := time.Now().Add(between(rng, w.cfg.ttl/5, w.cfg.ttl/3)); time.Now().Before(until); {
			w.critical(rng, l)
		}
	}
	w.inSection.CompareAndSwap(l, nil) // the other loop's section may have taken its place
	w.h.add(with(base, typeOK, time.Time{}, nil))
	w.h.add(Record{Type: typeInvoke, F: fRelease, Key: rowKey(l), Owner: l.Owner(), Token: l.Token()}) // WithLock's (WithPermit's), next
}

// Why a WithLock section's ctx was cancelled, in the Reason of its fCancel record.
const (
	cancelClosed = "closed" // errors.Is(cause, pglock.ErrClosed): Close
	cancelLost   = "lost"   // a *LockLostError
	cancelOther  = "other"
)

func causeKind(cause error) string {
	switch {
	case errors.Is(cause, pglock.ErrClosed):
		return cancelClosed
	case errors.Is(cause, pglock.ErrLockLost):
		return cancelLost
	}
	return cancelOther
}

// longTx holds a lock of its own, then key's, and writes key's lock-fenced counter in a
// transaction kept open for 1.2 to 1.6 ttl after its FenceHeld write (whose row lock on
// key's lock row lasts as long). The client must go on renewing both locks meanwhile:
// a transaction of its own may not cost it a lock (invariant 7).
func (w *worker) longTx(ctx context.Context, key string) {
	other, err := w.acquire(ctx, "other/"+w.cfg.id, pglock.Wait(w.cfg.ttl))
	if err != nil {
		return
	}
	unwatchOther := w.watch(other)
	defer func() {
		w.release(other)
		unwatchOther()
	}()
	l, err := w.acquire(ctx, key, pglock.Wait(5*w.cfg.ttl))
	if err != nil {
		return
	}
	unwatch := w.watch(l)
	defer func() {
		w.release(l)
		unwatch()
	}()
	op := w.op()
	for _, x := range []*pglock.Lock{l, other} {
		w.h.add(Record{Type: typeInvoke, F: fLongTx, Op: op, Key: x.Key(), Owner: x.Owner(), Token: x.Token()})
	}
	hold := between(w.rng, 6*w.cfg.ttl/5, 8*w.cfg.ttl/5)
	w.fencedTx(l, other, hold)
	w.h.add(Record{Type: typeOK, F: fLongTx, Op: op, Key: l.Key(), Owner: l.Owner(), Token: l.Token(),
		Reason: "open for " + hold.Round(time.Millisecond).String() + " after the write"})
}

// fencedTx reads l's lock-fenced counter and writes it +1 with FenceHeld in one
// transaction, which it keeps open for hold before it commits.
func (w *worker) fencedTx(l, other *pglock.Lock, hold time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout+hold)
	defer cancel()
	r := rmw{table: tableLock, op: w.op()}
	read := Record{F: fRead, Table: r.table, Key: l.Key(), Op: r.op, Token: l.Token()}
	w.h.add(with(read, typeInvoke, time.Time{}, nil))
	tx, err := w.pool.Begin(ctx)
	if err != nil {
		w.h.add(with(read, typeUnknown, time.Time{}, err))
		return
	}
	defer func() { _ = tx.Rollback(ctx) }() // after the commit, a no-op
	var at time.Time
	if err := tx.QueryRow(ctx, "SELECT value, clock_timestamp() FROM torture.lock_fenced WHERE key = $1", l.Key()).Scan(&r.value, &at); err != nil {
		w.h.add(with(read, typeUnknown, time.Time{}, err))
		return
	}
	read.Read = r.value
	w.h.add(with(read, typeOK, at, nil))
	if w.cfg.mutate == mutOldRenewal {
		// What the old batched renewal waited on: the transaction's row locks on the
		// rows of the client's locks.
		if _, err := tx.Exec(ctx, "SELECT 1 FROM pglock.locks WHERE key = ANY($1) FOR SHARE", []string{l.Key(), other.Key()}); err != nil {
			w.h.add(Record{Type: typeEvent, F: fMutate, Key: l.Key(), Token: l.Token(), Reason: mutOldRenewal, Err: err.Error()})
			return
		}
	}
	q, args, err := pglock.FenceHeld("UPDATE torture.lock_fenced SET value = $1, token = $2, op = $3 WHERE key = $4 RETURNING clock_timestamp()",
		l.Key(), l.Token(), r.value+1, l.Token(), r.op, l.Key())
	if err != nil {
		panic(err) // a constant query: a bug
	}
	base := Record{F: fWrite, Table: r.table, Key: l.Key(), Op: r.op, Token: l.Token(), Read: r.value, Wrote: r.value + 1}
	w.h.add(with(base, typeInvoke, time.Time{}, nil))
	switch err := tx.QueryRow(ctx, q, args...).Scan(&at); {
	case errors.Is(err, pgx.ErrNoRows):
		w.h.add(with(base, typeFail, time.Time{}, nil))
		return
	case err != nil:
		w.h.add(with(base, typeUnknown, time.Time{}, err))
		return
	}
	sleep(ctx, hold)
	if err := tx.Commit(ctx); err != nil {
		w.h.add(with(base, typeUnknown, at, err))
		return
	}
	w.h.add(with(base, typeOK, at, nil))
}

// twoTTLs holds, again and again for 2 to 4 ttl, a lock of the client's ttl and one of
// twice it. When the link goes silent (a partition), each must be given up by its own
// deadline: the short one's ctx is not to wait for the long one's renewal (invariant 3).
func (w *worker) twoTTLs(ctx context.Context) {
	rng := rand.New(rand.NewPCG(w.cfg.seed, 2))
	for ctx.Err() == nil {
		short, err := w.acquire(ctx, "short/"+w.cfg.id, pglock.TTL(w.cfg.ttl), pglock.Wait(2*w.cfg.ttl))
		if err != nil {
			continue
		}
		// Watched from the start: it may be lost while the long one is being taken.
		unwatchShort := func() bool { return false }
		if w.cfg.mutate != mutOldDeadline {
			unwatchShort = w.watch(short)
		}
		long, err := w.acquire(ctx, "long/"+w.cfg.id, pglock.TTL(2*w.cfg.ttl), pglock.Wait(3*w.cfg.ttl))
		if err == nil {
			if w.cfg.mutate == mutOldDeadline {
				unwatchShort = w.watchShort(short, long)
			}
			unwatchLong := w.watch(long)
			sleep(ctx, between(rng, 2*w.cfg.ttl, 4*w.cfg.ttl))
			w.release(long)
			unwatchLong()
		}
		w.release(short)
		unwatchShort()
	}
}

// watchShort watches the short lock of twoTTLs under the old-deadline mutation: its
// loss is recorded only once the long lock's ctx has ended too, as when the old
// renewer's call for the long lock held up the short one's deadline.
func (w *worker) watchShort(short, long *pglock.Lock) (stop func() bool) {
	return context.AfterFunc(short.Context(), func() {
		<-long.Context().Done()
		w.lostCtx(short)
	})
}

// probeTimeout bounds a probe: shorter than the delay fault's smallest delay, so that
// under it every probe gives up while its statement is on the wire.
func probeTimeout(ttl time.Duration) time.Duration { return ttl / 50 }

// probes tries, every ttl/8 to ttl/2, a key of its own (always free; half the time),
// one of the keys or the semaphore with TryAcquire on a ctx of probeTimeout. Through a slow link the ctx ends with
// the statement in flight, and the database may grant the key all the same: the client
// must hand back whatever it may have been granted (invariant 8).
func (w *worker) probes(ctx context.Context) {
	rng := rand.New(rand.NewPCG(w.cfg.seed, 3))
	for sleep(ctx, between(rng, w.cfg.ttl/8, w.cfg.ttl/2)) {
		key := "probe/" + w.cfg.id
		switch rng.IntN(4) {
		case 0:
			key = "k" + strconv.Itoa(rng.IntN(w.cfg.keys))
		case 1:
			key = semKey
		}
		w.probe(ctx, key)
	}
}

func (w *worker) probe(ctx context.Context, key string) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout(w.cfg.ttl))
	defer cancel()
	start := time.Now()
	w.h.add(Record{Type: typeInvoke, F: fProbe, Key: key, Local: start})
	var (
		l   *pglock.Lock
		err error
	)
	switch {
	case key == semKey:
		l, err = w.sem.TryAcquire(ctx)
	case w.cfg.mutate == mutOldAcquire:
		w.probeSQL(ctx, key, start)
		return
	default:
		l, err = w.client.TryAcquire(ctx, key)
	}
	if err != nil {
		w.h.add(Record{Type: typeFail, F: fProbe, Key: key, Start: start, Err: err.Error()})
		return
	}
	w.h.add(Record{Type: typeOK, F: fProbe, Key: rowKey(l), Owner: l.Owner(), Token: l.Token(), Start: start})
	unwatch := w.watch(l)
	w.release(l)
	unwatch()
}

// probeSQL is a probe under the old-acquire mutation: pglock.lock_acquire called
// directly, handing nothing back when ctx ends first, as the old TryAcquire did.
func (w *worker) probeSQL(ctx context.Context, key string, start time.Time) {
	owner := w.cfg.id + "/probe-" + strconv.FormatInt(w.ops.Add(1), 10)
	var token *int64
	err := w.pool.QueryRow(ctx, "SELECT pglock.lock_acquire($1, $2, $3)", key, owner, w.cfg.ttl.Milliseconds()).Scan(&token)
	switch {
	case err != nil:
		w.h.add(Record{Type: typeFail, F: fProbe, Key: key, Owner: owner, Start: start, Err: err.Error()})
		return
	case token == nil:
		w.h.add(Record{Type: typeFail, F: fProbe, Key: key, Owner: owner, Start: start, Err: pglock.ErrNotAcquired.Error()})
		return
	}
	w.h.add(Record{Type: typeOK, F: fProbe, Key: key, Owner: owner, Token: *token, Start: start})
	base := Record{F: fRelease, Key: key, Owner: owner, Token: *token}
	w.h.add(with(base, typeInvoke, time.Time{}, nil))
	rctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	var ok bool
	if err := w.pool.QueryRow(rctx, "SELECT pglock.lock_release($1, $2)", key, owner).Scan(&ok); err != nil || !ok {
		w.h.add(with(base, typeFail, time.Time{}, err))
		return
	}
	w.h.add(with(base, typeOK, time.Time{}, nil))
}

// rmw is one table's read-modify-write in a critical section.
type rmw struct {
	table string
	op    string
	value int64 // read
}

// critical reads l's counter (the row of its row key) in each table (in a random
// order), thinks, and writes value+1 to each (in another random order). A pause
// anywhere in the think time leaves three stale writes to land after a successor's.
// A permit's holder writes only the fenced tables and thinks ttl/3 to 2 ttl/3: a
// permit is held long (renewed, and paused in its think time) for few writes.
func (w *worker) critical(rng *rand.Rand, l *pglock.Lock) {
	if l.Permit() > 0 {
		w.readThinkWrite(rng, l, []string{tableColumn, tableLock}, between(rng, w.cfg.ttl/3, 2*w.cfg.ttl/3))
		return
	}
	w.readThinkWrite(rng, l, counterTables, time.Duration(rng.Int64N(int64(w.cfg.think)+1)))
}

func (w *worker) readThinkWrite(rng *rand.Rand, l *pglock.Lock, tables []string, think time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout+think)
	defer cancel()
	var done []rmw
	for _, i := range rng.Perm(len(tables)) {
		if r, ok := w.read(ctx, l, tables[i]); ok {
			done = append(done, r)
		}
	}
	sleep(ctx, think)
	rng.Shuffle(len(done), func(i, j int) { done[i], done[j] = done[j], done[i] })
	for _, r := range done {
		w.write(ctx, l, r)
	}
}

func (w *worker) read(ctx context.Context, l *pglock.Lock, table string) (rmw, bool) {
	r := rmw{table: table, op: w.op()}
	row := rowKey(l)
	q, args := "SELECT value, clock_timestamp() FROM torture."+table+" WHERE key = $1", []any{row}
	if table == tableColumn {
		// The claim: a column fence alone refuses only writes older than the row's last
		// one, so the reader records its token first (see fencing_test.go).
		var err error
		q, args, err = pglock.FenceUpdate("UPDATE torture.column_fenced SET value = value WHERE key = $1 RETURNING value, clock_timestamp()",
			"token", l.Token(), row)
		if err != nil {
			panic(err) // a constant query: a bug
		}
	}
	w.h.add(Record{Type: typeInvoke, F: fRead, Table: table, Key: row, Op: r.op, Token: l.Token()})
	var at time.Time
	err := w.pool.QueryRow(ctx, q, args...).Scan(&r.value, &at)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		w.h.add(Record{Type: typeFail, F: fRead, Table: table, Key: row, Op: r.op, Token: l.Token(), Reason: "claim refused"})
		return r, false
	case err != nil:
		w.h.add(Record{Type: typeUnknown, F: fRead, Table: table, Key: row, Op: r.op, Token: l.Token(), Err: err.Error()})
		return r, false
	}
	w.h.add(Record{Type: typeOK, F: fRead, Table: table, Key: row, Op: r.op, Token: l.Token(), Read: r.value, DB: at})
	return r, true
}

func (w *worker) write(ctx context.Context, l *pglock.Lock, r rmw) {
	const update = "UPDATE torture.%s SET value = $1, token = $2, op = $3 WHERE key = $4 RETURNING clock_timestamp()"
	row := rowKey(l)
	q, args := fmt.Sprintf(update, r.table), []any{r.value + 1, l.Token(), r.op, row}
	var err error
	switch r.table {
	case tableColumn:
		q, args, err = pglock.FenceUpdate("UPDATE torture.column_fenced SET value = $1, op = $2 WHERE key = $3 RETURNING clock_timestamp()",
			"token", l.Token(), r.value+1, r.op, row)
	case tableLock:
		// A permit is fenced by its semaphore's key and its token.
		q, args, err = pglock.FenceHeld(q, l.Key(), l.Token(), args...)
	}
	if err != nil {
		panic(err) // constant queries: a bug
	}
	base := Record{F: fWrite, Table: r.table, Key: row, Op: r.op, Token: l.Token(), Read: r.value, Wrote: r.value + 1}
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
	var last int64
	for {
		next := time.Now().Truncate(w.cfg.tick).Add(w.cfg.tick)
		if !sleep(ctx, time.Until(next)) {
			return
		}
		// The tick is the one of the moment the timer fired, as a scheduler's run is
		// the run of the moment it starts: a worker paused on its way to a tick (or a
		// timer that fires late) runs a later tick, not the one it slept for, which
		// another worker may have run meanwhile. Missed ticks are not caught up.
		n := time.Now().UnixNano() / int64(w.cfg.tick)
		if n <= last { // the timer fired a moment early
			continue
		}
		last = n
		start := time.Now()
		err := job.Run(context.WithValue(ctx, tickKey{}, n))
		switch {
		case err != nil && ctx.Err() == nil:
			w.h.add(Record{Type: typeFail, F: fTick, Wrote: n, Err: err.Error()})
		case err == nil && w.ran != n: // skipped: its EventJobSkipped, emitted during the Run, says why
			w.h.add(Record{Type: typeEvent, F: fSkip, Wrote: n, Start: start, Local: time.Now()})
		}
	}
}

// tickRun is the job: it records the tick in the job's row, fenced by its lease.
func (w *worker) tickRun(ctx context.Context) error {
	n, _ := ctx.Value(tickKey{}).(int64)
	w.ran = n
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
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.slow:
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

// between draws a duration in [lo, hi).
func between(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(rng.Int64N(int64(hi-lo)))
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
