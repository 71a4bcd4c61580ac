package pglock

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// pruneBatch is how many rows one prune statement deletes at most: each is a short
// transaction, and rows it has locked cost an acquisition of their key that attempt.
const pruneBatch = 1000

// pruner is a store's capability of deleting locks released or expired long ago (see
// Client.Prune). The PostgreSQL and memory stores have it.
type pruner interface {
	// prune deletes up to limit locks whose lease ended (released or expired) more
	// than olderThan ago, never a live one, keeping the token rule, and returns how
	// many it deleted. It returns 0 at once when another prune is running.
	prune(ctx context.Context, olderThan time.Duration, limit int) (int64, error)
}

// Prune deletes the store's locks whose lease ended, released or expired, more than
// olderThan ago, and returns how many it deleted. A key is kept after its release so
// that its next acquisition finds its row; without pruning, every key ever used stays
// in the table.
//
// Prune never touches a live lock, whatever olderThan (0 prunes every lock not held
// now), nor the row of a lock that an acquisition, a renewal, a release or an open
// fenced transaction (FenceHeld) has row-locked: it skips it, without waiting. The
// token rule holds across it: a pruned key acquired again gets a token greater than
// every token it had. It is safe to call from many instances at once: the calls take
// turns, and one that finds another running returns at once with what it deleted.
// The one cost to others: an acquisition of a long-dead key whose row a prune has
// locked at that moment loses that attempt (TryAcquire returns ErrNotAcquired; Acquire
// retries).
//
// It deletes in batches of 1000 rows, each one statement, until a batch deletes fewer
// or another instance's prune is running. ctx bounds the whole; when it ends, Prune
// returns what it deleted so far and ctx's error. A negative olderThan is
// ErrInvalidArgument and deletes nothing. On a store other than the PostgreSQL and
// memory stores it returns an error wrapping errors.ErrUnsupported. It is safe for
// concurrent use. Each call scans the table (expires_at has no index, so that renewals
// stay HOT updates): run it every few minutes, from a job for instance:
//
//	prune, err := client.Job("pglock:prune", func(ctx context.Context) error {
//		_, err := client.Prune(ctx, time.Hour)
//		return err
//	}, pglock.OnOneInstance())
//	...
//	_, err = scheduler.NewJob(gocron.DurationJob(5*time.Minute), prune.Task(), pglock.GocronOptions("pglock-prune")...)
func (c *Client) Prune(ctx context.Context, olderThan time.Duration) (int64, error) {
	if olderThan < 0 {
		return 0, invalidArg("Prune: olderThan %v is negative", olderThan)
	}
	p, ok := c.store.(pruner)
	if !ok {
		return 0, fmt.Errorf("pglock: prune: %T cannot prune: %w", unwatched(c.store), errors.ErrUnsupported)
	}
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		n, err := p.prune(ctx, olderThan, pruneBatch)
		total += n
		if err != nil || n < pruneBatch {
			return total, err
		}
	}
}
