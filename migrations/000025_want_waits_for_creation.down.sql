-- lock_acquire_or_want as 000011 defined it: a new key's row being created is no row to
-- mark (-1).
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
