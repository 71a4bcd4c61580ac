-- Back to 000029: no slots. The slots' locks stay in pglock.locks as the rows of keys
-- released, which Prune deletes.
DROP FUNCTION IF EXISTS pglock.job_slot_prune(bigint, integer);
DROP FUNCTION IF EXISTS pglock.job_slot_retry(text, text, bigint);
DROP FUNCTION IF EXISTS pglock.job_slot_end(text, bigint, text, bigint, text, bigint);
DROP FUNCTION IF EXISTS pglock.job_slot_claim(text, bigint, bigint, text, bigint, integer, bigint);
DROP FUNCTION IF EXISTS pglock.job_slot_due(text);
DROP FUNCTION IF EXISTS pglock.job_slot_key(text, bigint);
DROP TABLE IF EXISTS pglock.job_slots;
