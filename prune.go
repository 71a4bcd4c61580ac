package pglock

import (
	"context"
	"time"
)

// pruneBatch is how many rows one prune statement deletes at most: each is a short
// transaction, and rows it has locked cost an acquisition of their key that attempt.
const pruneBatch = 1000

// Prune deletes the store's locks, permits included, whose lease ended (released or
// expired) more than olderThan ago, and the slots of scheduled jobs that ended more than
// olderThan ago (never a job's latest), and returns how many it deleted; 0 prunes every
// lock not held now. It never touches a live lock, and tokens keep growing across it. It is
// safe to call from many instances at once. Each call scans the table: run it every few
// minutes, from a job for instance. ctx bounds the whole: when it ends, Prune returns
// what it deleted so far and ctx's error. A negative olderThan is ErrInvalidArgument. See
// the package doc, # Listing, forcing a release and pruning.
func (c *Client) Prune(ctx context.Context, olderThan time.Duration) (int64, error) {
	if olderThan < 0 {
		return 0, invalidArg("Prune: olderThan %v is negative", olderThan)
	}
	total, err := pruneAll(ctx, func(ctx context.Context) (int64, error) { return c.store.Prune(ctx, olderThan, pruneBatch) })
	if s := c.slotStore(); s != nil && err == nil {
		var slots int64
		slots, err = pruneAll(ctx, func(ctx context.Context) (int64, error) { return s.SlotPrune(ctx, olderThan, pruneBatch) })
		total += slots
	}
	return total, err
}

// pruneAll calls prune, which deletes up to pruneBatch rows, until it deletes fewer or
// ctx ends, and returns how many rows it deleted.
func pruneAll(ctx context.Context, prune func(ctx context.Context) (int64, error)) (int64, error) {
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		n, err := prune(ctx)
		total += n
		if err != nil || n < pruneBatch {
			return total, err
		}
	}
}
