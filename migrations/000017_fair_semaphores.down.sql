-- The semaphores' fair queue gone: their waiters deleted, sem_acquire as 000013 left
-- it, lock_release, lock_force_release, queue_acquire, queue_poll and queue_leave as
-- 000014 did.
DELETE FROM pglock.waiters w WHERE strpos(w.key, chr(31)) > 0;

-- sem_acquire as in 000013.
CREATE OR REPLACE FUNCTION pglock.sem_acquire(key text, owner text, ttl_ms bigint, permits integer,
    OUT permit integer, OUT fencing_token bigint)
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    live integer;
    candidate integer;
BEGIN
    IF sem_acquire.key = '' OR length(sem_acquire.key) > 495 OR strpos(sem_acquire.key, chr(31)) > 0
        OR sem_acquire.owner = '' OR sem_acquire.ttl_ms < 1 OR sem_acquire.ttl_ms > 31536000000
        OR sem_acquire.permits < 1 OR sem_acquire.permits > 1000 THEN
        RAISE EXCEPTION 'pglock.sem_acquire: want a key of 1 to 495 characters without U+001F, an owner, a ttl_ms of 1 to 31536000000 (365 days) and permits of 1 to 1000, not a key of % characters, owner %, ttl_ms % and permits %',
            length(sem_acquire.key), quote_literal(sem_acquire.owner), sem_acquire.ttl_ms, sem_acquire.permits
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM FROM pglock.semaphores s WHERE s.key = sem_acquire.key FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO pglock.semaphores AS s (key, permits) VALUES (sem_acquire.key, sem_acquire.permits)
        ON CONFLICT ON CONSTRAINT semaphores_pkey DO NOTHING;
        PERFORM FROM pglock.semaphores s WHERE s.key = sem_acquire.key FOR UPDATE;
    END IF;
    SELECT count(*) INTO live FROM pglock.locks l
    WHERE l.semaphore = sem_acquire.key AND l.owner IS NOT NULL AND l.expires_at > clock_timestamp();
    IF live >= sem_acquire.permits THEN
        RETURN;
    END IF;
    FOR candidate IN
        SELECT i FROM generate_series(1, sem_acquire.permits) AS g(i)
        WHERE NOT EXISTS (
            SELECT FROM pglock.locks l
            WHERE l.key = sem_acquire.key || chr(31) || g.i
              AND l.owner IS NOT NULL AND l.expires_at > clock_timestamp())
        ORDER BY g.i
    LOOP
        sem_acquire.fencing_token := pglock.lock_acquire(sem_acquire.key || chr(31) || candidate,
            sem_acquire.owner, sem_acquire.ttl_ms);
        IF sem_acquire.fencing_token IS NOT NULL THEN
            sem_acquire.permit := candidate;
            UPDATE pglock.semaphores s
            SET permits = sem_acquire.permits, acquired_at = clock_timestamp()
            WHERE s.key = sem_acquire.key;
            RETURN;
        END IF;
    END LOOP;
END $$;

-- lock_release as in 000014.
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
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF EXISTS (SELECT FROM pglock.waiters w WHERE w.key = lock_release.key) THEN
        PERFORM pglock.queue_grant(lock_release.key);
    END IF;
    RETURN true;
END $$;

-- lock_force_release as in 000014.
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
    IF EXISTS (SELECT FROM pglock.waiters w WHERE w.key = lock_force_release.key) THEN
        PERFORM pglock.queue_grant(lock_force_release.key);
    END IF;
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
END $$;

-- queue_acquire and queue_poll as in 000014: their result columns change, so DROP them
-- first (the grants are given back below).
DROP FUNCTION IF EXISTS pglock.queue_acquire(text, text, bigint, integer);
CREATE FUNCTION pglock.queue_acquire(key text, owner text, ttl_ms bigint, permits integer,
    OUT fencing_token bigint, OUT ticket bigint)
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    locked boolean;
BEGIN
    IF queue_acquire.key = '' OR length(queue_acquire.key) > 500 OR queue_acquire.owner = ''
        OR queue_acquire.ttl_ms < 1 OR queue_acquire.ttl_ms > 31536000000 OR queue_acquire.permits <> 0 THEN
        RAISE EXCEPTION 'pglock.queue_acquire: want a key of 1 to 500 characters, an owner, a ttl_ms of 1 to 31536000000 (365 days) and permits 0, not a key of % characters, owner %L, ttl_ms % and permits %',
            length(queue_acquire.key), queue_acquire.owner, queue_acquire.ttl_ms, queue_acquire.permits
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Twice when the key has no row yet: the caller that inserts it first has it, and
    -- the second pass waits for its commit on the row lock, so that its release finds
    -- this waiter queued.
    FOR pass IN 1..2 LOOP
        PERFORM FROM pglock.locks l WHERE l.key = queue_acquire.key FOR NO KEY UPDATE;
        locked := FOUND;
        IF NOT EXISTS (SELECT FROM pglock.waiters w
                       WHERE w.key = queue_acquire.key AND w.granted IS NULL
                         AND w.seen_at > clock_timestamp() - interval '1 second') THEN
            fencing_token := pglock.lock_take(queue_acquire.key, queue_acquire.owner, queue_acquire.ttl_ms);
            IF fencing_token IS NOT NULL THEN
                RETURN;
            END IF;
        END IF;
        EXIT WHEN locked;
    END LOOP;
    DELETE FROM pglock.waiters w
    WHERE w.key = queue_acquire.key AND w.seen_at < clock_timestamp() - interval '1 minute';
    INSERT INTO pglock.waiters AS w (key, owner, ttl_ms, permits, seen_at)
    VALUES (queue_acquire.key, queue_acquire.owner, queue_acquire.ttl_ms, queue_acquire.permits, clock_timestamp())
    RETURNING w.ticket INTO ticket;
