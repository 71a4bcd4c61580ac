-- lock_held that leaves renewals alone under READ COMMITTED, lock_release that ends the
-- lease at the release, and lock_prune, which deletes rows released or expired long ago
-- without breaking the token rule, with lock_acquire drawing the token of a key without
-- a row only once it has inserted the row.

-- lock_held reports whether (key, token) is the live holder of key on the database
-- clock: not released, still the same fencing token, and not expired. A fenced write
-- (FenceHeld) ANDs it to its WHERE, so a write that runs after a takeover, a release
-- or the expiry writes nothing. It row-locks the lock row until the caller's
-- transaction ends, so that no takeover can happen while the write is unsettled; which
-- row lock depends on the isolation level.
--
-- READ COMMITTED (and READ UNCOMMITTED, the same thing in PostgreSQL): FOR KEY SHARE.
-- It does not conflict with the FOR NO KEY UPDATE lock of the UPDATEs of a renewal
-- (lock_renew, lock_renew_many), a release or lock_want, none of which changes the
-- key: FOR SHARE did, so a fenced transaction left open held up the client's batched
-- renewal, which timed out, and every lock of the process was lost (issue path 2). It
-- does conflict with the FOR UPDATE of lock_acquire (which then loses at once) and of
-- lock_prune (which skips the row), and a non-key update carries it to the new row
-- version, so no takeover can happen while the transaction is open, renewed or
-- expired. A takeover in flight that locked the row FOR UPDATE, as lock_acquire does,
-- makes it wait, then read the new row version and answer false; so a tool that takes
-- a key over by hand must lock the row FOR UPDATE first: an UPDATE of the owner and
-- the token alone does not conflict with FOR KEY SHARE, and is not waited for.
--
-- REPEATABLE READ, SERIALIZABLE: FOR SHARE, as in 000002. Here FOR KEY SHARE is unsafe:
-- it locks the row version of the transaction's snapshot even when a takeover that
-- changed only non-key columns committed after the snapshot, and answers true for the
-- stale token. FOR SHARE raises a serialization failure (40001) instead. It still holds
-- up the lock's renewals until the transaction ends: keep such transactions short.
--
-- CASE evaluates one branch only, so one row lock is taken, never both. The caller
-- needs SELECT and UPDATE privileges on pglock.locks, as the row locks do. VOLATILE:
-- it reads clock_timestamp() and locks a row, so it is evaluated for every row, each
-- call on a fresh snapshot under READ COMMITTED. STRICT: a null key or token is never
-- a holder; the null result counts as false in a WHERE.
CREATE OR REPLACE FUNCTION pglock.lock_held(key text, token bigint) RETURNS boolean
LANGUAGE sql VOLATILE STRICT AS $$
    SELECT CASE WHEN current_setting('transaction_isolation') IN ('read committed', 'read uncommitted') THEN
        EXISTS (
            SELECT 1 FROM pglock.locks l
            WHERE l.key = lock_held.key AND l.owner IS NOT NULL
              AND l.fencing_token = lock_held.token AND l.expires_at > clock_timestamp()
            FOR KEY SHARE)
    ELSE
        EXISTS (
            SELECT 1 FROM pglock.locks l
            WHERE l.key = lock_held.key AND l.owner IS NOT NULL
              AND l.fencing_token = lock_held.token AND l.expires_at > clock_timestamp()
            FOR SHARE)
    END
$$;

