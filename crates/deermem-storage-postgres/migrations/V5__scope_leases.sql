-- Schema version 5: read leases, so that a replica serves a user's scopes from its cache
-- without a round trip and still never serves a scope older than a write another replica has
-- acknowledged (docs/postgres.md, "Replicas and the cache").
--
-- A replica (a "holder", a random id) that read a user's row holds a lease on the user's
-- bucket until `expires_at` (the database's clock). Every transaction that changes what a
-- leased read serves (the user's row, the bucket's facts) first calls `deermem_fence`: it
-- locks the user's row, deletes the other holders' leases of the bucket, notifies each of
-- them on its channel `deermem_<holder>` (delivered at commit) and returns how long each lease
-- still had to run; the writer acknowledges only once each holder has answered or that time
-- has passed. The triggers below refuse any such change made without the fence.

CREATE TABLE scope_leases (
    bucket      text NOT NULL,
    holder      text NOT NULL,
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (bucket, holder)
);

-- Locks the user's row (which must exist), marks the transaction as fenced for `p_bucket`,
-- revokes the leases of every other holder and notifies each of them with `p_payload`.
-- Returns the revoked holders and the milliseconds their leases had left (0 when expired).
-- Each statement of a VOLATILE function takes a new snapshot, so the DELETE, running after
-- the lock is held, sees every lease granted before it (a grant holds the row `FOR SHARE`
-- until it commits).
CREATE FUNCTION deermem_fence(p_bucket text, p_holder text, p_payload text)
RETURNS TABLE (holder text, remaining_ms double precision)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    r record;
BEGIN
    PERFORM 1 FROM users u WHERE u.bucket = p_bucket FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'deermem_fence: no user row for the bucket';
    END IF;
    PERFORM set_config('deermem.fence', 'b:' || p_bucket, true);
    FOR r IN
        DELETE FROM scope_leases l WHERE l.bucket = p_bucket AND l.holder <> p_holder
        RETURNING l.holder AS h, l.expires_at AS e
    LOOP
        PERFORM pg_notify('deermem_' || r.h, p_payload);
        holder := r.h;
        remaining_ms := greatest(0, extract(epoch FROM (r.e - clock_timestamp())) * 1000);
        RETURN NEXT;
    END LOOP;
END
$$;

-- Refuses a change to what a leased read serves unless the transaction called
-- `deermem_fence` for that bucket. A user row created empty (revision 0, what a commit
-- creates before locking it) serves nothing and needs no fence.
CREATE FUNCTION deermem_fenced() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    fence text := current_setting('deermem.fence', true);
BEGIN
    IF TG_OP = 'INSERT' AND TG_TABLE_NAME = 'users' AND NEW.revision = 0 THEN
        RETURN NEW;
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') AND fence IS DISTINCT FROM 'b:' || OLD.bucket THEN
        RAISE EXCEPTION 'DeerMem: a write to % of bucket % without deermem_fence (replicas'' read leases would not be revoked)',
            TG_TABLE_NAME, OLD.bucket;
    END IF;
    IF TG_OP IN ('UPDATE', 'INSERT') AND fence IS DISTINCT FROM 'b:' || NEW.bucket THEN
        RAISE EXCEPTION 'DeerMem: a write to % of bucket % without deermem_fence (replicas'' read leases would not be revoked)',
            TG_TABLE_NAME, NEW.bucket;
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER users_fenced
    BEFORE INSERT OR DELETE OR UPDATE OF bucket, revision, version, summaries, last_updated
    ON users FOR EACH ROW EXECUTE FUNCTION deermem_fenced();

CREATE TRIGGER facts_fenced
    BEFORE INSERT OR DELETE OR UPDATE OF bucket, agent, id, revision, fact
    ON facts FOR EACH ROW EXECUTE FUNCTION deermem_fenced();
