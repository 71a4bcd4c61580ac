-- The functions as 000010 left them: the bodies of the migrations named, with 000006's
-- SECURITY DEFINER and search_path.

-- lock_acquire as in 000005.
CREATE OR REPLACE FUNCTION pglock.lock_acquire(key text, owner text, ttl_ms bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
    RETURN token;
END $$;

-- lock_acquire_or_want as in 000010.
CREATE OR REPLACE FUNCTION pglock.lock_acquire_or_want(key text, owner text, ttl_ms bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    token bigint;
BEGIN
    token := pglock.lock_acquire(lock_acquire_or_want.key, lock_acquire_or_want.owner, lock_acquire_or_want.ttl_ms);
    IF token IS NOT NULL OR lock_acquire_or_want.ttl_ms <= 0 THEN
        RETURN token;
    END IF;
    -- Lost, and nothing written so far. What follows writes only the mark, a hint: a
    -- crash that loses it wakes every listener anyway (they reconnect). No flush for it.
    PERFORM set_config('synchronous_commit', 'off', true);
    IF pglock.lock_want(lock_acquire_or_want.key) THEN
        RETURN 0;
    END IF;
    -- Lost, yet the key looks free: another caller's acquisition has the row locked and
    -- has not committed yet (its flush takes a while on a busy server). Wait for it, then
    -- mark the key it took. Without the wait, a crowd's losers took the key for free,
    -- tried again, and lost again, several times a handover. FOR NO KEY UPDATE, not a
    -- shared lock: the losers of one handover then wait in turn, each holding the row
    -- alone, rather than pile up as one MultiXact of shared lockers per loser; it does
    -- not conflict with a fenced transaction's FOR KEY SHARE.
    PERFORM FROM pglock.locks l WHERE l.key = lock_acquire_or_want.key FOR NO KEY UPDATE;
    IF pglock.lock_want(lock_acquire_or_want.key) THEN
        RETURN 0;
    END IF;
    RETURN -1;
END $$;

-- lock_renew as in 000004.
CREATE OR REPLACE FUNCTION pglock.lock_renew(key text, owner text, ttl_ms bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE pglock.locks l
    SET expires_at = clock_timestamp() + lock_renew.ttl_ms * interval '1 millisecond'
    WHERE l.key = lock_renew.key AND l.owner = lock_renew.owner
      AND l.expires_at > clock_timestamp() AND lock_renew.ttl_ms > 0;
    RETURN FOUND;
END $$;

-- lock_renew_many as in 000001.
CREATE OR REPLACE FUNCTION pglock.lock_renew_many(keys text[], owners text[], ttl_ms bigint) RETURNS SETOF text
LANGUAGE sql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    UPDATE pglock.locks l
    SET expires_at = clock_timestamp() + lock_renew_many.ttl_ms * interval '1 millisecond'
    FROM unnest(lock_renew_many.keys, lock_renew_many.owners) AS u(key, owner)
    WHERE l.key = u.key AND l.owner = u.owner
      AND l.expires_at > clock_timestamp() AND lock_renew_many.ttl_ms > 0
    RETURNING l.key
$$;

-- lock_release as in 000005.
CREATE OR REPLACE FUNCTION pglock.lock_release(key text, owner text) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE pglock.locks l
    SET owner = NULL,
        expires_at = clock_timestamp(),
        wanted_at = CASE WHEN l.wanted_at IS NOT NULL THEN
            (SELECT NULL::timestamptz FROM pg_notify('pglock_released', l.key)) END
    WHERE l.key = lock_release.key AND l.owner = lock_release.owner
      AND l.expires_at > clock_timestamp();
    RETURN FOUND;
END $$;

-- lock_want as in 000010.
CREATE OR REPLACE FUNCTION pglock.lock_want(key text) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    held boolean;
    marked boolean;
BEGIN
    FOR pass IN 1..2 LOOP
        UPDATE pglock.locks l
        SET wanted_at = clock_timestamp()
        WHERE l.key = lock_want.key AND l.owner IS NOT NULL
          AND l.expires_at > clock_timestamp() AND l.wanted_at IS NULL;
        IF FOUND THEN
            RETURN true;
        END IF;
        SELECT l.owner IS NOT NULL AND l.expires_at > clock_timestamp(), l.wanted_at IS NOT NULL
        INTO held, marked
        FROM pglock.locks l
        WHERE l.key = lock_want.key;
        IF NOT coalesce(held, false) THEN
            RETURN false;
        END IF;
        IF marked THEN
            RETURN true;
        END IF;
    END LOOP;
    RETURN false;
END $$;

-- lock_held as in 000005.
CREATE OR REPLACE FUNCTION pglock.lock_held(key text, token bigint) RETURNS boolean
LANGUAGE sql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN current_setting('transaction_isolation') IN ('read committed', 'read uncommitted') THEN
        EXISTS (
            SELECT 1 FROM pglock.locks l
            WHERE l.key = lock_held.key AND l.owner IS NOT NULL
              AND l.fencing_token = lock_held.token AND l.expires_at > clock_timestamp()
            FOR KEY SHARE)
    ELSE
        EXISTS (
            SELECT 1 FROM pglock.locks l
            WHERE l.key = lock_held.key AND l.owner IS NOT NULL
              AND l.fencing_token = lock_held.token AND l.expires_at > clock_timestamp()
            FOR SHARE)
    END
$$;

-- lock_force_release as in 000007.
CREATE OR REPLACE FUNCTION pglock.lock_force_release(key text, OUT owner text, OUT fencing_token bigint,
    OUT expires_at timestamptz, OUT expires_in_us bigint, OUT wanted boolean)
LANGUAGE plpgsql VOLATILE STRICT
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    now timestamptz;
BEGIN
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
END $$;

-- job_run_record as in 000008.
CREATE OR REPLACE FUNCTION pglock.job_run_record(job text, instance text, owner text, token bigint,
    ended_ago_us bigint, duration_us bigint, outcome text, err text, retention_ms bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ended timestamptz := statement_timestamp() - job_run_record.ended_ago_us * interval '1 microsecond';
    run_id bigint;
BEGIN
    IF job_run_record.job IS NULL OR job_run_record.instance IS NULL OR job_run_record.owner IS NULL
        OR job_run_record.token IS NULL OR job_run_record.outcome IS NULL
        OR NOT job_run_record.ended_ago_us >= 0 OR NOT job_run_record.duration_us >= 0
        OR NOT job_run_record.retention_ms > 0 THEN
        RAISE EXCEPTION 'pglock.job_run_record: job, instance, owner, token and outcome must not be null, ended_ago_us and duration_us must be >= 0 and retention_ms > 0'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    INSERT INTO pglock.job_runs AS r (job, instance, owner, fencing_token, started_at, ended_at, outcome, error)
    VALUES (job_run_record.job, job_run_record.instance, job_run_record.owner, job_run_record.token,
            ended - job_run_record.duration_us * interval '1 microsecond', ended,
            job_run_record.outcome, left(job_run_record.err, 1000))
    RETURNING r.id INTO run_id;
    IF run_id % 16 = 0 THEN
        DELETE FROM pglock.job_runs r
        WHERE r.job = job_run_record.job
          AND r.ended_at < clock_timestamp() - job_run_record.retention_ms * interval '1 millisecond';
    END IF;
    RETURN run_id;
END $$;
