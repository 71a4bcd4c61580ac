package pglock

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// permitSeparator separates a semaphore's key from a permit's number in the permit's
// row key (migrations/000013_semaphores.up.sql). checkKey refuses it in every key, so
// that no lock's key is ever a permit's.
const permitSeparator = "\x1f"

// maxSemaphoreKeyLength is the longest semaphore key: U+001F and up to 4 digits keep a
// permit's row key within MaxKeyLength.
const maxSemaphoreKeyLength = MaxKeyLength - 5

// permitKey returns the row key of permit of the semaphore key.
func permitKey(key string, permit int) string {
	return key + permitSeparator + strconv.Itoa(permit)
}

// splitPermitKey returns the semaphore key and permit number of a permit's row key,
// and (rowKey, 0) for a lock's key. It is the one place a row key is read back.
func splitPermitKey(rowKey string) (key string, permit int) {
	key, num, ok := strings.Cut(rowKey, permitSeparator)
	if !ok || num == "" || num[0] < '1' || num[0] > '9' || len(num) > 4 {
		return rowKey, 0
	}
	n, err := strconv.Atoi(num)
	if err != nil || n > MaxPermits {
		return rowKey, 0
	}
	return key, n
}

// checkSemaphore checks a semaphore's key and its number of permits (or a permit's
// number).
func checkSemaphore(key string, permits int) error {
	if err := checkKey(key); err != nil {
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
