-- Slots: each scheduled run of a job (a job with Cron or Every) is a slot, named by the
-- time its schedule gives it, and claimed once, on the database clock, whatever the
-- instances' clocks, their timers' shifts or their pauses (issue 35).
--
-- - pglock.job_slots holds a row per (job, slot) claimed. job_slot_claim inserts it: of
--   any number of instances whose ticks name the same slot, one inserts the row and
--   runs the slot; the others find it and skip. Each claim (each attempt) takes the
--   slot's lock, the lock row "<job>:slot:<slot in ms since the epoch>" of
--   pglock.locks, with a token drawn by fencing_token_next: the run's fence, renewed
--   while it runs as every lock is, so that FenceHeld and FenceUpdate refuse a stale
--   attempt's write, and so that a holder that died is seen (its lock expires).
-- - A tick names its slot with the database's clock: job_slot_claim takes the slot the
--   client computed from the schedule and the next one, and claims it only if it is the
--   schedule's latest at or before the database's now plus an early tolerance (half the
--   gap to the next slot, a second at most), answering 'moved' with the database's now
--   otherwise. A past slot (catch-up: next_ms null) is claimed only once it has come.
-- - A slot whose tick comes more than deadline_ms after it is recorded missed (outcome
--   'missed') by the first tick that finds it so, and by nobody else.
-- - job_slot_end records how an attempt ended and releases its lock in one statement,
--   whose commit does not wait for the disk (as lock_release_async). An attempt that
--   did not succeed, of a slot with attempts left (at least once), may be claimed again
--   by job_slot_retry once its retry_at has come; an attempt whose holder died (its
--   lock expired or was released without an end) at once. Each retry takes the slot's
--   lock again, with a greater token.
-- - job_slot_prune deletes the rows of slots long ended (or whose holder died long ago),
--   never a job's latest, so that a tick always finds the last slot claimed before it.
--
-- # The lock order
--
-- As 000027's header, with one more family: a slot's row. A function that changes a
-- slot's row changes it before the row of its lock, and never waits for a slot's row
-- while it holds a lock's row. job_slot_claim's insert may wait for a concurrent insert
-- of the same slot, holding nothing else; it then takes the slot's lock with a try
-- (the creation lock, then lock_take's SKIP LOCKED). job_slot_retry and job_slot_prune
-- lock slots' rows with SKIP LOCKED. job_slot_end updates the slot's row, then releases
-- its lock as lock_release does.

CREATE TABLE IF NOT EXISTS pglock.job_slots (
    job           text        NOT NULL, -- the job's key
    slot          timestamptz NOT NULL, -- the scheduled time it stands for
    attempt       integer     NOT NULL, -- 1 at the claim, one more each retry; 0 for a missed slot
    attempts      integer     NOT NULL, -- the most attempts: 1 at most once, more at least once
    fencing_token bigint,               -- the current attempt's token (its lock's); null when missed
    owner         text,                 -- the current attempt's owner; null when missed
    claimed_at    timestamptz NOT NULL, -- when the current attempt was claimed (or the slot found missed)
    ended_at      timestamptz,          -- when it ended; null while it runs, or when its holder died
    outcome       text CHECK (outcome IN ('ok', 'error', 'panicked', 'lost', 'skipped', 'missed')),
    retry_at      timestamptz,          -- the earliest next attempt after one that did not succeed
    CONSTRAINT job_slots_pkey PRIMARY KEY (job, slot),
    CONSTRAINT job_slots_attempt CHECK ((outcome = 'missed') = (fencing_token IS NULL)
                                        AND (fencing_token IS NULL) = (owner IS NULL))
);

-- The slots of a job that may be attempted again: those of a job at least once, until
-- their success or their last attempt.
CREATE INDEX IF NOT EXISTS job_slots_pending ON pglock.job_slots (job, slot)
    WHERE attempt < attempts AND outcome IS DISTINCT FROM 'ok' AND outcome IS DISTINCT FROM 'missed';

-- job_slot_key: the key of a slot's lock, "<job>:slot:<the slot in milliseconds since the
-- epoch>".
CREATE OR REPLACE FUNCTION pglock.job_slot_key(job text, slot_ms bigint) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT $1 OPERATOR(pg_catalog.||) ':slot:' OPERATOR(pg_catalog.||) $2::text
$$;

