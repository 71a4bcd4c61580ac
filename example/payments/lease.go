package payments

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pglock"
)

// LeaseWorker processes a payment pglock's way: it takes the lease "payment:<id>",
// reads the payment without a transaction, calls the provider under the payment's
// idempotency key holding no connection, and writes the status fenced by the lease's
// token. It is safe for concurrent use.
type LeaseWorker struct {
	db       *pgxpool.Pool
	locks    *pglock.Client
	provider Provider
	wait     time.Duration
}

// NewLeaseWorker returns a worker on db's payments table whose leases come from locks
// (on db's database or another). A worker that finds the lease held waits up to wait
// for it. It returns an error wrapping ErrInvalidArgument for a nil db, locks or
// provider, or a negative wait.
func NewLeaseWorker(db *pgxpool.Pool, locks *pglock.Client, provider Provider, wait time.Duration) (*LeaseWorker, error) {
	if db == nil || locks == nil || provider == nil {
		return nil, fmt.Errorf("%w: NewLeaseWorker: nil db, locks or provider", ErrInvalidArgument)
	}
	if wait < 0 {
		return nil, fmt.Errorf("%w: NewLeaseWorker: negative wait %v", ErrInvalidArgument, wait)
	}
	return &LeaseWorker{db: db, locks: locks, provider: provider, wait: wait}, nil
}

// Process charges payment id once: it returns Charged, Recorded or Skipped. ctx bounds
// the wait for the lease, the reads, the provider call and the write, and is cancelled
// if the lease is lost meanwhile. Errors wrap ErrInvalidArgument (empty id),
// ErrNotFound, pglock.ErrNotAcquired (the lease stayed held for the whole wait),
// ErrSuperseded, pglock.ErrLockLost, or the database's or the provider's error; a
// charge already made is then found by the next worker's Lookup.
func (w *LeaseWorker) Process(ctx context.Context, id string) (Outcome, error) {
	if err := checkID(id); err != nil {
		return "", err
	}
	var out Outcome
	err := w.locks.WithLock(ctx, "payment:"+id, func(ctx context.Context) error {
		lock, _ := pglock.FromContext(ctx)
		status, amount, err := read(ctx, w.db, id, "")
		if err != nil {
			return err
		}
		if done(status) {
			out = Skipped
			return nil
		}
		o, ref, err := settle(ctx, w.provider, id, amount)
		if err != nil {
			return err
		}
		n, err := pglock.ExecFenced(ctx, w.db, "UPDATE payments SET status = $1, provider_ref = $2 WHERE id = $3",
			"fencing_token", lock.Token(), StatusPaid, ref, id)
		if err != nil {
			return fmt.Errorf("payments: record %s: %w", id, err)
		}
		if n == 0 {
			return fmt.Errorf("%w: %s (token %d)", ErrSuperseded, id, lock.Token())
		}
		out = o
		return nil
	}, pglock.Wait(w.wait))
	if err != nil {
		return "", err
	}
	return out, nil
}
