package pglock

import (
	"context"
	"database/sql"
	"time"
)

// The stores' side of slots (slot.go): pglock.job_slots and its functions (000030).
// Only the PostgreSQL stores keep slots; a Client finds them by type assertion on its
// store (Client.slotStore), so that Store and backend stay as they are.

// slotStore is a store that keeps slots.
type slotStore interface {
	// slotClaim claims a slot (see pglock.job_slot_claim).
	slotClaim(ctx context.Context, a slotClaimArgs) (slotClaimReply, error)
	// slotEnd records how an attempt ended and releases its lock, reporting whether
	// owner still held it (see pglock.job_slot_end).
	slotEnd(ctx context.Context, job string, slot time.Time, owner string, token int64, outcome string,
		backoff time.Duration) (released bool, err error)
	// slotRetry claims a new attempt of a slot of job that may be attempted again now
	// (see pglock.job_slot_retry); ok false when none may.
	slotRetry(ctx context.Context, job, owner string, ttl time.Duration) (slotRetryReply, error)
	// slotPrune deletes up to limit slots ended more than olderThan ago (see
	// pglock.job_slot_prune).
	slotPrune(ctx context.Context, olderThan time.Duration, limit int) (int64, error)
}

// slotClaimArgs is a claim of slot for owner for ttl. next is the schedule's slot after
// it for a tick's claim, zero for a missed slot caught up.
type slotClaimArgs struct {
	job        string
	slot, next time.Time
	owner      string
	ttl        time.Duration
	attempts   int
	deadline   time.Duration // 0: none
}

// slotClaimReply is job_slot_claim's answer. Times are on the database clock; prior
// and due are zero when it gave none.
type slotClaimReply struct {
	status string // claimClaimed, claimTaken, claimLate or claimMoved
	token  int64
	prior  time.Time
	now    time.Time
	due    time.Time
}

// The statuses of a claim.
const (
	claimClaimed = "claimed"
	claimTaken   = "taken"
	claimLate    = "late"
	claimMoved   = "moved"
)

// slotRetryReply is job_slot_retry's answer: ok with the slot, token and attempt
// claimed, or due (zero when nothing is pending).
type slotRetryReply struct {
	ok      bool
	slot    time.Time
	token   int64
	attempt int
	now     time.Time
	due     time.Time
}

func slotMillis(t time.Time) int64 { return t.UnixMilli() }

func micros(v sql.NullInt64) time.Time {
	if !v.Valid {
		return time.Time{}
	}
	return time.UnixMicro(v.Int64)
}

func (s *postgresStore) slotClaim(ctx context.Context, a slotClaimArgs) (slotClaimReply, error) {
	var next any
	if !a.next.IsZero() {
		next = slotMillis(a.next)
	}
	var r slotClaimReply
	var token, prior, now, due sql.NullInt64
	err := s.queryRow(ctx, `SELECT status, fencing_token, prior_ms, now_us, due_us
		FROM pglock.job_slot_claim($1, $2, $3, $4, $5, $6, $7)`,
		a.job, slotMillis(a.slot), next, a.owner, ttlMillis(a.ttl), a.attempts, ttlMillis(a.deadline)).
		Scan(&r.status, &token, &prior, &now, &due)
	if err != nil {
		return r, storeError(err, "claim slot %v of %q", a.slot.UTC(), a.job)
	}
	r.token, r.now, r.due = token.Int64, micros(now), micros(due)
	if prior.Valid {
		r.prior = time.UnixMilli(prior.Int64)
	}
	return r, nil
}

func (s *postgresStore) slotEnd(ctx context.Context, job string, slot time.Time, owner string, token int64,
	outcome string, backoff time.Duration) (bool, error) {
	var released bool
	err := s.queryRow(ctx, `SELECT pglock.job_slot_end($1, $2, $3, $4, $5, $6)`,
		job, slotMillis(slot), owner, token, outcome, ttlMillis(backoff)).Scan(&released)
	if err != nil {
		return false, storeError(err, "end slot %v of %q", slot.UTC(), job)
	}
	return released, nil
}

func (s *postgresStore) slotRetry(ctx context.Context, job, owner string, ttl time.Duration) (slotRetryReply, error) {
	var r slotRetryReply
	var slot, token, attempt, now, due sql.NullInt64
	err := s.queryRow(ctx, `SELECT slot_ms, fencing_token, attempt, now_us, due_us FROM pglock.job_slot_retry($1, $2, $3)`,
		job, owner, ttlMillis(ttl)).Scan(&slot, &token, &attempt, &now, &due)
	if err != nil {
		return r, storeError(err, "retry a slot of %q", job)
	}
	r.ok, r.token, r.attempt, r.now, r.due = slot.Valid, token.Int64, int(attempt.Int64), micros(now), micros(due)
	if slot.Valid {
		r.slot = time.UnixMilli(slot.Int64)
	}
	return r, nil
}

func (s *postgresStore) slotPrune(ctx context.Context, olderThan time.Duration, limit int) (int64, error) {
	var deleted int64
	if err := s.queryRow(ctx, `SELECT pglock.job_slot_prune($1, $2)`, ttlMillis(olderThan), limit).Scan(&deleted); err != nil {
		return 0, storeError(err, "prune slots")
	}
	return deleted, nil
}

// slotStore returns the client's store as a slotStore, its calls watched for Health,
// or nil when the store keeps no slots.
func (c *Client) slotStore() slotStore {
	s, ok := unwatched(c.store).(slotStore)
	if !ok {
		return nil
	}
	return watchedSlots{s: s, k: c.health.calls}
}

// watchedSlots is a slotStore whose calls feed Health, as watched's do.
type watchedSlots struct {
	s slotStore
	k *calls
}

func (w watchedSlots) slotClaim(ctx context.Context, a slotClaimArgs) (_ slotClaimReply, err error) {
	defer w.k.end(w.k.begin(ctx, "claim slot", a.ttl, false), &err)
	return w.s.slotClaim(ctx, a)
}

func (w watchedSlots) slotEnd(ctx context.Context, job string, slot time.Time, owner string, token int64,
	outcome string, backoff time.Duration) (_ bool, err error) {
	defer w.k.end(w.k.begin(ctx, "end slot", 0, false), &err)
	return w.s.slotEnd(ctx, job, slot, owner, token, outcome, backoff)
}

func (w watchedSlots) slotRetry(ctx context.Context, job, owner string, ttl time.Duration) (_ slotRetryReply, err error) {
	defer w.k.end(w.k.begin(ctx, "retry slot", ttl, false), &err)
	return w.s.slotRetry(ctx, job, owner, ttl)
}

func (w watchedSlots) slotPrune(ctx context.Context, olderThan time.Duration, limit int) (_ int64, err error) {
	defer w.k.end(w.k.begin(ctx, "prune slots", 0, false), &err)
	return w.s.slotPrune(ctx, olderThan, limit)
}
