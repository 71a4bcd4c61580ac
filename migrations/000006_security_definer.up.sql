-- The functions run as their owner (the role that migrated), so that an application's
-- role needs nothing but USAGE on the schema and EXECUTE on the functions, and cannot
-- write pglock.locks or the sequence itself: with INSERT or UPDATE on them any code of
-- the application could forge a holder or rewind a token with a plain UPDATE, and no
-- fence could stop that. README.md ("Privileges") lists the GRANTs for such a role.
--
-- SECURITY DEFINER with search_path pinned to pg_catalog, then pg_temp (last, so that
-- no temporary object can stand in for a catalog one): every pglock object in the
-- bodies is qualified with pglock., and every unqualified name (clock_timestamp,
-- nextval, setval, pg_notify, pg_try_advisory_xact_lock, current_setting, greatest,
-- unnest, array_agg, max, the operators) is pg_catalog's. The bodies stay those of
-- 000001 to 000005; ALTER FUNCTION keeps them, their owner and their privileges.
--
-- lock_held runs inside the application's own UPDATE or DELETE. Its FOR KEY SHARE or
-- FOR SHARE row lock belongs to the caller's transaction whoever runs the function, so
-- it lasts until that transaction ends, as before; the caller no longer needs UPDATE on
-- pglock.locks for it. current_setting('transaction_isolation') and the snapshot are
-- the caller's transaction's, unchanged by SECURITY DEFINER. Likewise the caller's
-- statement_timeout and lock_timeout still bound every call.
--
-- EXECUTE is revoked from PUBLIC (PostgreSQL grants it on every new function): a
-- function that runs as its owner is callable only by the roles granted it. The roles
-- that could write pglock.locks before this migration (the old way to let an
-- application use pglock) are granted USAGE and EXECUTE here, so that they keep
-- working; their table and sequence privileges are left alone, for their owner to
-- revoke. A later migration that adds a function must revoke EXECUTE from PUBLIC and
-- grant it to the roles that have EXECUTE on lock_acquire.
ALTER FUNCTION pglock.lock_acquire(text, text, bigint) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION pglock.lock_renew(text, text, bigint) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION pglock.lock_renew_many(text[], text[], bigint) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION pglock.lock_release(text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION pglock.lock_want(text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION pglock.lock_holder(text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION pglock.lock_held(text, bigint) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION pglock.lock_prune(bigint, integer) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT DISTINCT a.grantee::regrole AS grantee
        FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
        WHERE c.oid = 'pglock.locks'::regclass AND a.privilege_type IN ('INSERT', 'UPDATE')
          AND a.grantee <> 0 AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT USAGE ON SCHEMA pglock TO %s', r.grantee);
        EXECUTE format('GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pglock TO %s', r.grantee);
    END LOOP;
END $$;

REVOKE ALL ON TABLE pglock.locks FROM PUBLIC;
REVOKE ALL ON SEQUENCE pglock.fencing_token_seq FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pglock FROM PUBLIC;
