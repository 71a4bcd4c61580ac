package pglock

import (
	"fmt"
	"log/slog"
	"os"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// Limits on what a Client accepts.
const (
	// MaxKeyLength is the longest key, in characters (runes).
	MaxKeyLength = 500
	// MinTTL and MaxTTL bound every ttl: the store counts in whole milliseconds, and a
	// lease longer than a year is a configuration mistake.
	MinTTL = time.Millisecond
	MaxTTL = 365 * 24 * time.Hour
	// DefaultTTL is the ttl of a Client without WithTTL: how long a lock lives without
	// a renewal, so how soon another instance takes over after a crash.
	DefaultTTL = 30 * time.Second
)

// Option configures a Client. An invalid option makes New return an error wrapping
// ErrInvalidArgument that names it.
type Option func(*config) error

type config struct {
	ttl      time.Duration
	logger   *slog.Logger
	clock    Clock
	instance string
	onEvent  func(Event)
	listen   *pgx.ConnConfig // the listener's connection (New); nil: waiting polls
	noListen bool
}

// WithTTL sets the default ttl of the client's locks (DefaultTTL if not set): between
// MinTTL and MaxTTL. Locks are renewed every ttl/3.
func WithTTL(ttl time.Duration) Option {
	return func(c *config) error {
		if err := checkTTL("WithTTL", ttl); err != nil {
			return err
		}
		c.ttl = ttl
		return nil
	}
}

// WithLogger sets the logger; nil means slog.Default(). Routine acquisitions, renewals,
// releases and skipped ticks log at debug, a job or leadership changing hands at info,
// a lost lock at warn. Attribute keys are key, owner, token, ttl and err.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		c.logger = l
		return nil
	}
}

// WithClock sets the clock the client renews, waits and counts deadlines on; nil means
// RealClock. Expiry is always measured by the store. Tests use pglocktest.ManualClock.
func WithClock(clock Clock) Option {
	return func(c *config) error {
		c.clock = clock
		return nil
	}
}

// WithInstanceName sets the prefix of every owner id the client draws (default
// "hostname/pid"), so the locks table says which instance holds what. It must be
// 1 to 200 characters of valid UTF-8 without NUL bytes.
func WithInstanceName(name string) Option {
	return func(c *config) error {
		if name == "" || utf8.RuneCountInString(name) > 200 || !validText(name) {
			return invalidArg("WithInstanceName: %q: want 1 to 200 characters of valid UTF-8 without NUL", name)
		}
		c.instance = name
		return nil
	}
}

// WithEventHandler sets a function called with every Event, in order, on one goroutine
// of the client's own: a slow handler delays later events, never renewals or callers.
// Events queue without bound while the handler is slow. Close waits for the queue to
// drain; an event that comes after Close has returned (a leader that Close gave up
// waiting for steps down later) is dropped. A panic in the handler is recovered and
// logged.
func WithEventHandler(h func(Event)) Option {
	return func(c *config) error {
		if h == nil {
			return invalidArg("WithEventHandler: nil handler")
		}
		c.onEvent = h
		return nil
	}
}

// WithoutListener makes a Client of New wait by polling alone. By default such a client
// opens one extra connection from its pool's configuration, the first time one of its
// Acquire calls or elections has to wait, and LISTENs on it, so that a release of the
// key wakes the waiter at once rather than at its next retry (a leader's Close or
// Resign hands over within milliseconds, not ttl/3). Use it behind PgBouncer in
// transaction mode, where LISTEN does not work, or to spare the connection. Clients
// of NewWithStore always poll.
func WithoutListener() Option {
	return func(c *config) error {
		c.noListen = true
		return nil
	}
}

// listenOn is New's option: the configuration of the listener's connection.
func listenOn(cfg *pgx.ConnConfig) Option {
	return func(c *config) error {
		c.listen = cfg
		return nil
	}
}

func defaultInstanceName() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	return fmt.Sprintf("%s/%d", host, os.Getpid())
}

// LockOption configures one acquisition.
type LockOption func(*lockConfig) error

type lockConfig struct {
	ttl     time.Duration
	wait    time.Duration
	waitSet bool
}

// TTL sets this lock's ttl, instead of the client's: between MinTTL and MaxTTL.
func TTL(ttl time.Duration) LockOption {
	return func(c *lockConfig) error {
		if err := checkTTL("TTL", ttl); err != nil {
			return err
		}
		c.ttl = ttl
		return nil
	}
}

// Wait bounds how long Acquire and WithLock wait for a held key, on the client's clock.
// Zero means one attempt. Without Wait they wait until their ctx ends. TryAcquire
// ignores it.
func Wait(d time.Duration) LockOption {
	return func(c *lockConfig) error {
		if d < 0 {
			return invalidArg("Wait: %v is negative", d)
		}
		c.wait, c.waitSet = d, true
		return nil
	}
}

// checkTTL returns an error naming what (an option, an argument) for a ttl out of range.
func checkTTL(what string, ttl time.Duration) error {
	if ttl < MinTTL || ttl > MaxTTL {
		return invalidArg("%s: ttl %v: want %v to %v", what, ttl, MinTTL, MaxTTL)
	}
	return nil
}

// checkKey returns an error wrapping ErrInvalidKey for a key no store should see.
func checkKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case !validText(key):
		return fmt.Errorf("%w: %q is not valid UTF-8 or contains a NUL byte", ErrInvalidKey, key)
	case utf8.RuneCountInString(key) > MaxKeyLength:
		return fmt.Errorf("%w: %d characters, the most is %d", ErrInvalidKey, utf8.RuneCountInString(key), MaxKeyLength)
	}
	return nil
}

func validText(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return false
		}
	}
	return utf8.ValidString(s)
}

// checkCall is the stores' argument check: what a client would never send.
func checkCall(key, owner string, ttl time.Duration) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if owner == "" || !validText(owner) {
		return invalidArg("owner %q: want non-empty valid UTF-8 without NUL", owner)
	}
	return checkTTL("ttl", ttl)
}
