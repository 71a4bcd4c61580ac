-- The SQL functions are the last line. README lets an application role call every
-- function of the schema, so whatever such a role passes them must not break what the
-- Go API promises. This migration closes what a role could do through them:
--
-- 1. No lock call takes a permit's row. A permit's row key is its semaphore's key,
--    U+001F and the permit's number (000013); lock_acquire, lock_acquire_or_want,
--    lock_want, queue_acquire and queue_poll of a lock, queue_leave, lock_held and
--    lock_holder now refuse a key with U+001F, as the Go API does, so that no lock call
--    mints a permit beyond a semaphore's number. Calls made on a held row (lock_renew,
--    lock_renew_many, lock_release and its kin, lock_force_release) take a lock's key
--    or a well-formed permit's row key, nothing else.
-- 2. Owners are bounded: 1 to 255 characters (the Go API's owners are an instance name
--    of up to 200 characters, a slash and a random suffix), so that the notification a
--    grant sends with its waiter's owner (pg_notify refuses a payload of 8000 bytes or
--    more) never fails, and with it every release of the key. Instance names are 1 to
--    200 characters, job names are keys, a skip's reason is a word of lowercase letters
--    and dashes.
-- 3. Every argument is checked, each with a message naming it (invalid_parameter_value,
--    22023, nothing written): job_skips_record and lock_holder checked none.
-- 4. One lock order (below), kept by every function: the release of several permits of
--    a semaphore with waiters and a force-release of one of them deadlocked; so could
--    a poll of a fair waiter and a release of its key.
-- 5. A fair claim whose reply was lost does not stall the queue: queue_acquire of an
--    owner that holds the key (a permit of the semaphore) live renews that lease and
--    returns its token (and permit), so the waiter that queues again after finding its
--    ticket gone gets what its lost claim took, instead of queueing behind itself until
--    the ttl.
-- 6. A permit handed back by owner (sem_release, lock_release_many of a semaphore's key
--    and U+001F) goes to the head of the semaphore's queue, as any permit's release does;
--    a poll that takes a permit makes the semaphore's row if lock_prune deleted it; and
--    lock_prune no longer deletes the row of a semaphore that has waiters.
--
-- # The lock order
--
-- Resources are ordered by family: a lock and its queue are one family, a semaphore
-- (its row, its permits' rows and its queue) another; families in the byte order of
-- their keys (COLLATE "C"), a lock's before a semaphore's of the same key. Within a
-- lock's family: its queue lock (a transaction-scoped advisory lock on the hash of the
-- key, seed 1885826161: exclusive to hand the key over or take it for the queue's head,
-- shared to queue), then its row, then its waiters' rows by ticket. Within a
-- semaphore's: its row (pglock.semaphores), then its permits' rows by row key, then its
-- waiters' rows by ticket.
-- A function never waits for a resource while it holds a later one. A try (FOR UPDATE
-- SKIP LOCKED, pg_try_advisory_xact_lock) waits for nothing and may come anywhere; so
-- does the creation lock of a new key's row (seed 1885826162), taken only as a try, or
-- shared by a caller that holds nothing else. Two keys whose hashes collide share a
-- queue lock; a batch over both could then wait in a cycle, at odds of 2^-64 a pair.
-- Batches (lock_renew_many, lock_release_many) go family by family in that order, and
-- within a semaphore lock the rows they change before any waiter's.

-- The helpers below are inlined into their callers' expressions by the planner (a
-- LANGUAGE sql function with one SELECT and no SET clause), so they cost no call; every
-- name in them is schema-qualified, as a pinned search_path would make them.

