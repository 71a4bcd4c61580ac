package store

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// What the tests of package store_test reach inside the stores.

var (
	FirstConn = firstConn
	TTLMillis = ttlMillis
	Inline    = inline
)

type (
	SinceUS   = sinceUS
	SkipsJSON = skipsJSON
)

// OneTrip sends each statement in a READ COMMITTED transaction of its own, in one
// message, as the retry of a rolled-back statement does.
type OneTrip struct{ o oneTrip }

// NewOneTrip returns a OneTrip on conn.
func NewOneTrip(conn *pgx.Conn) OneTrip { return OneTrip{oneTrip{conn}} }

// QueryRow sends q with args.
func (o OneTrip) QueryRow(ctx context.Context, q string, args ...any) interface{ Scan(...any) error } {
	return o.o.queryRow(ctx, q, args...)
}

// QueryKeys sends q with args and reads one text column.
func (o OneTrip) QueryKeys(ctx context.Context, q string, args ...any) ([]string, error) {
	return o.o.queryKeys(ctx, q, args...)
}
