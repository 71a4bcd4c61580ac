package store

import (
	"context"
	"database/sql"
	"slices"
	"strings"
	"sync"
	"time"
)

// The stores' side of the registry (registry.go): pglock.registry (000016, 000028).

// Registry kinds: the kind column of pglock.registry.
const (
	KindJob      = "job"
	KindElection = "election"
)

const (
	// RegistryRefresh is how often a client tells the store that its registrations
	// are still there (Registration.Seen).
	RegistryRefresh = 5 * time.Minute
	// registryGone is how long a registration neither closed nor refreshed stays
	// live: a refresh period and a minute for a late one.
	registryGone = RegistryRefresh + time.Minute
)

// The states of a registration: pglock's RegistrationLive, RegistrationClosed and
// RegistrationGone.
const (
	RegistrationLive   = "live"
	RegistrationClosed = "closed"
	RegistrationGone   = "gone"
)

// registrationState is the state of a registration seen at seen, closed or not, read
// at now.
func registrationState(closed bool, seen, now time.Time) string {
	switch {
	case closed:
		return RegistrationClosed
	case now.Sub(seen) > registryGone:
		return RegistrationGone
	}
	return RegistrationLive
}

// registryEntry is one registration, the memory store's key.
type registryEntry struct{ kind, key string }

func (s *postgresStore) RegistryTouch(ctx context.Context, kind string, keys []string, instance string, registering bool) error {
	var written sql.NullInt64
	if err := s.queryRow(ctx, `SELECT pglock.registry_touch($1, $2, $3, $4)`, kind, s.array(keys), instance, registering).
		Scan(&written); err != nil {
		return storeError(err, "register %d %ss", len(keys), kind)
	}
	return nil
}

func (s *postgresStore) RegistryClose(ctx context.Context, kind string, keys []string, instance string) error {
	var written sql.NullInt64
	if err := s.queryRow(ctx, `SELECT pglock.registry_close($1, $2, $3)`, kind, s.array(keys), instance).
		Scan(&written); err != nil {
		return storeError(err, "mark %d %ss closed", len(keys), kind)
	}
	return nil
}

// Registrations returns the registrations of kind, by key then instance.
func (s *postgresStore) Registrations(ctx context.Context, kind string) ([]RegistryRow, error) {
	var out []RegistryRow
	err := s.queryRows(ctx, `SELECT key, instance, registered_at, seen_at, closed_at, read_at
		FROM pglock.registry_states($1)`, []any{kind},
		func(r scanner) error {
			var row RegistryRow
			var closed sql.NullTime
			var readAt time.Time
			if err := r.Scan(&row.Key, &row.Instance, &row.Registered, &row.Seen, &closed, &readAt); err != nil {
				return err
			}
			row.State = registrationState(closed.Valid, row.Seen, readAt)
			out = append(out, row)
			return nil
		})
	if err != nil {
		return nil, storeError(err, "list the registered %ss", kind)
	}
	return out, nil
}

func (s *postgresStore) Elections(ctx context.Context) ([]LockInfo, error) {
	out := []LockInfo{}
	err := s.queryRows(ctx, `SELECT e.key, h.owner, h.fencing_token, h.expires_in_us, clock_timestamp()
		FROM (SELECT DISTINCT r.Key FROM pglock.registry_list('election') r) e
		CROSS JOIN LATERAL pglock.lock_holder(e.key) h`, nil, func(r scanner) error {
		var l LockInfo
		var owner sql.NullString
		var token, expiresInUS sql.NullInt64
		var readAt time.Time
		if err := r.Scan(&l.Key, &owner, &token, &expiresInUS, &readAt); err != nil {
			return err
		}
		if owner.Valid {
			in := time.Duration(expiresInUS.Int64) * time.Microsecond
			l.Owner, l.Instance, l.Token, l.Held, l.ExpiresAt, l.ExpiresIn = owner.String, instanceOf(owner.String),
				token.Int64, true, readAt.Add(in), in
		}
		out = append(out, l)
		return nil
	})
	if err != nil {
		return nil, storeError(err, "list elections")
	}
	sortLocks(out)
	return out, nil
}

// memoryRegistry is the memory store's registry. Its zero value is ready.
type memoryRegistry struct {
	mu   sync.Mutex
	rows map[registryEntry]map[string]Registration // by instance
}

func (s *memoryStore) RegistryTouch(_ context.Context, kind string, keys []string, instance string, registering bool) error {
	now := s.clock.Now()
	g := &s.registry
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.rows == nil {
		g.rows = make(map[registryEntry]map[string]Registration)
	}
	for _, key := range keys {
		e := registryEntry{kind, key}
		if g.rows[e] == nil {
			g.rows[e] = make(map[string]Registration)
		}
		r, ok := g.rows[e][instance]
		if !ok || registering {
			r = Registration{Instance: instance, Registered: now}
		}
		r.Seen, r.State = now, ""
		g.rows[e][instance] = r
	}
	return nil
}

func (s *memoryStore) RegistryClose(_ context.Context, kind string, keys []string, instance string) error {
	now := s.clock.Now()
	g := &s.registry
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, key := range keys {
		if r, ok := g.rows[registryEntry{kind, key}][instance]; ok && r.State != RegistrationClosed {
			r.Seen, r.State = now, RegistrationClosed
			g.rows[registryEntry{kind, key}][instance] = r
		}
	}
	return nil
}

func (s *memoryStore) Registrations(_ context.Context, kind string) ([]RegistryRow, error) {
	now := s.clock.Now()
	g := &s.registry
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []RegistryRow
	for e, byInstance := range g.rows {
		if e.kind != kind {
			continue
		}
		for _, r := range byInstance {
			r.State = registrationState(r.State == RegistrationClosed, r.Seen, now)
			out = append(out, RegistryRow{Key: e.key, Registration: r})
		}
	}
	slices.SortFunc(out, func(a, b RegistryRow) int {
		if c := strings.Compare(a.Key, b.Key); c != 0 {
			return c
		}
		return strings.Compare(a.Instance, b.Instance)
	})
	return out, nil
}

func (s *memoryStore) Elections(ctx context.Context) ([]LockInfo, error) {
	rows, _ := s.Registrations(ctx, KindElection)
	out := []LockInfo{}
	for _, r := range rows {
		if len(out) > 0 && out[len(out)-1].Key == r.Key {
			continue
		}
		l, err := s.Holder(ctx, r.Key)
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, nil
}
