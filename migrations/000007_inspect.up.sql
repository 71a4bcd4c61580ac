-- Reading the locks and breaking one by hand (Client.Locks, Client.ForceRelease), as
-- functions like every other: an operator's role needs EXECUTE on them, never SELECT
-- or UPDATE on pglock.locks. SECURITY DEFINER with search_path pinned, as 000006 sets
-- for the others: every pglock object is qualified, every other name is pg_catalog's.

-- lock_list returns the locks whose key starts with prefix ('' = all), held or not
-- (rows stay after their release until lock_prune deletes them), in no particular
-- order (Client.Locks sorts them: the sort costs the database more CPU than the client).
-- One statement, one clock_timestamp() for every row, returned as read_at: held says
-- whether a live holder had the key at read_at, on the database clock, and
-- expires_at - read_at is how long its lease had left; wanted whether a waiter marked
-- the held key (a mark on a key nobody holds is stale and not reported).
-- starts_with treats % and _ as the characters they are. It reads only and takes no
-- row lock: it waits for nothing. Each call reads every row of the table (the key's
-- index is in the database's collation, which a prefix cannot use in general).
-- Dropped first: 000015 adds a result column, which CREATE OR REPLACE cannot take
-- away when sql/pglock.sql runs again (the grants below are given back).
DROP FUNCTION IF EXISTS pglock.lock_list(text);
CREATE FUNCTION pglock.lock_list(prefix text)
RETURNS TABLE (key text, owner text, fencing_token bigint, expires_at timestamptz,
               held boolean, wanted boolean, read_at timestamptz)
LANGUAGE sql VOLATILE STRICT
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT l.key, l.owner, l.fencing_token, l.expires_at,
           l.owner IS NOT NULL AND l.expires_at > n.now,
           l.owner IS NOT NULL AND l.expires_at > n.now AND l.wanted_at IS NOT NULL,
           n.now
    FROM pglock.locks l, (SELECT clock_timestamp() AS now) n
    WHERE starts_with(l.key, lock_list.prefix)
$$;

-- lock_force_release breaks the lock on key whoever holds it, and returns what it
-- broke: the owner, the token, the lease's end and how far it was, and whether a
-- waiter had marked it; a row of nulls when no live holder has key.
--
-- It row-locks the row FOR UPDATE first, which waits: for an acquisition, a renewal
-- or a release in flight, and for an open fenced transaction, whose FOR KEY SHARE
-- (lock_held) conflicts with FOR UPDATE but not with a plain UPDATE of non-key
-- columns. So a fenced write either committed before the break (the old holder's
-- legitimate write) or runs after it and writes nothing, and no takeover happens
-- while a fenced transaction is open. Once it has the row it checks the latest
-- version on the clock: still held live, or nothing to break.
--
-- The break is a release on the owner's behalf: owner NULL, expires_at now (the end
-- of the lease, from which lock_prune counts), the row's token kept as the floor of
-- the next one, so the next acquisition gets a greater token. The holder's next
-- renewal finds no owner and is refused; lock_held answers false at once. A row a
-- waiter marked is unmarked and notified on pglock_released, as lock_release does.
CREATE OR REPLACE FUNCTION pglock.lock_force_release(key text, OUT owner text, OUT fencing_token bigint,
    OUT expires_at timestamptz, OUT expires_in_us bigint, OUT wanted boolean)
LANGUAGE plpgsql VOLATILE STRICT
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    now timestamptz;
BEGIN
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
END $$;

-- As 000006 asks of a migration that adds a function: EXECUTE revoked from PUBLIC,
-- granted to the roles that may execute lock_acquire.
REVOKE ALL ON FUNCTION pglock.lock_list(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pglock.lock_force_release(text) FROM PUBLIC;

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
        EXECUTE format('GRANT EXECUTE ON FUNCTION pglock.lock_list(text) TO %s', r.grantee);
        EXECUTE format('GRANT EXECUTE ON FUNCTION pglock.lock_force_release(text) TO %s', r.grantee);
    END LOOP;
END $$;
