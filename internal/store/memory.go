package store

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"
)

// Clock is the time the memory store measures expiry on: pglock.Clock has it.
type Clock interface{ Now() time.Time }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// NewMemory returns a store that keeps its locks in this process, with expiry on clock
// (nil means the real clock): pglock.NewMemoryStore's. It has no Wanter and no Slots.
// It is safe for concurrent use.
func NewMemory(clock Clock) Store {
	if clock == nil {
		clock = realClock{}
	}
	return &memoryStore{clock: clock, locks: make(map[string]*memoryLock), waiters: make(map[string][]*memoryWaiter)}
}

// Queued returns how many fair waiters the memory store s keeps queued on the lock key
// (for tests), or 0 for another store.
func Queued(s Store, key string) int {
	m, ok := s.(*memoryStore)
	if !ok {
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.waiters[key])
}

type memoryStore struct {
	clock   Clock
	mu      sync.Mutex
	seq     int64                  // the last token drawn; never below a pruned lock's token
	locks   map[string]*memoryLock // kept after release, like the table's rows, until pruned
	history memoryHistory          // job runs and skips (history.go)
	// The fair queues, as pglock.waiters: by key (a semaphore's: its key and
	// U+001F, semQueue), in the order of their tickets.
	waiters  map[string][]*memoryWaiter
	tickets  int64          // the last ticket drawn
	registry memoryRegistry // registered jobs and elections (registry.go)
}

// memoryWaiter is a fair waiter queued on a key (see Fair).
type memoryWaiter struct {
	ticket  int64
	owner   string
	ttl     time.Duration
	permits int       // the semaphore's N; 0 for a lock
	seen    time.Time // the last poll
	granted string    // the row key granted to it, "" while it waits
}

// semQueue returns the key of the fair queue of the semaphore key, as
// migrations/000017_fair_semaphores.up.sql keeps it: apart from a lock's of that key.
func semQueue(key string) string { return key + PermitSeparator }

type memoryLock struct {
	owner    string // "" once released
	token    int64
	acquired time.Time     // when token was drawn
	ttl      time.Duration // the ttl it was drawn for
	expires  time.Time     // the end of the lease: its expiry, or its release
}

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
	if s.queued(key, 0) {
		return 0, false, nil
	}
	token := s.take(key, owner, ttl)
	return token, token > 0, nil
}

// take takes key for owner for ttl when no live lock holds it, and returns its token,
// or 0; s.mu is held.
func (s *memoryStore) take(key, owner string, ttl time.Duration) int64 {
	if s.live(key, "") != nil {
		return 0
	}
	s.seq++
	l := s.locks[key]
	if l == nil {
		l = &memoryLock{}
		s.locks[key] = l
	}
	now := s.clock.Now()
	l.owner, l.token, l.acquired, l.ttl, l.expires = owner, max(s.seq, l.token+1), now, ttl.Truncate(time.Millisecond), now.Add(ttl)
	return l.token
}

// queued reports whether a live fair waiter that is not granted the key waits on key
// with a ticket below before (any ticket when 0); s.mu is held.
func (s *memoryStore) queued(key string, before int64) bool {
	alive := s.clock.Now().Add(-QueueBound)
	for _, w := range s.waiters[key] {
		if before != 0 && w.ticket >= before {
			break
		}
		if w.granted == "" && w.seen.After(alive) {
			return true
		}
	}
	return false
}

// waiting counts the live fair waiters not granted anything in the queue qkey with a
// ticket below before; s.mu is held.
func (s *memoryStore) waiting(qkey string, before int64) int {
	alive, n := s.clock.Now().Add(-QueueBound), 0
	for _, w := range s.waiters[qkey] {
		if w.ticket < before && w.granted == "" && w.seen.After(alive) {
			n++
		}
	}
	return n
}

// grant hands key, free, to the head of its live queue, for QueueBound; s.mu is held.
func (s *memoryStore) grant(key string) {
	now := s.clock.Now()
	for _, w := range s.waiters[key] {
		if w.granted == "" && w.seen.After(now.Add(-QueueBound)) {
			s.grantTo(w, key)
			return
		}
	}
}

// semGrant hands row, a permit of the semaphore key just freed, to the head of the
// semaphore's live queue when the head's N allows it, as pglock.sem_grant does; s.mu
// is held.
func (s *memoryStore) semGrant(key, row string) {
	alive := s.clock.Now().Add(-QueueBound)
	for _, w := range s.waiters[semQueue(key)] {
		if w.granted == "" && w.seen.After(alive) {
			if _, permit := SplitPermitKey(row); permit <= w.permits && len(s.livePermits(key, "")) < w.permits {
				s.grantTo(w, row)
			}
			return
		}
	}
}

