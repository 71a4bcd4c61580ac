package main

import (
	"bytes"
	"cmp"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/failover"
	"github.com/pgfence/pglock/internal/tcpproxy"
)

//go:embed schema.sql
var schemaSQL string

// The nemesis's faults.
const (
	faultPause     = "pause"     // SIGSTOP a worker (between a read and its write, or a lock holder, if there is one) for 2-4 ttl, then SIGCONT
	faultKill      = "kill"      // SIGKILL a worker and start a new one in its slot
	faultStop      = "stop"      // SIGTERM a worker in a WithLock section (Close), wait for it, start a new one
	faultTerminate = "terminate" // pg_terminate_backend every backend of one worker
	faultPartition = "partition" // black-hole a worker's proxy for 1-3 ttl, then restore
	faultDelay     = "delay"     // delay every chunk of a worker's proxy by ttl/20 to ttl/8 each way, for 1-3 ttl
	faultSlow      = "slow"      // SIGUSR1: a worker burns every P of its CPU for Config.Burn
	faultRestart   = "restart"   // restart PostgreSQL (Config.RestartCommand)
	faultFailover  = "failover"  // kill the primary, promote the standby, rebuild the old primary as the standby (Config.Failover)
)

// allFaults in the order reports list them.
var allFaults = []string{faultPause, faultKill, faultStop, faultTerminate, faultPartition, faultDelay, faultSlow, faultRestart, faultFailover}

// faultWeight is how often the nemesis picks each fault, relative to the others. A
// failover is not drawn: it comes on its own schedule (Config.FailoverEvery).
var faultWeight = map[string]int{faultPause: 3, faultKill: 2, faultStop: 2, faultTerminate: 2, faultPartition: 2,
	faultDelay: 2, faultSlow: 1, faultRestart: 1}

// The mutations: each restores in the workers an old behaviour of the library that the
// issue "Keep the lease's promise on every path" fixed (or, for count-then-take, a
// semaphore as it is often first written), so that a run (-mutate) shows the checker
// catches it.
const (
	mutOldClose    = "old-close"
	mutOldRenewal  = "old-renewal"
	mutOldAcquire  = "old-acquire"
	mutOldDeadline = "old-deadline"
	mutOldTokens   = "old-tokens"
)

// mutations lists what each mutation does, the invariant it must break, the fault that
// walks its path (none: the workers walk it on their own), and the replication a
// failover fault needs for it (Config.Failover).
var mutations = map[string]struct {
	What      string
	Invariant int
	Fault     string
	Failover  string
}{
	mutOldClose: {"on SIGTERM the worker hands back (pglock.lock_release) the key of the WithLock section in progress, " +
		"before Close, as Close did before it waited for the section to return", invOverlap, faultStop, ""},
	mutOldRenewal: {"the long fenced transaction also row-locks (FOR SHARE) the rows of both locks it holds, " +
		"which the old batched renewal waited on until its deadline", invRenew, "", ""},
	mutOldAcquire: {"probes call pglock.lock_acquire directly and hand nothing back when their ctx ends in flight, " +
		"as the old TryAcquire did", invGhost, faultDelay, ""},
	mutOldDeadline: {"the short lock's loss is seen (its ctx cancellation recorded) only once the long lock's ctx ends, " +
		"as when the old renewer's call for the long lock held up the short one's deadline", invSignal, faultPartition, ""},
	mutOldTokens: {"the run installs pglock.lock_acquire as migration 000011 left it (000012's down migration): tokens without " +
		"the timeline's floor, so that a promoted standby that lost the old primary's last acquisitions hands out their tokens again; " +
		"every asynchronous failover detaches the standby first", invCounters, faultFailover, failoverAsync},
	mutCountThenTake: {"the run installs a pglock.sem_acquire that counts the live holders and, if fewer than N, takes the lowest " +
		"free permit of 1 to 1000, with no turns on the semaphore's row (and 50 ms between the count and the take, a busy server): " +
		"two acquisitions that count at once both take a permit", invSemaphore, "", ""},
	mutSlotReclaim: {"the run installs a pglock.job_slot_claim that claims a slot another tick claimed once its lock is " +
		"free again (its run ended): a lock per tick, as gocron's lockers take, so that a tick that fires after the slot's " +
		"run ended runs it again", invSlots, "", ""},
}

