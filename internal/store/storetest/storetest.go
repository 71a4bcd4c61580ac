// Package storetest is the contract that every store of pglock keeps: Run checks it on
// a store, one subtest per behaviour, in the spirit of testing/fstest.TestFS. It has no
// false positives; it may miss races: run it with -race.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock/internal/store"
)

// The store contract: every store of pglock keeps it, as subtests, one per behaviour.
// Package store's tests run it on the PostgreSQL store (pgx, and database/sql), the
// memory store; package pglock's, on the PostgreSQL store behind PgBouncer, as a role
// with README.md's grants, under session settings; storetest_test.go checks that it
// fails stores that break it.

// Options configures Run.
type Options struct {
	// Concurrent adds the race cases: Callers goroutines race on each key.
	Concurrent bool
	// Callers is how many goroutines race in the concurrent cases; zero means 16.
	Callers int
	// AdvanceTime moves the store's clock forward by d (a memory store on a
	// ManualClock). Nil means the expiry cases wait in real time with short ttls.
	AdvanceTime func(d time.Duration)
	// RewindTokens makes the store's token source go back (for PostgreSQL: ALTER
	// SEQUENCE pglock.fencing_token_seq RESTART). Nil skips that case.
	RewindTokens func(t testing.TB)
	// Serial runs the cases one at a time. Under a small lock_timeout, a case's ALTER
	// SEQUENCE (RewindTokens) queues behind the acquisitions in flight of the others,
	// and their next nextval behind it, past the timeout: an error the cases do not
	// expect, from the tests' running side by side, not from the store.
	Serial bool
}

// Store is what the contract checks: Acquire, Renew and Release, and the batched
// renewal that every store of pglock has. A store.Store is one.
type Store interface {
	Acquire(ctx context.Context, key, owner string, ttl time.Duration) (int64, bool, error)
	Renew(ctx context.Context, key, owner string, ttl time.Duration) (bool, error)
	Release(ctx context.Context, key, owner string) (bool, error)
	RenewMany(ctx context.Context, keys, owners []string, ttl time.Duration) ([]string, error)
}

// semaphoreStore is a Store that takes semaphores' permits and hands back
// many keys in one call (the client's hand-backs): the cases of both run on such a
// store only.
type semaphoreStore interface {
	SemAcquire(ctx context.Context, key, owner string, ttl time.Duration, permits int) (permit int, token int64, acquired bool, err error)
	ReleaseMany(ctx context.Context, keys, owners []string) (released []int, err error)
}

const (
	// callTimeout bounds every store call.
	callTimeout = 10 * time.Second
	// shortTTL is the ttl of the locks a case checks before their expiry, or renews
	// before they do.
	shortTTL = 300 * time.Millisecond
	// expireTTL is the ttl of the locks a case only lets expire: nothing is checked
	// before their expiry, so no store is too slow for it, and the case waits no longer.
	expireTTL = 20 * time.Millisecond
	// slowAttempts is how many times a case that checks a lock before its expiry
	// runs, each time with a ttl four times longer, while the store answers too
	// slowly for the check to tell anything.
	slowAttempts = 3
	// longTTL is the ttl of the locks that must stay held for a whole case.
	longTTL = time.Minute
	// threeWeeks is the ttl of LongTTL.
	threeWeeks = 3 * 7 * 24 * time.Hour
	// defaultCallers is the number of racing goroutines when Callers is zero.
	defaultCallers = 16
	// raceKeys and raceRounds size the concurrent cases.
	raceKeys   = 4
	raceRounds = 20
)

// The owners in the cases. intruder only ever tries to take a key that must be held.
const (
	ownerA   = "owner-a"
	ownerB   = "owner-b"
	ownerC   = "owner-c"
	intruder = "owner-intruder"
)

