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
// # Slots
//
// A job with a schedule (Cron, Every) names each scheduled time a slot, and runs each
// slot once. A tick claims the slot it stands for in one statement (a row of
// pglock.job_slots, unique per job and slot): of any number of ticks that name it, on
// any instances, one claims it and runs it; the others skip it (ReasonSlotClaimed). The
// slot a tick stands for is read on the database's clock: the schedule's last slot at
// or before the database's now plus an early tolerance of half the gap to the next
// slot, a second at most. So the instances' timers may fire any time from that
// tolerance before the slot to the next slot after it, and an owner paused past its
// lease finds, when it resumes, the slot it meant to run already claimed. What timing
// can still do: a tick that comes more than the tolerance early names the slot before
// (already claimed: it skips), one that comes after the next slot names that one.
//
// Each claim, and each new attempt of a slot, takes the slot's lock, the key
// "<job>:slot:<the slot in ms since the epoch>", with a token drawn as every token is:
// renewed while the run goes on, FromContext's Lock inside the run, the fence of its
// writes (FenceHeld with its key, FenceUpdate with its token). The run's end records its
// outcome and releases that lock in one statement.
//
// Slots that no tick claimed (every instance was down, or an OnOneInstance owner died
// and its lease had not yet expired) are found by the next claim: they count as missed
// (ReasonSlotMissed), or CatchUp(n) runs the latest n of them first. With CatchUp,
// Job.Schedule also runs a tick when the scheduler starts, so that a slot missed while
// the whole fleet was down runs when the first instance comes back. Deadline makes a
// slot not started in time count as missed instead.
//
// At most once is the default: a claimed slot never runs again, whatever becomes of its
// run (a run whose holder died stays claimed; its lock expires). AtLeastOnce(n, b)
// runs again a slot whose attempt did not succeed: an error, a panic, a lock lost, or a
// holder that died (its slot's lock expired); up to n attempts, after b·2^(k-1), each
// with a greater token so that a dead attempt's late fenced write is refused. An
// instance that finds a slot claimed looks at it again when its attempt's lock would
// expire, one statement per look, while it runs. A crash right after a successful end
// may lose the end's record (it is not flushed, as a release is not): the slot then
// runs again.
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
