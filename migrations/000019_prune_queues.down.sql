-- lock_prune as 000005 defined it, with 000006's attributes: lock rows only.
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
    IF doomed IS NULL THEN
        RETURN 0;
    END IF;
    SELECT s.last_value, s.is_called INTO seq_last, seq_called FROM pglock.fencing_token_seq s;
    -- The next nextval is last_value + increment once called, last_value before.
    IF seq_last < top OR (seq_last = top AND NOT seq_called) THEN
        PERFORM setval('pglock.fencing_token_seq', top);
    END IF;
    -- The rows are locked by this transaction: nobody changed them since.
    DELETE FROM pglock.locks l WHERE l.key = ANY (doomed);
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN deleted;
END $$;
