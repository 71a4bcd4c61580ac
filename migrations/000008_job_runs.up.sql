-- Run history: every run of a job (Client.Job, a gocron locker's job) and a count of the
-- ticks each instance skipped, so that "when did the export last run, where, and did it
-- fail?" has an answer in the database. The client writes them in the background, after
-- the runs, one statement per run (see RunHistory); Client.JobRuns and Client.Jobs read
-- them.

-- One row per run. Times are on the database clock: the client sends how long ago the
-- run ended and how long it took, on its own monotonic clock, so a client whose wall
-- clock is off still records the database's times. "Ago" counts from when the client
-- sent the statement, so the functions count it back from statement_timestamp() (when
-- the server received it), not clock_timestamp(), which comes after the function's
-- compilation on a new connection and would place the run a few milliseconds late.
CREATE TABLE IF NOT EXISTS pglock.job_runs (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job           text        NOT NULL, -- the job's key or gocron job name
    instance      text        NOT NULL, -- the client's instance name (WithInstanceName)
    owner         text        NOT NULL, -- the owner id of the lock the run held
    fencing_token bigint      NOT NULL, -- that lock's token
    started_at    timestamptz NOT NULL,
    ended_at      timestamptz NOT NULL,
    outcome       text        NOT NULL CHECK (outcome IN ('ok', 'error', 'panicked', 'lost')),
    error         text                  -- the error's text, at most 1000 characters; null when none
);

-- The last runs of a job, and (partial) its last failure, without reading its other runs.
CREATE INDEX IF NOT EXISTS job_runs_job_ended_at ON pglock.job_runs (job, ended_at, id);
CREATE INDEX IF NOT EXISTS job_runs_job_failed ON pglock.job_runs (job, ended_at, id) WHERE outcome <> 'ok';

-- Skipped ticks, counted per job, instance and reason: a job that runs every second on
-- one of ten instances skips nine ticks a second, which would swamp job_runs as rows.
CREATE TABLE IF NOT EXISTS pglock.job_skips (
    job      text        NOT NULL,
    instance text        NOT NULL,
    reason   text        NOT NULL, -- 'other instance', 'run in progress'
    count    bigint      NOT NULL CHECK (count > 0),
    last_at  timestamptz NOT NULL, -- the last skip counted, on the database clock
    CONSTRAINT job_skips_pkey PRIMARY KEY (job, instance, reason)
);

-- job_run_record records one run that ended ended_ago_us microseconds ago after running
-- duration_us, and returns its id. Every 16th id it also deletes the runs of that job
-- that ended more than retention_ms ago, so that the history prunes itself (an index
-- range scan of the job's oldest rows). err is kept to its first 1000 characters; null
-- when the run had none. Bad input raises invalid_parameter_value (22023); an unknown
-- outcome fails the table's CHECK (23514). Its transaction commits without waiting
-- for its WAL to reach the disk (synchronous_commit off until the transaction ends): a
-- crash may lose the last runs recorded, never a lock or a token, and a run never
-- waits for a flush. So call it as a statement of its own, never inside a transaction
-- whose other writes must be durable; the same goes for job_skips_record.
CREATE OR REPLACE FUNCTION pglock.job_run_record(job text, instance text, owner text, token bigint,
    ended_ago_us bigint, duration_us bigint, outcome text, err text, retention_ms bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    ended timestamptz := statement_timestamp() - job_run_record.ended_ago_us * interval '1 microsecond';
    run_id bigint;
BEGIN
    IF job_run_record.job IS NULL OR job_run_record.instance IS NULL OR job_run_record.owner IS NULL
        OR job_run_record.token IS NULL OR job_run_record.outcome IS NULL
        OR NOT job_run_record.ended_ago_us >= 0 OR NOT job_run_record.duration_us >= 0
        OR NOT job_run_record.retention_ms > 0 THEN
        RAISE EXCEPTION 'pglock.job_run_record: job, instance, owner, token and outcome must not be null, ended_ago_us and duration_us must be >= 0 and retention_ms > 0'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    INSERT INTO pglock.job_runs AS r (job, instance, owner, fencing_token, started_at, ended_at, outcome, error)
    VALUES (job_run_record.job, job_run_record.instance, job_run_record.owner, job_run_record.token,
            ended - job_run_record.duration_us * interval '1 microsecond', ended,
            job_run_record.outcome, left(job_run_record.err, 1000))
    RETURNING r.id INTO run_id;
    IF run_id % 16 = 0 THEN
        DELETE FROM pglock.job_runs r
        WHERE r.job = job_run_record.job
          AND r.ended_at < clock_timestamp() - job_run_record.retention_ms * interval '1 millisecond';
    END IF;
    RETURN run_id;
END $$;

-- job_skips_record adds the skips that instance counted, a JSON array of
-- {"job", "reason", "count", "ago_us"} (ago_us: how long ago the last of them was, one
-- element per job and reason), to their counters, and deletes the counters of those
-- jobs, any instance, last counted more than retention_ms ago (instances that are gone).
-- It returns how many counters it wrote.
CREATE OR REPLACE FUNCTION pglock.job_skips_record(instance text, skips json, retention_ms bigint) RETURNS integer
LANGUAGE plpgsql VOLATILE STRICT AS $$
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
END $$;

-- job_run_list returns the last max_rows runs of job, newest first.
CREATE OR REPLACE FUNCTION pglock.job_run_list(job text, max_rows integer) RETURNS SETOF pglock.job_runs
LANGUAGE sql STABLE STRICT AS $$
    SELECT r.* FROM pglock.job_runs r
    WHERE r.job = job_run_list.job
    ORDER BY r.ended_at DESC, r.id DESC
    LIMIT job_run_list.max_rows
$$;

-- job_last_runs returns, for every job with runs, its last run (last_failure false)
-- and its last run whose outcome is not ok (last_failure true; none when it never
-- failed). The jobs are found by a skip scan of the job index, a lookup a job, so it
-- reads two rows a job however long the history.
CREATE OR REPLACE FUNCTION pglock.job_last_runs()
RETURNS TABLE (last_failure boolean, id bigint, job text, instance text, owner text, fencing_token bigint,
               started_at timestamptz, ended_at timestamptz, outcome text, error text)
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE jobs(job) AS (
        (SELECT r.job FROM pglock.job_runs r ORDER BY r.job LIMIT 1)
        UNION ALL
        SELECT (SELECT r.job FROM pglock.job_runs r WHERE r.job > j.job ORDER BY r.job LIMIT 1)
        FROM jobs j WHERE j.job IS NOT NULL)
    SELECT false, l.id, l.job, l.instance, l.owner, l.fencing_token, l.started_at, l.ended_at, l.outcome, l.error
    FROM jobs j CROSS JOIN LATERAL (
        SELECT r.* FROM pglock.job_runs r WHERE r.job = j.job
        ORDER BY r.ended_at DESC, r.id DESC LIMIT 1) l
    UNION ALL
    SELECT true, f.id, f.job, f.instance, f.owner, f.fencing_token, f.started_at, f.ended_at, f.outcome, f.error
    FROM jobs j CROSS JOIN LATERAL (
        SELECT r.* FROM pglock.job_runs r WHERE r.job = j.job AND r.outcome <> 'ok'
        ORDER BY r.ended_at DESC, r.id DESC LIMIT 1) f
$$;

-- job_skip_list returns every skip counter, by job, instance and reason.
CREATE OR REPLACE FUNCTION pglock.job_skip_list() RETURNS SETOF pglock.job_skips
LANGUAGE sql STABLE AS $$
    SELECT s.* FROM pglock.job_skips s ORDER BY s.job, s.instance, s.reason
$$;

-- As 000006: the functions run as their owner, so that an application role needs only
-- EXECUTE on them and can neither write nor read the tables itself; EXECUTE goes to the
-- roles that may call lock_acquire, not to PUBLIC.
ALTER FUNCTION pglock.job_run_record(text, text, text, bigint, bigint, bigint, text, text, bigint)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION pglock.job_skips_record(text, json, bigint) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION pglock.job_run_list(text, integer) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION pglock.job_last_runs() SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION pglock.job_skip_list() SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

REVOKE ALL ON TABLE pglock.job_runs FROM PUBLIC;
REVOKE ALL ON TABLE pglock.job_skips FROM PUBLIC;
REVOKE ALL ON FUNCTION pglock.job_run_record(text, text, text, bigint, bigint, bigint, text, text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION pglock.job_skips_record(text, json, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION pglock.job_run_list(text, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION pglock.job_last_runs() FROM PUBLIC;
REVOKE ALL ON FUNCTION pglock.job_skip_list() FROM PUBLIC;

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
        EXECUTE format('GRANT EXECUTE ON FUNCTION pglock.job_run_record(text, text, text, bigint, bigint, bigint, text, text, bigint), '
            'pglock.job_skips_record(text, json, bigint), pglock.job_run_list(text, integer), '
            'pglock.job_last_runs(), pglock.job_skip_list() TO %s', r.grantee);
    END LOOP;
END $$;
