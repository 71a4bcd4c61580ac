package main

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pgfence/pglock"
)

// The semaphore of the run: every worker takes its permits (Config.Permits of them).
// A permit's lease is the row of its row key (permitRowKey) in pglock.locks, and the
// counters it writes under the permit are the rows of that key in the counter tables:
// each permit has rows of its own, which its token fences (FenceUpdate), and which
// FenceHeld fences with the semaphore's key and the permit's token.
const semKey = "sem"

// permitSeparator separates a semaphore's key from a permit's number in the permit's
// row key (pglock's migration 000013).
const permitSeparator = "\x1f"

// permitRowKey returns the row key of permit of the semaphore key, or key for a lock
// (permit 0).
func permitRowKey(key string, permit int) string {
	if permit == 0 {
		return key
	}
	return key + permitSeparator + strconv.Itoa(permit)
}

// rowKey is the key under which the history names l: its key, or its permit's row key.
func rowKey(l *pglock.Lock) string { return permitRowKey(l.Key(), l.Permit()) }

// semaphoreOf returns the semaphore of a permit's row key, and the key itself for any
// other key (a lock's, or a semaphore's).
func semaphoreOf(key string) string {
	sem, _, _ := strings.Cut(key, permitSeparator)
	return sem
}

// isPermit reports whether key is a permit's row key.
func isPermit(key string) bool { return strings.Contains(key, permitSeparator) }

// semLoop takes a permit of the semaphore and does read-modify-writes of the permit's
// counters under it, as lockLoop does under a key's lock, until ctx ends: with Acquire
// and Release, or in a WithPermit section; then it rests ttl/10 to ttl/2. A holder
// thinks long and writes little (see critical): the semaphore is full and contended
// most of the time for a tenth of the lock loop's history records.
func (w *worker) semLoop(ctx context.Context) {
	rng := rand.New(rand.NewPCG(w.cfg.seed, 4))
	for ctx.Err() == nil {
		if rng.IntN(2) == 0 {
			w.withLock(ctx, rng, semKey, func(ctx context.Context, fn func(context.Context) error) error {
				return w.sem.WithPermit(ctx, fn, pglock.Wait(5*w.cfg.ttl))
			})
		} else {
			w.acquireRelease(ctx, rng, semKey, func() (*pglock.Lock, error) {
				return w.sem.Acquire(ctx, pglock.Wait(5*w.cfg.ttl))
			})
		}
		sleep(ctx, between(rng, w.cfg.ttl/10, w.cfg.ttl/2))
	}
}

// mutCountThenTake is the mutation of the semaphore (see mutateSemaphore).
const mutCountThenTake = "count-then-take"

// countThenTake is pglock.sem_acquire as a semaphore is often first written: count
// the live holders, and if they are fewer than permits, take a free permit. It takes no
// turns (no row lock on the semaphore's row) and takes the lowest free number of 1 to
// 1000 rather than of 1 to permits, so that two acquisitions that count at once both
// take a permit. The pg_sleep between the count and the take stands in for a busy
// server, so that a 30-second run meets the race.
const countThenTake = `
CREATE OR REPLACE FUNCTION pglock.sem_acquire(key text, owner text, ttl_ms bigint, permits integer,
    OUT permit integer, OUT fencing_token bigint)
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    live integer;
    candidate integer;
BEGIN
    SELECT count(*) INTO live FROM pglock.locks l
    WHERE strpos(l.key, chr(31)) > 0 AND split_part(l.key, chr(31), 1) = sem_acquire.key
      AND l.owner IS NOT NULL AND l.expires_at > clock_timestamp();
    IF live >= sem_acquire.permits THEN
        RETURN;
    END IF;
    PERFORM pg_sleep(0.05);
    FOR candidate IN
        SELECT i FROM generate_series(1, 1000) AS g(i)
        WHERE NOT EXISTS (
            SELECT FROM pglock.locks l
            WHERE l.key = sem_acquire.key || chr(31) || g.i
              AND l.owner IS NOT NULL AND l.expires_at > clock_timestamp())
        ORDER BY g.i
    LOOP
        sem_acquire.fencing_token := pglock.lock_take(sem_acquire.key || chr(31) || candidate,
            sem_acquire.owner, sem_acquire.ttl_ms);
        IF sem_acquire.fencing_token IS NOT NULL THEN
            sem_acquire.permit := candidate;
            RETURN;
        END IF;
    END LOOP;
END $$;`

