-- The torture test's tables, in the database of the run, beside the pglock schema.
CREATE SCHEMA torture;

-- Every change of a lock row that matters (holder, token, expiry), on the database
-- clock: the lease intervals the checker measures against. The log row commits with
-- the change, and the row lock of pglock.locks orders a key's entries by id. xact
-- names the transaction: an acquisition that writes its row twice (a placeholder
-- token, then the real one) is one change to everyone else.
CREATE TABLE torture.lease_log (
    id         bigserial PRIMARY KEY,
    key        text NOT NULL,
    owner      text,
    token      bigint NOT NULL,
    expires_at timestamptz NOT NULL,
    at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    xact       bigint NOT NULL DEFAULT txid_current()
);

CREATE FUNCTION torture.log_lease() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO torture.lease_log (key, owner, token, expires_at)
    VALUES (NEW.key, NEW.owner, NEW.fencing_token, NEW.expires_at);
    RETURN NULL;
END
$$;

CREATE TRIGGER torture_lease_insert AFTER INSERT ON pglock.locks
    FOR EACH ROW EXECUTE FUNCTION torture.log_lease();
CREATE TRIGGER torture_lease_update AFTER UPDATE ON pglock.locks
    FOR EACH ROW
    WHEN (OLD.owner IS DISTINCT FROM NEW.owner OR OLD.fencing_token <> NEW.fencing_token
          OR OLD.expires_at <> NEW.expires_at)
    EXECUTE FUNCTION torture.log_lease();

-- The counters: the same K rows in a column-fenced, a lock-fenced and an unfenced
-- table, and the OnOneInstance job's row (key 'tick', value the last tick run).
CREATE TABLE torture.column_fenced (key text PRIMARY KEY, value bigint NOT NULL DEFAULT 0,
    token bigint NOT NULL DEFAULT 0, op text);
CREATE TABLE torture.lock_fenced (LIKE torture.column_fenced INCLUDING ALL);
CREATE TABLE torture.unfenced (LIKE torture.column_fenced INCLUDING ALL);
CREATE TABLE torture.job (LIKE torture.column_fenced INCLUDING ALL);

-- Every write a counter table accepted (a new op), in its own transaction: what the
-- database holds whatever the client heard back. The row lock orders a key's entries.
CREATE TABLE torture.writes (
    id        bigserial PRIMARY KEY,
    tbl       text NOT NULL,
    key       text NOT NULL,
    op        text NOT NULL,
    old_value bigint NOT NULL,
    new_value bigint NOT NULL,
    old_token bigint NOT NULL,
    new_token bigint NOT NULL,
    at        timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE FUNCTION torture.log_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO torture.writes (tbl, key, op, old_value, new_value, old_token, new_token)
    VALUES (TG_TABLE_NAME, NEW.key, NEW.op, OLD.value, NEW.value, OLD.token, NEW.token);
    RETURN NULL;
END
$$;

CREATE TRIGGER torture_write AFTER UPDATE ON torture.column_fenced
    FOR EACH ROW WHEN (NEW.op IS DISTINCT FROM OLD.op) EXECUTE FUNCTION torture.log_write();
CREATE TRIGGER torture_write AFTER UPDATE ON torture.lock_fenced
    FOR EACH ROW WHEN (NEW.op IS DISTINCT FROM OLD.op) EXECUTE FUNCTION torture.log_write();
CREATE TRIGGER torture_write AFTER UPDATE ON torture.unfenced
    FOR EACH ROW WHEN (NEW.op IS DISTINCT FROM OLD.op) EXECUTE FUNCTION torture.log_write();
CREATE TRIGGER torture_write AFTER UPDATE ON torture.job
    FOR EACH ROW WHEN (NEW.op IS DISTINCT FROM OLD.op) EXECUTE FUNCTION torture.log_write();

INSERT INTO torture.job (key) VALUES ('tick');

-- The rows the slotted jobs' runs appended, each fenced by its slot's lock (FenceHeld on
-- an INSERT): what the database accepted, whatever the client heard back.
CREATE TABLE torture.slot_runs (
    id    bigserial PRIMARY KEY,
    job   text NOT NULL,
    slot  timestamptz NOT NULL,
    token bigint NOT NULL,
    op    text NOT NULL,
    at    timestamptz NOT NULL DEFAULT clock_timestamp()
);
