DROP FUNCTION IF EXISTS pglock.lock_release_async(text, text);
