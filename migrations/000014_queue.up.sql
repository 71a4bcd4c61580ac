-- The fair queue (Fair, queue.go): waiters served in the order they arrived, on any
-- instance, each handover one statement.
--
-- A fair waiter that finds its key held is queued in pglock.waiters with a ticket from
-- a sequence, the order of arrival across the fleet. A release (lock_release, and so
-- lock_release_async; lock_force_release; a queued waiter leaving with a grant) of a
-- key that has a live waiter hands it in the same call to the head of the queue (the
-- smallest ticket, live, not granted): the lock row gets the head's owner, a new token
-- and a short lease of Q = 1 s (a grant), the waiter's row the granted key, and the
-- head's client is notified on pglock_granted with the head's owner as the payload.
-- The head claims it with queue_poll, which extends the lease to the waiter's ttl
-- (durable) and deletes its row. A waiter is live while its client polls it
-- (queue_poll refreshes seen_at every Q/4): one whose client died, was paused or gave
-- up without a word is skipped once Q has passed since its last poll; a grant nobody
-- claims lapses after Q, and the next live head takes the key at its next poll. So a
-- dead or paused waiter stalls the queue for about Q + Q/4 at most. A paused waiter
-- that comes back keeps its place; a row not polled for a minute is deleted by the
-- next queue_acquire of its key, and its waiter, if it comes back, queues again.
--
-- A key with live waiters is theirs: lock_acquire (and lock_acquire_or_want, which
-- calls it) fails while one is queued, even when the key is free, so that a caller
-- outside the queue cannot barge past it. A release of a key without waiters costs one
-- more probe of the waiters' primary key, on an empty index when nobody waits.
--
-- Every function keeps what 000011 and 000012 promise: its arguments checked (22023),
-- a win or a claim durable, tokens drawn after the row lock and never below their
-- timeline's floor. The row lock of a key's lock row orders what changes its queue:
-- queue_acquire, queue_leave and the head's take hold it (FOR NO KEY UPDATE, which a
-- fenced transaction's FOR KEY SHARE does not hold up), and a release or a
-- force-release holds it already when it hands over. A heartbeat writes no lock row
-- and flushes nothing (synchronous_commit off: a lost one only costs the waiter its
-- turn until its next poll); a claim or a take in the same call puts back the setting
-- it found, raised to on from off or local.

CREATE SEQUENCE IF NOT EXISTS pglock.waiter_ticket_seq;

CREATE TABLE IF NOT EXISTS pglock.waiters (
    key     text        NOT NULL,
    ticket  bigint      NOT NULL DEFAULT nextval('pglock.waiter_ticket_seq'),
    owner   text        NOT NULL, -- the owner the key is granted to
    ttl_ms  bigint      NOT NULL, -- the lease a claim gives
    permits integer     NOT NULL DEFAULT 0, -- 0: a lock
    seen_at timestamptz NOT NULL, -- the last poll, on the database clock
    granted text,                 -- the lock row granted, null while waiting
    PRIMARY KEY (key, ticket)
);

REVOKE ALL ON TABLE pglock.waiters FROM PUBLIC;
REVOKE ALL ON SEQUENCE pglock.waiter_ticket_seq FROM PUBLIC;

-- fencing_token_next draws a token as 000012's lock_acquire did: at least its
-- timeline's floor. Like every function of the schema (000006), it runs as the schema's
-- owner with its search_path pinned; the functions below call it.
CREATE OR REPLACE FUNCTION pglock.fencing_token_next() RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    token bigint;
    floor bigint;
