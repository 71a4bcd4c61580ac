package pglock

import (
	"context"
	"time"
)

// pruneBatch is how many rows one prune statement deletes at most: each is a short
// transaction, and rows it has locked cost an acquisition of their key that attempt.
const pruneBatch = 1000

// Prune deletes the store's locks whose lease ended, released or expired, more than
// olderThan ago, and returns how many it deleted. A key is kept after its release so
// that its next acquisition finds its row; without pruning, every key ever used stays
// in the table. A permit is a lock like any other. With them, whatever olderThan, it
// deletes what fair waiters whose clients died leave in the queues (not polled for a
// minute: such a waiter that comes back queues again) and the row of each semaphore
// that no permit has a row of any more (the next acquisition of a permit makes it
// again); those are not counted. It deletes the slots of jobs with a schedule that
// ended (or whose holder died) more than olderThan ago, never a job's latest, and
// counts them.
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
// ErrInvalidArgument and deletes nothing. On a type that embeds a Store it returns an
// error wrapping errors.ErrUnsupported. It is safe for concurrent use. Each call scans
// the table (expires_at has no index, so that renewals stay HOT updates): run it every
// few minutes, from a job for instance:
//
//	prune, err := client.Job("pglock:prune", func(ctx context.Context) error {
//		_, err := client.Prune(ctx, time.Hour)
//		return err
//	}, pglock.OnOneInstance())
//	...
//	_, err = scheduler.NewJob(gocron.DurationJob(5*time.Minute), prune.Task(), pglock.GocronOptions(prune.Key())...)
func (c *Client) Prune(ctx context.Context, olderThan time.Duration) (int64, error) {
	if olderThan < 0 {
		return 0, invalidArg("Prune: olderThan %v is negative", olderThan)
	}
	b, err := c.backend("prune", "cannot prune")
	if err != nil {
		return 0, err
	}
	total, err := pruneAll(ctx, func(ctx context.Context) (int64, error) { return b.prune(ctx, olderThan, pruneBatch) })
	if s := c.slotStore(); s != nil && err == nil {
		var slots int64
		slots, err = pruneAll(ctx, func(ctx context.Context) (int64, error) { return s.slotPrune(ctx, olderThan, pruneBatch) })
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
