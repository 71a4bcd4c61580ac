package pglock

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pglock/internal/schedule"
	"github.com/pgfence/pglock/internal/store"
)

// Limits on what a Client accepts.
const (
	// MaxKeyLength is the longest key, in characters (runes). A semaphore's key is at
	// most MaxKeyLength-5 (see Client.Semaphore).
	MaxKeyLength = 500
	// MaxPermits is the most permits a semaphore has (see Client.Semaphore).
	MaxPermits = 1000
	// MinTTL and MaxTTL bound every ttl: the store counts in whole milliseconds, and a
	// lease longer than a year is a configuration mistake.
	MinTTL = time.Millisecond
	MaxTTL = 365 * 24 * time.Hour
	// DefaultTTL is the ttl of a Client without the TTL option: how long a lock lives
	// without a renewal, so how soon another instance takes over after a crash.
	DefaultTTL = 30 * time.Second
)

// The option types (see "Options" in the package doc) are sealed by their unexported
// methods: only this package's functions make options.

// ClientOption configures a Client: New and NewWithStore take it. The ClientOptions are
// WithLogger, WithClock, WithInstanceName, WithEventHandler, WithoutListener,
// WithListenerConnString, RunHistory and TTL.
type ClientOption interface{ clientOption() option }

// AcquireOption configures Acquire and WithLock. The AcquireOptions are TTL, Wait and
// Fair.
type AcquireOption interface{ acquireOption() option }

// JobOption configures Client.Job. The JobOptions are OnOneInstance, WithoutOverlapping,
// AtMost, TTL, and for slots Cron, Every, CatchUp, Deadline and AtLeastOnce.
type JobOption interface{ jobOption() option }

// Option is an option that every call takes: a ClientOption, an AcquireOption and a
// JobOption. The one Option is TTL; TryAcquire, Elect and the gocron adapters take
// Options, so that nothing but TTL fits them.
type Option interface {
	ClientOption
	AcquireOption
	JobOption
	everyOption() option
}

// option is what every option is: its name, for errors, and what it sets.
type option struct {
	name  string
	apply func(*settings) error
}

// The options' types, one for each set of calls an option fits.
type (
	clientOpt  option // ClientOption
	acquireOpt option // AcquireOption
	jobOpt     option // JobOption
	everyOpt   option // Option
)

func (o clientOpt) clientOption() option   { return option(o) }
func (o acquireOpt) acquireOption() option { return option(o) }
func (o jobOpt) jobOption() option         { return option(o) }
func (o everyOpt) clientOption() option    { return option(o) }
func (o everyOpt) acquireOption() option   { return option(o) }
func (o everyOpt) jobOption() option       { return option(o) }
func (o everyOpt) everyOption() option     { return option(o) }

// settings is what the options set, for every kind of call; each call reads its part.
type settings struct {
	ttl                time.Duration
	wait               time.Duration
	waitSet            bool
	fair               bool
	logger             *slog.Logger
	clock              Clock
	instance           string
	onEvent            []func(Event)   // WithEventHandler's, in order
	listen             *pgx.ConnConfig // the listener's connection (New); nil: waiting polls
	listenOverride     *pgx.ConnConfig // WithListenerConnString's, over listen
	noListen           bool
	oneInstance        bool
	withoutOverlapping bool
	atMost             int                // AtMost's; 0: none
	runRetention       time.Duration      // RunHistory's; 0: off
	schedule           *schedule.Schedule // Cron's or Every's; nil: none
	catchUp            int                // CatchUp's; 0: none
	deadline           time.Duration      // Deadline's; 0: none
	attempts           int                // AtLeastOnce's; 0: at most once
	backoff            time.Duration      // AtLeastOnce's
}

// applyOptions applies opts, given to the call callName, over s; get is the method of
// their interface (ClientOption.clientOption, for one).
func applyOptions[O any](s *settings, callName string, opts []O, get func(O) option) error {
	for _, o := range opts {
		if any(o) == nil {
			return invalidArg("%s: a nil %s", callName, reflect.TypeFor[O]().Name())
		}
		opt := get(o)
		if err := opt.apply(s); err != nil {
			return fmt.Errorf("%w: %s: %s: %s", ErrInvalidArgument, callName, opt.name, err)
		}
	}
	return nil
}

// TTL sets how long a lock lives without a renewal, MinTTL to MaxTTL: given to New, the
// default of the client's locks (DefaultTTL when not set); given to any other call, the
// ttl of its locks. Locks are renewed every ttl/3; a holder that dies is replaced after
// about ttl.
func TTL(ttl time.Duration) Option {
	return everyOpt{name: "TTL", apply: func(s *settings) error {
		if ttl < MinTTL || ttl > MaxTTL {
			return fmt.Errorf("%v: want %v to %v", ttl, MinTTL, MaxTTL)
		}
		s.ttl = ttl
		return nil
	}}
}

// Wait bounds how long Acquire and WithLock wait for a held key, on the client's clock.
// Zero means one attempt; without Wait they wait until their ctx ends.
func Wait(d time.Duration) AcquireOption {
	return acquireOpt{name: "Wait", apply: func(s *settings) error {
		if d < 0 {
			return fmt.Errorf("%v is negative", d)
		}
		s.wait, s.waitSet = d, true
		return nil
	}}
}

