package main

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pglock/internal/testkit"
)

// callTracer records, in a worker's history, every pglock statement its pool runs (the
// client's acquisitions, renewals, releases and hand-backs): when the call asked the pool
// for a connection, when the statement was sent, when its answer came, and its error.
// It is the evidence the checker weighs before it blames pglock for a lost lock or a
// ghost: a renewal sent late, or answered late, and why.
type callTracer struct {
	h *historyWriter
	// pooled holds, per connection just handed out by the pool, when the call asked
	// for it: the next statement on that connection is that call's.
	pooled sync.Map // *pgx.Conn → time.Time
}

type acquireStartKey struct{}

type queryStartKey struct{}

// queryStart is what TraceQueryStart keeps for TraceQueryEnd.
type queryStart struct {
	rec Record
}

// TraceAcquireStart implements pgxpool.AcquireTracer.
func (t *callTracer) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	return context.WithValue(ctx, acquireStartKey{}, time.Now())
}

// TraceAcquireEnd implements pgxpool.AcquireTracer. A call that got no connection
// (its ctx ended first, or the connection failed) is recorded as a call of "pool".
func (t *callTracer) TraceAcquireEnd(ctx context.Context, _ *pgxpool.Pool, data pgxpool.TraceAcquireEndData) {
	at, ok := ctx.Value(acquireStartKey{}).(time.Time)
	switch {
	case !ok:
	case data.Err != nil:
		t.h.add(Record{Type: typeEvent, F: fCall, Reason: callPool, Pool: at, Err: data.Err.Error()})
	case data.Conn != nil:
		t.pooled.Store(data.Conn, at)
	}
}

// callPool is the function of a call record for a pool acquisition that failed.
const callPool = "pool"

// callConnect is the function of a call record for a new connection: Start when the
// pool began to open it, Local when it was open (or failed).
const callConnect = "connect"

// TraceConnectStart implements pgx.ConnectTracer.
func (t *callTracer) TraceConnectStart(ctx context.Context, _ pgx.TraceConnectStartData) context.Context {
	return context.WithValue(ctx, acquireStartKey{}, time.Now())
}

// TraceConnectEnd implements pgx.ConnectTracer.
func (t *callTracer) TraceConnectEnd(ctx context.Context, data pgx.TraceConnectEndData) {
	at, _ := ctx.Value(acquireStartKey{}).(time.Time)
	r := Record{Type: typeEvent, F: fCall, Reason: callConnect, Start: at}
	if data.Err != nil {
		r.Err = data.Err.Error()
	}
	t.h.add(r)
}

// TraceQueryStart implements pgx.QueryTracer.
func (t *callTracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	now := time.Now()
	v, _ := t.pooled.LoadAndDelete(conn)
	fn := pglockCall(data.SQL)
	if fn == "" {
		return ctx
	}
	r := Record{Type: typeEvent, F: fCall, Reason: fn, Start: now}
	if at, ok := v.(time.Time); ok {
		r.Pool = at
	}
	if len(data.Args) >= 2 {
		switch k := data.Args[0].(type) {
		case string:
			r.Key = k
			r.Owner, _ = data.Args[1].(string)
		case []string:
			r.Keys = k
			r.Owners, _ = data.Args[1].([]string)
		}
	}
	return context.WithValue(ctx, queryStartKey{}, &queryStart{rec: r})
}

// TraceQueryEnd implements pgx.QueryTracer.
func (t *callTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	q, ok := ctx.Value(queryStartKey{}).(*queryStart)
	if !ok {
		return
	}
	r := q.rec
	r.Local = time.Now()
	if data.Err != nil {
		r.Err = data.Err.Error()
	}
	t.h.add(r)
}

