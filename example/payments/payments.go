// Package payments is the row-locking article's payment, charged once by three workers
// that process it at the same time, written two ways: with a row lock held across the
// provider call (RowLockWorker, the article's way), and with a pglock lease, an
// idempotency key and a fenced status write (LeaseWorker). README.md beside this file
// says when each is right.
package payments

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pglock"
)

// Schema creates the payments table if it is missing. fencing_token is the token of the
// pglock lease whose holder last wrote the row (LeaseWorker); RowLockWorker leaves it 0.
const Schema = `
CREATE TABLE IF NOT EXISTS payments (
	id            text PRIMARY KEY,
	amount        bigint NOT NULL CHECK (amount > 0),
	status        text NOT NULL DEFAULT 'new' CHECK (status IN ('new', 'paid', 'failed')),
	provider_ref  text,
	fencing_token bigint NOT NULL DEFAULT 0
)`

// The statuses of a payment.
const (
	StatusNew    = "new"    // not charged yet, as far as the table knows
	StatusPaid   = "paid"   // charged; provider_ref names the charge
	StatusFailed = "failed" // the provider refused it
)

// Outcome is what one worker did with a payment.
type Outcome string

// The outcomes of Process.
const (
	// Charged: this worker called the provider, which charged the payment, and
	// recorded the status.
	Charged Outcome = "charged"
	// Recorded: the table said new, but the provider already had a charge under the
	// payment's idempotency key (an earlier worker charged and then failed to record
	// it): this worker only recorded the status, without charging again.
	Recorded Outcome = "recorded"
	// Skipped: the payment was already paid or failed; this worker did nothing.
	Skipped Outcome = "skipped"
	// Busy: another worker held the payment's row (RowLockSkipLocked); this worker
	// did nothing.
	Busy Outcome = "busy"
)

// Errors of Process. Database and provider errors are returned wrapped, so a
// *pgconn.PgError stays reachable with errors.As.
var (
	// ErrNotFound: no payment has the id.
	ErrNotFound = errors.New("payments: no such payment")
	// ErrInvalidArgument: a nil dependency or an empty id.
	ErrInvalidArgument = errors.New("payments: invalid argument")
	// ErrSuperseded: a LeaseWorker's status write was refused because a worker with a
	// newer lease (a greater fencing token) wrote the payment first: this worker had
	// been paused past its lease.
	ErrSuperseded = errors.New("payments: a newer worker wrote the payment first")
)

// Provider is the payment provider. Charge moves the money under an idempotency key;
// Lookup answers whether a charge under that key was already made, and its reference.
// Both honour ctx.
type Provider interface {
	Charge(ctx context.Context, idempotencyKey string, amount int64) (ref string, err error)
	Lookup(ctx context.Context, idempotencyKey string) (ref string, found bool, err error)
}

// Querier is what ReadStatus reads with: *pgxpool.Pool, *pgx.Conn, pgx.Tx.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Insert adds a payment of amount with status (StatusNew, StatusPaid or StatusFailed).
// ctx bounds the statement; errors are the database's, wrapped.
func Insert(ctx context.Context, db pglock.Execer, id string, amount int64, status string) error {
	if _, err := db.Exec(ctx, "INSERT INTO payments (id, amount, status) VALUES ($1, $2, $3)", id, amount, status); err != nil {
		return fmt.Errorf("payments: insert %s: %w", id, err)
	}
	return nil
}

// ReadStatus is the plain reader: it reads a payment's status without any lock, as a
// page showing the payment would. ctx bounds the read, including the wait for a
// connection of the pool. It returns ErrNotFound for an unknown id.
func ReadStatus(ctx context.Context, db Querier, id string) (string, error) {
	status, _, err := read(ctx, db, id, "")
	return status, err
}

// read reads a payment's status and amount, with lockClause (a row lock, or "")
// appended to the SELECT. It returns ErrNotFound when no row comes back.
func read(ctx context.Context, db Querier, id string, lockClause string) (status string, amount int64, err error) {
	err = db.QueryRow(ctx, "SELECT status, amount FROM payments WHERE id = $1 "+lockClause, id).Scan(&status, &amount)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", 0, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	if err != nil {
		return "", 0, fmt.Errorf("payments: read %s: %w", id, err)
	}
	return status, amount, nil
}

// settle is what both workers do once they alone hold the payment and found it new:
// ask the provider whether it was charged already (by a worker that then failed to
// record it), charge it if not, and return the outcome and the charge's reference.
func settle(ctx context.Context, provider Provider, id string, amount int64) (Outcome, string, error) {
	ref, found, err := provider.Lookup(ctx, id)
	if err != nil {
		return "", "", fmt.Errorf("payments: look up %s: %w", id, err)
	}
	if found {
		return Recorded, ref, nil
	}
	ref, err = provider.Charge(ctx, id, amount)
	if err != nil {
		return "", "", fmt.Errorf("payments: charge %s: %w", id, err)
	}
	return Charged, ref, nil
}

func checkID(id string) error {
	if id == "" {
		return fmt.Errorf("%w: empty payment id", ErrInvalidArgument)
	}
	return nil
}

func done(status string) bool { return status == StatusPaid || status == StatusFailed }
