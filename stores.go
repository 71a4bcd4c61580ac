package pglock

import (
	"context"
	"database/sql"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pglock/internal/store"
)

// Store keeps the locks that every instance shares: NewPostgresStore, NewSQLStore and
// NewMemoryStore make the only stores there are, and New makes one on its pool. A
// Client takes it (NewWithStore); it has no methods of its own. See the package doc,
// # Stores.
type Store struct{ s store.Store }

// Queryer is what the PostgreSQL store needs of pgx: *pgxpool.Pool and *pgx.Conn have it.
// A pgx.Tx has it too, but a lock taken inside a transaction is rolled back with it. A
// Queryer that wraps pgx must pass its arguments on as they are (see the package
// doc, # PgBouncer, query modes and retries).
type Queryer interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// NewPostgresStore returns a Store on the pglock schema (see Migrate), through pgx: every
// feature of a Client works on it, behind PgBouncer in transaction mode too, whatever the
// pool's DefaultQueryExecMode. On a database without the schema, or with one older than
// this library, every call fails with an error that says to run Migrate and wraps the
// server's *pgconn.PgError. With a nil db, NewWithStore refuses the store with an error
// wrapping ErrInvalidArgument. See the package doc, # PgBouncer, query modes and retries
// and # Renewals and releases.
func NewPostgresStore(db Queryer) *Store {
	return &Store{store.NewPostgres(db)}
}

// NewSQLStore returns a Store on the pglock schema (see Migrate) for database/sql, with
// any PostgreSQL driver (pgx's stdlib, lib/pq): every feature of a Client works on it.
// Without the schema, or with an older one, every call fails with an error that says to
// run Migrate and wraps the driver's; with a nil db, NewWithStore refuses the store with
// an error wrapping ErrInvalidArgument.
func NewSQLStore(db *sql.DB) *Store { return &Store{store.NewSQL(db)} }

// NewMemoryStore returns a Store that keeps its locks in this process, with expiry on
// clock (nil means the real clock), for tests: NewWithStore(NewMemoryStore(clock),
// WithClock(clock)). It excludes callers in one process only. Every feature of a Client
// works on it but the listener (waiters poll) and a job's slots (Cron, Every).
func NewMemoryStore(clock Clock) *Store {
	return &Store{store.NewMemory(clock)}
}
