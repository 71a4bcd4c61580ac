-- A plain lock pays only for itself. Semaphores, the fair queue and the console were
-- paid for by every acquisition and release of a plain lock: a trigger that set
-- acquired_at and ttl_ms on every change of token, a stored generated column
-- (semaphore) computed on every write of a row, renewals included, probes of
-- pglock.waiters in every acquisition and release, a queue lock (an advisory lock) in
-- every release, and nested calls whose pinned search_path is set and put back at
-- each call. Now:
--
-- - lock_acquire reads the key's row (locking nothing: a held key is refused so), then
--   takes a free key in one statement (the row locked with SKIP LOCKED and its token
--   drawn after, in the UPDATE that writes acquired_at and ttl_ms), and probes the
--   waiters only of a key whose row says a fair waiter queued on it (queued).
-- - lock_release and lock_release_async release a plain key whose row is not queued in
--   one statement, with no queue lock and no probe; a permit, a queued key, or a key
--   not held goes the way of 000027 (lock_release_slow).
-- - No trigger: the statements that change a token write acquired_at and ttl_ms (a
--   claim of a grant writes the waiter's ttl_ms, which the trigger left at the grant's
--   second).
-- - No stored column: a permit's semaphore is split_part(key, U+001F, 1), indexed for
--   the rows whose key has U+001F.
--
-- queued is set by queue_acquire when it queues a waiter of the key, before the
-- waiter's row exists, and cleared by a release, under the key's queue lock, that finds
-- no waiter left. A release that finds the key queued takes the key's queue lock and
-- hands the key over as before (000023). Waiters that queue at once never wait for each
-- other: the first marks the row, and one that finds the row locked does not wait for
-- it while another waiter holds the key's queue lock (that one marks it); with the
-- queue lock to itself, the row's locker is no waiter (a release in flight, say), and it
-- waits for it, marks the row and takes the key if the release left it free. A mark
-- none of them could make (a key whose row is still being created; the release of a
-- key that two waiters queue on at that moment, both finding its row locked) is made
-- at their next poll; until then an acquisition outside the queue may take the key, as
-- one that came just before the waiters would have.

ALTER TABLE pglock.locks ADD COLUMN IF NOT EXISTS queued boolean NOT NULL DEFAULT false;

-- The keys fair waiters wait for now are queued.
INSERT INTO pglock.locks AS l (key, fencing_token, expires_at, queued)
SELECT w.key, 1, clock_timestamp(), true
FROM (SELECT DISTINCT o.key FROM pglock.waiters o WHERE strpos(o.key, chr(31)) = 0) w
ON CONFLICT ON CONSTRAINT locks_pkey DO UPDATE SET queued = true;

DROP TRIGGER IF EXISTS locks_acquired_at_insert ON pglock.locks;
DROP TRIGGER IF EXISTS locks_acquired_at_update ON pglock.locks;
DROP FUNCTION IF EXISTS pglock.locks_set_acquired_at();

CREATE INDEX IF NOT EXISTS locks_semaphore_of ON pglock.locks (split_part(key, chr(31), 1))
    WHERE strpos(key, chr(31)) > 0;
ALTER TABLE pglock.locks DROP COLUMN IF EXISTS semaphore; -- and its index