// mutateSemaphore, under the count-then-take mutation, installs countThenTake as
// pglock.sem_acquire.
func (c *controller) mutateSemaphore(ctx context.Context) error {
	if c.cfg.Mutate != mutCountThenTake {
		return nil
	}
	_, err := c.pool.Exec(ctx, countThenTake)
	return err
}

// permitRows returns the row keys of the semaphore's permits, for the counter tables.
func permitRows(permits int) []string {
	rows := make([]string, permits)
	for i := range rows {
		rows[i] = permitRowKey(semKey, i+1)
	}
	return rows
}

// semaphores checks invariant 9: at no instant on the database clock does a semaphore
// have more live holders than its permits (Config.Permits, which every worker asks
// for). A permit's lease is live from its acquisition to its release or expiry, as for
// a lock (lease.end). It also counts the permits' acquisitions and measures the most
// holders at once, and how long the semaphore had all its permits held.
func (c *checker) semaphores() {
	st := &c.r.Stats
	for _, r := range c.h.Records {
		if semaphoreOf(r.Key) != semKey {
			continue
		}
		switch {
		case r.F == fAcquire && r.Type == typeOK:
			st.Permits[0]++
		case r.F == fAcquire && r.Type == typeFail && strings.HasPrefix(r.Err, pglock.ErrNotAcquired.Error()):
			st.Permits[1]++
		case r.F == fAcquire && r.Type == typeFail:
			st.Permits[2]++
		case r.F == fWrite && r.Table != tableUnfenced && r.Type == typeOK:
			st.PermitWrites[0]++
		case r.F == fWrite && r.Table != tableUnfenced && r.Type == typeFail:
			st.PermitWrites[1]++
		}
	}
	type edge struct {
		at time.Time
		up bool // a lease starts; else one ends
		l  *lease
	}
	bySem := map[string][]edge{}
	for key, ls := range c.leases {
		if !isPermit(key) {
			continue
		}
		for _, l := range ls {
			st.PermitLeases++
			bySem[semaphoreOf(key)] = append(bySem[semaphoreOf(key)], edge{l.start, true, l}, edge{l.end(), false, l})
		}
	}
	n := c.h.Config.Permits
	if n < 1 {
		return // a history from before the semaphore worker
	}
	for _, sem := range slices.Sorted(maps.Keys(bySem)) {
		es := bySem[sem]
		// At the same instant an end comes first: a lease is live while expires_at is
		// after the clock, so that one ending at t and one starting at t are not both live.
		slices.SortStableFunc(es, func(a, b edge) int {
			if d := a.at.Compare(b.at); d != 0 {
				return d
			}
			return cmp.Compare(boolInt(a.up), boolInt(b.up))
		})
		live := map[*lease]bool{}
		var fullSince time.Time
		for _, e := range es {
			was := len(live)
			if e.up {
				live[e.l] = true
			} else {
				delete(live, e.l)
			}
			now := len(live)
			st.MaxHolders = max(st.MaxHolders, now)
			switch {
			case was < n && now >= n:
				fullSince = e.at
			case was >= n && now < n:
				st.SemaphoreFull += e.at.Sub(fullSince)
			}
			if was <= n && now > n {
				c.r.violate(invSemaphore, "semaphore %q had %d live holders at %s, more than its %d permits: %s",
					sem, now, stamp(e.at), n, describeHolders(live))
			}
		}
	}
}

// describeHolders lists the leases of live by permit: number, token, holder and span.
func describeHolders(live map[*lease]bool) string {
	ls := slices.SortedFunc(maps.Keys(live), func(a, b *lease) int { return cmp.Compare(a.key, b.key) })
	var s []string
	for _, l := range ls {
		_, num, _ := strings.Cut(l.key, permitSeparator)
		s = append(s, fmt.Sprintf("permit %s (token %d, %s) from %s until %s", num, l.token, l.worker, stamp(l.start), stamp(l.end())))
	}
	return strings.Join(s, "; ")
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
