-- Back to 000026: the functions as they were, the helpers of 000027 dropped.
CREATE OR REPLACE FUNCTION pglock.fencing_token_next()
 RETURNS bigint
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    token bigint;
    floor bigint;
BEGIN
    token := nextval('pglock.fencing_token_seq');
    floor := (('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1) << 40;
    IF token <= floor THEN
        PERFORM pg_advisory_xact_lock(2736408391470914537);
        token := nextval('pglock.fencing_token_seq');
        IF token <= floor THEN
            token := setval('pglock.fencing_token_seq', floor + 1);
        END IF;
    END IF;
    RETURN token;
END $function$
;

CREATE OR REPLACE FUNCTION pglock.job_run_record(job text, instance text, owner text, token bigint, ended_ago_us bigint, duration_us bigint, outcome text, err text, retention_ms bigint)
 RETURNS bigint
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    ended timestamptz;
    run_id bigint;
BEGIN
    IF job_run_record.job IS NULL OR job_run_record.instance IS NULL OR job_run_record.owner IS NULL
        OR job_run_record.token IS NULL OR job_run_record.outcome IS NULL
        OR job_run_record.job = '' OR length(job_run_record.job) > 500
        OR NOT job_run_record.ended_ago_us >= 0 OR NOT job_run_record.duration_us >= 0
        OR NOT job_run_record.retention_ms > 0 THEN
        RAISE EXCEPTION 'pglock.job_run_record: job (1 to 500 characters), instance, owner, token and outcome must not be null, ended_ago_us and duration_us must be >= 0 and retention_ms > 0'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    ended := statement_timestamp() - job_run_record.ended_ago_us * interval '1 microsecond';
    PERFORM set_config('synchronous_commit', 'off', true);
    INSERT INTO pglock.job_runs AS r (job, instance, owner, fencing_token, started_at, ended_at, outcome, error)
    VALUES (job_run_record.job, job_run_record.instance, job_run_record.owner, job_run_record.token,
            ended - job_run_record.duration_us * interval '1 microsecond', ended,
            job_run_record.outcome, left(job_run_record.err, 1000))
    RETURNING r.id INTO run_id;
    IF run_id % 16 = 0 THEN
        DELETE FROM pglock.job_runs r
        WHERE r.id IN (
            SELECT o.id FROM pglock.job_runs o
            WHERE o.job = job_run_record.job
              AND o.ended_at < clock_timestamp() - job_run_record.retention_ms * interval '1 millisecond'
            ORDER BY o.ended_at, o.id
            LIMIT 64
            FOR UPDATE SKIP LOCKED);
    END IF;
    RETURN run_id;
END $function$
;

CREATE OR REPLACE FUNCTION pglock.job_skips_record(instance text, skips json, retention_ms bigint)
 RETURNS integer
 LANGUAGE plpgsql
 STRICT SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    written integer;
BEGIN
    IF NOT job_skips_record.retention_ms > 0 THEN
        RAISE EXCEPTION 'pglock.job_skips_record: retention_ms must be > 0, not %', job_skips_record.retention_ms
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    INSERT INTO pglock.job_skips AS s (job, instance, reason, count, last_at)
    SELECT e.job, job_skips_record.instance, e.reason, e.count,
           statement_timestamp() - e.ago_us * interval '1 microsecond'
    FROM json_to_recordset(job_skips_record.skips) AS e(job text, reason text, count bigint, ago_us bigint)
    ON CONFLICT ON CONSTRAINT job_skips_pkey DO UPDATE
    SET count = s.count + excluded.count,
        last_at = greatest(s.last_at, excluded.last_at);
    GET DIAGNOSTICS written = ROW_COUNT;
    DELETE FROM pglock.job_skips s
    WHERE s.job IN (SELECT e.job FROM json_to_recordset(job_skips_record.skips) AS e(job text))
      AND s.last_at < clock_timestamp() - job_skips_record.retention_ms * interval '1 millisecond';
    RETURN written;
END $function$
;

CREATE OR REPLACE FUNCTION pglock.lock_acquire(key text, owner text, ttl_ms bigint)
 RETURNS bigint
 LANGUAGE plpgsql
 STRICT SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    IF lock_acquire.key = '' OR length(lock_acquire.key) > 500 OR lock_acquire.owner = ''
        OR lock_acquire.ttl_ms < 1 OR lock_acquire.ttl_ms > 31536000000 THEN
        RAISE EXCEPTION 'pglock.lock_acquire: want a key of 1 to 500 characters, an owner and a ttl_ms of 1 to 31536000000 (365 days), not a key of % characters, owner %L and ttl_ms %',
            length(lock_acquire.key), lock_acquire.owner, lock_acquire.ttl_ms
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT FROM pglock.waiters w
               WHERE w.key = lock_acquire.key AND w.granted IS NULL
                 AND w.seen_at > clock_timestamp() - interval '1 second') THEN
        RETURN NULL;
    END IF;
    RETURN pglock.lock_take(lock_acquire.key, lock_acquire.owner, lock_acquire.ttl_ms);
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
BEGIN
    IF lock_force_release.key = '' OR length(lock_force_release.key) > 500 THEN
        RAISE EXCEPTION 'pglock.lock_force_release: want a key of 1 to 500 characters, not %', length(lock_force_release.key)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended(lock_force_release.key, 1885826161)); -- the queue's order: see above
    SELECT l.owner, l.fencing_token, l.expires_at, l.wanted_at IS NOT NULL, l.semaphore
    INTO lock_force_release.owner, lock_force_release.fencing_token,
         lock_force_release.expires_at, lock_force_release.wanted, sem
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
    ELSIF EXISTS (SELECT FROM pglock.waiters w WHERE w.key = sem || chr(31)) THEN
        PERFORM pglock.sem_grant(sem, lock_force_release.key);
    END IF;
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
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
    IF lock_held.key = '' OR length(lock_held.key) > 500 THEN
        RAISE EXCEPTION 'pglock.lock_held: want a key of 1 to 500 characters, not %', length(lock_held.key)
            USING ERRCODE = 'invalid_parameter_value';
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