-- lock_acquire: a read of the key's row, which locks nothing, refuses a held key; a free
-- key is taken in one statement; a new key as 000027 takes it.
CREATE OR REPLACE FUNCTION pglock.lock_acquire(key text, owner text, ttl_ms bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    token bigint;
    free boolean;
BEGIN
    IF NOT (pglock.lock_key_ok(lock_acquire.key) AND pglock.lock_owner_ok(lock_acquire.owner)
            AND pglock.lock_ttl_ok(lock_acquire.ttl_ms)) THEN
        IF NOT pglock.lock_key_ok(lock_acquire.key) THEN
            PERFORM pglock.lock_refuse('lock_acquire', 'key', 'a lock''s key: 1 to 500 characters without U+001F', lock_acquire.key);
        ELSIF NOT pglock.lock_owner_ok(lock_acquire.owner) THEN
            PERFORM pglock.lock_refuse('lock_acquire', 'owner', '1 to 255 characters', lock_acquire.owner);
        END IF;
        PERFORM pglock.lock_refuse('lock_acquire', 'ttl_ms', '1 to 31536000000 (365 days)', lock_acquire.ttl_ms::text);
    END IF;
    -- A read first, which locks nothing: a held key is refused with no more.
    SELECT l.owner IS NULL OR l.expires_at <= clock_timestamp() INTO free
    FROM pglock.locks l WHERE l.key = lock_acquire.key;
    IF NOT FOUND THEN
        IF EXISTS (SELECT FROM pglock.waiters w -- a new key's waiters, queued while it was created
                   WHERE w.key = lock_acquire.key AND w.granted IS NULL
                     AND w.seen_at > clock_timestamp() - interval '1 second') THEN
            RETURN NULL;
        END IF;
        RETURN pglock.lock_take(lock_acquire.key, lock_acquire.owner, lock_acquire.ttl_ms);
    ELSIF NOT free THEN
        RETURN NULL;
    END IF;
    UPDATE pglock.locks l
    SET owner = lock_acquire.owner,
        fencing_token = greatest(nextval('pglock.fencing_token_seq'), l.fencing_token + 1),
        expires_at = clock_timestamp() + lock_acquire.ttl_ms * interval '1 millisecond',
        acquired_at = clock_timestamp(),
        ttl_ms = lock_acquire.ttl_ms
    WHERE l.key = (SELECT f.key FROM pglock.locks f
                   WHERE f.key = lock_acquire.key AND (f.owner IS NULL OR f.expires_at <= clock_timestamp())
                     AND (NOT f.queued OR NOT EXISTS (
                         SELECT FROM pglock.waiters w
                         WHERE w.key = lock_acquire.key AND w.granted IS NULL
                           AND w.seen_at > clock_timestamp() - interval '1 second'))
                   FOR UPDATE SKIP LOCKED)
    RETURNING l.fencing_token INTO token;
    IF NOT FOUND THEN
        RETURN NULL; -- taken meanwhile, being changed, or queued for
    END IF;
    IF token <= (pglock.fencing_timeline() - 1) << 40 THEN
        -- A new timeline's first tokens (000012): above its floor.
        UPDATE pglock.locks l SET fencing_token = greatest(pglock.fencing_token_next(), l.fencing_token + 1)
        WHERE l.key = lock_acquire.key
        RETURNING l.fencing_token INTO token;
    END IF;
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    RETURN token;
END $$;

-- lock_take as in 000024, writing acquired_at and ttl_ms.
CREATE OR REPLACE FUNCTION pglock.lock_take(key text, owner text, ttl_ms bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE STRICT SECURITY INVOKER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    token bigint;
    inserted boolean := false;
BEGIN
    PERFORM FROM pglock.locks l
    WHERE l.key = lock_take.key AND (l.owner IS NULL OR l.expires_at <= clock_timestamp())
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        IF EXISTS (SELECT FROM pglock.locks l WHERE l.key = lock_take.key) THEN
            RETURN NULL;
        END IF;
        -- A new key: another transaction creating its row now holds it (000024).
        IF NOT pg_try_advisory_xact_lock(hashtextextended(lock_take.key, 1885826162)) THEN
            RETURN NULL;
        END IF;
        INSERT INTO pglock.locks AS l (key, owner, fencing_token, expires_at)
        VALUES (lock_take.key, lock_take.owner, 1,
                clock_timestamp() + lock_take.ttl_ms * interval '1 millisecond')
        ON CONFLICT ON CONSTRAINT locks_pkey DO NOTHING;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        inserted := true;
    END IF;
    token := pglock.fencing_token_next();
    -- A new row's placeholder token (1) is no floor; a free row's token is, for a
    -- sequence that went back (a restore, a failover within one timeline's range).
    UPDATE pglock.locks l
    SET owner = lock_take.owner,
        fencing_token = CASE WHEN inserted THEN token ELSE greatest(token, l.fencing_token + 1) END,
        expires_at = clock_timestamp() + lock_take.ttl_ms * interval '1 millisecond',
        acquired_at = clock_timestamp(),
        ttl_ms = lock_take.ttl_ms
    WHERE l.key = lock_take.key
    RETURNING l.fencing_token INTO token;
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    RETURN token;
END $$;

-- lock_release_slow releases what the one statement of lock_release does not: a
-- permit (sem_release_permits), a key whose row says it is queued, or a key not held
-- (lock_release_key). That statement, when the row changed under it (a waiter marked
-- it queued meanwhile, say), may have left the row locked by this transaction while it
-- found nothing to update (PostgreSQL locks the newest version of a row it rechecks):
-- then the key's queue lock, which comes before the row in the lock order, is only
-- tried. A transaction that has no id yet has locked no row. When the try fails, the
-- key is released without its handover: the head of its queue takes it at its next
-- poll. Callers checked the arguments.
CREATE OR REPLACE FUNCTION pglock.lock_release_slow(key text, owner text) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SECURITY INVOKER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF strpos(lock_release_slow.key, chr(31)) > 0 THEN
        RETURN EXISTS (SELECT FROM pglock.sem_release_permits(split_part(lock_release_slow.key, chr(31), 1),
            ARRAY[lock_release_slow.key], ARRAY[lock_release_slow.owner]));
    END IF;
    IF pg_current_xact_id_if_assigned() IS NULL
        OR pg_try_advisory_xact_lock(hashtextextended(lock_release_slow.key, 1885826161)) THEN
        RETURN pglock.lock_release_key(lock_release_slow.key, lock_release_slow.owner);
    END IF;
    UPDATE pglock.locks l
    SET owner = NULL,
        expires_at = clock_timestamp(),
        wanted_at = CASE WHEN l.wanted_at IS NOT NULL THEN
            (SELECT NULL::timestamptz FROM pg_notify('pglock_released', l.key)) END
    WHERE l.key = lock_release_slow.key AND l.owner = lock_release_slow.owner
      AND l.expires_at > clock_timestamp();
    RETURN FOUND;
END $$;

-- lock_release: a plain key nobody queued for in one statement (no queue lock, no probe
-- of the waiters), the rest through lock_release_slow.
CREATE OR REPLACE FUNCTION pglock.lock_release(key text, owner text) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT (pglock.lock_row_key_ok(lock_release.key) AND pglock.lock_owner_ok(lock_release.owner)) THEN
        IF NOT pglock.lock_row_key_ok(lock_release.key) THEN
            PERFORM pglock.lock_refuse('lock_release', 'key', 'a lock''s key or a permit''s row key', lock_release.key);
        END IF;
        PERFORM pglock.lock_refuse('lock_release', 'owner', '1 to 255 characters', lock_release.owner);
    END IF;
    IF strpos(lock_release.key, chr(31)) = 0 THEN
        UPDATE pglock.locks l
        SET owner = NULL,
            expires_at = clock_timestamp(),
            wanted_at = CASE WHEN l.wanted_at IS NOT NULL THEN
                (SELECT NULL::timestamptz FROM pg_notify('pglock_released', l.key)) END
        WHERE l.key = lock_release.key AND l.owner = lock_release.owner
          AND l.expires_at > clock_timestamp() AND NOT l.queued;
        IF FOUND THEN
            RETURN true;
        END IF;
    END IF;
    RETURN pglock.lock_release_slow(lock_release.key, lock_release.owner);
END $$;

-- lock_release_async: lock_release, its transaction committed without waiting for its
-- flush (000009); written out, not a call of lock_release, whose pinned search_path
-- would be set and put back once more.
CREATE OR REPLACE FUNCTION pglock.lock_release_async(key text, owner text) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    prior text;
BEGIN
    IF NOT (pglock.lock_row_key_ok(lock_release_async.key) AND pglock.lock_owner_ok(lock_release_async.owner)) THEN
        IF NOT pglock.lock_row_key_ok(lock_release_async.key) THEN
            PERFORM pglock.lock_refuse('lock_release_async', 'key', 'a lock''s key or a permit''s row key', lock_release_async.key);
        END IF;
        PERFORM pglock.lock_refuse('lock_release_async', 'owner', '1 to 255 characters', lock_release_async.owner);
    END IF;
    prior := set_config('synchronous_commit', 'off', true);
    IF strpos(lock_release_async.key, chr(31)) = 0 THEN
        UPDATE pglock.locks l
        SET owner = NULL,
            expires_at = clock_timestamp(),
            wanted_at = CASE WHEN l.wanted_at IS NOT NULL THEN
                (SELECT NULL::timestamptz FROM pg_notify('pglock_released', l.key)) END
        WHERE l.key = lock_release_async.key AND l.owner = lock_release_async.owner
          AND l.expires_at > clock_timestamp() AND NOT l.queued;
        IF FOUND THEN
            RETURN true;
        END IF;
    END IF;
    RETURN pglock.lock_release_slow(lock_release_async.key, lock_release_async.owner);
END $$;

-- lock_release_key as in 000027, clearing queued when the key has no waiter left: under
-- the key's queue lock, every waiter queueing has committed or waits for this
-- transaction, and then marks the row again.
CREATE OR REPLACE FUNCTION pglock.lock_release_key(key text, owner text) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SECURITY INVOKER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(lock_release_key.key, 1885826161));
    UPDATE pglock.locks l
    SET owner = NULL,
        expires_at = clock_timestamp(),
        wanted_at = CASE WHEN l.wanted_at IS NOT NULL THEN
            (SELECT NULL::timestamptz FROM pg_notify('pglock_released', l.key)) END,
        queued = l.queued AND EXISTS (SELECT FROM pglock.waiters w WHERE w.key = l.key)
    WHERE l.key = lock_release_key.key AND l.owner = lock_release_key.owner
      AND l.expires_at > clock_timestamp();
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF EXISTS (SELECT FROM pglock.waiters w WHERE w.key = lock_release_key.key) THEN
        PERFORM pglock.queue_grant(lock_release_key.key);
    END IF;
    RETURN true;
END $$;

-- lock_force_release as in 000027, clearing queued as lock_release_key does.
CREATE OR REPLACE FUNCTION pglock.lock_force_release(key text,
    OUT owner text, OUT fencing_token bigint, OUT expires_at timestamptz, OUT expires_in_us bigint, OUT wanted boolean)
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    now timestamptz;
    sem text;
    queued boolean;
BEGIN
    IF NOT pglock.lock_row_key_ok(lock_force_release.key) THEN
        PERFORM pglock.lock_refuse('lock_force_release', 'key', 'a lock''s key or a permit''s row key', lock_force_release.key);
    END IF;
    IF strpos(lock_force_release.key, chr(31)) > 0 THEN
        sem := split_part(lock_force_release.key, chr(31), 1);
        queued := EXISTS (SELECT FROM pglock.waiters w WHERE w.key = sem || chr(31));
        IF queued THEN
            PERFORM FROM pglock.semaphores s WHERE s.key = sem FOR UPDATE;
        END IF;
    ELSE
        PERFORM pg_advisory_xact_lock(hashtextextended(lock_force_release.key, 1885826161));
    END IF;
    SELECT l.owner, l.fencing_token, l.expires_at, l.wanted_at IS NOT NULL
    INTO lock_force_release.owner, lock_force_release.fencing_token,
         lock_force_release.expires_at, lock_force_release.wanted
    FROM pglock.locks l
    WHERE l.key = lock_force_release.key
    FOR UPDATE;
    now := clock_timestamp();
    IF NOT FOUND OR lock_force_release.owner IS NULL OR lock_force_release.expires_at <= now THEN
        owner := NULL;
        fencing_token := NULL;
        expires_at := NULL;
        wanted := NULL;
        RETURN;
    END IF;
    expires_in_us := (extract(epoch FROM lock_force_release.expires_at - now) * 1000000)::bigint;
    UPDATE pglock.locks l
    SET owner = NULL,
        expires_at = now,
        wanted_at = CASE WHEN l.wanted_at IS NOT NULL THEN
            (SELECT NULL::timestamptz FROM pg_notify('pglock_released', l.key)) END,
        queued = l.queued AND EXISTS (SELECT FROM pglock.waiters w WHERE w.key = l.key)
    WHERE l.key = lock_force_release.key;
    IF sem IS NULL THEN
        IF EXISTS (SELECT FROM pglock.waiters w WHERE w.key = lock_force_release.key) THEN
            PERFORM pglock.queue_grant(lock_force_release.key);
        END IF;
    ELSIF queued THEN
        PERFORM pglock.sem_grant(sem, lock_force_release.key);
    END IF;
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
END $$;

-- queue_grant as in 000014, writing acquired_at and the grant's ttl_ms.
CREATE OR REPLACE FUNCTION pglock.queue_grant(key text) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SECURITY INVOKER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    head pglock.waiters;
    token bigint;
BEGIN
    SELECT * INTO head FROM pglock.waiters w
    WHERE w.key = queue_grant.key AND w.granted IS NULL
      AND w.seen_at > clock_timestamp() - interval '1 second'
    ORDER BY w.ticket
    LIMIT 1
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    token := pglock.fencing_token_next();
    UPDATE pglock.locks l
    SET owner = head.owner,
        fencing_token = greatest(token, l.fencing_token + 1),
        expires_at = clock_timestamp() + interval '1 second',
        acquired_at = clock_timestamp(),
        ttl_ms = 1000
    WHERE l.key = queue_grant.key;
    UPDATE pglock.waiters w
    SET granted = queue_grant.key, seen_at = clock_timestamp()
    WHERE w.key = head.key AND w.ticket = head.ticket;
    PERFORM pg_notify('pglock_granted', head.owner);
    RETURN true;
END $$;

-- sem_grant as in 000017, writing acquired_at and the grant's ttl_ms.
CREATE OR REPLACE FUNCTION pglock.sem_grant(key text, row_key text) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SECURITY INVOKER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    head pglock.waiters;
    token bigint;
BEGIN
    PERFORM FROM pglock.semaphores s WHERE s.key = sem_grant.key FOR UPDATE;
    SELECT * INTO head FROM pglock.waiters w
    WHERE w.key = sem_grant.key || chr(31) AND w.granted IS NULL
      AND w.seen_at > clock_timestamp() - interval '1 second'
    ORDER BY w.ticket
    LIMIT 1
    FOR UPDATE;
    IF NOT FOUND OR split_part(sem_grant.row_key, chr(31), 2)::integer > head.permits
        OR pglock.sem_live(sem_grant.key) >= head.permits THEN
        RETURN false;
    END IF;
    token := pglock.fencing_token_next();
    UPDATE pglock.locks l
    SET owner = head.owner,
        fencing_token = greatest(token, l.fencing_token + 1),
        expires_at = clock_timestamp() + interval '1 second',
        acquired_at = clock_timestamp(),
        ttl_ms = 1000
    WHERE l.key = sem_grant.row_key;
    UPDATE pglock.waiters w
    SET granted = sem_grant.row_key, seen_at = clock_timestamp()
    WHERE w.key = head.key AND w.ticket = head.ticket;
    UPDATE pglock.semaphores s
    SET permits = head.permits, acquired_at = clock_timestamp()
    WHERE s.key = sem_grant.key;
    PERFORM pg_notify('pglock_granted', head.owner);
    RETURN true;
END $$;

-- sem_live as in 000017, a permit's semaphore read from its key.
CREATE OR REPLACE FUNCTION pglock.sem_live(key text) RETURNS integer
LANGUAGE sql VOLATILE STRICT SECURITY INVOKER SET search_path = pg_catalog, pg_temp AS $$
    SELECT count(*)::integer FROM pglock.locks l
    WHERE strpos(l.key, chr(31)) > 0 AND split_part(l.key, chr(31), 1) = sem_live.key
      AND l.owner IS NOT NULL AND l.expires_at > clock_timestamp()
$$;

-- sem_want as in 000027, a permit's semaphore read from its key.
CREATE OR REPLACE FUNCTION pglock.sem_want(key text, permits integer) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET enable_hashjoin = off SET enable_mergejoin = off AS $$
DECLARE
    live integer;
BEGIN
    IF NOT pglock.sem_key_ok(sem_want.key) THEN
        PERFORM pglock.lock_refuse('sem_want', 'key', 'a semaphore''s key: 1 to 495 characters without U+001F', sem_want.key);
    ELSIF sem_want.permits < 1 OR sem_want.permits > 1000 THEN
        PERFORM pglock.lock_refuse('sem_want', 'permits', '1 to 1000', sem_want.permits::text);
    END IF;
    UPDATE pglock.locks l
    SET wanted_at = clock_timestamp()
    FROM (SELECT h.key FROM pglock.locks h
          WHERE strpos(h.key, chr(31)) > 0 AND split_part(h.key, chr(31), 1) = sem_want.key
          ORDER BY h.key COLLATE "C") AS h
    WHERE l.key = h.key AND l.owner IS NOT NULL AND l.expires_at > clock_timestamp() AND l.wanted_at IS NULL;
    SELECT count(*) INTO live FROM pglock.locks l
    WHERE strpos(l.key, chr(31)) > 0 AND split_part(l.key, chr(31), 1) = sem_want.key
      AND l.owner IS NOT NULL AND l.expires_at > clock_timestamp();
    RETURN live >= sem_want.permits;
END $$;

-- lock_held as in 000027, a permit's semaphore read from its key.
CREATE OR REPLACE FUNCTION pglock.lock_held(key text, token bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    row_key text;
BEGIN
    IF NOT pglock.lock_key_ok(lock_held.key) THEN
        PERFORM pglock.lock_refuse('lock_held', 'key', 'a lock''s or a semaphore''s key: 1 to 500 characters without U+001F', lock_held.key);
    END IF;
    SELECT l.key INTO row_key FROM pglock.locks l
    WHERE l.key = lock_held.key AND l.owner IS NOT NULL
      AND l.fencing_token = lock_held.token AND l.expires_at > clock_timestamp()
    FOR KEY SHARE;
    IF NOT FOUND THEN
        SELECT l.key INTO row_key FROM pglock.locks l
        WHERE strpos(l.key, chr(31)) > 0 AND split_part(l.key, chr(31), 1) = lock_held.key
          AND l.owner IS NOT NULL AND l.fencing_token = lock_held.token AND l.expires_at > clock_timestamp()
        FOR KEY SHARE;
        IF NOT FOUND THEN
            RETURN false;
        END IF;
    END IF;
    IF current_setting('transaction_isolation') IN ('read committed', 'read uncommitted') THEN
        RETURN true;
    END IF;
    BEGIN
        PERFORM FROM pglock.locks l WHERE l.key = row_key FOR SHARE;
        RAISE SQLSTATE 'PGLK0'; -- undo the subtransaction: the FOR SHARE goes with it
    EXCEPTION WHEN SQLSTATE 'PGLK0' THEN
        NULL;
    END;
    RETURN true;
END $$;

-- sem_release_permits as in 000027, a permit's semaphore read from its key.
CREATE OR REPLACE FUNCTION pglock.sem_release_permits(sem text, row_keys text[], owners text[], OUT i integer)
RETURNS SETOF integer
LANGUAGE plpgsql VOLATILE SECURITY INVOKER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    queued boolean;
    r record;
    released text[] := '{}';
    hit integer[] := '{}';
BEGIN
    queued := EXISTS (SELECT FROM pglock.waiters w WHERE w.key = sem_release_permits.sem || chr(31));
    IF queued THEN
        PERFORM FROM pglock.semaphores s WHERE s.key = sem_release_permits.sem FOR UPDATE;
    END IF;
    FOR r IN
        SELECT l.key, u.i FROM pglock.locks l
        JOIN unnest(sem_release_permits.row_keys, sem_release_permits.owners) WITH ORDINALITY AS u(k, o, i)
          ON l.owner = u.o AND (l.key = u.k OR u.k IS NULL)
        WHERE strpos(l.key, chr(31)) > 0 AND split_part(l.key, chr(31), 1) = sem_release_permits.sem
          AND l.expires_at > clock_timestamp()
        ORDER BY l.key COLLATE "C"
        FOR NO KEY UPDATE OF l
    LOOP
        UPDATE pglock.locks l
        SET owner = NULL,
            expires_at = clock_timestamp(),
            wanted_at = CASE WHEN l.wanted_at IS NOT NULL THEN
                (SELECT NULL::timestamptz FROM pg_notify('pglock_released', l.key)) END
        WHERE l.key = r.key AND l.owner IS NOT NULL AND l.expires_at > clock_timestamp();
        IF FOUND THEN
            released := released || r.key;
            IF NOT r.i = ANY (hit) THEN
                hit := hit || r.i::integer;
            END IF;
        END IF;
    END LOOP;
    IF queued THEN
        FOR j IN 1..cardinality(released) LOOP
            PERFORM pglock.sem_grant(sem_release_permits.sem, released[j]);
        END LOOP;
    END IF;
    FOREACH i IN ARRAY hit LOOP
        RETURN NEXT;
    END LOOP;
END $$;

-- queue_acquire as in 000027, a permit's semaphore read from its key, and a lock's row
-- marked queued before its waiter's row is made.
CREATE OR REPLACE FUNCTION pglock.queue_acquire(key text, owner text, ttl_ms bigint, permits integer,
    OUT fencing_token bigint, OUT ticket bigint, OUT permit integer, OUT ahead integer)
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    held text;
BEGIN
    IF queue_acquire.permits < 0 OR queue_acquire.permits > 1000 THEN
        PERFORM pglock.lock_refuse('queue_acquire', 'permits', '0 (a lock) to 1000', queue_acquire.permits::text);
    ELSIF queue_acquire.permits = 0 AND NOT pglock.lock_key_ok(queue_acquire.key) THEN
        PERFORM pglock.lock_refuse('queue_acquire', 'key', 'a lock''s key: 1 to 500 characters without U+001F', queue_acquire.key);
    ELSIF queue_acquire.permits > 0 AND NOT pglock.sem_key_ok(queue_acquire.key) THEN
        PERFORM pglock.lock_refuse('queue_acquire', 'key', 'a semaphore''s key: 1 to 495 characters without U+001F', queue_acquire.key);
    ELSIF NOT pglock.lock_owner_ok(queue_acquire.owner) THEN
        PERFORM pglock.lock_refuse('queue_acquire', 'owner', '1 to 255 characters', queue_acquire.owner);
    ELSIF NOT pglock.lock_ttl_ok(queue_acquire.ttl_ms) THEN
        PERFORM pglock.lock_refuse('queue_acquire', 'ttl_ms', '1 to 31536000000 (365 days)', queue_acquire.ttl_ms::text);
    END IF;
    IF queue_acquire.permits > 0 THEN
        PERFORM pglock.sem_lock(queue_acquire.key, queue_acquire.permits);
        UPDATE pglock.locks l
        SET expires_at = clock_timestamp() + queue_acquire.ttl_ms * interval '1 millisecond'
        WHERE l.key = (SELECT h.key FROM pglock.locks h
                       WHERE strpos(h.key, chr(31)) > 0 AND split_part(h.key, chr(31), 1) = queue_acquire.key
                         AND h.owner = queue_acquire.owner
                         AND h.expires_at > clock_timestamp()
                       ORDER BY h.key COLLATE "C" LIMIT 1)
        RETURNING l.key, l.fencing_token INTO held, fencing_token;
        IF FOUND THEN
            permit := split_part(held, chr(31), 2)::integer;
            IF current_setting('synchronous_commit') IN ('off', 'local') THEN
                PERFORM set_config('synchronous_commit', 'on', true);
            END IF;
            RETURN;
        END IF;
        IF pglock.sem_waiting(queue_acquire.key, NULL) = 0 THEN
            SELECT t.permit, t.fencing_token INTO queue_acquire.permit, queue_acquire.fencing_token
            FROM pglock.sem_take(queue_acquire.key, queue_acquire.owner, queue_acquire.ttl_ms, queue_acquire.permits) t;
            IF fencing_token IS NOT NULL THEN
                RETURN;
            END IF;
        END IF;
        PERFORM set_config('synchronous_commit', 'off', true); -- queued: see 000020
        DELETE FROM pglock.waiters w
        WHERE w.key = queue_acquire.key || chr(31) AND w.seen_at < clock_timestamp() - interval '1 minute';
        INSERT INTO pglock.waiters AS w (key, owner, ttl_ms, permits, seen_at)
        VALUES (queue_acquire.key || chr(31), queue_acquire.owner, queue_acquire.ttl_ms, queue_acquire.permits,
                clock_timestamp())
        RETURNING w.ticket INTO ticket;
        ahead := (SELECT count(*)::integer
                 FROM (SELECT FROM pglock.waiters o
                       WHERE o.key = queue_acquire.key || chr(31) AND o.ticket < queue_acquire.ticket AND o.granted IS NULL
                         AND o.seen_at > clock_timestamp() - interval '1 second'
                       LIMIT 8) a);
        RETURN;
    END IF;
    -- A lock: beside the other waiters of the key that queue at once, ahead of a
    -- release (000023).
    PERFORM pg_advisory_xact_lock_shared(hashtextextended(queue_acquire.key, 1885826161));
    UPDATE pglock.locks l
    SET expires_at = clock_timestamp() + queue_acquire.ttl_ms * interval '1 millisecond'
    WHERE l.key = queue_acquire.key AND l.owner = queue_acquire.owner AND l.expires_at > clock_timestamp()
    RETURNING l.fencing_token INTO fencing_token;
    IF FOUND THEN
        IF current_setting('synchronous_commit') IN ('off', 'local') THEN
            PERFORM set_config('synchronous_commit', 'on', true);
        END IF;
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT FROM pglock.waiters w
                   WHERE w.key = queue_acquire.key AND w.granted IS NULL
                     AND w.seen_at > clock_timestamp() - interval '1 second') THEN
        fencing_token := pglock.lock_take(queue_acquire.key, queue_acquire.owner, queue_acquire.ttl_ms);
        IF fencing_token IS NOT NULL THEN
            RETURN;
        END IF;
    END IF;
    -- Queueing: the key's row says so first (queued), so that a release takes the key's
    -- queue lock and sees the waiter, and an acquisition outside the queue sees it.
    IF NOT coalesce((SELECT l.queued FROM pglock.locks l WHERE l.key = queue_acquire.key), true) THEN
        UPDATE pglock.locks l SET queued = true
        WHERE l.key = (SELECT f.key FROM pglock.locks f WHERE f.key = queue_acquire.key AND NOT f.queued
                       FOR NO KEY UPDATE SKIP LOCKED);
        IF NOT FOUND AND NOT coalesce((SELECT l.queued FROM pglock.locks l WHERE l.key = queue_acquire.key), true)
            -- A row another transaction has locked. Unless other waiters queue on the key
            -- now (one of them is marking it, and waiters never wait for each other), that
            -- transaction is no waiter: wait for it, with the key's queue lock to itself,
            -- and mark the row. A release that locked the row first has committed by now:
            -- the key may be free.
            AND pg_try_advisory_xact_lock(hashtextextended(queue_acquire.key, 1885826161)) THEN
            UPDATE pglock.locks l SET queued = true WHERE l.key = queue_acquire.key AND NOT l.queued;
            IF NOT EXISTS (SELECT FROM pglock.waiters w
                           WHERE w.key = queue_acquire.key AND w.granted IS NULL
                             AND w.seen_at > clock_timestamp() - interval '1 second') THEN
                fencing_token := pglock.lock_take(queue_acquire.key, queue_acquire.owner, queue_acquire.ttl_ms);
                IF fencing_token IS NOT NULL THEN
                    RETURN;
                END IF;
            END IF;
        END IF;
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true); -- queued: see 000020
    DELETE FROM pglock.waiters w
    WHERE w.key = queue_acquire.key AND w.seen_at < clock_timestamp() - interval '1 minute';
    INSERT INTO pglock.waiters AS w (key, owner, ttl_ms, permits, seen_at)
    VALUES (queue_acquire.key, queue_acquire.owner, queue_acquire.ttl_ms, 0, clock_timestamp())
    RETURNING w.ticket INTO ticket;
    ahead := (SELECT count(*)::integer
             FROM (SELECT FROM pglock.waiters o
                   WHERE o.key = queue_acquire.key AND o.ticket < queue_acquire.ticket AND o.granted IS NULL
                     AND o.seen_at > clock_timestamp() - interval '1 second'
                   LIMIT 8) a);
END $$;

-- queue_poll as in 000027, a claim writing the waiter's ttl_ms, and a lock's waiter
-- marking its key's row queued if its queueing could not.
CREATE OR REPLACE FUNCTION pglock.queue_poll(key text, ticket bigint,
    OUT fencing_token bigint, OUT queued boolean, OUT permit integer, OUT head boolean, OUT ahead integer)
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    w pglock.waiters;
    prior text := current_setting('synchronous_commit');
    qkey text;
    semaphore boolean := false;
    locked text; -- the lock row locked before the heartbeat
    taking boolean := false; -- what a take needs is locked
    held boolean; -- a lock's key has a live holder
    marked boolean; -- a lock's row is marked queued
BEGIN
    IF NOT pglock.lock_key_ok(queue_poll.key) THEN
        PERFORM pglock.lock_refuse('queue_poll', 'key', 'a lock''s or a semaphore''s key: 1 to 500 characters without U+001F', queue_poll.key);
    ELSIF queue_poll.ticket < 1 THEN
        PERFORM pglock.lock_refuse('queue_poll', 'ticket', 'above 0', queue_poll.ticket::text);
    END IF;
    queued := false;
    qkey := queue_poll.key;
    SELECT * INTO w FROM pglock.waiters o WHERE o.key = qkey AND o.ticket = queue_poll.ticket;
    IF NOT FOUND THEN
        qkey := queue_poll.key || chr(31);
        SELECT * INTO w FROM pglock.waiters o WHERE o.key = qkey AND o.ticket = queue_poll.ticket;
        IF NOT FOUND THEN
            RETURN;
        END IF;
        semaphore := true;
    END IF;
    IF semaphore THEN
        IF w.granted IS NOT NULL THEN
            PERFORM FROM pglock.locks l WHERE l.key = w.granted FOR NO KEY UPDATE;
            locked := w.granted;
        ELSIF pglock.sem_waiting(queue_poll.key, w.ticket) < w.permits - pglock.sem_live(queue_poll.key) THEN
            PERFORM pglock.sem_lock(queue_poll.key, w.permits);
            taking := true;
        END IF;
    ELSE
        SELECT l.owner IS NOT NULL AND l.expires_at > clock_timestamp(), l.queued INTO held, marked
        FROM pglock.locks l WHERE l.key = queue_poll.key;
        IF w.granted IS NOT NULL
            OR NOT coalesce(held, false) AND NOT EXISTS (
                SELECT FROM pglock.waiters o
                WHERE o.key = qkey AND o.ticket < w.ticket AND o.granted IS NULL
                  AND o.seen_at > clock_timestamp() - interval '1 second') THEN
            PERFORM pg_advisory_xact_lock(hashtextextended(queue_poll.key, 1885826161));
            PERFORM FROM pglock.locks l WHERE l.key = queue_poll.key FOR NO KEY UPDATE;
            locked := queue_poll.key;
            taking := true;
        END IF;
        IF NOT coalesce(marked, true) THEN
            -- The mark its queueing could not make (queue_acquire): now, if nobody has
            -- the row locked.
            UPDATE pglock.locks l SET queued = true
            WHERE l.key = (SELECT f.key FROM pglock.locks f WHERE f.key = queue_poll.key AND NOT f.queued
                           FOR NO KEY UPDATE SKIP LOCKED);
        END IF;
    END IF;
    -- The heartbeat: it row-locks the waiter's row, so that a grant under way
    -- (queue_grant's, sem_grant's FOR UPDATE) is seen here or comes after this call.
    PERFORM set_config('synchronous_commit', 'off', true);
    UPDATE pglock.waiters o SET seen_at = clock_timestamp()
    WHERE o.key = qkey AND o.ticket = queue_poll.ticket
    RETURNING * INTO w;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF w.granted IS NOT NULL THEN
        IF locked IS DISTINCT FROM w.granted THEN
            PERFORM FROM pglock.locks l WHERE l.key = w.granted FOR NO KEY UPDATE SKIP LOCKED;
            IF FOUND THEN
                locked := w.granted;
            END IF;
        END IF;
        IF locked IS NOT DISTINCT FROM w.granted THEN
            UPDATE pglock.locks l
            SET expires_at = clock_timestamp() + w.ttl_ms * interval '1 millisecond', ttl_ms = w.ttl_ms
            WHERE l.key = w.granted AND l.owner = w.owner AND l.expires_at > clock_timestamp()
            RETURNING l.fencing_token INTO fencing_token;
            IF FOUND THEN
                DELETE FROM pglock.waiters o WHERE o.key = w.key AND o.ticket = queue_poll.ticket;
                IF semaphore THEN
                    permit := split_part(w.granted, chr(31), 2)::integer;
                END IF;
                PERFORM set_config('synchronous_commit',
                    CASE WHEN prior IN ('off', 'local') THEN 'on' ELSE prior END, true);
                RETURN;
            END IF;
            -- The grant lapsed: the waiter waits again, from its place.
            UPDATE pglock.waiters o SET granted = NULL
            WHERE o.key = w.key AND o.ticket = queue_poll.ticket;
            w.granted := NULL;
        END IF;
    END IF;
    queued := true;
    SELECT count(*)::integer INTO ahead
    FROM (SELECT FROM pglock.waiters o
          WHERE o.key = w.key AND o.ticket < w.ticket AND o.granted IS NULL
            AND o.seen_at > clock_timestamp() - interval '1 second'
          LIMIT 8) a;
    head := ahead = 0;
    IF w.granted IS NOT NULL OR NOT taking THEN
        RETURN; -- a grant to claim at the next poll, or no take to try now
    END IF;
    IF semaphore THEN
        IF pglock.sem_waiting(queue_poll.key, w.ticket) >= w.permits - pglock.sem_live(queue_poll.key) THEN
            RETURN;
        END IF;
        SELECT t.permit, t.fencing_token INTO queue_poll.permit, queue_poll.fencing_token
        FROM pglock.sem_take(queue_poll.key, w.owner, w.ttl_ms, w.permits) t;
    ELSE
        IF ahead > 0 OR EXISTS (SELECT FROM pglock.locks l
                                WHERE l.key = queue_poll.key AND l.owner IS NOT NULL
                                  AND l.expires_at > clock_timestamp()) THEN
            RETURN;
        END IF;
        fencing_token := pglock.lock_take(queue_poll.key, w.owner, w.ttl_ms);
    END IF;
    IF fencing_token IS NOT NULL THEN
        DELETE FROM pglock.waiters o WHERE o.key = w.key AND o.ticket = queue_poll.ticket;
        queued := false;
        PERFORM set_config('synchronous_commit',
            CASE WHEN prior IN ('off', 'local') THEN 'on' ELSE prior END, true);
    END IF;
END $$;

-- lock_prune as in 000027, a permit's semaphore read from its key.
CREATE OR REPLACE FUNCTION pglock.lock_prune(older_than_ms bigint, max_rows integer) RETURNS bigint
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    doomed text[];
    top bigint;
    seq_last bigint;
    seq_called boolean;
    deleted bigint;
BEGIN
    IF NOT lock_prune.older_than_ms BETWEEN 0 AND 9223372036855 THEN
        PERFORM pglock.lock_refuse('lock_prune', 'older_than_ms', '0 to 9223372036855 (a time.Duration''s range)', lock_prune.older_than_ms::text);
    ELSIF lock_prune.max_rows < 1 THEN
        PERFORM pglock.lock_refuse('lock_prune', 'max_rows', '1 or more', lock_prune.max_rows::text);
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
    deleted := 0;
    IF doomed IS NOT NULL THEN
        -- A sequence only moves up here: a nextval between this read and the setval
        -- may be set back to top, but every token above top is still on its own row,
        -- whose next token is drawn above it (lock_take's greatest).
        SELECT s.last_value, s.is_called INTO seq_last, seq_called FROM pglock.fencing_token_seq s;
        IF seq_last < top OR (seq_last = top AND NOT seq_called) THEN
            PERFORM setval('pglock.fencing_token_seq', top);
        END IF;
        DELETE FROM pglock.locks l WHERE l.key = ANY (doomed);
        GET DIAGNOSTICS deleted = ROW_COUNT;
    END IF;
    DELETE FROM pglock.waiters w
    WHERE (w.key, w.ticket) IN (
        SELECT o.key, o.ticket FROM pglock.waiters o
        WHERE o.seen_at < clock_timestamp() - interval '1 minute'
        LIMIT lock_prune.max_rows
        FOR UPDATE SKIP LOCKED);
    DELETE FROM pglock.semaphores s
    WHERE s.key IN (
        SELECT e.key FROM pglock.semaphores e
        WHERE NOT EXISTS (SELECT FROM pglock.locks l
                          WHERE strpos(l.key, chr(31)) > 0 AND split_part(l.key, chr(31), 1) = e.key)
          AND NOT EXISTS (SELECT FROM pglock.waiters w WHERE w.key = e.key || chr(31))
        LIMIT lock_prune.max_rows
        FOR UPDATE SKIP LOCKED);
    RETURN deleted;
END $$;

-- lock_release_slow is new: as 000006 asks, no EXECUTE for PUBLIC, EXECUTE for the roles
-- that may call lock_acquire (it runs as its caller: such a role has no privilege on
-- the tables).
REVOKE ALL ON FUNCTION pglock.lock_release_slow(text, text) FROM PUBLIC;
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
        EXECUTE format('GRANT EXECUTE ON FUNCTION pglock.lock_release_slow(text, text) TO %s', r.grantee);
    END LOOP;
END $$;
