-- A plain lock's acquisition names no table but pglock.locks. 000029 probed
-- pglock.waiters only for a key whose row is queued, but in the statement that takes
-- every free key: each execution of that statement opened and locked pglock.waiters
-- and its indexes, and started the probe's plan, whether or not it ran. Now the read
-- that comes first also reads queued, and a key it found not queued is taken by a
-- statement without the probe; that statement still checks NOT queued on the row it
-- locks, so a waiter that queued between the read and the statement wins (the call
-- returns NULL, as when the key was taken meanwhile). A queued key is taken, as
-- before, only when no live waiter is left.
CREATE OR REPLACE FUNCTION pglock.lock_acquire(key text, owner text, ttl_ms bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    token bigint;
    free boolean;
    queued boolean;
BEGIN
    IF NOT (pglock.lock_key_ok(lock_acquire.key) AND pglock.lock_owner_ok(lock_acquire.owner)
            AND pglock.lock_ttl_ok(lock_acquire.ttl_ms)) THEN
        IF NOT pglock.lock_key_ok(lock_acquire.key) THEN
            PERFORM pglock.lock_refuse('lock_acquire', 'key', 'a lock''s key: 1 to 500 characters without U+001F', lock_acquire.key);
        ELSIF NOT pglock.lock_owner_ok(lock_acquire.owner) THEN
            PERFORM pglock.lock_refuse('lock_acquire', 'owner', '1 to 255 characters', lock_acquire.owner);
        END IF;
        PERFORM pglock.lock_refuse('lock_acquire', 'ttl_ms', '1 to 31536000000 (365 days)', lock_acquire.ttl_ms::text);
    END IF;
    -- A read first, which locks nothing: a held key is refused with no more.
    SELECT l.owner IS NULL OR l.expires_at <= clock_timestamp(), l.queued INTO free, queued
    FROM pglock.locks l WHERE l.key = lock_acquire.key;
    IF NOT FOUND THEN
        IF EXISTS (SELECT FROM pglock.waiters w -- a new key's waiters, queued while it was created
                   WHERE w.key = lock_acquire.key AND w.granted IS NULL
                     AND w.seen_at > clock_timestamp() - interval '1 second') THEN
            RETURN NULL;
        END IF;
        RETURN pglock.lock_take(lock_acquire.key, lock_acquire.owner, lock_acquire.ttl_ms);
    ELSIF NOT free THEN
        RETURN NULL;
    END IF;
    IF NOT queued THEN
        -- The plain path: the statement names no table but the key's.
        UPDATE pglock.locks l
        SET owner = lock_acquire.owner,
            fencing_token = greatest(nextval('pglock.fencing_token_seq'), l.fencing_token + 1),
            expires_at = clock_timestamp() + lock_acquire.ttl_ms * interval '1 millisecond',
            acquired_at = clock_timestamp(),
            ttl_ms = lock_acquire.ttl_ms
        WHERE l.key = (SELECT f.key FROM pglock.locks f
                       WHERE f.key = lock_acquire.key AND (f.owner IS NULL OR f.expires_at <= clock_timestamp())
                         AND NOT f.queued
                       FOR UPDATE SKIP LOCKED)
        RETURNING l.fencing_token INTO token;
    ELSE
        -- A fair waiter queued on the key: free to take only if none is live.
        UPDATE pglock.locks l
        SET owner = lock_acquire.owner,
            fencing_token = greatest(nextval('pglock.fencing_token_seq'), l.fencing_token + 1),
            expires_at = clock_timestamp() + lock_acquire.ttl_ms * interval '1 millisecond',
            acquired_at = clock_timestamp(),
            ttl_ms = lock_acquire.ttl_ms
        WHERE l.key = (SELECT f.key FROM pglock.locks f
                       WHERE f.key = lock_acquire.key AND (f.owner IS NULL OR f.expires_at <= clock_timestamp())
                         AND (NOT f.queued OR NOT EXISTS (
                             SELECT FROM pglock.waiters w
                             WHERE w.key = lock_acquire.key AND w.granted IS NULL
                               AND w.seen_at > clock_timestamp() - interval '1 second'))
                       FOR UPDATE SKIP LOCKED)
        RETURNING l.fencing_token INTO token;
    END IF;
    IF NOT FOUND THEN
        RETURN NULL; -- taken meanwhile, being changed, or queued for
    END IF;
    IF token <= (pglock.fencing_timeline() - 1) << 40 THEN
        -- A new timeline's first tokens (000012): above its floor.
        UPDATE pglock.locks l SET fencing_token = greatest(pglock.fencing_token_next(), l.fencing_token + 1)
        WHERE l.key = lock_acquire.key
        RETURNING l.fencing_token INTO token;
    END IF;
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    RETURN token;
END $$;