// Run runs the store contract as subtests of t. Each subtest calls newStore
// once, with its own t, before it runs in parallel with the others. newStore returns a
// store on a fresh, empty state or one that other subtests share: every subtest uses
// keys of its own, made of its name and a random part. The subtests are named after
// behaviours, so that -run 'TestX/RenewAfterExpiryFails' picks one.
//
// Without opts.AdvanceTime the expiry cases wait in real time: 20 ms for a lock they
// only let expire, 300 ms and more for one they check before its expiry; they
// overlap, so the whole run takes a few seconds. They assume that the
// store's clock runs at the rate of the local one. With AdvanceTime the subtests run
// one at a time and never sleep, since moving the shared clock would expire the
// locks of the others.
//
// It has no false positives: a failure is a broken contract, or a store so slow that
// expiry could not be checked (the failure says so). It may miss races, however: run
// it with -race, and with opts.Concurrent against a server behind a connection pool,
// so that calls really overlap.
func Run(t *testing.T, newStore func(t *testing.T) Store, opts Options) {
	t.Helper()
	require.GreaterOrEqual(t, opts.Callers, 0, "Options.Callers")
	if opts.Callers == 0 {
		opts.Callers = defaultCallers
	}
	c := &contract{newStore: newStore, opts: opts}

	c.run(t, "AcquireFree", acquireFree)
	c.run(t, "AcquireHeld", acquireHeld)
	c.run(t, "AcquireOwnHeldIsNotReentrant", acquireOwnHeldIsNotReentrant)

	c.run(t, "RenewByHolderExtends", renewByHolderExtends)
	c.run(t, "RenewByAnotherFails", renewByAnotherFails)
	c.run(t, "RenewAfterExpiryFails", renewAfterExpiryFails)
	c.run(t, "RenewNeverRecreates", renewNeverRecreates)

	c.run(t, "ReleaseByHolderFrees", releaseByHolderFrees)
	c.run(t, "ReleaseByAnotherFails", releaseByAnotherFails)
	c.run(t, "ReleaseAfterExpiryFails", releaseAfterExpiryFails)
	c.run(t, "ReleaseTwice", releaseTwice)

	c.group(t, "ExpiredLockIsFree", func(t *testing.T) {
		c.run(t, "AcquireByAnother", expiredAcquireByAnother)
		c.run(t, "AcquireByFormerHolder", expiredAcquireByFormerHolder)
		c.run(t, "RenewAfterTakeover", expiredRenewAfterTakeover)
		c.run(t, "ReleaseAfterTakeover", expiredReleaseAfterTakeover)
		c.run(t, "NeverAcquired", neverAcquired)
	})

	c.group(t, "TokensGrow", func(t *testing.T) {
		c.run(t, "AcrossRelease", tokensGrowAcrossRelease)
		c.run(t, "AcrossExpiry", tokensGrowAcrossExpiry)
		c.run(t, "AfterRewind", tokensGrowAfterRewind)
		c.run(t, "PositiveOnEveryKey", tokensPositiveOnEveryKey)
	})

	c.run(t, "LongTTL", longTTLHolds)
	c.run(t, "KeysAreKeptApart", keysAreKeptApart)
	c.run(t, "RenewMany", renewMany)

	c.group(t, "Semaphore", func(t *testing.T) {
		c.run(t, "GrantsTheLowestFreePermitUpToN", semaphoreGrantsLowestFree)
		c.run(t, "ExpiredPermitIsFree", semaphoreExpiredPermitIsFree)
		c.run(t, "ReleaseManyHandsBackWhatOwnersHold", releaseManyHandsBack)
	})

	c.group(t, "Concurrent", func(t *testing.T) {
		if !opts.Concurrent {
			t.Skip("Options.Concurrent is off")
		}
		c.run(t, "OneWinnerPerRound", oneWinnerPerRound)
		c.run(t, "HoldersNeverOverlap", holdersNeverOverlap)
		c.run(t, "NPermitsPerRound", semaphoreNPermitsPerRound)
	})
}

// contract is one Run.
type contract struct {
	newStore func(t *testing.T) Store
	opts     Options
}

// group runs body as a subtest that holds other subtests.
func (c *contract) group(t *testing.T, name string, body func(t *testing.T)) {
	t.Helper()
	t.Run(name, func(t *testing.T) {
		if c.opts.AdvanceTime == nil && !c.opts.Serial {
			t.Parallel()
		}
		body(t)
	})
}

// run runs check as a subtest, on a store of its own from newStore.
func (c *contract) run(t *testing.T, name string, check func(h *harness)) {
	t.Helper()
	t.Run(name, func(t *testing.T) {
		h := &harness{t: t, store: c.newStore(t), opts: c.opts, prefix: keyPrefix(t)}
		require.NotNil(t, h.store, "newStore returned nil")
		if c.opts.AdvanceTime == nil && !c.opts.Serial {
			t.Parallel()
		}
		check(h)
	})
}

// keyPrefix returns a prefix for the keys of t, unique to this run of it.
func keyPrefix(t *testing.T) string {
	t.Helper()
	return fmt.Sprintf("%s/%016x/", t.Name(), rand.Uint64())
}

// harness is what a subtest checks the store with.
type harness struct {
	t      *testing.T
	store  Store
	opts   Options
	prefix string
	// elapsed is how far AdvanceTime moved the store's clock in this subtest.
	elapsed time.Duration
}

// key returns the key name of the subtest.
func (h *harness) key(name string) string {
	return h.prefix + name
}

// now returns the time on the clock the subtest waits on: the local clock, or a
// count of how far AdvanceTime moved the store's.
func (h *harness) now() time.Time {
	if h.opts.AdvanceTime == nil {
		return time.Now()
	}
	return time.Time{}.Add(h.elapsed)
}

// waitUntil returns once now() reaches at: it advances the store's clock, or sleeps.
func (h *harness) waitUntil(at time.Time) {
	d := at.Sub(h.now())
	if d <= 0 {
		return
	}
	if h.opts.AdvanceTime == nil {
		time.Sleep(d)
		return
	}
	h.opts.AdvanceTime(d)
	h.elapsed += d
}

