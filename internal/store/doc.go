// Package store is pglock's storage layer: the Store interface that a pglock.Client
// calls, its PostgreSQL stores (pgx and database/sql, with the retries of rolled-back
// statements and the renewals' own pool), its memory store, and Observe, which records
// every call's outcome for Health. Package storetest is its contract suite.
//
// Nothing here is pglock's API: package pglock wraps a Store in its opaque pglock.Store,
// so that no store but these is ever given to a Client.
package store
