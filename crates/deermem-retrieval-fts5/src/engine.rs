//! The synchronous SQLite side of the adapter: schema, row encoding, writes in one transaction
//! each, and the per-scope BM25 search. Everything here runs on a blocking thread.
//!
//! # Schema (version [`SCHEMA_VERSION`])
//! - `meta(key, value)`: `schema_version`.
//! - `scopes(scope_key, scope_user, scope_agent, next_seq)`: one row per indexed scope. The user
//!   and agent are JSON-encoded like the reference's `scope_user`/`scope_agent` (`"alice"` with
//!   the quotes, or `null`), so no user id can collide with the legacy no-user scope.
//! - `docs(id, scope_key, fact_id, category, created_us, confidence, fact_json, digest, script)`:
//!   one row per indexed fact; `id` is also the FTS rowid, `(scope_key << 32) | seq`, so each scope owns one
//!   contiguous rowid range and a search reads only its scope's part of every doclist.
//! - `fts_0` ... `fts_127` (`fts(content, cjk)` each): contentless FTS5 tables (`unicode61`, like
//!   the reference) holding the fact text without its CJK runs in `content` and the runs'
//!   bigrams in `cjk`. A scope's documents live in shard `scope_key % 128`, created with the
//!   first scope that needs it. BM25's IDF is
//!   computed by FTS5 over the whole table on every query, a scan of every posting of every
//!   query term; sharding keeps that scan (and the term statistics) to a few tenants.
//! - `docs.digest`: the SHA-256 of the fact's content, the text its vector is made from.
//! - `docs.script`: the content's script group (`cjk` or `other`,
//!   `deermem_core::policy::language::script_group`), a field derived from the text like the
//!   FTS columns: written with the document (so a rebuild fills it) and read with the vectors,
//!   so the ranking by meaning calibrates by it without looking at the text again. Version 3
//!   added it; a file of version 2 is dropped and rebuilt like any older schema.
//! - `scope_gen(scope_key, gen)`: a scope's write stamp, a random number that triggers on
//!   `docs` and `vectors` replace on every write to the scope, from any process. The decoded
//!   vectors a search keeps in memory (`vector_cache`) are used only while the stamp they were
//!   read at is current. Added to version 3 files in place (`CREATE ... IF NOT EXISTS`, and a
//!   stamp for every scope already there), so the vectors survive.
//! - `vectors(scope_user, scope_agent, fact_id, model_id, digest, dim, vec)`: at most one
//!   embedding per document (the `VectorIndex` port), keyed like the scopes by the stored user
//!   and agent texts so it survives a rebuild that re-inserts the same text; `vec` is `dim`
//!   little-endian `f32`s. A vector is current when its model id is the embedder's and its
//!   digest the document's; anything else (another model, a changed text, a blob of the wrong
//!   length or with a non-finite number) counts as missing.

use std::collections::{HashMap, HashSet};

use deermem_core::fact::{FactDraft, NormalizeContext, normalize_fact};
use deermem_core::policy::language::{ScriptGroup, script_group};
use deermem_core::policy::text::rank;
use deermem_core::{
    AgentName, Fact, FactId, FactScope, MatchType, RetrievalError, Scope, Timestamp, UserId,
};
use rusqlite::{Connection, ErrorCode, OptionalExtension, TransactionBehavior, params};
use serde_json::{Map, Value};

use crate::cjk;

/// The schema version recorded in `meta`; a file with another version is rebuilt from empty.
pub const SCHEMA_VERSION: &str = "3";

/// Largest scope key: keys above it would make rowids negative.
const MAX_SCOPE_KEY: i64 = (1 << 31) - 1;
/// Largest per-scope sequence number (the low 32 bits of a rowid).
const MAX_SEQ: i64 = (1 << 32) - 1;

/// Number of FTS5 shard tables.
pub(crate) const SHARDS: i64 = 128;

/// The FTS5 table holding a document (or a scope key's documents).
pub(crate) fn shard_of_key(key: i64) -> i64 {
    key.rem_euclid(SHARDS)
}

fn shard_of_doc(id: i64) -> i64 {
    shard_of_key(id >> 32)
}

/// The statement creating one shard table (shards are created with their first scope).
fn create_shard_sql(shard: i64) -> String {
    format!(
        "CREATE VIRTUAL TABLE IF NOT EXISTS fts_{shard} USING fts5(\
         content, cjk, content='', contentless_delete=1, tokenize='unicode61');"
    )
}

/// The shard tables that exist.
fn existing_shards(conn: &Connection) -> rusqlite::Result<Vec<i64>> {
    let mut stmt = conn.prepare_cached(
        "SELECT name FROM sqlite_master WHERE type='table' AND name GLOB 'fts_[0-9]*' \
         AND sql LIKE 'CREATE VIRTUAL TABLE%'",
    )?;
    let names = stmt
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(names
        .iter()
        .filter_map(|n| n.strip_prefix("fts_").and_then(|d| d.parse().ok()))
        .collect())
}

/// Merges the segments of each shard a rebuild refilled (all of them after a full rebuild)
/// into one, FTS5's `optimize`, each shard in its own transaction after the rebuild's commit.
///
/// A bulk load leaves a shard in several segments, and a search seeks every query term in
/// every segment: at 1,000,000 facts that made the term seeks most of a search's time. The
/// merge rewrites a shard (about 6 MiB at that size; all shards took 3.7 s). It changes no
/// document, so a failure is only logged: the index stays as the rebuild committed it.
pub(crate) fn merge_segments(conn: &Connection, scopes: Option<&[ScopeKeyText]>) {
    let shards = existing_shards(conn).and_then(|existing| match scopes {
        None => Ok(existing),
        Some(keys) => {
            let mut wanted = Vec::new();
            for k in keys {
                if let Some(key) = scope_key(conn, k)? {
                    let shard = shard_of_key(key);
                    if existing.contains(&shard) && !wanted.contains(&shard) {
                        wanted.push(shard);
                    }
                }
            }
            Ok(wanted)
        }
    });
    let shards = match shards {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list the FTS5 shards to merge their segments");
            return;
        }
    };
    for shard in shards {
        let sql = format!("INSERT INTO fts_{shard}(fts_{shard}) VALUES('optimize');");
        if let Err(e) = conn.execute_batch(&sql) {
            tracing::warn!(shard, error = %e, "cannot merge an FTS5 shard's segments");
        }
    }
}