// late reports whether now() has reached deadline: a lock whose ttl was counted from
// before deadline - ttl may have expired, so a check that found it free tells nothing.
func (h *harness) late(deadline time.Time) bool {
	return !h.now().Before(deadline)
}

// withShortTTL runs attempt with shortTTL, then with longer ttls while attempt
// reports that the store answered too slowly for its checks to tell anything. Each
// attempt gets fresh keys.
func (h *harness) withShortTTL(attempt func(ttl time.Duration) (conclusive bool)) {
	h.t.Helper()
	ttl := shortTTL
	for range slowAttempts {
		if attempt(ttl) {
			return
		}
		h.t.Logf("the store answered too slowly to check a ttl of %v; trying %v", ttl, 4*ttl)
		h.prefix = keyPrefix(h.t)
		ttl *= 4
	}
	h.t.Fatalf("the store answered too slowly to check expiry, even with a ttl of %v", ttl/4)
}

// acquire calls Acquire and requires no error.
func (h *harness) acquire(key, owner string, ttl time.Duration) (int64, bool) {
	h.t.Helper()
	token, acquired, err := contractAcquire(h.store, key, owner, ttl)
	require.NoError(h.t, err, "Acquire(%q, %q, %v)", key, owner, ttl)
	return token, acquired
}

// mustAcquire requires that owner acquires key, with a positive token, and returns
// the token. why says what a refusal means.
func (h *harness) mustAcquire(key, owner string, ttl time.Duration, why string) int64 {
	h.t.Helper()
	token, acquired := h.acquire(key, owner, ttl)
	require.True(h.t, acquired, "Acquire(%q, %q, %v) refused: %s", key, owner, ttl, why)
	require.Positive(h.t, token, "Acquire(%q, %q, %v) returned a token that is not positive", key, owner, ttl)
	return token
}

// requireHeld requires that key has a live holder: another owner cannot acquire it.
func (h *harness) requireHeld(key, why string) {
	h.t.Helper()
	_, acquired := h.acquire(key, intruder, longTTL)
	require.False(h.t, acquired, "another owner acquired %q: %s", key, why)
}

// renew calls Renew and requires no error.
func (h *harness) renew(key, owner string, ttl time.Duration) bool {
	h.t.Helper()
	renewed, err := contractRenew(h.store, key, owner, ttl)
	require.NoError(h.t, err, "Renew(%q, %q, %v)", key, owner, ttl)
	return renewed
}

// release calls Release and requires no error.
func (h *harness) release(key, owner string) bool {
	h.t.Helper()
	released, err := contractRelease(h.store, key, owner)
	require.NoError(h.t, err, "Release(%q, %q)", key, owner)
	return released
}

// expire has owner acquire key with expireTTL, waits until the lock expired, and
// returns its token.
func (h *harness) expire(key, owner string) int64 {
	h.t.Helper()
	token := h.mustAcquire(key, owner, expireTTL, "the key must be free")
	// The store counted the ttl from before Acquire returned.
	h.waitUntil(h.now().Add(expireTTL + expireTTL/3))
	return token
}

// contractAcquire calls s.Acquire with a timeout.
func contractAcquire(s Store, key, owner string, ttl time.Duration) (int64, bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	return s.Acquire(ctx, key, owner, ttl)
}

// contractRenew calls s.Renew with a timeout.
func contractRenew(s Store, key, owner string, ttl time.Duration) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	return s.Renew(ctx, key, owner, ttl)
}

// contractRelease calls s.Release with a timeout.
func contractRelease(s Store, key, owner string) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	return s.Release(ctx, key, owner)
}

func acquireFree(h *harness) {
	h.mustAcquire(h.key("k"), ownerA, longTTL, "the key is free")
}

func acquireHeld(h *harness) {
	k := h.key("k")
	h.mustAcquire(k, ownerA, longTTL, "the key is free")
	_, acquired := h.acquire(k, ownerB, longTTL)
	require.False(h.t, acquired, "a second owner acquired a held key")
	require.True(h.t, h.release(k, ownerA), "the holder lost the key to a refused Acquire")
}

func acquireOwnHeldIsNotReentrant(h *harness) {
	k := h.key("k")
	h.mustAcquire(k, ownerA, longTTL, "the key is free")
	_, acquired := h.acquire(k, ownerA, longTTL)
	require.False(h.t, acquired, "the holder acquired its own held key again: locks are not reentrant")
	h.requireHeld(k, "the holder's second Acquire freed the key")
	require.True(h.t, h.release(k, ownerA), "the holder lost the key to its own refused Acquire")
}

