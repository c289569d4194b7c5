-- DeerMem on PostgreSQL, schema version 1: users with their shared revision and summaries,
-- facts per (user, agent) with a full-text vector, the per-scope fact metadata, and the
-- search documents of the retrieval port (an index in the database for any storage).
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
    -- The category searches filter on (`context` when the fact has none).
    category     text NOT NULL DEFAULT 'context',
    -- What search matches: the content's words as the FTS5 tokenizer makes them (lower-cased,
    -- diacritics removed), then its CJK runs as bigrams, space separated (the core's shared
    -- text rule), and the number of those tokens (BM25's document length).
    search_text    text NOT NULL DEFAULT '',
    search_tokens  integer NOT NULL DEFAULT 0 CHECK (search_tokens >= 0),
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

-- The retrieval port's documents: one fact per (scope, id), indexed like `facts`. The scope is
-- kept as JSON text (`null` for the legacy no-user layout, else the quoted raw user id; the
-- agent likewise), so user ids that share a storage bucket stay apart.
CREATE TABLE search_docs (
    scope_user     text NOT NULL,
    scope_agent    text NOT NULL,
    fact_id        text NOT NULL,
    revision       bigint,
    -- The fact in its internal JSON shape, with its scope.
    fact           json NOT NULL,
    category       text NOT NULL,
    search_text    text NOT NULL,
    search_tokens  integer NOT NULL CHECK (search_tokens >= 0),
    tsv            tsvector GENERATED ALWAYS AS (to_tsvector('simple', search_text)) STORED,
    PRIMARY KEY (scope_user, scope_agent, fact_id)
);

CREATE INDEX search_docs_tsv ON search_docs USING gin (tsv);
