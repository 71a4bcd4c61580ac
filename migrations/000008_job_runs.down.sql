-- Back to 000007: no run history.
DROP FUNCTION IF EXISTS pglock.job_skip_list();
DROP FUNCTION IF EXISTS pglock.job_last_runs();
DROP FUNCTION IF EXISTS pglock.job_run_list(text, integer);
DROP FUNCTION IF EXISTS pglock.job_skips_record(text, json, bigint);
DROP FUNCTION IF EXISTS pglock.job_run_record(text, text, text, bigint, bigint, bigint, text, text, bigint);
DROP TABLE IF EXISTS pglock.job_skips;
DROP TABLE IF EXISTS pglock.job_runs;