/// Drops every table of ours, whatever shard count the old schema used.
fn drop_sql(conn: &Connection) -> rusqlite::Result<String> {
    let mut sql = String::from("DROP TABLE IF EXISTS fts;\n");
    for i in existing_shards(conn)? {
        sql.push_str(&format!("DROP TABLE IF EXISTS fts_{i};\n"));
    }
    sql.push_str(DROP_SQL);
    Ok(sql)
}

const CREATE_SQL: &str = "
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS scopes(
    scope_key INTEGER PRIMARY KEY,
    scope_user TEXT NOT NULL,
    scope_agent TEXT NOT NULL,
    next_seq INTEGER NOT NULL,
    UNIQUE(scope_user, scope_agent)
);
CREATE TABLE IF NOT EXISTS docs(
    id INTEGER PRIMARY KEY,
    scope_key INTEGER NOT NULL,
    fact_id TEXT NOT NULL,
    category TEXT NOT NULL,
    created_us INTEGER,
    confidence REAL NOT NULL,
    fact_json TEXT NOT NULL,
    digest BLOB NOT NULL,
    script TEXT NOT NULL,
    UNIQUE(scope_key, fact_id)
);
CREATE TABLE IF NOT EXISTS vectors(
    scope_user TEXT NOT NULL,
    scope_agent TEXT NOT NULL,
    fact_id TEXT NOT NULL,
    model_id TEXT NOT NULL,
    digest BLOB NOT NULL,
    dim INTEGER NOT NULL,
    vec BLOB NOT NULL,
    PRIMARY KEY(scope_user, scope_agent, fact_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS scope_gen(scope_key INTEGER PRIMARY KEY, gen INTEGER NOT NULL);
CREATE TRIGGER IF NOT EXISTS docs_gen_insert AFTER INSERT ON docs BEGIN
    INSERT OR REPLACE INTO scope_gen VALUES(NEW.scope_key, random()); END;
CREATE TRIGGER IF NOT EXISTS docs_gen_delete AFTER DELETE ON docs BEGIN
    INSERT OR REPLACE INTO scope_gen VALUES(OLD.scope_key, random()); END;
CREATE TRIGGER IF NOT EXISTS docs_gen_update AFTER UPDATE ON docs BEGIN
    INSERT OR REPLACE INTO scope_gen VALUES(OLD.scope_key, random());
    INSERT OR REPLACE INTO scope_gen VALUES(NEW.scope_key, random()); END;
CREATE TRIGGER IF NOT EXISTS vectors_gen_insert AFTER INSERT ON vectors BEGIN
    INSERT OR REPLACE INTO scope_gen SELECT scope_key, random() FROM scopes
    WHERE scope_user = NEW.scope_user AND scope_agent = NEW.scope_agent; END;
CREATE TRIGGER IF NOT EXISTS vectors_gen_delete AFTER DELETE ON vectors BEGIN
    INSERT OR REPLACE INTO scope_gen SELECT scope_key, random() FROM scopes
    WHERE scope_user = OLD.scope_user AND scope_agent = OLD.scope_agent; END;
CREATE TRIGGER IF NOT EXISTS vectors_gen_update AFTER UPDATE ON vectors BEGIN
    INSERT OR REPLACE INTO scope_gen SELECT scope_key, random() FROM scopes
    WHERE scope_user = OLD.scope_user AND scope_agent = OLD.scope_agent;
    INSERT OR REPLACE INTO scope_gen SELECT scope_key, random() FROM scopes
    WHERE scope_user = NEW.scope_user AND scope_agent = NEW.scope_agent; END;
INSERT OR IGNORE INTO scope_gen SELECT scope_key, random() FROM scopes;
";

const DROP_SQL: &str = "
DROP TABLE IF EXISTS scope_gen;
DROP TABLE IF EXISTS vectors;
DROP TABLE IF EXISTS docs;
DROP TABLE IF EXISTS scopes;
DROP TABLE IF EXISTS meta;
";

/// How a SQLite failure should be reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FailureKind {
    /// The MATCH expression (or another statement) is not valid: a query problem.
    Syntax,
    /// The file is corrupt or not a database: the index must be recreated.
    Corrupt,
    /// The file cannot be read or written now (I/O, locks, permissions, disk full).
    Unavailable,
    /// Anything else.
    Other,
}

/// Classifies a rusqlite error.
pub(crate) fn classify(e: &rusqlite::Error) -> FailureKind {
    match e {
        rusqlite::Error::SqliteFailure(f, _) => match f.code {
            ErrorCode::Unknown => FailureKind::Syntax,
            ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase => FailureKind::Corrupt,
            ErrorCode::CannotOpen
            | ErrorCode::ReadOnly
            | ErrorCode::DiskFull
            | ErrorCode::SystemIoFailure
            | ErrorCode::DatabaseBusy
            | ErrorCode::DatabaseLocked
            | ErrorCode::PermissionDenied
            | ErrorCode::FileLockingProtocolFailed
            | ErrorCode::OutOfMemory => FailureKind::Unavailable,
            _ => FailureKind::Other,
        },
        _ => FailureKind::Other,
    }
}

/// Maps a rusqlite error to the port's error.
pub(crate) fn to_retrieval_error(e: &rusqlite::Error) -> RetrievalError {
    match classify(e) {
        FailureKind::Corrupt | FailureKind::Unavailable => {
            RetrievalError::Unavailable(format!("sqlite: {e}"))
        }
        FailureKind::Syntax | FailureKind::Other => RetrievalError::Backend(format!("sqlite: {e}")),
    }
}

/// SQLite's page cache of each connection, in bytes.
pub const PAGE_CACHE_BYTES: u64 = 8 * 1024 * 1024;
/// The page size of a new index file, in bytes (see [`configure`]).
pub(crate) const PAGE_SIZE: u32 = 16 * 1024;
/// The memory-mapped window of each connection, in bytes.
pub const MMAP_BYTES: u64 = 16 * 1024 * 1024;

/// Applies the connection settings: busy timeout, statement cache, and for the writer WAL.
pub(crate) fn configure(conn: &Connection, writer: bool, busy_ms: u64) -> rusqlite::Result<()> {
    conn.busy_timeout(std::time::Duration::from_millis(busy_ms))?;
    conn.set_prepared_statement_cache_capacity(256);
    crate::tf::register(conn)?;
    // Searches touch postings all over the file: a page cache and memory-mapped reads avoid a
    // read syscall and a copy per page. Both are bounded per connection (and the pool keeps at
    // most `max_idle_readers` readers besides the writer), so the memory the index takes in a
    // serving process is bounded whatever the size of the file: mapped pages count in the
    // process's RSS, and a window as large as a big index would grow with the store.
    conn.execute_batch(&format!(
        "PRAGMA cache_size=-{}; PRAGMA mmap_size={};",
        PAGE_CACHE_BYTES / 1024,
        MMAP_BYTES
    ))?;
    // Keep one plan per statement: otherwise every new MATCH text re-prepares the search.
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    if writer {
        // Takes effect only on a new file, before WAL mode is set (an existing file keeps its
        // page size). A vector row (a 384-dimension vector is 1,536 bytes) is stored in a
        // WITHOUT ROWID b-tree, whose cells keep about 1,000 bytes locally on a 4 KiB page: the
        // rest went to an overflow page of its own, so ranking a scope read one page per fact.
        // On 16 KiB pages a row of up to about 4,000 bytes (1,000 dimensions) stays in its
        // leaf, beside the rest of its scope.
        conn.execute_batch(&format!("PRAGMA page_size={PAGE_SIZE};"))?;
        // In-memory databases answer "memory"; either answer is fine.
        let _mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
        // Derived data: NORMAL is durable enough in WAL mode, and the WAL is trimmed after
        // checkpoints so a bulk rebuild does not leave a WAL as large as the index.
        conn.execute_batch("PRAGMA synchronous=NORMAL; PRAGMA journal_size_limit=8388608;")?;
    } else {
        conn.execute_batch("PRAGMA query_only=1;")?;
    }
    Ok(())
}

/// Creates the schema, or replaces every table of an incompatible (older or foreign) version.
/// Returns whether an old schema was dropped.
pub(crate) fn init_schema(conn: &Connection) -> rusqlite::Result<bool> {
    let has_meta: bool = conn.query_row(
        "SELECT EXISTS(SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta')",
        [],
        |r| r.get(0),
    )?;
    let has_any: bool = conn.query_row(
        "SELECT EXISTS(SELECT 1 FROM sqlite_master WHERE type='table' AND \
         (name IN ('docs','scopes','meta','vectors') OR name GLOB 'fts_[0-9]*' OR name = 'fts'))",
        [],
        |r| r.get(0),
    )?;
    let version: Option<String> = if has_meta {
        conn.query_row(
            "SELECT value FROM meta WHERE key='schema_version'",
            [],
            |r| r.get(0),
        )
        .optional()?
    } else {
        None
    };
    let dropped = has_any && version.as_deref() != Some(SCHEMA_VERSION);
    let mut sql = String::from("BEGIN IMMEDIATE;");
    if dropped {
        sql.push_str(&drop_sql(conn)?);
    }
    sql.push_str(CREATE_SQL);
    sql.push_str("INSERT OR REPLACE INTO meta(key, value) VALUES('schema_version', '");
    sql.push_str(SCHEMA_VERSION);
    sql.push_str("'); COMMIT;");
    if let Err(e) = conn.execute_batch(&sql) {
        let _ = conn.execute_batch("ROLLBACK;");
        return Err(e);
    }
    // Touch every table so that a damaged file fails here, at open, rather than later.
    conn.query_row(
        "SELECT (SELECT count(*) FROM scopes) + (SELECT count(*) FROM meta) \
         + (SELECT count(*) FROM vectors)",
        [],
        |r| r.get::<_, i64>(0),
    )?;
    for i in existing_shards(conn)? {
        conn.query_row(&format!("SELECT count(*) FROM fts_{i}_data"), [], |r| {
            r.get::<_, i64>(0)
        })?;
    }
    Ok(dropped)
}

/// A scope as stored: the JSON-encoded raw user id and agent name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ScopeKeyText {
    /// `"alice"` (JSON string) or `null`.
    pub(crate) user: String,
    /// `"coder"` (JSON string) or `null`.
    pub(crate) agent: String,
}

