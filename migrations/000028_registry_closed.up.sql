-- Whether each instance that registered a job or an election is still there: a
-- client's Close (and an election's Resign) marks its registrations closed, so that an
-- operator tells an instance that left from one that died (a registration neither
-- closed nor refreshed for longer than a client's refresh period: Registration.State).
-- Registering or refreshing opens a registration again. As 000016's, these writes are
-- hints for operators, never something a lock rests on: they are not flushed.
ALTER TABLE pglock.registry ADD COLUMN IF NOT EXISTS closed_at timestamptz; -- when its client left; null while open

-- registry_check raises invalid_parameter_value (22023), naming the argument, unless
-- kind is job or election, instance has 1 to 200 characters, and keys are up to 1000
-- of 1 to 500 characters without U+001F: the checks of registry_touch and
-- registry_close (fn), written once. It reads and writes nothing.
CREATE OR REPLACE FUNCTION pglock.registry_check(fn text, kind text, keys text[], instance text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF fn IS NULL OR fn NOT IN ('registry_touch', 'registry_close') THEN
        RAISE EXCEPTION 'pglock.registry_check: fn %: want registry_touch or registry_close', quote_nullable(fn)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF kind IS NULL OR kind NOT IN ('job', 'election') THEN
        RAISE EXCEPTION 'pglock.%: kind %: want job or election', fn, quote_nullable(kind)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF instance IS NULL OR length(instance) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'pglock.%: instance of % characters: want 1 to 200', fn, coalesce(length(instance), 0)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF keys IS NULL OR coalesce(cardinality(keys), 0) > 1000
        OR EXISTS (SELECT FROM unnest(keys) k WHERE k IS NULL OR length(k) NOT BETWEEN 1 AND 500 OR strpos(k, chr(31)) > 0) THEN
        RAISE EXCEPTION 'pglock.%: keys: want up to 1000 keys of 1 to 500 characters without U+001F, not % keys',
            fn, coalesce(cardinality(keys), 0)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;

-- registry_touch as 000016 defined it, but a registration or a refresh opens the row
-- again (closed_at null), and each argument is checked on its own (registry_check).
CREATE OR REPLACE FUNCTION pglock.registry_touch(kind text, keys text[], instance text, registering boolean)
RETURNS integer
LANGUAGE plpgsql VOLATILE STRICT
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    written integer;
    now timestamptz := clock_timestamp();
BEGIN
    PERFORM pglock.registry_check('registry_touch', registry_touch.kind, registry_touch.keys, registry_touch.instance);
    PERFORM set_config('synchronous_commit', 'off', true);
    INSERT INTO pglock.registry AS r (kind, key, instance, registered_at, seen_at)
    SELECT registry_touch.kind, k, registry_touch.instance, now, now
    FROM (SELECT DISTINCT k FROM unnest(registry_touch.keys) k) u
    ON CONFLICT ON CONSTRAINT registry_pkey DO UPDATE
    SET seen_at = excluded.seen_at,
        registered_at = CASE WHEN registry_touch.registering THEN excluded.registered_at ELSE r.registered_at END,
        closed_at = NULL;
    GET DIAGNOSTICS written = ROW_COUNT;
    IF registry_touch.registering THEN
        DELETE FROM pglock.registry r WHERE r.seen_at < now - interval '7 days';
    END IF;
    RETURN written;
END $$;

-- registry_close marks the open registrations of keys of kind by instance closed, now
-- (closed_at, and seen_at: the last time the instance was heard of), and returns how
-- many it marked. Its arguments are checked as registry_touch's.
CREATE OR REPLACE FUNCTION pglock.registry_close(kind text, keys text[], instance text)
RETURNS integer
LANGUAGE plpgsql VOLATILE STRICT
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    written integer;
    now timestamptz := clock_timestamp();
BEGIN
    PERFORM pglock.registry_check('registry_close', registry_close.kind, registry_close.keys, registry_close.instance);
    PERFORM set_config('synchronous_commit', 'off', true);
    UPDATE pglock.registry r SET closed_at = now, seen_at = now
    WHERE r.kind = registry_close.kind AND r.instance = registry_close.instance
      AND r.key = ANY (registry_close.keys) AND r.closed_at IS NULL;
    GET DIAGNOSTICS written = ROW_COUNT;
    RETURN written;
END $$;

-- registry_states returns the registrations of kind, by key then instance, as
-- registry_list does, with closed_at and the database's clock (read_at), which a
-- registration's state is told by. An unknown kind raises invalid_parameter_value.
-- (registry_list stays as it was, for clients older than this migration.)
CREATE OR REPLACE FUNCTION pglock.registry_states(kind text)
RETURNS TABLE (key text, instance text, registered_at timestamptz, seen_at timestamptz,
               closed_at timestamptz, read_at timestamptz)
LANGUAGE plpgsql VOLATILE STRICT
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF registry_states.kind NOT IN ('job', 'election') THEN
        RAISE EXCEPTION 'pglock.registry_states: kind %: want job or election', quote_literal(registry_states.kind)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    SELECT r.key, r.instance, r.registered_at, r.seen_at, r.closed_at, n.now
    FROM pglock.registry r, (SELECT clock_timestamp() AS now) n
    WHERE r.kind = registry_states.kind
    ORDER BY r.key, r.instance;
END $$;

REVOKE ALL ON FUNCTION pglock.registry_check(text, text, text[], text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pglock.registry_close(text, text[], text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pglock.registry_states(text) FROM PUBLIC;

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
        EXECUTE format('GRANT EXECUTE ON FUNCTION pglock.registry_check(text, text, text[], text), '
            'pglock.registry_close(text, text[], text), pglock.registry_states(text) TO %s', r.grantee);
    END LOOP;
END $$;
