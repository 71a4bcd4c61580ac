package pglock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Store keeps the locks that every instance shares. Each method is atomic and measures
// expiry on the store's own clock: of any number of concurrent callers of Acquire for one
// key, exactly one wins. An expired lock does not exist for any method. Store is closed:
// NewPostgresStore, NewSQLStore and NewMemoryStore make the only stores there are. A type
// that embeds a Store is a Store too, with the three calls only. See the package
// doc, # Stores.
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

	// pglockStore seals the interface: only this package's stores have it, and a
	// type that embeds one of them.
	pglockStore()
}

// backend is everything a Client asks of a store beyond Store's three calls. The
// stores of NewPostgresStore, NewSQLStore and NewMemoryStore have it all; a type
// that embeds a Store has none of it (see Store), and Client.backend says so.
//
// It is not part of Store itself on purpose: a type that embeds a Store would then
// have these methods too, promoted from the store inside it, and the client would
// renew, read and write around the Acquire, Renew and Release that the type changed.
type backend interface {
	Store

	// renewMany renews many locks of one ttl in one call. keys and owners have the
	// same length, and keys has no duplicates; renewed lists the keys whose (key,
	// owner) was still held live and was renewed.
	renewMany(ctx context.Context, keys, owners []string, ttl time.Duration) (renewed []string, err error)
	// holder returns key's live lease (see Election.Leader): Held false, and every
	// field but Key zero, when the key is free, released or expired.
	holder(ctx context.Context, key string) (LockInfo, error)

	// listLocks returns the locks whose key starts with prefix, sorted by key byte by
	// byte, never nil (see Client.Locks).
	listLocks(ctx context.Context, prefix string) ([]LockInfo, error)
	// semAcquire takes the lowest free permit of the semaphore key (1..permits) for
	// owner for ttl, while fewer than permits live holders hold its permits, and returns
	// the permit's number and its token (greater than every token the permit had);
	// acquired false, with a nil error, when none is free (see pglock.sem_acquire).
	semAcquire(ctx context.Context, key, owner string, ttl time.Duration, permits int) (permit int, token int64, acquired bool, err error)
	// releaseMany releases keys[i] for owners[i] in one call, as Release does, and
	// returns the indexes i of those it released: the client's hand-backs (see
	// handBacks). A key is a lock's key or a permit's row key, or a semaphore's key
	// followed by permitSeparator for the permit of unknown number that the owner may
	// hold live.
	releaseMany(ctx context.Context, keys, owners []string) (released []int, err error)

	// forceRelease ends the lease of key's live holder, whoever it is, so that its
	// renewals are refused and the next acquisition gets a greater token, and returns
	// the lock as it was just before; Held false (and nothing changed) when no live
	// holder had key (see Client.ForceRelease).
	forceRelease(ctx context.Context, key string) (LockInfo, error)
	// prune deletes up to limit locks whose lease ended (released or expired) more
	// than olderThan ago, never a live one, keeping the token rule, and returns how
	// many it deleted. It returns 0 at once when another prune is running (see
	// Client.Prune).
	prune(ctx context.Context, olderThan time.Duration, limit int) (int64, error)

	// recordRun records one run of a job; retention says how old the job's runs may
	// get (see RunHistory).
	recordRun(ctx context.Context, r runRecord, retention time.Duration) error
	// recordSkips adds counts of skipped ticks of instance, one per job and reason.
	recordSkips(ctx context.Context, instance string, skips []skipCount, retention time.Duration) error
	// jobRuns returns the last limit runs of job, newest first (see Client.JobRuns).
	jobRuns(ctx context.Context, job string, limit int) ([]JobRun, error)
	// jobStatuses returns every job with runs or skips (see Client.JobStatuses).
	jobStatuses(ctx context.Context) ([]JobStatus, error)

	// queueAcquire takes t for owner for ttl when it is free and no live fair waiter
	// is queued on it (token > 0, ticket 0; for a semaphore, its lowest free permit),
	// or queues owner (ticket > 0, token 0) and returns ahead as queuePoll does. See Fair.
	queueAcquire(ctx context.Context, t target, owner string, ttl time.Duration) (permit int, token, ticket int64, ahead int, err error)
	// queuePoll polls a queued waiter of key (a lock's or a semaphore's): it claims
	// what was granted to it, or takes the key (a free permit) when its turn has come,
	// and returns its token (and permit) with queued false; else it records that the
	// waiter is live and returns 0 with queued true, and ahead: how many live waiters
	// ahead of it wait for a grant, counted up to maxAhead (0: the next grant is its).
	// queued false with a 0 token: the ticket is not in the queue.
	queuePoll(ctx context.Context, key string, ticket int64) (permit int, token int64, queued bool, ahead int, err error)
	// queueLeave takes the waiter out of the queue, passing on a grant it had not
	// claimed, and reports whether it was queued.
	queueLeave(ctx context.Context, key string, ticket int64) (bool, error)
	// registryTouch writes that instance registered keys of kind (kindJob,
	// kindElection): a registration when registering, else a refresh (see registry).
	registryTouch(ctx context.Context, kind string, keys []string, instance string, registering bool) error
	// registryClose marks instance's registrations of keys of kind closed: it left.
	registryClose(ctx context.Context, kind string, keys []string, instance string) error
	// registrations returns the registrations of kind, by key then instance, each
	// with its state as of the read.
	registrations(ctx context.Context, kind string) ([]registryRow, error)
	// elections returns every registered election's key with its live holder, as
	// holder reads it, sorted by key (see Client.Elections).
	elections(ctx context.Context) ([]LockInfo, error)
}

