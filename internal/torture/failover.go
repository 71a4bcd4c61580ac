package main

import (
	"context"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/failover"
)

// The failover fault (issue 19). A failover run (Config.Failover) works on a primary and
// a streaming standby of its own (internal/failover), in synchronous or asynchronous
// replication; the controller, the workers (through their proxies, one per server) and
// the samplers reach the primary through the pair's multi-host URL
// (target_session_attrs=read-write). About every Config.FailoverEvery, in the place of
// the next fault, the nemesis kills the primary (pg_ctl -m immediate), promotes the
// standby, and rebuilds the old primary as the new standby from a fresh base backup, so
// that failovers repeat. In asynchronous mode it first detaches the standby (it stops
// receiving WAL) one failover in two, for ttl to 3 ttl before the kill, so that the
// failover loses what the primary acknowledged meanwhile.
//
// The checker must know what a failover may have lost. The controller samples the
// primary's flushed WAL position (pg_current_wal_flush_lsn()) every lsnSample; a commit
// acknowledged before a sample was flushed, so it ends at or below the sample's
// position. After the promotion, the new timeline's history file says where it branched
// off the old one (Cluster.Branch): the last sample at or below the branch point is
// Failover.KeptUntil, and everything acknowledged before it is on the new primary. What
// the old primary acknowledged after it may have been lost. See failover_check.go for
// what the checker makes of it.

// The failover modes (Config.Failover).
const (
	failoverSync  = "sync"
	failoverAsync = "async"
)

// Failover is one failover, on the controller's clock.
type Failover struct {
	OldPrimary string    `json:"old_primary"`        // the server's name in the pair: a or b
	NewPrimary string    `json:"new_primary"`        // the promoted one
	From       int       `json:"from"`               // the old primary's timeline
	To         int       `json:"to"`                 // the new one's
	Detached   time.Time `json:"detached,omitzero"`  // when the standby stopped receiving WAL, if it was made to
	Kill       time.Time `json:"kill"`               // the kill began
	Killed     time.Time `json:"killed"`             // the old primary was gone
	Promoted   time.Time `json:"promoted"`           // the controller saw the new primary take writes (it may have taken some just before)
	Rebuilt    time.Time `json:"rebuilt"`            // the old primary streamed as the new standby
	Branch     string    `json:"branch"`             // the LSN where timeline To branched off From
	KeptLSN    string    `json:"kept_lsn,omitempty"` // the last sample at or below Branch
	// KeptUntil is when the primary was last sampled at or below the branch point:
	// every commit acknowledged before it is on the new primary.
	KeptUntil time.Time `json:"kept_until"`
}

func (f Failover) detail() string {
	kept := fmt.Sprintf("%v before the kill", f.Kill.Sub(f.KeptUntil).Round(time.Millisecond))
	if f.KeptUntil.After(f.Kill) {
		kept = fmt.Sprintf("%v into the kill", f.KeptUntil.Sub(f.Kill).Round(time.Millisecond))
	}
	d := fmt.Sprintf("%s to %s, timeline %d to %d, promoted in %v, rebuilt in %v; the new primary has what was acknowledged until %s",
		f.OldPrimary, f.NewPrimary, f.From, f.To, f.Promoted.Sub(f.Kill).Round(time.Millisecond),
		f.Rebuilt.Sub(f.Promoted).Round(time.Millisecond), kept)
	if !f.Detached.IsZero() {
		d += fmt.Sprintf(", the standby detached %v before it", f.Kill.Sub(f.Detached).Round(time.Millisecond))
	}
	return d
}

// lsnSample is the primary's flushed WAL position at a time: every commit acknowledged
// before At ends at or below LSN, on Timeline.
type lsnSample struct {
	At       time.Time
	LSN      uint64
	Timeline int
}

// lsnPeriod is how often sampleLSNs samples.
const lsnPeriod = 20 * time.Millisecond

// sampleLSNs adds, every lsnPeriod until ctx ends, the flushed WAL position of the
// primary that url reaches (a multi-host URL follows the new primary after a failover),
// on a connection of its own, opened again after an error.
func sampleLSNs(ctx context.Context, url string, add func(lsnSample)) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return
	}
	cfg.ConnectTimeout = time.Second
	everyOnConn(ctx, cfg, lsnPeriod, func(conn *pgx.Conn) error {
		at := time.Now() // before the query: what was acknowledged by now is flushed by its answer
		var lsn, walfile string
		if err := conn.QueryRow(ctx, "SELECT l::text, pg_walfile_name(l) FROM pg_current_wal_flush_lsn() l").Scan(&lsn, &walfile); err != nil {
			return err
		}
		n, err1 := parseLSN(lsn)
		tli, err2 := strconv.ParseInt(walfile[:8], 16, 64)
		if err1 == nil && err2 == nil {
			add(lsnSample{At: at, LSN: n, Timeline: int(tli)})
		}
		return nil
	})
}

