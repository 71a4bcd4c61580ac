-- lock_held reports whether (key, token) is the live holder of key on the database
-- clock: not released, still the same fencing token, and not expired. A fenced write
-- (FenceHeld) ANDs it to its WHERE, so a write that runs after a takeover, a release
-- or the expiry writes nothing.
--
-- FOR SHARE locks the lock row until the caller's transaction ends: a takeover (which
-- fails at once on a locked row since 000004) cannot happen meanwhile, and an
-- UPDATE of the row (and a release or renewal) waits until the write that saw the
-- lock held has committed or rolled back, so no newer token exists while it is open.
-- When such an UPDATE committed first, FOR SHARE re-reads the new row version under
-- READ COMMITTED, finds another token and answers false (under REPEATABLE READ or
-- SERIALIZABLE it raises a serialization failure instead). The caller needs SELECT and
-- UPDATE privileges on pglock.locks, as FOR SHARE does.
--
-- VOLATILE: it reads clock_timestamp() and locks a row, so the planner evaluates it
-- for every row, and each call takes a fresh snapshot. STRICT: a null key or token is
-- never a holder; the null result counts as false in a WHERE.
CREATE OR REPLACE FUNCTION pglock.lock_held(key text, token bigint) RETURNS boolean
LANGUAGE sql VOLATILE STRICT AS $$
    SELECT EXISTS (
        SELECT 1 FROM pglock.locks l
        WHERE l.key = lock_held.key AND l.owner IS NOT NULL
          AND l.fencing_token = lock_held.token AND l.expires_at > clock_timestamp()
        FOR SHARE)
$$;