-- job_slot_due: when an attempt of one of job's slots may next be made again, in
-- microseconds since the epoch: a failed attempt's retry_at, a running attempt's lock's
-- expiry (now when its lock is gone); null when no slot of job may be.
CREATE OR REPLACE FUNCTION pglock.job_slot_due(job text) RETURNS bigint
LANGUAGE sql STABLE SECURITY INVOKER SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_catalog.round(pg_catalog.date_part('epoch', pg_catalog.min(
               CASE WHEN p.ended_at IS NOT NULL THEN p.retry_at
                    ELSE GREATEST(pg_catalog.clock_timestamp(),
                        (SELECT l.expires_at FROM pglock.locks l
                         WHERE l.key OPERATOR(pg_catalog.=) pglock.job_slot_key(p.job,
                                   pg_catalog.round(pg_catalog.date_part('epoch', p.slot) OPERATOR(pg_catalog.*) 1000)::bigint)
                           AND l.owner OPERATOR(pg_catalog.=) p.owner
                           AND l.fencing_token OPERATOR(pg_catalog.=) p.fencing_token)) END))
           OPERATOR(pg_catalog.*) 1000000)::bigint
    FROM pglock.job_slots p
    WHERE p.job OPERATOR(pg_catalog.=) $1 AND p.attempt OPERATOR(pg_catalog.<) p.attempts
      AND p.outcome IS DISTINCT FROM 'ok' AND p.outcome IS DISTINCT FROM 'missed'
$$;

