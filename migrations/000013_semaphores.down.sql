-- lock_held as 000011 left it; the semaphores' functions, table, index and column go.
-- A permit's row stays, a lock whose key holds U+001F.
DROP FUNCTION IF EXISTS pglock.sem_acquire(text, text, bigint, integer);
DROP FUNCTION IF EXISTS pglock.sem_want(text, integer);
DROP FUNCTION IF EXISTS pglock.sem_release(text, text);
DROP TABLE IF EXISTS pglock.semaphores;
DROP INDEX IF EXISTS pglock.locks_semaphore;
ALTER TABLE pglock.locks DROP COLUMN IF EXISTS semaphore;

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
