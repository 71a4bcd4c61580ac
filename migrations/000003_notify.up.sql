-- Fast handover: a release wakes the clients waiting for its key through
-- NOTIFY pglock_released, '<key>'. PostgreSQL serializes the commits of transactions
-- that NOTIFY, so a release notifies only when a waiter marked the row (wanted_at):
-- an uncontended release pays nothing.
ALTER TABLE pglock.locks ADD COLUMN IF NOT EXISTS wanted_at timestamptz;

-- lock_want marks key as wanted by a waiter that listens on pglock_released, and
-- reports whether the key is held live and marked, so that its release will notify.
-- false means the key is free (or changed hands unmarked): try to acquire it again
-- now. Two statements, each on a fresh snapshot (VOLATILE): the UPDATE marks the
-- latest row version if it is held and unmarked, and writes nothing when it is
-- already marked; the SELECT then sees any release that committed in between.
CREATE OR REPLACE FUNCTION pglock.lock_want(key text) RETURNS boolean
LANGUAGE sql VOLATILE STRICT AS $$
    UPDATE pglock.locks l
    SET wanted_at = clock_timestamp()
    WHERE l.key = lock_want.key AND l.owner IS NOT NULL
      AND l.expires_at > clock_timestamp() AND l.wanted_at IS NULL;
    SELECT EXISTS (
        SELECT 1 FROM pglock.locks l
        WHERE l.key = lock_want.key AND l.owner IS NOT NULL
          AND l.expires_at > clock_timestamp() AND l.wanted_at IS NOT NULL)
$$;

-- lock_release clears the owner of key if owner still holds it live; the row stays.
-- A marked row is unmarked and notified. The NOTIFY is in the SET, not after the
-- UPDATE: only there does l.wanted_at read the row version the UPDATE locked (a mark
-- committed since the statement's snapshot included), and RETURNING would read the
-- cleared value. Should a concurrent change make PostgreSQL evaluate the SET twice,
-- the identical notifications of one transaction are delivered once.
CREATE OR REPLACE FUNCTION pglock.lock_release(key text, owner text) RETURNS boolean
LANGUAGE sql VOLATILE STRICT AS $$
    WITH released AS (
        UPDATE pglock.locks l
        SET owner = NULL,
            wanted_at = CASE WHEN l.wanted_at IS NOT NULL THEN
                (SELECT NULL::timestamptz FROM pg_notify('pglock_released', l.key)) END
        WHERE l.key = lock_release.key AND l.owner = lock_release.owner
          AND l.expires_at > clock_timestamp()
        RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM released)
$$;

-- lock_holder returns the live holder of key, its fencing token and the microseconds
-- until its lease expires on the database clock; a row of nulls when none.
CREATE OR REPLACE FUNCTION pglock.lock_holder(key text, OUT owner text, OUT fencing_token bigint, OUT expires_in_us bigint)
LANGUAGE sql VOLATILE STRICT AS $$
    SELECT l.owner, l.fencing_token, (extract(epoch FROM l.expires_at - clock_timestamp()) * 1000000)::bigint
    FROM pglock.locks l
    WHERE l.key = lock_holder.key AND l.owner IS NOT NULL AND l.expires_at > clock_timestamp()
$$;
