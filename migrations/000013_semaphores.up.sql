-- Semaphores: N permits under one key, each permit a lock like any other.
--
-- Permit i of semaphore key is the lock row whose key is key || chr(31) || i (U+001F,
-- the unit separator, which the Go API refuses in every key, so that no lock's key is
-- ever a permit's). Renewal, release, lock_held's row lock, force release, pruning, the
-- NOTIFY of a release and lock_list treat a permit's row as they treat any lock's.
-- A semaphore key is at most 495 characters, so that a row key stays within 500.
--
-- The column semaphore is the semaphore's key on a permit's row, null on a lock's,
-- computed from the row's key, so that lock_acquire (which sem_acquire calls to take a
-- permit) writes it without knowing of semaphores; its partial index makes counting a
-- semaphore's live holders and finding a permit by (semaphore, token) index lookups.
-- Adding it rewrites the table once, under the migration's lock. A row a SQL caller
-- wrote under a key with U+001F before this migration reads as a permit of the key
-- before the U+001F.
ALTER TABLE pglock.locks ADD COLUMN IF NOT EXISTS semaphore text
    GENERATED ALWAYS AS (CASE WHEN strpos(key, chr(31)) > 0 THEN split_part(key, chr(31), 1) END) STORED;
CREATE INDEX IF NOT EXISTS locks_semaphore ON pglock.locks (semaphore) WHERE semaphore IS NOT NULL;

-- One row per semaphore ever acquired: the acquisitions of one semaphore take turns on
-- its row lock, so that counting the live holders and taking a permit are one step.
-- permits is the number the last granted acquisition asked for, acquired_at when.
CREATE TABLE IF NOT EXISTS pglock.semaphores (
    key         text        PRIMARY KEY,
    permits     integer     NOT NULL CHECK (permits BETWEEN 1 AND 1000),
    acquired_at timestamptz -- on the database clock; null until the first grant
);