BEGIN
    token := nextval('pglock.fencing_token_seq');
    floor := (('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1) << 40;
    IF token <= floor THEN
        PERFORM pg_advisory_xact_lock(2736408391470914537);
        token := nextval('pglock.fencing_token_seq');
        IF token <= floor THEN
            token := setval('pglock.fencing_token_seq', floor + 1);
        END IF;
    END IF;
    RETURN token;
END $$;

-- lock_take is 000012's lock_acquire after its argument check: it takes a free key,
-- durably, or returns null; its callers check the arguments first.
CREATE OR REPLACE FUNCTION pglock.lock_take(key text, owner text, ttl_ms bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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

-- queue_grant hands key, free, to the head of its queue: the caller holds key's lock
-- row locked. It reports whether there was a live head. The grant itself is not
-- flushed: it promises nothing until its claim, whose flush covers it.
CREATE OR REPLACE FUNCTION pglock.queue_grant(key text) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    head pglock.waiters;
    token bigint;
BEGIN
    SELECT * INTO head FROM pglock.waiters w
    WHERE w.key = queue_grant.key AND w.granted IS NULL
      AND w.seen_at > clock_timestamp() - interval '1 second'
    ORDER BY w.ticket
    LIMIT 1
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    token := pglock.fencing_token_next();
    UPDATE pglock.locks l
    SET owner = head.owner,
        fencing_token = greatest(token, l.fencing_token + 1),
        expires_at = clock_timestamp() + interval '1 second'
    WHERE l.key = queue_grant.key;
    UPDATE pglock.waiters w
    SET granted = queue_grant.key, seen_at = clock_timestamp()
    WHERE w.key = head.key AND w.ticket = head.ticket;
    PERFORM pg_notify('pglock_granted', head.owner);
    RETURN true;
END $$;

-- lock_acquire as in 000012, failing while a live fair waiter is queued on the key.
CREATE OR REPLACE FUNCTION pglock.lock_acquire(key text, owner text, ttl_ms bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF lock_acquire.key = '' OR length(lock_acquire.key) > 500 OR lock_acquire.owner = ''
        OR lock_acquire.ttl_ms < 1 OR lock_acquire.ttl_ms > 31536000000 THEN
        RAISE EXCEPTION 'pglock.lock_acquire: want a key of 1 to 500 characters, an owner and a ttl_ms of 1 to 31536000000 (365 days), not a key of % characters, owner %L and ttl_ms %',
            length(lock_acquire.key), lock_acquire.owner, lock_acquire.ttl_ms
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT FROM pglock.waiters w
               WHERE w.key = lock_acquire.key AND w.granted IS NULL
                 AND w.seen_at > clock_timestamp() - interval '1 second') THEN
        RETURN NULL;
    END IF;
    RETURN pglock.lock_take(lock_acquire.key, lock_acquire.owner, lock_acquire.ttl_ms);
END $$;

-- lock_release as in 000011, handing the key to the head of its queue.
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

-- lock_force_release as in 000011, handing the key to the head of its queue.
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

-- queue_acquire takes key for owner at once, as lock_acquire does, when it is free
-- and no live waiter is queued on it (fencing_token, ticket null); otherwise it queues
-- the caller (ticket, fencing_token null), who then calls queue_poll until it claims
-- the key, or queue_leave. permits is 0: a lock.
-- Dropped first: 000017 widens its result, and sql/pglock.sql runs this again over that.
DROP FUNCTION IF EXISTS pglock.queue_acquire(text, text, bigint, integer);
CREATE OR REPLACE FUNCTION pglock.queue_acquire(key text, owner text, ttl_ms bigint, permits integer,
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

-- queue_poll is a queued waiter's poll. A waiter granted the key claims it: its lease
-- becomes its ttl from now, durably, its row is deleted, and the token is returned. The
-- head of the live queue takes the key when it is free (its holder expired, a grant
-- lapsed). Otherwise it refreshes seen_at, unflushed, and returns a null token. queued
-- is false when it returns a token, or when the ticket is not in the queue (deleted
-- after a minute without a poll, or lost in a crash): queue again.
DROP FUNCTION IF EXISTS pglock.queue_poll(text, bigint); -- as queue_acquire
CREATE OR REPLACE FUNCTION pglock.queue_poll(key text, ticket bigint, OUT fencing_token bigint, OUT queued boolean)
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

-- queue_leave takes a waiter out of the queue, and reports whether it was in it. A
-- grant it had not claimed goes to the next live head.
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

REVOKE ALL ON FUNCTION pglock.fencing_token_next() FROM PUBLIC;
REVOKE ALL ON FUNCTION pglock.lock_take(text, text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION pglock.queue_grant(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pglock.queue_acquire(text, text, bigint, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION pglock.queue_poll(text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION pglock.queue_leave(text, bigint) FROM PUBLIC;
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
        EXECUTE format('GRANT EXECUTE ON FUNCTION pglock.fencing_token_next() TO %s', r.grantee);
        EXECUTE format('GRANT EXECUTE ON FUNCTION pglock.lock_take(text, text, bigint) TO %s', r.grantee);
        EXECUTE format('GRANT EXECUTE ON FUNCTION pglock.queue_grant(text) TO %s', r.grantee);
        EXECUTE format('GRANT EXECUTE ON FUNCTION pglock.queue_acquire(text, text, bigint, integer) TO %s', r.grantee);
        EXECUTE format('GRANT EXECUTE ON FUNCTION pglock.queue_poll(text, bigint) TO %s', r.grantee);
        EXECUTE format('GRANT EXECUTE ON FUNCTION pglock.queue_leave(text, bigint) TO %s', r.grantee);
    END LOOP;
END $$;