// parseLSN parses an LSN as PostgreSQL writes it: two hexadecimal halves, "16/B374D848".
func parseLSN(s string) (uint64, error) {
	hi, lo, ok := strings.Cut(s, "/")
	if !ok {
		return 0, fmt.Errorf("torture: LSN %q", s)
	}
	h, err := strconv.ParseUint(hi, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("torture: LSN %q: %w", s, err)
	}
	l, err := strconv.ParseUint(lo, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("torture: LSN %q: %w", s, err)
	}
	return h<<32 | l, nil
}

// startCluster starts the run's primary and standby, migrates them and points the run
// at them; stop closes them.
func (c *controller) startCluster(ctx context.Context) (stop func(), err error) {
	mode := failover.Synchronous
	if c.cfg.Failover == failoverAsync {
		mode = failover.Asynchronous
	}
	if c.cluster, err = failover.StartCluster(mode); err != nil {
		return nil, err
	}
	stop = func() {
		if err := c.cluster.Close(); err != nil {
			c.logf("%v", err)
		}
	}
	c.timeline = 1
	c.cfg.DatabaseURL = c.cluster.URL()
	mctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := pglock.Migrate(mctx, c.cfg.DatabaseURL); err != nil {
		stop()
		return nil, err
	}
	return stop, nil
}

// mutateTokens, under the old-tokens mutation, installs lock_acquire as migration
// 000011 left it: 000012's down migration, which drops the timeline's floor.
func (c *controller) mutateTokens(ctx context.Context) error {
	if c.cfg.Mutate != mutOldTokens {
		return nil
	}
	down, err := fs.ReadFile(pglock.Migrations(), "000012_timeline_tokens.down.sql")
	if err != nil {
		return err
	}
	_, err = c.pool.Exec(ctx, string(down))
	return err
}

// failover kills the primary, promotes the standby and rebuilds the old primary as the
// new standby; in asynchronous mode it detaches the standby first one time in two
// (every time under the old-tokens mutation), for ttl to 3 ttl. Its error means the
// pair is in no state to go on.
func (c *controller) failover(ctx context.Context) (Failover, error) {
	f := Failover{OldPrimary: c.cluster.Primary(), From: c.timeline}
	if c.cluster.Mode() == failover.Asynchronous && (c.cfg.Mutate == mutOldTokens || c.rng.IntN(2) == 0) {
		if err := c.cluster.Detach(); err != nil {
			return f, err
		}
		f.Detached = time.Now()
		sleep(ctx, c.between(c.cfg.TTL, 3*c.cfg.TTL))
	}
	f.Kill = time.Now()
	if err := c.cluster.KillPrimary(); err != nil {
		return f, err
	}
	f.Killed = time.Now()
	if err := c.cluster.Promote(); err != nil {
		return f, err
	}
	f.Promoted = time.Now()
	f.NewPrimary = c.cluster.Primary()
	var err error
	if f.To, err = c.cluster.Timeline(); err != nil {
		return f, err
	}
	if f.Branch, err = c.cluster.Branch(); err != nil {
		return f, err
	}
	branch, err := parseLSN(f.Branch)
	if err != nil {
		return f, err
	}
	f.KeptUntil, f.KeptLSN = c.keptUntil(f.From, branch)
	c.timeline = f.To
	if err := c.cluster.Rebuild(); err != nil {
		return f, err
	}
	f.Rebuilt = time.Now()
	return f, nil
}

// keptUntil returns the time of the last sample of timeline at or below branch, and its
// position, and forgets the samples of that timeline. Without one (the sampler could not
// run), it returns the run's start: anything may have been lost.
func (c *controller) keptUntil(timeline int, branch uint64) (time.Time, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	at, lsn := c.t0, ""
	for _, s := range c.lsns {
		if s.Timeline == timeline && s.LSN <= branch && s.At.After(at) {
			at, lsn = s.At, fmt.Sprintf("%X/%X", s.LSN>>32, uint32(s.LSN))
		}
	}
	kept := c.lsns[:0]
	for _, s := range c.lsns {
		if s.Timeline > timeline {
			kept = append(kept, s)
		}
	}
	c.lsns = kept
	return at, lsn
}

// server is one host of a connection string.
type server struct {
	host string
	port uint16
}

// serversOf returns the hosts a connection config tries, in order, each once.
func serversOf(cc *pgx.ConnConfig) []server {
	out := []server{{cc.Host, cc.Port}}
	for _, fb := range cc.Fallbacks {
		if s := (server{fb.Host, fb.Port}); !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// dialThrough points a worker's connection config at its proxies (host:port, in the
// order of the URL's hosts), keeping the URL's target_session_attrs check.
func dialThrough(cc *pgconn.Config, proxies string) error {
	var servers []server
	for _, addr := range strings.Split(proxies, ",") {
		host, port, ok := strings.Cut(addr, ":")
		p, err := strconv.ParseUint(port, 10, 16)
		if !ok || err != nil {
			return fmt.Errorf("worker: -dial %q: want host:port[,host:port]", proxies)
		}
		servers = append(servers, server{host, uint16(p)})
	}
	cc.Host, cc.Port, cc.TLSConfig, cc.Fallbacks = servers[0].host, servers[0].port, nil, nil
	for _, s := range servers[1:] {
		cc.Fallbacks = append(cc.Fallbacks, &pgconn.FallbackConfig{Host: s.host, Port: s.port})
	}
	return nil
}
