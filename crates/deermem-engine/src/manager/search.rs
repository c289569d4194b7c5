//! Manager search: the storage's ranked search over the scope's index (rebuilt lazily per scope
//! until a full warm-up has run) in the requested or configured mode (`bm25`, `vector`,
//! `hybrid`; the vector modes only with an embedder), then a substring scan over the whole bucket when the index finds
//! nothing or fails; access heat under hybrid/shadow only.

use std::num::NonZeroUsize;
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use deermem_core::config::EmbeddingProvider;
use deermem_core::policy::substring::{SubstringRules, substring_search};
use deermem_core::ports::{MemorySearch, ScoredFact, SearchRequest};
use deermem_core::{
    AgentName, CacheBound, Fact, FactId, InvalidInputCode, ManagerError, MatchType, RebuildReport,
    Scope, SearchMode, SearchQuery, UserId,
};
use deermem_pycompat::py;
use lru::LruCache;

use super::DeerMemManager;

/// The largest `top_k` honoured (larger values are clamped; nothing is lost, a bucket holds at
/// most 500 facts).
pub(crate) const MAX_TOP_K: usize = 1000;

pub(crate) use deermem_core::fact::MAX_QUERY_CHARS;

/// Scopes remembered as warmed before a full warm-up; forgetting one only costs one more scoped
/// rebuild.
const WARM_SCOPES_CAP: usize = 16_384;

type ScopeKey = (Option<UserId>, AgentName);

struct WarmInner {
    fully: bool,
    scopes: LruCache<ScopeKey, ()>,
}

/// Which scopes' index entries are known to be current.
pub(super) struct WarmState(Mutex<WarmInner>);

