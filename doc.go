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
// returns the same as one script, each function defined once). Many instances may
// migrate at once: one migrates, the others wait for it and find nothing to do; a step
// that has started runs to its end even when Migrate's ctx ends. New returns a Client
// on a pgx pool. Every
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
// option, and the call then does nothing. The option types are sealed: only this
// package makes options.
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
// the data. A semaphore's permit fences the same way (see # Semaphores).
//
// # Taking a lock
//
// TryAcquire makes one attempt. Acquire retries with exponential backoff and jitter,
// polling at least every quarter of its ttl so that a lock whose holder died is taken
// soon after it expires, until the key is free, until Wait(d) has passed on the
// client's clock (Wait(0) is one attempt) or until ctx ends; with a listener the key's
// release wakes it at once (see # Waking waiters). Once the store has answered an
// attempt, Acquire rides out an outage (a failover, for one) as the locks it holds do:
// an attempt that fails because the store cannot be reached, or its connection was
// lost, is made again (soon, then with the backoff, up to a second) for up to the
// lock's ttl from the first such failure in a row; then that failure is returned.
//
// A grant whose confirmation came back only after the lock's deadline (ttl less a tenth
// from the call's send), so late that the lock may already be someone else's, is
// handed back, and the call returns ErrNotAcquired. On a
// *pgxpool.Pool (New, NewPostgresStore) the store takes the call's connection itself:
// the lock's ttl counts from when the call had its connection, not from before a wait
// for a busy pool, and a call still waiting for a connection when its ctx ends is never
// sent.
//
// # Handing back a failed acquisition
//
// When an acquisition fails after it may have reached the server (its ctx ended with
// the statement in flight, the link broke), the client releases in the background
// what the server may have granted, rather than leave the key to an owner nobody knows
// for a whole ttl. A connection that could not be made reached no server: nothing is
// handed back; nor is anything for a call that was still waiting for a connection of a
// *pgxpool.Pool when its ctx ended, since it was never sent. The same holds for a
// permit of a semaphore.
//
// Hand-backs are bounded for the whole client: one goroutine makes one release call at
// a time; each failed acquisition is released up to 5 times over about 2.6 s while
// nothing is found; at most 1024 wait (past that, the key expires after its ttl); a
// failed release call pauses them all, doubling up to 2 s, so an unreachable database
// sees about one connection attempt every 2 s from them. Close gives each one last
// release, stops at the first failed call, and waits, bounded by its ctx. On a pool,
// hand-backs go as renewals do (see # Renewals and releases).
//
// # Renewals and releases
//
// A Client on a *pgxpool.Pool (New, or NewWithStore on NewPostgresStore of a pool) never
// has a renewal wait for the pool's connections behind the application (a burst of
// requests, a slow report), where every lock of the client would be lost at once: a
// renewal takes an idle connection of the pool if there is one, and otherwise goes
// through a pool of the client's own of two connections, made from a copy of the pool's
// configuration (its hooks, its tracer, PgBouncer or not) a sixth of the ttl after the
// client first holds a lock (half-way to its first renewal), or at once when a call
// finds the pool busy before then. Both connections are kept open, so that a renewal
// waits neither for the application nor for a connection to start, and Client.Close
// closes them. A call takes whichever connection comes first, the own pool's or one
// the application puts back. Releases and the hand-backs above go the same way; a
// lock is no longer renewed while its release waits. On a *pgx.Conn or a pgx.Tx,
// renewals, releases and hand-backs go through it. A renewal call is bounded, on the
// Client's Clock, by the earliest deadline of its locks, and each lock's context is
// cancelled at its own deadline whatever the call is doing, so a link that goes silent
// cannot make a holder learn late.
//
// Release runs on its ctx detached from its cancellation, with a timeout, so a
// cancelled ctx still releases. On PostgreSQL a release (and a waiter's mark of a held
// key as wanted) commits in a transaction of its own without waiting for the WAL flush
// (lock_release_async, lock_acquire_or_want; migration 000009): a crash right after it
// can bring the lock back, held by the same owner and token, until the expiry it had.
// Nobody else holds the key meanwhile and the next holder's token is still greater; the
// next holder just waits for that expiry. So write nothing fenced with a lock's token
// after its Release. Inside the caller's transaction (a pgx.Tx, or a *pgx.Conn on which
// one is open) the store uses statements that leave the caller's commit as durable as
// the caller set it (an acquisition makes it durable, whatever the caller set), and a
// lock taken there is rolled back with the transaction.
//
// # Waking waiters
//
// A Client of New opens one extra connection, from its pool's configuration, the first
// time one of its Acquire calls or elections has to wait, and LISTENs on it, so that a
// release of the key wakes the waiter at once rather than at its next retry (a leader's
// Close or Resign hands over within milliseconds, not ttl/3). WithoutListener spares
// that connection: waiters then poll. Behind PgBouncer in transaction mode, where
// LISTEN does not work, use WithoutListener, or WithListenerConnString to listen on
// PostgreSQL directly (on the pool's database, where the releases are notified);
// waiters get the key without either, by polling. A Client of NewWithStore polls,
// unless WithListenerConnString is given with a store of NewPostgresStore or
// NewSQLStore; the memory store has no NOTIFY. WithoutListener overrides
// WithListenerConnString.
//
// # PgBouncer, query modes and retries
//
// Every call of the PostgreSQL store is one statement calling one of the schema's
// functions. It works behind PgBouncer in transaction mode whatever the pool's
// DefaultQueryExecMode: the default mode's named prepared statements belong to one
// server connection, which PgBouncer hands to another client at the end of each
// transaction, so at the first statement that meets a missing or duplicate prepared
// statement, the store sends it again and from then on runs every statement with
// pgx.QueryExecModeExec (nothing kept on a connection), passed as the first argument
// of its calls: a Queryer that wraps pgx must pass its arguments on as they are.
// Straight to PostgreSQL, it keeps the pool's mode and its cost. For ExecFenced behind
// PgBouncer with a pool in pgx's default mode, pass pgx.QueryExecModeExec yourself.
//
// A statement that PostgreSQL rolls back with a serialization failure or a deadlock (a
// pool whose default_transaction_isolation is repeatable read or serializable) is sent
// again in a READ COMMITTED transaction, in one message with its BEGIN and COMMIT so
// that the server never waits on the client while the statement's row locks are held,
// up to four tries in all (internal/store/retry.go); Locks' listing, which may have read rows
// when it fails, returns the error.
//
// # Fenced writes
//
// FenceUpdate rewrites a single UPDATE so that it writes only rows whose token column
// holds a token <= the caller's, or NULL, and records the caller's token there. It
// appends `"column" = $n` to the SET list and `AND ("column" IS NULL OR "column" <= $n)`
// to the WHERE, wrapping the original condition in parentheses (or adds that condition
// as the WHERE when there is none), where $n follows the highest parameter of the
// query, and appends the token to args:
//
//	q, args, err := pglock.FenceUpdate("UPDATE products SET in_stock = $1 WHERE id = $2", "stock_fencing_token", token, count, id)
//	// q == `UPDATE products SET in_stock = $1, "stock_fencing_token" = $3 WHERE (id = $2) AND ("stock_fencing_token" IS NULL OR "stock_fencing_token" <= $3)`
//	// args == []any{count, id, token}
//
// Equal tokens pass, so a holder may write many times; a stale holder's write updates
// no row. Declare the column bigint NOT NULL DEFAULT 0. A nullable column works too:
// NULL stands for a row no fenced write has touched, which any token may write, as it
// may a 0; the write leaves its token there, and from then on the row is fenced like
// any other. In the WHERE the column is not qualified, so it must be unambiguous: with
// a FROM clause, no FROM table may have a column of that name (PostgreSQL then refuses
// the statement). WITH queries, ONLY, aliases, FROM, RETURNING and one trailing
// semicolon are kept. ExecFenced runs the rewritten query; it wrote 0 rows when none
// matched or a newer token holds every row it matched: the caller's lock was taken
// over.
//
// FenceHeld appends AND pglock.lock_held($n, $m) to an UPDATE's or DELETE's WHERE
// (adding WHERE when none), with the key and the token as the new last two args; the
// original condition is wrapped in parentheses, $n follows the highest parameter of
// the query, and WITH queries, ONLY, aliases, FROM or USING, RETURNING and one trailing
// semicolon are kept. pglock.lock_held comes with the 000002_lock_held migration, and
// the written rows must be in the database that holds pglock.locks. The guarantee, on
// the database clock: a write whose statement runs after the lock was taken over,
// released or expired updates nothing (0 rows), because lock_held is false for it; a
// write that commits before the takeover is the old holder's legitimate write.
// lock_held row-locks the lock's row until the write's transaction ends, so while that
// transaction is open no takeover can happen: an acquisition that meets the locked row
// fails at once (Acquire retries), even after the lease expired, and Client.ForceRelease
// waits for it. No new token exists before the write is settled. The row lock is FOR
// KEY SHARE at every isolation level: the holder's renewals (and its release) go on
// while the transaction is open, so a slow transaction costs no lock its lease. Under
// READ COMMITTED lock_held reads the latest committed row at each statement. Under
// REPEATABLE READ or SERIALIZABLE the transaction's snapshot could not see a takeover,
// so a row changed after the snapshot makes the write fail with a serialization error
// (SQLSTATE 40001) instead of writing (migration 000011).
//
// Under pgx's simple protocol (pgx v5.12 and later, which this module requires) pgx
// substitutes the arguments into the text itself; it skips literals and dollar-quoted
// strings (which may hold $n) as PostgreSQL does, but would also substitute a $n that
// ends an unquoted identifier (x$1), which PostgreSQL reads as part of the name: quote
// such an identifier, or use another mode. ExecFenced, under that protocol (the mode
// given as the first of args, or the db's DefaultQueryExecMode when none is), refuses
// with ErrUnsafeQuery any query with $ and a digit right after a letter, digit or
// underscore anywhere in its text, quoted or not, to keep the check simple. The lexer
// that splits queries assumes what pgx requires of a connection anyway:
// client_encoding UTF8 and standard_conforming_strings on.
//
// # Semaphores
//
// A semaphore lets up to N holders in at once, across every instance that asks for the
// same number, each holding one permit, numbered 1 to N. A permit, once taken, is a
// *Lock like any other: renewed in the background until Release or Close, its Context
// cancelled when it is lost, its Token a fencing token that grows with each acquisition
// of the permit; Lock.Key is the semaphore's key and Lock.Permit the permit's number.
// TryAcquire takes the lowest free permit. A Semaphore holds no state of its own (the
// store does), and Client.Semaphore makes no call: make them at will. With a listener,
// the release of any permit wakes one of the client's waiters for the semaphore at
// once.
//
// In the store a permit's row key is the semaphore's key, U+001F and the permit's
// number (migration 000013): so a semaphore's key has at most MaxKeyLength-5
// characters, and no key may contain U+001F. A semaphore's key and a lock's key are
// apart: a lock of the same key is another thing. What a permit costs beside a lock is
// in BENCHMARKS.md (A permit beside a lock).
//
// Fencing a write with a permit's token: FenceHeld(query, l.Key(), l.Token()) works
// for a permit as for a lock: the write happens only while that permit is held live,
// on the database clock. FenceUpdate fences by token per row: several permits are held
// at once, so give each permit rows of its own, for instance a slot column equal to
// l.Permit() in the WHERE, and a paused holder's late write to its slot is refused once
// the permit has a newer holder.
//
// Changing the number of permits: each acquisition says how many permits the semaphore
// has: the number of its Semaphore. A smaller number grants no permit above it, and no
// permit at all while the semaphore has that many live holders or more; holders of
// permits above it keep them until they release. Never more live holders than permits
// when every instance asks for the same number.
//
// # Fair queue
//
// With Fair, Acquire and WithLock wait in the key's queue, kept by the database
// (migration 000014) and shared by every client of it: the waiter that arrived first,
// on any instance, is served first, and a release hands the key straight to it in the
// same statement (a grant), which the waiter claims at its next poll: one acquisition
// statement per handover, not a race. Semaphore.Acquire and WithPermit with Fair wait
// in the semaphore's queue (apart from the queue of a lock of the same key): a
// permit's release hands that permit to the head of the queue when the head's number
// of permits allows it (fewer live holders than it, and the permit's number within
// it); a waiter whose turn came without a release (a holder expired, the number grew)
// takes the lowest free permit at its next poll, when fewer live waiters are ahead of
// it than it has free permits.
//
// The bound: a fair waiter that dies, is paused or gives up without leaving stalls the
// queue for at most about Q + Q/4, Q = 1 s on the database clock: it is skipped once Q
// has passed since its last poll (a live waiter polls at least every Q/4), and a key
// granted to it that it does not claim within Q goes to the next live waiter at that
// waiter's next poll. A waiter paused longer than Q keeps its place and is served when
// it polls again (not polled for a minute, it queues again at the back). A waiter whose
// ctx ends, whose Wait passes or whose Client closes leaves the queue, passing on a
// grant it had. A waiter whose claim's reply was lost finds its ticket gone at its next
// poll and queues again under the same owner: it gets the key its claim took, with that
// claim's token (migration 000027). One that dies after its poll claimed the key holds
// it as any holder does: until its ttl passes.
//
// While a live fair waiter is queued on a key (a semaphore), the key is the queue's:
// TryAcquire, and Acquire without Fair, fail even when the key (a permit) is free at
// that moment (a grant not claimed yet, a holder that just expired), since an attempt
// from outside the queue that could take a free key would starve the waiters queued
// for it. Fair waiters need the listener (New's default) to be woken when the key is
// theirs; without one, they find out at their next poll, Q/4 later at most. A Store
// that embeds another has no queue, nor does a PostgreSQL store inside a transaction
// of the caller's (a pgx.Tx, or a connection with one open), whose wait would hold the
// key's row locked.
//
// What it costs: a row per waiter and a poll (an unflushed write) every Q/4 per
// waiter, and, for the waiter served, one round trip more than a plain acquisition
// (the claim). While a client's listener starts (its first second or so after New), no
// grant can wake its waiters: the one served finds out at its next poll, every few
// milliseconds for the few next in line, so the slowest handovers of a crowd that
// starts with its clients are about twice a plain crowd's, where its median, and its
// p99 once listening, are better (BENCHMARKS.md, Semaphores and the fair queue). So it
// is a choice, not the default: jobs and elections never wait, and callers that do
// not ask for it keep the plain behaviour.
//
// # Jobs
//
// Client.Job runs a function at each tick of a schedule through locks. Its key is
// required, so that a rename of the function does not change it during a rolling
// deploy, and it names the job's locks; it is checked as a lock's key, with its lease
// key "<key>:owner", so it has at most MaxKeyLength-6 characters:
//
//   - OnOneInstance: the first instance whose tick comes takes the job's lease, the lock
//     "<key>:owner", and keeps it, renewed, between ticks for as long as its Client is
//     up; it runs every tick, and the other instances skip each tick
//     (SkipOtherInstance). When the owner dies, its lease expires after the ttl, on
//     the database clock, and the first tick after that, on any instance, takes the job
//     over; when it closes its Client, it hands the lease back at once. Missed ticks are
//     not caught up.
//   - WithoutOverlapping: a run holds the run lock "<key>", renewed, from its start to
//     its end, and a tick that finds it held is skipped (SkipRunInProgress), on this
//     instance or any other. Without OnOneInstance it means "any instance, one run at a
//     time".
//   - AtMost(n): a run holds a permit of the semaphore of the job's key with n permits,
//     renewed, from its start to its end, and a tick that finds all n permits held is
//     skipped (SkipLimitReached), on this instance or any other. It goes alone: with
//     WithoutOverlapping it would ask for two run limits at once (AtMost(1) is "one run
//     at a time"), and with OnOneInstance for runs on one instance only, where a limit
//     across the fleet means nothing. Give each permit rows of its own to fence
//     (Lock.Permit).
//
// The lease vouches that no two instances run the same tick, so a tick it cannot vouch
// for is skipped (SkipLeaseInDoubt): on the owner, when its renewal is overdue (the
// store's expiry is less than half a ttl away); on another instance, when its take is
// answered more than a third of the ttl after the tick began (an owner paused past its
// lease may have run that tick). Ticks of the same time that fire more than a sixth of
// the ttl apart on two instances can both run: keep the ttl well above the clocks'
// skew and the scheduler's jitter. The same lease, and the same rules, are those of
// GocronLocker and GocronElector.
//
// A job's key, its lease key and an election's or a gocron elector's key are registered
// with the client: a second job with the same key, a job whose key is another job's
// lease key, or one that is an elector's or an election's key is refused, the error
// naming both. Register the job with gocron in singleton mode (GocronOptions), so that
// gocron itself refuses an overlap inside one process before pglock makes any store
// call, and name it after the job's key, so that the job has one name everywhere:
// gocron's, the run history's, the events' and the metrics':
//
//	job, err := client.Job("inventory:stock-reconciliation", reconcile, pglock.OnOneInstance(), pglock.WithoutOverlapping())
//	...
//	_, err = scheduler.NewJob(gocron.CronJob("*/5 * * * *", false), job.Task(), pglock.GocronOptions(job.Key())...)
//
// Job.Run runs one tick. A skipped tick (another instance owns the job, a run is in
// progress, or AtMost's limit is reached) is logged at debug, emitted as an
// EventJobSkipped and counted in the run history; a run is emitted as an EventJobRan (its Duration and Outcome set) and
// recorded in the run history, a panicking function's too (OutcomePanicked) before the
// panic goes on up.
//
// At Close, Run returns ErrClosed from Close's start (so an admin path calling Run can
// tell a shutdown from a skip); the runs in progress are
// cancelled (their ctx's cause is ErrClosed) and waited for, bounded by Close's ctx;
// then the lease is handed back, so that the next tick on another instance runs at
// once rather than after the ttl, or, when Close's ctx ends first, left to expire. A
// lease whose last run started less than a second before, on the client's clock, is
// kept for the rest of that second, so that instances firing the same tick a few
// milliseconds later skip it rather than run it again.
//
// # gocron adapters
//
// GocronLocker's locks are sticky leases rather than per-run locks. gocron takes a lock
// per run, named after the job; a per-run lock released at the end of a fast run lets
// an instance whose tick comes a few milliseconds later run the same tick again (gocron
// issue #841). Here, Lock for job name takes the lease "<name>:owner" (OnOneInstance's
// lease of a job keyed name) at the first tick that finds it free and keeps it,
// renewed, between ticks for as long as the client is up; on the other instances, and
// for a tick the lease cannot vouch for, Lock fails and gocron skips the run (logged
// at debug, emitted as an EventJobSkipped). Unlock keeps the lease: it needs no store
// call, so it works with the cancelled ctx gocron passes at its shutdown; it emits an
// EventJobRan and records the run in the run history, as OutcomeOK or OutcomeLost,
// since gocron does not tell a locker how its task ended, and returns a *LockLostError
// when the lease was lost during the run, else nil. Each job name is checked and
// registered as a Job's key at its first Lock (an error matching ErrInvalidKey or
// ErrInvalidArgument then). At Close, runs between Lock and Unlock
// finish (bounded by Close's ctx) and the leases are handed back, each kept for the
// rest of the second after its last run started.
//
// GocronElector's leader holds a sticky lease on its key, taken by the first IsLeader
// that finds it free and then kept, renewed, for as long as the client is up, exactly
// as OnOneInstance's lease: the other instances' schedulers skip every job (logged at
// debug with key, emitted as an EventJobSkipped); when the leader dies, the first
// IsLeader after the ttl takes over. gocron asks IsLeader before each run but does not
// tell an elector when a run ends, and its Shutdown gives up after its stop timeout
// (10 s by default) with runs still going. So at Close the lease is handed back only
// when every run it let start was a task of the elector's Task, which Close cancels
// (ErrClosed) and waits for, bounded by its ctx, and then only a second after the last
// IsLeader that let a job run. After a run of any other task, the lease is not handed
// back: it is no longer renewed, and another instance leads once it expires, a ttl
// later, so that two instances never run the scheduler's jobs side by side while the
// old runs can still go on (a run that outlasts even the ttl can: use Task). Only a
// Task's run has a fencing token, its lease's; a plain task has none to fence its
// writes with.
//
// # Leader election
//
// Client.Elect makes the instance campaign for a key every ttl/3 on the client's clock,
// and at once when the key is released (with a listener). The instance that takes the
// lease leads: it renews the lease through the client's renewer and runs
// LeaderCallbacks.OnAcquired. It stops leading when the lease is lost, at Resign, at
// Close (which hands the lease back, so another instance leads within milliseconds with
// a listener, within ttl/3 without), or when OnAcquired fails; OnLost then runs. After a
// failed OnAcquired the instance campaigns again after ttl/3. A crashed leader is
// replaced within the ttl. A campaign that fails because the store cannot be reached, or
// its connection was lost (an outage, a failover), is made again sooner: after 5 ms,
// doubling up to ttl/3. Leading and stepping down are logged at info ("pglock: leading",
// "pglock: stepped down") and emitted as EventLeadershipAcquired and
// EventLeadershipLost.
//
// OnAcquired may return nil at once, leaving work running on its ctx, or run until ctx
// ends: either way the instance leads until the lease is lost or it steps down. It must
// return once its ctx ends: OnLost, the lease's release and Close wait for it. Returning
// an error, or panicking, steps down: the lease is handed back.
//
// A paused leader cannot know that its lease expired meanwhile, and a leader whose
// lease was broken (Client.ForceRelease) learns it at its next renewal: until that is
// refused, or its deadline passes on the client's clock, Election.IsLeader stays true
// while another instance may lead, and Election.Leader, which reads the store, may name
// the other instance. That is why a leader's writes carry its lease's fencing token.
//
// # Events and logs
//
// Handlers given with WithEventHandler are called with every Event, in order, on one
// goroutine of the client's own: a slow handler delays later events, never renewals or
// callers. Every handler gets every event, in the order the options were given (a
// metrics handler beside a log or a test's own, for one). Up to 4096 events wait while
// the handlers are slow; beyond that, new events are dropped rather than held without
// bound (a handler that blocks forever costs no more memory than that): each is
// counted in Health.EventsDropped, and the drops are logged at warn, at most every 10
// s. Close waits for the queue to drain (bounded by its ctx); an event that comes after
// Close has returned (a leader that Close gave up waiting for steps down later) is
// dropped. A panic in a handler is recovered and logged.
//
// The client logs routine acquisitions, renewals, releases and skipped ticks at debug,
// a job or a leadership changing hands at info, and a lost lock at warn, with the
// attribute keys key, owner, token, ttl, reason and err.
//
// # Run history and registrations
//
// With RunHistory on (7 days when not set) and a store of New, NewPostgresStore,
// NewSQLStore or NewMemoryStore, the client records every run of its Jobs and of its
// GocronLockers' jobs (job, instance, owner, token, start and end on the store's clock,
// outcome, error text), and counts the ticks they skip per job, instance and reason.
// Writes happen in the background, one statement per run after the run, and skip
// counts at most once a second, so a run never waits for them; a failed write is
// logged at warn and never fails a run. Close waits for what is pending (bounded by
// its ctx). The store deletes a job's runs older than the retention now and then as it
// records them. Client.JobRuns and Client.JobStatuses read the history whatever
// RunHistory says.
//
// A client registers its jobs and elections in the store (Client.Job, Client.Elect, a
// GocronLocker's first Lock of a job, GocronElector), so that they are listed before
// their first run: one statement at registration, then a refresh every 5 minutes while
// the client is open, never on a caller's path. Close (or Resign, for an election)
// marks them closed; a registration neither closed nor refreshed for 6 minutes is
// RegistrationGone, and the store forgets those not seen for 7 days.
//
// # Listing, forcing a release and pruning
//
// Client.Locks reads every lock under its prefix in one statement, on one reading of
// the store's clock. It reads only and takes no row lock, so it waits for nobody and
// nobody waits for it; but each call reads every row under the prefix (with the
// PostgreSQL store, it scans the table), so poll it every second or so, not in a tight
// loop. A key's row stays after its release, with an empty Owner, and after its
// expiry, with Held false, until Prune deletes it. A store error says to run Migrate
// when the schema is missing or older than this library, and what to grant when the
// role may not call pglock's functions. LockInfo.AcquiredAt and LockInfo.TTL are zero
// for a row last acquired before migration 000015; with PostgreSQL, TTL is the new
// expiry less the clock a trigger read just after the acquisition, so a few
// milliseconds short. LockInfo.Waiting is the row's wanted_at mark, which stays until
// the next release, so it may outlive a waiter that gave up.
//
// Client.ForceRelease is the operator's tool for a holder that is stuck: a healthy
// holder is better stopped, or left to Release. It returns the lease it broke (Held
// true, with the holder's Owner and Token and the ExpiresAt it had), or the zero
// LockInfo and ErrNotHeld. What follows a break, on the store's
// clock: the key is free at once, so the next acquisition (a waiter is woken as by a
// release) gets a token greater than the broken one; the holder's next renewal is
// refused, at which the holder's lock is lost (LostRefused) and the ctx of the code
// under it is cancelled, within ttl/3 of the break; a FenceHeld write that runs after
// the break writes nothing, at once, and a FenceUpdate write with the broken token
// writes nothing once the new holder wrote its greater token. Until its next renewal
// the holder still believes it holds the key: only a fence stops a write it makes in
// between. With the PostgreSQL store the break row-locks the key's row first, so it
// waits for an acquisition, renewal or release in flight and for an open fenced
// transaction (FenceHeld) of the holder: such a transaction commits before the break,
// as the old holder's legitimate write, or it runs after it and writes nothing. The
// break is logged at warn (key, owner, token).
//
// A key's row is kept after its release so that its next acquisition finds it; without
// Client.Prune, every key ever used stays in the table. Prune deletes locks, permits
// among them, whose lease ended more than its olderThan ago, and, whatever olderThan,
// what fair waiters whose clients died leave in the queues (not polled for a minute:
// such a waiter that comes back queues again) and the row of each semaphore that no
// permit has a row of any more (the next acquisition of a permit makes it again);
// those are not counted. It never touches a live lock, nor the row of a lock that an
// acquisition, a renewal, a release or an open fenced transaction has row-locked: it
// skips it, without waiting. The token rule holds across it: a pruned key acquired
// again gets a token greater than every token it had. Calls on many instances take
// turns, and one that finds another running returns at once with what it deleted. The
// one cost to others: an acquisition of a long-dead key whose row a prune has locked at
// that moment loses that attempt (TryAcquire returns ErrNotAcquired; Acquire
// retries). Prune deletes in batches of 1000 rows, each one statement, until a batch
// deletes fewer or another instance's prune is running. Each call scans the table
// (expires_at has no index, so that renewals stay HOT updates): run it every few
// minutes, from a job for instance:
//
//	prune, err := client.Job("pglock:prune", func(ctx context.Context) error {
//		_, err := client.Prune(ctx, time.Hour)
//		return err
//	}, pglock.OnOneInstance())
//	...
//	_, err = scheduler.NewJob(gocron.DurationJob(5*time.Minute), prune.Task(), pglock.GocronOptions(prune.Key())...)
//
// # Health
//
// Client.Health reports readiness from what the client knows: it makes no store call,
// and its cost does not grow with the locks held, so it is cheap enough for every
// probe. Health.Ready is false while the last store call of the client failed (none
// has succeeded since), while a call has waited for an answer for half the client's
// ttl (or half its lock's ttl, when shorter) and the store answered no other call
// meanwhile, while a held lock's renewal is overdue (none confirmed for half its ttl,
// when one is due every third), and after Close. A lock is given up only at nine
// tenths of its ttl without a confirmed renewal, so a holder is unready before any
// lock is lost. It is true again once a store call succeeds and no renewal is overdue.
// An answer is a success, whatever it says: a key held by another owner, a renewal
// refused. A failure is an error from the driver or the server; bad input, and a call
// whose context the caller ended (before it waited as above), are neither. While the
// last call failed, the client makes a call of its own once a second (a renewal of a
// key nobody holds, which writes nothing), so that it turns ready again when the store
// answers even if nothing else calls it.
//
// In Kubernetes, a readiness probe should answer from Ready (503 when false): "do not
// send me work that needs a lock now". A liveness probe should not use Health at all:
// a database outage is not cured by restarting every instance (each restart opens new
// connections against a server that is trying to come back, and a lock held by the
// restarted process is left to expire); let liveness check only that the process
// itself still serves. Show the probe's caller no more than Ready (and, say,
// FailedCall and FailedAt): Err wraps the driver's error, which may name the
// database's user, host and database; log it instead.
//
// # Slots
//
// A job with a schedule (Cron, Every) names each scheduled time a slot, and runs each
// slot once. A tick claims the slot it stands for in one statement (a row of
// pglock.job_slots, unique per job and slot): of any number of ticks that name it, on
// any instances, one claims it and runs it; the others skip it (SkipSlotClaimed). The
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
// (SkipSlotMissed), or CatchUp(n) runs the latest n of them first. With CatchUp,
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
// (database/sql) or NewMemoryStore (one process, for tests). There are no others: a
// Store is opaque, so that every Client has every feature of its store. Every atomic
// check of pglock runs in PostgreSQL, on the database clock, in the SQL functions that
// Migrate installs (lock_acquire, lock_renew_many, lock_held for fenced writes, the
// NOTIFY of a release, the job history, lock_prune); a store written elsewhere could
// give neither those guarantees nor what fencing tokens and the history mean. The
// memory store is there for tests: NewWithStore on NewMemoryStore runs a Client in one
// process, on a clock the test moves; every feature works on it but the listener, which
// needs PostgreSQL's NOTIFY, and a job's slots.
//
// # Shutdown
//
// Close a Client at shutdown so that its leases are handed back at once instead of
// expiring after ttl: first stop the scheduler (gocron's Shutdown: no more ticks,
// running ones finish), then Client.Close, then close the pool. Close never hands a key
// back while code holding it may still run: it refuses new acquisitions, runs and
// campaigns, cancels every WithLock function, job run and leader's OnAcquired with
// ErrClosed as the cause and waits for each to return first, and only then hands their
// locks back; when its ctx ends before they do, their keys are left to expire on the
// database clock instead. Locks the caller took with TryAcquire or Acquire and still
// holds have their Context cancelled with ErrClosed and are released. Before that, the
// hand-backs of failed acquisitions still pending are made once more and stopped. Then
// Close marks the client's job and election registrations closed, stops its renewer
// and delivers the events still queued. Its store calls run on a context detached from
// ctx's cancellation, with a timeout.
package pglock
