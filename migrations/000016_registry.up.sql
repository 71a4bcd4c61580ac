-- The registry: the jobs and elections that clients registered (Client.Job, Elect,
-- GocronLocker's jobs, GocronElector), which instance registered each and when it was
-- last seen, so that a job is listed before its first run and every election can be
-- listed with its leader. A client writes its registrations in the background, once at
-- registration and again every few minutes (seen_at), one statement for all of them;
-- a registration is a hint for operators, never something a lock rests on, so its
-- writes are not flushed (as the run history's, 000008).
CREATE TABLE IF NOT EXISTS pglock.registry (
    kind          text        NOT NULL CHECK (kind IN ('job', 'election')),
    key           text        NOT NULL, -- the job's key (gocron job name) or the election's key
    instance      text        NOT NULL, -- the client's instance name (WithInstanceName)
    registered_at timestamptz NOT NULL, -- its last registration by that instance, database clock
    seen_at       timestamptz NOT NULL, -- its last refresh by that instance
    CONSTRAINT registry_pkey PRIMARY KEY (kind, key, instance)
);

-- registry_touch writes that instance registered keys of kind ('job' or 'election'):
-- registered_at and seen_at are now when registering, only seen_at otherwise (a
-- refresh). When registering it also deletes every registration not seen for 7 days
-- (instances that are gone: the run history's default retention). It returns how many
-- rows it wrote. Bad input raises invalid_parameter_value (22023), writing nothing: an
-- unknown kind, an empty instance, more than 1000 keys, a key that is null, empty or
-- longer than 500 characters.
CREATE OR REPLACE FUNCTION pglock.registry_touch(kind text, keys text[], instance text, registering boolean)
RETURNS integer
LANGUAGE plpgsql VOLATILE STRICT AS $$
DECLARE
    written integer;
    now timestamptz := clock_timestamp();
BEGIN
    IF registry_touch.kind NOT IN ('job', 'election') OR registry_touch.instance = ''
        OR coalesce(cardinality(registry_touch.keys), 0) > 1000
        OR EXISTS (SELECT FROM unnest(registry_touch.keys) k WHERE k IS NULL OR k = '' OR length(k) > 500) THEN
        RAISE EXCEPTION 'pglock.registry_touch: want kind job or election, an instance and up to 1000 keys of 1 to 500 characters, not kind %L, instance %L and % keys',
            registry_touch.kind, registry_touch.instance, cardinality(registry_touch.keys)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    INSERT INTO pglock.registry AS r (kind, key, instance, registered_at, seen_at)
    SELECT registry_touch.kind, k, registry_touch.instance, now, now
    FROM (SELECT DISTINCT k FROM unnest(registry_touch.keys) k) u
    ON CONFLICT ON CONSTRAINT registry_pkey DO UPDATE
    SET seen_at = excluded.seen_at,
        registered_at = CASE WHEN registry_touch.registering THEN excluded.registered_at ELSE r.registered_at END;
    GET DIAGNOSTICS written = ROW_COUNT;
    IF registry_touch.registering THEN
        DELETE FROM pglock.registry r WHERE r.seen_at < now - interval '7 days';
    END IF;
    RETURN written;
END $$;

-- registry_list returns the registrations of kind, by key then instance.
CREATE OR REPLACE FUNCTION pglock.registry_list(kind text)
RETURNS TABLE (key text, instance text, registered_at timestamptz, seen_at timestamptz)
LANGUAGE sql STABLE STRICT AS $$
    SELECT r.key, r.instance, r.registered_at, r.seen_at FROM pglock.registry r
    WHERE r.kind = registry_list.kind
    ORDER BY r.key, r.instance
$$;

-- As 000008: the functions run as their owner, so that an application role needs only
-- EXECUTE on them; EXECUTE goes to the roles that may call lock_acquire, not to PUBLIC.
ALTER FUNCTION pglock.registry_touch(text, text[], text, boolean) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION pglock.registry_list(text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

REVOKE ALL ON TABLE pglock.registry FROM PUBLIC;
REVOKE ALL ON FUNCTION pglock.registry_touch(text, text[], text, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION pglock.registry_list(text) FROM PUBLIC;

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
        EXECUTE format('GRANT EXECUTE ON FUNCTION pglock.registry_touch(text, text[], text, boolean), '
            'pglock.registry_list(text) TO %s', r.grantee);
    END LOOP;
END $$;
