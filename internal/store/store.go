package store

import (
	"context"
	"strings"
	"time"
)

// Store keeps the locks that every instance shares. Each method is atomic and measures
// expiry on the store's own clock: of any number of concurrent callers of Acquire for one
// key, exactly one wins. An expired lock does not exist for any method. NewPostgres,
// NewSQL and NewMemory make the stores there are: a Client's, wrapped in pglock.Store.
// See the package doc, # Stores. Optional capabilities (Wanter, Slots) are found by
// type assertion.
type Store interface {
	// Acquire takes key for owner for ttl if no live lock holds it, and returns its
	// fencing token: positive, and greater than every token the key had before.
	// acquired is false, with a nil error, when a live holder has the key.
	Acquire(ctx context.Context, key, owner string, ttl time.Duration) (token int64, acquired bool, err error)
	// Renew moves the expiry of key to ttl from now if owner still holds it live,
	// and reports whether it did. It never re-creates a lock.
	Renew(ctx context.Context, key, owner string, ttl time.Duration) (bool, error)
	// Release gives key back if owner still holds it live, and reports whether it did.
	Release(ctx context.Context, key, owner string) (bool, error)

	// RenewMany renews many locks of one ttl in one call. keys and owners have the
	// same length, and keys has no duplicates; renewed lists the keys whose (key,
	// owner) was still held live and was renewed.
	RenewMany(ctx context.Context, keys, owners []string, ttl time.Duration) (renewed []string, err error)
	// Holder returns key's live lease (see Election.Leader): Held false, and every
	// field but Key zero, when the key is free, released or expired.
	Holder(ctx context.Context, key string) (LockInfo, error)

	// ListLocks returns the locks whose key starts with prefix, sorted by key byte by
	// byte, never nil (see Client.Locks).
	ListLocks(ctx context.Context, prefix string) ([]LockInfo, error)
	// SemAcquire takes the lowest free permit of the semaphore key (1..permits) for
	// owner for ttl, while fewer than permits live holders hold its permits, and returns
	// the permit's number and its token (greater than every token the permit had);
	// acquired false, with a nil error, when none is free (see pglock.sem_acquire).
	SemAcquire(ctx context.Context, key, owner string, ttl time.Duration, permits int) (permit int, token int64, acquired bool, err error)
	// ReleaseMany releases keys[i] for owners[i] in one call, as Release does, and
	// returns the indexes i of those it released: the client's hand-backs (see
	// handBacks). A key is a lock's key or a permit's row key, or a semaphore's key
	// followed by PermitSeparator for the permit of unknown number that the owner may
	// hold live.
	ReleaseMany(ctx context.Context, keys, owners []string) (released []int, err error)

	// ForceRelease ends the lease of key's live holder, whoever it is, so that its
	// renewals are refused and the next acquisition gets a greater token, and returns
	// the lock as it was just before; Held false (and nothing changed) when no live
	// holder had key (see Client.ForceRelease).
	ForceRelease(ctx context.Context, key string) (LockInfo, error)
	// Prune deletes up to limit locks whose lease ended (released or expired) more
	// than olderThan ago, never a live one, keeping the token rule, and returns how
	// many it deleted. It returns 0 at once when another prune is running (see
	// Client.Prune).
	Prune(ctx context.Context, olderThan time.Duration, limit int) (int64, error)

	// RecordRun records one run of a job; retention says how old the job's runs may
	// get (see RunHistory).
	RecordRun(ctx context.Context, r RunRecord, retention time.Duration) error
	// RecordSkips adds counts of skipped ticks of instance, one per job and reason.
	RecordSkips(ctx context.Context, instance string, skips []SkipCount, retention time.Duration) error
	// JobRuns returns the last limit runs of job, newest first (see Client.JobRuns).
	JobRuns(ctx context.Context, job string, limit int) ([]JobRun, error)
	// JobStatuses returns every job with runs or skips (see Client.JobStatuses).
	JobStatuses(ctx context.Context) ([]JobStatus, error)

	// QueueAcquire takes t for owner for ttl when it is free and no live fair waiter
	// is queued on it (token > 0, ticket 0; for a semaphore, its lowest free permit),
	// or queues owner (ticket > 0, token 0) and returns ahead as QueuePoll does. See Fair.
	QueueAcquire(ctx context.Context, t Target, owner string, ttl time.Duration) (permit int, token, ticket int64, ahead int, err error)
	// QueuePoll polls a queued waiter of key (a lock's or a semaphore's): it claims
	// what was granted to it, or takes the key (a free permit) when its turn has come,
	// and returns its token (and permit) with queued false; else it records that the
	// waiter is live and returns 0 with queued true, and ahead: how many live waiters
	// ahead of it wait for a grant, counted up to MaxAhead (0: the next grant is its).
	// queued false with a 0 token: the ticket is not in the queue.
	QueuePoll(ctx context.Context, key string, ticket int64) (permit int, token int64, queued bool, ahead int, err error)
	// QueueLeave takes the waiter out of the queue, passing on a grant it had not
	// claimed, and reports whether it was queued.
	QueueLeave(ctx context.Context, key string, ticket int64) (bool, error)
	// RegistryTouch writes that instance registered keys of kind (KindJob,
	// KindElection): a registration when registering, else a refresh (see registry).
	RegistryTouch(ctx context.Context, kind string, keys []string, instance string, registering bool) error
	// RegistryClose marks instance's registrations of keys of kind closed: it left.
	RegistryClose(ctx context.Context, kind string, keys []string, instance string) error
	// Registrations returns the registrations of kind, by key then instance, each
	// with its state as of the read.
	Registrations(ctx context.Context, kind string) ([]RegistryRow, error)
	// Elections returns every registered election's key with its live holder, as
	// Holder reads it, sorted by key (see Client.Elections).
	Elections(ctx context.Context) ([]LockInfo, error)
}

