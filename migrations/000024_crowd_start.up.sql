-- A crowd's start on a key (many waiters at once), two changes.
--
-- lock_take as in 000014 (SECURITY INVOKER since 000022), refusing a new key at once
-- while another transaction is creating its row, instead of waiting for that
-- transaction's end: the INSERT ... ON CONFLICT of a row that another uncommitted
-- insert holds waits for it, and then finds the key held anyway. At a crowd's start on
-- a new key, every waiter but the first waited for the first's durable commit inside
-- queue_acquire, under the queue's shared advisory lock (000023), then all inserted
-- their waiter rows at once; the first holder's release waited for all of that:
-- 100-400 ms on a start of 100 fair waiters over 20 clients whose listeners were
-- connecting (BENCHMARKS.md). A transaction-scoped advisory lock on the key's hash
-- (a seed of its own, apart from the queue's) marks the creation; a transaction that
-- does not get it returns null, as for a held key. Two new keys whose hashes collide
-- while both are being created: one is refused once, and its caller tries again.

CREATE OR REPLACE FUNCTION pglock.lock_take(key text, owner text, ttl_ms bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE STRICT SECURITY INVOKER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    token bigint;
    inserted boolean := false;
BEGIN
    PERFORM FROM pglock.locks l
    WHERE l.key = lock_take.key AND (l.owner IS NULL OR l.expires_at <= clock_timestamp())
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        IF EXISTS (SELECT FROM pglock.locks l WHERE l.key = lock_take.key) THEN
            RETURN NULL;
        END IF;
        -- A new key: another transaction creating its row now holds it (see above).
        IF NOT pg_try_advisory_xact_lock(hashtextextended(lock_take.key, 1885826162)) THEN
            RETURN NULL;
        END IF;
        INSERT INTO pglock.locks AS l (key, owner, fencing_token, expires_at)
        VALUES (lock_take.key, lock_take.owner, 1,
                clock_timestamp() + lock_take.ttl_ms * interval '1 millisecond')
        ON CONFLICT ON CONSTRAINT locks_pkey DO NOTHING;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        inserted := true;
    END IF;
    token := pglock.fencing_token_next();
    -- A new row's placeholder token (1) is no floor; a free row's token is, for a
    -- sequence that went back (a restore, a failover within one timeline's range).
    UPDATE pglock.locks l
    SET owner = lock_take.owner,
        fencing_token = CASE WHEN inserted THEN token ELSE greatest(token, l.fencing_token + 1) END,
        expires_at = clock_timestamp() + lock_take.ttl_ms * interval '1 millisecond'
    WHERE l.key = lock_take.key
    RETURNING l.fencing_token INTO token;
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    RETURN token;
END $$;

-- queue_poll as in 000023, telling a waiter that stays queued how many live waiters
-- ahead of it wait for a grant (ahead, counted up to 8; head is ahead = 0). While a
-- client's listener starts (its first connection, a second or more on a loaded machine),
-- no grant can wake its waiters: they poll. With head alone, only the waiter a poll had
-- called the head polled fast, and the next one learned that it was next at its own
-- poll, 20-40 ms later: the start of a crowd of 100 fair waiters over 20 clients had a
-- handover p99 of 104-142 ms against 29-105 ms for plain waiters (BENCHMARKS.md). The
-- few waiters next in line now poll the faster the nearer they are (queue.go), so the
-- next one already polls fast when the key is granted to it. A new result column needs a
-- DROP (its grants go with it, given back below as 000021 gives them); head stays, for
-- a client of schema 23 during a rolling upgrade.
DROP FUNCTION IF EXISTS pglock.queue_poll(text, bigint);
CREATE FUNCTION pglock.queue_poll(key text, ticket bigint,
    OUT fencing_token bigint, OUT queued boolean, OUT permit integer, OUT head boolean, OUT ahead integer)
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
    SELECT count(*)::integer INTO ahead
    FROM (SELECT FROM pglock.waiters o
          WHERE o.key = w.key AND o.ticket < w.ticket AND o.granted IS NULL
            AND o.seen_at > clock_timestamp() - interval '1 second'
          LIMIT 8) a;
    head := ahead = 0;
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
        EXECUTE format('GRANT EXECUTE ON FUNCTION pglock.queue_poll(text, bigint) TO %s', r.grantee);
    END LOOP;
END $$;
