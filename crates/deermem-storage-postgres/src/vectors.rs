//! Embedding vectors in PostgreSQL (schema version 4): the `VectorIndex` port over the storage's
//! `facts` ([`PgFactIndex`], with `fact_vectors`) and over the retrieval port's `search_docs`
//! (`PgRetrieval`, with `doc_vectors`), one implementation for both tables.
//!
//! A document (a fact row, a search document) records `content_digest`, the SHA-256 of its
//! content. A vector row holds the model id, the digest of the text it was made from, its
//! dimension and its values as `real[]`; it is current while the model id is the one asked
//! for, the digest is the document's, and the values are readable (one dimension, as many as
//! recorded, no NULL, NaN or infinity). Anything else is missing, so a changed text, another
//! model or a damaged row is simply embedded again. A vector row references its document with
//! `ON DELETE CASCADE`: deleting a fact (a commit, clearing a user, `deermem migrate` replacing
//! a bucket) or a search document deletes its vector in the same transaction. Every value
//! reaches the database as a bind parameter; only the fixed table and column names below are
//! part of the SQL text.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use deermem_core::ports::{Clock, EmbedTask, Retrieval, ScopedSearch, VectorIndex};
use deermem_core::{
    AgentName, Fact, RetrievalError, RetrievalStats, Scope, SearchHit, SearchQuery, Timestamp,
    UserId,
};
use sha2::Digest as _;
use tokio_postgres::GenericClient;
use tokio_postgres::error::SqlState;

use crate::repository::PgStorage;
use crate::retrieval::backend;
use crate::store::PgDatabase;

/// The SHA-256 of a document's content: the text its vector is made from.
pub(crate) fn content_digest(content: &str) -> Vec<u8> {
    sha2::Sha256::digest(content.as_bytes()).to_vec()
}

/// The document table a vector index reads, with its vector table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// The storage's `facts`, keyed by bucket and agent; vectors in `fact_vectors`.
    Facts,
    /// The retrieval port's `search_docs`, keyed by the scope's JSON texts; vectors in
    /// `doc_vectors`.
    Docs,
}

/// The condition on `v` (a vector row) and `d` (its document) for a current vector of model
/// `$m` (the placeholder is given).
fn current(m: &str) -> String {
    format!(
        "v.model_id = {m} AND v.digest = d.content_digest AND array_ndims(v.vec) = 1 \
         AND cardinality(v.vec) = v.dimension AND array_position(v.vec, NULL) IS NULL \
         AND NOT (v.vec && ARRAY['NaN', 'Infinity', '-Infinity']::real[])"
    )
}

impl Source {
    /// Document table, its scope columns and its id column.
    fn docs(self) -> (&'static str, &'static str, &'static str, &'static str) {
        match self {
            Self::Facts => ("facts", "bucket", "agent", "id"),
            Self::Docs => ("search_docs", "scope_user", "scope_agent", "fact_id"),
        }
    }

