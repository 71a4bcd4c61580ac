DROP FUNCTION IF EXISTS pglock.lock_renew_many(text[], text[], bigint);
DROP FUNCTION IF EXISTS pglock.lock_release(text, text);
DROP FUNCTION IF EXISTS pglock.lock_renew(text, text, bigint);
DROP FUNCTION IF EXISTS pglock.lock_acquire(text, text, bigint);
DROP TABLE IF EXISTS pglock.locks;
DROP SEQUENCE IF EXISTS pglock.fencing_token_seq;
