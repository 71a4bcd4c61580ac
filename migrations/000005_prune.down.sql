-- Back to lock_held of 000002, and lock_acquire and lock_release of 000004.
DROP FUNCTION IF EXISTS pglock.lock_prune(bigint, integer);

CREATE OR REPLACE FUNCTION pglock.lock_held(key text, token bigint) RETURNS boolean
LANGUAGE sql VOLATILE STRICT AS $$
    SELECT EXISTS (
        SELECT 1 FROM pglock.locks l
        WHERE l.key = lock_held.key AND l.owner IS NOT NULL
          AND l.fencing_token = lock_held.token AND l.expires_at > clock_timestamp()
        FOR SHARE)
$$;

CREATE OR REPLACE FUNCTION pglock.lock_release(key text, owner text) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT AS $$
BEGIN
    UPDATE pglock.locks l
    SET owner = NULL,
        wanted_at = CASE WHEN l.wanted_at IS NOT NULL THEN
            (SELECT NULL::timestamptz FROM pg_notify('pglock_released', l.key)) END
    WHERE l.key = lock_release.key AND l.owner = lock_release.owner
      AND l.expires_at > clock_timestamp();
    RETURN FOUND;
END $$;

CREATE OR REPLACE FUNCTION pglock.lock_acquire(key text, owner text, ttl_ms bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE STRICT AS $$
DECLARE
    token bigint;
BEGIN
    IF lock_acquire.ttl_ms <= 0 THEN
        RETURN NULL;
    END IF;
    PERFORM FROM pglock.locks l
    WHERE l.key = lock_acquire.key AND (l.owner IS NULL OR l.expires_at <= clock_timestamp())
    FOR UPDATE SKIP LOCKED;
    IF FOUND THEN
        UPDATE pglock.locks l
        SET owner = lock_acquire.owner,
            fencing_token = greatest(nextval('pglock.fencing_token_seq'), l.fencing_token + 1),
            expires_at = clock_timestamp() + lock_acquire.ttl_ms * interval '1 millisecond'
        WHERE l.key = lock_acquire.key
        RETURNING l.fencing_token INTO token;
        RETURN token;
    END IF;
    IF EXISTS (SELECT FROM pglock.locks l WHERE l.key = lock_acquire.key) THEN
        RETURN NULL;
    END IF;
    INSERT INTO pglock.locks AS l (key, owner, fencing_token, expires_at)
    VALUES (lock_acquire.key, lock_acquire.owner, nextval('pglock.fencing_token_seq'),
            clock_timestamp() + lock_acquire.ttl_ms * interval '1 millisecond')
    ON CONFLICT ON CONSTRAINT locks_pkey DO NOTHING
    RETURNING l.fencing_token INTO token;
    RETURN token;
END $$;