func renewByHolderExtends(h *harness) {
	h.withShortTTL(func(ttl time.Duration) bool {
		k := h.key("k")
		// sent is when the call that last set the expiry was sent: the store counted
		// the ttl from later, so the lock is live until sent + ttl at least.
		sent := h.now()
		h.mustAcquire(k, ownerA, ttl, "the key is free")
		var returned time.Time
		// Four renewals, each half a ttl after the last, end past the first expiry.
		for range 4 {
			h.waitUntil(sent.Add(ttl / 2))
			next := h.now()
			renewed := h.renew(k, ownerA, ttl)
			if !renewed && h.late(sent.Add(ttl)) {
				return false
			}
			require.True(h.t, renewed, "Renew by the holder before the expiry refused")
			sent, returned = next, h.now()
		}
		_, stolen := h.acquire(k, ownerB, longTTL)
		if stolen && h.late(sent.Add(ttl)) {
			return false
		}
		require.False(h.t, stolen, "another owner acquired the key past its first ttl, though the holder renewed it")
		// Renew moves the expiry to ttl from now, not further.
		h.waitUntil(returned.Add(ttl + ttl/3))
		h.mustAcquire(k, ownerB, longTTL, "the lock outlived the ttl of its last renewal")
		return true
	})
}

func renewByAnotherFails(h *harness) {
	k := h.key("k")
	h.mustAcquire(k, ownerA, longTTL, "the key is free")
	require.False(h.t, h.renew(k, ownerB, longTTL), "Renew by an owner that does not hold the key succeeded")
	h.requireHeld(k, "a refused Renew freed the key")
	require.True(h.t, h.release(k, ownerA), "the holder lost the key to another owner's Renew")
}

func renewAfterExpiryFails(h *harness) {
	k := h.key("k")
	h.expire(k, ownerA)
	require.False(h.t, h.renew(k, ownerA, longTTL), "Renew of an expired lock succeeded")
	h.mustAcquire(k, ownerB, longTTL, "a refused Renew revived the expired lock")
}

func renewNeverRecreates(h *harness) {
	k := h.key("released")
	h.mustAcquire(k, ownerA, longTTL, "the key is free")
	require.True(h.t, h.release(k, ownerA), "Release by the holder refused")
	require.False(h.t, h.renew(k, ownerA, longTTL), "Renew after Release succeeded")
	h.mustAcquire(k, ownerB, longTTL, "Renew after Release re-created the lock")

	never := h.key("never-acquired")
	require.False(h.t, h.renew(never, ownerA, longTTL), "Renew of a key never acquired succeeded")
	h.mustAcquire(never, ownerB, longTTL, "Renew of a key never acquired created a lock")
}

func releaseByHolderFrees(h *harness) {
	k := h.key("k")
	h.mustAcquire(k, ownerA, longTTL, "the key is free")
	require.True(h.t, h.release(k, ownerA), "Release by the holder refused")
	h.mustAcquire(k, ownerB, longTTL, "Release did not free the key")
}

func releaseByAnotherFails(h *harness) {
	k := h.key("k")
	h.mustAcquire(k, ownerA, longTTL, "the key is free")
	require.False(h.t, h.release(k, ownerB), "Release by an owner that does not hold the key succeeded")
	h.requireHeld(k, "another owner's Release freed the key")
	require.True(h.t, h.release(k, ownerA), "the holder lost the key to another owner's Release")
}

func releaseAfterExpiryFails(h *harness) {
	k := h.key("k")
	h.expire(k, ownerA)
	require.False(h.t, h.release(k, ownerA), "Release of an expired lock succeeded")
	h.mustAcquire(k, ownerB, longTTL, "the key stayed held after its expiry and a refused Release")
}

func releaseTwice(h *harness) {
	k := h.key("k")
	h.mustAcquire(k, ownerA, longTTL, "the key is free")
	require.True(h.t, h.release(k, ownerA), "Release by the holder refused")
	require.False(h.t, h.release(k, ownerA), "a second Release succeeded")
}

func expiredAcquireByAnother(h *harness) {
	k := h.key("k")
	expired := h.expire(k, ownerA)
	token := h.mustAcquire(k, ownerB, longTTL, "an expired lock kept the key")
	require.Greater(h.t, token, expired, "the token did not grow across the expiry")
}

func expiredAcquireByFormerHolder(h *harness) {
	k := h.key("k")
	expired := h.expire(k, ownerA)
	token := h.mustAcquire(k, ownerA, longTTL, "an expired lock kept the key from its former holder")
	require.Greater(h.t, token, expired, "the token did not grow across the expiry")
}

func expiredRenewAfterTakeover(h *harness) {
	k := h.key("k")
	h.expire(k, ownerA)
	h.mustAcquire(k, ownerB, longTTL, "an expired lock kept the key")
	require.False(h.t, h.renew(k, ownerA, longTTL), "the former holder renewed a key another owner took over")
	h.requireHeld(k, "the former holder's Renew freed the key")
	require.True(h.t, h.release(k, ownerB), "the new holder lost the key to the former holder's Renew")
}

func expiredReleaseAfterTakeover(h *harness) {
	k := h.key("k")
	h.expire(k, ownerA)
	h.mustAcquire(k, ownerB, longTTL, "an expired lock kept the key")
	require.False(h.t, h.release(k, ownerA), "the former holder released a key another owner took over")
	h.requireHeld(k, "the former holder's Release freed the key")
	require.True(h.t, h.release(k, ownerB), "the new holder lost the key to the former holder's Release")
}

