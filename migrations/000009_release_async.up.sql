-- lock_release_async is lock_release whose transaction commits without waiting for its
-- WAL to reach the disk (or a synchronous standby). pglock's stores release with it, each
-- release a transaction of its own; lock_release stays durable for callers that release
-- inside a transaction of theirs, whose other writes must not lose their durability.
--
-- Why a release may skip the flush: an acquisition must survive a crash (its token and
-- its holder), and so must a renewal (a lost one would move the expiry back under a
-- holder that believes it still has the key). A release that a crash loses only brings
-- the row back as it was: held by an owner that has moved on, until the expiry it had.
-- Nobody holds the key twice, no token changes, and the next holder waits at most one
-- ttl. The WAL is one sequence, so any later durable commit (the next acquisition of the
-- key above all) flushes the release's record first: no acquisition survives a crash
-- that lost the release before it. A marked row's NOTIFY is sent at the commit, as
-- before; a waiter it wakes acquires durably.
--
-- set_config(..., true) lasts until the transaction ends: called inside a transaction of
-- the caller's, it would make that whole transaction's commit asynchronous. Call it as a
-- statement of its own.
CREATE OR REPLACE FUNCTION pglock.lock_release_async(key text, owner text) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    RETURN pglock.lock_release(lock_release_async.key, lock_release_async.owner);
END $$;

-- As 000006 asks of a new function: no EXECUTE for PUBLIC; the roles that may acquire
-- may release this way too.
REVOKE ALL ON FUNCTION pglock.lock_release_async(text, text) FROM PUBLIC;
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
        EXECUTE format('GRANT EXECUTE ON FUNCTION pglock.lock_release_async(text, text) TO %s', r.grantee);
    END LOOP;
END $$;
