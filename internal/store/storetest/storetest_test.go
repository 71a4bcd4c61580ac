package storetest

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock"
)

// flaw names a rule of the contract that a fakeStore breaks.
type flaw string

const (
	noFlaw         flaw = ""
	alwaysAcquires flaw = "always-acquires" // Acquire wins even over a live holder
	renewRecreates flaw = "renew-recreates" // Renew creates a lock on a key no one holds live
	ignoresExpiry  flaw = "ignores-expiry"  // locks never expire
)

// brokenStoreEnv tells TestStoreContractOnABrokenStore, run in a child process, which
// flaw to check.
const brokenStoreEnv = "PGLOCK_TEST_BROKEN_STORE"

// fakeLock is a lock of a fakeStore; owner is empty once released.
type fakeLock struct {
	owner   string
	token   int64
	expires time.Time
}

// fakeStore is a Store in memory, with expiry on now, that breaks the rule its
// flaw names. It is written as a store outside pglock would be, which the contract
// cannot tell from a store of pglock's.
type fakeStore struct {
	now  func() time.Time
	flaw flaw

	mu    sync.Mutex
	locks map[string]*fakeLock
	seq   int64
}

func newFakeStore(now func() time.Time, f flaw) *fakeStore {
	return &fakeStore{now: now, flaw: f, locks: map[string]*fakeLock{}}
}

// liveHolder returns the live holder of key, or "".
func (s *fakeStore) liveHolder(key string) string {
	l := s.locks[key]
	if l == nil || (s.flaw != ignoresExpiry && !s.now().Before(l.expires)) {
		return ""
	}
	return l.owner
}

// take gives key to owner for ttl with a new token.
func (s *fakeStore) take(key, owner string, ttl time.Duration) int64 {
	s.seq++
	token := s.seq
	if l := s.locks[key]; l != nil {
		token = max(token, l.token+1)
	}
	s.locks[key] = &fakeLock{owner: owner, token: token, expires: s.now().Add(ttl)}
	return token
}

func (s *fakeStore) Acquire(_ context.Context, key, owner string, ttl time.Duration) (int64, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.liveHolder(key) != "" && s.flaw != alwaysAcquires {
		return 0, false, nil
	}
	return s.take(key, owner, ttl), true, nil
}

func (s *fakeStore) Renew(_ context.Context, key, owner string, ttl time.Duration) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.renew(key, owner, ttl), nil
}

func (s *fakeStore) renew(key, owner string, ttl time.Duration) bool {
	switch holder := s.liveHolder(key); {
	case holder == owner:
		s.locks[key].expires = s.now().Add(ttl)
		return true
	case holder == "" && s.flaw == renewRecreates:
		s.take(key, owner, ttl)
		return true
	default:
		return false
	}
}

func (s *fakeStore) Release(_ context.Context, key, owner string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.liveHolder(key) != owner {
		return false, nil
	}
	s.locks[key].owner = ""
	return true, nil
}

func (s *fakeStore) RenewMany(_ context.Context, keys, owners []string, ttl time.Duration) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var renewed []string
	for i, key := range keys {
		if s.renew(key, owners[i], ttl) {
			renewed = append(renewed, key)
		}
	}
	return renewed, nil
}

// rewind makes the token sequence start over.
func (s *fakeStore) rewind(testing.TB) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq = 0
}

// fakeClock is a clock that only Advance moves.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func TestStoreContractPassesACorrectStore(t *testing.T) {
	t.Parallel()
	t.Run("RealTime", func(t *testing.T) {
		t.Parallel()
		Run(t, func(*testing.T) Store { return newFakeStore(time.Now, noFlaw) },
			Options{Concurrent: true})
	})
	t.Run("AdvanceTime", func(t *testing.T) {
		t.Parallel()
		clock := &fakeClock{now: time.Now()}
		s := newFakeStore(clock.Now, noFlaw)
		Run(t, func(*testing.T) Store { return s },
			Options{Concurrent: true, Callers: 8, AdvanceTime: clock.Advance, RewindTokens: s.rewind})
	})
}

// TestStoreContractOnABrokenStore runs the contract against a broken fakeStore, in the
// child process TestStoreContractFailsBrokenStores starts.
func TestStoreContractOnABrokenStore(t *testing.T) {
	f := flaw(os.Getenv(brokenStoreEnv))
	if f == noFlaw {
		t.Skip("run by TestStoreContractFailsBrokenStores")
	}
	clock := &fakeClock{now: time.Now()}
	s := newFakeStore(clock.Now, f)
	Run(t, func(*testing.T) Store { return s },
		Options{Concurrent: true, AdvanceTime: clock.Advance, RewindTokens: s.rewind})
}

func TestStoreContractFailsBrokenStores(t *testing.T) {
	t.Parallel()
	for f, failing := range map[flaw][]string{
		alwaysAcquires: {"AcquireHeld", "AcquireOwnHeldIsNotReentrant", "Concurrent/OneWinnerPerRound"},
		renewRecreates: {"RenewNeverRecreates", "RenewAfterExpiryFails"},
		ignoresExpiry: {"RenewByHolderExtends", "RenewAfterExpiryFails", "ReleaseAfterExpiryFails",
			"ExpiredLockIsFree/AcquireByAnother", "ExpiredLockIsFree/AcquireByFormerHolder",
			"TokensGrow/AcrossExpiry", "LongTTL", "RenewMany"},
	} {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestStoreContractOnABrokenStore$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), brokenStoreEnv+"="+string(f))
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			require.ErrorAs(t, err, &exit, "the contract passed a store that is %s:\n%s", f, out)
			for _, name := range failing {
				require.Contains(t, string(out), "--- FAIL: TestStoreContractOnABrokenStore/"+name+" (", "the contract missed a store that is %s", f)
			}
		})
	}
}

func TestIncreasing(t *testing.T) {
	require.NoError(t, increasing(nil))
	require.NoError(t, increasing([]int64{1, 2, 7}))
	require.Error(t, increasing([]int64{0, 1}))
	require.Error(t, increasing([]int64{3, 3}))
	require.Error(t, increasing([]int64{3, 2}))
}

func TestSoleWinner(t *testing.T) {
	won, lost := attempt{token: 5, acquired: true}, attempt{}
	winner, err := soleWinner([]attempt{lost, won, lost})
	require.NoError(t, err)
	require.Equal(t, 1, winner)

	for name, attempts := range map[string][]attempt{
		"none":     {lost, lost},
		"two":      {won, lost, won},
		"error":    {won, {err: errors.New("boom")}},
		"token 0":  {{acquired: true}},
		"negative": {{token: -1, acquired: true}},
	} {
		_, err := soleWinner(attempts)
		require.Error(t, err, name)
	}
}

func TestApartKeys(t *testing.T) {
	prefix := "TestStoreContract/KeysAreKeptApart/0123456789abcdef/"
	seen := map[string]string{}
	for _, k := range apartKeys(prefix) {
		require.True(t, strings.HasPrefix(k.key, prefix), k.what)
		require.True(t, utf8.ValidString(k.key), k.what)
		require.LessOrEqual(t, utf8.RuneCountInString(k.key), pglock.MaxKeyLength, k.what)
		if strings.HasPrefix(k.what, "500 ") {
			require.Equal(t, pglock.MaxKeyLength, utf8.RuneCountInString(k.key), k.what)
		}
		require.NotContains(t, seen, k.key, "%s repeats %s", k.what, seen[k.key])
		seen[k.key] = k.what
	}
}
