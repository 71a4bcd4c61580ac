-- Back to lock_list as 000007 defined it (without acquired_at and ttl_ms), no triggers, no column.
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
REVOKE ALL ON FUNCTION pglock.lock_list(text) FROM PUBLIC;

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
    END LOOP;
END $$;

DROP TRIGGER IF EXISTS locks_acquired_at_update ON pglock.locks;
DROP TRIGGER IF EXISTS locks_acquired_at_insert ON pglock.locks;
DROP FUNCTION IF EXISTS pglock.locks_set_acquired_at();
ALTER TABLE pglock.locks DROP COLUMN IF EXISTS ttl_ms;
ALTER TABLE pglock.locks DROP COLUMN IF EXISTS acquired_at;
