package pglock

import (
	"context"
	"sync"
	"time"
)

// NewMemoryStore returns a Store that keeps its locks in this process, with expiry on
// clock (nil means the real clock). It excludes callers in one process only: instances
// of an application must share a PostgreSQL store instead: it is there for tests, as
// NewWithStore(NewMemoryStore(clock), WithClock(clock)). Every feature of a Client
// works on it but the listener, which needs PostgreSQL's NOTIFY: waiters poll. It is
// safe for concurrent use.
func NewMemoryStore(clock Clock) Store {
	if clock == nil {
		clock = realClock{}
	}
	return &memoryStore{clock: clock, locks: make(map[string]*memoryLock)}
}

type memoryStore struct {
	clock   Clock
	mu      sync.Mutex
	seq     int64                  // the last token drawn; never below a pruned lock's token
	locks   map[string]*memoryLock // kept after release, like the table's rows, until pruned
	history memoryHistory          // job runs and skips (history.go)
}

type memoryLock struct {
	owner   string // "" once released
	token   int64
	expires time.Time // the end of the lease: its expiry, or its release
}

func (s *memoryStore) pglockStore() {}

// live returns key's lock if owner (any owner when "") holds it and it has not expired.
func (s *memoryStore) live(key, owner string) *memoryLock {
	l := s.locks[key]
	if l == nil || l.owner == "" || (owner != "" && l.owner != owner) || !l.expires.After(s.clock.Now()) {
		return nil
	}
	return l
}

func (s *memoryStore) Acquire(_ context.Context, key, owner string, ttl time.Duration) (int64, bool, error) {
	if err := checkAcquire(key, owner, ttl); err != nil {
		return 0, false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.live(key, "") != nil {
		return 0, false, nil
	}
	return s.take(key, owner, ttl), true, nil
}

// take gives the free key to owner and returns its new token; s.mu is held.
func (s *memoryStore) take(key, owner string, ttl time.Duration) int64 {
	s.seq++
	l := s.locks[key]
	if l == nil {
		l = &memoryLock{}
		s.locks[key] = l
	}
	l.owner, l.token, l.expires = owner, max(s.seq, l.token+1), s.clock.Now().Add(ttl)
	return l.token
}

// semAcquire is pglock.sem_acquire's rule on the store's clock; one mutex makes the
// count and the take one step.
func (s *memoryStore) semAcquire(_ context.Context, key, owner string, ttl time.Duration, permits int) (int, int64, bool, error) {
	if err := checkSemCall(key, owner, ttl, permits); err != nil {
		return 0, 0, false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.livePermits(key, "")) >= permits {
		return 0, 0, false, nil
	}
	for i := 1; i <= permits; i++ {
		if row := permitKey(key, i); s.live(row, "") == nil {
			return i, s.take(row, owner, ttl), true, nil
		}
	}
	return 0, 0, false, nil // unreachable: fewer live holders than permits
}

// livePermits returns the row keys of the live permits of the semaphore key held by
// owner (any owner when ""); s.mu is held.
func (s *memoryStore) livePermits(key, owner string) []string {
	var rows []string
	for row := range s.locks {
		if sem, permit := splitPermitKey(row); permit > 0 && sem == key && s.live(row, owner) != nil {
			rows = append(rows, row)
		}
	}
	return rows
}

func (s *memoryStore) semRelease(_ context.Context, key, owner string) (bool, error) {
	if err := checkSemCall(key, owner, time.Millisecond, 1); err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rows := s.livePermits(key, owner)
	for _, row := range rows {
		l := s.locks[row]
		l.owner, l.expires = "", s.clock.Now()
	}
	return len(rows) > 0, nil
}

func (s *memoryStore) Renew(_ context.Context, key, owner string, ttl time.Duration) (bool, error) {
	if err := checkCall(key, owner, ttl); err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.renew(key, owner, ttl), nil
}

// renew renews key for owner if owner holds it live; s.mu is held.
func (s *memoryStore) renew(key, owner string, ttl time.Duration) bool {
	l := s.live(key, owner)
	if l == nil {
		return false
	}
	l.expires = s.clock.Now().Add(ttl)
	return true
}

func (s *memoryStore) renewMany(_ context.Context, keys, owners []string, ttl time.Duration) ([]string, error) {
	if err := checkRenewMany(keys, owners, ttl); err != nil {
		return nil, err
	}
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

func (s *memoryStore) Release(_ context.Context, key, owner string) (bool, error) {
	if err := checkCall(key, owner, time.Millisecond); err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.live(key, owner)
	if l == nil {
		return false, nil
	}
	l.owner, l.expires = "", s.clock.Now()
	return true, nil
}

// prune deletes up to limit locks released or expired more than olderThan ago, as
// pglock.lock_prune does, raising seq to every token it deletes.
func (s *memoryStore) prune(_ context.Context, olderThan time.Duration, limit int) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	var deleted int64
	for key, l := range s.locks {
		if deleted == int64(limit) {
			break
		}
		if (l.owner == "" || !l.expires.After(now)) && l.expires.Before(now.Add(-olderThan)) {
			s.seq = max(s.seq, l.token)
			delete(s.locks, key)
			deleted++
		}
	}
	return deleted, nil
}

func (s *memoryStore) holder(_ context.Context, key string) (LockInfo, error) {
	if err := checkKey(key); err != nil {
		return LockInfo{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if l := s.locks[key]; l != nil {
		if info := s.info(key, l, s.clock.Now()); info.Held {
			return info, nil
		}
	}
	return LockInfo{Key: key}, nil
}
