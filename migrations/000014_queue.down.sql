-- The queue's functions and table gone; lock_acquire as 000012 left it, lock_release and
-- lock_force_release as 000011 did.
DROP FUNCTION IF EXISTS pglock.queue_leave(text, bigint);
DROP FUNCTION IF EXISTS pglock.queue_poll(text, bigint);
DROP FUNCTION IF EXISTS pglock.queue_acquire(text, text, bigint, integer);

-- lock_acquire as in 000012.
CREATE OR REPLACE FUNCTION pglock.lock_acquire(key text, owner text, ttl_ms bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    token bigint;
    inserted boolean := false;
    floor bigint;
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
    IF NOT FOUND THEN
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
        inserted := true;
    END IF;
    token := nextval('pglock.fencing_token_seq');
    floor := (('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1) << 40;
    IF token <= floor THEN
        PERFORM pg_advisory_xact_lock(2736408391470914537);
        token := nextval('pglock.fencing_token_seq');
        IF token <= floor THEN
            token := setval('pglock.fencing_token_seq', floor + 1);
        END IF;
    END IF;
    -- A new row's placeholder token (1) is no floor; a free row's token is, for a
    -- sequence that went back (a restore, a failover within one timeline's range).
    UPDATE pglock.locks l
    SET owner = lock_acquire.owner,
        fencing_token = CASE WHEN inserted THEN token ELSE greatest(token, l.fencing_token + 1) END,
        expires_at = clock_timestamp() + lock_acquire.ttl_ms * interval '1 millisecond'
    WHERE l.key = lock_acquire.key
    RETURNING l.fencing_token INTO token;
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    RETURN token;
END $$;

-- lock_release as in 000011.
CREATE OR REPLACE FUNCTION pglock.lock_release(key text, owner text) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF lock_release.key = '' OR length(lock_release.key) > 500 OR lock_release.owner = '' THEN
        RAISE EXCEPTION 'pglock.lock_release: want a key of 1 to 500 characters and an owner, not a key of % characters and owner %L',
            length(lock_release.key), lock_release.owner
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE pglock.locks l
    SET owner = NULL,
        expires_at = clock_timestamp(),
        wanted_at = CASE WHEN l.wanted_at IS NOT NULL THEN
            (SELECT NULL::timestamptz FROM pg_notify('pglock_released', l.key)) END
    WHERE l.key = lock_release.key AND l.owner = lock_release.owner
      AND l.expires_at > clock_timestamp();
    RETURN FOUND;
END $$;

-- lock_force_release as in 000011.
CREATE OR REPLACE FUNCTION pglock.lock_force_release(key text, OUT owner text, OUT fencing_token bigint,
    OUT expires_at timestamptz, OUT expires_in_us bigint, OUT wanted boolean)
LANGUAGE plpgsql VOLATILE STRICT
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    now timestamptz;
BEGIN
    IF lock_force_release.key = '' OR length(lock_force_release.key) > 500 THEN
        RAISE EXCEPTION 'pglock.lock_force_release: want a key of 1 to 500 characters, not %', length(lock_force_release.key)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT l.owner, l.fencing_token, l.expires_at, l.wanted_at IS NOT NULL
    INTO lock_force_release.owner, lock_force_release.fencing_token,
         lock_force_release.expires_at, lock_force_release.wanted
    FROM pglock.locks l
    WHERE l.key = lock_force_release.key
    FOR UPDATE;
    now := clock_timestamp();
    IF NOT FOUND OR lock_force_release.owner IS NULL OR lock_force_release.expires_at <= now THEN
        owner := NULL;
        fencing_token := NULL;
        expires_at := NULL;
        wanted := NULL;
        RETURN;
    END IF;
    expires_in_us := (extract(epoch FROM lock_force_release.expires_at - now) * 1000000)::bigint;
    UPDATE pglock.locks l
    SET owner = NULL,
        expires_at = now,
        wanted_at = CASE WHEN l.wanted_at IS NOT NULL THEN
            (SELECT NULL::timestamptz FROM pg_notify('pglock_released', l.key)) END
    WHERE l.key = lock_force_release.key;
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
END $$;

DROP FUNCTION IF EXISTS pglock.queue_grant(text);
DROP FUNCTION IF EXISTS pglock.lock_take(text, text, bigint);
DROP FUNCTION IF EXISTS pglock.fencing_token_next();
DROP TABLE IF EXISTS pglock.waiters;
DROP SEQUENCE IF EXISTS pglock.waiter_ticket_seq;
