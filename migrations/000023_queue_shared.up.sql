-- A crowd's fair waiters queue side by side. queue_acquire (000020) row-locked the
-- key's lock row FOR NO KEY UPDATE until its commit, so that a release, which updates
-- that row, could not miss a waiter queueing while it ran. That lock also queued the
-- waiters of a crowd one behind the other, and the release behind all of them: with
-- 100 fair waiters over 20 clients starting at once, listeners up, the handover p99
-- was 26-56 ms against 15-29 ms without the queue, 13-36 ms with this migration
-- (BenchmarkCrowd/20x5/start-warm, BENCHMARKS.md).
--
-- A transaction-scoped advisory lock on the key's 64-bit hash orders the queue now:
-- queue_acquire takes it shared (waiters queueing at once do not wait for each other)
-- and every function that hands the key over or takes it for the head takes it
-- exclusive, first, before the lock row: lock_release (so lock_release_async and
-- lock_release_many), lock_force_release, queue_leave, and queue_poll's take of a free
-- key. So a release still waits for the waiters queueing when it comes, and sees them;
-- a waiter that comes after the release asked for the lock waits for it (PostgreSQL's
-- lock queue lets no shared request pass a waiting exclusive one), then finds the key
-- granted or free. Two keys whose hashes collide only wait for each other. The order
-- is the same everywhere (the advisory lock, then the lock row), so no two of these
-- wait for each other in a cycle. A semaphore's queue keeps its own order, its row
-- (sem_lock).

CREATE OR REPLACE FUNCTION pglock.queue_acquire(key text, owner text, ttl_ms bigint, permits integer,
    OUT fencing_token bigint, OUT ticket bigint, OUT permit integer)
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
        PERFORM set_config('synchronous_commit', 'off', true); -- queued: see above
        DELETE FROM pglock.waiters w
        WHERE w.key = queue_acquire.key || chr(31) AND w.seen_at < clock_timestamp() - interval '1 minute';
        INSERT INTO pglock.waiters AS w (key, owner, ttl_ms, permits, seen_at)
        VALUES (queue_acquire.key || chr(31), queue_acquire.owner, queue_acquire.ttl_ms, queue_acquire.permits,
                clock_timestamp())
        RETURNING w.ticket INTO ticket;
        RETURN;
    END IF;
    -- A lock: beside the other waiters of the key that queue at once, ahead of a
    -- release (see above).
    PERFORM pg_advisory_xact_lock_shared(hashtextextended(queue_acquire.key, 1885826161));
    IF NOT EXISTS (SELECT FROM pglock.waiters w
                   WHERE w.key = queue_acquire.key AND w.granted IS NULL
                     AND w.seen_at > clock_timestamp() - interval '1 second') THEN
        fencing_token := pglock.lock_take(queue_acquire.key, queue_acquire.owner, queue_acquire.ttl_ms);
        IF fencing_token IS NOT NULL THEN
            RETURN;
        END IF;
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true); -- queued: see above
    DELETE FROM pglock.waiters w
    WHERE w.key = queue_acquire.key AND w.seen_at < clock_timestamp() - interval '1 minute';
    INSERT INTO pglock.waiters AS w (key, owner, ttl_ms, permits, seen_at)
    VALUES (queue_acquire.key, queue_acquire.owner, queue_acquire.ttl_ms, 0, clock_timestamp())
    RETURNING w.ticket INTO ticket;
END $$;

CREATE OR REPLACE FUNCTION pglock.queue_poll(key text, ticket bigint,
    OUT fencing_token bigint, OUT queued boolean, OUT permit integer, OUT head boolean)
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
    head := NOT EXISTS (SELECT FROM pglock.waiters o
                        WHERE o.key = w.key AND o.ticket < w.ticket AND o.granted IS NULL
                          AND o.seen_at > clock_timestamp() - interval '1 second');
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
    -- Free: the head of the live queue takes it, once every waiter queueing now is in
    -- the queue (see above), under the row lock.
    PERFORM pg_advisory_xact_lock(hashtextextended(queue_poll.key, 1885826161)); -- the queue's order: see above
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
    PERFORM pg_advisory_xact_lock(hashtextextended(queue_leave.key, 1885826161)); -- the queue's order: see above
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
    PERFORM pg_advisory_xact_lock(hashtextextended(lock_release.key, 1885826161)); -- the queue's order: see above
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
    PERFORM pg_advisory_xact_lock(hashtextextended(lock_force_release.key, 1885826161)); -- the queue's order: see above
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
