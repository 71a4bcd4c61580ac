-- Back to the LANGUAGE sql bodies of 000001 and 000003.
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
