package pglock

import (
	"errors"
	"fmt"

	"github.com/pgfence/pglock/internal/store"
)

// Sentinel errors. Every error pglock returns is "pglock:"-prefixed and matches one of
// these with errors.Is, or wraps the store's error (a *pgconn.PgError stays reachable
// with errors.As).
var (
	// ErrNotAcquired is returned by TryAcquire when a live holder has the key, and by
	// Acquire and WithLock when it stayed held for the whole wait or their ctx ended; a
	// gocron adapter's Lock or IsLeader returns it where another instance holds the
	// lease.
	ErrNotAcquired = errors.New("pglock: lock not acquired")
	// ErrNotHeld is returned by ForceRelease when no live holder has the key (the
	// permit): free, released or expired.
	ErrNotHeld = errors.New("pglock: not held")
	// ErrLockLost is matched by the *LockLostError that Release, WithLock, Job.Run and
	// the gocron adapters return for a lock lost before its release.
	ErrLockLost = errors.New("pglock: lock lost")
	// ErrClosed is returned by a Client's calls once its Close has begun, and is the
	// cause of the contexts Close cancels.
	ErrClosed = errors.New("pglock: client closed")
	// ErrResigned is the context.Cause of a leader's OnAcquired context after
	// Election.Resign.
	ErrResigned = errors.New("pglock: resigned from the election")
	// ErrInvalidKey is returned for a key that is empty, longer than MaxKeyLength
	// characters (a semaphore's, MaxKeyLength-5), not valid UTF-8, or contains a NUL byte
	// or U+001F (which separates a semaphore's key from a permit's number in the store).
	ErrInvalidKey = store.ErrInvalidKey
	// ErrInvalidArgument is returned for an option, a duration or a function argument
	// that is out of range or nil; the error's text names it.
	ErrInvalidArgument = store.ErrInvalidArgument
	// ErrInvalidToken is returned by an acquisition whose store answered a fencing token
	// that is not positive: the store is broken, and fencing with such a token would be
	// unsafe.
	ErrInvalidToken = errors.New("pglock: store returned a fencing token that is not positive")
	// ErrUnsafeQuery is returned by FenceUpdate, FenceHeld and ExecFenced for a query
	// they cannot rewrite safely: empty, not a single UPDATE (or DELETE, for FenceHeld),
	// several statements, WHERE CURRENT OF, a WITH query that writes or has SEARCH or
	// CYCLE, or text the lexer cannot split with certainty (an unterminated literal,
	// comment or dollar quote, a NUL byte, invalid UTF-8, a number or parameter running
	// into a word). The error's text says which.
	ErrUnsafeQuery = errors.New("pglock: query cannot be fenced safely")
)

// LostReason says why a lock was lost (LockLostError.Reason, Event.LostReason): a
// value that stays the same from release to release, for logs, metrics and switches.
type LostReason string

const (
	// LostRefused: the store refused a renewal: another holder has the key, or it
	// expired.
	LostRefused LostReason = "refused"
	// LostExpired: the lock's deadline passed without a renewal the store confirmed
	// (see the package doc).
	LostExpired LostReason = "expired"
	// LostReleaseRefused: at its release, the store no longer held the lock for its
	// owner.
	LostReleaseRefused LostReason = "release-refused"
)

// LockLostError is the context.Cause of a lost lock's context, and what Release and
// WithLock return for a lock lost before its release. errors.Is(err, ErrLockLost) is true.
type LockLostError struct {
	Key    string // a semaphore's key for a permit (Lock.Key)
	Permit int    // the permit's number (Lock.Permit); 0 for a lock
	Owner  string
	Token  int64
	Reason LostReason
}

// Error names the lock, its token and the reason it was lost.
func (e *LockLostError) Error() string {
	if e.Permit > 0 {
		return fmt.Sprintf("pglock: permit %d of %q (token %d) lost: %s", e.Permit, e.Key, e.Token, e.Reason)
	}
	return fmt.Sprintf("pglock: lock %q (token %d) lost: %s", e.Key, e.Token, e.Reason)
}

// Is reports whether target is ErrLockLost.
func (e *LockLostError) Is(target error) bool { return target == ErrLockLost }

func invalidArg(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidArgument}, args...)...)
}
