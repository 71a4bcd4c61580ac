package store

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// The checks of a store call's arguments: what a client would never send. Package
// pglock makes the same checks before a call, with the same errors.

var (
	// ErrInvalidKey is pglock.ErrInvalidKey: the stores return it, and package pglock
	// exports it.
	ErrInvalidKey = errors.New("pglock: invalid key")
	// ErrInvalidArgument is pglock.ErrInvalidArgument.
	ErrInvalidArgument = errors.New("pglock: invalid argument")
)

// invalidArg returns an error wrapping ErrInvalidArgument, its text made with format
// and args.
func invalidArg(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidArgument}, args...)...)
}

// Limits on what a store takes: pglock's constants of the same names.
const (
	MaxKeyLength = 500
	MaxPermits   = 1000
	MinTTL       = time.Millisecond
	MaxTTL       = 365 * 24 * time.Hour
)

// maxOwnerLength is the longest owner the stores take (the SQL functions' bound): an
// instance name of up to maxInstanceLength characters, a slash and a random suffix fit.
const maxOwnerLength = 255

// PermitSeparator separates a semaphore's key from a permit's number in the permit's
// row key (migrations/000013_semaphores.up.sql). CheckKey refuses it in every key, so
// that no lock's key is ever a permit's.
const PermitSeparator = "\x1f"

// maxSemaphoreKeyLength is the longest semaphore key: U+001F and up to 4 digits keep a
// permit's row key within MaxKeyLength.
const maxSemaphoreKeyLength = MaxKeyLength - 5

// PermitKey returns the row key of permit of the semaphore key.
func PermitKey(key string, permit int) string {
	return key + PermitSeparator + strconv.Itoa(permit)
}

// SplitPermitKey returns the semaphore key and permit number of a permit's row key,
// and (rowKey, 0) for a lock's key. It is the one place a row key is read back.
func SplitPermitKey(rowKey string) (key string, permit int) {
	key, num, ok := strings.Cut(rowKey, PermitSeparator)
	if !ok || num == "" || num[0] < '1' || num[0] > '9' || len(num) > 4 {
		return rowKey, 0
	}
	n, err := strconv.Atoi(num)
	if err != nil || n > MaxPermits {
		return rowKey, 0
	}
	return key, n
}

// CheckSemaphore checks a semaphore's key and its number of permits (or a permit's
// number).
func CheckSemaphore(key string, permits int) error {
	if err := CheckKey(key); err != nil {
		return err
	}
	if n := utf8.RuneCountInString(key); n > maxSemaphoreKeyLength {
		return fmt.Errorf("%w: %d characters, the most for a semaphore is %d", ErrInvalidKey, n, maxSemaphoreKeyLength)
	}
	if permits < 1 || permits > MaxPermits {
		return invalidArg("semaphore %q: %d permits: want 1 to %d", key, permits, MaxPermits)
	}
	return nil
}

// CheckTTL returns an error naming what (an argument) for a ttl out of range.
func CheckTTL(what string, ttl time.Duration) error {
	if ttl < MinTTL || ttl > MaxTTL {
		return invalidArg("%s: ttl %v: want %v to %v", what, ttl, MinTTL, MaxTTL)
	}
	return nil
}

// CheckKey returns an error wrapping ErrInvalidKey for a key no store should see, or
// one with U+001F, which would make it a permit's row key (see PermitKey).
func CheckKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case !ValidText(key):
		return fmt.Errorf("%w: %q is not valid UTF-8 or contains a NUL byte", ErrInvalidKey, key)
	case utf8.RuneCountInString(key) > MaxKeyLength:
		return fmt.Errorf("%w: %d characters, the most is %d", ErrInvalidKey, utf8.RuneCountInString(key), MaxKeyLength)
	case strings.Contains(key, PermitSeparator):
		return fmt.Errorf("%w: %q contains U+001F, which separates a semaphore's key from a permit's number", ErrInvalidKey, key)
	}
	return nil
}

// checkStoreKey is CheckKey for a store call, which is given a lock's key or a
// permit's row key.
func checkStoreKey(key string) error {
	if sem, permit := SplitPermitKey(key); permit > 0 {
		return CheckSemaphore(sem, permit)
	}
	return CheckKey(key)
}

// ValidText reports whether s is valid UTF-8 without a NUL byte: a text PostgreSQL takes.
func ValidText(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return false
		}
	}
	return utf8.ValidString(s)
}

// checkAcquire is checkCall for an acquisition of a lock's key: a permit's row key is
// taken only through its semaphore (semAcquire), never as a lock.
func checkAcquire(key, owner string, ttl time.Duration) error {
	if err := CheckKey(key); err != nil {
		return err
	}
	return checkCall(key, owner, ttl)
}

// checkSemCall is checkCall for a call on a semaphore.
func checkSemCall(key, owner string, ttl time.Duration, permits int) error {
	if err := CheckSemaphore(key, permits); err != nil {
		return err
	}
	return checkCall(key, owner, ttl)
}

// checkCall is the stores' argument check: what a client would never send.
func checkCall(key, owner string, ttl time.Duration) error {
	if err := checkStoreKey(key); err != nil {
		return err
	}
	if owner == "" || utf8.RuneCountInString(owner) > maxOwnerLength || !ValidText(owner) {
		return invalidArg("owner %q: want 1 to %d characters of valid UTF-8 without NUL", owner, maxOwnerLength)
	}
	return CheckTTL("ttl", ttl)
}