impl WarmState {
    pub(super) fn new() -> Self {
        Self(Mutex::new(WarmInner {
            fully: false,
            scopes: LruCache::new(NonZeroUsize::new(WARM_SCOPES_CAP).unwrap_or(NonZeroUsize::MIN)),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, WarmInner> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn is_warm(&self, key: &ScopeKey) -> bool {
        let mut s = self.lock();
        s.fully || s.scopes.get(key).is_some()
    }

    fn mark(&self, key: ScopeKey) {
        self.lock().scopes.put(key, ());
    }

    fn mark_fully(&self) {
        let mut s = self.lock();
        s.fully = true;
        s.scopes.clear();
    }

    fn fully(&self) -> bool {
        self.lock().fully
    }

    /// The scopes remembered as warmed, and their bound.
    pub(super) fn cache_bound(&self) -> CacheBound {
        let held = self.lock().scopes.len();
        CacheBound::entries(WARM_SCOPES_NAME, WARM_SCOPES_CAP, Some(held))
    }
}

/// The name the warmed-scope bookkeeping is reported under.
pub(crate) const WARM_SCOPES_NAME: &str = "engine.warmed_scopes";

/// The manager's substring path: every fact of the bucket whose content contains the stripped,
/// lower-cased query (and whose category matches), by bounded confidence, highest first
/// (stable), cut to `top_k` after the category filter.
pub(super) fn substring_matches(
    facts: &[Fact],
    query: &str,
    category: Option<&str>,
    top_k: usize,
) -> Vec<ScoredFact> {
    substring_search(facts, query, category, top_k, SubstringRules::MANAGER)
        .into_iter()
        .map(|(score, f)| ScoredFact {
            fact: f.to_public(),
            score: Some(score),
            match_type: MatchType::Substring,
        })
        .collect()
}

impl DeerMemManager {
    /// Rebuilds the whole derived search index and, unless the rebuild failed as a whole, marks
    /// every scope warm (lazy per-scope rebuilds stop). Single facts that fail are counted in
    /// the report and logged; they do not make the warm-up fail. Never errors: a failure is a
    /// report with `fatal` set, and the lazy path stays on.
    pub async fn warm_retrieval(&self) -> RebuildReport {
        match self.storage.rebuild_index(None).await {
            Ok(report) => {
                if report.fatal {
                    tracing::warn!(
                        ?report,
                        "memory search index warm-up failed; scopes will be rebuilt lazily"
                    );
                } else {
                    if report.failed > 0 {
                        tracing::warn!(?report, "memory search index warm-up skipped some facts");
                    } else {
                        tracing::info!(indexed = report.indexed, "memory search index warmed");
                    }
                    self.warm.mark_fully();
                }
                report
            }
            Err(e) => {
                tracing::warn!(error = %e, "memory search index warm-up failed; scopes will be rebuilt lazily");
                RebuildReport {
                    supported: self.indexed,
                    indexed: 0,
                    failed: 0,
                    fatal: true,
                    reason: Some(e.to_string()),
                }
            }
        }
    }

    /// Whether a full warm-up has succeeded.
    pub fn retrieval_warmed(&self) -> bool {
        self.warm.fully()
    }

    /// The lazy warm-up of one scope: rebuild its index once, unless a full warm-up ran. A
    /// partial failure still marks it warm; a fatal one (or an error) is retried next time.
    async fn ensure_scope_warm(&self, user: Option<&UserId>, agent: &AgentName) {
        let key = (user.cloned(), agent.clone());
        if self.warm.is_warm(&key) {
            return;
        }
        if !self.indexed {
            self.warm.mark(key);
            return;
        }
        match self
            .storage
            .rebuild_index(Some(std::slice::from_ref(&key)))
            .await
        {
            Ok(report) if !report.supported || !report.fatal => {
                if report.failed > 0 {
                    tracing::warn!(?report, agent = %agent, "scope index rebuild skipped some facts");
                }
                self.warm.mark(key);
            }
            Ok(report) => {
                tracing::warn!(?report, agent = %agent, "scope index rebuild failed; retrying on the next search");
            }
            Err(e) => {
                tracing::warn!(error = %e, agent = %agent, "scope index rebuild failed; retrying on the next search");
            }
        }
    }

    /// The mode a search ranks by: the request's, else the configured default. A mode that
    /// ranks by embeddings is refused when no embedder is configured, rather than answered
    /// silently with BM25.
    fn search_mode(&self, requested: Option<SearchMode>) -> Result<SearchMode, ManagerError> {
        let Some(mode) = requested else {
            return Ok(self.config.default_search_mode());
        };
        if mode.uses_vectors() && self.config.embedding.provider == EmbeddingProvider::None {
            return Err(ManagerError::invalid(
                InvalidInputCode::Other,
                format!(
                    "search mode {} needs an embedder: set backend_config.embedding",
                    mode.as_str()
                ),
            ));
        }
        Ok(mode)
    }
}

#[async_trait]
impl MemorySearch for DeerMemManager {
    async fn search_scored(&self, req: SearchRequest) -> Result<Vec<ScoredFact>, ManagerError> {
        let (user, agent) = self.bucket(&req.scope)?;
        let mode = self.search_mode(req.mode)?;
        if py::strip(&req.query).is_empty() || req.top_k == 0 {
            return Ok(Vec::new());
        }
        if req.query.chars().nth(MAX_QUERY_CHARS).is_some() {
            return Err(ManagerError::invalid(
                InvalidInputCode::Other,
                format!("query is too long (at most {MAX_QUERY_CHARS} characters)"),
            ));
        }
        let top_k = req.top_k.min(MAX_TOP_K);
        let category = req.category.as_deref().filter(|c| !c.is_empty());
        self.ensure_scope_warm(user.as_ref(), &agent).await;
        let query = SearchQuery {
            text: req.query.clone(),
            scopes: vec![Scope::new(user.clone(), Some(agent.clone()))],
            top_k,
            category: category.map(str::to_owned),
            mode: Some(mode),
        };
        let hits = self.storage.search_facts(&query).await.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "memory index search failed; using the substring scan");
            Vec::new()
        });
        let mut results: Vec<ScoredFact> = hits
            .into_iter()
            .take(top_k)
            .map(|h| ScoredFact {
                fact: h.fact.to_public(),
                score: Some(h.score),
                match_type: h.match_type,
            })
            .collect();
        if results.is_empty() {
            let doc = self.storage.load(user.as_ref(), Some(&agent)).await?;
            results = substring_matches(&doc.facts, &req.query, category, top_k);
        }
        if !results.is_empty() && self.config.tracks_usage() {
            let ids: Vec<FactId> = results
                .iter()
                .filter_map(|r| FactId::new(r.fact.id.clone()).ok())
                .collect();
            if let Err(e) = self
                .storage
                .record_fact_accesses(user.as_ref(), &agent, &ids, Some(self.clock.now()))
                .await
            {
                tracing::debug!(error = %e, "could not record fact accesses");
            }
        }
        Ok(results)
    }
}
