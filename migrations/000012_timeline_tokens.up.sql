-- Tokens never repeat for a key across a failover, even one that loses commits.
--
-- With asynchronous replication (the default of Patroni and CloudNativePG), a promoted
-- standby can miss the last commits the old primary acknowledged: an acquisition, and
-- the sequence's progress before it. Its sequence then hands the next holder the token
-- a lost holder was told about, or a smaller one, and the lost holder's late writes
-- pass the fences (token >= col, lock_held). A promotion always starts a new timeline,
-- and WAL is written on the current timeline only: the primary's timeline is the first
-- 8 hex digits of pg_walfile_name(pg_current_wal_lsn()). So a token issued on timeline
-- t is at least (t - 1) << 40: on timeline 1 nothing changes; after a promotion every
-- token is above every token an earlier timeline issued, as long as a timeline issues
-- fewer than 2^40 (about 10^12) tokens. The same holds for a restore to a point in
-- time, which starts a timeline too.
--
-- Tokens stay sequence values, unique across keys: the first acquisitions on a new
-- timeline move the sequence up to the timeline's floor with setval. setval is not
-- atomic with nextval (two callers could both set it, and the later one set it back
-- under a token the other handed out), so they take turns on a transaction-scoped
-- advisory lock, and each draws again once it has the lock; every later caller's
-- nextval is above the floor and takes no lock. It costs one pg_current_wal_lsn() and
-- pg_walfile_name() per acquisition (a shared-memory read and a string).
--
-- The two paths (a free row updated, a new row inserted) now draw the token at one
-- place and write it with one UPDATE. Both drawn after the row lock, as before.

-- lock_acquire as in 000011, its token at least its timeline's floor.
CREATE OR REPLACE FUNCTION pglock.lock_acquire(key text, owner text, ttl_ms bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    token bigint;
    inserted boolean := false;
    floor bigint;
BEGIN
    IF lock_acquire.key = '' OR length(lock_acquire.key) > 500 OR lock_acquire.owner = ''
        OR lock_acquire.ttl_ms < 1 OR lock_acquire.ttl_ms > 31536000000 THEN
        RAISE EXCEPTION 'pglock.lock_acquire: want a key of 1 to 500 characters, an owner and a ttl_ms of 1 to 31536000000 (365 days), not a key of % characters, owner %L and ttl_ms %',
            length(lock_acquire.key), lock_acquire.owner, lock_acquire.ttl_ms
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM FROM pglock.locks l
    WHERE l.key = lock_acquire.key AND (l.owner IS NULL OR l.expires_at <= clock_timestamp())
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
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
        inserted := true;
    END IF;
    token := nextval('pglock.fencing_token_seq');
    floor := (('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1) << 40;
    IF token <= floor THEN
        PERFORM pg_advisory_xact_lock(2736408391470914537);
        token := nextval('pglock.fencing_token_seq');
        IF token <= floor THEN
            token := setval('pglock.fencing_token_seq', floor + 1);
        END IF;
    END IF;
    -- A new row's placeholder token (1) is no floor; a free row's token is, for a
    -- sequence that went back (a restore, a failover within one timeline's range).
    UPDATE pglock.locks l
    SET owner = lock_acquire.owner,
        fencing_token = CASE WHEN inserted THEN token ELSE greatest(token, l.fencing_token + 1) END,
        expires_at = clock_timestamp() + lock_acquire.ttl_ms * interval '1 millisecond'
    WHERE l.key = lock_acquire.key
    RETURNING l.fencing_token INTO token;
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    RETURN token;
END $$;
