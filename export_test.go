package pglock

import (
	"time"

	"github.com/pgfence/pglock/internal/store"
)

// What the tests of package pglock_test reach inside a Client.

// InternalStore returns the store that s wraps, for a test that calls it directly.
func InternalStore(s *Store) store.Store { return s.s }

// WrapStore returns a Store on s: a test's wrapper of an InternalStore that injects
// faults.
func WrapStore(s store.Store) *Store { return &Store{s} }

// OwnIdleConns returns how many connections of c's own pool for renewals and releases
// are idle: 0 before the pool is made.
func OwnIdleConns(c *Client) int32 {
	if own := c.renewals.Own(); own != nil {
		return own.Stat().IdleConns()
	}
	return 0
}

// UndoAcquire hands key back for owner, as c does for an acquisition abandoned in flight.
func UndoAcquire(c *Client, key, owner string, ttl time.Duration) { c.handBacks.Add(key, owner, ttl) }

// ConnsPerTest and ConnsBeside are the shares of the server's max_connections of each
// test running at once and of other packages' tests (main_test.go's -parallel default).
const ConnsPerTest, ConnsBeside = connsPerTest, connsBeside