-- lock_release clears the owner of key if owner still holds it live; the row stays,
-- its expires_at set to the release, so that it is the end of the lease for every row
-- (lock_prune counts a row's age from it). A row a waiter marked is unmarked and
-- notified, from the SET, where l.wanted_at reads the row version the UPDATE locked
-- (see 000003).
CREATE OR REPLACE FUNCTION pglock.lock_release(key text, owner text) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT AS $$
BEGIN
    UPDATE pglock.locks l
    SET owner = NULL,
        expires_at = clock_timestamp(),
        wanted_at = CASE WHEN l.wanted_at IS NOT NULL THEN
            (SELECT NULL::timestamptz FROM pg_notify('pglock_released', l.key)) END
    WHERE l.key = lock_release.key AND l.owner = lock_release.owner
      AND l.expires_at > clock_timestamp();
    RETURN FOUND;
END $$;

-- lock_acquire as in 000004, except for a key without a row: the token is drawn after
-- the INSERT, not in its VALUES. PostgreSQL evaluates the VALUES before it checks for a
-- conflicting row, so an acquisition stalled in between (a descheduled backend) could
-- find that another client meanwhile inserted the key with a greater token, released
-- it and had it pruned, and insert the key with its older token. After the INSERT,
-- which follows the prune's commit (or waits for it), nextval is above every token
-- the prune deleted. The row's token until then is a placeholder nobody sees: the row
-- is not committed.
CREATE OR REPLACE FUNCTION pglock.lock_acquire(key text, owner text, ttl_ms bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE STRICT AS $$
DECLARE
    token bigint;
BEGIN
    IF lock_acquire.ttl_ms <= 0 THEN
        RETURN NULL;
    END IF;
    PERFORM FROM pglock.locks l
    WHERE l.key = lock_acquire.key AND (l.owner IS NULL OR l.expires_at <= clock_timestamp())
    FOR UPDATE SKIP LOCKED;
    IF FOUND THEN
        UPDATE pglock.locks l
        SET owner = lock_acquire.owner,
            fencing_token = greatest(nextval('pglock.fencing_token_seq'), l.fencing_token + 1),
            expires_at = clock_timestamp() + lock_acquire.ttl_ms * interval '1 millisecond'
        WHERE l.key = lock_acquire.key
        RETURNING l.fencing_token INTO token;
        RETURN token;
    END IF;
    IF EXISTS (SELECT FROM pglock.locks l WHERE l.key = lock_acquire.key) THEN
        RETURN NULL;
    END IF;
    INSERT INTO pglock.locks AS l (key, owner, fencing_token, expires_at)
    VALUES (lock_acquire.key, lock_acquire.owner, 1,
            clock_timestamp() + lock_acquire.ttl_ms * interval '1 millisecond')
    ON CONFLICT ON CONSTRAINT locks_pkey DO NOTHING;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    UPDATE pglock.locks l
    SET fencing_token = nextval('pglock.fencing_token_seq')
    WHERE l.key = lock_acquire.key
    RETURNING l.fencing_token INTO token;
    RETURN token;
END $$;

-- lock_prune deletes up to max_rows rows released or expired more than older_than_ms
-- milliseconds ago on the database clock, and returns how many it deleted. A row whose
-- lease is live is never touched, whatever older_than_ms.
--
-- It never waits: it row-locks its rows FOR UPDATE SKIP LOCKED, passing over a row that
-- an acquire, a renewal, a release or an open fenced transaction has locked (and an
-- acquire that meets a row it locked loses that attempt). Prunes take turns on a
-- transaction-scoped advisory lock (the key is "pglockpr" in ASCII); one that finds
-- another running returns 0 at once.
--
-- The token rule across a prune: a key without a row gets its next token from the
-- sequence alone (lock_acquire draws it after inserting the row), so before the DELETE
-- the sequence is raised until its next value is above every token deleted. That
-- matters when a token came from a row's floor after the sequence went back. setval is
-- not transactional: raising it early is harmless if the DELETE rolls back. Prunes are
-- serialized and each raises the sequence only above the value it read, so it never
-- goes below what an earlier prune deleted. A nextval by an acquisition between that
-- read and the setval may be drawn again later, but only by keys that have a row: the
-- row is the floor of the key's next token, and the prune that deletes it raises the
-- sequence first. Reading the sequence needs SELECT on it and setval needs UPDATE: a
-- role without them gets an error, never a broken rule.
--
-- There is no index on expires_at, on purpose: renewals rewrite it every ttl/3 and
-- would lose their HOT updates. A prune scans the table, so run it every few minutes,
-- not every second. Bad input raises invalid_parameter_value (22023).
CREATE OR REPLACE FUNCTION pglock.lock_prune(older_than_ms bigint, max_rows integer) RETURNS bigint
LANGUAGE plpgsql VOLATILE STRICT AS $$
DECLARE
    doomed text[];
    top bigint;
    seq_last bigint;
    seq_called boolean;
    deleted bigint;
BEGIN
    IF lock_prune.older_than_ms < 0 OR lock_prune.max_rows < 1 THEN
        RAISE EXCEPTION 'pglock.lock_prune: older_than_ms must be >= 0 and max_rows >= 1, not % and %',
            lock_prune.older_than_ms, lock_prune.max_rows
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT pg_try_advisory_xact_lock(8099561680514281586) THEN
        RETURN 0;
    END IF;
    SELECT array_agg(d.key), max(d.fencing_token) INTO doomed, top
    FROM (
        SELECT l.key, l.fencing_token FROM pglock.locks l
        WHERE (l.owner IS NULL OR l.expires_at <= clock_timestamp())
          AND l.expires_at < clock_timestamp() - lock_prune.older_than_ms * interval '1 millisecond'
        LIMIT lock_prune.max_rows
        FOR UPDATE SKIP LOCKED) d;
    IF doomed IS NULL THEN
        RETURN 0;
    END IF;
    SELECT s.last_value, s.is_called INTO seq_last, seq_called FROM pglock.fencing_token_seq s;
    -- The next nextval is last_value + increment once called, last_value before.
    IF seq_last < top OR (seq_last = top AND NOT seq_called) THEN
        PERFORM setval('pglock.fencing_token_seq', top);
    END IF;
    -- The rows are locked by this transaction: nobody changed them since.
    DELETE FROM pglock.locks l WHERE l.key = ANY (doomed);
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN deleted;
END $$;
