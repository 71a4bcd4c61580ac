-- lock_acquire_or_want as in 000011, waiting for a new key's row that another
-- transaction is creating before it marks the key. Since 000024, lock_take refuses a
-- new key at once while another transaction creates its row (a transaction-scoped
-- advisory lock on the key's hash, seed 1885826162), where it used to wait inside the
-- INSERT for that transaction's end. A waiter's attempt then found no row to mark and
-- returned -1 (free: try again), and each client's waiter tried again 1, 2, 4 ms later
-- until the first holder's durable commit landed: 41 attempts before the first
-- acquisition of a crowd of 20 clients on a loaded machine, where one per client is the
-- rule. A waiter that lost waits for the creation instead (a shared lock on the same
-- hash: it holds nothing else by then, and the creator never waits on it), then marks
-- the row, so that its release notifies; if the creation rolled back, the key is free
-- (-1). TryAcquire (lock_acquire) and the fair queue's queue_acquire still do not wait.
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
    IF NOT EXISTS (SELECT FROM pglock.locks l WHERE l.key = lock_acquire_or_want.key) THEN
        PERFORM pg_advisory_xact_lock_shared(hashtextextended(lock_acquire_or_want.key, 1885826162));
    END IF;
    PERFORM FROM pglock.locks l WHERE l.key = lock_acquire_or_want.key FOR NO KEY UPDATE;
    IF pglock.lock_want(lock_acquire_or_want.key) THEN
        RETURN 0;
    END IF;
    RETURN -1;
END $$;
