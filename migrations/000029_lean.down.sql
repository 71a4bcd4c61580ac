-- Back to 000028: the stored column semaphore and its index, the acquired_at trigger,
-- no queued column, and the functions as 000027 left them.
ALTER TABLE pglock.locks ADD COLUMN IF NOT EXISTS semaphore text
    GENERATED ALWAYS AS (CASE WHEN strpos(key, chr(31)) > 0 THEN split_part(key, chr(31), 1) END) STORED;
CREATE INDEX IF NOT EXISTS locks_semaphore ON pglock.locks (semaphore) WHERE semaphore IS NOT NULL;
DROP INDEX IF EXISTS pglock.locks_semaphore_of;

CREATE OR REPLACE FUNCTION pglock.locks_set_acquired_at()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    NEW.acquired_at := clock_timestamp();
    NEW.ttl_ms := round(extract(epoch FROM NEW.expires_at - NEW.acquired_at) * 1000)::bigint;
    RETURN NEW;
END $function$
;

REVOKE ALL ON FUNCTION pglock.locks_set_acquired_at() FROM PUBLIC;
DROP TRIGGER IF EXISTS locks_acquired_at_insert ON pglock.locks;
DROP TRIGGER IF EXISTS locks_acquired_at_update ON pglock.locks;
CREATE TRIGGER locks_acquired_at_insert BEFORE INSERT ON pglock.locks
    FOR EACH ROW EXECUTE FUNCTION pglock.locks_set_acquired_at();
CREATE TRIGGER locks_acquired_at_update BEFORE UPDATE ON pglock.locks
    FOR EACH ROW WHEN (old.fencing_token IS DISTINCT FROM new.fencing_token) EXECUTE FUNCTION pglock.locks_set_acquired_at();

CREATE OR REPLACE FUNCTION pglock.lock_acquire(key text, owner text, ttl_ms bigint)
 RETURNS bigint
 LANGUAGE plpgsql
 STRICT SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    IF NOT pglock.lock_key_ok(lock_acquire.key) THEN
        PERFORM pglock.lock_refuse('lock_acquire', 'key', 'a lock''s key: 1 to 500 characters without U+001F', lock_acquire.key);
    ELSIF NOT pglock.lock_owner_ok(lock_acquire.owner) THEN
        PERFORM pglock.lock_refuse('lock_acquire', 'owner', '1 to 255 characters', lock_acquire.owner);
    ELSIF NOT pglock.lock_ttl_ok(lock_acquire.ttl_ms) THEN
        PERFORM pglock.lock_refuse('lock_acquire', 'ttl_ms', '1 to 31536000000 (365 days)', lock_acquire.ttl_ms::text);
    END IF;
    IF EXISTS (SELECT FROM pglock.waiters w
               WHERE w.key = lock_acquire.key AND w.granted IS NULL
                 AND w.seen_at > clock_timestamp() - interval '1 second') THEN
        RETURN NULL;
    END IF;
    RETURN pglock.lock_take(lock_acquire.key, lock_acquire.owner, lock_acquire.ttl_ms);
END $function$
;

CREATE OR REPLACE FUNCTION pglock.lock_take(key text, owner text, ttl_ms bigint)
 RETURNS bigint
 LANGUAGE plpgsql
 STRICT
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
        -- A new key: another transaction creating its row now holds it (see above).
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
        expires_at = clock_timestamp() + lock_take.ttl_ms * interval '1 millisecond'
    WHERE l.key = lock_take.key
    RETURNING l.fencing_token INTO token;
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    RETURN token;
END $function$
;