func neverAcquired(h *harness) {
	k := h.key("k")
	require.False(h.t, h.renew(k, ownerA, longTTL), "Renew of a key never acquired succeeded")
	require.False(h.t, h.release(k, ownerA), "Release of a key never acquired succeeded")
	h.mustAcquire(k, ownerA, longTTL, "a refused Renew or Release of a key never acquired kept it")
}

func tokensGrowAcrossRelease(h *harness) {
	k := h.key("k")
	var tokens []int64
	for _, owner := range []string{ownerA, ownerB, ownerA, ownerA} {
		tokens = append(tokens, h.mustAcquire(k, owner, longTTL, "the key was released"))
		require.True(h.t, h.release(k, owner), "Release by the holder refused")
	}
	require.NoError(h.t, increasing(tokens), "tokens of %q across releases", k)
}

func tokensGrowAcrossExpiry(h *harness) {
	k := h.key("k")
	tokens := []int64{h.expire(k, ownerA), h.expire(k, ownerB)}
	tokens = append(tokens, h.mustAcquire(k, ownerA, longTTL, "an expired lock kept the key"))
	require.NoError(h.t, increasing(tokens), "tokens of %q across expiries", k)
}

func tokensGrowAfterRewind(h *harness) {
	if h.opts.RewindTokens == nil {
		h.t.Skip("Options.RewindTokens is nil")
	}
	k := h.key("k")
	var tokens []int64
	for range 3 {
		tokens = append(tokens, h.mustAcquire(k, ownerA, longTTL, "the key was released"))
		require.True(h.t, h.release(k, ownerA), "Release by the holder refused")
	}
	h.opts.RewindTokens(h.t)
	tokens = append(tokens, h.mustAcquire(k, ownerB, longTTL, "the key was released"))
	require.NoError(h.t, increasing(tokens), "tokens of %q across a rewind of the token source", k)
	h.mustAcquire(h.key("fresh"), ownerA, longTTL, "the key is free")
}

func tokensPositiveOnEveryKey(h *harness) {
	for i := range 10 {
		h.mustAcquire(h.key(fmt.Sprint(i)), ownerA, longTTL, "the key is free")
	}
}

func longTTLHolds(h *harness) {
	k := h.key("k")
	h.mustAcquire(k, ownerA, threeWeeks, "the key is free")
	require.True(h.t, h.renew(k, ownerA, threeWeeks), "Renew of a lock with a ttl of three weeks refused")
	h.requireHeld(k, "a lock with a ttl of three weeks")
	if h.opts.AdvanceTime == nil {
		require.True(h.t, h.release(k, ownerA), "Release of a lock with a ttl of three weeks refused")
		return
	}
	start := h.now()
	h.waitUntil(start.Add(threeWeeks - 24*time.Hour))
	h.requireHeld(k, "a day before the end of a ttl of three weeks")
	h.waitUntil(start.Add(threeWeeks + 24*time.Hour))
	h.mustAcquire(k, ownerB, longTTL, "the lock outlived its ttl of three weeks")
}

// keyCase is a key of KeysAreKeptApart, with what makes it special.
type keyCase struct {
	what string
	key  string
}

// apartKeys returns keys that differ only in ways a store might lose: length up to
// store.MaxKeyLength, multibyte runes, emoji sequences, normalization, direction,
// trailing spaces and case. Each starts with prefix.
func apartKeys(prefix string) []keyCase {
	n := store.MaxKeyLength - utf8.RuneCountInString(prefix)
	return []keyCase{
		{"500 ASCII characters", prefix + strings.Repeat("a", n)},
		{"499 ASCII characters", prefix + strings.Repeat("a", n-1)},
		{"500 ASCII characters, the last differs", prefix + strings.Repeat("a", n-1) + "b"},
		{"500 two-byte characters", prefix + strings.Repeat("ж", n)},
		{"500 two-byte characters, the last differs", prefix + strings.Repeat("ж", n-1) + "з"},
		{"500 four-byte characters", prefix + strings.Repeat("🐈", n)},
		{"black cat emoji sequence", prefix + "🐈\u200d⬛"},
		{"cat emoji", prefix + "🐈"},
		{"e and a combining acute accent", prefix + "e\u0301"},
		{"precomposed e with acute accent", prefix + "\u00e9"},
		{"right-to-left text", prefix + "مخزن"},
		{"k", prefix + "k"},
		{"k and a trailing space", prefix + "k "},
		{"k and two trailing spaces", prefix + "k  "},
		{"Key", prefix + "Key"},
		{"key", prefix + "key"},
		{"KEY", prefix + "KEY"},
	}
}

