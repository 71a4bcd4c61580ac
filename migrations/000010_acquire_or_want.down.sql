DROP FUNCTION IF EXISTS pglock.lock_acquire_or_want(text, text, bigint);

-- lock_want as 000003 wrote it, with 000006's SECURITY DEFINER and search_path.
CREATE OR REPLACE FUNCTION pglock.lock_want(key text) RETURNS boolean
LANGUAGE sql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    UPDATE pglock.locks l
    SET wanted_at = clock_timestamp()
    WHERE l.key = lock_want.key AND l.owner IS NOT NULL
      AND l.expires_at > clock_timestamp() AND l.wanted_at IS NULL;
    SELECT EXISTS (
        SELECT 1 FROM pglock.locks l
        WHERE l.key = lock_want.key AND l.owner IS NOT NULL
          AND l.expires_at > clock_timestamp() AND l.wanted_at IS NOT NULL)
$$;
