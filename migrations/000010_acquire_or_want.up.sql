-- A waiter's attempt that marks the key in the same call, and a lock_want that marks a
-- key whose acquisition committed while it ran.

-- lock_acquire_or_want is a waiter's attempt: lock_acquire, and when the key turns out
-- held, lock_want in the same call. A waiter that lost used to mark the key with a
-- second round trip; in a crowd of clients on a busy server, that round trip often came
-- after the winner had released the key again, found it free, and cost another attempt
-- for a release whose wake-up was on its way. Marking in the losing call itself marks
-- the key while it is held, so that its release notifies, and needs no second trip.
--
-- It returns the new fencing token when it took the key; 0 when the key is held and
-- marked wanted (its release will notify pglock_released); -1 when neither (the key was
-- released, or changed hands unmarked, in between): try again now. A losing call writes
-- the mark, once per holding, as lock_want does, and a row lock when it has to wait for
-- an acquisition in flight; neither is flushed. Only for a caller that LISTENs on
-- pglock_released: a mark nobody hears costs the release a NOTIFY.
CREATE OR REPLACE FUNCTION pglock.lock_acquire_or_want(key text, owner text, ttl_ms bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    token bigint;
BEGIN
    token := pglock.lock_acquire(lock_acquire_or_want.key, lock_acquire_or_want.owner, lock_acquire_or_want.ttl_ms);
    IF token IS NOT NULL OR lock_acquire_or_want.ttl_ms <= 0 THEN
        RETURN token;
    END IF;
    -- Lost, and nothing written so far. What follows writes only the mark, a hint: a
    -- crash that loses it wakes every listener anyway (they reconnect). No flush for it.
    PERFORM set_config('synchronous_commit', 'off', true);
    IF pglock.lock_want(lock_acquire_or_want.key) THEN
        RETURN 0;
    END IF;
    -- Lost, yet the key looks free: another caller's acquisition has the row locked and
    -- has not committed yet (its flush takes a while on a busy server). Wait for it, then
    -- mark the key it took. Without the wait, a crowd's losers took the key for free,
    -- tried again, and lost again, several times a handover. FOR NO KEY UPDATE, not a
    -- shared lock: the losers of one handover then wait in turn, each holding the row
    -- alone, rather than pile up as one MultiXact of shared lockers per loser; it does
    -- not conflict with a fenced transaction's FOR KEY SHARE.
    PERFORM FROM pglock.locks l WHERE l.key = lock_acquire_or_want.key FOR NO KEY UPDATE;
    IF pglock.lock_want(lock_acquire_or_want.key) THEN
        RETURN 0;
    END IF;
    RETURN -1;
END $$;

-- lock_want marks key as wanted and reports whether it is held live and marked (see
-- 000003), now also when a holder's acquisition committed while the UPDATE ran: the
-- UPDATE reads the row as its snapshot saw it, and a row released at that snapshot is
-- skipped, not waited for, even though an acquisition holds it by the time the SELECT
-- looks. The old lock_want then answered false ("try again now") for a key that was
-- held, and the waiter tried once more for nothing: in crowds, for about half of the
-- losers of every handover. Such a key is marked on a second pass, with a snapshot
-- taken after that acquisition. PL/pgSQL, so that each statement takes its own snapshot
-- and keeps its plan.
CREATE OR REPLACE FUNCTION pglock.lock_want(key text) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    held boolean;
    marked boolean;
BEGIN
    FOR pass IN 1..2 LOOP
        UPDATE pglock.locks l
        SET wanted_at = clock_timestamp()
        WHERE l.key = lock_want.key AND l.owner IS NOT NULL
          AND l.expires_at > clock_timestamp() AND l.wanted_at IS NULL;
        IF FOUND THEN
            RETURN true;
        END IF;
        SELECT l.owner IS NOT NULL AND l.expires_at > clock_timestamp(), l.wanted_at IS NOT NULL
        INTO held, marked
        FROM pglock.locks l
        WHERE l.key = lock_want.key;
        IF NOT coalesce(held, false) THEN
            RETURN false;
        END IF;
        IF marked THEN
            RETURN true;
        END IF;
    END LOOP;
    RETURN false;
END $$;

-- As 000006 asks of a new function: no EXECUTE for PUBLIC; the roles that may acquire
-- may wait this way too.
REVOKE ALL ON FUNCTION pglock.lock_acquire_or_want(text, text, bigint) FROM PUBLIC;
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
        EXECUTE format('GRANT EXECUTE ON FUNCTION pglock.lock_acquire_or_want(text, text, bigint) TO %s', r.grantee);
    END LOOP;
END $$;