// checkMutation returns an error for a mutation that does not exist.
func checkMutation(m string) error {
	if _, ok := mutations[m]; !ok && m != "" {
		return fmt.Errorf("torture: unknown mutation %q (want one of %s)", m, strings.Join(slices.Sorted(maps.Keys(mutations)), ","))
	}
	return nil
}

// Config is one run of the torture test.
type Config struct {
	Workers  int           `json:"workers"`
	Keys     int           `json:"keys"`
	Permits  int           `json:"permits,omitempty"` // the semaphore's; 0 in histories from before it
	TTL      time.Duration `json:"ttl"`
	Duration time.Duration `json:"duration"`
	Think    time.Duration `json:"think"` // the most a critical section waits between its reads and its writes
	Tick     time.Duration `json:"tick"`  // the OnOneInstance job's schedule
	Burn     time.Duration `json:"burn"`  // how long a slow fault burns the CPU
	Gap      time.Duration `json:"gap"`   // the most time between two faults
	// Slack is how late a running holder may be told of a loss, after its lease's
	// expiry on the database clock, before it counts as a violation: the scheduling
	// delay of a timer on a loaded machine. The holder's own deadline comes before the
	// expiry by the renewal's latency, which is less.
	Slack          time.Duration `json:"slack"`
	Seed           uint64        `json:"seed"`
	Faults         []string      `json:"faults"`           // enabled faults
	Mutate         string        `json:"mutate,omitempty"` // an old behaviour restored in the workers (mutations)
	RestartCommand string        `json:"restart_command,omitempty"`
	// Failover, sync or async, runs on a primary and a streaming standby of the run's
	// own (internal/failover) in that replication mode, reached through a multi-host
	// URL, and fails it over about every FailoverEvery (faultFailover).
	Failover      string        `json:"failover,omitempty"`
	FailoverEvery time.Duration `json:"failover_every,omitempty"`
	Started       time.Time     `json:"started"`
	Command       string        `json:"command,omitempty"` // how the run was started, for the report
	Note          string        `json:"note,omitempty"`    // what the report should say about the run's circumstances
	Server        string        `json:"server,omitempty"`  // PostgreSQL's version
	Host          string        `json:"host,omitempty"`    // the machine, for the report

	DatabaseURL string    `json:"-"`
	WorkerBin   string    `json:"-"` // this program, built
	Dir         string    `json:"-"` // where histories go
	Log         io.Writer `json:"-"` // progress
}

func (c *Config) check() error {
	switch {
	case c.Workers < 2:
		return errors.New("torture: want 2 workers or more")
	case c.Keys < 1:
		return errors.New("torture: want 1 key or more")
	case c.Permits < 1 || c.Permits > pglock.MaxPermits:
		return fmt.Errorf("torture: want 1 to %d permits", pglock.MaxPermits)
	case c.TTL < 100*time.Millisecond:
		return errors.New("torture: want a ttl of 100ms or more")
	case c.Duration <= 0 || c.Tick <= 0 || c.Think < 0 || c.Burn <= 0 || c.Gap <= 0 || c.Slack < 0:
		return errors.New("torture: durations must be positive")
	case (c.DatabaseURL == "") == (c.Failover == "") || c.WorkerBin == "" || c.Dir == "":
		return errors.New("torture: a database URL or a failover mode (not both), the worker binary and the directory are required")
	case c.Failover != "" && c.Failover != failoverSync && c.Failover != failoverAsync:
		return fmt.Errorf("torture: failover %q: want %s or %s", c.Failover, failoverSync, failoverAsync)
	case c.Failover != "" && c.FailoverEvery <= 0:
		return errors.New("torture: a failover mode needs a positive FailoverEvery")
	case (c.Failover != "") != slices.Contains(c.Faults, faultFailover):
		return errors.New("torture: the failover fault comes with a failover mode, and only with it")
	case c.Failover != "" && slices.Contains(c.Faults, faultRestart):
		return errors.New("torture: the restart fault restarts the system's server, not the failover pair's")
	}
	if m, ok := mutations[c.Mutate]; ok && m.Failover != "" && m.Failover != c.Failover {
		return fmt.Errorf("torture: mutation %s needs -failover %s", c.Mutate, m.Failover)
	}
	for _, f := range c.Faults {
		if !slices.Contains(allFaults, f) {
			return fmt.Errorf("torture: unknown fault %q (want some of %s)", f, strings.Join(allFaults, ","))
		}
	}
	if slices.Contains(c.Faults, faultRestart) && c.RestartCommand == "" {
		return errors.New("torture: the restart fault needs a restart command")
	}
	return checkMutation(c.Mutate)
}

