DROP FUNCTION IF EXISTS pglock.lock_held(text, bigint);
