package store

import (
	"cmp"
	"context"
	"database/sql"
	"slices"
	"strings"
	"time"
)

// The stores' side of Client.Locks and Client.ForceRelease (inspect.go).

// queryRows runs a statement that returns rows and calls row for each, switching to
// pgx.QueryExecModeExec behind a pooler as queryRow does. The retry is made only when
// no row was read yet: the server refuses a missing prepared statement at Parse or
// Bind, before any row.
func (p *pgxCalls) queryRows(ctx context.Context, q string, args []any, row func(scanner) error) error {
	sent, exec := p.args(args)
	read := 0
	err := p.eachRow(ctx, q, sent, func(r scanner) error { read++; return row(r) })
	if err != nil && read == 0 && p.retry(err, exec) {
		return p.eachRow(ctx, q, withExecMode(args), row)
	}
	return err
}

func (p *pgxCalls) eachRow(ctx context.Context, q string, args []any, row func(scanner) error) error {
	rows, err := p.db.Query(ctx, q, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	return scanEach(rows, row)
}

// sqlRows is queryRows for database/sql.
func sqlRows(ctx context.Context, db *sql.DB, q string, args []any, row func(scanner) error) error {
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	return scanEach(rows, row)
}

// scanEach calls row for each row of rows (pgx's or database/sql's), and returns the
// first error, row's or the rows'.
func scanEach(rows interface {
	scanner
	Next() bool
	Err() error
}, row func(scanner) error) error {
	for rows.Next() {
		if err := row(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

func (s *postgresStore) ListLocks(ctx context.Context, prefix string) ([]LockInfo, error) {
	out := []LockInfo{}
	err := s.queryRows(ctx, `SELECT key, coalesce(owner, ''), fencing_token, expires_at, held, wanted, read_at, acquired_at, ttl_ms FROM pglock.lock_list($1)`,
		[]any{prefix}, func(r scanner) error {
			var l LockInfo
			var readAt time.Time
			var acquiredAt sql.NullTime
			var ttlMS sql.NullInt64
			if err := r.Scan(&l.Key, &l.Owner, &l.Token, &l.ExpiresAt, &l.Held, &l.Waiting, &readAt, &acquiredAt, &ttlMS); err != nil {
				return err
			}
			l.AcquiredAt, l.TTL = acquiredAt.Time, time.Duration(ttlMS.Int64)*time.Millisecond
			l.Instance = instanceOf(l.Owner)
			l.ExpiresIn = expiresIn(l.ExpiresAt, readAt, l.Held)
			out = append(out, l)
			return nil
		})
	if err != nil {
		return nil, storeError(err, "list locks")
	}
	sortLocks(out)
	return out, nil
}

// expiresIn is how long a lease that ends at expires has left at now: never above
// zero for a lock nobody holds (a row released before 000005 kept its expiry).
func expiresIn(expires, now time.Time, held bool) time.Duration {
	in := expires.Sub(now)
	if !held {
		in = min(in, 0)
	}
	return in
}

// sortLocks reads each row key as a lock's key or a semaphore's key and permit, and
// sorts locks by key, byte by byte, then by permit.
func sortLocks(locks []LockInfo) {
	for i := range locks {
		locks[i].Key, locks[i].Permit = SplitPermitKey(locks[i].Key)
	}
	slices.SortFunc(locks, func(a, b LockInfo) int {
		return cmp.Or(strings.Compare(a.Key, b.Key), cmp.Compare(a.Permit, b.Permit))
	})
}

func (s *postgresStore) ForceRelease(ctx context.Context, key string) (LockInfo, error) {
	var owner sql.NullString
	var token, expiresInUS sql.NullInt64
	var expiresAt sql.NullTime
	var wanted sql.NullBool
	err := s.queryRow(ctx, `SELECT owner, fencing_token, expires_at, expires_in_us, wanted FROM pglock.lock_force_release($1)`, key).
		Scan(&owner, &token, &expiresAt, &expiresInUS, &wanted)
	if err != nil {
		return LockInfo{}, storeError(err, "force release %q", key)
	}
	if !owner.Valid {
		return LockInfo{}, nil
	}
	return LockInfo{
		Key: key, Owner: owner.String, Instance: instanceOf(owner.String), Token: token.Int64, Held: true,
		ExpiresAt: expiresAt.Time, ExpiresIn: time.Duration(expiresInUS.Int64) * time.Microsecond, Waiting: wanted.Bool,
	}, nil
}

func (s *memoryStore) ListLocks(_ context.Context, prefix string) ([]LockInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	out := []LockInfo{}
	for key, l := range s.locks {
		if strings.HasPrefix(key, prefix) {
			info := s.info(key, l, now)
			info.AcquiredAt, info.TTL = l.acquired, l.ttl // lock_list's alone, as with PostgreSQL
			out = append(out, info)
		}
	}
	sortLocks(out)
	return out, nil
}

func (s *memoryStore) ForceRelease(_ context.Context, key string) (LockInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.live(key, "")
	if l == nil {
		return LockInfo{}, nil
	}
	now := s.clock.Now()
	info := s.info(key, l, now)
	l.owner, l.expires = "", now // a release on the owner's behalf: the token stays the floor
	s.handOver(key)
	return info, nil
}

// info describes key's lock at now; s.mu is held.
func (s *memoryStore) info(key string, l *memoryLock, now time.Time) LockInfo {
	held := l.owner != "" && l.expires.After(now)
	return LockInfo{Key: key, Owner: l.owner, Instance: instanceOf(l.owner), Token: l.token, Held: held,
		ExpiresAt: l.expires, ExpiresIn: expiresIn(l.expires, now, held)}
}

// instanceOf returns the instance-name part of an owner id: up to its last "/" (an
// instance name may itself hold one, as the default "hostname/pid" does).
func instanceOf(owner string) string {
	if i := strings.LastIndexByte(owner, '/'); i >= 0 {
		return owner[:i]
	}
	return owner
}