CREATE OR REPLACE FUNCTION pglock.lock_holder(key text, OUT owner text, OUT fencing_token bigint, OUT expires_in_us bigint)
 RETURNS record
 LANGUAGE sql
 STRICT SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
    SELECT l.owner, l.fencing_token, (extract(epoch FROM l.expires_at - clock_timestamp()) * 1000000)::bigint
    FROM pglock.locks l
    WHERE l.key = lock_holder.key AND l.owner IS NOT NULL AND l.expires_at > clock_timestamp()
$function$
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
    deleted := 0;
    IF doomed IS NOT NULL THEN
        SELECT s.last_value, s.is_called INTO seq_last, seq_called FROM pglock.fencing_token_seq s;
        -- The next nextval is last_value + increment once called, last_value before.
        IF seq_last < top OR (seq_last = top AND NOT seq_called) THEN
            PERFORM setval('pglock.fencing_token_seq', top);
        END IF;
        -- The rows are locked by this transaction: nobody changed them since.
        DELETE FROM pglock.locks l WHERE l.key = ANY (doomed);
        GET DIAGNOSTICS deleted = ROW_COUNT;
    END IF;
    -- What the queues and the semaphores leave behind, as many rows of each at most:
    -- waiters not polled for a minute (their clients died; queue_acquire deletes them
    -- too, but only at their key's next queueing, and queue_poll has them queue again),
    -- and semaphores none of whose permits has a row left (sem_lock inserts the row
    -- again at the next acquisition; the row is the semaphore's mutex and its last N).
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
        LIMIT lock_prune.max_rows
        FOR UPDATE SKIP LOCKED);
    RETURN deleted;
END $function$
;

CREATE OR REPLACE FUNCTION pglock.lock_release(key text, owner text)
 RETURNS boolean
 LANGUAGE plpgsql
 STRICT SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    sem text;
BEGIN
    IF lock_release.key = '' OR length(lock_release.key) > 500 OR lock_release.owner = '' THEN
        RAISE EXCEPTION 'pglock.lock_release: want a key of 1 to 500 characters and an owner, not a key of % characters and owner %L',
            length(lock_release.key), lock_release.owner
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended(lock_release.key, 1885826161)); -- the queue's order: see above
    UPDATE pglock.locks l
    SET owner = NULL,
        expires_at = clock_timestamp(),
        wanted_at = CASE WHEN l.wanted_at IS NOT NULL THEN
            (SELECT NULL::timestamptz FROM pg_notify('pglock_released', l.key)) END
    WHERE l.key = lock_release.key AND l.owner = lock_release.owner
      AND l.expires_at > clock_timestamp()
    RETURNING l.semaphore INTO sem;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF sem IS NULL THEN
        IF EXISTS (SELECT FROM pglock.waiters w WHERE w.key = lock_release.key) THEN
            PERFORM pglock.queue_grant(lock_release.key);
        END IF;
    ELSIF EXISTS (SELECT FROM pglock.waiters w WHERE w.key = sem || chr(31)) THEN
        PERFORM pglock.sem_grant(sem, lock_release.key);
    END IF;
    RETURN true;