    /// Vector table and its scope columns (the id column is `fact_id`).
    fn vectors(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Self::Facts => ("fact_vectors", "bucket", "agent"),
            Self::Docs => ("doc_vectors", "scope_user", "scope_agent"),
        }
    }

    /// The stored key of a scope: `(bucket, agent)` or the JSON texts; `None` without an agent.
    fn key(self, scope: &Scope) -> Option<(String, String)> {
        let agent = scope.agent.as_ref()?;
        Some(match self {
            Self::Facts => (
                scope.user.as_ref().map_or("", UserId::bucket).to_owned(),
                agent.as_str().to_owned(),
            ),
            Self::Docs => crate::retrieval::scope_key(scope),
        })
    }

    /// `FROM docs d LEFT JOIN vectors v ON (the same document)`.
    fn join(self, kind: &str) -> String {
        let (docs, da, db, did) = self.docs();
        let (vecs, va, vb) = self.vectors();
        format!(
            "{docs} d {kind} JOIN {vecs} v ON v.{va} = d.{da} AND v.{vb} = d.{db} \
             AND v.fact_id = d.{did}"
        )
    }

    /// A stored document read back: its scope and fact. `requested` is the scope the caller
    /// asked for (its raw user id owns the fact), or `None` to take the one the fact records.
    fn read(
        self,
        (a, b, id, text): (&str, &str, &str, &str),
        requested: Option<&Scope>,
        now: Timestamp,
    ) -> Result<(Scope, Fact), Unreadable> {
        match self {
            Self::Facts => {
                let mut fact = crate::stored::decode_fact(text, now)?;
                let agent = AgentName::parse(b)?;
                let user = match requested {
                    Some(s) => s.user.clone(),
                    None => match fact.scope.user_id.as_deref() {
                        Some(raw) => Some(UserId::new(raw)?),
                        None => None,
                    },
                };
                if user.as_ref().map_or("", UserId::bucket) != a {
                    return Err(Unreadable::OtherBucket(a.to_owned()));
                }
                fact.scope.user_id = user.as_ref().map(|u| u.as_str().to_owned());
                Ok((Scope::new(user, Some(agent)), fact))
            }
            Self::Docs => {
                let scope = match requested {
                    Some(s) => s.clone(),
                    None => crate::retrieval::scope_of(a, b)?,
                };
                let fact = crate::retrieval::decode(text, id, &scope, now)?;
                Ok((scope, fact))
            }
        }
    }
}

