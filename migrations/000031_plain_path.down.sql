-- Back to 000029: lock_acquire probes pglock.waiters in the statement that takes a free key.
CREATE OR REPLACE FUNCTION pglock.lock_acquire(key text, owner text, ttl_ms bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    token bigint;
    free boolean;
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
    SELECT l.owner IS NULL OR l.expires_at <= clock_timestamp() INTO free
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
