-- The Honcho and OpenViking capture cursors, when the storage is postgres: one row per cursor,
-- keyed as the file store names them (the space is the backend's folder, `honcho/cursors`, the
-- name the file name, `{hash}.json`), holding the cursor file's bytes.
CREATE TABLE remote_cursors (
    space      text        NOT NULL,
    name       text        NOT NULL,
    body       bytea       NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (space, name)
);