// WithLogger sets the client's logger; nil means slog.Default(). See the package
// doc, # Events and logs, for what it logs at which level.
func WithLogger(l *slog.Logger) ClientOption {
	return clientOpt{name: "WithLogger", apply: func(s *settings) error {
		s.logger = l
		return nil
	}}
}

// WithClock sets the clock the client renews, waits and counts deadlines on; nil means
// the real clock. Expiry is always measured by the store. Tests use
// pglocktest.ManualClock.
func WithClock(clock Clock) ClientOption {
	return clientOpt{name: "WithClock", apply: func(s *settings) error {
		s.clock = clock
		return nil
	}}
}

// WithInstanceName sets the prefix of every owner id the client draws (default
// "hostname/pid"), so the locks table says which instance holds what: 1 to 200 characters
// of valid UTF-8 without NUL bytes.
func WithInstanceName(name string) ClientOption {
	return clientOpt{name: "WithInstanceName", apply: func(s *settings) error {
		if name == "" || utf8.RuneCountInString(name) > maxInstanceLength || !store.ValidText(name) {
			return fmt.Errorf("%q: want 1 to %d characters of valid UTF-8 without NUL", name, maxInstanceLength)
		}
		s.instance = name
		return nil
	}}
}

// WithEventHandler adds a function called with every Event, in order, on a goroutine of
// the client's own; given more than once, every handler gets every event. A slow handler
// delays later events, never renewals or callers; past 4096 waiting events, new ones are
// dropped (Health.EventsDropped). A panic in it is recovered and logged. See the package
// doc, # Events and logs.
func WithEventHandler(h func(Event)) ClientOption {
	return clientOpt{name: "WithEventHandler", apply: func(s *settings) error {
		if h == nil {
			return errors.New("nil handler")
		}
		s.onEvent = append(s.onEvent, h)
		return nil
	}}
}

// WithoutListener makes a Client of New wait by polling alone, sparing the connection it
// would LISTEN on for releases (see the package doc, # Waking waiters). Use it, or
// WithListenerConnString, behind PgBouncer in transaction mode.
func WithoutListener() ClientOption {
	return clientOpt{name: "WithoutListener", apply: func(s *settings) error {
		s.noListen = true
		return nil
	}}
}

// WithListenerConnString sets the connection string, non-empty and accepted by
// pgx.ParseConfig, of the connection a Client LISTENs on for releases, on the pool's
// database: PostgreSQL directly while the pool goes through PgBouncer in transaction
// mode. It applies to New, and to NewWithStore on NewPostgresStore or NewSQLStore, which
// otherwise poll; WithoutListener overrides it. See the package doc, # Waking waiters.
func WithListenerConnString(connString string) ClientOption {
	return clientOpt{name: "WithListenerConnString", apply: func(s *settings) error {
		if connString == "" {
			return errors.New("empty: want a connection string")
		}
		cfg, err := pgx.ParseConfig(connString)
		if err != nil {
			return err
		}
		s.listenOverride = cfg
		return nil
	}}
}

// listenOn is New's option: the configuration of the listener's connection.
func listenOn(cfg *pgx.ConnConfig) ClientOption {
	return clientOpt{name: "listenOn", apply: func(s *settings) error {
		s.listen = cfg
		return nil
	}}
}

// OnOneInstance runs the job on one instance: the first whose tick comes takes the job's
// lease, "<key>:owner", and keeps it while its Client is up; the other instances skip
// each tick until the lease is handed back or expires. With a schedule (Cron, Every) the
// slots vouch that each runs once; without one, a tick the lease cannot vouch for is
// skipped (SkipLeaseInDoubt): keep the ttl well above the clocks' skew and the
// scheduler's jitter. See the package doc, # Jobs.
func OnOneInstance() JobOption {
	return jobOpt{name: "OnOneInstance", apply: func(s *settings) error {
		s.oneInstance = true
		return nil
	}}
}

// WithoutOverlapping keeps a run from overlapping another run of the job, on this
// instance or any other: a run holds the run lock "<key>", and a tick that finds it held
// is skipped. Without OnOneInstance it means "any instance, one run at a time".
func WithoutOverlapping() JobOption {
	return jobOpt{name: "WithoutOverlapping", apply: func(s *settings) error {
		s.withoutOverlapping = true
		return nil
	}}
}

// AtMost lets up to n runs of the job, 1 to MaxPermits, be in progress at once across the
// fleet: each run holds a permit of the semaphore of the job's key, and a tick that finds
// all n held is skipped (SkipLimitReached). It goes alone: Client.Job refuses it with
// WithoutOverlapping or OnOneInstance (ErrInvalidArgument). See the package doc, # Jobs.
func AtMost(n int) JobOption {
	return jobOpt{name: "AtMost", apply: func(s *settings) error {
		if n < 1 || n > MaxPermits {
			return fmt.Errorf("%d runs: want 1 to %d", n, MaxPermits)
		}
		s.atMost = n
		return nil
	}}
}

// maxInstanceLength is the longest instance name (WithInstanceName).
const maxInstanceLength = 200

func defaultInstanceName() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	return fmt.Sprintf("%s/%d", host, os.Getpid())
}