END $function$
;

CREATE OR REPLACE FUNCTION pglock.lock_release_many(keys text[], owners text[], async boolean)
 RETURNS SETOF integer
 LANGUAGE plpgsql
 STRICT SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
END $function$
;

CREATE OR REPLACE FUNCTION pglock.lock_renew(key text, owner text, ttl_ms bigint)
 RETURNS boolean
 LANGUAGE plpgsql
 STRICT SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    IF lock_renew.key = '' OR length(lock_renew.key) > 500 OR lock_renew.owner = ''
        OR lock_renew.ttl_ms < 1 OR lock_renew.ttl_ms > 31536000000 THEN
        RAISE EXCEPTION 'pglock.lock_renew: want a key of 1 to 500 characters, an owner and a ttl_ms of 1 to 31536000000 (365 days), not a key of % characters, owner %L and ttl_ms %',
            length(lock_renew.key), lock_renew.owner, lock_renew.ttl_ms
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE pglock.locks l
    SET expires_at = clock_timestamp() + lock_renew.ttl_ms * interval '1 millisecond'
    WHERE l.key = lock_renew.key AND l.owner = lock_renew.owner
      AND l.expires_at > clock_timestamp();
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    RETURN true;
END $function$
;

CREATE OR REPLACE FUNCTION pglock.lock_renew_many(keys text[], owners text[], ttl_ms bigint)
 RETURNS SETOF text
 LANGUAGE plpgsql
 STRICT SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
 SET enable_hashjoin TO 'off'
 SET enable_mergejoin TO 'off'
AS $function$
BEGIN
    IF lock_renew_many.ttl_ms < 1 OR lock_renew_many.ttl_ms > 31536000000
        OR cardinality(lock_renew_many.keys) <> cardinality(lock_renew_many.owners)
        OR EXISTS (SELECT FROM unnest(lock_renew_many.keys, lock_renew_many.owners) AS u(key, owner)
                   WHERE u.key IS NULL OR u.key = '' OR length(u.key) > 500 OR u.owner IS NULL OR u.owner = '') THEN
        RAISE EXCEPTION 'pglock.lock_renew_many: want as many keys as owners, keys of 1 to 500 characters, owners and a ttl_ms of 1 to 31536000000 (365 days), not % keys, % owners and ttl_ms %',
            cardinality(lock_renew_many.keys), cardinality(lock_renew_many.owners), lock_renew_many.ttl_ms
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    UPDATE pglock.locks l
    SET expires_at = clock_timestamp() + lock_renew_many.ttl_ms * interval '1 millisecond'
    FROM (SELECT u.key, u.owner FROM unnest(lock_renew_many.keys, lock_renew_many.owners) AS u(key, owner)
          ORDER BY u.key) AS u
    WHERE l.key = u.key AND l.owner = u.owner AND l.expires_at > clock_timestamp()
    RETURNING l.key;
    IF FOUND AND current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
END $function$
;

CREATE OR REPLACE FUNCTION pglock.lock_want(key text)
 RETURNS boolean
 LANGUAGE plpgsql
 STRICT SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    held boolean;
    marked boolean;
BEGIN
    IF lock_want.key = '' OR length(lock_want.key) > 500 THEN
        RAISE EXCEPTION 'pglock.lock_want: want a key of 1 to 500 characters, not %', length(lock_want.key)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR pass IN 1..2 LOOP
        UPDATE pglock.locks l
        SET wanted_at = clock_timestamp()
        WHERE l.key = lock_want.key AND l.owner IS NOT NULL
          AND l.expires_at > clock_timestamp() AND l.wanted_at IS NULL;
        IF FOUND THEN
            RETURN true;
        END IF;
        SELECT l.owner IS NOT NULL AND l.expires_at > clock_timestamp(), l.wanted_at IS NOT NULL
        INTO held, marked
        FROM pglock.locks l
        WHERE l.key = lock_want.key;
        IF NOT coalesce(held, false) THEN
            RETURN false;
        END IF;
        IF marked THEN
            RETURN true;
        END IF;
    END LOOP;
    RETURN false;
