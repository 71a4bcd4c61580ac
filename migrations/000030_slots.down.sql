-- Back to 000029: no slots. The slots' locks stay in pglock.locks as the rows of keys
-- released, which Prune deletes.
DROP FUNCTION IF EXISTS pglock.job_slot_prune(bigint, integer);
DROP FUNCTION IF EXISTS pglock.job_slot_retry(text, text, bigint);
DROP FUNCTION IF EXISTS pglock.job_slot_end(text, bigint, text, bigint, text, bigint);
DROP FUNCTION IF EXISTS pglock.job_slot_claim(text, bigint, bigint, text, bigint, integer, bigint);
DROP FUNCTION IF EXISTS pglock.job_slot_due(text);
DROP FUNCTION IF EXISTS pglock.job_slot_key(text, bigint);
DROP FUNCTION IF EXISTS pglock.job_slot_stats();
DROP TABLE IF EXISTS pglock.job_slots;

-- The run history as 000027 left it: no slot nor attempt.
DROP FUNCTION IF EXISTS pglock.job_run_record(text, text, text, bigint, bigint, bigint, text, text, bigint, bigint, integer);
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
END $function$;
DROP FUNCTION IF EXISTS pglock.job_run_slot(bigint);
ALTER TABLE pglock.job_runs DROP COLUMN IF EXISTS slot;
ALTER TABLE pglock.job_runs DROP COLUMN IF EXISTS attempt;
