-- The internal helpers run as their caller (SECURITY INVOKER), not as the schema's
-- owner: fencing_token_next, lock_take, queue_grant and the semaphores' sem_lock,
-- sem_live, sem_waiting, sem_take and sem_grant check no argument (their callers did),
-- and README's grant (EXECUTE ON ALL FUNCTIONS) lets an application role call them
-- directly: lock_take took a 100,000-character key, past every check. Called from
-- pglock's functions, which run as the owner, they run as the owner too, as before;
-- called by a role with no privilege on pglock's tables (README's), they fail with
-- insufficient_privilege (42501) and change nothing. The trigger function
-- locks_set_acquired_at runs as whoever writes the row: pglock's functions, or an
-- administrator. Their search_path stays pinned.
ALTER FUNCTION pglock.fencing_token_next() SECURITY INVOKER;
ALTER FUNCTION pglock.lock_take(text, text, bigint) SECURITY INVOKER;
ALTER FUNCTION pglock.queue_grant(text) SECURITY INVOKER;
ALTER FUNCTION pglock.sem_lock(text, integer) SECURITY INVOKER;
ALTER FUNCTION pglock.sem_live(text) SECURITY INVOKER;
ALTER FUNCTION pglock.sem_waiting(text, bigint) SECURITY INVOKER;
ALTER FUNCTION pglock.sem_take(text, text, bigint, integer) SECURITY INVOKER;
ALTER FUNCTION pglock.sem_grant(text, text) SECURITY INVOKER;
ALTER FUNCTION pglock.locks_set_acquired_at() SECURITY INVOKER;