fn json_text(v: Option<&str>) -> String {
    match v {
        Some(s) => Value::String(s.to_owned()).to_string(),
        None => "null".to_owned(),
    }
}

impl ScopeKeyText {
    /// The stored form of a scope.
    pub(crate) fn of(scope: &Scope) -> Self {
        Self {
            user: json_text(scope.user.as_ref().map(|u| u.as_str())),
            agent: json_text(scope.agent.as_ref().map(|a| a.as_str())),
        }
    }
}

/// One fact ready to be written.
#[derive(Clone, Debug)]
pub(crate) struct Row {
    /// The stored scope.
    pub(crate) scope: ScopeKeyText,
    /// The fact id.
    pub(crate) fact_id: String,
    /// `category or "context"`.
    pub(crate) category: String,
    /// `createdAt` in microseconds, when aware and parseable.
    pub(crate) created_us: Option<i64>,
    /// The confidence as the score reads it.
    pub(crate) confidence: f64,
    /// The fact as JSON, with its scope set to the indexing scope.
    pub(crate) fact_json: String,
    /// The `content` column.
    pub(crate) body: String,
    /// The `cjk` column.
    pub(crate) grams: String,
    /// [`text_digest`] of the content.
    pub(crate) digest: [u8; 32],
    /// The content's script group (the `script` column).
    pub(crate) script: ScriptGroup,
}

/// The SHA-256 of a text a vector is made from.
pub(crate) fn text_digest(text: &str) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(text.as_bytes()).into()
}