CREATE OR REPLACE FUNCTION pglock.lock_release(key text, owner text)
 RETURNS boolean
 LANGUAGE plpgsql
 STRICT SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    IF NOT pglock.lock_row_key_ok(lock_release.key) THEN
        PERFORM pglock.lock_refuse('lock_release', 'key', 'a lock''s key or a permit''s row key', lock_release.key);
    ELSIF NOT pglock.lock_owner_ok(lock_release.owner) THEN
        PERFORM pglock.lock_refuse('lock_release', 'owner', '1 to 255 characters', lock_release.owner);
    END IF;
    IF strpos(lock_release.key, chr(31)) = 0 THEN
        RETURN pglock.lock_release_key(lock_release.key, lock_release.owner);
    END IF;
    RETURN EXISTS (SELECT FROM pglock.sem_release_permits(split_part(lock_release.key, chr(31), 1),
        ARRAY[lock_release.key], ARRAY[lock_release.owner]));
END $function$
;

CREATE OR REPLACE FUNCTION pglock.lock_release_async(key text, owner text)
 RETURNS boolean
 LANGUAGE plpgsql
 STRICT SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    RETURN pglock.lock_release(lock_release_async.key, lock_release_async.owner);
END $function$
;

CREATE OR REPLACE FUNCTION pglock.lock_release_key(key text, owner text)
 RETURNS boolean
 LANGUAGE plpgsql
 STRICT
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(lock_release_key.key, 1885826161));
    UPDATE pglock.locks l
    SET owner = NULL,
        expires_at = clock_timestamp(),
        wanted_at = CASE WHEN l.wanted_at IS NOT NULL THEN
            (SELECT NULL::timestamptz FROM pg_notify('pglock_released', l.key)) END
    WHERE l.key = lock_release_key.key AND l.owner = lock_release_key.owner
      AND l.expires_at > clock_timestamp();
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF EXISTS (SELECT FROM pglock.waiters w WHERE w.key = lock_release_key.key) THEN
        PERFORM pglock.queue_grant(lock_release_key.key);
    END IF;
    RETURN true;
END $function$
;

CREATE OR REPLACE FUNCTION pglock.lock_force_release(key text, OUT owner text, OUT fencing_token bigint, OUT expires_at timestamp with time zone, OUT expires_in_us bigint, OUT wanted boolean)
 RETURNS record
 LANGUAGE plpgsql
 STRICT SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
            (SELECT NULL::timestamptz FROM pg_notify('pglock_released', l.key)) END
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
END $function$
;

CREATE OR REPLACE FUNCTION pglock.queue_grant(key text)
 RETURNS boolean
 LANGUAGE plpgsql
 STRICT
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
        expires_at = clock_timestamp() + interval '1 second'
    WHERE l.key = queue_grant.key;
    UPDATE pglock.waiters w
    SET granted = queue_grant.key, seen_at = clock_timestamp()
    WHERE w.key = head.key AND w.ticket = head.ticket;
    PERFORM pg_notify('pglock_granted', head.owner);
    RETURN true;
END $function$
;

CREATE OR REPLACE FUNCTION pglock.sem_grant(key text, row_key text)
 RETURNS boolean
 LANGUAGE plpgsql
 STRICT
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
        expires_at = clock_timestamp() + interval '1 second'
    WHERE l.key = sem_grant.row_key;
    UPDATE pglock.waiters w
    SET granted = sem_grant.row_key, seen_at = clock_timestamp()
    WHERE w.key = head.key AND w.ticket = head.ticket;
    UPDATE pglock.semaphores s
    SET permits = head.permits, acquired_at = clock_timestamp()
    WHERE s.key = sem_grant.key;
    PERFORM pg_notify('pglock_granted', head.owner);
    RETURN true;
END $function$
;

CREATE OR REPLACE FUNCTION pglock.sem_live(key text)
 RETURNS integer
 LANGUAGE sql
 STRICT
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
    SELECT count(*)::integer FROM pglock.locks l
    WHERE l.semaphore = sem_live.key AND l.owner IS NOT NULL AND l.expires_at > clock_timestamp()
$function$
;

CREATE OR REPLACE FUNCTION pglock.sem_want(key text, permits integer)
 RETURNS boolean
 LANGUAGE plpgsql
 STRICT SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
 SET enable_hashjoin TO 'off'
 SET enable_mergejoin TO 'off'
