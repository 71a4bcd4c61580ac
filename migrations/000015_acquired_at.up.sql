-- When the current holder acquired its key, and the ttl it acquired it for
-- (LockInfo.AcquiredAt and TTL: the console's "held for" and "expiring", under a third
-- of the ttl left). Both are set by triggers on the database clock, only when the
-- token changes, which is what an acquisition does and nothing else does: a renewal,
-- a release, a force-release and a want leave them, and pay only the WHEN test. The
-- ttl is the new expiry less that clock, in whole milliseconds (the acquisition read
-- the clock a few microseconds before). A row that existed before this migration has
-- both NULL until its next acquisition.
ALTER TABLE pglock.locks ADD COLUMN IF NOT EXISTS acquired_at timestamptz;
ALTER TABLE pglock.locks ADD COLUMN IF NOT EXISTS ttl_ms bigint;

CREATE OR REPLACE FUNCTION pglock.locks_set_acquired_at()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    NEW.acquired_at := clock_timestamp();
    NEW.ttl_ms := round(extract(epoch FROM NEW.expires_at - NEW.acquired_at) * 1000)::bigint;
    RETURN NEW;
END $$;
REVOKE ALL ON FUNCTION pglock.locks_set_acquired_at() FROM PUBLIC;

-- Two triggers, as a WHEN cannot name OLD on INSERT; DROP then CREATE because
-- PostgreSQL 13 has no CREATE OR REPLACE TRIGGER.
DROP TRIGGER IF EXISTS locks_acquired_at_insert ON pglock.locks;
CREATE TRIGGER locks_acquired_at_insert BEFORE INSERT ON pglock.locks
    FOR EACH ROW EXECUTE FUNCTION pglock.locks_set_acquired_at();
DROP TRIGGER IF EXISTS locks_acquired_at_update ON pglock.locks;
CREATE TRIGGER locks_acquired_at_update BEFORE UPDATE ON pglock.locks
    FOR EACH ROW WHEN (OLD.fencing_token IS DISTINCT FROM NEW.fencing_token)
    EXECUTE FUNCTION pglock.locks_set_acquired_at();

-- lock_list as 000007 defined it, with acquired_at and ttl_ms: a new result column needs a DROP
-- (its grants go with it, given back below as 000007 gives them).
DROP FUNCTION IF EXISTS pglock.lock_list(text);
CREATE FUNCTION pglock.lock_list(prefix text)
RETURNS TABLE (key text, owner text, fencing_token bigint, expires_at timestamptz,
               held boolean, wanted boolean, read_at timestamptz, acquired_at timestamptz, ttl_ms bigint)
LANGUAGE sql VOLATILE STRICT
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT l.key, l.owner, l.fencing_token, l.expires_at,
           l.owner IS NOT NULL AND l.expires_at > n.now,
           l.owner IS NOT NULL AND l.expires_at > n.now AND l.wanted_at IS NOT NULL,
           n.now, l.acquired_at, l.ttl_ms
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
        EXECUTE format('GRANT EXECUTE ON FUNCTION pglock.lock_list(text), pglock.locks_set_acquired_at() TO %s', r.grantee);
    END LOOP;
END $$;