-- job_slot_claim claims slot slot_ms of job for owner for ttl_ms, with a job of attempts
-- attempts (1: at most once). With next_ms (the schedule's slot after it), slot_ms
-- must be the schedule's latest at or before the database's now plus the early
-- tolerance; without (a missed slot a tick catches up), it must have come. status says
-- what happened:
--   claimed  the slot is this call's: fencing_token is its lock's token, prior_ms the
--            job's latest slot before it (null when none), so the caller knows what it
--            missed;
--   taken    another call claimed it (or recorded it missed) first;
--   late     more than deadline_ms (when above 0) after the slot: recorded missed, with
--            prior_ms as for claimed;
--   moved    slot_ms is not the slot this call may claim on the database's clock: now_us
--            says what that clock reads, nothing is written.
-- now_us is the database's now (microseconds since the epoch); due_us, for a job with
-- more than one attempt, job_slot_due's. Bad input raises invalid_parameter_value
-- (22023) and writes nothing. A claim commits durably, as an acquisition does.
CREATE OR REPLACE FUNCTION pglock.job_slot_claim(job text, slot_ms bigint, next_ms bigint, owner text, ttl_ms bigint,
    attempts integer, deadline_ms bigint,
    OUT status text, OUT fencing_token bigint, OUT prior_ms bigint, OUT now_us bigint, OUT due_us bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    now timestamptz := clock_timestamp();
    slot_at timestamptz;
    early interval;
    k text;
    token bigint;
    inserted boolean := false;
BEGIN
    IF NOT coalesce(pglock.lock_key_ok(job_slot_claim.job), false) THEN
        PERFORM pglock.lock_refuse('job_slot_claim', 'job', 'a job''s key: 1 to 500 characters without U+001F', job_slot_claim.job);
    ELSIF NOT coalesce(job_slot_claim.slot_ms BETWEEN 0 AND 253402300799999, false) THEN
        PERFORM pglock.lock_refuse('job_slot_claim', 'slot_ms', '0 to 253402300799999 (milliseconds since the epoch, up to the year 9999)', job_slot_claim.slot_ms::text);
    ELSIF NOT pglock.lock_key_ok(pglock.job_slot_key(job_slot_claim.job, job_slot_claim.slot_ms)) THEN
        PERFORM pglock.lock_refuse('job_slot_claim', 'job', 'a job''s key short enough that its slot''s lock key ("<job>:slot:<slot_ms>") has at most 500 characters', job_slot_claim.job);
    ELSIF NOT coalesce(job_slot_claim.next_ms > job_slot_claim.slot_ms AND job_slot_claim.next_ms <= 253402300799999,
                       job_slot_claim.next_ms IS NULL) THEN
        PERFORM pglock.lock_refuse('job_slot_claim', 'next_ms', 'null (a missed slot) or after slot_ms, up to 253402300799999', job_slot_claim.next_ms::text);
    ELSIF NOT coalesce(pglock.lock_owner_ok(job_slot_claim.owner), false) THEN
        PERFORM pglock.lock_refuse('job_slot_claim', 'owner', '1 to 255 characters', job_slot_claim.owner);
    ELSIF NOT coalesce(pglock.lock_ttl_ok(job_slot_claim.ttl_ms), false) THEN
        PERFORM pglock.lock_refuse('job_slot_claim', 'ttl_ms', '1 to 31536000000 (365 days)', job_slot_claim.ttl_ms::text);
    ELSIF NOT coalesce(job_slot_claim.attempts BETWEEN 1 AND 100, false) THEN
        PERFORM pglock.lock_refuse('job_slot_claim', 'attempts', '1 (at most once) to 100', job_slot_claim.attempts::text);
    ELSIF NOT coalesce(job_slot_claim.deadline_ms BETWEEN 0 AND 31536000000, false) THEN
        PERFORM pglock.lock_refuse('job_slot_claim', 'deadline_ms', '0 (none) to 31536000000 (365 days)', job_slot_claim.deadline_ms::text);
    END IF;
    now_us := round(date_part('epoch', now) * 1000000)::bigint;
    slot_at := timestamptz 'epoch' + job_slot_claim.slot_ms * interval '1 millisecond';
    IF job_slot_claim.next_ms IS NOT NULL THEN
        early := least((job_slot_claim.next_ms - job_slot_claim.slot_ms) / 2, 1000) * interval '1 millisecond';
        IF slot_at > now + early
            OR timestamptz 'epoch' + job_slot_claim.next_ms * interval '1 millisecond' <= now + early THEN
            status := 'moved';
            RETURN;
        END IF;
    ELSIF slot_at > now THEN
        status := 'moved';
        RETURN;
    END IF;
    IF job_slot_claim.deadline_ms > 0 AND now - slot_at > job_slot_claim.deadline_ms * interval '1 millisecond' THEN
        INSERT INTO pglock.job_slots AS p (job, slot, attempt, attempts, claimed_at, ended_at, outcome)
        VALUES (job_slot_claim.job, slot_at, 0, job_slot_claim.attempts, now, now, 'missed')
        ON CONFLICT ON CONSTRAINT job_slots_pkey DO NOTHING;
        status := CASE WHEN FOUND THEN 'late' ELSE 'taken' END;
    ELSIF EXISTS (SELECT FROM pglock.job_slots p WHERE p.job = job_slot_claim.job AND p.slot = slot_at) THEN
        status := 'taken'; -- a read first, which locks and draws nothing: most ticks of a slot lose
    ELSE
        token := pglock.fencing_token_next();
        INSERT INTO pglock.job_slots AS p (job, slot, attempt, attempts, fencing_token, owner, claimed_at)
        VALUES (job_slot_claim.job, slot_at, 1, job_slot_claim.attempts, token, job_slot_claim.owner, now)
        ON CONFLICT ON CONSTRAINT job_slots_pkey DO NOTHING;
        IF NOT FOUND THEN
            status := 'taken';
        ELSE
            -- The slot's lock: a new key, unless a prune left its row or a caller of
            -- lock_acquire took it; then as lock_take takes a key.
            k := pglock.job_slot_key(job_slot_claim.job, job_slot_claim.slot_ms);
            IF pg_try_advisory_xact_lock(hashtextextended(k, 1885826162)) THEN
                INSERT INTO pglock.locks AS l (key, owner, fencing_token, expires_at, acquired_at, ttl_ms)
                VALUES (k, job_slot_claim.owner, token, now + job_slot_claim.ttl_ms * interval '1 millisecond',
                        now, job_slot_claim.ttl_ms)
                ON CONFLICT ON CONSTRAINT locks_pkey DO NOTHING;
                inserted := FOUND;
            END IF;
            IF NOT inserted THEN
                token := pglock.lock_take(k, job_slot_claim.owner, job_slot_claim.ttl_ms);
                IF token IS NULL THEN
                    -- Its lock's key is held by someone else: the attempt is lost.
                    UPDATE pglock.job_slots p SET ended_at = now, outcome = 'lost', retry_at = now
                    WHERE p.job = job_slot_claim.job AND p.slot = slot_at;
                ELSE
                    UPDATE pglock.job_slots p SET fencing_token = token
                    WHERE p.job = job_slot_claim.job AND p.slot = slot_at;
                END IF;
            END IF;
            status := CASE WHEN token IS NULL THEN 'taken' ELSE 'claimed' END;
            job_slot_claim.fencing_token := token;
            IF current_setting('synchronous_commit') IN ('off', 'local') THEN
                PERFORM set_config('synchronous_commit', 'on', true);
            END IF;
        END IF;
    END IF;
    IF status IN ('claimed', 'late') THEN
        SELECT round(date_part('epoch', max(p.slot)) * 1000)::bigint INTO prior_ms
        FROM pglock.job_slots p WHERE p.job = job_slot_claim.job AND p.slot < slot_at;
    END IF;
    IF job_slot_claim.attempts > 1 THEN
        due_us := pglock.job_slot_due(job_slot_claim.job);
    END IF;
END $$;

-- job_slot_end records how the attempt of owner with token of slot slot_ms of job ended
-- (outcome: ok, error, panicked, lost or skipped), unless a later attempt took the slot
-- over, and releases the slot's lock for owner as lock_release does; it returns whether
-- owner still held it. An attempt that did not succeed, of a slot with attempts left,
-- may be made again from backoff_ms times 2^(attempt-1) on (a day at most). Its commit
-- does not wait for the disk (as lock_release_async): call it as a statement of its own.
CREATE OR REPLACE FUNCTION pglock.job_slot_end(job text, slot_ms bigint, owner text, token bigint, outcome text,
    backoff_ms bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    now timestamptz := clock_timestamp();
    k text;
BEGIN
    IF NOT coalesce(pglock.lock_key_ok(job_slot_end.job), false) THEN
        PERFORM pglock.lock_refuse('job_slot_end', 'job', 'a job''s key: 1 to 500 characters without U+001F', job_slot_end.job);
    ELSIF NOT coalesce(job_slot_end.slot_ms BETWEEN 0 AND 253402300799999, false) THEN
        PERFORM pglock.lock_refuse('job_slot_end', 'slot_ms', '0 to 253402300799999 (milliseconds since the epoch, up to the year 9999)', job_slot_end.slot_ms::text);
    ELSIF NOT pglock.lock_key_ok(pglock.job_slot_key(job_slot_end.job, job_slot_end.slot_ms)) THEN
        PERFORM pglock.lock_refuse('job_slot_end', 'job', 'a job''s key short enough that its slot''s lock key ("<job>:slot:<slot_ms>") has at most 500 characters', job_slot_end.job);
    ELSIF NOT coalesce(pglock.lock_owner_ok(job_slot_end.owner), false) THEN
        PERFORM pglock.lock_refuse('job_slot_end', 'owner', '1 to 255 characters', job_slot_end.owner);
    ELSIF NOT coalesce(job_slot_end.token > 0, false) THEN
        PERFORM pglock.lock_refuse('job_slot_end', 'token', 'above 0', job_slot_end.token::text);
    ELSIF NOT coalesce(job_slot_end.outcome IN ('ok', 'error', 'panicked', 'lost', 'skipped'), false) THEN
        PERFORM pglock.lock_refuse('job_slot_end', 'outcome', 'ok, error, panicked, lost or skipped', job_slot_end.outcome);
    ELSIF NOT coalesce(job_slot_end.backoff_ms BETWEEN 0 AND 86400000, false) THEN
        PERFORM pglock.lock_refuse('job_slot_end', 'backoff_ms', '0 to 86400000 (a day)', job_slot_end.backoff_ms::text);
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    UPDATE pglock.job_slots p
    SET ended_at = now,
        outcome = job_slot_end.outcome,
        retry_at = CASE WHEN job_slot_end.outcome <> 'ok' AND p.attempt < p.attempts THEN
            now + least(job_slot_end.backoff_ms * power(2, p.attempt - 1), 86400000) * interval '1 millisecond' END
    WHERE p.job = job_slot_end.job AND p.slot = timestamptz 'epoch' + job_slot_end.slot_ms * interval '1 millisecond'
      AND p.fencing_token = job_slot_end.token AND p.owner = job_slot_end.owner AND p.ended_at IS NULL;
    k := pglock.job_slot_key(job_slot_end.job, job_slot_end.slot_ms);
    UPDATE pglock.locks l
    SET owner = NULL,
        expires_at = now,
        wanted_at = CASE WHEN l.wanted_at IS NOT NULL THEN
            (SELECT NULL::timestamptz FROM pg_notify('pglock_released', l.key)) END
    WHERE l.key = k AND l.owner = job_slot_end.owner AND l.expires_at > now AND NOT l.queued;
    IF FOUND THEN
        RETURN true;
    END IF;
    RETURN pglock.lock_release_slow(k, job_slot_end.owner);
END $$;

-- job_slot_retry claims, for owner for ttl_ms, a new attempt of job's oldest slot that
-- may be attempted again now (a failed attempt's retry_at has come; a running
-- attempt's lock expired or was released without an end): slot_ms, fencing_token (its
-- lock's, greater than the last attempt's) and attempt say which. Without one, slot_ms
-- is null and due_us is job_slot_due's. now_us is the database's now. A claim commits
-- durably.
CREATE OR REPLACE FUNCTION pglock.job_slot_retry(job text, owner text, ttl_ms bigint,
    OUT slot_ms bigint, OUT fencing_token bigint, OUT attempt integer, OUT now_us bigint, OUT due_us bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    now timestamptz := clock_timestamp();
    slot_at timestamptz;
    ms bigint;
    token bigint;
BEGIN
    IF NOT coalesce(pglock.lock_key_ok(job_slot_retry.job), false) THEN
        PERFORM pglock.lock_refuse('job_slot_retry', 'job', 'a job''s key: 1 to 500 characters without U+001F', job_slot_retry.job);
    ELSIF NOT coalesce(pglock.lock_owner_ok(job_slot_retry.owner), false) THEN
        PERFORM pglock.lock_refuse('job_slot_retry', 'owner', '1 to 255 characters', job_slot_retry.owner);
    ELSIF NOT coalesce(pglock.lock_ttl_ok(job_slot_retry.ttl_ms), false) THEN
        PERFORM pglock.lock_refuse('job_slot_retry', 'ttl_ms', '1 to 31536000000 (365 days)', job_slot_retry.ttl_ms::text);
    END IF;
    now_us := round(date_part('epoch', now) * 1000000)::bigint;
    SELECT p.slot INTO slot_at FROM pglock.job_slots p
    WHERE p.job = job_slot_retry.job AND p.attempt < p.attempts
      AND p.outcome IS DISTINCT FROM 'ok' AND p.outcome IS DISTINCT FROM 'missed'
      AND CASE WHEN p.ended_at IS NOT NULL THEN p.retry_at <= now
               ELSE NOT EXISTS (SELECT FROM pglock.locks l
                                WHERE l.key = pglock.job_slot_key(p.job, round(date_part('epoch', p.slot) * 1000)::bigint)
                                  AND l.owner = p.owner AND l.fencing_token = p.fencing_token
                                  AND l.expires_at > now) END
    ORDER BY p.slot
    LIMIT 1
    FOR UPDATE SKIP LOCKED;
    IF FOUND THEN
        ms := round(date_part('epoch', slot_at) * 1000)::bigint;
        token := pglock.lock_take(pglock.job_slot_key(job_slot_retry.job, ms), job_slot_retry.owner, job_slot_retry.ttl_ms);
        IF token IS NOT NULL THEN
            UPDATE pglock.job_slots p
            SET attempt = p.attempt + 1, fencing_token = token, owner = job_slot_retry.owner, claimed_at = now,
                ended_at = NULL, outcome = NULL, retry_at = NULL
            WHERE p.job = job_slot_retry.job AND p.slot = slot_at
            RETURNING p.attempt INTO job_slot_retry.attempt;
            slot_ms := ms;
            fencing_token := token;
            RETURN;
        END IF;
    END IF;
    due_us := pglock.job_slot_due(job_slot_retry.job);
END $$;

-- job_slot_prune deletes up to max_rows slots that ended (or whose holder's lock is
-- gone) more than older_than_ms ago, attempts left or not, and returns how many; never
-- a job's latest slot, nor one whose lock is live. It skips rows others have locked.
CREATE OR REPLACE FUNCTION pglock.job_slot_prune(older_than_ms bigint, max_rows integer) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    cutoff timestamptz;
    deleted bigint;
BEGIN
    IF NOT coalesce(job_slot_prune.older_than_ms BETWEEN 0 AND 9223372036855, false) THEN
        PERFORM pglock.lock_refuse('job_slot_prune', 'older_than_ms', '0 to 9223372036855 (a time.Duration''s range)', job_slot_prune.older_than_ms::text);
    ELSIF NOT coalesce(job_slot_prune.max_rows >= 1, false) THEN
        PERFORM pglock.lock_refuse('job_slot_prune', 'max_rows', '1 or more', job_slot_prune.max_rows::text);
    END IF;
    cutoff := clock_timestamp() - job_slot_prune.older_than_ms * interval '1 millisecond';
    DELETE FROM pglock.job_slots p
    WHERE (p.job, p.slot) IN (
        SELECT o.job, o.slot FROM pglock.job_slots o
        WHERE o.slot < cutoff AND coalesce(o.ended_at, o.claimed_at) < cutoff
          AND EXISTS (SELECT FROM pglock.job_slots n WHERE n.job = o.job AND n.slot > o.slot)
          AND NOT EXISTS (SELECT FROM pglock.locks l
                          WHERE l.key = pglock.job_slot_key(o.job, round(date_part('epoch', o.slot) * 1000)::bigint)
                            AND l.owner = o.owner AND l.fencing_token = o.fencing_token
                            AND l.expires_at > clock_timestamp())
        LIMIT job_slot_prune.max_rows
        FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN deleted;
END $$;

-- The run history records each run's slot and attempt: job_run_record takes them (the
-- form without them, which clients of 000029 call, records none), job_run_list returns
-- them with the rest of the row, job_run_slot those of job_last_runs's runs.
ALTER TABLE pglock.job_runs ADD COLUMN IF NOT EXISTS slot timestamptz;    -- the slot the run stood for; null without
ALTER TABLE pglock.job_runs ADD COLUMN IF NOT EXISTS attempt integer;     -- its attempt, 1 for the first; null without

-- job_run_record as in 000027, with the run's slot (milliseconds since the epoch) and
-- attempt, both null for a job without slots.
CREATE OR REPLACE FUNCTION pglock.job_run_record(job text, instance text, owner text, token bigint,
    ended_ago_us bigint, duration_us bigint, outcome text, err text, retention_ms bigint, slot_ms bigint, attempt integer)
RETURNS bigint
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
    ELSIF NOT coalesce(job_run_record.slot_ms BETWEEN 0 AND 253402300799999 AND job_run_record.attempt BETWEEN 1 AND 100,
                       job_run_record.slot_ms IS NULL AND job_run_record.attempt IS NULL) THEN
        PERFORM pglock.lock_refuse('job_run_record', 'slot_ms and attempt', 'both null, or a slot of 0 to 253402300799999 (milliseconds since the epoch) and an attempt of 1 to 100',
            format('%s and %s', job_run_record.slot_ms, job_run_record.attempt));
    END IF;
    ended := statement_timestamp() - job_run_record.ended_ago_us * interval '1 microsecond';
    PERFORM set_config('synchronous_commit', 'off', true);
    INSERT INTO pglock.job_runs AS r (job, instance, owner, fencing_token, started_at, ended_at, outcome, error, slot, attempt)
    VALUES (job_run_record.job, job_run_record.instance, job_run_record.owner, job_run_record.token,
            ended - job_run_record.duration_us * interval '1 microsecond', ended,
            job_run_record.outcome, left(job_run_record.err, 1000),
            timestamptz 'epoch' + job_run_record.slot_ms * interval '1 millisecond', job_run_record.attempt)
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

-- job_run_record without a slot, as 000029's clients call it.
CREATE OR REPLACE FUNCTION pglock.job_run_record(job text, instance text, owner text, token bigint,
    ended_ago_us bigint, duration_us bigint, outcome text, err text, retention_ms bigint) RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT pglock.job_run_record($1, $2, $3, $4, $5, $6, $7, $8, $9, NULL, NULL)
$$;

-- job_run_slot returns the slot (milliseconds since the epoch) and attempt of the run
-- id, nulls for a run without or unknown: what job_last_runs (whose columns a
-- migration cannot change, as the migrations run again) does not say.
CREATE OR REPLACE FUNCTION pglock.job_run_slot(id bigint, OUT slot_ms bigint, OUT attempt integer)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT round(date_part('epoch', r.slot) * 1000)::bigint, r.attempt FROM pglock.job_runs r WHERE r.id = $1
$$;

-- job_slot_stats returns, per job with slots (as Prune left them), its latest slot and
-- how many of its slots ended in success (ok), ended without it with no attempt left
-- (failed), are running (live lock), lost their holder with no attempt left (lost) or
-- wait for another attempt (pending), and how many attempts were retries.
CREATE OR REPLACE FUNCTION pglock.job_slot_stats()
RETURNS TABLE (job text, last_slot timestamptz, ok bigint, failed bigint, running bigint, lost bigint, pending bigint,
               retried bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT s.job, max(s.slot),
           count(*) FILTER (WHERE s.outcome = 'ok'),
           count(*) FILTER (WHERE s.outcome NOT IN ('ok', 'missed') AND s.attempt >= s.attempts),
           count(*) FILTER (WHERE s.ended_at IS NULL AND s.live),
           count(*) FILTER (WHERE s.ended_at IS NULL AND NOT s.live AND s.attempt >= s.attempts),
           count(*) FILTER (WHERE s.attempt < s.attempts AND (s.outcome NOT IN ('ok', 'missed') OR s.ended_at IS NULL AND NOT s.live)),
           coalesce(sum(s.attempt - 1) FILTER (WHERE s.attempt > 1), 0)
    FROM (SELECT p.*, EXISTS (SELECT FROM pglock.locks l
                              WHERE l.key = pglock.job_slot_key(p.job, round(date_part('epoch', p.slot) * 1000)::bigint)
                                AND l.owner = p.owner AND l.fencing_token = p.fencing_token
                                AND l.expires_at > clock_timestamp()) AS live
          FROM pglock.job_slots p) s
    GROUP BY s.job
    ORDER BY s.job
$$;

-- As 000006 asks: no privilege for PUBLIC; EXECUTE for the roles that may call
-- lock_acquire (the helpers run as their caller: such a role has no privilege on the
-- tables).
REVOKE ALL ON TABLE pglock.job_slots FROM PUBLIC;
REVOKE ALL ON FUNCTION pglock.job_slot_key(text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION pglock.job_slot_due(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pglock.job_slot_claim(text, bigint, bigint, text, bigint, integer, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION pglock.job_slot_end(text, bigint, text, bigint, text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION pglock.job_slot_retry(text, text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION pglock.job_slot_prune(bigint, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION pglock.job_slot_stats() FROM PUBLIC;
REVOKE ALL ON FUNCTION pglock.job_run_slot(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION pglock.job_run_record(text, text, text, bigint, bigint, bigint, text, text, bigint, bigint, integer) FROM PUBLIC;
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
        EXECUTE format('GRANT EXECUTE ON FUNCTION pglock.job_slot_key(text, bigint), pglock.job_slot_due(text), '
            'pglock.job_slot_claim(text, bigint, bigint, text, bigint, integer, bigint), '
            'pglock.job_slot_end(text, bigint, text, bigint, text, bigint), pglock.job_slot_retry(text, text, bigint), '
            'pglock.job_slot_prune(bigint, integer), pglock.job_slot_stats(), pglock.job_run_slot(bigint), '
            'pglock.job_run_record(text, text, text, bigint, bigint, bigint, text, text, bigint, bigint, integer) TO %s', r.grantee);
    END LOOP;
END $$;
