-- lock_acquire, lock_renew and lock_release in PL/pgSQL. PostgreSQL cannot inline a
-- LANGUAGE sql function that writes and plans its body again on every call; PL/pgSQL
-- keeps its plans for the session. Measured here (BENCHMARKS.md): acquire+release went
-- from 1.60x to 1.08x of two durable single-row UPDATEs, a losing acquire from 3.4x to
-- 1.5x of SELECT 1, and 32 callers racing for one key from 6 to 53 acquisitions a second.

-- lock_acquire takes key for owner for ttl_ms milliseconds and returns the new fencing
-- token, or null when the key is held. Of any number of concurrent callers exactly one
-- wins: the one that row-locks the free row, or, for a key without a row, the one whose
-- INSERT lands. A caller that finds the row held, or locked by anyone (an acquire, a
-- renewal or a release in flight, a fenced write's FOR SHARE), loses at once, without
-- waiting and without writing: no row lock, no transaction id, no WAL. The token is
-- drawn after the row lock, with the row's own token as its floor, so it is greater
-- than every token the key had even if the sequence went back.
CREATE OR REPLACE FUNCTION pglock.lock_acquire(key text, owner text, ttl_ms bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE STRICT AS $$
DECLARE
    token bigint;
BEGIN
    IF lock_acquire.ttl_ms <= 0 THEN
        RETURN NULL;
    END IF;
    PERFORM FROM pglock.locks l
    WHERE l.key = lock_acquire.key AND (l.owner IS NULL OR l.expires_at <= clock_timestamp())
    FOR UPDATE SKIP LOCKED;
    IF FOUND THEN
        UPDATE pglock.locks l
        SET owner = lock_acquire.owner,
            fencing_token = greatest(nextval('pglock.fencing_token_seq'), l.fencing_token + 1),
            expires_at = clock_timestamp() + lock_acquire.ttl_ms * interval '1 millisecond'
        WHERE l.key = lock_acquire.key
        RETURNING l.fencing_token INTO token;
        RETURN token;
    END IF;
    IF EXISTS (SELECT FROM pglock.locks l WHERE l.key = lock_acquire.key) THEN
        RETURN NULL;
    END IF;
    INSERT INTO pglock.locks AS l (key, owner, fencing_token, expires_at)
    VALUES (lock_acquire.key, lock_acquire.owner, nextval('pglock.fencing_token_seq'),
            clock_timestamp() + lock_acquire.ttl_ms * interval '1 millisecond')
    ON CONFLICT ON CONSTRAINT locks_pkey DO NOTHING
    RETURNING l.fencing_token INTO token;
    RETURN token;
END $$;

-- lock_renew moves the expiry of key to ttl_ms from now if owner still holds it live.
-- Never an upsert: a renewal cannot re-create a lock that was lost.
CREATE OR REPLACE FUNCTION pglock.lock_renew(key text, owner text, ttl_ms bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT AS $$
BEGIN
    UPDATE pglock.locks l
    SET expires_at = clock_timestamp() + lock_renew.ttl_ms * interval '1 millisecond'
    WHERE l.key = lock_renew.key AND l.owner = lock_renew.owner
      AND l.expires_at > clock_timestamp() AND lock_renew.ttl_ms > 0;
    RETURN FOUND;
END $$;

-- lock_release clears the owner of key if owner still holds it live; the row stays. A
-- row a waiter marked is unmarked and notified, from the SET, where l.wanted_at reads
-- the row version the UPDATE locked (see 000003).
CREATE OR REPLACE FUNCTION pglock.lock_release(key text, owner text) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT AS $$
BEGIN
    UPDATE pglock.locks l
    SET owner = NULL,
        wanted_at = CASE WHEN l.wanted_at IS NOT NULL THEN
            (SELECT NULL::timestamptz FROM pg_notify('pglock_released', l.key)) END
    WHERE l.key = lock_release.key AND l.owner = lock_release.owner
      AND l.expires_at > clock_timestamp();
    RETURN FOUND;
END $$;
