package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pglock"
)

// Slots (issue 35): every worker ticks two jobs with a schedule, on every multiple of
// slotEvery since the epoch, the same slots in every worker. slotOnceKey is at most
// once; slotAtLeastKey at least once, its runs thinking and failing now and then so
// that pauses, kills and partitions land in them. Each run appends a row to
// torture.slot_runs, fenced by its slot's lock (FenceHeld on an INSERT), and records
// its start (an invoke with the slot and the token) in the worker's history.
const (
	slotOnceKey    = "slots:once"
	slotAtLeastKey = "slots:atleast"
	slotEvery      = 250 * time.Millisecond
	slotAttempts   = 3
	fSlot          = "slot" // a run of a slot, Wrote its slot in ms since the epoch
)

// slotBackoff is the at-least-once job's backoff: a tenth of the ttl.
func slotBackoff(ttl time.Duration) time.Duration { return ttl / 10 }

// slotJobs registers the two jobs.
func (w *worker) slotJobs() (once, atLeast *pglock.Job, err error) {
	once, err = w.client.Job(slotOnceKey, w.slotRun(slotOnceKey, nil), pglock.Every(slotEvery))
	if err != nil {
		return nil, nil, err
	}
	rng := rand.New(rand.NewPCG(w.cfg.seed, 0x510))
	atLeast, err = w.client.Job(slotAtLeastKey, w.slotRun(slotAtLeastKey, rng), pglock.Every(slotEvery),
		pglock.AtLeastOnce(slotAttempts, slotBackoff(w.cfg.ttl)))
	return once, atLeast, err
}

// slotTicks ticks both jobs on every slot, until ctx ends.
func (w *worker) slotTicks(ctx context.Context, jobs ...*pglock.Job) {
	for {
		next := time.Now().Truncate(slotEvery).Add(slotEvery)
		if !sleep(ctx, time.Until(next)) {
			return
		}
		for _, j := range jobs {
			if err := j.Run(ctx); err != nil && ctx.Err() == nil {
				w.h.add(Record{Type: typeFail, F: fSlot, Key: j.Key(), Err: err.Error()})
			}
		}
	}
}

// slotRun is a job's run: it records its start, then appends its row, fenced by its
// slot's lock. With rng (the at-least-once job's), it thinks up to half a ttl first,
// and one run in ten fails after its write.
func (w *worker) slotRun(job string, rng *rand.Rand) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		l, ok := pglock.FromContext(ctx)
		slot, slotted := pglock.SlotFromContext(ctx)
		if !ok || !slotted {
			return errors.New("torture: a slot's run without its lock or slot")
		}
		op := w.op()
		base := Record{F: fSlot, Key: job, Op: op, Owner: l.Owner(), Token: l.Token(), Wrote: slot.UnixMilli()}
		w.h.add(with(base, typeInvoke, time.Time{}, nil))
		// The run's end lets the slot's lock go: the client releases it once fn returns.
		defer w.h.add(Record{Type: typeInvoke, F: fRelease, Key: l.Key(), Owner: l.Owner(), Token: l.Token()})
		fail := false
		if rng != nil {
			w.slotMu.Lock()
			think := time.Duration(rng.Int64N(int64(w.cfg.ttl / 2)))
			fail = rng.IntN(10) == 0
			w.slotMu.Unlock()
			sleep(context.WithoutCancel(ctx), think) // as a run that goes on after its ctx ends
		}
		q, args, err := pglock.FenceHeld("INSERT INTO torture.slot_runs (job, slot, token, op) VALUES ($1, $2, $3, $4) RETURNING clock_timestamp()",
			l.Key(), l.Token(), job, slot, l.Token(), op)
		if err != nil {
			return err
		}
		octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
		defer cancel()
		r := w.exec(octx, base, q, args)
		w.h.add(r)
		if fail || r.Type != typeOK {
			return fmt.Errorf("torture: attempt of slot %d did not succeed (%s)", slot.UnixMilli(), r.Type)
		}
		return nil
	}
}

// SlotRow is a slot of pglock.job_slots at the end of a run.
type SlotRow struct {
	Job       string     `json:"job"`
	Slot      time.Time  `json:"slot"`
	Attempt   int        `json:"attempt"`
	Attempts  int        `json:"attempts"`
	Token     *int64     `json:"token"`
	ClaimedAt time.Time  `json:"claimed_at"`
	EndedAt   *time.Time `json:"ended_at"`
	Outcome   *string    `json:"outcome"`
}

// SlotRunRow is a row torture.slot_runs accepted: a run's fenced write.
type SlotRunRow struct {
	ID    int64     `json:"id"`
	Job   string    `json:"job"`
	Slot  time.Time `json:"slot"`
	Token int64     `json:"token"`
	Op    string    `json:"op"`
}

// collectSlots reads the slots and the slot runs' rows at the end of a run.
func (c *controller) collectSlots(ctx context.Context, h *History) error {
	rows, _ := c.pool.Query(ctx, `SELECT job, slot, attempt, attempts, fencing_token, claimed_at, ended_at, outcome
		FROM pglock.job_slots ORDER BY job, slot`)
	var err error
	if h.Slots, err = pgx.CollectRows(rows, pgx.RowToStructByPos[SlotRow]); err != nil {
		return err
	}
	rows, _ = c.pool.Query(ctx, `SELECT id, job, slot, token, op FROM torture.slot_runs ORDER BY id`)
	h.SlotRuns, err = pgx.CollectRows(rows, pgx.RowToStructByPos[SlotRunRow])
	return err
}

// mutSlotReclaim is the mutation of slots (see mutateSlots).
const mutSlotReclaim = "slot-reclaim"

