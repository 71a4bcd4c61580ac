-- The fair queue (000014) for semaphores (000013): Semaphore.Acquire and WithPermit
-- with Fair.
--
-- A semaphore's fair waiters are queued in pglock.waiters under the semaphore's key
-- followed by U+001F (key || chr(31)), with permits the N they ask for: no lock's key
-- and no permit's row key ends that way, so a semaphore's queue and the queue of a lock
-- of the same key stay apart, and every lock path of 000014 is left as it was.
--
-- queue_acquire with permits > 0 takes a permit at once, as sem_acquire does, when no
-- live fair waiter is queued on the semaphore; otherwise it queues the caller. The
-- release of a permit (lock_release, and so lock_release_async; lock_force_release; a
-- waiter leaving with a grant) hands the permit, in the same call, to the head of the
-- semaphore's queue when the head's N allows it (fewer live holders than the head's N,
-- and the permit's number within it): a grant, as for a lock, claimed by the head's
-- queue_poll. A waiter whose turn came without a release (a holder expired, a grant
-- lapsed, N grew) takes a free permit at its poll when fewer live waiters are ahead of
-- it than there are free permits for its N. sem_acquire (TryAcquire, Acquire without
-- Fair) fails while a live fair waiter is queued on the semaphore, so that nothing
-- barges past the queue.
--
-- Lock order, so that none of these deadlock: a permit's row, then the semaphore's row,
-- then the waiters' rows. A release holds the permit's row when it takes the
-- semaphore's row to hand it over; a take (sem_acquire, queue_acquire, a poll's take)
-- holds the semaphore's row and waits for no permit's row (lock_take skips a locked
-- one); a poll takes the semaphore's row before its heartbeat touches its waiter's row,
-- and only when a take looks possible on its snapshot. A release whose statement comes
-- before the commit of a queue_acquire that found the semaphore full finds no waiter to
-- hand to: that waiter takes the permit at its next poll, Q/4 later at most.

-- sem_lock row-locks the semaphore key's row, making it first (permits is what it
-- records then). Callers: sem_acquire, queue_acquire.
CREATE OR REPLACE FUNCTION pglock.sem_lock(key text, permits integer) RETURNS void
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM FROM pglock.semaphores s WHERE s.key = sem_lock.key FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO pglock.semaphores AS s (key, permits) VALUES (sem_lock.key, sem_lock.permits)
        ON CONFLICT ON CONSTRAINT semaphores_pkey DO NOTHING;
        PERFORM FROM pglock.semaphores s WHERE s.key = sem_lock.key FOR UPDATE;
    END IF;
END $$;

-- sem_live counts the live holders of the semaphore key: any permit number, owner
-- set, not expired (an unclaimed grant is one).
CREATE OR REPLACE FUNCTION pglock.sem_live(key text) RETURNS integer
LANGUAGE sql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT count(*)::integer FROM pglock.locks l
    WHERE l.semaphore = sem_live.key AND l.owner IS NOT NULL AND l.expires_at > clock_timestamp()
$$;

-- sem_waiting counts the live fair waiters queued on the semaphore key, not granted,
-- with a ticket below before (any ticket when null).
CREATE OR REPLACE FUNCTION pglock.sem_waiting(key text, before bigint) RETURNS integer
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT count(*)::integer FROM pglock.waiters w
    WHERE w.key = sem_waiting.key || chr(31) AND w.granted IS NULL
      AND w.seen_at > clock_timestamp() - interval '1 second'
      AND (sem_waiting.before IS NULL OR w.ticket < sem_waiting.before)
$$;

