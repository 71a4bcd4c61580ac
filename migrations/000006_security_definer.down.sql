-- Back to 000005: the functions run with the caller's rights again, and PUBLIC may
-- execute them, as PostgreSQL grants by default. The caller then needs SELECT, INSERT
-- and UPDATE on pglock.locks (DELETE for lock_prune) and USAGE and UPDATE on
-- pglock.fencing_token_seq. The grants 000006 made to roles are left in place.
ALTER FUNCTION pglock.lock_acquire(text, text, bigint) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pglock.lock_renew(text, text, bigint) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pglock.lock_renew_many(text[], text[], bigint) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pglock.lock_release(text, text) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pglock.lock_want(text) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pglock.lock_holder(text) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pglock.lock_held(text, bigint) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pglock.lock_prune(bigint, integer) SECURITY INVOKER RESET search_path;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pglock TO PUBLIC;