// mutateSlots, under the slot-reclaim mutation, installs a pglock.job_slot_claim that
// claims a slot another tick claimed, once its lock is free again: a lock per tick, as
// gocron's lockers take.
func (c *controller) mutateSlots(ctx context.Context) error {
	if c.cfg.Mutate != mutSlotReclaim {
		return nil
	}
	var def string
	if err := c.pool.QueryRow(ctx, `SELECT pg_get_functiondef('pglock.job_slot_claim(text, bigint, bigint, text, bigint, integer, bigint)'::regprocedure)`).
		Scan(&def); err != nil {
		return err
	}
	const read = `ELSIF EXISTS (SELECT FROM pglock.job_slots p WHERE p.job = job_slot_claim.job AND p.slot = slot_at) THEN`
	const claim = `VALUES (job_slot_claim.job, slot_at, 1, job_slot_claim.attempts, token, job_slot_claim.owner, now)
        ON CONFLICT ON CONSTRAINT job_slots_pkey DO NOTHING;`
	if !strings.Contains(def, read) || !strings.Contains(def, claim) {
		return errors.New("torture: slot-reclaim: job_slot_claim is not as the mutation expects")
	}
	def = strings.Replace(def, read, `ELSIF false THEN`, 1)
	def = strings.Replace(def, claim, `VALUES (job_slot_claim.job, slot_at, 1, job_slot_claim.attempts, token, job_slot_claim.owner, now)
        ON CONFLICT ON CONSTRAINT job_slots_pkey DO UPDATE
        SET fencing_token = excluded.fencing_token, owner = excluded.owner, claimed_at = excluded.claimed_at;`, 1)
	_, err := c.pool.Exec(ctx, def)
	return err
}

// slots checks invariant 10. The at-most-once job: no slot runs under two claims, on
// the clients (two tokens in the runs' records) nor in the database (two tokens among
// its accepted rows). The at-least-once job: each attempt of a slot has a greater
// token than the one before, in the runs' records and in the rows the database
// accepted; and every slot claimed ends in a success or its attempts spent, unless it
// was claimed so near the run's end that its attempts could not all come before the
// workers stopped.
func (c *checker) slots() {
	st := &c.r.Stats
	runs := map[string]map[int64][]int64{} // job → slot → tokens, in record order
	for _, r := range c.h.Records {
		if r.F != fSlot || r.Type != typeInvoke {
			continue
		}
		st.SlotRuns++
		if runs[r.Key] == nil {
			runs[r.Key] = map[int64][]int64{}
		}
		runs[r.Key][r.Wrote] = append(runs[r.Key][r.Wrote], r.Token)
	}
	for _, slot := range slices.Sorted(maps.Keys(runs[slotOnceKey])) {
		if tokens := slices.Compact(slices.Sorted(slices.Values(runs[slotOnceKey][slot]))); len(tokens) > 1 {
			c.r.violate(invSlots, "%s: slot %s ran under %d claims (tokens %v)", slotOnceKey, stampMS(slot), len(tokens), tokens)
		}
	}
	for _, slot := range slices.Sorted(maps.Keys(runs[slotAtLeastKey])) {
		tokens := slices.Compact(slices.Sorted(slices.Values(runs[slotAtLeastKey][slot])))
		st.SlotRetries += len(tokens) - 1
	}
	accepted := map[string]map[time.Time][]int64{}
	for _, r := range c.h.SlotRuns {
		if accepted[r.Job] == nil {
			accepted[r.Job] = map[time.Time][]int64{}
		}
		accepted[r.Job][r.Slot] = append(accepted[r.Job][r.Slot], r.Token)
	}
	for job, bySlot := range accepted {
		for slot, tokens := range bySlot {
			if job == slotOnceKey && len(slices.Compact(slices.Sorted(slices.Values(tokens)))) > 1 {
				c.r.violate(invSlots, "%s: slot %s has rows of %d claims in the database (tokens %v)", job, stamp(slot), len(tokens), tokens)
			}
			if !slices.IsSorted(tokens) {
				c.r.violate(invSlots, "%s: slot %s: an attempt's row was accepted after a later attempt's (tokens in commit order %v)", job, stamp(slot), tokens)
			}
		}
	}
	// The workers' end: the first of the last workers to stop.
	last := map[int]Life{}
	for _, l := range c.h.Lives {
		if p, ok := last[l.Slot]; !ok || l.Start.After(p.Start) {
			last[l.Slot] = l
		}
	}
	var end time.Time
	for _, l := range last {
		if end.IsZero() || l.End.Before(end) {
			end = l.End
		}
	}
	ttl, backoff := c.h.Config.TTL, slotBackoff(c.h.Config.TTL)
	grace := time.Duration(slotAttempts) * (ttl + backoff<<(slotAttempts-1) + slotEvery + c.slack)
	for _, s := range c.h.Slots {
		if s.Outcome != nil && *s.Outcome == "missed" {
			st.SlotsMissed++
			continue
		}
		st.Slots[s.Job]++
		if s.Job != slotAtLeastKey || s.Outcome != nil && *s.Outcome == "ok" || s.Attempt >= s.Attempts {
			continue
		}
		if !end.IsZero() && s.Slot.Add(grace).After(end) {
			st.SlotsPendingAtEnd++
			continue
		}
		outcome := "running, its holder's lock gone"
		if s.Outcome != nil {
			outcome = *s.Outcome
		}
		c.r.violate(invSlots, "%s: slot %s ended %s after %d of its %d attempts", s.Job, stamp(s.Slot), outcome, s.Attempt, s.Attempts)
	}
}

// stampMS writes a slot in ms since the epoch as a time.
func stampMS(ms int64) string { return stamp(time.UnixMilli(ms)) }
