//! The search modes over one dataset: every user's facts indexed once in a throwaway FTS5 index
//! (BM25, CJK bigrams: the engine's lexical search) and, when an embedder is given, embedded
//! once; each query ranked within its user's scope by BM25, by exact vector similarity, or by
//! reciprocal rank fusion of the two (the core's `policy::fusion`).

use std::collections::HashMap;
use std::sync::Arc;

use deermem_core::fact::{NormalizeContext, normalize_fact};
use deermem_core::policy::fusion::{nearest, reciprocal_rank_fusion};
use deermem_core::ports::{Clock, Embedder, Retrieval};
use deermem_core::{AgentName, FactId, Scope, SearchQuery, Timestamp, UserId};
use deermem_retrieval_fts5::{Fts5Options, Fts5Retrieval};
use serde_json::{Map, json};

use crate::dataset::{Dataset, EvalQuery};

/// How many candidates each ranked list holds before fusion and scoring.
pub const CANDIDATES: usize = 50;

/// A search mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mode {
    /// Lexical: FTS5 BM25.
    Bm25,
    /// Exact nearest neighbours by cosine similarity.
    Vector,
    /// Reciprocal rank fusion (k = 60) of the two.
    Hybrid,
}

impl Mode {
    /// The mode's name in reports and flags.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Bm25 => "bm25",
            Self::Vector => "vector",
            Self::Hybrid => "hybrid",
        }
    }
}

/// Why the harness could not run.
#[derive(Debug, thiserror::Error)]
pub enum RankError {
    /// A user id or fact id the engine refuses.
    #[error("dataset id {0:?} is not usable: {1}")]
    BadId(String, String),
    /// The index failed.
    #[error("index: {0}")]
    Index(#[from] deermem_core::RetrievalError),
    /// The embedder failed.
    #[error("embedder: {0}")]
    Embed(#[from] deermem_core::EmbedError),
    /// The temporary index directory could not be made.
    #[error("temporary directory: {0}")]
    Io(#[from] std::io::Error),
}

#[derive(Debug)]
struct FixedClock;

impl Clock for FixedClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_unix_seconds(1_767_225_600)
    }
}

/// The indexed dataset.
pub struct Ranker {
    index: Fts5Retrieval,
    embedder: Option<Arc<dyn Embedder>>,
    /// Per user: (fact id, unit vector), in dataset order.
    vectors: HashMap<String, Vec<(String, Vec<f32>)>>,
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for Ranker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ranker")
            .field("embedder", &self.embedder)
            .field("users", &self.vectors.len())
            .finish_non_exhaustive()
    }
}

fn scope(user: &str) -> Result<Scope, RankError> {
    let id = UserId::new(user).map_err(|e| RankError::BadId(user.to_owned(), e.to_string()))?;
    Ok(Scope::new(Some(id), Some(AgentName::default_bucket())))
}

impl Ranker {
    /// Indexes every fact, and embeds them all when `embedder` is given.
    ///
    /// # Errors
    /// An id the engine refuses, an index or embedder failure.
    pub async fn build(
        dataset: &Dataset,
        embedder: Option<Arc<dyn Embedder>>,
    ) -> Result<Self, RankError> {
        let dir = tempfile::tempdir()?;
        let index = Fts5Retrieval::open_file(
            &dir.path().join("eval.sqlite"),
            Arc::new(FixedClock),
            Fts5Options::default(),
        )?;
        let now = FixedClock.now();
        for f in &dataset.facts {
            let s = scope(&f.user)?;
            let id =
                FactId::new(&f.id).map_err(|e| RankError::BadId(f.id.clone(), e.to_string()))?;
            let mut draft = Map::new();
            draft.insert("id".into(), json!(f.id));
            draft.insert("content".into(), json!(f.content));
            draft.insert("source".into(), json!("eval"));
            if let Some(c) = &f.category {
                draft.insert("category".into(), json!(c));
            }
            let fs = s.to_fact_scope();
            let new_id = move || id.clone();
            let fact = normalize_fact(
                &draft,
                &NormalizeContext {
                    scope: &fs,
                    existing: None,
                    now,
                    new_id: &new_id,
                },
            )
            .map_err(|e| RankError::BadId(f.id.clone(), e.to_string()))?;
            index.upsert(&s, &fact).await?;
        }
        let mut vectors: HashMap<String, Vec<(String, Vec<f32>)>> = HashMap::new();
        if let Some(e) = &embedder {
            let texts: Vec<String> = dataset.facts.iter().map(|f| f.content.clone()).collect();
            let embedded = e.embed(&texts).await?;
            for (f, v) in dataset.facts.iter().zip(embedded) {
                vectors
                    .entry(f.user.clone())
                    .or_default()
                    .push((f.id.clone(), v));
            }
        }
        Ok(Self {
            index,
            embedder,
            vectors,
            _dir: dir,
        })
    }

    /// The modes this ranker can run: BM25 always, vector and hybrid with an embedder.
    pub fn modes(&self) -> Vec<Mode> {
        if self.embedder.is_some() {
            vec![Mode::Bm25, Mode::Vector, Mode::Hybrid]
        } else {
            vec![Mode::Bm25]
        }
    }

    /// Fact ids for `query` in `mode`, best first, at most [`CANDIDATES`].
    ///
    /// # Errors
    /// An index or embedder failure.
    pub async fn rank(&self, mode: Mode, query: &EvalQuery) -> Result<Vec<String>, RankError> {
        match mode {
            Mode::Bm25 => self.lexical(query).await,
            Mode::Vector => self.semantic(query).await,
            Mode::Hybrid => {
                let lexical = self.lexical(query).await?;
                let semantic = self.semantic(query).await?;
                Ok(reciprocal_rank_fusion(&[&lexical, &semantic])
                    .into_iter()
                    .take(CANDIDATES)
                    .map(|(id, _)| id)
                    .collect())
            }
        }
    }

    async fn lexical(&self, query: &EvalQuery) -> Result<Vec<String>, RankError> {
        let q = SearchQuery::new(query.query.clone(), scope(&query.user)?, CANDIDATES);
        let hits = self.index.search(&q).await?;
        Ok(hits
            .into_iter()
            .map(|h| h.fact.id.as_str().to_owned())
            .collect())
    }

    async fn semantic(&self, query: &EvalQuery) -> Result<Vec<String>, RankError> {
        let Some(e) = &self.embedder else {
            return Ok(Vec::new());
        };
        let q = e.embed(std::slice::from_ref(&query.query)).await?;
        let Some(qv) = q.first() else {
            return Ok(Vec::new());
        };
        let empty = Vec::new();
        let candidates = self.vectors.get(&query.user).unwrap_or(&empty);
        Ok(nearest(qv, candidates, CANDIDATES)
            .into_iter()
            .map(|(id, _)| id.clone())
            .collect())
    }
}