// grantTo grants row, free, to w for QueueBound; s.mu is held.
func (s *memoryStore) grantTo(w *memoryWaiter, row string) {
	now := s.clock.Now()
	s.seq++
	l := s.locks[row]
	l.owner, l.token, l.acquired, l.ttl, l.expires = w.owner, max(s.seq, l.token+1), now, w.ttl.Truncate(time.Millisecond), now.Add(QueueBound)
	w.granted, w.seen = row, now
}

// handOver hands row, just freed, to the head of its queue: its semaphore's for a
// permit, its key's for a lock; s.mu is held.
func (s *memoryStore) handOver(row string) {
	if key, permit := SplitPermitKey(row); permit > 0 {
		s.semGrant(key, row)
		return
	}
	s.grant(row)
}

// waiter returns the waiter of ticket in the queue of the lock key or of the semaphore
// key, its queue's key and its index, or nil; s.mu is held.
func (s *memoryStore) waiter(key string, ticket int64) (*memoryWaiter, string, int) {
	for _, qkey := range []string{key, semQueue(key)} {
		for i, w := range s.waiters[qkey] {
			if w.ticket == ticket {
				return w, qkey, i
			}
		}
	}
	return nil, "", -1
}

// dequeue deletes key's i-th waiter; s.mu is held.
func (s *memoryStore) dequeue(key string, i int) {
	q := slices.Delete(s.waiters[key], i, i+1)
	if len(q) == 0 {
		delete(s.waiters, key)
		return
	}
	s.waiters[key] = q
}