-- sem_acquire takes a permit of the semaphore key for owner for ttl_ms milliseconds
-- when fewer than permits live holders (owner set, not expired, any permit number)
-- hold the semaphore's permits, and returns the permit's number and its fencing
-- token; nulls when none is free. The permit is the lowest number in 1..permits whose
-- row is free (no row, released or expired), taken by lock_acquire on its row key:
-- the token is greater than every token the permit had, and the win is durable (the
-- caller's transaction commits with synchronous_commit raised to on). So a smaller
-- permits than before grants no permit above it, and no permit at all while the live
-- holders are as many as permits or more; the holders keep theirs until they release.
-- When every caller asks for the same permits, never more than permits live holders.
--
-- The acquisitions of one semaphore take turns: each row-locks the semaphore's row
-- first (FOR UPDATE, which waits for the one before to commit), then counts the live
-- holders on a fresh snapshot (READ COMMITTED: each statement of a VOLATILE function
-- takes one). A grant writes the semaphore's row, so that under REPEATABLE READ or
-- SERIALIZABLE an acquisition whose snapshot misses a grant that committed after it
-- fails to lock the row with a serialization failure (40001) rather than count from a
-- stale snapshot. A permit row that a fenced transaction keeps locked (an expired
-- permit whose old holder's transaction is open) is skipped for the next free one.
-- Bad input raises invalid_parameter_value (22023) and touches nothing.
CREATE OR REPLACE FUNCTION pglock.sem_acquire(key text, owner text, ttl_ms bigint, permits integer,
    OUT permit integer, OUT fencing_token bigint)
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    live integer;
    candidate integer;
BEGIN
    IF sem_acquire.key = '' OR length(sem_acquire.key) > 495 OR strpos(sem_acquire.key, chr(31)) > 0
        OR sem_acquire.owner = '' OR sem_acquire.ttl_ms < 1 OR sem_acquire.ttl_ms > 31536000000
        OR sem_acquire.permits < 1 OR sem_acquire.permits > 1000 THEN
        RAISE EXCEPTION 'pglock.sem_acquire: want a key of 1 to 495 characters without U+001F, an owner, a ttl_ms of 1 to 31536000000 (365 days) and permits of 1 to 1000, not a key of % characters, owner %, ttl_ms % and permits %',
            length(sem_acquire.key), quote_literal(sem_acquire.owner), sem_acquire.ttl_ms, sem_acquire.permits
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM FROM pglock.semaphores s WHERE s.key = sem_acquire.key FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO pglock.semaphores AS s (key, permits) VALUES (sem_acquire.key, sem_acquire.permits)
        ON CONFLICT ON CONSTRAINT semaphores_pkey DO NOTHING;
        PERFORM FROM pglock.semaphores s WHERE s.key = sem_acquire.key FOR UPDATE;
    END IF;
    SELECT count(*) INTO live FROM pglock.locks l
    WHERE l.semaphore = sem_acquire.key AND l.owner IS NOT NULL AND l.expires_at > clock_timestamp();
    IF live >= sem_acquire.permits THEN
        RETURN;
    END IF;
    FOR candidate IN
        SELECT i FROM generate_series(1, sem_acquire.permits) AS g(i)
        WHERE NOT EXISTS (
            SELECT FROM pglock.locks l
            WHERE l.key = sem_acquire.key || chr(31) || g.i
              AND l.owner IS NOT NULL AND l.expires_at > clock_timestamp())
        ORDER BY g.i
    LOOP
        sem_acquire.fencing_token := pglock.lock_acquire(sem_acquire.key || chr(31) || candidate,
            sem_acquire.owner, sem_acquire.ttl_ms);
        IF sem_acquire.fencing_token IS NOT NULL THEN
            sem_acquire.permit := candidate;
            UPDATE pglock.semaphores s
            SET permits = sem_acquire.permits, acquired_at = clock_timestamp()
            WHERE s.key = sem_acquire.key;
            RETURN;
        END IF;
    END LOOP;
END $$;

-- sem_want marks every live permit of the semaphore key wanted, so that the release
-- of any of them notifies on pglock_released (with the permit's row key), and reports
-- whether the semaphore is full: at least permits live holders. false means "try to
-- acquire now". It locks and writes the rows in the order of their keys, as
-- lock_renew_many does, so that the two never deadlock.
CREATE OR REPLACE FUNCTION pglock.sem_want(key text, permits integer) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET enable_hashjoin = off SET enable_mergejoin = off AS $$
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
END $$;

-- sem_release gives back the permit of the semaphore key that owner holds live, when
-- its number is not known (an acquisition whose reply never came), and reports whether
-- it did; a permit whose number is known is released by lock_release on its row key.
CREATE OR REPLACE FUNCTION pglock.sem_release(key text, owner text) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
END $$;

-- lock_held as in 000011, and (key, token) may also be a semaphore's key and the token
-- of one of its permits (FenceHeld with a permit's Lock.Key and Lock.Token): the
-- exact row is looked for first, then the permit row whose semaphore is key and whose
-- token is token (tokens are unique across keys), with the same FOR KEY SHARE row lock
-- and the same REPEATABLE READ / SERIALIZABLE rule, on the row found.
CREATE OR REPLACE FUNCTION pglock.lock_held(key text, token bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
END $$;

-- As 000006 asks of a migration that adds a function: EXECUTE revoked from PUBLIC,
-- granted to the roles that may execute lock_acquire; the table is the functions'.
REVOKE ALL ON TABLE pglock.semaphores FROM PUBLIC;
REVOKE ALL ON FUNCTION pglock.sem_acquire(text, text, bigint, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION pglock.sem_want(text, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION pglock.sem_release(text, text) FROM PUBLIC;

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
        EXECUTE format('GRANT EXECUTE ON FUNCTION pglock.sem_acquire(text, text, bigint, integer), '
            'pglock.sem_want(text, integer), pglock.sem_release(text, text) TO %s', r.grantee);
    END LOOP;
END $$;
