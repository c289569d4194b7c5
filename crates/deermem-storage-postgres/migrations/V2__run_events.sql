-- Schema version 2: the run journal (which memory block each run of a thread saw), shared by
-- every replica so that "once per run" holds across them.

CREATE TABLE run_events (
    -- The user's storage bucket: one user's events are never read for another.
    bucket      text NOT NULL,
    -- Increasing from 1 per user, never reused (allocated from run_event_counters).
    seq         bigint NOT NULL CHECK (seq >= 1),
    thread_id   text NOT NULL,
    run_id      text NOT NULL,
    event_type  text NOT NULL,
    category    text NOT NULL,
    content     jsonb NOT NULL,
    metadata    jsonb NOT NULL,
    created_at  text NOT NULL,
    PRIMARY KEY (bucket, seq)
);

-- At most one memory block per run.
CREATE UNIQUE INDEX run_events_one_context ON run_events (bucket, thread_id, run_id)
    WHERE event_type = 'context:memory';
CREATE INDEX run_events_by_run ON run_events (bucket, thread_id, run_id, seq);

CREATE TABLE run_event_counters (
    bucket    text PRIMARY KEY,
    last_seq  bigint NOT NULL CHECK (last_seq >= 1)
);