// pglockCall returns the name of the pglock function a statement of the client calls
// (lock_ and sem_ functions), or "" for any other statement (the workers' own,
// lock_held in their fences included).
func pglockCall(sql string) string {
	i := strings.Index(sql, "pglock.lock_")
	if i < 0 {
		i = strings.Index(sql, "pglock.sem_")
	}
	if i < 0 {
		return ""
	}
	fn := sql[i+len("pglock."):]
	if j := strings.IndexByte(fn, '('); j >= 0 {
		fn = fn[:j]
	}
	if fn == "lock_held" {
		return ""
	}
	return fn
}

// stallPeriod is how often a stall watch's timer is due; stallMin is how late it must
// run to count as a stall (testkit.WatchStalls); the server's pings use the same.
const (
	stallPeriod = testkit.StallPeriod
	stallMin    = testkit.StallMin
)

// watchStalls is testkit.WatchStalls: every timer of a worker, the renewer's included,
// suffered the stalls it reports.
var watchStalls = testkit.WatchStalls

// watchServer pings the server (SELECT 1 on a connection of its own) every stallPeriod
// and calls stalled with the ping's send and answer whenever it took stallMin or more,
// until ctx ends: the time the server's processes did not run (a machine starved of
// CPU runs a backend late whatever its statement), which a worker's renewal suffered
// too. A ping that fails (a restart, a failover) counts nothing; the connection is
// opened again.
func watchServer(ctx context.Context, url string, stalled func(sent, answered time.Time)) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return
	}
	everyOnConn(ctx, cfg, stallPeriod, func(conn *pgx.Conn) error {
		sent := time.Now()
		if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
			return err
		}
		if answered := time.Now(); answered.Sub(sent) >= stallMin {
			stalled(sent, answered)
		}
		return nil
	})
}

// everyOnConn calls f every period until ctx ends, with a connection to the server of
// cfg of its own, opened again after f fails (a restart, a failover): the controller's
// samplers.
func everyOnConn(ctx context.Context, cfg *pgx.ConnConfig, period time.Duration, f func(*pgx.Conn) error) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			_ = conn.Close(context.Background())
		}
	}()
	for sleep(ctx, period) {
		if conn == nil {
			var err error
			if conn, err = pgx.ConnectConfig(ctx, cfg); err != nil {
				conn = nil
				continue
			}
		}
		if err := f(conn); err != nil {
			_ = conn.Close(context.Background())
			conn = nil
		}
	}
}

// waitSample is how often the controller looks for the workers' pglock statements
// waiting in the server.
const waitSample = 20 * time.Millisecond

// sampleWaits adds to waits, every waitSample until ctx ends, each pglock statement of a
// worker that is waiting in the server on a lock, an internal lock, I/O or a synchronous
// standby's confirmation of its commit (IPC/SyncRep), with what blocks it: the evidence
// of what a late renewal waited on. It has a connection of its
// own, opened again after an error (a restart).
func sampleWaits(ctx context.Context, url string, add func(Wait)) {
	const q = `SELECT clock_timestamp(), substr(a.application_name, length('pglock-torture/') + 1), a.pid,
	       a.wait_event_type, a.wait_event, left(a.query, 120), a.query_start, pg_blocking_pids(a.pid),
	       coalesce((SELECT array_agg(left(b.query, 120)) FROM pg_stat_activity b WHERE b.pid = ANY (pg_blocking_pids(a.pid))), '{}')
	FROM pg_stat_activity a
	WHERE a.datname = current_database() AND a.application_name LIKE 'pglock-torture/%' AND a.state = 'active'
	  AND (a.wait_event_type IN ('Lock', 'LWLock', 'IO') OR a.wait_event = 'SyncRep') AND (a.query LIKE '%pglock.lock\_%' OR a.query LIKE '%pglock.sem\_%')`
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return
	}
	everyOnConn(ctx, cfg, waitSample, func(conn *pgx.Conn) error {
		rows, _ := conn.Query(ctx, q)
		waits, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Wait])
		if err != nil {
			return err
		}
		for _, w := range waits {
			add(w)
		}
		return nil
	})
}