-- lock_key_ok: a lock's key, 1 to 500 characters without U+001F.
CREATE OR REPLACE FUNCTION pglock.lock_key_ok(key text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT pg_catalog.length($1) BETWEEN 1 AND 500 AND pg_catalog.strpos($1, pg_catalog.chr(31)) = 0
$$;

-- sem_key_ok: a semaphore's key, 1 to 495 characters without U+001F.
CREATE OR REPLACE FUNCTION pglock.sem_key_ok(key text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT pg_catalog.length($1) BETWEEN 1 AND 495 AND pg_catalog.strpos($1, pg_catalog.chr(31)) = 0
$$;

-- lock_row_key_ok: a lock's key, or a permit's row key: a semaphore's key, U+001F and a
-- number of 1 to 1000 written in digits without a leading zero.
CREATE OR REPLACE FUNCTION pglock.lock_row_key_ok(key text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN pg_catalog.strpos($1, pg_catalog.chr(31)) = 0 THEN pg_catalog.length($1) BETWEEN 1 AND 500
           WHEN pg_catalog.strpos($1, pg_catalog.chr(31)) BETWEEN 2 AND 496
                AND pg_catalog.substr($1, pg_catalog.strpos($1, pg_catalog.chr(31)) + 1) OPERATOR(pg_catalog.~) '^[1-9][0-9]{0,3}$'
           THEN pg_catalog.substr($1, pg_catalog.strpos($1, pg_catalog.chr(31)) + 1)::integer <= 1000
           ELSE false END
$$;

-- lock_owner_ok: an owner, 1 to 255 characters.
CREATE OR REPLACE FUNCTION pglock.lock_owner_ok(owner text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT pg_catalog.length($1) BETWEEN 1 AND 255
$$;

-- lock_ttl_ok: a ttl of 1 ms to 365 days.
CREATE OR REPLACE FUNCTION pglock.lock_ttl_ok(ttl_ms bigint) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT $1 BETWEEN 1 AND 31536000000
$$;

-- lock_refuse raises invalid_parameter_value (22023) for argument arg of pglock's function
-- fn, saying what it wants; got describes the value (its length and its start for a
-- text). Called only once a check has failed.
CREATE OR REPLACE FUNCTION pglock.lock_refuse(fn text, arg text, want text, got text) RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'pglock.%: % %: want %', fn, arg,
        CASE WHEN got IS NULL THEN 'null'
             WHEN length(got) > 40 THEN format('of %s characters starting %L', length(got),
                                               replace(left(got, 40), chr(31), '<U+001F>'))
             ELSE quote_literal(replace(got, chr(31), '<U+001F>')) END,
        want
        USING ERRCODE = 'invalid_parameter_value';
END $$;

-- fencing_timeline is the server's timeline, the floor of the tokens fencing_token_next draws
-- (000012). A function of its own so that a test can stand in another timeline for the
-- functions under test.
CREATE OR REPLACE FUNCTION pglock.fencing_timeline() RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT ('x' OPERATOR(pg_catalog.||) pg_catalog.left(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 8))::bit(32)::bigint
$$;

-- fencing_token_next as in 000014, the timeline read through fencing_timeline().
CREATE OR REPLACE FUNCTION pglock.fencing_token_next() RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY INVOKER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    token bigint;
    floor bigint;
BEGIN
    token := nextval('pglock.fencing_token_seq');
    floor := (pglock.fencing_timeline() - 1) << 40;
    IF token <= floor THEN
        PERFORM pg_advisory_xact_lock(2736408391470914537);
        token := nextval('pglock.fencing_token_seq');
        IF token <= floor THEN
            token := setval('pglock.fencing_token_seq', floor + 1);
        END IF;
    END IF;
    RETURN token;
END $$;

-- lock_acquire as in 000014, its arguments checked one by one.
CREATE OR REPLACE FUNCTION pglock.lock_acquire(key text, owner text, ttl_ms bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
END $$;

-- lock_want as in 000010, its key a lock's.
CREATE OR REPLACE FUNCTION pglock.lock_want(key text) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    held boolean;
    marked boolean;
BEGIN
    IF NOT pglock.lock_key_ok(lock_want.key) THEN
        PERFORM pglock.lock_refuse('lock_want', 'key', 'a lock''s key: 1 to 500 characters without U+001F', lock_want.key);
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
END $$;

-- lock_renew as in 000011: a lock's key or a permit's row key.
CREATE OR REPLACE FUNCTION pglock.lock_renew(key text, owner text, ttl_ms bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT pglock.lock_row_key_ok(lock_renew.key) THEN
        PERFORM pglock.lock_refuse('lock_renew', 'key', 'a lock''s key or a permit''s row key', lock_renew.key);
    ELSIF NOT pglock.lock_owner_ok(lock_renew.owner) THEN
        PERFORM pglock.lock_refuse('lock_renew', 'owner', '1 to 255 characters', lock_renew.owner);
    ELSIF NOT pglock.lock_ttl_ok(lock_renew.ttl_ms) THEN
        PERFORM pglock.lock_refuse('lock_renew', 'ttl_ms', '1 to 31536000000 (365 days)', lock_renew.ttl_ms::text);
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
END $$;

-- lock_renew_many as in 000011, its rows locked in the lock order: by family (the key
-- before any U+001F), then by row key, bytewise.
CREATE OR REPLACE FUNCTION pglock.lock_renew_many(keys text[], owners text[], ttl_ms bigint) RETURNS SETOF text
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET enable_hashjoin = off SET enable_mergejoin = off AS $$
DECLARE
    bad text;
BEGIN
    IF cardinality(lock_renew_many.keys) <> cardinality(lock_renew_many.owners) THEN
        PERFORM pglock.lock_refuse('lock_renew_many', 'owners',
            format('as many as keys (%s)', cardinality(lock_renew_many.keys)), cardinality(lock_renew_many.owners)::text);
    ELSIF NOT pglock.lock_ttl_ok(lock_renew_many.ttl_ms) THEN
        PERFORM pglock.lock_refuse('lock_renew_many', 'ttl_ms', '1 to 31536000000 (365 days)', lock_renew_many.ttl_ms::text);
    END IF;
    SELECT u.key INTO bad FROM unnest(lock_renew_many.keys) AS u(key)
    WHERE NOT coalesce(pglock.lock_row_key_ok(u.key), false) LIMIT 1;
    IF FOUND THEN
        PERFORM pglock.lock_refuse('lock_renew_many', 'keys', 'locks'' keys or permits'' row keys', bad);
    END IF;
    SELECT u.owner INTO bad FROM unnest(lock_renew_many.owners) AS u(owner)
    WHERE NOT coalesce(pglock.lock_owner_ok(u.owner), false) LIMIT 1;
    IF FOUND THEN
        PERFORM pglock.lock_refuse('lock_renew_many', 'owners', 'owners of 1 to 255 characters', bad);
    END IF;
    RETURN QUERY
    UPDATE pglock.locks l
    SET expires_at = clock_timestamp() + lock_renew_many.ttl_ms * interval '1 millisecond'
    FROM (SELECT u.key, u.owner FROM unnest(lock_renew_many.keys, lock_renew_many.owners) AS u(key, owner)
          ORDER BY split_part(u.key, chr(31), 1) COLLATE "C", u.key COLLATE "C") AS u
    WHERE l.key = u.key AND l.owner = u.owner AND l.expires_at > clock_timestamp()
    RETURNING l.key;
    IF FOUND AND current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
END $$;

-- sem_release_permits releases the permits of semaphore sem that row_keys[i] names, each
-- if owners[i] holds it live (when row_keys[i] is null: every permit of sem that
-- owners[i] holds live), and hands each released permit to the head of the semaphore's
-- queue. It returns the indexes i it released a permit for. In the lock order: the
-- semaphore's row, when its queue has waiters; the permits' rows, by row key; then
-- the waiters' rows, in the grants. Callers checked the arguments.
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
END $$;

-- lock_release_key releases the lock key (a lock's key, not a permit's) held live by owner
-- and hands it to the head of its queue: in the lock order, the key's queue lock, its
-- row, then the waiters' rows. Callers checked the arguments.
CREATE OR REPLACE FUNCTION pglock.lock_release_key(key text, owner text) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SECURITY INVOKER SET search_path = pg_catalog, pg_temp AS $$
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
END $$;

-- lock_release as in 000023: a lock's key or a permit's row key, each in the lock
-- order (lock_release_key, sem_release_permits).
CREATE OR REPLACE FUNCTION pglock.lock_release(key text, owner text) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
END $$;

-- sem_release as in 000017 (a permit handed back by owner, its number unknown), its
-- permits handed to the semaphore's queue as a release of each would.
CREATE OR REPLACE FUNCTION pglock.sem_release(key text, owner text) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT pglock.sem_key_ok(sem_release.key) THEN
        PERFORM pglock.lock_refuse('sem_release', 'key', 'a semaphore''s key: 1 to 495 characters without U+001F', sem_release.key);
    ELSIF NOT pglock.lock_owner_ok(sem_release.owner) THEN
        PERFORM pglock.lock_refuse('sem_release', 'owner', '1 to 255 characters', sem_release.owner);
    END IF;
    RETURN EXISTS (SELECT FROM pglock.sem_release_permits(sem_release.key, ARRAY[NULL::text], ARRAY[sem_release.owner]));
END $$;

-- lock_release_many as in 000018, family by family in the lock order: a lock's
-- releases one by one (lock_release_key); a semaphore's (its permits' row keys, and its key
-- followed by U+001F for a permit of unknown number) in one sem_release_permits, which
-- locks the rows before it hands any over.
CREATE OR REPLACE FUNCTION pglock.lock_release_many(keys text[], owners text[], async boolean) RETURNS SETOF integer
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    bad text;
    f record;
    i integer;
BEGIN
    IF cardinality(lock_release_many.keys) <> cardinality(lock_release_many.owners) THEN
        PERFORM pglock.lock_refuse('lock_release_many', 'owners',
            format('as many as keys (%s)', cardinality(lock_release_many.keys)), cardinality(lock_release_many.owners)::text);
    ELSIF cardinality(lock_release_many.keys) > 1000 THEN
        PERFORM pglock.lock_refuse('lock_release_many', 'keys', 'at most 1000',
            cardinality(lock_release_many.keys)::text || ' keys');
    END IF;
    SELECT u.key INTO bad FROM unnest(lock_release_many.keys) AS u(key)
    WHERE NOT coalesce(pglock.lock_row_key_ok(u.key) OR right(u.key, 1) = chr(31) AND pglock.sem_key_ok(left(u.key, -1)), false)
    LIMIT 1;
    IF FOUND THEN
        PERFORM pglock.lock_refuse('lock_release_many', 'keys',
            'locks'' keys, permits'' row keys or semaphores'' keys followed by U+001F', bad);
    END IF;
    SELECT u.owner INTO bad FROM unnest(lock_release_many.owners) AS u(owner)
    WHERE NOT coalesce(pglock.lock_owner_ok(u.owner), false) LIMIT 1;
    IF FOUND THEN
        PERFORM pglock.lock_refuse('lock_release_many', 'owners', 'owners of 1 to 255 characters', bad);
    END IF;
    IF lock_release_many.async THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    FOR f IN
        SELECT split_part(u.k, chr(31), 1) AS family, strpos(u.k, chr(31)) > 0 AS semaphore,
               array_agg(nullif(u.k, split_part(u.k, chr(31), 1) || chr(31)) ORDER BY u.k COLLATE "C", u.i) AS keys,
               array_agg(u.o ORDER BY u.k COLLATE "C", u.i) AS owners,
               array_agg(u.i ORDER BY u.k COLLATE "C", u.i) AS positions
        FROM unnest(lock_release_many.keys, lock_release_many.owners) WITH ORDINALITY AS u(k, o, i)
        GROUP BY split_part(u.k, chr(31), 1), strpos(u.k, chr(31)) > 0
        ORDER BY split_part(u.k, chr(31), 1) COLLATE "C", strpos(u.k, chr(31)) > 0
    LOOP
        IF f.semaphore THEN
            FOR i IN SELECT p.i FROM pglock.sem_release_permits(f.family, f.keys, f.owners) p LOOP
                RETURN NEXT f.positions[i];
            END LOOP;
        ELSE
            FOR i IN 1..cardinality(f.keys) LOOP
                IF pglock.lock_release_key(f.keys[i], f.owners[i]) THEN
                    RETURN NEXT f.positions[i];
                END IF;
            END LOOP;
        END IF;
    END LOOP;
END $$;

-- lock_force_release as in 000023, in the lock order: for a permit, the semaphore's row
-- first when its queue has waiters.
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
END $$;

-- lock_held as in 000017, its key a lock's or a semaphore's.
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
END $$;

-- lock_holder as in 000016, its key checked: a lock's.
CREATE OR REPLACE FUNCTION pglock.lock_holder(key text, OUT owner text, OUT fencing_token bigint, OUT expires_in_us bigint)
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT pglock.lock_key_ok(lock_holder.key) THEN
        PERFORM pglock.lock_refuse('lock_holder', 'key', 'a lock''s key: 1 to 500 characters without U+001F', lock_holder.key);
    END IF;
    SELECT l.owner, l.fencing_token, (extract(epoch FROM l.expires_at - clock_timestamp()) * 1000000)::bigint
    INTO lock_holder.owner, lock_holder.fencing_token, lock_holder.expires_in_us
    FROM pglock.locks l
    WHERE l.key = lock_holder.key AND l.owner IS NOT NULL AND l.expires_at > clock_timestamp();
END $$;

-- queue_acquire as in 000026, its key a lock's when permits is 0, and idempotent for an
-- owner that holds the key live (a permit of the semaphore): it renews that lease and
-- returns its token (and permit), as if it had taken it now. A fair waiter whose claim
-- committed but whose reply was lost finds its ticket gone at its next poll and queues
-- again under the same owner: it gets what the lost claim took.
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
END $$;

-- queue_poll as in 000024, in the lock order: it reads its waiter's row first, without
-- locking it, and takes what the poll may need before the row: for a claim, the
-- granted row (and a lock's queue lock); for a take that looks possible, a lock's
-- queue lock and row, or the semaphore's row (made again if lock_prune deleted it).
-- Only then the heartbeat row-locks the waiter's row. A grant that came in between
-- (its row not locked here) is claimed only if its row can be locked without a wait;
-- else at the next poll.
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
END $$;

-- queue_leave as in 000023, in the lock order: for a semaphore's waiter, the semaphore's
-- row, then the row of a permit granted to it, then the waiters' rows.
CREATE OR REPLACE FUNCTION pglock.queue_leave(key text, ticket bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    w pglock.waiters;
BEGIN
    IF NOT pglock.lock_key_ok(queue_leave.key) THEN
        PERFORM pglock.lock_refuse('queue_leave', 'key', 'a lock''s or a semaphore''s key: 1 to 500 characters without U+001F', queue_leave.key);
    ELSIF queue_leave.ticket < 1 THEN
        PERFORM pglock.lock_refuse('queue_leave', 'ticket', 'above 0', queue_leave.ticket::text);
    END IF;
    SELECT * INTO w FROM pglock.waiters o
    WHERE o.key = queue_leave.key || chr(31) AND o.ticket = queue_leave.ticket;
    IF FOUND THEN
        PERFORM FROM pglock.semaphores s WHERE s.key = queue_leave.key FOR UPDATE;
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
    PERFORM pg_advisory_xact_lock(hashtextextended(queue_leave.key, 1885826161));
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
END $$;

-- sem_acquire as in 000017, its arguments checked one by one.
CREATE OR REPLACE FUNCTION pglock.sem_acquire(key text, owner text, ttl_ms bigint, permits integer,
    OUT permit integer, OUT fencing_token bigint)
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT pglock.sem_key_ok(sem_acquire.key) THEN
        PERFORM pglock.lock_refuse('sem_acquire', 'key', 'a semaphore''s key: 1 to 495 characters without U+001F', sem_acquire.key);
    ELSIF NOT pglock.lock_owner_ok(sem_acquire.owner) THEN
        PERFORM pglock.lock_refuse('sem_acquire', 'owner', '1 to 255 characters', sem_acquire.owner);
    ELSIF NOT pglock.lock_ttl_ok(sem_acquire.ttl_ms) THEN
        PERFORM pglock.lock_refuse('sem_acquire', 'ttl_ms', '1 to 31536000000 (365 days)', sem_acquire.ttl_ms::text);
    ELSIF sem_acquire.permits < 1 OR sem_acquire.permits > 1000 THEN
        PERFORM pglock.lock_refuse('sem_acquire', 'permits', '1 to 1000', sem_acquire.permits::text);
    END IF;
    PERFORM pglock.sem_lock(sem_acquire.key, sem_acquire.permits);
    IF pglock.sem_waiting(sem_acquire.key, NULL) > 0 THEN
        RETURN;
    END IF;
    SELECT t.permit, t.fencing_token INTO sem_acquire.permit, sem_acquire.fencing_token
    FROM pglock.sem_take(sem_acquire.key, sem_acquire.owner, sem_acquire.ttl_ms, sem_acquire.permits) t;
END $$;

-- sem_want as in 000017, its arguments checked one by one.
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
    FROM (SELECT h.key FROM pglock.locks h WHERE h.semaphore = sem_want.key ORDER BY h.key COLLATE "C") AS h
    WHERE l.key = h.key AND l.owner IS NOT NULL AND l.expires_at > clock_timestamp() AND l.wanted_at IS NULL;
    SELECT count(*) INTO live FROM pglock.locks l
    WHERE l.semaphore = sem_want.key AND l.owner IS NOT NULL AND l.expires_at > clock_timestamp();
    RETURN live >= sem_want.permits;
END $$;

-- lock_prune as in 000019, sparing the row of a semaphore whose queue has waiters.
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
        WHERE NOT EXISTS (SELECT FROM pglock.locks l WHERE l.semaphore = e.key)
          AND NOT EXISTS (SELECT FROM pglock.waiters w WHERE w.key = e.key || chr(31))
        LIMIT lock_prune.max_rows
        FOR UPDATE SKIP LOCKED);
    RETURN deleted;
END $$;

-- job_run_record as in 000008, every argument checked.
CREATE OR REPLACE FUNCTION pglock.job_run_record(job text, instance text, owner text, token bigint,
    ended_ago_us bigint, duration_us bigint, outcome text, err text, retention_ms bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ended timestamptz;
    run_id bigint;
BEGIN
    IF NOT coalesce(pglock.lock_key_ok(job_run_record.job), false) THEN
        PERFORM pglock.lock_refuse('job_run_record', 'job', 'a job''s name: 1 to 500 characters without U+001F', job_run_record.job);
    ELSIF NOT coalesce(length(job_run_record.instance) BETWEEN 1 AND 200, false) THEN
        PERFORM pglock.lock_refuse('job_run_record', 'instance', '1 to 200 characters', job_run_record.instance);
    ELSIF NOT coalesce(pglock.lock_owner_ok(job_run_record.owner), false) THEN
        PERFORM pglock.lock_refuse('job_run_record', 'owner', '1 to 255 characters', job_run_record.owner);
    ELSIF NOT coalesce(job_run_record.token > 0, false) THEN
        PERFORM pglock.lock_refuse('job_run_record', 'token', 'above 0', job_run_record.token::text);
    ELSIF NOT coalesce(job_run_record.ended_ago_us BETWEEN 0 AND 3155760000000000, false) THEN
        PERFORM pglock.lock_refuse('job_run_record', 'ended_ago_us', '0 to 3155760000000000 (100 years)', job_run_record.ended_ago_us::text);
    ELSIF NOT coalesce(job_run_record.duration_us BETWEEN 0 AND 3155760000000000, false) THEN
        PERFORM pglock.lock_refuse('job_run_record', 'duration_us', '0 to 3155760000000000 (100 years)', job_run_record.duration_us::text);
    ELSIF NOT coalesce(job_run_record.outcome IN ('ok', 'error', 'panicked', 'lost'), false) THEN
        PERFORM pglock.lock_refuse('job_run_record', 'outcome', 'ok, error, panicked or lost', job_run_record.outcome);
    ELSIF NOT coalesce(job_run_record.retention_ms BETWEEN 1 AND 9223372036855, false) THEN
        PERFORM pglock.lock_refuse('job_run_record', 'retention_ms', '1 to 9223372036855 (a time.Duration''s range)', job_run_record.retention_ms::text);
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
END $$;

-- job_skips_record as in 000008, every argument checked: an instance of 1 to 200
-- characters, and skips a JSON array of up to 10000 objects, each a job's name, a
-- reason (a word of lowercase letters and dashes), a count of 1 to 10^12 and an age of
-- 0 to 100 years in microseconds. Entries of one job and reason add up; a count stops
-- at bigint's largest rather than fail every later record of its row.
CREATE OR REPLACE FUNCTION pglock.job_skips_record(instance text, skips json, retention_ms bigint) RETURNS integer
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    written integer;
    bad text;
BEGIN
    IF NOT length(job_skips_record.instance) BETWEEN 1 AND 200 THEN
        PERFORM pglock.lock_refuse('job_skips_record', 'instance', '1 to 200 characters', job_skips_record.instance);
    ELSIF json_typeof(job_skips_record.skips) <> 'array' OR json_array_length(job_skips_record.skips) > 10000 THEN
        PERFORM pglock.lock_refuse('job_skips_record', 'skips', 'a JSON array of up to 10000 objects', left(job_skips_record.skips::text, 100));
    ELSIF NOT job_skips_record.retention_ms BETWEEN 1 AND 9223372036855 THEN
        PERFORM pglock.lock_refuse('job_skips_record', 'retention_ms', '1 to 9223372036855 (a time.Duration''s range)', job_skips_record.retention_ms::text);
    END IF;
    SELECT e.value::text INTO bad FROM json_array_elements(job_skips_record.skips) AS e
    WHERE NOT coalesce(json_typeof(e.value) = 'object'
        AND pglock.lock_key_ok(e.value->>'job')
        AND (e.value->>'reason') ~ '^[a-z][a-z-]{0,63}$'
        AND CASE WHEN json_typeof(e.value->'count') = 'number' AND json_typeof(e.value->'ago_us') = 'number'
                 THEN (e.value->>'count') ~ '^[1-9][0-9]{0,11}$'
                      AND (e.value->>'ago_us') ~ '^[0-9]{1,16}$' AND (e.value->>'ago_us')::bigint <= 3155760000000000
                 ELSE false END, false)
    LIMIT 1;
    IF FOUND THEN
        PERFORM pglock.lock_refuse('job_skips_record', 'skips',
            'objects of a job''s name (a key), a reason (lowercase letters and dashes), a count of 1 to 999999999999 and an ago_us of 0 to 3155760000000000 (100 years)', bad);
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    INSERT INTO pglock.job_skips AS s (job, instance, reason, count, last_at)
    SELECT e.job, job_skips_record.instance, e.reason, sum(e.count),
           max(statement_timestamp() - e.ago_us * interval '1 microsecond')
    FROM json_to_recordset(job_skips_record.skips) AS e(job text, reason text, count bigint, ago_us bigint)
    GROUP BY e.job, e.reason
    ON CONFLICT ON CONSTRAINT job_skips_pkey DO UPDATE
    SET count = CASE WHEN s.count > 9223372036854775807 - excluded.count THEN 9223372036854775807
                     ELSE s.count + excluded.count END,
        last_at = greatest(s.last_at, excluded.last_at);
    GET DIAGNOSTICS written = ROW_COUNT;
    DELETE FROM pglock.job_skips s
    WHERE s.job IN (SELECT e.job FROM json_to_recordset(job_skips_record.skips) AS e(job text))
      AND s.last_at < clock_timestamp() - job_skips_record.retention_ms * interval '1 millisecond';
    RETURN written;
END $$;

-- job_run_list as in 000008, its max_rows checked.
CREATE OR REPLACE FUNCTION pglock.job_run_list(job text, max_rows integer) RETURNS SETOF pglock.job_runs
LANGUAGE plpgsql STABLE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF job_run_list.max_rows < 0 THEN
        PERFORM pglock.lock_refuse('job_run_list', 'max_rows', '0 or more', job_run_list.max_rows::text);
    END IF;
    RETURN QUERY
    SELECT r.* FROM pglock.job_runs r
    WHERE r.job = job_run_list.job
    ORDER BY r.ended_at DESC, r.id DESC
    LIMIT job_run_list.max_rows;
END $$;

-- registry_touch as in 000016, its instance 1 to 200 characters and its keys keys.
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

-- New functions, as 000006 asks: no EXECUTE for PUBLIC, EXECUTE for the roles that may
-- call lock_acquire (README grants EXECUTE ON ALL FUNCTIONS; an upgrade keeps that
-- true). The helpers that touch a table run as their caller, so such a role calling
-- one directly has no privilege on the tables and changes nothing (000022).
DO $$
DECLARE
    f text;
    r record;
BEGIN
    FOREACH f IN ARRAY ARRAY['pglock.lock_key_ok(text)', 'pglock.sem_key_ok(text)', 'pglock.lock_row_key_ok(text)',
        'pglock.lock_owner_ok(text)', 'pglock.lock_ttl_ok(bigint)', 'pglock.lock_refuse(text, text, text, text)', 'pglock.fencing_timeline()',
        'pglock.sem_release_permits(text, text[], text[])', 'pglock.lock_release_key(text, text)'] LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
        FOR r IN
            SELECT DISTINCT a.grantee::regrole AS grantee
            FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
            WHERE p.oid = 'pglock.lock_acquire(text, text, bigint)'::regprocedure AND a.privilege_type = 'EXECUTE'
              AND a.grantee <> 0 AND a.grantee <> p.proowner
        LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s', f, r.grantee);
        END LOOP;
    END LOOP;
END $$;

-- A waiter whose owner is longer than any the functions now take was queued by a
-- caller outside the Go API: its grant's notification would fail every release of its
-- key. It goes.
DELETE FROM pglock.waiters w WHERE length(w.owner) > 255;
