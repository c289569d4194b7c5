-- Schema version 6: the turn journal (docs/reliability.md, "No accepted turn is lost"), shared
-- by every replica: each conversation turn a replica accepted is a row here, committed before
-- the acknowledgement, until its extraction is committed (or an operator drops it). A replica
-- leases the pending rows it works on (`lease_owner` until `lease_until`, renewed by claiming
-- again); the rows of a replica that died are claimed by another once their lease has ended.
--
-- Instants are microseconds since the Unix epoch (the core's `Timestamp`, kept exactly; the
-- claimer's clock decides when a lease has ended, as the port says).

CREATE TABLE turn_journal (
    id               text PRIMARY KEY,
    -- Append order, breaking ties of `accepted_at`.
    seq              bigserial NOT NULL,
    -- The raw user id; NULL for an anonymous host.
    user_id          text,
    agent            text NOT NULL,
    thread_id        text NOT NULL,
    trace_id         text,
    signals          text[] NOT NULL,
    emergency        boolean NOT NULL,
    -- The admitted messages (the core `Message` serde). `json`, not `jsonb`: it keeps the
    -- text as written and accepts every string JSON can carry (`\u0000` included).
    messages         json NOT NULL,
    accepted_at      bigint NOT NULL,
    attempts         integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at  bigint,
    last_error       text,
    state            text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'dead')),
    lease_owner      text,
    lease_until      bigint,
    -- What the item weighs against the journal's byte bound.
    bytes            bigint NOT NULL CHECK (bytes >= 0)
);

CREATE INDEX turn_journal_order ON turn_journal (accepted_at, seq);
CREATE INDEX turn_journal_pending ON turn_journal (accepted_at, seq) WHERE state = 'pending';
CREATE INDEX turn_journal_user ON turn_journal (user_id, accepted_at, seq);