AS $function$
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
    FROM (SELECT h.key FROM pglock.locks h WHERE h.semaphore = sem_want.key ORDER BY h.key COLLATE "C") AS h
    WHERE l.key = h.key AND l.owner IS NOT NULL AND l.expires_at > clock_timestamp() AND l.wanted_at IS NULL;
    SELECT count(*) INTO live FROM pglock.locks l
    WHERE l.semaphore = sem_want.key AND l.owner IS NOT NULL AND l.expires_at > clock_timestamp();
    RETURN live >= sem_want.permits;
END $function$
;

CREATE OR REPLACE FUNCTION pglock.lock_held(key text, token bigint)
 RETURNS boolean
 LANGUAGE plpgsql
 STRICT SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
        WHERE l.semaphore = lock_held.key AND l.owner IS NOT NULL
          AND l.fencing_token = lock_held.token AND l.expires_at > clock_timestamp()
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
END $function$
;

CREATE OR REPLACE FUNCTION pglock.sem_release_permits(sem text, row_keys text[], owners text[], OUT i integer)
 RETURNS SETOF integer
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
          ON l.owner = u.o AND (l.key = u.k OR u.k IS NULL AND l.semaphore = sem_release_permits.sem)
        WHERE l.semaphore = sem_release_permits.sem AND l.expires_at > clock_timestamp()
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
END $function$
;

CREATE OR REPLACE FUNCTION pglock.queue_acquire(key text, owner text, ttl_ms bigint, permits integer, OUT fencing_token bigint, OUT ticket bigint, OUT permit integer, OUT ahead integer)
 RETURNS record
 LANGUAGE plpgsql
 STRICT SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
                       WHERE h.semaphore = queue_acquire.key AND h.owner = queue_acquire.owner
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
END $function$
;

CREATE OR REPLACE FUNCTION pglock.queue_poll(key text, ticket bigint, OUT fencing_token bigint, OUT queued boolean, OUT permit integer, OUT head boolean, OUT ahead integer)
 RETURNS record
 LANGUAGE plpgsql
 STRICT SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    w pglock.waiters;
    prior text := current_setting('synchronous_commit');
    qkey text;
    semaphore boolean := false;
    locked text; -- the lock row locked before the heartbeat
    taking boolean := false; -- what a take needs is locked
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
    ELSIF w.granted IS NOT NULL
        OR NOT EXISTS (SELECT FROM pglock.waiters o
                       WHERE o.key = qkey AND o.ticket < w.ticket AND o.granted IS NULL
                         AND o.seen_at > clock_timestamp() - interval '1 second')
           AND NOT EXISTS (SELECT FROM pglock.locks l
                           WHERE l.key = queue_poll.key AND l.owner IS NOT NULL AND l.expires_at > clock_timestamp()) THEN
        PERFORM pg_advisory_xact_lock(hashtextextended(queue_poll.key, 1885826161));
        PERFORM FROM pglock.locks l WHERE l.key = queue_poll.key FOR NO KEY UPDATE;
        locked := queue_poll.key;
        taking := true;
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
            SET expires_at = clock_timestamp() + w.ttl_ms * interval '1 millisecond'
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
END $function$
;

CREATE OR REPLACE FUNCTION pglock.lock_prune(older_than_ms bigint, max_rows integer)
 RETURNS bigint
 LANGUAGE plpgsql
 STRICT SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
        WHERE NOT EXISTS (SELECT FROM pglock.locks l WHERE l.semaphore = e.key)
          AND NOT EXISTS (SELECT FROM pglock.waiters w WHERE w.key = e.key || chr(31))
        LIMIT lock_prune.max_rows
        FOR UPDATE SKIP LOCKED);
    RETURN deleted;
END $function$
;

DROP FUNCTION IF EXISTS pglock.lock_release_slow(text, text);
ALTER TABLE pglock.locks DROP COLUMN IF EXISTS queued;
