package pglock

import (
	"errors"
	"fmt"
)

// Sentinel errors. Every error pglock returns is "pglock:"-prefixed and matches one of
// these with errors.Is, or wraps the store's error (a *pgconn.PgError stays reachable
// with errors.As).
var (
	// ErrNotAcquired: the key is held by a live holder (TryAcquire), or stayed held
	// for the whole wait (Acquire, WithLock).
	ErrNotAcquired = errors.New("pglock: lock not acquired")
	// ErrLockLost: a lock was lost before it was released. A *LockLostError matches it.
	ErrLockLost = errors.New("pglock: lock lost")
	// ErrClosed: the Client was closed.
	ErrClosed = errors.New("pglock: client closed")
	// ErrResigned: the context.Cause of a leader's OnAcquired context after
	// Election.Resign.
	ErrResigned = errors.New("pglock: resigned from the election")
	// ErrInvalidKey: a key is empty, longer than MaxKeyLength characters, not valid
	// UTF-8, or contains a NUL byte.
	ErrInvalidKey = errors.New("pglock: invalid key")
	// ErrInvalidArgument: an option, a duration or a function argument is out of range
	// or nil. The error's text names the argument.
	ErrInvalidArgument = errors.New("pglock: invalid argument")
	// ErrInvalidToken: a Store answered a fencing token that is not positive. The
	// store is broken; fencing with such a token would be unsafe.
	ErrInvalidToken = errors.New("pglock: store returned a fencing token that is not positive")
	// ErrUnsafeQuery is returned by FenceUpdate, FenceHeld and ExecFenced for a query
	// they cannot rewrite safely: empty, not a single UPDATE (or DELETE, for FenceHeld),
	// several statements, WHERE CURRENT OF, a WITH query that writes or has SEARCH or
	// CYCLE, or text the lexer cannot split with certainty (an unterminated literal,
	// comment or dollar quote, a NUL byte, invalid UTF-8, a number or parameter running
	// into a word). The error's text says which. The lexer assumes what pgx requires of
	// a connection anyway: client_encoding UTF8 and standard_conforming_strings on.
	ErrUnsafeQuery = errors.New("pglock: query cannot be fenced safely")
)

// Why a lock was lost, in LockLostError.Reason.
const (
	// ReasonRefused: the store refused a renewal: another holder has the key, or it expired.
	ReasonRefused = "the store refused a renewal"
	// ReasonExpired: ttl passed since the last renewal the store confirmed, counted
	// from the moment that renewal was sent.
	ReasonExpired = "ttl passed without a confirmed renewal"
	// ReasonReleaseRefused: the store no longer held the lock for its owner at release.
	ReasonReleaseRefused = "the store no longer held it at release"
)

// LockLostError is the context.Cause of a lost lock's context, and what Release and
// WithLock return for a lock lost before its release. errors.Is(err, ErrLockLost) is true.
type LockLostError struct {
	Key    string
	Owner  string
	Token  int64
	Reason string // ReasonRefused, ReasonExpired or ReasonReleaseRefused
}

func (e *LockLostError) Error() string {
	return fmt.Sprintf("pglock: lock %q (token %d) lost: %s", e.Key, e.Token, e.Reason)
}

// Is reports whether target is ErrLockLost.
func (e *LockLostError) Is(target error) bool { return target == ErrLockLost }

func invalidArg(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidArgument}, args...)...)
}