func keysAreKeptApart(h *harness) {
	require.Less(h.t, utf8.RuneCountInString(h.prefix), store.MaxKeyLength/2, "the subtest's name is too long for its keys")
	keys := apartKeys(h.prefix)
	owner := func(i int) string { return fmt.Sprintf("owner-%d", i) }
	for i, k := range keys {
		h.mustAcquire(k.key, owner(i), longTTL, "another key blocked "+k.what)
	}
	for i, k := range keys {
		require.True(h.t, h.renew(k.key, owner(i), longTTL), "Renew of %s by its holder refused", k.what)
		require.False(h.t, h.renew(k.key, owner((i+1)%len(keys)), longTTL), "the holder of another key renewed %s", k.what)
	}
	for i, k := range keys {
		require.True(h.t, h.release(k.key, owner(i)), "Release of %s by its holder refused", k.what)
		for _, other := range keys[i+1:] {
			h.requireHeld(other.key, fmt.Sprintf("releasing %s freed %s", k.what, other.what))
		}
	}
}

func renewMany(h *harness) {
	renewed, err := renewManyCall(h.store, nil, nil, longTTL)
	require.NoError(h.t, err, "RenewMany of no keys")
	require.Empty(h.t, renewed, "RenewMany of no keys")

	h.withShortTTL(func(ttl time.Duration) bool {
		held, heldByC := h.key("held"), h.key("held-by-c")
		others, released, expired, never := h.key("others"), h.key("released"), h.key("expired"), h.key("never-acquired")
		h.mustAcquire(others, ownerB, longTTL, "the key is free")
		h.mustAcquire(released, ownerA, longTTL, "the key is free")
		require.True(h.t, h.release(released, ownerA), "Release by the holder refused")
		sent := h.now()
		h.mustAcquire(expired, ownerA, ttl, "the key is free")
		h.mustAcquire(held, ownerA, 3*ttl, "the key is free")
		h.mustAcquire(heldByC, ownerC, 3*ttl, "the key is free")
		returned := h.now()
		h.waitUntil(returned.Add(ttl + ttl/3))

		keys := []string{held, others, released, expired, never, heldByC}
		owners := []string{ownerA, ownerA, ownerA, ownerA, ownerA, ownerC}
		renewed, err := renewManyCall(h.store, keys, owners, longTTL)
		require.NoError(h.t, err, "RenewMany")
		if (!slices.Contains(renewed, held) || !slices.Contains(renewed, heldByC)) && h.late(sent.Add(3*ttl)) {
			return false
		}
		require.ElementsMatch(h.t, []string{held, heldByC}, renewed, "RenewMany must return exactly the keys still held live by the given owners")

		h.waitUntil(returned.Add(3*ttl + ttl/3))
		h.requireHeld(held, "RenewMany did not extend the lock")
		h.requireHeld(heldByC, "RenewMany did not extend the lock")
		require.False(h.t, h.release(others, ownerA), "RenewMany gave another owner's key to the caller")
		require.True(h.t, h.release(others, ownerB), "the holder lost its key to another owner's RenewMany")
		for _, k := range []string{released, expired, never} {
			h.mustAcquire(k, ownerB, longTTL, "RenewMany re-created a lock")
		}
		require.True(h.t, h.release(held, ownerA), "the holder lost a key RenewMany renewed")
		require.True(h.t, h.release(heldByC, ownerC), "the holder lost a key RenewMany renewed")
		return true
	})
}

// renewManyCall calls b.RenewMany with a timeout.
func renewManyCall(b Store, keys, owners []string, ttl time.Duration) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	return b.RenewMany(ctx, keys, owners, ttl)
}

// attempt is the outcome of one racing Acquire.
type attempt struct {
	token    int64
	acquired bool
	err      error
}

func oneWinnerPerRound(h *harness) {
	keys := make([]string, raceKeys)
	for i := range keys {
		keys[i] = h.key(fmt.Sprint(i))
	}
	owner := func(i int) string { return fmt.Sprintf("owner-%d", i) }
	last := make([]int64, len(keys))
	for round := range raceRounds {
		attempts := make([][]attempt, len(keys))
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i, k := range keys {
			attempts[i] = make([]attempt, h.opts.Callers)
			for caller := range h.opts.Callers {
				wg.Go(func() {
					<-start
					a := &attempts[i][caller]
					a.token, a.acquired, a.err = contractAcquire(h.store, k, owner(caller), longTTL)
				})
			}
		}
		close(start)
		wg.Wait()

		for i, k := range keys {
			winner, err := soleWinner(attempts[i])
			require.NoError(h.t, err, "round %d on %q", round, k)
			token := attempts[i][winner].token
			require.Greater(h.t, token, last[i], "round %d on %q: the token did not grow", round, k)
			last[i] = token
			require.True(h.t, h.release(k, owner(winner)), "round %d on %q: Release by the winner refused", round, k)
		}
	}
}

