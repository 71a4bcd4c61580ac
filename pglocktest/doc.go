// Package pglocktest helps test code that uses pglock.
//
// # A database per test
//
// Postgres returns a pool on a database of the test's own with the pglock schema and
// no rows, closed when the test ends; PostgresURL returns the database's URL instead,
// for code that opens its own connections, and Pool opens another pool on it, for a
// second instance of an application. No two tests use a database at once, so they may
// run in parallel. A database is first copied from a template that is migrated once
// per server and schema version (CREATE DATABASE … TEMPLATE), so a test costs a copy,
// not a migration. When its test ends, a database with no session left on it and the
// catalog its copy had (no table, column, function, grant or setting of the test's) is
// emptied (its tables truncated, its sequences restarted, its statistics reset) and
// given to the process's next test: a copy costs the server about half a second, the
// emptying tens of milliseconds. Any other database is dropped in the background (a
// DROP DATABASE waits for a checkpoint, which the test need not wait for); the last
// test of the process using the server drops the kept ones and waits for the drops.
//
// The server is the one in PGLOCK_TEST_DATABASE_URL (DatabaseURLEnv) when it is set,
// else the one the libpq defaults reach (PGHOST, PGPORT, PGUSER, the local socket) if
// it answers, else an embedded PostgreSQL that the tests of the process share, stopped
// when the last test using it ends (its binaries are downloaded once; offline, point
// PGLOCK_POSTGRES_BINARIES at local ones). With no server at all the tests that
// need one are skipped, saying why, except when the CI environment variable is set:
// then they fail, so that a CI job cannot pass without having run them. A program
// (not a test) finds a server for local development the same way with pglockdev.
//
// # Time
//
// A pglock.Client on a ManualClock renews, waits and counts its locks' deadlines only
// when the test calls Advance. Such a client behaves like a paused process (a long
// garbage collection, SIGSTOP): it does not renew, and the database expires its locks
// after their ttl, in real time, on its own clock. That is how a test shows that a
// write from a holder that lost its lock is refused by its fencing token.
//
// # Without a database
//
// A test that needs no PostgreSQL gives its client pglock.NewMemoryStore on a
// ManualClock: pglock.NewWithStore(pglock.NewMemoryStore(clock), pglock.WithClock(clock)).
// pglock.Store is opaque (its doc says why), so this package has no contract suite for
// stores: pglock runs its own on the stores it has.
package pglocktest