// controller starts the workers, runs the nemesis, and gathers the history.
type controller struct {
	cfg   Config
	pool  *pgxpool.Pool // straight to the database, never through a proxy
	rng   *rand.Rand
	slots []*slot
	t0    time.Time

	cluster  *failover.Cluster // the primary and the standby of a failover run; nil otherwise
	timeline int               // the cluster's primary's

	mu        sync.Mutex
	lives     []*Life
	faults    []Fault
	stalls    []Stall
	waits     []Wait
	failovers []Failover
	lsns      []lsnSample // the primary's flushed WAL, sampled (failover runs)
}

// slot is a place for a worker: its proxies (one per server of the URL, in its order)
// outlive the worker's incarnations.
type slot struct {
	n       int
	proxies []*tcpproxy.Proxy
	inc     int
	cur     *proc
}

// addrs is the -dial list of the slot's worker: its proxies' addresses.
func (s *slot) addrs() string {
	var a []string
	for _, p := range s.proxies {
		a = append(a, p.Addr())
	}
	return strings.Join(a, ",")
}

func (s *slot) blackhole() {
	for _, p := range s.proxies {
		p.Blackhole()
	}
}

// heal lifts a partition and a delay.
func (s *slot) heal() {
	for _, p := range s.proxies {
		p.Restore()
	}
	s.delay(0)
}

func (s *slot) delay(d time.Duration) {
	for _, p := range s.proxies {
		p.SetDelay(tcpproxy.ToServer, d)
		p.SetDelay(tcpproxy.ToClient, d)
	}
}

// proc is a running worker process.
type proc struct {
	life   *Life
	cmd    *exec.Cmd
	done   chan struct{} // closed when it has exited and life is complete
	ready  chan struct{} // closed when it handles SIGTERM and SIGUSR1 (before, either kills it)
	killed bool          // by the nemesis or at shutdown: an exit that is no finding
}

