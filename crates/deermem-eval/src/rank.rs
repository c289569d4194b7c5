//! The search modes over one dataset, ranked by the engine's own search path: every user's
//! facts indexed once in a throwaway FTS5 index (BM25, CJK bigrams), and, when an embedder is
//! given, wrapped in the engine's [`HybridRetrieval`] whose worker embeds them once (its
//! backfill) into the index's vector table; each query is then a [`SearchQuery`] within its
//! user's scope with `mode` set to `bm25`, `vector` or `hybrid`, so the figures are what a user
//! of the engine gets.

use std::sync::Arc;
use std::time::Duration;

use deermem_core::fact::{FactDraft, FactSource, NormalizeContext, normalize_fact};
use deermem_core::ports::{Clock, Embedder, Retrieval, VectorIndex};
use deermem_core::{
    AgentName, Fact, FactId, Scope, SearchHit, SearchMode, SearchQuery, Timestamp, UserId,
};
use deermem_engine::hybrid::HybridRetrieval;
use deermem_retrieval_fts5::{Fts5Options, Fts5Retrieval};

use crate::dataset::{Dataset, EvalFact, EvalQuery};

/// How many hits each query asks for (the ranking that is scored).
pub const CANDIDATES: usize = 50;

/// A search mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mode {
    /// Lexical: FTS5 BM25.
    Bm25,
    /// Exact nearest neighbours by cosine similarity.
    Vector,
    /// The engine's fusion of the two (`policy::fusion`).
    Hybrid,
}

