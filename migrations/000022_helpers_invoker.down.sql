-- Back to 000014-000017's helpers, running as the schema's owner.
ALTER FUNCTION pglock.fencing_token_next() SECURITY DEFINER;
ALTER FUNCTION pglock.lock_take(text, text, bigint) SECURITY DEFINER;
ALTER FUNCTION pglock.queue_grant(text) SECURITY DEFINER;
ALTER FUNCTION pglock.sem_lock(text, integer) SECURITY DEFINER;
ALTER FUNCTION pglock.sem_live(text) SECURITY DEFINER;
ALTER FUNCTION pglock.sem_waiting(text, bigint) SECURITY DEFINER;
ALTER FUNCTION pglock.sem_take(text, text, bigint, integer) SECURITY DEFINER;
ALTER FUNCTION pglock.sem_grant(text, text) SECURITY DEFINER;
ALTER FUNCTION pglock.locks_set_acquired_at() SECURITY DEFINER;