/// A vector as stored: `dim` little-endian `f32`s.
pub(crate) fn encode_vector(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A stored vector, or `None` when the blob is not `dim` finite `f32`s.
pub(crate) fn decode_vector(blob: &[u8], dim: i64) -> Option<Vec<f32>> {
    let dim = usize::try_from(dim).ok().filter(|d| *d > 0)?;
    if blob.len() != dim.checked_mul(4)? {
        return None;
    }
    let v: Vec<f32> = blob
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    v.iter().all(|x| x.is_finite()).then_some(v)
}

/// Appends a stored vector to `out`: `false`, with `out` unchanged, when the blob is not `dim`
/// finite `f32`s.
pub(crate) fn decode_vector_into(blob: &[u8], dim: i64, out: &mut Vec<f32>) -> bool {
    let Some(dim) = usize::try_from(dim).ok().filter(|d| *d > 0) else {
        return false;
    };
    if Some(blob.len()) != dim.checked_mul(4) {
        return false;
    }
    let start = out.len();
    out.extend(
        blob.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
    );
    if out[start..].iter().all(|x| x.is_finite()) {
        true
    } else {
        out.truncate(start);
        false
    }
}

/// A document's content, for a row whose script tag is missing.
pub(crate) fn doc_content(conn: &Connection, id: i64) -> rusqlite::Result<String> {
    conn.prepare_cached(
        "SELECT coalesce(json_extract(fact_json, '$.content'), '') FROM docs WHERE id = ?1",
    )?
    .query_row(params![id], |r| r.get(0))
}

/// Encodes a fact for indexing under `scope`.
///
/// # Errors
/// `InvalidInput` when the scope has no agent (facts always live in an agent bucket).
pub(crate) fn encode_row(scope: &Scope, fact: &Fact) -> Result<Row, RetrievalError> {
    let map = deermem_core::search::index_document(scope, fact)?;
    let fact_json = serde_json::to_string(&map)
        .map_err(|e| RetrievalError::InvalidInput(format!("fact cannot be encoded: {e}")))?;
    let (body, grams) = cjk::index_columns(&fact.content);
    Ok(Row {
        scope: ScopeKeyText::of(scope),
        fact_id: fact.id.as_str().to_owned(),
        category: fact.category_or_default().to_owned(),
        created_us: rank::created_micros(&fact.created_at),
        confidence: rank::index_confidence(fact),
        fact_json,
        body,
        grams,
        digest: text_digest(&fact.content),
        script: script_group(&fact.content),
    })
}

/// Why an index row does not decode.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DecodeError {
    /// `fact_json` is not a JSON object.
    #[error("invalid fact_json: {0}")]
    Json(#[from] serde_json::Error),
    /// The stored fact id is not an id.
    #[error("invalid stored fact id: {0}")]
    FactId(deermem_core::IdError),
    /// The JSON is not a valid fact.
    #[error("invalid fact: {0}")]
    Fact(#[from] deermem_core::FactError),
    /// A scope key text is neither a JSON string nor null.
    #[error("unexpected {0}")]
    ScopeText(Value),
    /// A scope key holds an invalid user id or agent name.
    #[error("{0}")]
    ScopeId(deermem_core::IdError),
}

/// Decodes a stored fact, re-normalising it through core under the indexing scope.
///
/// # Errors
/// [`DecodeError`] saying why the stored JSON is not a valid fact.
pub(crate) fn decode_fact(
    fact_id: &str,
    fact_json: &str,
    scope: &FactScope,
    now: Timestamp,
) -> Result<Fact, DecodeError> {
    let map: Map<String, Value> = serde_json::from_str(fact_json)?;
    let fallback = FactId::new(fact_id).map_err(DecodeError::FactId)?;
    let new_id = move || fallback.clone();
    let ctx = NormalizeContext {
        scope,
        existing: None,
        now,
        new_id: &new_id,
    };
    Ok(normalize_fact(&FactDraft::from_json(map)?, &ctx)?)
}

/// The rowid range `[lo, hi]` of a scope key.
pub(crate) fn scope_range(key: i64) -> (i64, i64) {
    (key << 32, (key << 32) | MAX_SEQ)
}

/// Looks up a scope's key.
pub(crate) fn scope_key(conn: &Connection, scope: &ScopeKeyText) -> rusqlite::Result<Option<i64>> {
    conn.prepare_cached("SELECT scope_key FROM scopes WHERE scope_user=?1 AND scope_agent=?2")?
        .query_row(params![scope.user, scope.agent], |r| r.get(0))
        .optional()
}

/// The key of a scope and its write stamp (`scope_gen`: random, replaced by triggers on every
/// write to the scope's documents or vectors; `None` before the first such write), if indexed.
pub(crate) fn scope_key_stamp(
    conn: &Connection,
    scope: &ScopeKeyText,
) -> rusqlite::Result<Option<(i64, Option<i64>)>> {
    conn.prepare_cached(
        "SELECT s.scope_key, g.gen FROM scopes s LEFT JOIN scope_gen g ON g.scope_key = s.scope_key \
         WHERE s.scope_user=?1 AND s.scope_agent=?2",
    )?
    .query_row(params![scope.user, scope.agent], |r| Ok((r.get(0)?, r.get(1)?)))
    .optional()
}

/// A writer inside one transaction: caches scope keys and sequence numbers, and writes them
/// back at [`Writer::finish`].
pub(crate) struct Writer<'c> {
    tx: rusqlite::Transaction<'c>,
    scopes: HashMap<ScopeKeyText, (i64, i64)>,
    /// Every scope was emptied in this transaction.
    all_fresh: bool,
    /// Scopes emptied in this transaction: their documents are all in `written`.
    fresh: HashSet<ScopeKeyText>,
    /// Documents written in this transaction to fresh scopes, by `(scope key, fact id)`.
    written: HashMap<(i64, String), i64>,
}

/// A write error: a database failure, or a limit of the rowid layout.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WriteError {
    /// SQLite failed.
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
    /// A limit was reached (too many scopes, sequence exhausted).
    #[error("{0}")]
    Limit(String),
}

impl<'c> Writer<'c> {
    /// Starts an immediate (write-locking) transaction.
    pub(crate) fn begin(conn: &'c mut Connection) -> rusqlite::Result<Self> {
        Ok(Self {
            tx: conn.transaction_with_behavior(TransactionBehavior::Immediate)?,
            scopes: HashMap::new(),
            all_fresh: false,
            fresh: HashSet::new(),
            written: HashMap::new(),
        })
    }