-- sem_take is 000013's sem_acquire after its argument check, its row lock (the caller
-- holds the semaphore's row) and the queue's check: it takes the lowest free permit
-- while fewer than permits live holders hold the semaphore, durably, or returns nulls.
CREATE OR REPLACE FUNCTION pglock.sem_take(key text, owner text, ttl_ms bigint, permits integer,
    OUT permit integer, OUT fencing_token bigint)
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    candidate integer;
BEGIN
    IF pglock.sem_live(sem_take.key) >= sem_take.permits THEN
        RETURN;
    END IF;
    FOR candidate IN
        SELECT i FROM generate_series(1, sem_take.permits) AS g(i)
        WHERE NOT EXISTS (
            SELECT FROM pglock.locks l
            WHERE l.key = sem_take.key || chr(31) || g.i
              AND l.owner IS NOT NULL AND l.expires_at > clock_timestamp())
        ORDER BY g.i
    LOOP
        sem_take.fencing_token := pglock.lock_take(sem_take.key || chr(31) || candidate,
            sem_take.owner, sem_take.ttl_ms);
        IF sem_take.fencing_token IS NOT NULL THEN
            sem_take.permit := candidate;
            UPDATE pglock.semaphores s
            SET permits = sem_take.permits, acquired_at = clock_timestamp()
            WHERE s.key = sem_take.key;
            RETURN;
        END IF;
    END LOOP;
END $$;