// Wanter is the PostgreSQL stores' capability of marking a key wanted by a waiter,
// so that its release notifies the listeners (see listener.go). Only a store whose
// releases NOTIFY has it, and only a Client with a listener uses it. wanted is true
// when a live holder has the key and the mark is set; false means "try to acquire it
// now".
type Wanter interface {
	MarkWanted(ctx context.Context, key string) (wanted bool, err error)
	// AcquireOrWant is Store.Acquire that, when the key is held, marks it wanted in
	// the same call: wanted reports that it did (the key's release will notify), so
	// that the waiter parks without a MarkWanted round trip; acquired and wanted both
	// false mean "try again now".
	AcquireOrWant(ctx context.Context, key, owner string, ttl time.Duration) (token int64, acquired, wanted bool, err error)
	// SemWant marks every live permit of the semaphore key wanted, so that the release
	// of any of them notifies, and reports whether the semaphore is full (at least
	// permits live holders); false means "try to acquire now".
	SemWant(ctx context.Context, key string, permits int) (wanted bool, err error)
}

// checkTicket checks a fair waiter's key and ticket, as checkCall does a lock's.
func checkTicket(key string, ticket int64) error {
	if err := CheckKey(key); err != nil {
		return err
	}
	if ticket < 1 {
		return invalidArg("ticket %d: want 1 or more", ticket)
	}
	return nil
}

// checkQueueCall checks a fair acquisition of t, as checkCall does a lock's and
// checkSemCall a permit's.
func checkQueueCall(t Target, owner string, ttl time.Duration) error {
	if t.Permits != 0 {
		return checkSemCall(t.Key, owner, ttl, t.Permits)
	}
	return checkCall(t.Key, owner, ttl)
}

// checkReleaseMany checks the arguments of Store.ReleaseMany, as checkCall does
// one lock's and checkSemCall one permit's.
func checkReleaseMany(keys, owners []string) error {
	if len(keys) != len(owners) || len(keys) > MaxReleaseMany {
		return invalidArg("release many: %d keys and %d owners: want as many of each, at most %d", len(keys), len(owners), MaxReleaseMany)
	}
	for i, key := range keys {
		var err error
		if sem, ok := strings.CutSuffix(key, PermitSeparator); ok {
			err = checkSemCall(sem, owners[i], time.Millisecond, 1)
		} else {
			err = checkCall(key, owners[i], time.Millisecond)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// MaxReleaseMany is the most keys one releaseMany call takes
// (pglock.lock_release_many's limit).
const MaxReleaseMany = 1000

// checkRenewMany checks the arguments of Store.RenewMany, as checkCall does one
// lock's.
func checkRenewMany(keys, owners []string, ttl time.Duration) error {
	if len(keys) != len(owners) {
		return invalidArg("renew many: %d keys and %d owners", len(keys), len(owners))
	}
	for i := range keys {
		if err := checkCall(keys[i], owners[i], ttl); err != nil {
			return err
		}
	}
	return nil
}