END $function$
;

CREATE OR REPLACE FUNCTION pglock.queue_acquire(key text, owner text, ttl_ms bigint, permits integer, OUT fencing_token bigint, OUT ticket bigint, OUT permit integer, OUT ahead integer)
 RETURNS record
 LANGUAGE plpgsql
 STRICT SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    IF queue_acquire.key = '' OR queue_acquire.owner = ''
        OR queue_acquire.ttl_ms < 1 OR queue_acquire.ttl_ms > 31536000000
        OR queue_acquire.permits < 0 OR queue_acquire.permits > 1000
        OR queue_acquire.permits = 0 AND length(queue_acquire.key) > 500
        OR queue_acquire.permits > 0 AND (length(queue_acquire.key) > 495 OR strpos(queue_acquire.key, chr(31)) > 0) THEN
        RAISE EXCEPTION 'pglock.queue_acquire: want a key of 1 to 500 characters (1 to 495 without U+001F for a semaphore), an owner, a ttl_ms of 1 to 31536000000 (365 days) and permits of 0 (a lock) to 1000, not a key of % characters, owner %L, ttl_ms % and permits %',
            length(queue_acquire.key), queue_acquire.owner, queue_acquire.ttl_ms, queue_acquire.permits
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF queue_acquire.permits > 0 THEN
        PERFORM pglock.sem_lock(queue_acquire.key, queue_acquire.permits);
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
    -- release (see above).
    PERFORM pg_advisory_xact_lock_shared(hashtextextended(queue_acquire.key, 1885826161));
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

CREATE OR REPLACE FUNCTION pglock.queue_leave(key text, ticket bigint)
 RETURNS boolean
 LANGUAGE plpgsql
 STRICT SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    w pglock.waiters;
BEGIN
    IF queue_leave.key = '' OR length(queue_leave.key) > 500 OR queue_leave.ticket < 1 THEN
        RAISE EXCEPTION 'pglock.queue_leave: want a key of 1 to 500 characters and a ticket above 0, not a key of % characters and ticket %',
            length(queue_leave.key), queue_leave.ticket
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO w FROM pglock.waiters o
    WHERE o.key = queue_leave.key || chr(31) AND o.ticket = queue_leave.ticket;
    IF FOUND THEN
        -- A semaphore's waiter: its granted permit's row first (the lock order).
        IF w.granted IS NOT NULL THEN
            PERFORM FROM pglock.locks l WHERE l.key = w.granted FOR NO KEY UPDATE;
        END IF;
        DELETE FROM pglock.waiters o WHERE o.key = queue_leave.key || chr(31) AND o.ticket = queue_leave.ticket
        RETURNING * INTO w;
        IF NOT FOUND THEN
            RETURN false;
        END IF;
        IF w.granted IS NOT NULL THEN
            UPDATE pglock.locks l
            SET owner = NULL, expires_at = clock_timestamp()
            WHERE l.key = w.granted AND l.owner = w.owner AND l.expires_at > clock_timestamp();
            IF FOUND THEN
                PERFORM pglock.sem_grant(queue_leave.key, w.granted);
            END IF;
        END IF;
        RETURN true;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended(queue_leave.key, 1885826161)); -- the queue's order: see above
    PERFORM FROM pglock.locks l WHERE l.key = queue_leave.key FOR NO KEY UPDATE;
    DELETE FROM pglock.waiters o WHERE o.key = queue_leave.key AND o.ticket = queue_leave.ticket
    RETURNING * INTO w;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF w.granted IS NOT NULL THEN
        UPDATE pglock.locks l
        SET owner = NULL, expires_at = clock_timestamp()
        WHERE l.key = w.granted AND l.owner = w.owner AND l.expires_at > clock_timestamp();
        IF FOUND THEN
            PERFORM pglock.queue_grant(queue_leave.key);
        END IF;
    END IF;
    RETURN true;
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
    semaphore boolean;
    locked boolean := false;