// soleWinner returns the index of the one attempt that acquired the key, or an error
// if an attempt failed, or if not exactly one acquired it with a positive token.
func soleWinner(attempts []attempt) (int, error) {
	winner := -1
	for i, a := range attempts {
		switch {
		case a.err != nil:
			return 0, fmt.Errorf("caller %d: Acquire: %w", i, a.err)
		case !a.acquired:
		case winner >= 0:
			return 0, fmt.Errorf("callers %d and %d both acquired the key", winner, i)
		case a.token <= 0:
			return 0, fmt.Errorf("caller %d acquired the key with token %d, which is not positive", i, a.token)
		default:
			winner = i
		}
	}
	if winner < 0 {
		return 0, fmt.Errorf("none of %d callers acquired the free key", len(attempts))
	}
	return winner, nil
}

// raceKey is what the goroutines of HoldersNeverOverlap see of one key.
type raceKey struct {
	key     string
	holders atomic.Int32
	mu      sync.Mutex
	tokens  []int64 // in the order the holders won them
	errs    []error
}

// fail records a broken contract or a failed call.
func (r *raceKey) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, err)
}

// compete has owner try to acquire r's key iterations times. Whenever it wins, it
// checks that no one else holds the key, renews it, and releases it; whenever it
// loses, it checks that it cannot renew or release it.
func (r *raceKey) compete(s Store, owner string, iterations int) {
	for range iterations {
		token, acquired, err := contractAcquire(s, r.key, owner, longTTL)
		if err != nil {
			r.fail(fmt.Errorf("%s: Acquire: %w", owner, err))
			return
		}
		if !acquired {
			if renewed, err := contractRenew(s, r.key, owner, longTTL); err != nil || renewed {
				r.fail(fmt.Errorf("%s lost, then Renew: %v, %w", owner, renewed, err))
				return
			}
			if released, err := contractRelease(s, r.key, owner); err != nil || released {
				r.fail(fmt.Errorf("%s lost, then Release: %v, %w", owner, released, err))
				return
			}
			continue
		}
		if n := r.holders.Add(1); n != 1 {
			r.fail(fmt.Errorf("%s won while %d others held the key", owner, n-1))
		}
		r.mu.Lock()
		r.tokens = append(r.tokens, token)
		r.mu.Unlock()
		renewed, err := contractRenew(s, r.key, owner, longTTL)
		r.holders.Add(-1)
		if err != nil || !renewed {
			r.fail(fmt.Errorf("%s won, then Renew: %v, %w", owner, renewed, err))
			return
		}
		if released, err := contractRelease(s, r.key, owner); err != nil || !released {
			r.fail(fmt.Errorf("%s won, then Release: %v, %w", owner, released, err))
			return
		}
	}
}

func holdersNeverOverlap(h *harness) {
	const iterations = 10
	keys := make([]*raceKey, raceKeys)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range keys {
		keys[i] = &raceKey{key: h.key(fmt.Sprint(i))}
		for caller := range h.opts.Callers {
			wg.Go(func() {
				<-start
				keys[i].compete(h.store, fmt.Sprintf("owner-%d", caller), iterations)
			})
		}
	}
	close(start)
	wg.Wait()

	for _, r := range keys {
		require.NoError(h.t, errors.Join(r.errs...), "racing on %q", r.key)
		require.NotEmpty(h.t, r.tokens, "no caller ever acquired %q", r.key)
		require.NoError(h.t, increasing(r.tokens), "tokens of %q in the order they were won", r.key)
	}
}

// increasing returns an error unless every token is positive and greater than the
// one before it.
func increasing(tokens []int64) error {
	for i, token := range tokens {
		if token <= 0 {
			return fmt.Errorf("token %d of %v is not positive", i, tokens)
		}
		if i > 0 && token <= tokens[i-1] {
			return fmt.Errorf("token %d of %v is not greater than the one before it", i, tokens)
		}
	}
	return nil
}

// semaphore returns the store as a semaphoreStore, skipping the case on a store that
// has none.
func (h *harness) semaphore() semaphoreStore {
	h.t.Helper()
	s, ok := h.store.(semaphoreStore)
	if !ok {
		h.t.Skip("the store takes no permits")
	}
	return s
}

// semAcquire takes a permit and requires no error.
func (h *harness) semAcquire(key, owner string, ttl time.Duration, permits int) (int, int64, bool) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	permit, token, ok, err := h.semaphore().SemAcquire(ctx, key, owner, ttl, permits)
	require.NoError(h.t, err)
	return permit, token, ok
}

