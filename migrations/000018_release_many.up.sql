-- lock_release_many hands back, in one statement, what failed acquisitions may have
-- been granted (the client's hand-backs): keys[i] for owners[i], where a key is a lock's
-- key or a permit's row key, or a semaphore's key followed by U+001F for the permit of
-- unknown number that owners[i] may hold (as sem_release). It returns the positions
-- (from 1) of those it released. Each is released as lock_release (sem_release)
-- releases it: a marked key notifies, a key (a permit) goes to the head of its fair
-- queue. A client
-- used to send one release per hand-back, one at a time: over a slow link, a few
-- hand-backs in a row took longer than the ttl, and the last keys were left to expire.
--
-- The keys are released in their order (a byte order), so that two calls whose keys
-- overlap lock their rows in the same order. With async true, the commit does not wait
-- for its WAL flush, as lock_release_async's: call it so only as a statement of its own
-- (see 000009), never inside a transaction of the caller's.
CREATE OR REPLACE FUNCTION pglock.lock_release_many(keys text[], owners text[], async boolean)
RETURNS SETOF integer
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    k text;
    o text;
    i integer;
BEGIN
    IF cardinality(lock_release_many.keys) <> cardinality(lock_release_many.owners)
        OR cardinality(lock_release_many.keys) > 1000 THEN
        RAISE EXCEPTION 'pglock.lock_release_many: want as many owners as keys, at most 1000, not % keys and % owners',
            cardinality(lock_release_many.keys), cardinality(lock_release_many.owners)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF lock_release_many.async THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    FOR k, o, i IN
        SELECT u.k, u.o, u.i FROM unnest(lock_release_many.keys, lock_release_many.owners) WITH ORDINALITY AS u(k, o, i)
        ORDER BY u.k COLLATE "C", u.o COLLATE "C"
    LOOP
        IF k IS NULL OR o IS NULL THEN
            RAISE EXCEPTION 'pglock.lock_release_many: want no null key or owner'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF right(k, 1) = chr(31) THEN
            IF pglock.sem_release(left(k, -1), o) THEN
                RETURN NEXT i;
            END IF;
        ELSIF pglock.lock_release(k, o) THEN
            RETURN NEXT i;
        END IF;
    END LOOP;
END $$;

-- As 000006 asks of a migration that adds a function: EXECUTE revoked from PUBLIC,
-- granted to the roles that may execute lock_acquire.
REVOKE ALL ON FUNCTION pglock.lock_release_many(text[], text[], boolean) FROM PUBLIC;
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT DISTINCT a.grantee::regrole AS grantee
        FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
        WHERE p.oid = 'pglock.lock_acquire(text, text, bigint)'::regprocedure AND a.privilege_type = 'EXECUTE'
          AND a.grantee <> 0 AND a.grantee <> p.proowner
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION pglock.lock_release_many(text[], text[], boolean) TO %s', r.grantee);
    END LOOP;
END $$;
