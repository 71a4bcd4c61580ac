package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrAbandoned is a store call whose caller's ctx (SendMark.Wait) ended while its
// statement was in flight: the caller returns at once, and the call goes on to its reply
// on the same connection, which it then reports to SendMark.Abandon's finish.
var ErrAbandoned = errors.New("pglock: the caller gave up while the statement was in flight")

// flightRow is the row of an acquisition's statement sent on a connection of a
// *pgxpool.Pool while its caller's ctx (SendMark.Wait) may end. pgx closes the connection
// of a statement whose ctx ends; flightRow instead waits for the reply with
// pgconn.PgConn.ReceiveMessage, which leaves the connection open when its ctx ends (the
// deadline pgx sets to interrupt the read stops a message between two reads, and the
// next read goes on from there). So the caller's goroutine makes the call itself, with
// no goroutine beside it (one per call cost 10-15% of an acquisition on a 2-core VM, in
// the wake-ups of idle threads), and returns at once when its ctx ends; a goroutine then
// reads the rest of the reply on the same connection, and hands it to the mark's
// Abandon. The statement is prepared once per connection and kept, as pgx does by
// default, but by the message of its first call, not in a round trip of its own (in the
// pool's other modes of the extended protocol, and behind a pooler, it is parsed at each
// call); it is described once too, and traced by the pool's tracer. A pool in the simple
// protocol goes through pgx as other calls do.
type flightRow struct {
	p    *pgxCalls
	ctx  context.Context // detached from the caller's: the call's own bounds
	m    *SendMark
	conn *pgxpool.Conn
	q    string
	args []any
}

// flightMode reports whether a pool's statements can go as flightRow sends them.
func flightMode(pool *pgxpool.Pool) bool {
	switch pool.Config().ConnConfig.DefaultQueryExecMode {
	case pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec:
		return true
	}
	return false
}

func (r *flightRow) Scan(dest ...any) (err error) {
	conn := r.conn.Conn()
	if tracer := conn.Config().Tracer; tracer != nil {
		ctx := tracer.TraceQueryStart(r.ctx, conn, pgx.TraceQueryStartData{SQL: r.q, Args: r.args})
		defer func() { tracer.TraceQueryEnd(ctx, conn, pgx.TraceQueryEndData{Err: err}) }()
	}
	params, err := textParams(r.args)
	if err != nil {
		r.conn.Release()
		return err
	}
	f := &sentCall{conn: r.conn}
	// Prepared and kept as pgx does by default; in the pool's other modes, and behind a
	// pooler, the unnamed statement.
	cached := r.conn.Conn().Config().DefaultQueryExecMode == pgx.QueryExecModeCacheStatement
	for {
		exec := r.p.pooled.Load() || !cached
		if err = f.send(r.q, params, exec); err == nil {
			err = f.receive(r.m.Wait)
			if errors.Is(err, errWaitEnded) {
				return f.abandon(r.ctx, r.m, dest)
			}
			if err == nil {
				err = f.scan(f.conn.Conn().TypeMap(), dest)
			}
		}
		if f.conn == nil || !r.p.retry(err, exec) {
			f.release()
			return err
		}
	}
}

// errWaitEnded is sentCall.receive's when its ctx ended before the reply was in.
var errWaitEnded = errors.New("pglock: the wait for the reply ended")

// sentCall is a statement sent on conn and the reply being read.
type sentCall struct {
	conn   *pgxpool.Conn // nil once released or closed
	name   string        // the prepared statement's; "": the unnamed one
	fields []field
	row    [][]byte // the DataRow's values, copied
	pgErr  error    // the server's ErrorResponse
	done   bool     // ReadyForQuery came
}

// field is what a column of the reply needs to be scanned.
type field struct {
	oid    uint32
	format int16
}

// send sends q with params (text): as the connection's prepared statement, which the
// same message prepares and describes on its first call (kept, see receive), or, with
// exec, as the unnamed statement, parsed and described at each call.
func (f *sentCall) send(q string, params [][]byte, exec bool) error {
	pc := f.conn.Conn().PgConn()
	*f = sentCall{conn: f.conn}
	parse := exec
	if !exec {
		f.name = statementName(q)
		var ok bool
		f.fields, ok = preparedOn(pc)[f.name]
		parse = !ok
	}
	fe := pc.Frontend()
	if parse {
		fe.SendParse(&pgproto3.Parse{Name: f.name, Query: q})
	}
	fe.SendBind(&pgproto3.Bind{PreparedStatement: f.name, Parameters: params})
	if f.fields == nil {
		fe.SendDescribe(&pgproto3.Describe{ObjectType: 'P'})
	}
	fe.SendExecute(&pgproto3.Execute{})
	fe.SendSync(&pgproto3.Sync{})
	if err := fe.Flush(); err != nil {
		f.close()
		return err
	}
	return nil
}

// preparedKey is the key of pgconn.PgConn.CustomData under which the statements that
// flightRow prepared on a connection are kept.
const preparedKey = "pglock.prepared"

// preparedOn returns the statements prepared on pc by name, with the columns of their
// rows (nil until a call described them), made on first use.
func preparedOn(pc *pgconn.PgConn) map[string][]field {
	data := pc.CustomData()
	prepared, _ := data[preparedKey].(map[string][]field)
	if prepared == nil {
		prepared = map[string][]field{}
		data[preparedKey] = prepared
	}
	return prepared
}

