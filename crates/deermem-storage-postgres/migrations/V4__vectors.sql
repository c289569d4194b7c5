-- Schema version 4: embedding vectors for search by meaning, derived data like the search
-- columns. Each fact (and each retrieval document) records the SHA-256 of its content, the
-- text a vector is made from; a vector is current only while its model id is the embedder's
-- and its digest is the document's. Rows written before this version have no digest yet: the
-- vector index computes it the first time it lists them.
--
-- The values are a plain `real[]` (pgvector is not required): ranking is exact, per scope, in
-- the engine. A vector's row is deleted with its fact or document (the foreign keys cascade),
-- so removing, clearing or replacing facts never leaves a vector behind.

ALTER TABLE facts ADD COLUMN content_digest bytea;
ALTER TABLE search_docs ADD COLUMN content_digest bytea;

-- One vector per stored fact: the storage's search by meaning.
CREATE TABLE fact_vectors (
    bucket     text NOT NULL,
    agent      text NOT NULL,
    fact_id    text NOT NULL,
    model_id   text NOT NULL,
    digest     bytea NOT NULL,
    dimension  integer NOT NULL CHECK (dimension >= 1),
    vec        real[] NOT NULL,
    PRIMARY KEY (bucket, agent, fact_id),
    FOREIGN KEY (bucket, agent, fact_id) REFERENCES facts (bucket, agent, id) ON DELETE CASCADE
);

-- One vector per document of the retrieval port (`search_docs`).
CREATE TABLE doc_vectors (
    scope_user   text NOT NULL,
    scope_agent  text NOT NULL,
    fact_id      text NOT NULL,
    model_id     text NOT NULL,
    digest       bytea NOT NULL,
    dimension    integer NOT NULL CHECK (dimension >= 1),
    vec          real[] NOT NULL,
    PRIMARY KEY (scope_user, scope_agent, fact_id),
    FOREIGN KEY (scope_user, scope_agent, fact_id)
        REFERENCES search_docs (scope_user, scope_agent, fact_id) ON DELETE CASCADE
);
