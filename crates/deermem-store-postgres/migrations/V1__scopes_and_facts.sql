-- DeerMem on PostgreSQL, schema version 1: users with their shared revision and summaries,
-- facts per (user, agent) with a full-text vector, and the per-scope fact metadata.
-- Tables live in the schema named by `backend_config.postgres.schema`; the migration runner
-- sets the search path to it.

CREATE TABLE users (
    -- The user's storage bucket (the same name the file store gives its directory); the empty
    -- string is the legacy single-user root layout.
    bucket        text PRIMARY KEY,
    -- Incremented by exactly 1 by every commit that writes, under the row lock.
    revision      bigint NOT NULL DEFAULT 0 CHECK (revision >= 0),
    version       text NOT NULL DEFAULT '1.0',
    -- The user's summaries in the document shape (user / history sections). `json`, not
    -- `jsonb`: key order is kept, so data moved back to files is byte-identical.
    summaries     json NOT NULL DEFAULT '{}'::json,
    last_updated  text
);

CREATE TABLE facts (
    bucket       text NOT NULL REFERENCES users (bucket) ON DELETE CASCADE,
    agent        text NOT NULL,
    id           text NOT NULL,
    revision     bigint NOT NULL CHECK (revision >= 1),
    -- The fact in its stored document shape (the Markdown front matter and body as JSON), in
    -- `json` so that its key order survives.
    fact         json NOT NULL,
    -- What search matches: content and category, with CJK runs spelled out as bigrams.
    search_text  text NOT NULL DEFAULT '',
    tsv          tsvector GENERATED ALWAYS AS (to_tsvector('simple', search_text)) STORED,
    PRIMARY KEY (bucket, agent, id)
);

CREATE INDEX facts_tsv ON facts USING gin (tsv);

-- Per-scope metadata never part of a fact's revision: the usage heat map and the capacity
-- audit, each one JSON document per (user, agent). `json`, not `jsonb`, like the summaries:
-- the sidecars' key order is kept, so data moved back to files is byte-identical.
CREATE TABLE fact_metadata (
    bucket  text NOT NULL REFERENCES users (bucket) ON DELETE CASCADE,
    agent   text NOT NULL,
    usage   json NOT NULL DEFAULT '{}'::json,
    audit   json NOT NULL DEFAULT '[]'::json,
    PRIMARY KEY (bucket, agent)
);
