-- Back to the schema before 000018: hand-backs one release at a time.
DROP FUNCTION IF EXISTS pglock.lock_release_many(text[], text[], boolean);