    fn scope_entry(
        &mut self,
        scope: &ScopeKeyText,
        create: bool,
    ) -> Result<Option<i64>, WriteError> {
        if let Some((key, _)) = self.scopes.get(scope) {
            return Ok(Some(*key));
        }
        let found: Option<(i64, i64)> = self
            .tx
            .prepare_cached(
                "SELECT scope_key, next_seq FROM scopes WHERE scope_user=?1 AND scope_agent=?2",
            )?
            .query_row(params![scope.user, scope.agent], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()?;
        let entry = match found {
            Some(e) => e,
            None if create => {
                self.tx
                    .prepare_cached(
                        "INSERT INTO scopes(scope_user, scope_agent, next_seq) VALUES(?1, ?2, 1)",
                    )?
                    .execute(params![scope.user, scope.agent])?;
                let key = self.tx.last_insert_rowid();
                if !(1..=MAX_SCOPE_KEY).contains(&key) {
                    return Err(WriteError::Limit(format!(
                        "scope key {key} is outside the index's rowid layout"
                    )));
                }
                self.tx
                    .execute_batch(&create_shard_sql(shard_of_key(key)))?;
                (key, 1)
            }
            None => return Ok(None),
        };
        self.scopes.insert(scope.clone(), entry);
        Ok(Some(entry.0))
    }

    fn delete_doc(&mut self, id: i64) -> rusqlite::Result<()> {
        self.tx
            .prepare_cached(&format!(
                "DELETE FROM fts_{} WHERE rowid=?1",
                shard_of_doc(id)
            ))?
            .execute([id])?;
        self.tx
            .prepare_cached("DELETE FROM docs WHERE id=?1")?
            .execute([id])?;
        Ok(())
    }

    /// Inserts or replaces one document.
    pub(crate) fn upsert(&mut self, row: &Row) -> Result<(), WriteError> {
        let key = self
            .scope_entry(&row.scope, true)?
            .ok_or_else(|| WriteError::Limit("scope could not be created".into()))?;
        let fresh = self.all_fresh || self.fresh.contains(&row.scope);
        let old: Option<i64> = if fresh {
            // Emptied in this transaction: only this transaction's writes can collide.
            self.written.get(&(key, row.fact_id.clone())).copied()
        } else {
            self.tx
                .prepare_cached("SELECT id FROM docs WHERE scope_key=?1 AND fact_id=?2")?
                .query_row(params![key, row.fact_id], |r| r.get(0))
                .optional()?
        };
        if let Some(old) = old {
            self.delete_doc(old)?;
        }
        let seq = {
            let entry = self
                .scopes
                .get_mut(&row.scope)
                .ok_or_else(|| WriteError::Limit("scope cache lost its entry".into()))?;
            let seq = entry.1;
            if seq > MAX_SEQ {
                return Err(WriteError::Limit(format!(
                    "scope {}|{} used all {MAX_SEQ} sequence numbers; rebuild it",
                    row.scope.user, row.scope.agent
                )));
            }
            entry.1 += 1;
            seq
        };
        let id = (key << 32) | seq;
        self.tx
            .prepare_cached(
                "INSERT INTO docs(id, scope_key, fact_id, category, created_us, confidence, \
                 fact_json, digest, script) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            )?
            .execute(params![
                id,
                key,
                row.fact_id,
                row.category,
                row.created_us,
                row.confidence,
                row.fact_json,
                &row.digest[..],
                row.script.as_str()
            ])?;
        self.tx
            .prepare_cached(&format!(
                "INSERT INTO fts_{}(rowid, content, cjk) VALUES(?1, ?2, ?3)",
                shard_of_key(key)
            ))?
            .execute(params![id, row.body, row.grams])?;
        if fresh {
            self.written.insert((key, row.fact_id.clone()), id);
        }
        Ok(())
    }

    /// Removes one document; absent documents are a no-op.
    pub(crate) fn remove(&mut self, scope: &ScopeKeyText, fact_id: &str) -> Result<(), WriteError> {
        let Some(key) = self.scope_entry(scope, false)? else {
            return Ok(());
        };
        let old: Option<i64> = self
            .tx
            .prepare_cached("SELECT id FROM docs WHERE scope_key=?1 AND fact_id=?2")?
            .query_row(params![key, fact_id], |r| r.get(0))
            .optional()?;
        if let Some(old) = old {
            self.delete_doc(old)?;
        }
        self.drop_vector(scope, fact_id)
    }

    /// Deletes every document of one scope and forgets the scope; its vectors too unless
    /// `keep_vectors` (a rebuild, which drops the orphans at the end with
    /// [`Writer::drop_orphan_vectors`]).
    pub(crate) fn clear_scope(
        &mut self,
        scope: &ScopeKeyText,
        keep_vectors: bool,
    ) -> Result<(), WriteError> {
        if !keep_vectors {
            self.tx
                .prepare_cached("DELETE FROM vectors WHERE scope_user=?1 AND scope_agent=?2")?
                .execute(params![scope.user, scope.agent])?;
        }
        let Some(key) = self.scope_entry(scope, false)? else {
            self.fresh.insert(scope.clone());
            return Ok(());
        };
        let (lo, hi) = scope_range(key);
        let ids: Vec<i64> = self
            .tx
            .prepare_cached("SELECT id FROM docs WHERE id BETWEEN ?1 AND ?2")?
            .query_map([lo, hi], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        for id in ids {
            self.delete_doc(id)?;
        }
        self.tx
            .prepare_cached("DELETE FROM scopes WHERE scope_key=?1")?
            .execute([key])?;
        self.scopes.remove(scope);
        self.fresh.insert(scope.clone());
        Ok(())
    }

    /// [`Writer::clear_all`] for `None`, else [`Writer::clear_scope`] of each scope.
    pub(crate) fn clear(
        &mut self,
        scopes: Option<&[ScopeKeyText]>,
        keep_vectors: bool,
    ) -> Result<(), WriteError> {
        match scopes {
            None => self.clear_all(keep_vectors),
            Some(list) => list
                .iter()
                .try_for_each(|s| self.clear_scope(s, keep_vectors)),
        }
    }

    /// Deletes every document of every scope; every vector too unless `keep_vectors` (see
    /// [`Writer::clear_scope`]).
    pub(crate) fn clear_all(&mut self, keep_vectors: bool) -> Result<(), WriteError> {
        let mut sql = String::from("DELETE FROM docs; DELETE FROM scopes;");
        if !keep_vectors {
            sql.push_str("DELETE FROM vectors;");
        }
        for i in existing_shards(&self.tx)? {
            sql.push_str(&format!(
                "INSERT INTO fts_{i}(fts_{i}) VALUES('delete-all');"
            ));
        }
        self.tx.execute_batch(&sql)?;
        self.scopes.clear();
        self.all_fresh = true;
        self.written.clear();
        Ok(())
    }

    /// Deletes the vectors of `scopes` (every scope when `None`) whose document is gone.
    pub(crate) fn drop_orphan_vectors(
        &mut self,
        scopes: Option<&[ScopeKeyText]>,
    ) -> Result<(), WriteError> {
        const ORPHAN: &str = "NOT EXISTS(SELECT 1 FROM scopes s JOIN docs d \
             ON d.scope_key = s.scope_key WHERE s.scope_user = vectors.scope_user \
             AND s.scope_agent = vectors.scope_agent AND d.fact_id = vectors.fact_id)";
        match scopes {
            None => {
                self.tx
                    .execute(&format!("DELETE FROM vectors WHERE {ORPHAN}"), [])?;
            }
            Some(list) => {
                let mut stmt = self.tx.prepare_cached(&format!(
                    "DELETE FROM vectors WHERE scope_user=?1 AND scope_agent=?2 AND {ORPHAN}"
                ))?;
                for s in list {
                    stmt.execute(params![s.user, s.agent])?;
                }
            }
        }
        Ok(())
    }

    /// Stores `vec` for the document `(scope, fact_id)` when it still holds the text of
    /// `digest`; returns whether it was stored.
    pub(crate) fn put_vector(
        &mut self,
        scope: &ScopeKeyText,
        fact_id: &str,
        model_id: &str,
        digest: &[u8; 32],
        vec: &[f32],
    ) -> Result<bool, WriteError> {
        let dim =
            i64::try_from(vec.len()).map_err(|_| WriteError::Limit("vector too long".into()))?;
        let n = self
            .tx
            .prepare_cached(
                "INSERT OR REPLACE INTO vectors(scope_user, scope_agent, fact_id, model_id, \
                 digest, dim, vec) SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7 WHERE EXISTS(SELECT 1 \
                 FROM scopes s JOIN docs d ON d.scope_key = s.scope_key WHERE \
                 s.scope_user = ?1 AND s.scope_agent = ?2 AND d.fact_id = ?3 AND d.digest = ?5)",
            )?
            .execute(params![
                scope.user,
                scope.agent,
                fact_id,
                model_id,
                &digest[..],
                dim,
                encode_vector(vec)
            ])?;
        Ok(n > 0)
    }

    /// Deletes the vector of one document.
    pub(crate) fn drop_vector(
        &mut self,
        scope: &ScopeKeyText,
        fact_id: &str,
    ) -> Result<(), WriteError> {
        self.tx
            .prepare_cached(
                "DELETE FROM vectors WHERE scope_user=?1 AND scope_agent=?2 AND fact_id=?3",
            )?
            .execute(params![scope.user, scope.agent, fact_id])?;
        Ok(())
    }

    /// Writes the sequence counters back and commits.
    pub(crate) fn finish(self) -> Result<(), WriteError> {
        {
            let mut stmt = self
                .tx
                .prepare_cached("UPDATE scopes SET next_seq=?2 WHERE scope_key=?1")?;
            for (key, next) in self.scopes.values() {
                stmt.execute(params![key, next])?;
            }
        }
        self.tx.commit()?;
        Ok(())
    }
}

/// One ranked candidate of a scope search (the fact is decoded later, only for the final hits).
#[derive(Clone, Debug)]
pub(crate) struct Candidate {
    /// The document id.
    pub(crate) id: i64,
    /// `-bm25`.
    pub(crate) rel: f64,
    /// The final score.
    pub(crate) score: f64,
    /// Whether only the CJK column matched.
    pub(crate) cjk_only: bool,
    /// Index of the scope in the query.
    pub(crate) scope_index: usize,
}

impl Candidate {
    /// `Cjk` when only the CJK column matched, else `Fts5`.
    pub(crate) fn match_type(&self) -> MatchType {
        if self.cjk_only {
            MatchType::Cjk
        } else {
            MatchType::Fts5
        }
    }
}

/// How one scope search ranks its matches.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ScopeSearch<'a> {
    /// The FTS5 expression.
    pub(crate) expr: &'a str,
    /// Whether `expr` is the plain-words OR (its matches are every scope document holding a
    /// term, so BM25's statistics can be taken from them, see [`crate::tf`]).
    pub(crate) plain: bool,
    /// Only this category.
    pub(crate) category: Option<&'a str>,
    /// How many candidates to keep.
    pub(crate) per_scope: usize,
    /// Whether the query holds CJK letters.
    pub(crate) has_cjk: bool,
    /// The time decay's "now".
    pub(crate) now: Timestamp,
}

/// Runs one MATCH expression within one scope: the reference's engine search with
/// `top_k_e = per_scope` (the `2 * per_scope` best by BM25), scored and cut to `per_scope`.
///
/// A plain expression is ranked by BM25 over the scope ([`crate::tf`]); any other by FTS5's
/// `bm25()`, whose statistics are the shard's.
pub(crate) fn search_scope(
    conn: &Connection,
    key: i64,
    q: &ScopeSearch<'_>,
    scope_index: usize,
) -> rusqlite::Result<Vec<Candidate>> {
    let limit = q.per_scope.saturating_mul(2);
    let mut ranked = if q.plain {
        scope_bm25_matches(conn, key, q)?
    } else {
        shard_bm25_matches(conn, key, q, limit)?
    };
    ranked.truncate(limit);
    let mut out: Vec<Candidate> = ranked
        .into_iter()
        .map(|m| Candidate {
            id: m.id,
            rel: m.rel,
            score: rank::final_score(m.rel, rank::decay(q.now, m.created), m.confidence),
            cjk_only: m.cjk_only,
            scope_index,
        })
        .collect();
    // Stable: ties keep BM25 order.
    out.sort_by(|a, b| b.score.total_cmp(&a.score));
    out.truncate(q.per_scope);
    Ok(out)
}

/// One match before the final score.
struct Match {
    id: i64,
    rel: f64,
    created: Option<i64>,
    confidence: f64,
    cjk_only: bool,
}

/// The matches ranked by FTS5's `bm25()`, best first (ties by rowid), at most `limit`.
fn shard_bm25_matches(
    conn: &Connection,
    key: i64,
    q: &ScopeSearch<'_>,
    limit: usize,
) -> rusqlite::Result<Vec<Match>> {
    let (lo, hi) = scope_range(key);
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let t = format!("fts_{}", shard_of_key(key));
    let sql = format!(
        "SELECT {t}.rowid, bm25({t}), docs.created_us, docs.confidence{extra}
         FROM {t} JOIN docs ON docs.id = {t}.rowid
         WHERE {t} MATCH ?1 AND {t}.rowid BETWEEN ?2 AND ?3{cat}
         ORDER BY 2, 1 LIMIT ?4",
        extra = if q.has_cjk {
            format!(", bm25({t}, 1.0, 0.0)")
        } else {
            String::new()
        },
        cat = if q.category.is_some() {
            " AND docs.category = ?5"
        } else {
            ""
        },
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let has_cjk = q.has_cjk;
    let map_row = |r: &rusqlite::Row<'_>| -> rusqlite::Result<Match> {
        let bm25: f64 = r.get(1)?;
        let cjk_only = if has_cjk {
            let body: f64 = r.get(4)?;
            body == 0.0
        } else {
            false
        };
        Ok(Match {
            id: r.get(0)?,
            rel: -bm25,
            created: r.get(2)?,
            confidence: r.get(3)?,
            cjk_only,
        })
    };
    match q.category {
        Some(c) => stmt
            .query_map(params![q.expr, lo, hi, limit, c], map_row)?
            .collect(),
        None => stmt
            .query_map(params![q.expr, lo, hi, limit], map_row)?
            .collect(),
    }
}

/// Every match of a plain expression in the scope, ranked by BM25 with the scope's document
/// count and document frequencies (all categories count towards them; the category filter
/// applies after), best first, ties by rowid (the order of `ORDER BY bm25, rowid`).
fn scope_bm25_matches(
    conn: &Connection,
    key: i64,
    q: &ScopeSearch<'_>,
) -> rusqlite::Result<Vec<Match>> {
    let (lo, hi) = scope_range(key);
    let t = format!("fts_{}", shard_of_key(key));
    let sql = format!(
        "SELECT {t}.rowid, {f}({t}), docs.created_us, docs.confidence, docs.category
         FROM {t} JOIN docs ON docs.id = {t}.rowid
         WHERE {t} MATCH ?1 AND {t}.rowid BETWEEN ?2 AND ?3",
        f = crate::tf::NAME,
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let rows = stmt
        .query_map(params![q.expr, lo, hi], |r| {
            let blob = r.get_ref(1)?.as_blob()?;
            let tf = crate::tf::RowTf::decode(blob).ok_or_else(|| {
                rusqlite::Error::FromSqlConversionFailure(
                    1,
                    rusqlite::types::Type::Blob,
                    "not a term-frequency record".into(),
                )
            })?;
            let in_category = match q.category {
                Some(c) => r.get_ref(4)?.as_str()? == c,
                None => true,
            };
            Ok((r.get::<_, i64>(0)?, tf, r.get(2)?, r.get(3)?, in_category))
        })?
        .collect::<rusqlite::Result<Vec<(i64, crate::tf::RowTf, Option<i64>, f64, bool)>>>()?;
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let docs: i64 = conn
        .prepare_cached("SELECT count(*) FROM docs WHERE scope_key = ?1")?
        .query_row([key], |r| r.get(0))?;
    let tfs: Vec<&crate::tf::RowTf> = rows.iter().map(|r| &r.1).collect();
    let bm25 = crate::tf::ScopeBm25::new(docs, &tfs);
    let mut out: Vec<Match> = rows
        .iter()
        .filter(|r| r.4)
        .map(|(id, tf, created, confidence, _)| Match {
            id: *id,
            rel: bm25.relevance(tf),
            created: *created,
            confidence: *confidence,
            cjk_only: q.has_cjk && tf.body_missed(),
        })
        .collect();
    out.sort_by(|a, b| b.rel.total_cmp(&a.rel).then(a.id.cmp(&b.id)));
    Ok(out)
}

/// The stored id and JSON of a document.
pub(crate) fn load_doc(conn: &Connection, id: i64) -> rusqlite::Result<Option<(String, String)>> {
    conn.prepare_cached("SELECT fact_id, fact_json FROM docs WHERE id=?1")?
        .query_row([id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()
}

/// The fact id of document `id`, if it is there.
pub(crate) fn doc_fact_id(conn: &Connection, id: i64) -> rusqlite::Result<Option<String>> {
    conn.prepare_cached("SELECT fact_id FROM docs WHERE id=?1")?
        .query_row([id], |r| r.get(0))
        .optional()
}

/// One inventory row: scope user JSON, scope agent JSON, fact id, revision.
pub(crate) type InventoryRow = (String, String, String, Option<i64>);

/// Every document as an [`InventoryRow`].
pub(crate) fn inventory(conn: &Connection) -> rusqlite::Result<Vec<InventoryRow>> {
    conn.prepare_cached(
        "SELECT s.scope_user, s.scope_agent, d.fact_id, json_extract(d.fact_json, '$.revision') \
         FROM docs d JOIN scopes s ON s.scope_key = d.scope_key",
    )?
    .query_map([], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3).ok().flatten()))
    })?
    .collect()
}

/// The stored user and agent texts of every indexed scope.
pub(crate) fn scope_texts(conn: &Connection) -> rusqlite::Result<Vec<(String, String)>> {
    conn.prepare_cached("SELECT scope_user, scope_agent FROM scopes ORDER BY scope_key")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect()
}

/// The scope of a stored scope key text (the inverse of [`ScopeKeyText::of`]).
///
/// # Errors
/// [`DecodeError`] when the stored text is not a JSON string or null, or not a valid id.
pub(crate) fn decode_scope(user: &str, agent: &str) -> Result<Scope, DecodeError> {
    let text = |s: &str| -> Result<Option<String>, DecodeError> {
        match serde_json::from_str::<Value>(s)? {
            Value::Null => Ok(None),
            Value::String(v) => Ok(Some(v)),
            other => Err(DecodeError::ScopeText(other)),
        }
    };
    let user = text(user)?
        .map(UserId::new)
        .transpose()
        .map_err(DecodeError::ScopeId)?;
    let agent = text(agent)?
        .map(|a| AgentName::parse(&a))
        .transpose()
        .map_err(DecodeError::ScopeId)?;
    Ok(Scope::new(user, agent))
}

/// Number of indexed documents.
pub(crate) fn count_docs(conn: &Connection) -> rusqlite::Result<u64> {
    let n: i64 = conn
        .prepare_cached("SELECT count(*) FROM docs")?
        .query_row([], |r| r.get(0))?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// The condition on `v` (vectors) and `d` (docs) for a current vector of model `?1`.
const CURRENT: &str = "v.model_id = ?1 AND v.digest = d.digest AND length(v.vec) = v.dim * 4";

/// One document without a current vector: scope user and agent texts, fact id, content.
pub(crate) type MissingRow = (String, String, String, String);

/// Up to `limit` documents (of the scope key, or of the whole index) without a current vector
/// of `model_id`, in document order.
pub(crate) fn missing_vectors(
    conn: &Connection,
    model_id: &str,
    scope_key: Option<i64>,
    limit: usize,
) -> rusqlite::Result<Vec<MissingRow>> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let sql = format!(
        "SELECT s.scope_user, s.scope_agent, d.fact_id, \
         coalesce(json_extract(d.fact_json, '$.content'), '') \
         FROM docs d JOIN scopes s ON s.scope_key = d.scope_key \
         LEFT JOIN vectors v ON v.scope_user = s.scope_user AND v.scope_agent = s.scope_agent \
         AND v.fact_id = d.fact_id \
         WHERE NOT coalesce({CURRENT}, 0) {scope} ORDER BY d.id LIMIT ?2",
        scope = if scope_key.is_some() {
            "AND d.id BETWEEN ?3 AND ?4"
        } else {
            ""
        }
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let map = |r: &rusqlite::Row<'_>| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?));
    match scope_key {
        Some(key) => {
            let (lo, hi) = scope_range(key);
            stmt.query_map(params![model_id, limit, lo, hi], map)?
                .collect()
        }
        None => stmt.query_map(params![model_id, limit], map)?.collect(),
    }
}

/// One document of a scope with a vector of the model: doc id, fact id, fact JSON, dim, blob,
/// script tag.
pub(crate) type VectorRow = (i64, String, String, i64, Vec<u8>, String);

/// The documents of one scope with a current vector of `model_id`.
pub(crate) fn scope_vectors(
    conn: &Connection,
    scope_key: i64,
    model_id: &str,
) -> rusqlite::Result<Vec<VectorRow>> {
    let (lo, hi) = scope_range(scope_key);
    let sql = format!(
        "SELECT d.id, d.fact_id, d.fact_json, v.dim, v.vec, d.script \
         FROM docs d JOIN scopes s ON s.scope_key = d.scope_key \
         JOIN vectors v ON v.scope_user = s.scope_user AND v.scope_agent = s.scope_agent \
         AND v.fact_id = d.fact_id \
         WHERE d.id BETWEEN ?2 AND ?3 AND {CURRENT} ORDER BY d.id"
    );
    conn.prepare_cached(&sql)?
        .query_map(params![model_id, lo, hi], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
            ))
        })?
        .collect()
}