// run runs the torture test described by cfg and checks its history. It returns the
// check's result; the error reports a run that could not be carried out, not
// violations (see Result.Failed).
func run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, err
	}
	c := &controller{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, 0x7047))}
	c.cfg.Started = time.Now()
	if cfg.Failover != "" {
		stop, err := c.startCluster(ctx)
		if err != nil {
			return nil, err
		}
		defer stop()
	}
	var err error
	if c.pool, err = pgxpool.New(ctx, c.cfg.DatabaseURL); err != nil {
		return nil, err
	}
	defer c.pool.Close()
	c.cfg.Host = fmt.Sprintf("%s/%s, %d CPUs", runtime.GOOS, runtime.GOARCH, runtime.NumCPU())
	if err := c.setup(ctx); err != nil {
		return nil, fmt.Errorf("torture: set-up: %w", err)
	}
	servers := serversOf(c.pool.Config().ConnConfig)
	defer c.stopAll()
	c.logf("seed %d, %d workers, %d keys, ttl %v, %v, faults %s; histories in %s",
		cfg.Seed, cfg.Workers, cfg.Keys, cfg.TTL, cfg.Duration, strings.Join(cfg.Faults, ","), cfg.Dir)
	c.t0 = time.Now()
	// The evidence of what the machine did: the controller's own stalls (its proxies are
	// every worker's link), the server's (a ping's answer late), and the workers'
	// statements waiting in the server.
	wctx, stopWatching := context.WithCancel(ctx)
	var watching sync.WaitGroup
	defer func() { stopWatching(); watching.Wait() }()
	watching.Go(func() {
		watchStalls(wctx, func(due, ran time.Time) {
			c.mu.Lock()
			c.stalls = append(c.stalls, Stall{Due: due, Ran: ran})
			c.mu.Unlock()
		})
	})
	watching.Go(func() {
		watchServer(wctx, c.cfg.DatabaseURL, func(sent, answered time.Time) {
			c.mu.Lock()
			c.stalls = append(c.stalls, Stall{Due: sent, Ran: answered, Server: true})
			c.mu.Unlock()
		})
	})
	watching.Go(func() {
		sampleWaits(wctx, c.cfg.DatabaseURL, func(w Wait) {
			c.mu.Lock()
			c.waits = append(c.waits, w)
			c.mu.Unlock()
		})
	})
	if c.cluster != nil {
		watching.Go(func() {
			sampleLSNs(wctx, c.cfg.DatabaseURL, func(s lsnSample) {
				c.mu.Lock()
				c.lsns = append(c.lsns, s)
				c.mu.Unlock()
			})
		})
	}
	for i := range cfg.Workers {
		s := &slot{n: i + 1}
		c.slots = append(c.slots, s) // stopAll closes its proxies
		for _, srv := range servers {
			p, err := tcpproxy.New(tcpproxy.To(srv.host, srv.port))
			if err != nil {
				return nil, err
			}
			s.proxies = append(s.proxies, p)
		}
		if err := c.start(s); err != nil {
			return nil, err
		}
	}
	runErr := c.nemesis(ctx)
	sleep(ctx, 2*cfg.TTL) // quiet: the last fault's effects settle before shutdown
	c.stopAll()
	stopWatching()
	watching.Wait()
	if runErr != nil {
		return nil, runErr
	}
	h, err := c.collect(ctx)
	if err != nil {
		return nil, fmt.Errorf("torture: collect: %w", err)
	}
	if err := saveHistory(cfg.Dir, h); err != nil {
		return nil, err
	}
	if h, err = loadHistory(cfg.Dir); err != nil { // check what a later `torture check` would read
		return nil, err
	}
	return check(h), nil
}

func (c *controller) logf(format string, args ...any) {
	if c.cfg.Log == nil {
		return
	}
	fmt.Fprintf(c.cfg.Log, "torture: "+format+"\n", args...)
}

func (c *controller) setup(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := c.pool.QueryRow(ctx, "SHOW server_version").Scan(&c.cfg.Server); err != nil {
		return err
	}
	if _, err := c.pool.Exec(ctx, schemaSQL); err != nil {
		return err
	}
	if err := c.mutateTokens(ctx); err != nil {
		return err
	}
	if err := c.mutateSemaphore(ctx); err != nil {
		return err
	}
	if err := c.mutateSlots(ctx); err != nil {
		return err
	}
	for _, table := range counterTables {
		if _, err := c.pool.Exec(ctx, "INSERT INTO torture."+table+" (key) SELECT 'k' || i FROM generate_series(0, $1 - 1) i UNION ALL SELECT unnest($2::text[])",
			c.cfg.Keys, permitRows(c.cfg.Permits)); err != nil {
			return err
		}
	}
	return nil
}

