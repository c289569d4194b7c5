//! The retrieval port in PostgreSQL: [`PgRetrieval`] keeps its own documents in `search_docs`
//! (one fact per scope and id, indexed and searched exactly like the storage's `facts`, see
//! [`crate::search`]), so a derived index in the database can serve any storage. Writes are
//! applied before they are acknowledged; a query without an indexable term finds nothing, as
//! in the FTS5 adapter. It is also a `VectorIndex`: vectors in `doc_vectors`, see
//! [`crate::vectors`]; a rebuild rewrites the documents it keeps in place, so their vectors
//! stay current when their text is unchanged.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use deermem_core::fact::{FactDraft, NormalizeContext, normalize_fact};
use deermem_core::ports::{Clock, EmbedTask, Retrieval, VectorIndex};
use deermem_core::{
    AgentName, Fact, FactId, IndexedDoc, RetrievalError, RetrievalStats, Scope, SearchHit,
    SearchQuery, Timestamp, UserId,
};
use serde_json::{Map, Value};
use tokio_postgres::GenericClient;

use crate::search::{self, Scored, Table};
use crate::store::PgDatabase;
use crate::vectors::{Source, Vectors};

/// The retrieval port over the `search_docs` table of one schema.
pub struct PgRetrieval {
    store: PgDatabase,
    clock: Arc<dyn Clock>,
    closed: AtomicBool,
}

impl std::fmt::Debug for PgRetrieval {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgRetrieval")
            .field("store", &self.store)
            .field("closed", &self.closed.load(Ordering::Relaxed))
            .finish()
    }
}

/// A scope as stored: the JSON texts of its raw user id and agent name (`null` when absent).
pub(crate) fn scope_key(scope: &Scope) -> (String, String) {
    let text = |v: Option<&str>| {
        v.map_or(Value::Null, |s| Value::String(s.to_owned()))
            .to_string()
    };
    (
        text(scope.user.as_ref().map(UserId::as_str)),
        text(scope.agent.as_ref().map(AgentName::as_str)),
    )
}