// wantMarker is the PostgreSQL stores' capability of marking a key wanted by a waiter,
// so that its release notifies the listeners (see listener.go). Only a store whose
// releases NOTIFY has it, and only a Client with a listener uses it. wanted is true
// when a live holder has the key and the mark is set; false means "try to acquire it
// now".
type wantMarker interface {
	markWanted(ctx context.Context, key string) (wanted bool, err error)
	// acquireOrWant is Store.Acquire that, when the key is held, marks it wanted in
	// the same call: wanted reports that it did (the key's release will notify), so
	// that the waiter parks without a markWanted round trip; acquired and wanted both
	// false mean "try again now".
	acquireOrWant(ctx context.Context, key, owner string, ttl time.Duration) (token int64, acquired, wanted bool, err error)
	// semWant marks every live permit of the semaphore key wanted, so that the release
	// of any of them notifies, and reports whether the semaphore is full (at least
	// permits live holders); false means "try to acquire now".
	semWant(ctx context.Context, key string, permits int) (wanted bool, err error)
}

// backend returns the client's store as a backend, for the call op (named in the
// error) that needs what cannot describes. On a type that embeds a Store it returns an
// error wrapping errors.ErrUnsupported.
func (c *Client) backend(op, cannot string) (backend, error) {
	b, ok := c.store.(backend)
	if !ok {
		return nil, fmt.Errorf("pglock: %s: %T %s: it embeds a Store, and such a type has only Acquire, Renew and Release: %w",
			op, unwatched(c.store), cannot, errors.ErrUnsupported)
	}
	return b, nil
}

// checkTicket checks a fair waiter's key and ticket, as checkCall does a lock's.
func checkTicket(key string, ticket int64) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if ticket < 1 {
		return invalidArg("ticket %d: want 1 or more", ticket)
	}
	return nil
}

// checkQueueCall checks a fair acquisition of t, as checkCall does a lock's and
// checkSemCall a permit's.
func checkQueueCall(t target, owner string, ttl time.Duration) error {
	if t.permits != 0 {
		return checkSemCall(t.key, owner, ttl, t.permits)
	}
	return checkCall(t.key, owner, ttl)
}

// checkReleaseMany checks the arguments of backend.releaseMany, as checkCall does
// one lock's and checkSemCall one permit's.
func checkReleaseMany(keys, owners []string) error {
	if len(keys) != len(owners) || len(keys) > maxReleaseMany {
		return invalidArg("release many: %d keys and %d owners: want as many of each, at most %d", len(keys), len(owners), maxReleaseMany)
	}
	for i, key := range keys {
		var err error
		if sem, ok := strings.CutSuffix(key, permitSeparator); ok {
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

// maxReleaseMany is the most keys one releaseMany call takes
// (pglock.lock_release_many's limit).
const maxReleaseMany = 1000

// checkRenewMany checks the arguments of backend.renewMany, as checkCall does one
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
