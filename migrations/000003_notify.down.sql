DROP FUNCTION IF EXISTS pglock.lock_holder(text);
DROP FUNCTION IF EXISTS pglock.lock_want(text);
CREATE OR REPLACE FUNCTION pglock.lock_release(key text, owner text) RETURNS boolean
LANGUAGE sql VOLATILE STRICT AS $$
    WITH released AS (
        UPDATE pglock.locks l
        SET owner = NULL
        WHERE l.key = lock_release.key AND l.owner = lock_release.owner
          AND l.expires_at > clock_timestamp()
        RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM released)
$$;
ALTER TABLE pglock.locks DROP COLUMN IF EXISTS wanted_at;
