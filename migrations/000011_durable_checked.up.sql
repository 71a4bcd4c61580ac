-- The functions keep their promise whatever the server's settings and whoever calls
-- them: what they write that the promise rests on is flushed even under
-- synchronous_commit off, they refuse what the Go API refuses, and an open fenced
-- transaction holds up no renewal at any isolation level.
--
-- Durable whatever synchronous_commit says. An acquisition must survive a crash (its
-- token and its holder: a lost one hands the token to a second holder), and so must a
-- renewal (a lost one moves the expiry back under a holder that believes it still has
-- the key) and a force-release (a lost one gives the key back to the holder it was
-- broken for, after its new holder was told it was free). synchronous_commit off or
-- local, from the server, the database, the role or the session, is raised to on for
-- the caller's transaction when one of them writes; a stronger setting (remote_write,
-- remote_apply, on) is kept. set_config(..., true) is undone only by the end of the
-- transaction: a function's SET clause (search_path here) restores the settings it
-- names at the function's exit, and no others, so the commit that follows waits for its
-- flush (.ci/crash crashes the server right after each statement to prove it). Called
-- inside a caller's transaction, the whole transaction becomes durable: its commit is
-- the commit of the acquisition. A losing acquisition writes nothing, and changes
-- nothing; lock_release_async, job_run_record, job_skips_record and the mark of a
-- losing lock_acquire_or_want stay asynchronous, on purpose (see 000008 to 000010).
--
-- Bad input raises invalid_parameter_value (22023), as lock_prune's does, touching
-- nothing: a key is 1 to 500 characters (the Go API's MaxKeyLength), an owner is not
-- empty, a ttl is 1 ms to 365 days (MinTTL, MaxTTL), so that a role granted EXECUTE
-- cannot write a 100,000-character key and a ttl past an interval's range is refused
-- before it overflows. Text holds no NUL, and a UTF8 database no invalid UTF-8. The
-- functions that only read (lock_holder, lock_list, job_run_list) answer nothing for a
-- key that cannot exist, and are left as they were.

-- lock_acquire as in 000005, with its arguments checked and its win durable.
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

-- lock_acquire_or_want as in 000010. lock_acquire checks the arguments and makes a win
-- durable (its set_config outlives its return, as above); a loss writes only the mark,
-- unflushed.
CREATE OR REPLACE FUNCTION pglock.lock_acquire_or_want(key text, owner text, ttl_ms bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    token bigint;
BEGIN
    token := pglock.lock_acquire(lock_acquire_or_want.key, lock_acquire_or_want.owner, lock_acquire_or_want.ttl_ms);
    IF token IS NOT NULL THEN
        RETURN token;
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    IF pglock.lock_want(lock_acquire_or_want.key) THEN
        RETURN 0;
    END IF;
    PERFORM FROM pglock.locks l WHERE l.key = lock_acquire_or_want.key FOR NO KEY UPDATE;
    IF pglock.lock_want(lock_acquire_or_want.key) THEN
        RETURN 0;
    END IF;
    RETURN -1;
END $$;

-- lock_renew as in 000004, with its arguments checked and its renewal durable.
CREATE OR REPLACE FUNCTION pglock.lock_renew(key text, owner text, ttl_ms bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF lock_renew.key = '' OR length(lock_renew.key) > 500 OR lock_renew.owner = ''
        OR lock_renew.ttl_ms < 1 OR lock_renew.ttl_ms > 31536000000 THEN
        RAISE EXCEPTION 'pglock.lock_renew: want a key of 1 to 500 characters, an owner and a ttl_ms of 1 to 31536000000 (365 days), not a key of % characters, owner %L and ttl_ms %',
            length(lock_renew.key), lock_renew.owner, lock_renew.ttl_ms
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE pglock.locks l
    SET expires_at = clock_timestamp() + lock_renew.ttl_ms * interval '1 millisecond'
    WHERE l.key = lock_renew.key AND l.owner = lock_renew.owner
      AND l.expires_at > clock_timestamp();
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    RETURN true;
END $$;

-- lock_renew_many renews, in one statement, every (keys[i], owners[i]) still held live,
-- and returns the keys it renewed. It locks and writes the rows in the order of their
-- keys, whatever the order of the arrays: two calls over overlapping keys in different
-- orders, each locking one row the other wants, would deadlock (40P01) and wait a
-- deadlock_timeout first. The order is the plan's: the sorted arrays drive a nested loop
-- over the primary key, and the UPDATE locks each row as it reaches it; the function's
-- SET clause keeps the planner from a hash or merge join, whose order would be another.
-- (Locking the rows in a first pass, then updating them, costs a WAL record per row
-- more: a batched renewal took 1.6 times as long.) PL/pgSQL, so that its plan is kept
-- for the session. keys and owners have the same length and no null; null arrays
-- (STRICT) renew nothing.
CREATE OR REPLACE FUNCTION pglock.lock_renew_many(keys text[], owners text[], ttl_ms bigint) RETURNS SETOF text
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET enable_hashjoin = off SET enable_mergejoin = off AS $$
BEGIN
    IF lock_renew_many.ttl_ms < 1 OR lock_renew_many.ttl_ms > 31536000000
        OR cardinality(lock_renew_many.keys) <> cardinality(lock_renew_many.owners)
        OR EXISTS (SELECT FROM unnest(lock_renew_many.keys, lock_renew_many.owners) AS u(key, owner)
                   WHERE u.key IS NULL OR u.key = '' OR length(u.key) > 500 OR u.owner IS NULL OR u.owner = '') THEN
        RAISE EXCEPTION 'pglock.lock_renew_many: want as many keys as owners, keys of 1 to 500 characters, owners and a ttl_ms of 1 to 31536000000 (365 days), not % keys, % owners and ttl_ms %',
            cardinality(lock_renew_many.keys), cardinality(lock_renew_many.owners), lock_renew_many.ttl_ms
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    UPDATE pglock.locks l
    SET expires_at = clock_timestamp() + lock_renew_many.ttl_ms * interval '1 millisecond'
    FROM (SELECT u.key, u.owner FROM unnest(lock_renew_many.keys, lock_renew_many.owners) AS u(key, owner)
          ORDER BY u.key) AS u
    WHERE l.key = u.key AND l.owner = u.owner AND l.expires_at > clock_timestamp()
    RETURNING l.key;
    IF FOUND AND current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
END $$;

-- lock_release as in 000005, with its arguments checked (lock_release_async calls it).
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

-- lock_want as in 000010, with its key checked.
CREATE OR REPLACE FUNCTION pglock.lock_want(key text) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    held boolean;
    marked boolean;
BEGIN
    IF lock_want.key = '' OR length(lock_want.key) > 500 THEN
        RAISE EXCEPTION 'pglock.lock_want: want a key of 1 to 500 characters, not %', length(lock_want.key)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
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

-- lock_held reports whether (key, token) is the live holder of key on the database
-- clock, and row-locks the lock row FOR KEY SHARE until the caller's transaction ends,
-- at every isolation level. FOR KEY SHARE conflicts with the FOR UPDATE of a takeover
-- (lock_acquire loses at once, lock_prune skips the row, lock_force_release waits), not
-- with the FOR NO KEY UPDATE of a renewal, a release or a mark: an open fenced
-- transaction holds up no renewal, so it cannot stall the lock_renew_many of its ttl
-- group and cost the client's other locks (000005 took FOR SHARE under REPEATABLE READ
-- and SERIALIZABLE, which did).
--
-- Under READ COMMITTED each statement reads the latest row version, so that is all.
-- Under REPEATABLE READ and SERIALIZABLE, FOR KEY SHARE locks the version of the
-- transaction's snapshot even when a newer one was committed after it, and the answer
-- would be the snapshot's, perhaps a stale token. So it then takes FOR SHARE as well,
-- which raises a serialization failure (40001) on a row version changed since the
-- snapshot, as 000005 did, but in a subtransaction that it rolls back at once, which
-- releases the FOR SHARE and keeps FOR KEY SHARE. From then on only a non-key update
-- (a renewal, the holder's own release, a mark) can change the row before the
-- transaction ends, as under READ COMMITTED.
CREATE OR REPLACE FUNCTION pglock.lock_held(key text, token bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF lock_held.key = '' OR length(lock_held.key) > 500 THEN
        RAISE EXCEPTION 'pglock.lock_held: want a key of 1 to 500 characters, not %', length(lock_held.key)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM FROM pglock.locks l
    WHERE l.key = lock_held.key AND l.owner IS NOT NULL
      AND l.fencing_token = lock_held.token AND l.expires_at > clock_timestamp()
    FOR KEY SHARE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF current_setting('transaction_isolation') IN ('read committed', 'read uncommitted') THEN
        RETURN true;
    END IF;
    BEGIN
        PERFORM FROM pglock.locks l WHERE l.key = lock_held.key FOR SHARE;
        RAISE SQLSTATE 'PGLK0'; -- undo the subtransaction: the FOR SHARE goes with it
    EXCEPTION WHEN SQLSTATE 'PGLK0' THEN
        NULL;
    END;
    RETURN true;
END $$;

-- lock_force_release as in 000007, with its key checked and its break durable.
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

-- job_run_record as in 000008, with its job checked as a key and its pruning bounded:
-- every 16th run deletes at most 64 of the job's runs past retention, the oldest first,
-- skipping those another recorder is deleting. A history that grew while it was not
-- pruned (a longer retention before, a burst of runs) shrinks by up to 48 runs for
-- every 16 recorded, rather than in one statement that deletes it all while the run
-- waits.
CREATE OR REPLACE FUNCTION pglock.job_run_record(job text, instance text, owner text, token bigint,
    ended_ago_us bigint, duration_us bigint, outcome text, err text, retention_ms bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ended timestamptz;
    run_id bigint;
BEGIN
    IF job_run_record.job IS NULL OR job_run_record.instance IS NULL OR job_run_record.owner IS NULL
        OR job_run_record.token IS NULL OR job_run_record.outcome IS NULL
        OR job_run_record.job = '' OR length(job_run_record.job) > 500
        OR NOT job_run_record.ended_ago_us >= 0 OR NOT job_run_record.duration_us >= 0
        OR NOT job_run_record.retention_ms > 0 THEN
        RAISE EXCEPTION 'pglock.job_run_record: job (1 to 500 characters), instance, owner, token and outcome must not be null, ended_ago_us and duration_us must be >= 0 and retention_ms > 0'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    ended := statement_timestamp() - job_run_record.ended_ago_us * interval '1 microsecond';
    PERFORM set_config('synchronous_commit', 'off', true);
    INSERT INTO pglock.job_runs AS r (job, instance, owner, fencing_token, started_at, ended_at, outcome, error)
    VALUES (job_run_record.job, job_run_record.instance, job_run_record.owner, job_run_record.token,
            ended - job_run_record.duration_us * interval '1 microsecond', ended,
            job_run_record.outcome, left(job_run_record.err, 1000))
    RETURNING r.id INTO run_id;
    IF run_id % 16 = 0 THEN
        DELETE FROM pglock.job_runs r
        WHERE r.id IN (
            SELECT o.id FROM pglock.job_runs o
            WHERE o.job = job_run_record.job
              AND o.ended_at < clock_timestamp() - job_run_record.retention_ms * interval '1 millisecond'
            ORDER BY o.ended_at, o.id
            LIMIT 64
            FOR UPDATE SKIP LOCKED);
    END IF;
    RETURN run_id;
END $$;