/// One document of a scope for a ranking by meaning: doc id, fact id, category, script tag,
/// and the dimension and blob of its current vector of the model (`None` when it has none).
pub(crate) type RankRow = (i64, String, String, String, Option<i64>, Option<Vec<u8>>);

/// Every document of one scope with its current vector of `model_id`, if any, without the
/// fact itself (read only for the hits kept: [`doc_json`]).
pub(crate) fn scope_rank_rows(
    conn: &Connection,
    scope_key: i64,
    model_id: &str,
) -> rusqlite::Result<Vec<RankRow>> {
    let (lo, hi) = scope_range(scope_key);
    let sql = format!(
        "SELECT d.id, d.fact_id, d.category, d.script, \
         CASE WHEN {CURRENT} THEN v.dim END, CASE WHEN {CURRENT} THEN v.vec END \
         FROM docs d JOIN scopes s ON s.scope_key = d.scope_key \
         LEFT JOIN vectors v ON v.scope_user = s.scope_user AND v.scope_agent = s.scope_agent \
         AND v.fact_id = d.fact_id \
         WHERE d.id BETWEEN ?2 AND ?3 ORDER BY d.id"
    );
    conn.prepare_cached(&sql)?
        .query_map(params![model_id, lo, hi], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
            ))
        })?
        .collect()
}

/// The doc id and fact JSON of one fact of a scope, if it is indexed.
pub(crate) fn doc_json(
    conn: &Connection,
    scope_key: i64,
    fact_id: &str,
) -> rusqlite::Result<Option<(i64, String)>> {
    conn.prepare_cached("SELECT id, fact_json FROM docs WHERE scope_key = ?1 AND fact_id = ?2")?
        .query_row(params![scope_key, fact_id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()
}

/// `(documents with a current vector of model_id, documents)`.
pub(crate) fn vector_coverage(conn: &Connection, model_id: &str) -> rusqlite::Result<(u64, u64)> {
    let sql = format!(
        "SELECT count(v.fact_id), count(*) FROM docs d JOIN scopes s ON s.scope_key = d.scope_key \
         LEFT JOIN vectors v ON v.scope_user = s.scope_user AND v.scope_agent = s.scope_agent \
         AND v.fact_id = d.fact_id AND {CURRENT}"
    );
    let (with, all): (i64, i64) = conn
        .prepare_cached(&sql)?
        .query_row(params![model_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok((
        u64::try_from(with).unwrap_or(0),
        u64::try_from(all).unwrap_or(0),
    ))
}