/// A stored document that cannot be read back (it is skipped, never embedded).
#[derive(Debug, thiserror::Error)]
pub(crate) enum Unreadable {
    /// A fact row that does not decode.
    #[error("{0}")]
    Fact(#[from] crate::stored::Unreadable),
    /// A search document that does not decode.
    #[error("{0}")]
    Doc(#[from] crate::retrieval::DocError),
    /// A stored id the core refuses.
    #[error("{0}")]
    Id(#[from] deermem_core::IdError),
    /// A fact recording a user whose bucket is not the row's.
    #[error("the fact records a user of another bucket than {0:?}")]
    OtherBucket(String),
}

/// The vector side of one source, over a pool.
#[derive(Clone)]
pub(crate) struct Vectors {
    pub(crate) source: Source,
    pub(crate) store: PgDatabase,
    pub(crate) clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Vectors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vectors")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl Vectors {
    async fn client(&self) -> Result<deadpool_postgres::Object, RetrievalError> {
        self.store
            .client()
            .await
            .map_err(|e| RetrievalError::Unavailable(format!("PostgreSQL: {e}")))
    }

    /// Gives the documents of `key` (all when `None`) written before schema version 4 their
    /// content digest. A row is updated only while it still holds the fact that was read; one
    /// that does not decode keeps no digest and is never listed.
    async fn backfill_digests(
        &self,
        client: &impl GenericClient,
        key: Option<&(String, String)>,
    ) -> Result<(), RetrievalError> {
        let (docs, da, db, did) = self.source.docs();
        let select = format!(
            "SELECT {da}, {db}, {did}, fact::text FROM {docs} WHERE content_digest IS NULL"
        );
        let rows = match key {
            None => client.query(&select, &[]).await,
            Some((a, b)) => {
                client
                    .query(&format!("{select} AND {da} = $1 AND {db} = $2"), &[a, b])
                    .await
            }
        }
        .map_err(backend("read documents without a digest"))?;
        let now = self.clock.now();
        let update = format!(
            "UPDATE {docs} SET content_digest = $4 WHERE {da} = $1 AND {db} = $2 AND {did} = $3 \
             AND content_digest IS NULL AND fact::text = $5"
        );
        for r in &rows {
            let doc: (&str, &str, &str, &str) = (r.get(0), r.get(1), r.get(2), r.get(3));
            match self.source.read(doc, None, now) {
                Ok((_, fact)) => {
                    client
                        .execute(
                            &update,
                            &[
                                &doc.0,
                                &doc.1,
                                &doc.2,
                                &content_digest(&fact.content),
                                &doc.3,
                            ],
                        )
                        .await
                        .map_err(backend("record a digest"))?;
                }
                Err(e) => {
                    tracing::warn!(id = doc.2, error = %e,
                        "a stored document does not decode; it is not embedded");
                }
            }
        }
        Ok(())
    }

    pub(crate) async fn missing(
        &self,
        model_id: &str,
        scopes: Option<&[Scope]>,
        limit: usize,
    ) -> Result<Vec<EmbedTask>, RetrievalError> {
        if limit == 0 || scopes.is_some_and(<[Scope]>::is_empty) {
            return Ok(Vec::new());
        }
        let client = self.client().await?;
        let (_, da, db, did) = self.source.docs();
        let base = format!(
            "SELECT d.{da}, d.{db}, d.{did}, d.fact::text FROM {} AND {} \
             WHERE d.content_digest IS NOT NULL AND v.fact_id IS NULL",
            self.source.join("LEFT"),
            current("$1")
        );
        let order =
            format!("ORDER BY d.{da} COLLATE \"C\", d.{db} COLLATE \"C\", d.{did} COLLATE \"C\"");
        let now = self.clock.now();
        let mut out = Vec::new();
        let read = |rows: Vec<tokio_postgres::Row>, out: &mut Vec<EmbedTask>| {
            for r in &rows {
                let doc: (&str, &str, &str, &str) = (r.get(0), r.get(1), r.get(2), r.get(3));
                match self.source.read(doc, None, now) {
                    Ok((scope, fact)) => out.push(EmbedTask {
                        scope,
                        fact_id: doc.2.to_owned(),
                        text: fact.content,
                    }),
                    Err(e) => tracing::warn!(id = doc.2, error = %e,
                        "a stored document does not decode; it is not embedded"),
                }
            }
        };
        match scopes {
            None => {
                self.backfill_digests(&**client, None).await?;
                let n = i64::try_from(limit).unwrap_or(i64::MAX);
                let rows = client
                    .query(&format!("{base} {order} LIMIT $2"), &[&model_id, &n])
                    .await
                    .map_err(backend("list the documents to embed"))?;
                read(rows, &mut out);
            }
            Some(list) => {
                let mut seen: Vec<(String, String)> = Vec::new();
                for scope in list {
                    let Some(key) = self.source.key(scope) else {
                        continue;
                    };
                    if out.len() >= limit || seen.contains(&key) {
                        continue;
                    }
                    self.backfill_digests(&**client, Some(&key)).await?;
                    let n = i64::try_from(limit - out.len()).unwrap_or(i64::MAX);
                    let rows = client
                        .query(
                            &format!("{base} AND d.{da} = $2 AND d.{db} = $3 {order} LIMIT $4"),
                            &[&model_id, &key.0, &key.1, &n],
                        )
                        .await
                        .map_err(backend("list the documents to embed"))?;
                    read(rows, &mut out);
                    seen.push(key);
                }
            }
        }
        out.truncate(limit);
        Ok(out)
    }

    pub(crate) async fn put(
        &self,
        model_id: &str,
        tasks: &[EmbedTask],
        vectors: &[Vec<f32>],
    ) -> Result<usize, RetrievalError> {
        deermem_core::ports::check_put_vectors(tasks, vectors)?;
        if tasks.is_empty() {
            return Ok(0);
        }
        let client = self.client().await?;
        let (docs, da, db, did) = self.source.docs();
        let (vecs, va, vb) = self.source.vectors();
        let sql = format!(
            "INSERT INTO {vecs} ({va}, {vb}, fact_id, model_id, digest, dimension, vec) \
             SELECT d.{da}, d.{db}, d.{did}, $4, $5, $6, $7 FROM {docs} d \
             WHERE d.{da} = $1 AND d.{db} = $2 AND d.{did} = $3 AND d.content_digest = $5 \
             ON CONFLICT ({va}, {vb}, fact_id) DO UPDATE SET model_id = EXCLUDED.model_id, \
             digest = EXCLUDED.digest, dimension = EXCLUDED.dimension, vec = EXCLUDED.vec"
        );
        let stmt = client
            .prepare_cached(&sql)
            .await
            .map_err(backend("prepare a statement"))?;
        let mut stored = 0usize;
        for (task, vector) in tasks.iter().zip(vectors) {
            let Some((a, b)) = self.source.key(&task.scope) else {
                continue;
            };
            if task.fact_id.contains('\0') {
                continue;
            }
            let dimension = i32::try_from(vector.len()).map_err(|_| {
                RetrievalError::InvalidInput(format!("a vector of {} components", vector.len()))
            })?;
            let digest = content_digest(&task.text);
            match client
                .execute(
                    &stmt,
                    &[
                        &a,
                        &b,
                        &task.fact_id,
                        &model_id,
                        &digest,
                        &dimension,
                        vector,
                    ],
                )
                .await
            {
                Ok(n) => stored += usize::try_from(n).unwrap_or(0),
                // The document was deleted between the read and the insert: nothing to store.
                Err(e) if e.code() == Some(&SqlState::FOREIGN_KEY_VIOLATION) => {}
                Err(e) => return Err(backend("store a vector")(e)),
            }
        }
        Ok(stored)
    }

    pub(crate) async fn of_scopes(
        &self,
        scopes: &[Scope],
        model_id: &str,
    ) -> Result<Vec<(Fact, Vec<f32>)>, RetrievalError> {
        let client = self.client().await?;
        let (_, da, db, did) = self.source.docs();
        let sql = format!(
            "SELECT d.{did}, d.fact::text, v.vec FROM {} AND {} \
             WHERE d.{da} = $2 AND d.{db} = $3 ORDER BY d.{did} COLLATE \"C\"",
            self.source.join(""),
            current("$1")
        );
        let now = self.clock.now();
        let mut out = Vec::new();
        let mut seen: Vec<(String, String)> = Vec::new();
        for scope in scopes {
            let Some(key) = self.source.key(scope) else {
                continue;
            };
            if seen.contains(&key) {
                continue;
            }
            let rows = client
                .query(&sql, &[&model_id, &key.0, &key.1])
                .await
                .map_err(backend("read the vectors"))?;
            for r in &rows {
                let id: &str = r.get(0);
                let vec = match r.try_get::<_, Vec<f32>>(2) {
                    Ok(v) => v,
                    Err(e) => {
                        tracing::warn!(id, error = %e, "a stored vector does not read back; it is embedded again");
                        continue;
                    }
                };
                match self
                    .source
                    .read((&key.0, &key.1, id, r.get(1)), Some(scope), now)
                {
                    Ok((_, fact)) => out.push((fact, vec)),
                    Err(e) => {
                        tracing::warn!(id, error = %e, "skipping a stored document that does not decode")
                    }
                }
            }
            seen.push(key);
        }
        Ok(out)
    }

    pub(crate) async fn coverage(&self, model_id: &str) -> Result<(u64, u64), RetrievalError> {
        let client = self.client().await?;
        let (docs, ..) = self.source.docs();
        let row = client
            .query_one(
                &format!(
                    "SELECT (SELECT count(*) FROM {} AND {}), (SELECT count(*) FROM {docs})",
                    self.source.join(""),
                    current("$1")
                ),
                &[&model_id],
            )
            .await
            .map_err(backend("count the vectors"))?;
        let count = |i: usize| u64::try_from(row.get::<_, i64>(i)).unwrap_or(0);
        Ok((count(0), count(1)))
    }
}

/// The storage's facts as a retrieval index with vectors, for search by meaning on PostgreSQL
/// storage: the documents are the `facts` rows themselves (their search columns and content
/// digest written in each commit's transaction), the vectors live in `fact_vectors`, and every
/// replica reads both. Wrapped by the engine's hybrid retrieval and placed in front of the
/// storage's search by [`crate::PgIndexedStorage`].
///
/// As a `Retrieval` it only searches: `upsert`, `remove` and `clear` have nothing to do (the
/// storage's commits write and delete the rows, and deleting a fact deletes its vector), and
/// `rebuild` reports how many facts the scopes hold (the storage's `rebuild_index` refreshes
/// their search columns).
pub struct PgFactIndex {
    storage: Arc<PgStorage>,
    vectors: Vectors,
    closed: AtomicBool,
}

impl std::fmt::Debug for PgFactIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgFactIndex")
            .field("storage", &self.storage)
            .field("closed", &self.closed.load(Ordering::Relaxed))
            .finish()
    }
}

impl PgFactIndex {
    /// The index over `storage`'s facts; `store` is its pool (already migrated).
    pub fn new(storage: Arc<PgStorage>, store: PgDatabase, clock: Arc<dyn Clock>) -> Self {
        Self {
            storage,
            vectors: Vectors {
                source: Source::Facts,
                store,
                clock,
            },
            closed: AtomicBool::new(false),
        }
    }

