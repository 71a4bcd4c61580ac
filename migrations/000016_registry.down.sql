-- Back to the schema before 000016: no registry.
DROP FUNCTION IF EXISTS pglock.registry_list(text);
DROP FUNCTION IF EXISTS pglock.registry_touch(text, text[], text, boolean);
DROP TABLE IF EXISTS pglock.registry;