BEGIN
    IF queue_poll.key = '' OR length(queue_poll.key) > 500 OR queue_poll.ticket < 1 THEN
        RAISE EXCEPTION 'pglock.queue_poll: want a key of 1 to 500 characters and a ticket above 0, not a key of % characters and ticket %',
            length(queue_poll.key), queue_poll.ticket
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    queued := false;
    semaphore := EXISTS (SELECT FROM pglock.waiters o
                         WHERE o.key = queue_poll.key || chr(31) AND o.ticket = queue_poll.ticket);
    IF semaphore THEN
        -- The semaphore's row before the waiter's (the lock order), and only when a take
        -- looks possible: not granted, and fewer live waiters ahead than free permits.
        SELECT * INTO w FROM pglock.waiters o
        WHERE o.key = queue_poll.key || chr(31) AND o.ticket = queue_poll.ticket;
        IF w.granted IS NULL AND pglock.sem_waiting(queue_poll.key, w.ticket)
                < w.permits - pglock.sem_live(queue_poll.key) THEN
            PERFORM FROM pglock.semaphores s WHERE s.key = queue_poll.key FOR UPDATE;
            locked := true;
        END IF;
    END IF;
    -- The heartbeat first: it row-locks the waiter's row, so that a grant under way
    -- (queue_grant's, sem_grant's FOR UPDATE) is seen here or comes after this call.
    PERFORM set_config('synchronous_commit', 'off', true);
    UPDATE pglock.waiters o SET seen_at = clock_timestamp()
    WHERE o.key = CASE WHEN semaphore THEN queue_poll.key || chr(31) ELSE queue_poll.key END
      AND o.ticket = queue_poll.ticket
    RETURNING * INTO w;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF w.granted IS NOT NULL THEN
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
    END IF;
    queued := true;
    SELECT count(*)::integer INTO ahead
    FROM (SELECT FROM pglock.waiters o
          WHERE o.key = w.key AND o.ticket < w.ticket AND o.granted IS NULL
            AND o.seen_at > clock_timestamp() - interval '1 second'
          LIMIT 8) a;
    head := ahead = 0;
    IF semaphore THEN
        -- A take, under the semaphore's row lock taken above; a lapsed grant's waiter
        -- takes at its next poll.
        IF NOT locked OR pglock.sem_waiting(queue_poll.key, w.ticket)
                >= w.permits - pglock.sem_live(queue_poll.key) THEN
            RETURN;
        END IF;
        SELECT t.permit, t.fencing_token INTO queue_poll.permit, queue_poll.fencing_token
        FROM pglock.sem_take(queue_poll.key, w.owner, w.ttl_ms, w.permits) t;
        IF fencing_token IS NOT NULL THEN
            DELETE FROM pglock.waiters o WHERE o.key = w.key AND o.ticket = queue_poll.ticket;
            queued := false;
            PERFORM set_config('synchronous_commit',
                CASE WHEN prior IN ('off', 'local') THEN 'on' ELSE prior END, true);
        END IF;
        RETURN;
    END IF;
    IF EXISTS (SELECT FROM pglock.locks l
               WHERE l.key = queue_poll.key AND l.owner IS NOT NULL AND l.expires_at > clock_timestamp()) THEN
        RETURN;
    END IF;
    -- Free: the head of the live queue takes it, once every waiter queueing now is in
    -- the queue (see above), under the row lock.
    PERFORM pg_advisory_xact_lock(hashtextextended(queue_poll.key, 1885826161)); -- the queue's order: see above
    PERFORM FROM pglock.locks l WHERE l.key = queue_poll.key FOR NO KEY UPDATE;
    IF EXISTS (SELECT FROM pglock.waiters o
               WHERE o.key = queue_poll.key AND o.ticket < queue_poll.ticket AND o.granted IS NULL
                 AND o.seen_at > clock_timestamp() - interval '1 second') THEN
        RETURN;
    END IF;
    fencing_token := pglock.lock_take(queue_poll.key, w.owner, w.ttl_ms);
    IF fencing_token IS NOT NULL THEN
        DELETE FROM pglock.waiters o WHERE o.key = queue_poll.key AND o.ticket = queue_poll.ticket;
        queued := false;
        PERFORM set_config('synchronous_commit',
            CASE WHEN prior IN ('off', 'local') THEN 'on' ELSE prior END, true);
    END IF;
END $function$
;

CREATE OR REPLACE FUNCTION pglock.registry_touch(kind text, keys text[], instance text, registering boolean)
 RETURNS integer
 LANGUAGE plpgsql
 STRICT SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
END $function$
;