    fn open(&self) -> Result<(), RetrievalError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(RetrievalError::Unavailable(
                "the PostgreSQL index is closed".into(),
            ));
        }
        Ok(())
    }
}

#[async_trait]
impl Retrieval for PgFactIndex {
    fn kind(&self) -> &'static str {
        crate::KIND
    }

    async fn upsert(&self, scope: &Scope, _fact: &Fact) -> Result<(), RetrievalError> {
        self.open()?;
        if scope.agent.is_none() {
            return Err(RetrievalError::InvalidInput(
                "retrieval scope agentName must be set to index a fact".into(),
            ));
        }
        Ok(())
    }

    async fn remove(&self, _scope: &Scope, _id: &str) -> Result<(), RetrievalError> {
        self.open()
    }

    async fn search(&self, query: &SearchQuery) -> Result<Vec<SearchHit>, RetrievalError> {
        self.open()?;
        self.storage
            .search_facts(query)
            .await
            .map_err(|e| RetrievalError::Backend(e.to_string()))
    }

    async fn clear(&self, _scopes: Option<&[Scope]>) -> Result<(), RetrievalError> {
        self.open()
    }

    async fn rebuild(
        &self,
        scopes: Option<&[Scope]>,
        _facts: &[(Scope, Fact)],
    ) -> Result<usize, RetrievalError> {
        self.open()?;
        let client = self.vectors.client().await?;
        let n: i64 = match scopes {
            None => client
                .query_one("SELECT count(*) FROM facts", &[])
                .await
                .map_err(backend("count the facts"))?
                .get(0),
            Some(list) => {
                let mut n = 0i64;
                for s in list {
                    if let Some((b, a)) = Source::Facts.key(s) {
                        n += client
                            .query_one(
                                "SELECT count(*) FROM facts WHERE bucket = $1 AND agent = $2",
                                &[&b, &a],
                            )
                            .await
                            .map_err(backend("count the facts"))?
                            .get::<_, i64>(0);
                    }
                }
                n
            }
        };
        Ok(usize::try_from(n).unwrap_or(0))
    }

    async fn stats(&self) -> Result<RetrievalStats, RetrievalError> {
        self.open()?;
        crate::retrieval::doc_stats(&**self.vectors.client().await?, "facts").await
    }

    async fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }
}

#[async_trait]
impl VectorIndex for PgFactIndex {
    async fn missing_vectors(
        &self,
        model_id: &str,
        scopes: Option<&[Scope]>,
        limit: usize,
    ) -> Result<Vec<EmbedTask>, RetrievalError> {
        self.open()?;
        self.vectors.missing(model_id, scopes, limit).await
    }

    async fn put_vectors(
        &self,
        model_id: &str,
        tasks: &[EmbedTask],
        vectors: &[Vec<f32>],
    ) -> Result<usize, RetrievalError> {
        self.open()?;
        self.vectors.put(model_id, tasks, vectors).await
    }

    async fn scope_vectors(
        &self,
        scopes: &[Scope],
        model_id: &str,
    ) -> Result<Vec<(Fact, Vec<f32>)>, RetrievalError> {
        self.open()?;
        self.vectors.of_scopes(scopes, model_id).await
    }

    async fn vector_coverage(&self, model_id: &str) -> Result<(u64, u64), RetrievalError> {
        self.open()?;
        self.vectors.coverage(model_id).await
    }
}