END $$;

DROP FUNCTION IF EXISTS pglock.queue_poll(text, bigint);
CREATE FUNCTION pglock.queue_poll(key text, ticket bigint, OUT fencing_token bigint, OUT queued boolean)
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    w pglock.waiters;
    prior text := current_setting('synchronous_commit');
BEGIN
    IF queue_poll.key = '' OR length(queue_poll.key) > 500 OR queue_poll.ticket < 1 THEN
        RAISE EXCEPTION 'pglock.queue_poll: want a key of 1 to 500 characters and a ticket above 0, not a key of % characters and ticket %',
            length(queue_poll.key), queue_poll.ticket
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    queued := false;
    -- The heartbeat first: it row-locks the waiter's row, so that a grant under way
    -- (queue_grant's FOR UPDATE) is seen here or comes after this call, never lost.
    PERFORM set_config('synchronous_commit', 'off', true);
    UPDATE pglock.waiters o SET seen_at = clock_timestamp()
    WHERE o.key = queue_poll.key AND o.ticket = queue_poll.ticket
    RETURNING * INTO w;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF w.granted IS NOT NULL THEN
        UPDATE pglock.locks l
        SET expires_at = clock_timestamp() + w.ttl_ms * interval '1 millisecond'
        WHERE l.key = w.granted AND l.owner = w.owner AND l.expires_at > clock_timestamp()
        RETURNING l.fencing_token INTO fencing_token;
        IF FOUND THEN
            DELETE FROM pglock.waiters o WHERE o.key = queue_poll.key AND o.ticket = queue_poll.ticket;
            PERFORM set_config('synchronous_commit',
                CASE WHEN prior IN ('off', 'local') THEN 'on' ELSE prior END, true);
            RETURN;
        END IF;
        -- The grant lapsed: the waiter waits again, from its place.
        UPDATE pglock.waiters o SET granted = NULL
        WHERE o.key = queue_poll.key AND o.ticket = queue_poll.ticket;
    END IF;
    queued := true;
    IF EXISTS (SELECT FROM pglock.locks l
               WHERE l.key = queue_poll.key AND l.owner IS NOT NULL AND l.expires_at > clock_timestamp()) THEN
        RETURN;
    END IF;
    -- Free: the head of the live queue takes it, under the row lock that orders the queue.
    PERFORM FROM pglock.locks l WHERE l.key = queue_poll.key FOR NO KEY UPDATE;
    IF EXISTS (SELECT FROM pglock.waiters o
               WHERE o.key = queue_poll.key AND o.ticket < queue_poll.ticket AND o.granted IS NULL
                 AND o.seen_at > clock_timestamp() - interval '1 second') THEN
        RETURN;
    END IF;
    fencing_token := pglock.lock_take(queue_poll.key, w.owner, w.ttl_ms);
    IF fencing_token IS NOT NULL THEN
        DELETE FROM pglock.waiters o WHERE o.key = queue_poll.key AND o.ticket = queue_poll.ticket;
        queued := false;
        PERFORM set_config('synchronous_commit',
            CASE WHEN prior IN ('off', 'local') THEN 'on' ELSE prior END, true);
    END IF;
END $$;

-- queue_leave as in 000014.
CREATE OR REPLACE FUNCTION pglock.queue_leave(key text, ticket bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    w pglock.waiters;
BEGIN
    IF queue_leave.key = '' OR length(queue_leave.key) > 500 OR queue_leave.ticket < 1 THEN
        RAISE EXCEPTION 'pglock.queue_leave: want a key of 1 to 500 characters and a ticket above 0, not a key of % characters and ticket %',
            length(queue_leave.key), queue_leave.ticket
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM FROM pglock.locks l WHERE l.key = queue_leave.key FOR NO KEY UPDATE;
    DELETE FROM pglock.waiters o WHERE o.key = queue_leave.key AND o.ticket = queue_leave.ticket
    RETURNING * INTO w;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF w.granted IS NOT NULL THEN
        UPDATE pglock.locks l
        SET owner = NULL, expires_at = clock_timestamp()
        WHERE l.key = w.granted AND l.owner = w.owner AND l.expires_at > clock_timestamp();
        IF FOUND THEN
            PERFORM pglock.queue_grant(queue_leave.key);
        END IF;
    END IF;
    RETURN true;
END $$;

DROP FUNCTION IF EXISTS pglock.sem_grant(text, text);
DROP FUNCTION IF EXISTS pglock.sem_take(text, text, bigint, integer);
DROP FUNCTION IF EXISTS pglock.sem_waiting(text, bigint);
DROP FUNCTION IF EXISTS pglock.sem_live(text);
DROP FUNCTION IF EXISTS pglock.sem_lock(text, integer);

REVOKE ALL ON FUNCTION pglock.queue_acquire(text, text, bigint, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION pglock.queue_poll(text, bigint) FROM PUBLIC;
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT DISTINCT a.grantee::regrole AS grantee
        FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
        WHERE p.oid = 'pglock.lock_acquire(text, text, bigint)'::regprocedure
          AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION pglock.queue_acquire(text, text, bigint, integer), '
            'pglock.queue_poll(text, bigint) TO %s', r.grantee);
    END LOOP;
END $$;
