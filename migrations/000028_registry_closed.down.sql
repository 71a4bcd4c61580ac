-- Back to the registry of 000027: no closed registrations, registry_touch as it was.
DROP FUNCTION IF EXISTS pglock.registry_states(text);
DROP FUNCTION IF EXISTS pglock.registry_close(text, text[], text);

CREATE OR REPLACE FUNCTION pglock.registry_touch(kind text, keys text[], instance text, registering boolean) RETURNS integer
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    written integer;
    now timestamptz := clock_timestamp();
    bad text;
BEGIN
    IF registry_touch.kind NOT IN ('job', 'election') THEN
        PERFORM pglock.lock_refuse('registry_touch', 'kind', 'job or election', registry_touch.kind);
    ELSIF NOT length(registry_touch.instance) BETWEEN 1 AND 200 THEN
        PERFORM pglock.lock_refuse('registry_touch', 'instance', '1 to 200 characters', registry_touch.instance);
    ELSIF coalesce(cardinality(registry_touch.keys), 0) > 1000 THEN
        PERFORM pglock.lock_refuse('registry_touch', 'keys', 'at most 1000', cardinality(registry_touch.keys)::text || ' keys');
    END IF;
    SELECT k INTO bad FROM unnest(registry_touch.keys) k WHERE NOT coalesce(pglock.lock_key_ok(k), false) LIMIT 1;
    IF FOUND THEN
        PERFORM pglock.lock_refuse('registry_touch', 'keys', 'keys of 1 to 500 characters without U+001F', bad);
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

DROP FUNCTION IF EXISTS pglock.registry_check(text, text, text[], text);
ALTER TABLE pglock.registry DROP COLUMN IF EXISTS closed_at;