impl Mode {
    /// The mode's name in reports and flags.
    pub fn as_str(self) -> &'static str {
        self.search_mode().as_str()
    }

    /// The engine's search mode.
    pub fn search_mode(self) -> SearchMode {
        match self {
            Self::Bm25 => SearchMode::Bm25,
            Self::Vector => SearchMode::Vector,
            Self::Hybrid => SearchMode::Hybrid,
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
    /// The embedder failed while the facts were embedded.
    #[error("embedder: {0}")]
    Embed(String),
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

/// The indexed (and embedded) dataset.
#[derive(Debug)]
pub struct Ranker {
    search: Arc<dyn Retrieval>,
    embedded: bool,
    _dir: tempfile::TempDir,
}

fn scope(user: &str) -> Result<Scope, RankError> {
    let id = UserId::new(user).map_err(|e| RankError::BadId(user.to_owned(), e.to_string()))?;
    Ok(Scope::new(Some(id), Some(AgentName::default_bucket())))
}

/// The fact as the engine would store it.
fn fact(f: &EvalFact, scope: &Scope, now: Timestamp) -> Result<Fact, RankError> {
    let id = FactId::new(&f.id).map_err(|e| RankError::BadId(f.id.clone(), e.to_string()))?;
    let fs = scope.to_fact_scope();
    let ctx = NormalizeContext {
        scope: &fs,
        existing: None,
        now,
        new_id: &|| id.clone(),
    };
    FactDraft::identified(id.clone(), &f.content)
        .map(|d| {
            let d = d.with_source(FactSource::from_public_string("eval"));
            match &f.category {
                Some(c) => d.with_category(c.clone()),
                None => d,
            }
        })
        .and_then(|d| normalize_fact(&d, &ctx))
        .map_err(|e| RankError::BadId(f.id.clone(), e.to_string()))
}

/// How long the harness waits between looks at the embedding worker's progress.
const POLL: Duration = Duration::from_millis(5);

/// Waits until the worker of `hybrid` has embedded every document, or fails with the
/// embedder's error.
async fn backfilled(hybrid: &HybridRetrieval) -> Result<(), RankError> {
    loop {
        let stats = hybrid.stats().await?;
        let Some(c) = stats.vectors else {
            return Err(RankError::Embed(
                "the index reports no vector coverage".into(),
            ));
        };
        if let Some(e) = c.last_error {
            return Err(RankError::Embed(e));
        }
        if c.embedded >= c.total {
            return Ok(());
        }
        tokio::time::sleep(POLL).await;
    }
}

impl Ranker {
    /// Indexes every fact; with `embedder`, wraps the index in the engine's
    /// [`HybridRetrieval`] and waits for its worker to embed every fact (once).
    ///
    /// # Errors
    /// An id the engine refuses, an index or embedder failure.
    pub async fn build(
        dataset: &Dataset,
        embedder: Option<Arc<dyn Embedder>>,
    ) -> Result<Self, RankError> {
        let dir = tempfile::tempdir()?;
        let index = Arc::new(Fts5Retrieval::open_file(
            &dir.path().join("eval.sqlite"),
            Arc::new(FixedClock),
            Fts5Options::default(),
        )?);
        let now = FixedClock.now();
        let mut facts = Vec::with_capacity(dataset.facts.len());
        for f in &dataset.facts {
            let s = scope(&f.user)?;
            let fact = fact(f, &s, now)?;
            facts.push((s, fact));
        }
        index.rebuild(None, &facts).await?;
        let Some(embedder) = embedder else {
            return Ok(Self {
                search: index,
                embedded: false,
                _dir: dir,
            });
        };
        let vectors: Arc<dyn VectorIndex> = index.clone();
        let hybrid = HybridRetrieval::new(index, vectors, embedder, SearchMode::Hybrid);
        if hybrid.has_worker() {
            backfilled(&hybrid).await?;
        } else {
            hybrid
                .embed_pending()
                .await
                .map_err(|e| RankError::Embed(e.to_string()))?;
        }
        Ok(Self {
            search: Arc::new(hybrid),
            embedded: true,
            _dir: dir,
        })
    }

    /// The modes this ranker can run: BM25 always, vector and hybrid with an embedder.
    pub fn modes(&self) -> Vec<Mode> {
        if self.embedded {
            vec![Mode::Bm25, Mode::Vector, Mode::Hybrid]
        } else {
            vec![Mode::Bm25]
        }
    }

    /// Fact ids for `query` in `mode`, best first, at most [`CANDIDATES`].
    ///
    /// # Errors
    /// An index failure (an embedder failure answers BM25, as the engine does).
    pub async fn rank(&self, mode: Mode, query: &EvalQuery) -> Result<Vec<String>, RankError> {
        Ok(self
            .hits(mode, query)
            .await?
            .into_iter()
            .map(|h| h.fact.id.as_str().to_owned())
            .collect())
    }

    /// The engine's hits for `query` in `mode`, best first, at most [`CANDIDATES`].
    ///
    /// # Errors
    /// An index failure.
    pub async fn hits(&self, mode: Mode, query: &EvalQuery) -> Result<Vec<SearchHit>, RankError> {
        let mut q = SearchQuery::new(query.query.clone(), scope(&query.user)?, CANDIDATES);
        q.mode = Some(mode.search_mode());
        Ok(self.search.search(&q).await?)
    }

    /// Every query's hits in every mode as JSON lines (`query`, `mode`, and `hits`: each
    /// hit's `id`, `score` and `bm25`), for looking at single rankings.
    ///
    /// # Errors
    /// An index failure.
    pub async fn dump(&self, dataset: &Dataset) -> Result<String, RankError> {
        let mut out = String::new();
        for mode in self.modes() {
            for q in &dataset.queries {
                let hits: Vec<serde_json::Value> = self
                    .hits(mode, q)
                    .await?
                    .into_iter()
                    .map(|h| {
                        serde_json::json!({
                            "id": h.fact.id.as_str(), "score": h.score, "bm25": h.bm25
                        })
                    })
                    .collect();
                let line = serde_json::json!({"query": q.id, "mode": mode.as_str(), "hits": hits});
                out.push_str(&line.to_string());
                out.push('\n');
            }
        }
        Ok(out)
    }

    /// Fails when the embedder failed during the searches (the engine then answered BM25 for
    /// those queries, so the vector and hybrid figures would not be the model's).
    ///
    /// # Errors
    /// The embedder's last error, or an index failure.
    pub async fn check_embedder(&self) -> Result<(), RankError> {
        let last_error = self
            .search
            .stats()
            .await?
            .vectors
            .and_then(|c| c.last_error);
        last_error.map_or(Ok(()), |e| Err(RankError::Embed(e)))
    }
}
