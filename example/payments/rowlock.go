package payments

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// RowLock is the row-locking clause RowLockWorker reads the payment with.
type RowLock string

// The row locks of the article. FOR SHARE is left out: two workers that both hold
// a share lock and then both update the row deadlock (README.md).
const (
	// RowLockWait is FOR UPDATE: wait for the worker that holds the row to commit.
	RowLockWait RowLock = "FOR UPDATE"
	// RowLockNoWait is FOR UPDATE NOWAIT: fail at once, with SQLSTATE 55P03
	// (lock_not_available), when another worker holds the row.
	RowLockNoWait RowLock = "FOR UPDATE NOWAIT"
	// RowLockSkipLocked is FOR UPDATE SKIP LOCKED: find no row, and return Busy,
	// when another worker holds it.
	RowLockSkipLocked RowLock = "FOR UPDATE SKIP LOCKED"
)

// RowLockWorker processes a payment the article's way: in one transaction, it locks
// the payment's row, calls the provider, and writes the status, so the row lock and a
// connection of the pool are held for the whole provider call. It is safe for
// concurrent use.
type RowLockWorker struct {
	db       *pgxpool.Pool
	provider Provider
	lock     RowLock
}

// NewRowLockWorker returns a worker on db's payments table that locks the row with
// lock. It returns an error wrapping ErrInvalidArgument for a nil db or provider or an
// unknown lock.
func NewRowLockWorker(db *pgxpool.Pool, provider Provider, lock RowLock) (*RowLockWorker, error) {
	if db == nil || provider == nil {
		return nil, fmt.Errorf("%w: NewRowLockWorker: nil db or provider", ErrInvalidArgument)
	}
	switch lock {
	case RowLockWait, RowLockNoWait, RowLockSkipLocked:
	default:
		return nil, fmt.Errorf("%w: NewRowLockWorker: row lock %q", ErrInvalidArgument, lock)
	}
	return &RowLockWorker{db: db, provider: provider, lock: lock}, nil
}

// Process charges payment id once: it returns Charged, Recorded, Skipped, or Busy
// (RowLockSkipLocked). ctx bounds the wait for a connection, the wait for the row lock
// (RowLockWait) and the provider call. Errors wrap ErrInvalidArgument (empty id),
// ErrNotFound, or the database's or the provider's error; the transaction is then
// rolled back, and a charge already made is found by the next worker's Lookup.
func (w *RowLockWorker) Process(ctx context.Context, id string) (Outcome, error) {
	if err := checkID(id); err != nil {
		return "", err
	}
	var out Outcome
	err := pgx.BeginFunc(ctx, w.db, func(tx pgx.Tx) error {
		status, amount, err := read(ctx, tx, id, string(w.lock))
		switch {
		case errors.Is(err, ErrNotFound) && w.lock == RowLockSkipLocked:
			// SKIP LOCKED finds no row when another worker holds it, as when there is none.
			if _, err := ReadStatus(ctx, tx, id); err != nil {
				return err
			}
			out = Busy
			return nil
		case err != nil:
			return err
		case done(status):
			out = Skipped
			return nil
		}
		// The row lock and this transaction's connection are held from here until
		// the commit, for as long as the provider takes.
		o, ref, err := settle(ctx, w.provider, id, amount)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "UPDATE payments SET status = $1, provider_ref = $2 WHERE id = $3", StatusPaid, ref, id); err != nil {
			return fmt.Errorf("payments: record %s: %w", id, err)
		}
		out = o
		return nil
	})
	if err != nil {
		return "", err
	}
	return out, nil
}
