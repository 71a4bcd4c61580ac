// Package pglock makes a piece of work something one instance of an application holds:
// a lease on a key in PostgreSQL, renewed in the background while the holder is up,
// with a fencing token that grows with every acquisition of the key and a context that
// is cancelled the moment the lease is lost.
//
// On that lease it builds scheduled jobs that run on one instance and never overlap
// themselves (Client.Job, for gocron v2), locks you take yourself (Client.TryAcquire,
// Client.Acquire, Client.WithLock), semaphores that let up to N holders in at once,
// each permit a lock with a token of its own (Client.Semaphore), and leader election
// (Client.Elect).
//
// # Set-up
//
// Migrate creates the schema pglock (a few tables, sequences and SQL functions; SQL
// returns the same as one script). New returns a Client on a pgx pool. Every
// atomic decision (who holds a key, when it expires) is one statement in PostgreSQL,
// on the database's clock, so the instances' clocks never decide who holds a lock.
//
// # Options
//
// Each kind of call has its own option type, as gocron's SchedulerOption and JobOption
// or grpc's DialOption and CallOption do: New and NewWithStore take ClientOptions,
// Acquire and WithLock AcquireOptions, Client.Job JobOptions. TTL fits every call: it
// is an Option, which is all three, and the calls that take nothing else (TryAcquire,
// Elect, GocronElector, GocronLocker) take Options. So an option given to a call it
// does not fit (OnOneInstance to TryAcquire) does not compile. A value out of range, or a nil option, makes
// the call return an error wrapping ErrInvalidArgument that names the call and the
// option, and the call then does nothing.
//
// # What a lease promises
//
// Of any number of instances, at most one holds a live lease on a key, as the database
// counts time. The holder renews it every ttl/3, in one statement for all the locks a
// Client holds. A holder counts its own deadline: ttl from the moment it sent the last
// renewal the database confirmed (before the database started its ttl), less a tenth
// of ttl for timers and schedulers that run late. So a holder that is running gives up
// (its Lock.Context is cancelled with a *LockLostError) before the database expires
// the lease. When the database may have lost leases that a Client holds (its calls
// succeed again after failing, its listener reconnects, or it is granted a token of a
// later timeline: a standby was promoted), it confirms all of them at once rather than
// at their next renewal, so that a lease lost in a failover is found lost a round trip
// after the Client reaches the new primary (README: Running with a standby).
//
// # What it does not promise, and why fencing exists
//
// A lease cannot stop a holder that is not running: paused in a stop-the-world
// collection, swapped out, migrated, stopped with SIGSTOP. Its lease expires, another
// instance takes the key, and when the first one runs again it carries on with what it
// was doing, believing it still holds the lock, until its next renewal is refused.
// Nothing on the holder's side can close that window. Only the resource being written
// can: every acquisition gets a fencing token greater than every token the key had
// before (across releases, expiries, prunes, and a sequence that went back), and a write that
// carries its token can be refused when a newer holder has written. FenceUpdate and
// ExecFenced fence an UPDATE by a token column; FenceHeld fences any UPDATE or DELETE
// by the lock itself, which only works because the lock lives in the same database as
// the data. A semaphore's permit fences the same way (see Semaphore): FenceHeld with
// the semaphore's key and the permit's token, or FenceUpdate on rows of the permit's
// own (a slot column equal to Lock.Permit).
//
// # Stores
//
// A Client keeps its locks in a Store: New makes one on its pool, and NewWithStore takes
// one of NewPostgresStore (pgx: a pool, a connection, a transaction), NewSQLStore
// (database/sql) or NewMemoryStore (one process, for tests). There are no others, and
// Store cannot be implemented outside this package: every atomic check runs in
// PostgreSQL, on the database clock, in the SQL functions that Migrate installs, which
// a store written elsewhere could not stand in for, and most of a Client needs more of
// a store than Store's three methods (see Store).
//
// # Shutdown
//
// Close a Client at shutdown so that its leases are handed back at once instead of
// expiring after ttl: first stop the scheduler (gocron's Shutdown), then Client.Close,
// then close the pool. Close never hands a key back while code holding it may still
// run: it cancels every WithLock function, job run and leader with ErrClosed as the
// cause and waits for each to return first; when its ctx ends before they do, their
// keys are left to expire on the database clock instead.
package pglock