func (s *memoryStore) QueueAcquire(_ context.Context, t Target, owner string, ttl time.Duration) (int, int64, int64, int, error) {
	if err := checkQueueCall(t, owner, ttl); err != nil {
		return 0, 0, 0, 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// What owner holds already, a claim whose reply was lost: renewed and given again.
	row := t.Key
	if t.Permits > 0 {
		row = "" // no lock has this key
		if rows := s.livePermits(t.Key, owner); len(rows) > 0 {
			row = slices.Min(rows)
		}
	}
	if l := s.live(row, owner); l != nil {
		l.expires = s.clock.Now().Add(ttl)
		_, permit := SplitPermitKey(row)
		return permit, l.token, 0, 0, nil
	}
	qkey := t.Key
	if t.Permits > 0 {
		qkey = semQueue(t.Key)
		if !s.queued(qkey, 0) {
			if permit, token := s.semTake(t.Key, owner, ttl, t.Permits); token > 0 {
				return permit, token, 0, 0, nil
			}
		}
	} else if !s.queued(qkey, 0) {
		if token := s.take(qkey, owner, ttl); token > 0 {
			return 0, token, 0, 0, nil
		}
	}
	now := s.clock.Now()
	q := slices.DeleteFunc(s.waiters[qkey], func(w *memoryWaiter) bool { return w.seen.Before(now.Add(-time.Minute)) })
	s.tickets++
	s.waiters[qkey] = append(q, &memoryWaiter{ticket: s.tickets, owner: owner, ttl: ttl, permits: t.Permits, seen: now})
	return 0, 0, s.tickets, min(s.waiting(qkey, s.tickets), MaxAhead), nil
}

func (s *memoryStore) QueuePoll(_ context.Context, key string, ticket int64) (int, int64, bool, int, error) {
	if err := checkTicket(key, ticket); err != nil {
		return 0, 0, false, 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	w, qkey, i := s.waiter(key, ticket)
	if w == nil {
		return 0, 0, false, 0, nil
	}
	if w.granted != "" {
		if l := s.live(w.granted, w.owner); l != nil { // the claim
			l.expires = s.clock.Now().Add(w.ttl)
			s.dequeue(qkey, i)
			_, permit := SplitPermitKey(w.granted)
			return permit, l.token, false, 0, nil
		}
	}
	w.granted, w.seen = "", s.clock.Now()
	waiting := s.waiting(qkey, ticket)
	ahead := min(waiting, MaxAhead)
	if w.permits > 0 {
		if waiting >= w.permits-len(s.livePermits(key, "")) {
			return 0, 0, true, ahead, nil
		}
		permit, token := s.semTake(key, w.owner, w.ttl, w.permits)
		if token == 0 {
			return 0, 0, true, ahead, nil
		}
		s.dequeue(qkey, i)
		return permit, token, false, 0, nil
	}
	if s.live(key, "") != nil || s.queued(key, ticket) {
		return 0, 0, true, ahead, nil
	}
	token := s.take(key, w.owner, w.ttl)
	s.dequeue(key, i)
	return 0, token, false, 0, nil
}

func (s *memoryStore) QueueLeave(_ context.Context, key string, ticket int64) (bool, error) {
	if err := checkTicket(key, ticket); err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	w, qkey, i := s.waiter(key, ticket)
	if w == nil {
		return false, nil
	}
	s.dequeue(qkey, i)
	if w.granted != "" {
		if l := s.live(w.granted, w.owner); l != nil {
			l.owner, l.expires = "", s.clock.Now()
			s.handOver(w.granted)
		}
	}
	return true, nil
}

// SemAcquire is pglock.sem_acquire's rule on the store's clock; one mutex makes the
// count and the take one step.
func (s *memoryStore) SemAcquire(_ context.Context, key, owner string, ttl time.Duration, permits int) (int, int64, bool, error) {
	if err := checkSemCall(key, owner, ttl, permits); err != nil {
		return 0, 0, false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.queued(semQueue(key), 0) { // the semaphore is its fair waiters'
		return 0, 0, false, nil
	}
	permit, token := s.semTake(key, owner, ttl, permits)
	return permit, token, token > 0, nil
}

// semTake takes the lowest free permit of the semaphore key while fewer than permits
// live holders hold it, and returns its number and token, or zeros; s.mu is held.
func (s *memoryStore) semTake(key, owner string, ttl time.Duration, permits int) (int, int64) {
	if len(s.livePermits(key, "")) >= permits {
		return 0, 0
	}
	for i := 1; i <= permits; i++ {
		if row := PermitKey(key, i); s.live(row, "") == nil {
			return i, s.take(row, owner, ttl)
		}
	}
	return 0, 0 // unreachable: fewer live holders than permits
}

// livePermits returns the row keys of the live permits of the semaphore key held by
// owner (any owner when ""); s.mu is held.
func (s *memoryStore) livePermits(key, owner string) []string {
	var rows []string
	for row := range s.locks {
		if sem, permit := SplitPermitKey(row); permit > 0 && sem == key && s.live(row, owner) != nil {
			rows = append(rows, row)
		}
	}
	return rows
}

func (s *memoryStore) ReleaseMany(_ context.Context, keys, owners []string) ([]int, error) {
	if err := checkReleaseMany(keys, owners); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var released []int
	for i, key := range keys {
		if s.release(key, owners[i]) {
			released = append(released, i)
		}
	}
	return released, nil
}

// release releases key for owner, as pglock.lock_release_many does one key, and
// reports whether it did; s.mu is held.
func (s *memoryStore) release(key, owner string) bool {
	if sem, ok := strings.CutSuffix(key, PermitSeparator); ok {
		// A permit of unknown number (sem_release), handed over as any permit's release.
		rows := s.livePermits(sem, owner)
		for _, row := range rows {
			l := s.locks[row]
			l.owner, l.expires = "", s.clock.Now()
			s.handOver(row)
		}
		return len(rows) > 0
	}
	l := s.live(key, owner)
	if l == nil {
		return false
	}
	l.owner, l.expires = "", s.clock.Now()
	s.handOver(key)
	return true
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

func (s *memoryStore) RenewMany(_ context.Context, keys, owners []string, ttl time.Duration) ([]string, error) {
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
	return s.release(key, owner), nil
}

// Prune deletes up to limit locks released or expired more than olderThan ago, as
// pglock.lock_prune does, raising seq to every token it deletes.
func (s *memoryStore) Prune(_ context.Context, olderThan time.Duration, limit int) (int64, error) {
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
	// The waiters not polled for a minute, as lock_prune (000019): limit of them at most.
	gone := 0
	for key, q := range s.waiters {
		s.waiters[key] = slices.DeleteFunc(q, func(w *memoryWaiter) bool {
			if gone < limit && w.seen.Before(now.Add(-time.Minute)) {
				gone++
				return true
			}
			return false
		})
		if len(s.waiters[key]) == 0 {
			delete(s.waiters, key)
		}
	}
	return deleted, nil
}

func (s *memoryStore) Holder(_ context.Context, key string) (LockInfo, error) {
	if err := CheckKey(key); err != nil {
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
