-- lock_acquire as 000011 left it.
CREATE OR REPLACE FUNCTION pglock.lock_acquire(key text, owner text, ttl_ms bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    token bigint;
BEGIN
    IF lock_acquire.key = '' OR length(lock_acquire.key) > 500 OR lock_acquire.owner = ''
        OR lock_acquire.ttl_ms < 1 OR lock_acquire.ttl_ms > 31536000000 THEN
        RAISE EXCEPTION 'pglock.lock_acquire: want a key of 1 to 500 characters, an owner and a ttl_ms of 1 to 31536000000 (365 days), not a key of % characters, owner %L and ttl_ms %',
            length(lock_acquire.key), lock_acquire.owner, lock_acquire.ttl_ms
            USING ERRCODE = 'invalid_parameter_value';
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
        IF current_setting('synchronous_commit') IN ('off', 'local') THEN
            PERFORM set_config('synchronous_commit', 'on', true);
        END IF;
        RETURN token;
    END IF;
    IF EXISTS (SELECT FROM pglock.locks l WHERE l.key = lock_acquire.key) THEN
        RETURN NULL;
    END IF;
    INSERT INTO pglock.locks AS l (key, owner, fencing_token, expires_at)
    VALUES (lock_acquire.key, lock_acquire.owner, 1,
            clock_timestamp() + lock_acquire.ttl_ms * interval '1 millisecond')
    ON CONFLICT ON CONSTRAINT locks_pkey DO NOTHING;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    UPDATE pglock.locks l
    SET fencing_token = nextval('pglock.fencing_token_seq')
    WHERE l.key = lock_acquire.key
    RETURNING l.fencing_token INTO token;
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    RETURN token;
END $$;
