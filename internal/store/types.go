package store

import "time"

// The types that cross Store.

// Target is what an acquisition takes: a lock's key, or a permit of a semaphore.
type Target struct {
	Key     string // the lock's key, or the semaphore's
	Permits int    // the semaphore's permits; 0 for a lock
}

// LockInfo is one lock as the store sees it: pglock.LockInfo, whose doc says what each
// field means.
type LockInfo struct {
	Key, Owner, Instance  string
	Permit                int
	Token                 int64
	Held, Waiting         bool
	AcquiredAt, ExpiresAt time.Time
	TTL, ExpiresIn        time.Duration
}

// RunRecord is one run to record. Ended is on the real clock of this process: the
// store turns it into its own clock when it writes the run.
type RunRecord struct {
	Job, Instance, Owner string
	Token                int64
	Slot                 time.Time // zero for a job without a schedule
	Attempt              int       // the slot's attempt; 0 without a slot
	Ended                time.Time
	Duration             time.Duration
	Outcome              string
	Err                  string
}

// SkipCount is the skips of one job for one reason counted since the last flush.
type SkipCount struct {
	Job    string
	Reason string
	Count  int64
	Last   time.Time // real clock, as RunRecord.Ended
}

// JobRun, JobSlots, JobSkips and JobStatus are pglock's types of the same names, as the
// stores read them.
type (
	JobRun struct {
		Job, Instance, Owner string
		Token                int64
		Started, Ended       time.Time
		Outcome              string
		Error                string
		Slot                 time.Time
		Attempt              int
	}
	JobSlots struct {
		Last                                        time.Time
		OK, Failed, Running, Lost, Pending, Retried int64
	}
	JobSkips struct {
		Instance string
		Reason   string
		Count    int64
		Last     time.Time
	}
	JobStatus struct {
		Job         string
		LastRun     *JobRun
		LastFailure *JobRun
		Skips       []JobSkips
		Slots       *JobSlots
		// Registrations are the instances that registered the job (WithRegistrations).
		Registrations []Registration
	}
)

// OutcomeOK is the outcome of a run that returned nil (pglock.OutcomeOK).
const OutcomeOK = "ok"

// Registration is one registration of a key by an instance (pglock.Registration).
type Registration struct {
	Instance   string
	Registered time.Time
	Seen       time.Time
	State      string // RegistrationLive, RegistrationClosed or RegistrationGone
}

// RegistryRow is one registration as the store lists it.
type RegistryRow struct {
	Key string
	Registration
}

// QueueBound is Q, how long a fair waiter stays live after its last poll and how long
// a grant waits for its claim: the database's "interval '1 second'" in 000014.
const QueueBound = time.Second

// MaxAhead is how far queue_poll (000024) and queue_acquire (000026) count the waiters
// ahead of the caller.
const MaxAhead = 8

// Timeout bounds the store calls a Client makes on a context detached from its
// caller's cancellation: releases (a lease's at Close too), the hand-backs of failed
// acquisitions, the run history's writes, Health's probes.
const Timeout = 5 * time.Second