-- sem_grant hands row_key, a permit of the semaphore key just freed (the caller holds
-- its row locked), to the head of the semaphore's queue: when the head's N allows it
-- (fewer live holders than its N, and the permit's number at most its N), the permit's
-- row gets the head's owner, a new token and a lease of Q = 1 s, the head's row the
-- granted row key, and the head's client a notification on pglock_granted. It reports
-- whether it granted. Not flushed, as queue_grant: the claim's flush covers it.
CREATE OR REPLACE FUNCTION pglock.sem_grant(key text, row_key text) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    head pglock.waiters;
    token bigint;
BEGIN
    PERFORM FROM pglock.semaphores s WHERE s.key = sem_grant.key FOR UPDATE;
    SELECT * INTO head FROM pglock.waiters w
    WHERE w.key = sem_grant.key || chr(31) AND w.granted IS NULL
      AND w.seen_at > clock_timestamp() - interval '1 second'
    ORDER BY w.ticket
    LIMIT 1
    FOR UPDATE;
    IF NOT FOUND OR split_part(sem_grant.row_key, chr(31), 2)::integer > head.permits
        OR pglock.sem_live(sem_grant.key) >= head.permits THEN
        RETURN false;
    END IF;
    token := pglock.fencing_token_next();
    UPDATE pglock.locks l
    SET owner = head.owner,
        fencing_token = greatest(token, l.fencing_token + 1),
        expires_at = clock_timestamp() + interval '1 second'
    WHERE l.key = sem_grant.row_key;
    UPDATE pglock.waiters w
    SET granted = sem_grant.row_key, seen_at = clock_timestamp()
    WHERE w.key = head.key AND w.ticket = head.ticket;
    UPDATE pglock.semaphores s
    SET permits = head.permits, acquired_at = clock_timestamp()
    WHERE s.key = sem_grant.key;
    PERFORM pg_notify('pglock_granted', head.owner);
    RETURN true;
END $$;

-- sem_acquire as in 000013, failing while a live fair waiter is queued on the semaphore.
CREATE OR REPLACE FUNCTION pglock.sem_acquire(key text, owner text, ttl_ms bigint, permits integer,
    OUT permit integer, OUT fencing_token bigint)
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF sem_acquire.key = '' OR length(sem_acquire.key) > 495 OR strpos(sem_acquire.key, chr(31)) > 0
        OR sem_acquire.owner = '' OR sem_acquire.ttl_ms < 1 OR sem_acquire.ttl_ms > 31536000000
        OR sem_acquire.permits < 1 OR sem_acquire.permits > 1000 THEN
        RAISE EXCEPTION 'pglock.sem_acquire: want a key of 1 to 495 characters without U+001F, an owner, a ttl_ms of 1 to 31536000000 (365 days) and permits of 1 to 1000, not a key of % characters, owner %, ttl_ms % and permits %',
            length(sem_acquire.key), quote_literal(sem_acquire.owner), sem_acquire.ttl_ms, sem_acquire.permits
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pglock.sem_lock(sem_acquire.key, sem_acquire.permits);
    IF pglock.sem_waiting(sem_acquire.key, NULL) > 0 THEN
        RETURN;
    END IF;
    SELECT t.permit, t.fencing_token INTO sem_acquire.permit, sem_acquire.fencing_token
    FROM pglock.sem_take(sem_acquire.key, sem_acquire.owner, sem_acquire.ttl_ms, sem_acquire.permits) t;
END $$;

-- lock_release as in 000014, handing a permit to the head of its semaphore's queue.
CREATE OR REPLACE FUNCTION pglock.lock_release(key text, owner text) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    sem text;
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
      AND l.expires_at > clock_timestamp()
    RETURNING l.semaphore INTO sem;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF sem IS NULL THEN
        IF EXISTS (SELECT FROM pglock.waiters w WHERE w.key = lock_release.key) THEN
            PERFORM pglock.queue_grant(lock_release.key);
        END IF;
    ELSIF EXISTS (SELECT FROM pglock.waiters w WHERE w.key = sem || chr(31)) THEN
        PERFORM pglock.sem_grant(sem, lock_release.key);
    END IF;
    RETURN true;
END $$;

-- lock_force_release as in 000014, handing a permit to the head of its semaphore's queue.
CREATE OR REPLACE FUNCTION pglock.lock_force_release(key text, OUT owner text, OUT fencing_token bigint,
    OUT expires_at timestamptz, OUT expires_in_us bigint, OUT wanted boolean)
LANGUAGE plpgsql VOLATILE STRICT
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    now timestamptz;
    sem text;
BEGIN
    IF lock_force_release.key = '' OR length(lock_force_release.key) > 500 THEN
        RAISE EXCEPTION 'pglock.lock_force_release: want a key of 1 to 500 characters, not %', length(lock_force_release.key)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT l.owner, l.fencing_token, l.expires_at, l.wanted_at IS NOT NULL, l.semaphore
    INTO lock_force_release.owner, lock_force_release.fencing_token,
         lock_force_release.expires_at, lock_force_release.wanted, sem
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
    IF sem IS NULL THEN
        IF EXISTS (SELECT FROM pglock.waiters w WHERE w.key = lock_force_release.key) THEN
            PERFORM pglock.queue_grant(lock_force_release.key);
        END IF;
    ELSIF EXISTS (SELECT FROM pglock.waiters w WHERE w.key = sem || chr(31)) THEN
        PERFORM pglock.sem_grant(sem, lock_force_release.key);
    END IF;
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
END $$;

-- queue_acquire as in 000014, with permits of 1 to 1000 for a semaphore's key (0: a
-- lock, as before): it takes a permit at once when no live fair waiter is queued on the
-- semaphore and fewer live holders than permits hold it (permit, fencing_token set,
-- ticket null), else queues the caller (ticket set). A new result column needs a DROP
-- (its grants go with it, given back below).
DROP FUNCTION IF EXISTS pglock.queue_acquire(text, text, bigint, integer);
CREATE FUNCTION pglock.queue_acquire(key text, owner text, ttl_ms bigint, permits integer,
    OUT fencing_token bigint, OUT ticket bigint, OUT permit integer)
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    locked boolean;
BEGIN
    IF queue_acquire.key = '' OR queue_acquire.owner = ''
        OR queue_acquire.ttl_ms < 1 OR queue_acquire.ttl_ms > 31536000000
        OR queue_acquire.permits < 0 OR queue_acquire.permits > 1000
        OR queue_acquire.permits = 0 AND length(queue_acquire.key) > 500
        OR queue_acquire.permits > 0 AND (length(queue_acquire.key) > 495 OR strpos(queue_acquire.key, chr(31)) > 0) THEN
        RAISE EXCEPTION 'pglock.queue_acquire: want a key of 1 to 500 characters (1 to 495 without U+001F for a semaphore), an owner, a ttl_ms of 1 to 31536000000 (365 days) and permits of 0 (a lock) to 1000, not a key of % characters, owner %L, ttl_ms % and permits %',
            length(queue_acquire.key), queue_acquire.owner, queue_acquire.ttl_ms, queue_acquire.permits
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF queue_acquire.permits > 0 THEN
        PERFORM pglock.sem_lock(queue_acquire.key, queue_acquire.permits);
        IF pglock.sem_waiting(queue_acquire.key, NULL) = 0 THEN
            SELECT t.permit, t.fencing_token INTO queue_acquire.permit, queue_acquire.fencing_token
            FROM pglock.sem_take(queue_acquire.key, queue_acquire.owner, queue_acquire.ttl_ms, queue_acquire.permits) t;
            IF fencing_token IS NOT NULL THEN
                RETURN;
            END IF;
        END IF;
        DELETE FROM pglock.waiters w
        WHERE w.key = queue_acquire.key || chr(31) AND w.seen_at < clock_timestamp() - interval '1 minute';
        INSERT INTO pglock.waiters AS w (key, owner, ttl_ms, permits, seen_at)
        VALUES (queue_acquire.key || chr(31), queue_acquire.owner, queue_acquire.ttl_ms, queue_acquire.permits,
                clock_timestamp())
        RETURNING w.ticket INTO ticket;
        RETURN;
    END IF;
    -- A lock, as in 000014. Twice when the key has no row yet: the caller that inserts
    -- it first has it, and the second pass waits for its commit on the row lock, so
    -- that its release finds this waiter queued.
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
    VALUES (queue_acquire.key, queue_acquire.owner, queue_acquire.ttl_ms, 0, clock_timestamp())
    RETURNING w.ticket INTO ticket;