// start starts the slot's next incarnation.
func (c *controller) start(s *slot) error {
	s.inc++
	id := fmt.Sprintf("w%d.%d", s.n, s.inc)
	logPath := filepath.Join(c.cfg.Dir, id+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	wc := workerConfig{id: id, db: c.cfg.DatabaseURL, dial: s.addrs(), history: historyFile(c.cfg.Dir, id),
		keys: c.cfg.Keys, permits: c.cfg.Permits, ttl: c.cfg.TTL, think: c.cfg.Think, tick: c.cfg.Tick, burn: c.cfg.Burn, seed: c.rng.Uint64(),
		mutate: c.cfg.Mutate, readyFD: 3}
	readyR, readyW, err := os.Pipe()
	if err != nil {
		_ = logFile.Close()
		return err
	}
	cmd := exec.Command(c.cfg.WorkerBin, wc.args()...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.ExtraFiles = []*os.File{readyW} // the worker's fd 3
	// The kernel kills the worker if the controller dies without cleaning up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err = cmd.Start()
	_ = readyW.Close() // the worker's copy is the one that counts
	if err != nil {
		_ = readyR.Close()
		_ = logFile.Close()
		return err
	}
	p := &proc{life: &Life{ID: id, Slot: s.n, PID: cmd.Process.Pid, Start: time.Now(), Stderr: logPath}, cmd: cmd,
		done: make(chan struct{}), ready: make(chan struct{})}
	go func() {
		// The worker closes its end once it handles the signals; an end closed by its
		// exit reads the same, and done tells the two apart.
		_, _ = readyR.Read(make([]byte, 1))
		_ = readyR.Close()
		close(p.ready)
	}()
	c.mu.Lock()
	c.lives = append(c.lives, p.life)
	c.mu.Unlock()
	s.cur = p
	go func() {
		err := cmd.Wait()
		_ = logFile.Close()
		c.mu.Lock()
		p.life.End = time.Now()
		if err != nil && !p.killed {
			p.life.Exit = err.Error()
		}
		c.mu.Unlock()
		close(p.done)
	}()
	return nil
}

// signal sends sig to the slot's worker. SIGTERM and SIGUSR1 wait until the worker
// handles them, or has exited: sent sooner, either would kill it as it starts, a death
// the checker would blame on the worker.
func (c *controller) signal(s *slot, sig syscall.Signal) error {
	if sig == syscall.SIGTERM || sig == syscall.SIGUSR1 {
		<-s.cur.ready
	}
	return s.cur.cmd.Process.Signal(sig)
}

// kill SIGKILLs the slot's worker and waits for it to exit.
func (c *controller) kill(s *slot) {
	c.mu.Lock()
	s.cur.killed, s.cur.life.Killed = true, true
	c.mu.Unlock()
	_ = s.cur.cmd.Process.Kill()
	<-s.cur.done
}

// stopTimeout is how long a worker has to stop after SIGTERM before it is killed.
const stopTimeout = 20 * time.Second

// stopAll stops every worker: SIGCONT, SIGTERM and a clean Close, or SIGKILL after
// stopTimeout. It closes the proxies last (a worker's Close needs its connections). It
// is safe to call twice.
func (c *controller) stopAll() {
	var running []*slot
	for _, s := range c.slots {
		if s.cur == nil {
			continue
		}
		select {
		case <-s.cur.done:
			continue
		default:
		}
		s.heal()
		_ = c.signal(s, syscall.SIGCONT)
		_ = c.signal(s, syscall.SIGTERM)
		running = append(running, s)
	}
	deadline := time.Now().Add(stopTimeout)
	for _, s := range running {
		c.awaitExit(s, time.Until(deadline))
	}
	for _, s := range c.slots {
		for _, p := range s.proxies {
			p.Close()
		}
	}
}

// stop SIGTERMs the slot's worker, which closes its client cleanly, and waits for it
// to exit.
func (c *controller) stop(s *slot) error {
	err := c.signal(s, syscall.SIGTERM)
	c.awaitExit(s, stopTimeout)
	return err
}

// awaitExit waits up to d for the slot's worker to exit after a SIGTERM, then kills it:
// a finding, kept in its Life.
func (c *controller) awaitExit(s *slot, d time.Duration) {
	select {
	case <-s.cur.done:
	case <-time.After(d):
		c.mu.Lock()
		s.cur.killed, s.cur.life.Exit = true, "did not stop within "+stopTimeout.String()+" of SIGTERM"
		c.mu.Unlock()
		_ = s.cur.cmd.Process.Kill()
		<-s.cur.done
	}
}

// revive restarts the workers that exited on their own (a finding, kept in their
// Life) so the run goes on.
func (c *controller) revive() error {
	for _, s := range c.slots {
		select {
		case <-s.cur.done:
			c.logf("%6.1fs %s exited on its own: %s (see %s)", time.Since(c.t0).Seconds(), s.cur.life.ID, s.cur.life.Exit, s.cur.life.Stderr)
			if err := c.start(s); err != nil {
				return err
			}
		default:
		}
	}
	return nil
}

// nemesis injects faults one at a time, in an order and with timings drawn from the
// seed, until the run's duration has passed, and heals each before the next.
func (c *controller) nemesis(ctx context.Context) error {
	end := c.t0.Add(c.cfg.Duration)
	// A shuffled bag: each round injects every fault its weight's number of times, in
	// a random order, so that even a short run pauses a holder several times.
	var bag, round []string
	for _, f := range c.cfg.Faults {
		for range faultWeight[f] {
			bag = append(bag, f)
		}
	}
	if !sleep(ctx, min(2*c.cfg.TTL, c.cfg.Duration)) { // let the workers start
		return context.Cause(ctx)
	}
	// Failovers come on their own schedule, in the place of the next fault drawn.
	nextFailover := func() time.Time {
		return time.Now().Add(c.between(c.cfg.FailoverEvery/2, 3*c.cfg.FailoverEvery/2))
	}
	var failoverAt time.Time
	if c.cluster != nil {
		failoverAt = nextFailover()
	}
	for time.Now().Before(end) {
		if err := c.revive(); err != nil {
			return err
		}
		if len(round) == 0 {
			first := round == nil
			round = slices.Clone(bag)
			c.rng.Shuffle(len(round), func(i, j int) { round[i], round[j] = round[j], round[i] })
			// The run's first fault is a pause: a run of 20 s injects 8 to 10 faults, and
			// one in four such runs lost no unfenced update, which says nothing of the
			// fences (invariant 6).
			if i := slices.Index(round, faultPause); first && i >= 0 {
				round[0], round[i] = round[i], round[0]
			}
		}
		var kind string
		switch {
		case c.cluster != nil && !time.Now().Before(failoverAt):
			kind, failoverAt = faultFailover, nextFailover()
		case len(round) > 0:
			kind, round = round[0], round[1:]
		}
		if kind != "" {
			s := c.slots[c.rng.IntN(len(c.slots))]
			f, err := c.inject(ctx, kind, s)
			if err != nil {
				return err
			}
			c.mu.Lock()
			c.faults = append(c.faults, f)
			c.mu.Unlock()
			target := cmp.Or(f.Target, "the server")
			c.logf("%6.1fs %s %s %s%s", f.Start.Sub(c.t0).Seconds(), f.Kind, target, f.End.Sub(f.Start).Round(time.Millisecond),
				suffix(f.Detail, f.Err))
		}
		gap := time.Duration(c.rng.Int64N(int64(c.cfg.Gap)) + 1)
		if !sleep(ctx, min(gap, time.Until(end))) {
			return context.Cause(ctx)
		}
	}
	return c.revive()
}

func suffix(detail, err string) string {
	s := ""
	if detail != "" {
		s += " (" + detail + ")"
	}
	if err != "" {
		s += " error: " + err
	}
	return s
}

// between draws a duration in [lo, hi).
func (c *controller) between(lo, hi time.Duration) time.Duration {
	return between(c.rng, lo, hi)
}

// inject runs one fault on s (or on the server) and heals it, however ctx ends. It
// returns an error only when the run cannot go on.
func (c *controller) inject(ctx context.Context, kind string, s *slot) (Fault, error) {
	f := Fault{Kind: kind, Target: s.cur.life.ID, Start: time.Now()}
	var err error
	switch kind {
	case faultPause:
		d := c.between(2*c.cfg.TTL, 4*c.cfg.TTL)
		// Between a read and its write, so that the write goes stale (invariant 6
		// needs one that collides); else any holder of a key.
		if h := c.inRead(ctx); h != nil {
			s, f.Target, f.Detail = h, h.cur.life.ID, "a lock holder, between a read and its write"
		} else if h := c.holder(ctx); h != nil {
			s, f.Target, f.Detail = h, h.cur.life.ID, "a lock holder"
		}
		f.Start = time.Now()
		if err = c.signal(s, syscall.SIGSTOP); err == nil {
			sleep(ctx, d)
			err = c.signal(s, syscall.SIGCONT)
		}
	case faultKill:
		c.kill(s)
		f.End = time.Now()
		return f, c.start(s)
	case faultStop:
		if t := c.inSection(ctx); t != nil {
			s, f.Target, f.Detail = t, t.cur.life.ID, "in a WithLock section"
		}
		f.Start = time.Now()
		if err = c.stop(s); err != nil {
			f.Err = err.Error()
		}
		f.End = time.Now()
		return f, c.start(s)
	case faultTerminate:
		var n int
		err = c.pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = $1`, appName(f.Target)).Scan(&n)
		f.Detail = strconv.Itoa(n) + " backends"
	case faultPartition:
		s.blackhole()
		sleep(ctx, c.between(c.cfg.TTL, 3*c.cfg.TTL))
		s.heal()
	case faultDelay:
		// Longer than a probe's timeout, shorter than what would cost a renewal.
		d := c.between(c.cfg.TTL/20, c.cfg.TTL/8)
		f.Detail = d.Round(time.Millisecond).String() + " each way"
		s.delay(d)
		sleep(ctx, c.between(c.cfg.TTL, 3*c.cfg.TTL))
		s.delay(0)
	case faultSlow:
		if err = c.signal(s, syscall.SIGUSR1); err == nil {
			sleep(ctx, c.cfg.Burn)
		}
	case faultRestart:
		f.Target = ""
		err = c.restart(ctx)
	case faultFailover:
		fo, err := c.failover(ctx)
		if err != nil {
			return f, fmt.Errorf("torture: failover: %w", err) // the pair is in no state to go on
		}
		c.mu.Lock()
		c.failovers = append(c.failovers, fo)
		c.mu.Unlock()
		// The fault, for the checker's excuses, is the outage: from the kill to the
		// promotion. Its detail says the rest.
		return Fault{Kind: kind, Start: fo.Kill, End: fo.Promoted, Detail: fo.detail()}, nil
	}
	f.End = time.Now()
	if err != nil {
		f.Err = err.Error()
	}
	return f, nil
}

// holder returns the slot of a worker that holds one of the keys' locks now, if any:
// a pause then lands in a critical section.
func (c *controller) holder(ctx context.Context) *slot {
	for range 20 { // a key is almost always held; between two holders, look again
		rows, err := c.pool.Query(ctx, `SELECT owner FROM pglock.locks
			WHERE (key LIKE 'k%' OR strpos(key, chr(31)) > 0) AND owner IS NOT NULL AND expires_at > clock_timestamp() ORDER BY key`)
		if err != nil {
			return nil
		}
		owners, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil
		}
		if len(owners) > 0 {
			w := workerOf(owners[c.rng.IntN(len(owners))])
			for _, s := range c.slots {
				if s.cur.life.ID == w {
					return s
				}
			}
		}
		if !sleep(ctx, 10*time.Millisecond) {
			return nil
		}
	}
	return nil
}

// inSection returns the slot of a worker that is inside a WithLock section now, if
// any (a stop then lands in it), as the tail of its history says.
func (c *controller) inSection(ctx context.Context) *slot {
	return c.lookFor(ctx, 100, 5*time.Millisecond, sectionOpen) // sections come and go: look again
}

// inRead returns the slot of a worker between a read and its write now, if any within
// about 200 ms (a pause then lands in its think time), as the tail of its history says.
func (c *controller) inRead(ctx context.Context) *slot {
	return c.lookFor(ctx, 100, 2*time.Millisecond, readOpen)
}

// lookFor returns the slot of a worker whose history's tail passes open, looking up to
// times, every pause, or nil.
func (c *controller) lookFor(ctx context.Context, times int, pause time.Duration, open func(path string) bool) *slot {
	for range times {
		for _, i := range c.rng.Perm(len(c.slots)) {
			if s := c.slots[i]; open(historyFile(c.cfg.Dir, s.cur.life.ID)) {
				return s
			}
		}
		if !sleep(ctx, pause) {
			return nil
		}
	}
	return nil
}

// sectionOpen reports whether the last section record in the tail of the history at
// path is a section's start.
func sectionOpen(path string) bool {
	r, ok := lastRecord(path, fSection)
	return ok && r.Type == typeInvoke
}

// readOpen reports whether the last read or write record in the tail of the history at
// path is a read that returned: the worker is between a read-modify-write's read and
// its write (its think time), so a pause now makes that write stale.
func readOpen(path string) bool {
	r, ok := lastRecord(path, fRead, fWrite)
	return ok && r.F == fRead && r.Type == typeOK
}

// lastRecord returns the last record, in the tail of the history at path, whose F is one
// of fs.
func lastRecord(path string, fs ...string) (Record, bool) {
	f, err := os.Open(path)
	if err != nil {
		return Record{}, false
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return Record{}, false
	}
	off := max(st.Size()-32<<10, 0)
	buf := make([]byte, st.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil && err != io.EOF {
		return Record{}, false
	}
	lines := bytes.Split(buf, []byte("\n"))
	for i := len(lines) - 1; i >= 0; i-- {
		var r Record
		if !slices.ContainsFunc(fs, func(f string) bool { return bytes.Contains(lines[i], []byte(`"f":"`+f+`"`)) }) ||
			json.Unmarshal(lines[i], &r) != nil {
			continue
		}
		return r, true
	}
	return Record{}, false
}

// restart runs the restart command and waits until the server answers again.
func (c *controller) restart(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(cctx, "sh", "-c", c.cfg.RestartCommand).CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w: %s", c.cfg.RestartCommand, err, out)
	}
	for {
		if err := c.pool.Ping(cctx); err == nil {
			return nil
		}
		if !sleep(cctx, 200*time.Millisecond) {
			return fmt.Errorf("the server did not answer after the restart: %w", cctx.Err())
		}
	}
}

// collect reads what the database logged and what the controller saw.
func (c *controller) collect(ctx context.Context) (*History, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	h := &History{Config: c.cfg, Final: map[string]map[string]int64{}}
	var err error
	rows, _ := c.pool.Query(ctx, `SELECT id, key, coalesce(owner, ''), token, expires_at, at, xact FROM torture.lease_log ORDER BY id`)
	if h.Leases, err = pgx.CollectRows(rows, pgx.RowToStructByPos[LeaseRow]); err != nil {
		return nil, err
	}
	rows, _ = c.pool.Query(ctx, `SELECT id, tbl, key, op, old_value, new_value, old_token, new_token, at FROM torture.writes ORDER BY id`)
	if h.Writes, err = pgx.CollectRows(rows, pgx.RowToStructByPos[WriteRow]); err != nil {
		return nil, err
	}
	type counter struct {
		Key   string
		Value int64
	}
	for _, table := range append(slices.Clone(counterTables), tableJob) {
		rows, _ := c.pool.Query(ctx, "SELECT key, value FROM torture."+table)
		counters, err := pgx.CollectRows(rows, pgx.RowToStructByPos[counter])
		if err != nil {
			return nil, err
		}
		h.Final[table] = map[string]int64{}
		for _, kv := range counters {
			h.Final[table][kv.Key] = kv.Value
		}
	}
	if err := c.collectSlots(ctx, h); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	h.Faults = slices.Clone(c.faults)
	h.Stalls, h.Waits = slices.Clone(c.stalls), slices.Clone(c.waits)
	h.Failovers = slices.Clone(c.failovers)
	for _, l := range c.lives {
		h.Lives = append(h.Lives, *l)
	}
	return h, nil
}