// statementNames holds statementName's names by statement.
var statementNames sync.Map

// statementName is the name of q's prepared statement on a connection: pglock's own,
// apart from pgx's.
func statementName(q string) string {
	if name, ok := statementNames.Load(q); ok {
		return name.(string)
	}
	sum := sha256.Sum256([]byte(q))
	name := "pglock_" + hex.EncodeToString(sum[:12])
	statementNames.Store(q, name)
	return name
}

// receive reads the reply until ReadyForQuery, waiting no longer than ctx: when ctx
// ends first it returns errWaitEnded, the connection open and the reply's rest unread.
// Its error is the server's, or the connection's (then closed).
func (f *sentCall) receive(ctx context.Context) error {
	pc := f.conn.Conn().PgConn()
	for !f.done {
		msg, err := pc.ReceiveMessage(ctx)
		if err != nil {
			if ctx.Err() != nil && !pc.IsClosed() {
				return errWaitEnded
			}
			f.close()
			return err
		}
		switch msg := msg.(type) {
		case *pgproto3.ParseComplete:
			if f.name != "" {
				preparedOn(pc)[f.name] = nil // prepared; its columns come with the row's description
			}
		case *pgproto3.RowDescription:
			f.fields = make([]field, len(msg.Fields))
			for i, fd := range msg.Fields {
				f.fields[i] = field{oid: fd.DataTypeOID, format: fd.Format}
			}
			if f.name != "" {
				preparedOn(pc)[f.name] = f.fields
			}
		case *pgproto3.DataRow:
			f.row = make([][]byte, len(msg.Values))
			for i, v := range msg.Values {
				if v != nil {
					f.row[i] = append([]byte{}, v...)
				}
			}
		case *pgproto3.ErrorResponse:
			f.pgErr = pgconn.ErrorResponseToPgError(msg)
		case *pgproto3.ReadyForQuery:
			f.done = true
		}
	}
	if f.pgErr != nil {
		return f.pgErr
	}
	if f.row == nil {
		return pgx.ErrNoRows
	}
	return nil
}

// scan scans the row received into dest.
func (f *sentCall) scan(tm *pgtype.Map, dest []any) error {
	if len(f.row) != len(dest) || len(f.fields) != len(dest) {
		return fmt.Errorf("pglock: %d values in the row, %d to scan into", len(f.row), len(dest))
	}
	for i, d := range dest {
		if err := tm.Scan(f.fields[i].oid, f.fields[i].format, f.row[i], d); err != nil {
			return fmt.Errorf("pglock: scan column %d: %w", i, err)
		}
	}
	return nil
}

// granted reports whether the row received holds a fencing token in column col (from
// 1), sent as text: a grant. With no column named, any row counts as one.
func (f *sentCall) granted(col int) bool {
	if col < 1 {
		return true
	}
	if col > len(f.row) || f.row[col-1] == nil {
		return false
	}
	token, err := strconv.ParseInt(string(f.row[col-1]), 10, 64)
	return err == nil && token > 0
}

// abandon hands the rest of the reply to a goroutine of its own when the caller's mark
// allows (m.Abandon, which flightRow's calls have), and returns ErrAbandoned; else
// (Close has begun) it reads it here, bounded by ctx, the call's own, into dest.
func (f *sentCall) abandon(ctx context.Context, m *SendMark, dest []any) error {
	if rest, finish, ok := m.Abandon(); ok {
		go func() {
			// The caller's dest is the caller's again: the goroutine reads only the row.
			err := f.receive(rest)
			if errors.Is(err, errWaitEnded) { // Close gave up, or the call's time ran out
				f.close()
				err = context.Cause(rest)
			}
			granted := err == nil && f.granted(m.Token)
			f.release()
			if m.calls != nil {
				m.calls.end(m.flight, &err)
			}
			finish(granted, err)
		}()
		return ErrAbandoned
	}
	err := f.receive(ctx)
	if errors.Is(err, errWaitEnded) {
		f.close()
		err = context.Cause(ctx)
	}
	if err == nil {
		err = f.scan(f.conn.Conn().TypeMap(), dest)
	}
	f.release()
	return err
}

// release puts the connection back in the pool, the reply read.
func (f *sentCall) release() {
	if f.conn != nil {
		f.conn.Release()
		f.conn = nil
	}
}

// close closes the connection, whose reply may be half read, and puts it back (the
// pool drops it).
func (f *sentCall) close() {
	if f.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = f.conn.Conn().PgConn().Close(ctx)
		f.conn.Release()
		f.conn = nil
	}
}

// textParams encodes the arguments of an acquisition's statement in the text format:
// strings, integers, booleans and NULL are all it sends.
func textParams(args []any) ([][]byte, error) {
	params := make([][]byte, len(args))
	for i, a := range args {
		switch a := a.(type) {
		case nil:
		case bool:
			params[i] = []byte{'f'}
			if a {
				params[i][0] = 't'
			}
		case string:
			params[i] = []byte(a)
		case int64:
			params[i] = strconv.AppendInt(nil, a, 10)
		case int:
			params[i] = strconv.AppendInt(nil, int64(a), 10)
		default:
			return nil, fmt.Errorf("pglock: argument %d: %T is not sent by an acquisition", i+1, a)
		}
	}
	return params, nil
}