END $$;

-- queue_poll as in 000014 for a lock's waiter; for a semaphore's (key is the
-- semaphore's, the ticket one that queue_acquire returned with permits > 0) it claims
-- the permit granted to it (permit set), or takes a free permit when fewer live waiters
-- are ahead of it than its N has free permits, or refreshes seen_at. A new result column
-- needs a DROP (its grants go with it, given back below).
DROP FUNCTION IF EXISTS pglock.queue_poll(text, bigint);
CREATE FUNCTION pglock.queue_poll(key text, ticket bigint,
    OUT fencing_token bigint, OUT queued boolean, OUT permit integer)
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    w pglock.waiters;
    prior text := current_setting('synchronous_commit');
    semaphore boolean;
    locked boolean := false;
BEGIN
    IF queue_poll.key = '' OR length(queue_poll.key) > 500 OR queue_poll.ticket < 1 THEN
        RAISE EXCEPTION 'pglock.queue_poll: want a key of 1 to 500 characters and a ticket above 0, not a key of % characters and ticket %',
            length(queue_poll.key), queue_poll.ticket
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    queued := false;
    semaphore := EXISTS (SELECT FROM pglock.waiters o
                         WHERE o.key = queue_poll.key || chr(31) AND o.ticket = queue_poll.ticket);
    IF semaphore THEN
        -- The semaphore's row before the waiter's (the lock order), and only when a take
        -- looks possible: not granted, and fewer live waiters ahead than free permits.
        SELECT * INTO w FROM pglock.waiters o
        WHERE o.key = queue_poll.key || chr(31) AND o.ticket = queue_poll.ticket;
        IF w.granted IS NULL AND pglock.sem_waiting(queue_poll.key, w.ticket)
                < w.permits - pglock.sem_live(queue_poll.key) THEN
            PERFORM FROM pglock.semaphores s WHERE s.key = queue_poll.key FOR UPDATE;
            locked := true;
        END IF;
    END IF;
    -- The heartbeat first: it row-locks the waiter's row, so that a grant under way
    -- (queue_grant's, sem_grant's FOR UPDATE) is seen here or comes after this call.
    PERFORM set_config('synchronous_commit', 'off', true);
    UPDATE pglock.waiters o SET seen_at = clock_timestamp()
    WHERE o.key = CASE WHEN semaphore THEN queue_poll.key || chr(31) ELSE queue_poll.key END
      AND o.ticket = queue_poll.ticket
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
            DELETE FROM pglock.waiters o WHERE o.key = w.key AND o.ticket = queue_poll.ticket;
            IF semaphore THEN
                permit := split_part(w.granted, chr(31), 2)::integer;
            END IF;
            PERFORM set_config('synchronous_commit',
                CASE WHEN prior IN ('off', 'local') THEN 'on' ELSE prior END, true);
            RETURN;
        END IF;
        -- The grant lapsed: the waiter waits again, from its place.
        UPDATE pglock.waiters o SET granted = NULL
        WHERE o.key = w.key AND o.ticket = queue_poll.ticket;
    END IF;
    queued := true;
    IF semaphore THEN
        -- A take, under the semaphore's row lock taken above; a lapsed grant's waiter
        -- takes at its next poll.
        IF NOT locked OR pglock.sem_waiting(queue_poll.key, w.ticket)
                >= w.permits - pglock.sem_live(queue_poll.key) THEN
            RETURN;
        END IF;
        SELECT t.permit, t.fencing_token INTO queue_poll.permit, queue_poll.fencing_token
        FROM pglock.sem_take(queue_poll.key, w.owner, w.ttl_ms, w.permits) t;
        IF fencing_token IS NOT NULL THEN
            DELETE FROM pglock.waiters o WHERE o.key = w.key AND o.ticket = queue_poll.ticket;
            queued := false;
            PERFORM set_config('synchronous_commit',
                CASE WHEN prior IN ('off', 'local') THEN 'on' ELSE prior END, true);
        END IF;
        RETURN;
    END IF;
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

-- queue_leave as in 000014, for a semaphore's waiter too (key the semaphore's): a
-- permit granted to it and not claimed goes to the next live head its N allows.
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
    SELECT * INTO w FROM pglock.waiters o
    WHERE o.key = queue_leave.key || chr(31) AND o.ticket = queue_leave.ticket;
    IF FOUND THEN
        -- A semaphore's waiter: its granted permit's row first (the lock order).
        IF w.granted IS NOT NULL THEN
            PERFORM FROM pglock.locks l WHERE l.key = w.granted FOR NO KEY UPDATE;
        END IF;
        DELETE FROM pglock.waiters o WHERE o.key = queue_leave.key || chr(31) AND o.ticket = queue_leave.ticket
        RETURNING * INTO w;
        IF NOT FOUND THEN
            RETURN false;
        END IF;
        IF w.granted IS NOT NULL THEN
            UPDATE pglock.locks l
            SET owner = NULL, expires_at = clock_timestamp()
            WHERE l.key = w.granted AND l.owner = w.owner AND l.expires_at > clock_timestamp();
            IF FOUND THEN
                PERFORM pglock.sem_grant(queue_leave.key, w.granted);
            END IF;
        END IF;
        RETURN true;
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

REVOKE ALL ON FUNCTION pglock.sem_lock(text, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION pglock.sem_live(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pglock.sem_waiting(text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION pglock.sem_take(text, text, bigint, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION pglock.sem_grant(text, text) FROM PUBLIC;
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
        EXECUTE format('GRANT EXECUTE ON FUNCTION pglock.sem_lock(text, integer), pglock.sem_live(text), '
            'pglock.sem_waiting(text, bigint), pglock.sem_take(text, text, bigint, integer), '
            'pglock.sem_grant(text, text), pglock.queue_acquire(text, text, bigint, integer), '
            'pglock.queue_poll(text, bigint) TO %s', r.grantee);
    END LOOP;
END $$;
