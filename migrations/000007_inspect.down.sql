-- Back to 000006: no lock_list, no lock_force_release.
DROP FUNCTION IF EXISTS pglock.lock_force_release(text);
DROP FUNCTION IF EXISTS pglock.lock_list(text);