/// A stored index document that cannot be read back.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DocError {
    /// Not JSON.
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    /// A scope part that is neither a string nor null.
    #[error("not a string or null: {0}")]
    NotText(Value),
    /// An id the core refuses.
    #[error("{0}")]
    Id(#[from] deermem_core::IdError),
    /// A fact that does not normalise.
    #[error("{0}")]
    Fact(#[from] deermem_core::FactError),
}

/// The scope of a stored key (the inverse of [`scope_key`]).
pub(crate) fn scope_of(user: &str, agent: &str) -> Result<Scope, DocError> {
    let text = |s: &str| -> Result<Option<String>, DocError> {
        match serde_json::from_str::<Value>(s)? {
            Value::Null => Ok(None),
            Value::String(v) => Ok(Some(v)),
            other => Err(DocError::NotText(other)),
        }
    };
    let user = text(user)?.map(UserId::new).transpose()?;
    let agent = text(agent)?.map(|a| AgentName::parse(&a)).transpose()?;
    Ok(Scope::new(user, agent))
}

/// One document ready to be written.
struct Row {
    user: String,
    agent: String,
    id: String,
    revision: i64,
    fact: String,
    ix: search::Indexed,
    digest: Vec<u8>,
}

fn encode(scope: &Scope, fact: &Fact) -> Result<Row, RetrievalError> {
    let map = deermem_core::search::index_document(scope, fact)?;
    let (user, agent) = scope_key(scope);
    Ok(Row {
        user,
        agent,
        id: fact.id.as_str().to_owned(),
        revision: i64::try_from(fact.revision).unwrap_or(i64::MAX),
        fact: Value::Object(map).to_string(),
        ix: search::indexed(fact),
        digest: crate::vectors::content_digest(&fact.content),
    })
}

pub(crate) fn decode(
    json: &str,
    id: &str,
    scope: &Scope,
    now: Timestamp,
) -> Result<Fact, DocError> {
    let map: Map<String, Value> = serde_json::from_str(json)?;
    let fallback = FactId::new(id)?;
    let new_id = move || fallback.clone();
    let fs = scope.to_fact_scope();
    let ctx = NormalizeContext {
        scope: &fs,
        existing: None,
        now,
        new_id: &new_id,
    };
    Ok(normalize_fact(&FactDraft::from_json(map)?, &ctx)?)
}

pub(crate) fn backend(context: &'static str) -> impl Fn(tokio_postgres::Error) -> RetrievalError {
    move |e| RetrievalError::Backend(format!("PostgreSQL: {context}: {e}"))
}

/// The index statistics of a retrieval whose documents are the rows of `table`.
pub(crate) async fn doc_stats(
    client: &tokio_postgres::Client,
    table: &'static str,
) -> Result<RetrievalStats, RetrievalError> {
    let n: i64 = client
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await
        .map_err(backend("count the documents"))?
        .get(0);
    Ok(RetrievalStats {
        adapter: crate::KIND.to_owned(),
        total_docs: u64::try_from(n).unwrap_or(0),
        db_path: None,
        db_bytes: None,
        jieba: false,
        last_error: None,
        vectors: None,
    })
}

async fn write_row(client: &impl GenericClient, r: &Row) -> Result<(), RetrievalError> {
    client
        .execute(
            "INSERT INTO search_docs (scope_user, scope_agent, fact_id, revision, fact, category, \
             search_text, search_tokens, content_digest) \
             VALUES ($1, $2, $3, $4, $5::text::json, $6, $7, $8, $9) \
             ON CONFLICT (scope_user, scope_agent, fact_id) DO UPDATE SET \
             revision = EXCLUDED.revision, fact = EXCLUDED.fact, category = EXCLUDED.category, \
             search_text = EXCLUDED.search_text, search_tokens = EXCLUDED.search_tokens, \
             content_digest = EXCLUDED.content_digest",
            &[
                &r.user,
                &r.agent,
                &r.id,
                &r.revision,
                &r.fact,
                &r.ix.category,
                &r.ix.text,
                &r.ix.tokens,
                &r.digest,
            ],
        )
        .await
        .map_err(backend("write a document"))?;
    Ok(())
}

async fn delete_scopes(
    client: &impl GenericClient,
    scopes: Option<&[Scope]>,
) -> Result<(), RetrievalError> {
    match scopes {
        None => {
            client
                .execute("DELETE FROM search_docs", &[])
                .await
                .map_err(backend("clear the index"))?;
        }
        Some(list) => {
            for s in list {
                let (u, a) = scope_key(s);
                client
                    .execute(
                        "DELETE FROM search_docs WHERE scope_user = $1 AND scope_agent = $2",
                        &[&u, &a],
                    )
                    .await
                    .map_err(backend("clear a scope"))?;
            }
        }
    }
    Ok(())
}

/// Deletes the documents of `scopes` (every document when `None`) that `keep` does not hold
/// again. A kept document is rewritten in place, so its vector stays current when its text is
/// the same (a vector is a function of the text); the deleted ones take their vectors with them.
async fn delete_all_but(
    client: &impl GenericClient,
    scopes: Option<&[Scope]>,
    keep: &[Row],
) -> Result<(), RetrievalError> {
    let users: Vec<&str> = keep.iter().map(|r| r.user.as_str()).collect();
    let agents: Vec<&str> = keep.iter().map(|r| r.agent.as_str()).collect();
    let ids: Vec<&str> = keep.iter().map(|r| r.id.as_str()).collect();
    const NOT_KEPT: &str = "NOT EXISTS (SELECT 1 FROM unnest($1::text[], $2::text[], \
         $3::text[]) AS k(u, a, i) WHERE k.u = d.scope_user AND k.a = d.scope_agent \
         AND k.i = d.fact_id)";
    match scopes {
        None => {
            client
                .execute(
                    &format!("DELETE FROM search_docs d WHERE {NOT_KEPT}"),
                    &[&users, &agents, &ids],
                )
                .await
                .map_err(backend("clear the index"))?;
        }
        Some(list) => {
            for s in list {
                let (u, a) = scope_key(s);
                client
                    .execute(
                        &format!(
                            "DELETE FROM search_docs d WHERE d.scope_user = $4 \
                             AND d.scope_agent = $5 AND {NOT_KEPT}"
                        ),
                        &[&users, &agents, &ids, &u, &a],
                    )
                    .await
                    .map_err(backend("clear a scope"))?;
            }
        }
    }
    Ok(())
}

impl PgRetrieval {
    /// The index over `store` (already migrated).
    pub fn new(store: PgDatabase, clock: Arc<dyn Clock>) -> Self {
        Self {
            store,
            clock,
            closed: AtomicBool::new(false),
        }
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, RetrievalError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(RetrievalError::Unavailable(
                "the PostgreSQL index is closed".into(),
            ));
        }
        self.store
            .client()
            .await
            .map_err(|e| RetrievalError::Unavailable(format!("PostgreSQL: {e}")))
    }
}

