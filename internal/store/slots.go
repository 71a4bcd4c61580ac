package store

import (
	"context"
	"database/sql"
	"time"
)

// The stores' side of slots (pglock's slot.go): pglock.job_slots and its functions
// (000030). Only the PostgreSQL stores keep slots; a Client finds them by type
// assertion on its store (Unobserved), so that Store stays as it is.

// Slots is a store that keeps slots.
type Slots interface {
	// SlotClaim claims a slot (see pglock.job_slot_claim).
	SlotClaim(ctx context.Context, a SlotClaimArgs) (SlotClaimReply, error)
	// SlotEnd records how an attempt ended and releases its lock, reporting whether
	// owner still held it (see pglock.job_slot_end).
	SlotEnd(ctx context.Context, job string, slot time.Time, owner string, token int64, outcome string,
		backoff time.Duration) (released bool, err error)
	// SlotRetry claims a new attempt of a slot of job that may be attempted again now
	// (see pglock.job_slot_retry); ok false when none may.
	SlotRetry(ctx context.Context, job, owner string, ttl time.Duration) (SlotRetryReply, error)
	// SlotPrune deletes up to limit slots ended more than olderThan ago (see
	// pglock.job_slot_prune).
	SlotPrune(ctx context.Context, olderThan time.Duration, limit int) (int64, error)
}

// SlotClaimArgs is a claim of slot for owner for ttl. next is the schedule's slot after
// it for a tick's claim, zero for a missed slot caught up.
type SlotClaimArgs struct {
	Job        string
	Slot, Next time.Time
	Owner      string
	TTL        time.Duration
	Attempts   int
	Deadline   time.Duration // 0: none
}

// SlotClaimReply is job_slot_claim's answer. Times are on the database clock; prior
// and due are zero when it gave none.
type SlotClaimReply struct {
	Status string // ClaimClaimed, ClaimTaken, ClaimLate or ClaimMoved
	Token  int64
	Prior  time.Time
	Now    time.Time
	Due    time.Time
}

// The statuses of a claim.
const (
	ClaimClaimed = "claimed"
	ClaimTaken   = "taken"
	ClaimLate    = "late"
	ClaimMoved   = "moved"
)

// SlotRetryReply is job_slot_retry's answer: ok with the slot, token and attempt
// claimed, or due (zero when nothing is pending).
type SlotRetryReply struct {
	OK      bool
	Slot    time.Time
	Token   int64
	Attempt int
	Now     time.Time
	Due     time.Time
}

func slotMillis(t time.Time) int64 { return t.UnixMilli() }

func micros(v sql.NullInt64) time.Time {
	if !v.Valid {
		return time.Time{}
	}
	return time.UnixMicro(v.Int64)
}

func (s *postgresStore) SlotClaim(ctx context.Context, a SlotClaimArgs) (SlotClaimReply, error) {
	var next any
	if !a.Next.IsZero() {
		next = slotMillis(a.Next)
	}
	var r SlotClaimReply
	var token, prior, now, due sql.NullInt64
	tokenColumn(ctx, 2)
	err := s.queryRow(ctx, `SELECT status, fencing_token, prior_ms, now_us, due_us
		FROM pglock.job_slot_claim($1, $2, $3, $4, $5, $6, $7)`,
		a.Job, slotMillis(a.Slot), next, a.Owner, ttlMillis(a.TTL), a.Attempts, ttlMillis(a.Deadline)).
		Scan(&r.Status, &token, &prior, &now, &due)
	if err != nil {
		return r, storeError(err, "claim slot %v of %q", a.Slot.UTC(), a.Job)
	}
	r.Token, r.Now, r.Due = token.Int64, micros(now), micros(due)
	if prior.Valid {
		r.Prior = time.UnixMilli(prior.Int64)
	}
	return r, nil
}

func (s *postgresStore) SlotEnd(ctx context.Context, job string, slot time.Time, owner string, token int64,
	outcome string, backoff time.Duration) (bool, error) {
	var released bool
	err := s.queryRow(ctx, `SELECT pglock.job_slot_end($1, $2, $3, $4, $5, $6)`,
		job, slotMillis(slot), owner, token, outcome, ttlMillis(backoff)).Scan(&released)
	if err != nil {
		return false, storeError(err, "end slot %v of %q", slot.UTC(), job)
	}
	return released, nil
}

func (s *postgresStore) SlotRetry(ctx context.Context, job, owner string, ttl time.Duration) (SlotRetryReply, error) {
	var r SlotRetryReply
	var slot, token, attempt, now, due sql.NullInt64
	err := s.queryRow(ctx, `SELECT slot_ms, fencing_token, attempt, now_us, due_us FROM pglock.job_slot_retry($1, $2, $3)`,
		job, owner, ttlMillis(ttl)).Scan(&slot, &token, &attempt, &now, &due)
	if err != nil {
		return r, storeError(err, "retry a slot of %q", job)
	}
	r.OK, r.Token, r.Attempt, r.Now, r.Due = slot.Valid, token.Int64, int(attempt.Int64), micros(now), micros(due)
	if slot.Valid {
		r.Slot = time.UnixMilli(slot.Int64)
	}
	return r, nil
}

func (s *postgresStore) SlotPrune(ctx context.Context, olderThan time.Duration, limit int) (int64, error) {
	var deleted int64
	if err := s.queryRow(ctx, `SELECT pglock.job_slot_prune($1, $2)`, ttlMillis(olderThan), limit).Scan(&deleted); err != nil {
		return 0, storeError(err, "prune slots")
	}
	return deleted, nil
}

// ObserveSlots returns s with every call recorded in k, as Observe's store.
func ObserveSlots(s Slots, k *Calls) Slots { return watchedSlots{s: s, k: k} }

// watchedSlots is a Slots whose calls feed Health, as watched's do.
type watchedSlots struct {
	s Slots
	k *Calls
}

func (w watchedSlots) SlotClaim(ctx context.Context, a SlotClaimArgs) (_ SlotClaimReply, err error) {
	defer w.k.end(w.k.begin(ctx, "claim slot", a.TTL, false), &err)
	return w.s.SlotClaim(ctx, a)
}

func (w watchedSlots) SlotEnd(ctx context.Context, job string, slot time.Time, owner string, token int64,
	outcome string, backoff time.Duration) (_ bool, err error) {
	defer w.k.end(w.k.begin(ctx, "end slot", 0, false), &err)
	return w.s.SlotEnd(ctx, job, slot, owner, token, outcome, backoff)
}

func (w watchedSlots) SlotRetry(ctx context.Context, job, owner string, ttl time.Duration) (_ SlotRetryReply, err error) {
	defer w.k.end(w.k.begin(ctx, "retry slot", ttl, false), &err)
	return w.s.SlotRetry(ctx, job, owner, ttl)
}

func (w watchedSlots) SlotPrune(ctx context.Context, olderThan time.Duration, limit int) (_ int64, err error) {
	defer w.k.end(w.k.begin(ctx, "prune slots", 0, false), &err)
	return w.s.SlotPrune(ctx, olderThan, limit)
}
