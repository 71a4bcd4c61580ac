-- The locks: one row per key, kept after release so that every later acquisition
-- of the key takes the UPDATE path, whose token is drawn after the row lock.
CREATE SCHEMA IF NOT EXISTS pglock;

-- Tokens for every key. A sequence never goes back within one history of the
-- database; the row's own token is the floor for a sequence that did (restore, failover).
CREATE SEQUENCE IF NOT EXISTS pglock.fencing_token_seq;

-- fillfactor 50 leaves room on every page for HOT updates: renewals rewrite every
-- held row every ttl/3, and without the room the table and its index bloat.
CREATE TABLE IF NOT EXISTS pglock.locks (
    key           text        PRIMARY KEY,
    owner         text,       -- null once released
    fencing_token bigint      NOT NULL CHECK (fencing_token > 0),
    expires_at    timestamptz NOT NULL -- on the database clock
) WITH (fillfactor = 50);

-- lock_acquire takes key for owner for ttl_ms milliseconds and returns the new
-- fencing token, or null when a live holder has it. One statement: the NOT EXISTS
-- is a read-only check, so a losing call takes no row lock, no transaction id and
-- no WAL flush; the ON CONFLICT ... WHERE re-checks the row after locking it, so of
-- any number of concurrent callers exactly one wins.
CREATE OR REPLACE FUNCTION pglock.lock_acquire(key text, owner text, ttl_ms bigint) RETURNS bigint
LANGUAGE sql VOLATILE STRICT AS $$
    INSERT INTO pglock.locks AS l (key, owner, fencing_token, expires_at)
    SELECT lock_acquire.key, lock_acquire.owner, nextval('pglock.fencing_token_seq'),
           clock_timestamp() + lock_acquire.ttl_ms * interval '1 millisecond'
    WHERE lock_acquire.ttl_ms > 0
      AND NOT EXISTS (
        SELECT 1 FROM pglock.locks h
        WHERE h.key = lock_acquire.key AND h.owner IS NOT NULL AND h.expires_at > clock_timestamp())
    ON CONFLICT ON CONSTRAINT locks_pkey DO UPDATE
    SET owner = excluded.owner,
        fencing_token = greatest(nextval('pglock.fencing_token_seq'), l.fencing_token + 1),
        expires_at = excluded.expires_at
    WHERE l.owner IS NULL OR l.expires_at <= clock_timestamp()
    RETURNING l.fencing_token
$$;

-- lock_renew moves the expiry of key to ttl_ms from now if owner still holds it live.
-- Never an upsert: a renewal cannot re-create a lock that was lost.
CREATE OR REPLACE FUNCTION pglock.lock_renew(key text, owner text, ttl_ms bigint) RETURNS boolean
LANGUAGE sql VOLATILE STRICT AS $$
    WITH renewed AS (
        UPDATE pglock.locks l
        SET expires_at = clock_timestamp() + lock_renew.ttl_ms * interval '1 millisecond'
        WHERE l.key = lock_renew.key AND l.owner = lock_renew.owner
          AND l.expires_at > clock_timestamp() AND lock_renew.ttl_ms > 0
        RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM renewed)
$$;

-- lock_release clears the owner of key if owner still holds it live; the row stays.
CREATE OR REPLACE FUNCTION pglock.lock_release(key text, owner text) RETURNS boolean
LANGUAGE sql VOLATILE STRICT AS $$
    WITH released AS (
        UPDATE pglock.locks l
        SET owner = NULL
        WHERE l.key = lock_release.key AND l.owner = lock_release.owner
          AND l.expires_at > clock_timestamp()
        RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM released)
$$;

-- lock_renew_many renews, in one statement, every (keys[i], owners[i]) still held
-- live, and returns the keys it renewed.
CREATE OR REPLACE FUNCTION pglock.lock_renew_many(keys text[], owners text[], ttl_ms bigint) RETURNS SETOF text
LANGUAGE sql VOLATILE STRICT AS $$
    UPDATE pglock.locks l
    SET expires_at = clock_timestamp() + lock_renew_many.ttl_ms * interval '1 millisecond'
    FROM unnest(lock_renew_many.keys, lock_renew_many.owners) AS u(key, owner)
    WHERE l.key = u.key AND l.owner = u.owner
      AND l.expires_at > clock_timestamp() AND lock_renew_many.ttl_ms > 0
    RETURNING l.key
$$;