#[async_trait]
impl Retrieval for PgRetrieval {
    fn kind(&self) -> &'static str {
        crate::KIND
    }

    async fn upsert(&self, scope: &Scope, fact: &Fact) -> Result<(), RetrievalError> {
        let client = self.client().await?;
        let row = encode(scope, fact)?;
        write_row(&**client, &row).await
    }

    async fn remove(&self, scope: &Scope, id: &str) -> Result<(), RetrievalError> {
        let client = self.client().await?;
        // No stored id holds NUL (PostgreSQL text cannot), so there is nothing to remove.
        if scope.agent.is_none() || id.contains('\0') {
            return Ok(());
        }
        let (u, a) = scope_key(scope);
        client
            .execute(
                "DELETE FROM search_docs WHERE scope_user = $1 AND scope_agent = $2 \
                 AND fact_id = $3",
                &[&u, &a, &id],
            )
            .await
            .map_err(backend("remove a document"))?;
        Ok(())
    }

    async fn search(&self, query: &SearchQuery) -> Result<Vec<SearchHit>, RetrievalError> {
        let client = self.client().await?;
        if query.is_trivially_empty() {
            return Ok(Vec::new());
        }
        let category = query.category.as_deref();
        if category.is_some_and(|c| c.contains('\0')) {
            return Err(RetrievalError::InvalidInput(
                "a search category cannot contain a NUL character".into(),
            ));
        }
        let Some(plan) = search::plan(&query.text) else {
            return Ok(Vec::new());
        };
        let per_scope = query.top_k.saturating_mul(4);
        let now = self.clock.now();
        let mut all: Vec<Scored> = Vec::new();
        let mut seen: Vec<&Scope> = Vec::new();
        for scope in &query.scopes {
            if scope.agent.is_none() || seen.contains(&scope) {
                continue;
            }
            seen.push(scope);
            let (u, a) = scope_key(scope);
            let found = search::scope_candidates(
                &client,
                Table::Docs,
                (&u, &a),
                &plan,
                category,
                per_scope,
            )
            .await
            .map_err(backend("search"))?;
            let mut scored = Vec::with_capacity(found.len());
            for c in &found {
                match decode(&c.fact, &c.id, scope, now) {
                    Ok(fact) => scored.push(Scored::new(c, fact, now)),
                    Err(e) => {
                        tracing::warn!(error = %e, "skipping an index document that does not decode");
                    }
                }
            }
            all.extend(search::cut_scope(scored, per_scope));
        }
        Ok(search::finish(all, query.top_k))
    }

    async fn clear(&self, scopes: Option<&[Scope]>) -> Result<(), RetrievalError> {
        let mut client = self.client().await?;
        let raw: &mut tokio_postgres::Client = &mut client;
        let tx = raw.transaction().await.map_err(backend("begin"))?;
        delete_scopes(&tx, scopes).await?;
        tx.commit().await.map_err(backend("commit"))
    }

    async fn rebuild(
        &self,
        scopes: Option<&[Scope]>,
        facts: &[(Scope, Fact)],
    ) -> Result<usize, RetrievalError> {
        let rows = facts
            .iter()
            .map(|(s, f)| encode(s, f))
            .collect::<Result<Vec<_>, _>>()?;
        let mut client = self.client().await?;
        let raw: &mut tokio_postgres::Client = &mut client;
        let tx = raw.transaction().await.map_err(backend("begin"))?;
        delete_all_but(&tx, scopes, &rows).await?;
        for r in &rows {
            write_row(&tx, r).await?;
        }
        tx.commit().await.map_err(backend("commit"))?;
        Ok(rows.len())
    }

    async fn stats(&self) -> Result<RetrievalStats, RetrievalError> {
        doc_stats(&**self.client().await?, "search_docs").await
    }

    async fn inventory(&self) -> Result<Vec<IndexedDoc>, RetrievalError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT scope_user, scope_agent, fact_id, revision FROM search_docs",
                &[],
            )
            .await
            .map_err(backend("list the documents"))?;
        rows.iter()
            .map(|r| {
                let (u, a): (&str, &str) = (r.get(0), r.get(1));
                let scope = scope_of(u, a).map_err(|e| {
                    RetrievalError::Backend(format!(
                        "index holds an unreadable scope ({u}, {a}): {e}"
                    ))
                })?;
                Ok(IndexedDoc {
                    scope,
                    fact_id: r.get(2),
                    revision: r
                        .get::<_, Option<i64>>(3)
                        .and_then(|v| u64::try_from(v).ok()),
                })
            })
            .collect()
    }

    async fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }
}

impl PgRetrieval {
    /// The vectors beside the documents (`doc_vectors`), while the index is open.
    fn vectors(&self) -> Result<Vectors, RetrievalError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(RetrievalError::Unavailable(
                "the PostgreSQL index is closed".into(),
            ));
        }
        Ok(Vectors {
            source: Source::Docs,
            store: self.store.clone(),
            clock: Arc::clone(&self.clock),
        })
    }
}

/// Vectors kept in `doc_vectors` beside the documents: current while their model id and the
/// document's content digest match, deleted with their document.
#[async_trait]
impl VectorIndex for PgRetrieval {
    async fn missing_vectors(
        &self,
        model_id: &str,
        scopes: Option<&[Scope]>,
        limit: usize,
    ) -> Result<Vec<EmbedTask>, RetrievalError> {
        self.vectors()?.missing(model_id, scopes, limit).await
    }

    async fn put_vectors(
        &self,
        model_id: &str,
        tasks: &[EmbedTask],
        vectors: &[Vec<f32>],
    ) -> Result<usize, RetrievalError> {
        self.vectors()?.put(model_id, tasks, vectors).await
    }

    async fn scope_vectors(
        &self,
        scopes: &[Scope],
        model_id: &str,
    ) -> Result<Vec<(Fact, Vec<f32>)>, RetrievalError> {
        self.vectors()?.of_scopes(scopes, model_id).await
    }

    async fn vector_coverage(&self, model_id: &str) -> Result<(u64, u64), RetrievalError> {
        self.vectors()?.coverage(model_id).await
    }
}