// semaphoreGrantsLowestFree: N acquisitions get permits 1..N, the next none; a
// released permit (its row key released like a lock's) is granted again, with a
// greater token, and a smaller N grants nothing while as many are held.
func semaphoreGrantsLowestFree(h *harness) {
	key := strings.TrimSuffix(h.key("sem"), "/")
	var tokens []int64
	for want := 1; want <= 3; want++ {
		permit, token, ok := h.semAcquire(key, fmt.Sprintf("%s-%d", ownerA, want), longTTL, 3)
		require.True(h.t, ok, "permit %d", want)
		require.Equal(h.t, want, permit)
		require.Positive(h.t, token)
		tokens = append(tokens, token)
	}
	_, _, ok := h.semAcquire(key, ownerB, longTTL, 3)
	require.False(h.t, ok, "3 of 3 permits held")
	require.True(h.t, h.release(key+"\x1f2", ownerA+"-2"))
	_, _, ok = h.semAcquire(key, ownerB, longTTL, 2)
	require.False(h.t, ok, "2 held with 2 permits")
	permit, token, ok := h.semAcquire(key, ownerB, longTTL, 3)
	require.True(h.t, ok)
	require.Equal(h.t, 2, permit)
	require.Greater(h.t, token, tokens[1])
}

// semaphoreExpiredPermitIsFree: a permit whose holder stopped renewing is granted
// again after its ttl on the store's clock, with a greater token.
func semaphoreExpiredPermitIsFree(h *harness) {
	h.semaphore()
	h.withShortTTL(func(ttl time.Duration) bool {
		key := strings.TrimSuffix(h.key("sem"), "/")
		start := h.now()
		_, first, ok := h.semAcquire(key, ownerA, ttl, 1)
		require.True(h.t, ok)
		_, _, ok = h.semAcquire(key, ownerB, longTTL, 1)
		if h.late(start.Add(ttl)) {
			return false
		}
		require.False(h.t, ok, "the permit is held")
		// The store counted the ttl from before now: the permit has expired by now + ttl.
		h.waitUntil(h.now().Add(ttl + ttl/3))
		permit, token, ok := h.semAcquire(key, ownerB, longTTL, 1)
		require.True(h.t, ok, "the expired permit")
		require.Equal(h.t, 1, permit)
		require.Greater(h.t, token, first)
		return true
	})
}

// releaseManyHandsBack: one releaseMany call releases each key its owner holds live
// (a lock, a permit by its row key, a permit of unknown number by its semaphore's key
// and U+001F) and nothing else: not a key held by another owner, not one never
// acquired; and says which it released.
func releaseManyHandsBack(h *harness) {
	s := h.semaphore()
	lock, held, never := h.key("lock"), h.key("held"), h.key("never")
	sem := strings.TrimSuffix(h.key("sem"), "/")
	_, ok := h.acquire(lock, ownerA, longTTL)
	require.True(h.t, ok)
	_, ok = h.acquire(held, ownerB, longTTL)
	require.True(h.t, ok)
	_, _, ok = h.semAcquire(sem, ownerA, longTTL, 2)
	require.True(h.t, ok)
	_, _, ok = h.semAcquire(sem, ownerB, longTTL, 2)
	require.True(h.t, ok)

	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	released, err := s.ReleaseMany(ctx, []string{never, sem + "\x1f", held, lock, sem + "\x1f2"},
		[]string{ownerA, ownerA, ownerA, ownerA, ownerB})
	require.NoError(h.t, err)
	slices.Sort(released)
	require.Equal(h.t, []int{1, 3, 4}, released, "released: the permit of unknown number, the lock and the permit by its row key")
	_, ok = h.acquire(lock, ownerC, longTTL)
	require.True(h.t, ok, "the lock was handed back")
	_, ok = h.acquire(held, intruder, longTTL)
	require.False(h.t, ok, "another owner's lock stays held")
	_, ok = h.acquire(never, ownerC, longTTL)
	require.True(h.t, ok, "a key never acquired was left free")
	for range 2 {
		_, _, ok = h.semAcquire(sem, ownerC, longTTL, 2)
		require.True(h.t, ok, "both permits were handed back")
	}
	released, err = s.ReleaseMany(ctx, nil, nil)
	require.NoError(h.t, err)
	require.Empty(h.t, released)
}

// semaphoreNPermitsPerRound: Callers racers take permits of one semaphore of 3 at
// once; exactly 3 win, each a different permit, round after round.
func semaphoreNPermitsPerRound(h *harness) {
	s := h.semaphore()
	for round := range raceRounds / 4 { // the racers of a semaphore take turns: a round is slower
		key := fmt.Sprintf("%ssem-%d", h.prefix, round)
		var mu sync.Mutex
		won := map[int]string{}
		var twice []int
		errs := make(chan error, h.opts.Callers)
		var wg sync.WaitGroup
		for i := range h.opts.Callers {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
				defer cancel()
				owner := fmt.Sprintf("racer-%d", i)
				permit, _, ok, err := s.SemAcquire(ctx, key, owner, longTTL, 3)
				if err != nil || !ok {
					errs <- err
					return
				}
				mu.Lock()
				defer mu.Unlock()
				if won[permit] != "" {
					twice = append(twice, permit)
				}
				won[permit] = owner
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(h.t, err)
		}
		require.Empty(h.t, twice, "permits granted twice")
		require.Len(h.t, won, 3, "round %d: %v", round, won)
		for p := 1; p <= 3; p++ {
			require.NotEmpty(h.t, won[p], "round %d: permit %d", round, p)
		}
	}
}
