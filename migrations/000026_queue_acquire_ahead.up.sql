-- queue_acquire tells a waiter it queues how many live waiters ahead of it wait for a
-- grant (ahead, up to 8), as queue_poll does since 000024. While a client's listener
-- starts (its first connection: a second or more on a loaded machine), the waiters
-- nearest the head poll every few milliseconds (queue.go's nearPoll), since no grant
-- can wake them; but a waiter learnt its place only at its first poll, so the first
-- grant of a crowd's start went to a waiter that polled every 20-40 ms, the pace of the
-- first waiter of each client (BENCHMARKS.md, session 12). A new result column needs a
-- DROP (its grants go with it, given back below as 000021 gives them); the columns
-- before it are unchanged, for a client of schema 25 during a rolling upgrade.

DROP FUNCTION IF EXISTS pglock.queue_acquire(text, text, bigint, integer);
CREATE FUNCTION pglock.queue_acquire(key text, owner text, ttl_ms bigint, permits integer,
    OUT fencing_token bigint, OUT ticket bigint, OUT permit integer, OUT ahead integer)
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
        PERFORM set_config('synchronous_commit', 'off', true); -- queued: see 000020
        DELETE FROM pglock.waiters w
        WHERE w.key = queue_acquire.key || chr(31) AND w.seen_at < clock_timestamp() - interval '1 minute';
        INSERT INTO pglock.waiters AS w (key, owner, ttl_ms, permits, seen_at)
        VALUES (queue_acquire.key || chr(31), queue_acquire.owner, queue_acquire.ttl_ms, queue_acquire.permits,
                clock_timestamp())
        RETURNING w.ticket INTO ticket;
        ahead := (SELECT count(*)::integer
                 FROM (SELECT FROM pglock.waiters o
                       WHERE o.key = queue_acquire.key || chr(31) AND o.ticket < queue_acquire.ticket AND o.granted IS NULL
                         AND o.seen_at > clock_timestamp() - interval '1 second'
                       LIMIT 8) a);
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
    PERFORM set_config('synchronous_commit', 'off', true); -- queued: see 000020
    DELETE FROM pglock.waiters w
    WHERE w.key = queue_acquire.key AND w.seen_at < clock_timestamp() - interval '1 minute';
    INSERT INTO pglock.waiters AS w (key, owner, ttl_ms, permits, seen_at)
    VALUES (queue_acquire.key, queue_acquire.owner, queue_acquire.ttl_ms, 0, clock_timestamp())
    RETURNING w.ticket INTO ticket;
    ahead := (SELECT count(*)::integer
             FROM (SELECT FROM pglock.waiters o
                   WHERE o.key = queue_acquire.key AND o.ticket < queue_acquire.ticket AND o.granted IS NULL
                     AND o.seen_at > clock_timestamp() - interval '1 second'
                   LIMIT 8) a);
END $$;

REVOKE ALL ON FUNCTION pglock.queue_acquire(text, text, bigint, integer) FROM PUBLIC;
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
        EXECUTE format('GRANT EXECUTE ON FUNCTION pglock.queue_acquire(text, text, bigint, integer) TO %s', r.grantee);
    END LOOP;
END $$;