CREATE OR REPLACE FUNCTION pglock.sem_acquire(key text, owner text, ttl_ms bigint, permits integer, OUT permit integer, OUT fencing_token bigint)
 RETURNS record
 LANGUAGE plpgsql
 STRICT SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    IF sem_acquire.key = '' OR length(sem_acquire.key) > 495 OR strpos(sem_acquire.key, chr(31)) > 0
        OR sem_acquire.owner = '' OR sem_acquire.ttl_ms < 1 OR sem_acquire.ttl_ms > 31536000000
        OR sem_acquire.permits < 1 OR sem_acquire.permits > 1000 THEN
        RAISE EXCEPTION 'pglock.sem_acquire: want a key of 1 to 495 characters without U+001F, an owner, a ttl_ms of 1 to 31536000000 (365 days) and permits of 1 to 1000, not a key of % characters, owner %, ttl_ms % and permits %',
            length(sem_acquire.key), quote_literal(sem_acquire.owner), sem_acquire.ttl_ms, sem_acquire.permits
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pglock.sem_lock(sem_acquire.key, sem_acquire.permits);
    IF pglock.sem_waiting(sem_acquire.key, NULL) > 0 THEN
        RETURN;
    END IF;
    SELECT t.permit, t.fencing_token INTO sem_acquire.permit, sem_acquire.fencing_token
    FROM pglock.sem_take(sem_acquire.key, sem_acquire.owner, sem_acquire.ttl_ms, sem_acquire.permits) t;
END $function$
;

CREATE OR REPLACE FUNCTION pglock.sem_release(key text, owner text)
 RETURNS boolean
 LANGUAGE plpgsql
 STRICT SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    IF sem_release.key = '' OR length(sem_release.key) > 495 OR strpos(sem_release.key, chr(31)) > 0
        OR sem_release.owner = '' THEN
        RAISE EXCEPTION 'pglock.sem_release: want a key of 1 to 495 characters without U+001F and an owner, not a key of % characters and owner %',
            length(sem_release.key), quote_literal(sem_release.owner)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE pglock.locks l
    SET owner = NULL,
        expires_at = clock_timestamp(),
        wanted_at = CASE WHEN l.wanted_at IS NOT NULL THEN
            (SELECT NULL::timestamptz FROM pg_notify('pglock_released', l.key)) END
    WHERE l.semaphore = sem_release.key AND l.owner = sem_release.owner
      AND l.expires_at > clock_timestamp();
    RETURN FOUND;
END $function$
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
    IF sem_want.key = '' OR length(sem_want.key) > 495 OR strpos(sem_want.key, chr(31)) > 0
        OR sem_want.permits < 1 OR sem_want.permits > 1000 THEN
        RAISE EXCEPTION 'pglock.sem_want: want a key of 1 to 495 characters without U+001F and permits of 1 to 1000, not a key of % characters and permits %',
            length(sem_want.key), sem_want.permits
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE pglock.locks l
    SET wanted_at = clock_timestamp()
    FROM (SELECT h.key FROM pglock.locks h WHERE h.semaphore = sem_want.key ORDER BY h.key) AS h
    WHERE l.key = h.key AND l.owner IS NOT NULL AND l.expires_at > clock_timestamp() AND l.wanted_at IS NULL;
    SELECT count(*) INTO live FROM pglock.locks l
    WHERE l.semaphore = sem_want.key AND l.owner IS NOT NULL AND l.expires_at > clock_timestamp();
    RETURN live >= sem_want.permits;
END $function$
;

CREATE OR REPLACE FUNCTION pglock.job_run_list(job text, max_rows integer)
 RETURNS SETOF pglock.job_runs
 LANGUAGE sql
 STABLE STRICT SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
    SELECT r.* FROM pglock.job_runs r
    WHERE r.job = job_run_list.job
    ORDER BY r.ended_at DESC, r.id DESC
    LIMIT job_run_list.max_rows
$function$
;

DROP FUNCTION IF EXISTS pglock.lock_release_key(text, text);
DROP FUNCTION IF EXISTS pglock.sem_release_permits(text, text[], text[]);
DROP FUNCTION IF EXISTS pglock.fencing_timeline();
DROP FUNCTION IF EXISTS pglock.lock_refuse(text, text, text, text);
DROP FUNCTION IF EXISTS pglock.lock_ttl_ok(bigint);
DROP FUNCTION IF EXISTS pglock.lock_owner_ok(text);
DROP FUNCTION IF EXISTS pglock.lock_row_key_ok(text);
DROP FUNCTION IF EXISTS pglock.sem_key_ok(text);
DROP FUNCTION IF EXISTS pglock.lock_key_ok(text);
