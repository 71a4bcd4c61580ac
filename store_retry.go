package pglock

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
)

// A statement of the store that PostgreSQL rolled back for a serialization failure
// (SQLSTATE 40001) or a deadlock (40P01) did nothing: it ran in an implicit transaction
// of its own, which is gone, so sending it again is safe. A serialization failure comes
// from a pool whose default_transaction_isolation is repeatable read or serializable:
// pglock's functions are written for READ COMMITTED, and under SSI two calls on
// different keys that read the same page refuse each other. A deadlock comes from two
// lock_renew_many calls whose keys overlap in different orders (not from one Client,
// whose keys are its own). The pgx store sends such a statement again in a READ
// COMMITTED transaction of its own, where neither failure comes from the pool's
// setting; a store without transactions (database/sql's, or a Queryer that cannot
// begin one) sends it again as it was. Up to rolledBackTries times in all, after a
// pause of up to 1, 2, then 4 ms, while ctx lasts; then it returns the error.
const rolledBackTries = 4

// rolledBack reports whether err is such a failure (pgx's *pgconn.PgError and lib/pq's
// *pq.Error both tell their SQLSTATE).
func rolledBack(err error) bool {
	return sqlState(err) == "40001" || sqlState(err) == "40P01"
}

func sqlState(err error) string {
	var pgErr interface{ SQLState() string }
	if errors.As(err, &pgErr) {
		return pgErr.SQLState()
	}
	return ""
}

// storeCalls are the statements of a store, bound to a pool or to a transaction.
type storeCalls struct {
	queryRow  func(ctx context.Context, q string, args ...any) scanner
	queryKeys func(ctx context.Context, q string, args ...any) ([]string, error)
}

// readCommitted runs call on calls bound to a READ COMMITTED transaction, committed
// when call returns nil. errors.ErrUnsupported means it could not begin one.
type readCommitted func(ctx context.Context, call func(storeCalls) error) error

// retryRolledBack runs call(s.calls), and again, in a READ COMMITTED transaction where
// s can begin one, while it fails with a rolled-back statement. A retry that meets an
// aborted transaction (25P02: the store was given a transaction of the caller's, not a
// pool) returns the first error.
func retryRolledBack(ctx context.Context, plain storeCalls, rc readCommitted, call func(storeCalls) error) error {
	err := call(plain)
	for try := 1; try < rolledBackTries && rolledBack(err); try++ {
		t := time.NewTimer(rand.N(time.Millisecond << (try - 1)))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		}
		again := errors.ErrUnsupported
		if rc != nil {
			again = rc(ctx, call)
		}
		if errors.Is(again, errors.ErrUnsupported) {
			again = call(plain)
		}
		if sqlState(again) == "25P02" {
			return err
		}
		err = again
	}
	return err
}

// retryingRow is a row of a retrying store's queryRow: its Scan sends the statement
// again when it was rolled back.
type retryingRow struct {
	ctx   context.Context
	q     string
	args  []any
	plain storeCalls
	rc    readCommitted
}

func (r retryingRow) Scan(dest ...any) error {
	return retryRolledBack(r.ctx, r.plain, r.rc, func(c storeCalls) error {
		return c.queryRow(r.ctx, r.q, r.args...).Scan(dest...)
	})
}

// retrying returns s with its statements sent again when rolled back (rc may be nil).
func retrying(s *postgresStore, rc readCommitted) *postgresStore {
	plain := storeCalls{queryRow: s.queryRow, queryKeys: s.queryKeys}
	s.queryRow = func(ctx context.Context, q string, args ...any) scanner {
		return retryingRow{ctx: ctx, q: q, args: args, plain: plain, rc: rc}
	}
	s.queryKeys = func(ctx context.Context, q string, args ...any) (keys []string, err error) {
		err = retryRolledBack(ctx, plain, rc, func(c storeCalls) (err error) {
			keys, err = c.queryKeys(ctx, q, args...)
			return err
		})
		return keys, err
	}
	return s
}

// readCommitted is the pgx store's: a transaction begun on its Queryer (a pool, a
// connection), its statements in pgx.QueryExecModeExec (behind a pooler the
// transaction's server connection knows none of this client's prepared statements, and
// a statement that fails there aborts the transaction).
func (p *pgxCalls) readCommitted(ctx context.Context, call func(storeCalls) error) error {
	b, ok := p.db.(interface {
		BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
	})
	if !ok {
		return errors.ErrUnsupported
	}
	if _, inTx := p.db.(pgx.Tx); inTx {
		return errors.ErrUnsupported // a savepoint would not change the isolation
	}
	tx, err := b.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return err
	}
	in := &pgxCalls{db: tx}
	in.pooled.Store(true)
	if err := call(storeCalls{queryRow: in.queryRow, queryKeys: in.queryKeys}); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return err
	}
	return tx.Commit(ctx)
}
