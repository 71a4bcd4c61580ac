-- lock_prune as in 000005 (with 000006's attributes), deleting as well what the fair
-- queues and the semaphores leave behind: the rows of waiters whose clients died, and
-- the rows of semaphores that have no permit row left. It still returns the lock rows
-- it deleted, and deletes nothing of either when another prune is running.
CREATE OR REPLACE FUNCTION pglock.lock_prune(older_than_ms bigint, max_rows integer) RETURNS bigint
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    doomed text[];
    top bigint;
    seq_last bigint;
    seq_called boolean;
    deleted bigint;
BEGIN
    IF lock_prune.older_than_ms < 0 OR lock_prune.max_rows < 1 THEN
        RAISE EXCEPTION 'pglock.lock_prune: older_than_ms must be >= 0 and max_rows >= 1, not % and %',
            lock_prune.older_than_ms, lock_prune.max_rows
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT pg_try_advisory_xact_lock(8099561680514281586) THEN
        RETURN 0;
    END IF;
    SELECT array_agg(d.key), max(d.fencing_token) INTO doomed, top
    FROM (
        SELECT l.key, l.fencing_token FROM pglock.locks l
        WHERE (l.owner IS NULL OR l.expires_at <= clock_timestamp())
          AND l.expires_at < clock_timestamp() - lock_prune.older_than_ms * interval '1 millisecond'
        LIMIT lock_prune.max_rows
        FOR UPDATE SKIP LOCKED) d;
    deleted := 0;
    IF doomed IS NOT NULL THEN
        SELECT s.last_value, s.is_called INTO seq_last, seq_called FROM pglock.fencing_token_seq s;
        -- The next nextval is last_value + increment once called, last_value before.
        IF seq_last < top OR (seq_last = top AND NOT seq_called) THEN
            PERFORM setval('pglock.fencing_token_seq', top);
        END IF;
        -- The rows are locked by this transaction: nobody changed them since.
        DELETE FROM pglock.locks l WHERE l.key = ANY (doomed);
        GET DIAGNOSTICS deleted = ROW_COUNT;
    END IF;
    -- What the queues and the semaphores leave behind, as many rows of each at most:
    -- waiters not polled for a minute (their clients died; queue_acquire deletes them
    -- too, but only at their key's next queueing, and queue_poll has them queue again),
    -- and semaphores none of whose permits has a row left (sem_lock inserts the row
    -- again at the next acquisition; the row is the semaphore's mutex and its last N).
    DELETE FROM pglock.waiters w
    WHERE (w.key, w.ticket) IN (
        SELECT o.key, o.ticket FROM pglock.waiters o
        WHERE o.seen_at < clock_timestamp() - interval '1 minute'
        LIMIT lock_prune.max_rows
        FOR UPDATE SKIP LOCKED);
    DELETE FROM pglock.semaphores s
    WHERE s.key IN (
        SELECT e.key FROM pglock.semaphores e
        WHERE NOT EXISTS (SELECT FROM pglock.locks l WHERE l.semaphore = e.key)
        LIMIT lock_prune.max_rows
        FOR UPDATE SKIP LOCKED);
    RETURN deleted;
END $$;
