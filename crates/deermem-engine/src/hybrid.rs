//! Search by meaning over any retrieval adapter that can keep vectors: [`HybridRetrieval`]
//! wraps the lexical index, embeds documents behind the write and ranks `vector`/`hybrid`
//! queries.
//!
//! - **Writes** go to the index and are acknowledged as the index acknowledges them; a worker
//!   (a tokio task started by [`HybridRetrieval::new`] when a runtime is present) then embeds
//!   whatever [`VectorIndex::missing_vectors`] lists, in batches, and stores the vectors. The
//!   index is the only record of what is left to do, so a crash, a failed batch or a model
//!   change (vectors of another model id are simply missing) is picked up by the next pass; the
//!   worker makes one at start (the backfill).
//! - **An embedder failure never fails a write or a search.** It is logged and kept as
//!   `last_error`; the scopes of the batch are listed as pending in the stats' coverage; it is
//!   retried by the next write, the next vector or hybrid search of the scope, a rebuild, or
//!   the worker's backoff timer (1 s doubling to 5 min). A search whose embedding fails answers
//!   the BM25 result.
//! - **Search**: the mode is the query's or the configured default. `bm25` is the index as it
//!   is. `vector` and `hybrid` first embed up to [`INLINE_EMBED`] of the scopes' missing
//!   documents (so a fact written a moment ago is found), embed the query as a query (an
//!   in-process LRU cache keyed by model id and text answers a repeated one) and rank the
//!   scopes' vectors exactly, less each fact's similarity to the scope's centroid (hubs) and
//!   calibrated by script group so that a query's language does not outrank its meaning
//!   (`policy::fusion::nearest_calibrated`, after the category filter); `vector` answers that
//!   list cut to `top_k` (score = the corrected similarity), `hybrid` fuses it with the BM25
//!   candidates (`top_k` at least [`HYBRID_CANDIDATES`]) by the core's hybrid policy
//!   (`policy::fusion::hybrid_fusion`: reciprocal rank fusion, k = 60, where a BM25 hit counts
//!   only when it holds most of the query's terms, a decisive word match stays first and other
//!   strong word matches vote only among meaning's first five), `matchType` `hybrid` for a fact
//!   both lists found and the list's own type otherwise. Both lists come without facts where
//!   the index can (`VectorIndex::nearest`, `VectorIndex::word_ranking`); the fusion weighs
//!   numbered slots, and only the facts it weighs by their words and those the answer keeps are
//!   read (`VectorIndex::read_hits`).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use async_trait::async_trait;
use deermem_core::policy::fusion::{
    LexicalHit, coverage_matters, coverage_of, coverage_terms, hybrid_fusion,
};
use deermem_core::policy::language::script_group;
use deermem_core::ports::{Embedder, MeaningHit, MeaningQuery, Retrieval, VectorIndex};
use deermem_core::{
    CacheBound, Fact, IndexedDoc, MatchType, RetrievalError, RetrievalStats, Scope, SearchHit,
    SearchMode, SearchQuery, VectorCoverage,
};
use tokio::sync::Notify;

/// Documents embedded per embedder call by the worker and a rebuild.
pub const EMBED_BATCH: usize = 64;
/// At most this many of a query's scopes' missing documents are embedded before a vector or
/// hybrid search answers (the worker does the rest).
pub const INLINE_EMBED: usize = 64;
/// The BM25 candidates a hybrid search fuses: `max(top_k, HYBRID_CANDIDATES)`, and as many
/// nearest vectors.
pub const HYBRID_CANDIDATES: usize = 50;
/// Query embeddings kept in the process (least recently used evicted first), keyed by the
/// model identity and the query text: a repeated query costs no embedding request.
pub const QUERY_CACHE_ENTRIES: usize = 1024;
/// The name the query-embedding cache is reported under (see [`Retrieval::cache_bounds`]).
pub const QUERY_CACHE_NAME: &str = "search.query_embeddings";
/// The worker's first retry after an embedder failure; doubled per failure up to
/// [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait between retries.
const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// What the embedding side remembers: the scopes whose documents wait for a retry, and the
/// last embedder error.
#[derive(Debug, Default)]
struct EmbedState {
    pending: BTreeSet<Scope>,
    last_error: Option<String>,
}

#[derive(Debug)]
struct Shared {
    index: Arc<dyn Retrieval>,
    vectors: Arc<dyn VectorIndex>,
    embedder: Arc<dyn Embedder>,
    default_mode: SearchMode,
    state: Mutex<EmbedState>,
    closed: AtomicBool,
    query_cache: Mutex<QueryCache>,
}

/// The query-embedding cache: `(model identity, query text)` to its vector.
type QueryCache = lru::LruCache<(String, String), Arc<Vec<f32>>>;

/// Why an embedding pass stopped early.
#[derive(Debug, thiserror::Error)]
enum PassError {
    /// The embedder failed (recorded in the state).
    #[error("embedder: {0}")]
    Embedder(String),
    /// The index failed.
    #[error("index: {0}")]
    Index(RetrievalError),
}

/// A scope's label in status reports: `user|agent`.
fn scope_label(scope: &Scope) -> String {
    format!(
        "{}|{}",
        scope.user.as_ref().map_or("", |u| u.as_str()),
        scope.agent.as_ref().map_or("", |a| a.as_str())
    )
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, EmbedState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn record_failure(&self, scopes: impl IntoIterator<Item = Scope>, error: String) {
        let mut state = self.lock();
        if state.last_error.as_deref() != Some(error.as_str()) {
            tracing::warn!(model = %self.embedder.model_id(), %error,
                "embedding failed; search falls back to BM25 for the documents without vectors, and they are embedded again later");
        }
        state.pending.extend(scopes);
        state.last_error = Some(error);
    }

    /// Embeds the missing documents of `scopes` (all when `None`), at most `max` of them
    /// (unbounded when `None`); returns how many vectors were stored.
    async fn embed_missing(
        &self,
        scopes: Option<&[Scope]>,
        max: Option<usize>,
    ) -> Result<usize, PassError> {
        let model = self.embedder.model_id().to_owned();
        let dimension = self.embedder.dimension();
        let mut stored = 0usize;
        loop {
            let room = max.map_or(EMBED_BATCH, |m| m.saturating_sub(stored).min(EMBED_BATCH));
            if room == 0 || self.closed.load(Ordering::Acquire) {
                break;
            }
            let tasks = self
                .vectors
                .missing_vectors(&model, scopes, room)
                .await
                .map_err(PassError::Index)?;
            if tasks.is_empty() {
                self.succeeded(scopes);
                break;
            }
            let texts: Vec<String> = tasks.iter().map(|t| t.text.clone()).collect();
            let vectors = match self.embedder.embed(&texts).await {
                Ok(v) if v.len() == tasks.len() && v.iter().all(|x| x.len() == dimension) => Ok(v),
                Ok(v) => Err(format!(
                    "the embedder answered {} vectors for {} texts, or a vector not of dimension {dimension}",
                    v.len(),
                    tasks.len()
                )),
                Err(e) => Err(e.to_string()),
            };
            let vectors = match vectors {
                Ok(v) => v,
                Err(e) => {
                    self.record_failure(tasks.into_iter().map(|t| t.scope), e.clone());
                    return Err(PassError::Embedder(e));
                }
            };
            let n = self
                .vectors
                .put_vectors(&model, &tasks, &vectors)
                .await
                .map_err(PassError::Index)?;
            stored += n;
            if n == 0 {
                // Everything listed changed meanwhile: it is listed again next time.
                break;
            }
            if tasks.len() < room {
                self.succeeded(scopes);
                break;
            }
        }
        Ok(stored)
    }

    /// A pass over `scopes` (all when `None`) found nothing left to embed: they are no longer
    /// pending, and an empty pending list clears the last error.
    fn succeeded(&self, scopes: Option<&[Scope]>) {
        let mut state = self.lock();
        match scopes {
            None => state.pending.clear(),
            Some(list) => {
                for s in list {
                    state.pending.remove(s);
                }
            }
        }
        if state.pending.is_empty() && state.last_error.take().is_some() {
            tracing::info!(model = %self.embedder.model_id(), "embedding works again");
        }
    }

    async fn bm25(&self, query: &SearchQuery) -> Result<Vec<SearchHit>, RetrievalError> {
        let mut q = query.clone();
        q.mode = Some(SearchMode::Bm25);
        self.index.search(&q).await
    }

    /// The ranking by meaning (hits not yet read), or `None` when the embedder failed (the
    /// caller answers BM25). Documents of the scopes still without a vector are embedded first
    /// (at most [`INLINE_EMBED`]) when the index says some are missing.
    async fn by_meaning(
        &self,
        query: &SearchQuery,
        limit: usize,
    ) -> Result<Option<Vec<MeaningHit>>, RetrievalError> {
        let Some(query_vector) = self.query_vector(query).await else {
            return Ok(None);
        };
        let asked = MeaningQuery {
            scopes: &query.scopes,
            model_id: self.embedder.model_id(),
            vector: &query_vector,
            // The documents' script groups are the index's derived tag; the query's is here.
            group: script_group(&query.text),
            category: query.category.as_deref(),
            limit,
        };
        let ranking = self.vectors.nearest(&asked).await?;
        if !ranking.missing {
            // Nothing of these scopes waits for embedding.
            self.succeeded(Some(&query.scopes));
            return Ok(Some(ranking.hits));
        }
        match self
            .embed_missing(Some(&query.scopes), Some(INLINE_EMBED))
            .await
        {
            // Asked again even when this pass stored nothing: the worker may have embedded
            // them meanwhile.
            Ok(_) => Ok(Some(self.vectors.nearest(&asked).await?.hits)),
            Err(PassError::Embedder(_)) => Ok(None),
            Err(PassError::Index(e)) => Err(e),
        }
    }

    /// The query's embedding, from the cache or the embedder (then cached); `None` when the
    /// embedder failed (recorded).
    async fn query_vector(&self, query: &SearchQuery) -> Option<Arc<Vec<f32>>> {
        let key = (self.embedder.model_id().to_owned(), query.text.clone());
        if let Some(v) = self
            .query_cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
        {
            return Some(Arc::clone(v));
        }
        match self
            .embedder
            .embed_queries(std::slice::from_ref(&query.text))
            .await
        {
            Ok(mut v) if v.len() == 1 => {
                let vector = Arc::new(v.swap_remove(0));
                self.query_cache
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .put(key, Arc::clone(&vector));
                Some(vector)
            }
            answer => {
                let e = match answer {
                    Ok(v) => format!("the embedder answered {} vectors for 1 query", v.len()),
                    Err(e) => e.to_string(),
                };
                self.record_failure(query.scopes.iter().cloned(), e);
                None
            }
        }
    }

    async fn search(&self, query: &SearchQuery) -> Result<Vec<SearchHit>, RetrievalError> {
        let mode = query.mode.unwrap_or(self.default_mode);
        if query.is_trivially_empty() || !mode.uses_vectors() {
            return self.bm25(query).await;
        }
        let top_k = query.top_k;
        if mode == SearchMode::Vector {
            return match self.by_meaning(query, top_k).await? {
                Some(mut list) => {
                    self.vectors.read_hits(&mut list).await?;
                    Ok(list
                        .into_iter()
                        .filter_map(|hit| {
                            Some(SearchHit {
                                fact: hit.fact?,
                                score: f64::from(hit.score),
                                match_type: MatchType::Vector,
                                bm25: None,
                            })
                        })
                        .collect())
                }
                None => self.bm25(query).await,
            };
        }
        let wide = top_k.max(HYBRID_CANDIDATES);
        let mut lexical_query = query.clone();
        lexical_query.top_k = wide;
        lexical_query.mode = Some(SearchMode::Bm25);
        // Both rankings at once: each waits on its own blocking-pool task.
        let (semantic, lexical) =
            tokio::join!(self.by_meaning(query, wide), self.words(&lexical_query));
        let Some(semantic) = semantic? else {
            // The embedder failed: BM25 alone, with the `top_k` asked (its candidates differ).
            return self.bm25(query).await;
        };
        fuse(self.vectors.as_ref(), query, lexical?, semantic).await
    }

    /// The BM25 candidates of a hybrid search: ranked without their facts when the index can
    /// ([`VectorIndex::word_ranking`]), else searched with them.
    async fn words(&self, query: &SearchQuery) -> Result<Vec<Lexical>, RetrievalError> {
        if let Some(hits) = self.vectors.word_ranking(query).await? {
            return Ok(hits
                .into_iter()
                .map(|h| Lexical {
                    place: place_of(&query.scopes, &h.scope),
                    fact_id: h.fact_id,
                    scope: Some(h.scope),
                    fact: None,
                    bm25: Some(h.bm25),
                    match_type: h.match_type,
                })
                .collect());
        }
        Ok(self
            .bm25(query)
            .await?
            .into_iter()
            .map(|h| Lexical {
                place: place(
                    &query.scopes,
                    h.fact.scope.user_id.as_deref(),
                    h.fact.scope.agent_name.as_deref(),
                ),
                fact_id: h.fact.id.as_str().to_owned(),
                scope: None,
                bm25: h.bm25,
                match_type: h.match_type,
                fact: Some(h.fact),
            })
            .collect())
    }

    /// One worker pass over everything; `true` when it failed on the embedder.
    async fn pass(&self) -> bool {
        match self.embed_missing(None, None).await {
            Ok(n) => {
                if n > 0 {
                    tracing::debug!(stored = n, model = %self.embedder.model_id(), "vectors stored");
                }
                false
            }
            Err(PassError::Embedder(_)) => true,
            Err(PassError::Index(e)) => {
                tracing::warn!(error = %e, "the embedding worker cannot read the index; it tries again on the next write");
                false
            }
        }
    }
}

/// A BM25 candidate of a hybrid search: where its scope sits among the query's ([`place`]), its
/// id, where to read its fact (when the index ranked without reading it) or the fact, its BM25
/// relevance and how it matched.
#[derive(Debug)]
struct Lexical {
    place: usize,
    fact_id: String,
    scope: Option<Scope>,
    fact: Option<Fact>,
    bm25: Option<f64>,
    match_type: MatchType,
}

/// The position of the scope `(user, agent)` among `scopes` (`usize::MAX` outside them): with
/// the fact id, a fact's identity in both rankings, found without allocating.
fn place(scopes: &[Scope], user: Option<&str>, agent: Option<&str>) -> usize {
    scopes
        .iter()
        .position(|s| {
            s.user.as_ref().map(|u| u.as_str()) == user
                && s.agent.as_ref().map(|a| a.as_str()) == agent
        })
        .unwrap_or(usize::MAX)
}

/// [`place`] of an index scope.
fn place_of(scopes: &[Scope], scope: &Scope) -> usize {
    scopes.iter().position(|s| s == scope).unwrap_or(usize::MAX)
}

/// One fact of either ranking. The fusion weighs facts by their number (their slot's index),
/// so it compares and hashes numbers rather than scopes and ids.
#[derive(Debug, Default)]
struct Slot {
    place: usize,
    fact_id: String,
    /// Where to read the fact, while it is unread.
    scope: Option<Scope>,
    fact: Option<Fact>,
    /// BM25's relevance and match type, when BM25 found it.
    words: Option<(Option<f64>, MatchType)>,
    /// Whether the ranking by meaning found it.
    meaning: bool,
}

impl Slot {
    fn fill(&mut self, place: usize, fact_id: String, scope: Option<Scope>, fact: Option<Fact>) {
        if self.fact_id.is_empty() {
            self.place = place;
            self.fact_id = fact_id;
        }
        if self.fact.is_none() {
            self.fact = fact;
        }
        if self.scope.is_none() {
            self.scope = scope;
        }
    }
}

/// Fuses the BM25 candidates and the ranking by meaning by the core's hybrid policy
/// (`policy::fusion::hybrid_fusion`, each BM25 hit weighed by its coverage of the query's
/// terms), cut to `top_k`. Only the facts the policy weighs by their words
/// (`coverage_matters`) and those the answer keeps are read.
async fn fuse(
    vectors: &dyn VectorIndex,
    query: &SearchQuery,
    lexical: Vec<Lexical>,
    semantic: Vec<MeaningHit>,
) -> Result<Vec<SearchHit>, RetrievalError> {
    let scopes = &query.scopes;
    // Each hit by meaning's place among the query's scopes, worked out once.
    let semantic_places: Vec<usize> = semantic
        .iter()
        .map(|h| place_of(scopes, &h.scope))
        .collect();
    // Number each fact once, by its place and id.
    let (lexical_numbers, semantic_numbers, count) = {
        let mut numbers: HashMap<(usize, &str), usize> =
            HashMap::with_capacity(lexical.len() + semantic.len());
        let keys = (semantic_places.iter().zip(&semantic))
            .map(|(&place, h)| (place, h.fact_id.as_str()))
            .chain(lexical.iter().map(|l| (l.place, l.fact_id.as_str())));
        let mut all: Vec<usize> = Vec::with_capacity(lexical.len() + semantic.len());
        for key in keys {
            let next = numbers.len();
            all.push(*numbers.entry(key).or_insert(next));
        }
        let by_words = all.split_off(semantic.len());
        let by_meaning = all;
        (by_words, by_meaning, numbers.len())
    };
    let mut slots: Vec<Slot> = (0..count).map(|_| Slot::default()).collect();
    for ((&n, place), h) in semantic_numbers.iter().zip(semantic_places).zip(semantic) {
        slots[n].fill(place, h.fact_id, Some(h.scope), h.fact);
        slots[n].meaning = true;
    }
    for (&n, l) in lexical_numbers.iter().zip(lexical) {
        slots[n].fill(l.place, l.fact_id, l.scope, l.fact);
        slots[n].words = Some((l.bm25, l.match_type));
    }
    // The facts weighed by their words, and meaning's first `top_k` (which the answer keeps
    // unless a decisive word match displaces one), in one read.
    let weighed: Vec<bool> = (lexical_numbers.iter().enumerate())
        .map(|(rank, n)| coverage_matters(rank, n, &semantic_numbers))
        .collect();
    let first: Vec<usize> = (lexical_numbers.iter().zip(&weighed))
        .filter_map(|(n, w)| w.then_some(*n))
        .chain(semantic_numbers.iter().take(query.top_k).copied())
        .collect();
    read(vectors, scopes, &mut slots, first).await?;
    let terms = coverage_terms(&query.text);
    let lexical_hits: Vec<LexicalHit<usize>> = (lexical_numbers.iter().zip(&weighed))
        .map(|(&n, &w)| LexicalHit {
            id: n,
            bm25: slots[n].words.and_then(|(bm25, _)| bm25).unwrap_or(0.0),
            coverage: match &slots[n].fact {
                Some(f) if w => coverage_of(&terms, &f.content),
                _ => 0.0,
            },
        })
        .collect();
    let fused: Vec<(usize, f64)> = hybrid_fusion(&lexical_hits, &semantic_numbers)
        .into_iter()
        .take(query.top_k)
        .collect();
    read(
        vectors,
        scopes,
        &mut slots,
        fused.iter().map(|(n, _)| *n).collect(),
    )
    .await?;
    Ok(fused
        .into_iter()
        .filter_map(|(n, score)| {
            let slot = &mut slots[n];
            let (match_type, bm25) = match slot.words {
                Some((bm25, _)) if slot.meaning => (MatchType::Hybrid, bm25),
                Some((bm25, found_as)) => (found_as, bm25),
                None => (MatchType::Vector, None),
            };
            Some(SearchHit {
                fact: slot.fact.take()?,
                score,
                match_type,
                bm25,
            })
        })
        .collect())
}

/// Reads the facts of the slots `numbers` not read yet, in one [`VectorIndex::read_hits`]; a
/// fact whose document is gone meanwhile stays unread (the answer drops it).
async fn read(
    vectors: &dyn VectorIndex,
    scopes: &[Scope],
    slots: &mut [Slot],
    numbers: Vec<usize>,
) -> Result<(), RetrievalError> {
    let mut wanted = Vec::new();
    let mut hits = Vec::new();
    for n in numbers {
        let slot = &mut slots[n];
        if slot.fact.is_some() {
            continue;
        }
        // Taken, so a slot asked twice is read once.
        if let Some(scope) = slot.scope.take() {
            hits.push(MeaningHit {
                scope,
                fact_id: slot.fact_id.clone(),
                score: 0.0,
                fact: None,
            });
            wanted.push(n);
        }
    }
    if hits.is_empty() {
        return Ok(());
    }
    vectors.read_hits(&mut hits).await?;
    // `read_hits` keeps the order and drops the hits whose document is gone.
    let mut next = wanted.into_iter();
    for hit in hits {
        let place = place_of(scopes, &hit.scope);
        if let Some(n) = next.find(|&n| slots[n].fact_id == hit.fact_id && slots[n].place == place)
        {
            slots[n].fact = hit.fact;
        }
    }
    Ok(())
}

/// The embedding worker: a pass at start (backfill, model change), then one per wake-up (a
/// write, a rebuild) or, after an embedder failure, per backoff period. Holds the shared state
/// weakly, so dropping the retrieval ends it.
async fn worker(shared: Weak<Shared>, wake: Arc<Notify>) {
    let mut backoff: Option<Duration> = None;
    loop {
        let (failed, streak) = {
            let Some(shared) = shared.upgrade() else {
                return;
            };
            if shared.closed.load(Ordering::Acquire) {
                return;
            }
            // A search or rebuild that succeeded meanwhile ended the failure streak.
            let streak = shared.lock().last_error.is_some();
            (shared.pass().await, streak)
        };
        backoff = match (failed, backoff) {
            (false, _) => None,
            (true, Some(b)) if streak => Some((b * 2).min(MAX_BACKOFF)),
            (true, _) => Some(FIRST_BACKOFF),
        };
        match backoff {
            Some(wait) => {
                tokio::select! {
                    () = wake.notified() => {}
                    () = tokio::time::sleep(wait) => {}
                }
            }
            None => wake.notified().await,
        }
    }
}

/// A retrieval adapter with an embedder: lexical search from `index`, vectors in `vectors`
/// (usually the same adapter), queries ranked by their mode or `default_mode`.
#[derive(Debug)]
pub struct HybridRetrieval {
    shared: Arc<Shared>,
    wake: Arc<Notify>,
    worker: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl HybridRetrieval {
    /// Wraps `index`; vectors of `embedder`'s model are kept in `vectors`. Inside a tokio
    /// runtime the embedding worker starts at once and embeds whatever is missing (a new model
    /// re-embeds everything); without one, documents are embedded at search and rebuild.
    pub fn new(
        index: Arc<dyn Retrieval>,
        vectors: Arc<dyn VectorIndex>,
        embedder: Arc<dyn Embedder>,
        default_mode: SearchMode,
    ) -> Self {
        let shared = Arc::new(Shared {
            index,
            vectors,
            embedder,
            default_mode,
            state: Mutex::new(EmbedState::default()),
            closed: AtomicBool::new(false),
            query_cache: Mutex::new(lru::LruCache::new(
                std::num::NonZeroUsize::MIN.saturating_add(QUERY_CACHE_ENTRIES - 1),
            )),
        });
        let wake = Arc::new(Notify::new());
        let worker = tokio::runtime::Handle::try_current()
            .ok()
            .map(|h| h.spawn(worker(Arc::downgrade(&shared), Arc::clone(&wake))));
        Self {
            shared,
            wake,
            worker: Mutex::new(worker),
        }
    }

    /// The embedder.
    pub fn embedder(&self) -> &Arc<dyn Embedder> {
        &self.shared.embedder
    }

    /// The vector store.
    pub fn vectors(&self) -> &Arc<dyn VectorIndex> {
        &self.shared.vectors
    }

    /// Whether a background worker embeds behind the writes (a runtime was present at `new`).
    pub fn has_worker(&self) -> bool {
        self.worker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    /// Embeds everything missing now, on the caller's task (what the worker does in the
    /// background); returns how many vectors were stored.
    ///
    /// # Errors
    /// The embedder's failure (also recorded for the stats), or the index's.
    pub async fn embed_pending(&self) -> Result<usize, RetrievalError> {
        self.shared
            .embed_missing(None, None)
            .await
            .map_err(|e| match e {
                PassError::Index(e) => e,
                PassError::Embedder(e) => RetrievalError::Unavailable(format!("embedder: {e}")),
            })
    }

    /// The embedding coverage the stats report.
    async fn coverage(&self) -> Result<VectorCoverage, RetrievalError> {
        let model = self.shared.embedder.model_id();
        let (embedded, total) = self.shared.vectors.vector_coverage(model).await?;
        let state = self.shared.lock();
        Ok(VectorCoverage {
            model_id: model.to_owned(),
            dimension: self.shared.embedder.dimension(),
            embedded,
            total,
            pending_scopes: state.pending.iter().map(scope_label).collect(),
            last_error: state.last_error.clone(),
        })
    }
}

impl Drop for HybridRetrieval {
    fn drop(&mut self) {
        if let Some(h) = self
            .worker
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            h.abort();
        }
    }
}

#[async_trait]
impl Retrieval for HybridRetrieval {
    fn kind(&self) -> &'static str {
        self.shared.index.kind()
    }

    async fn upsert(&self, scope: &Scope, fact: &Fact) -> Result<(), RetrievalError> {
        self.shared.index.upsert(scope, fact).await?;
        self.wake.notify_one();
        Ok(())
    }

    async fn remove(&self, scope: &Scope, id: &str) -> Result<(), RetrievalError> {
        self.shared.index.remove(scope, id).await
    }

    async fn search(&self, query: &SearchQuery) -> Result<Vec<SearchHit>, RetrievalError> {
        self.shared.search(query).await
    }

    async fn clear(&self, scopes: Option<&[Scope]>) -> Result<(), RetrievalError> {
        self.shared.index.clear(scopes).await?;
        // Nothing of a cleared scope waits for embedding any more.
        self.shared.succeeded(scopes);
        Ok(())
    }

    async fn rebuild(
        &self,
        scopes: Option<&[Scope]>,
        facts: &[(Scope, Fact)],
    ) -> Result<usize, RetrievalError> {
        let n = self.shared.index.rebuild(scopes, facts).await?;
        // Best effort: an embedder failure is recorded for the stats, the rebuild stands.
        if let Err(e) = self.shared.embed_missing(scopes, None).await {
            tracing::warn!(error = %e, "the rebuilt documents could not all be embedded; they are embedded again later");
        }
        Ok(n)
    }

    async fn stats(&self) -> Result<RetrievalStats, RetrievalError> {
        let mut stats = self.shared.index.stats().await?;
        match self.coverage().await {
            Ok(c) => stats.vectors = Some(c),
            Err(e) => tracing::warn!(error = %e, "embedding coverage unavailable"),
        }
        Ok(stats)
    }

    async fn inventory(&self) -> Result<Vec<IndexedDoc>, RetrievalError> {
        self.shared.index.inventory().await
    }

    async fn indexed_scopes(&self) -> Result<Vec<Scope>, RetrievalError> {
        self.shared.index.indexed_scopes().await
    }

    async fn close(&self) {
        self.shared.closed.store(true, Ordering::Release);
        let worker = self
            .worker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(h) = worker {
            // A pass stops between batches; one in an embedder call is cut short (its
            // documents stay missing and are embedded after the next start).
            h.abort();
            let _ = h.await;
        }
        self.shared.index.close().await;
    }

    fn take_stale_scopes(&self) -> Vec<Scope> {
        self.shared.index.take_stale_scopes()
    }

    /// The query-embedding cache ([`QUERY_CACHE_ENTRIES`]) and the index's caches.
    fn cache_bounds(&self) -> Vec<CacheBound> {
        let held = self
            .shared
            .query_cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        let mut out = vec![CacheBound::entries(
            QUERY_CACHE_NAME,
            QUERY_CACHE_ENTRIES,
            Some(held),
        )];
        out.extend(self.shared.index.cache_bounds());
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn fact(id: &str) -> Fact {
        let s = deermem_testkit::retrieval::scope(Some("alice"), "coder");
        deermem_testkit::retrieval::fact(&s, id, &format!("fact {id}"), "context", 0.5)
    }

    fn meaning(id: &str, score: f32) -> MeaningHit {
        MeaningHit {
            scope: deermem_testkit::retrieval::scope(Some("alice"), "coder"),
            fact_id: id.to_owned(),
            score,
            fact: Some(fact(id)),
        }
    }

    fn semantic_of(ids: &[&str]) -> Vec<MeaningHit> {
        ids.iter().map(|id| meaning(id, 0.5)).collect()
    }

    /// [`fuse`]'s answer when every fact is already read (nothing is read from the index).
    fn fuse_hits(
        query: &str,
        lexical: Vec<SearchHit>,
        semantic: Vec<MeaningHit>,
        top_k: usize,
    ) -> Vec<SearchHit> {
        let clock = Arc::new(deermem_testkit::clock::ManualClock::at(
            "2026-01-01T00:00:00Z",
        ));
        let index = deermem_retrieval_fts5::Fts5Retrieval::in_memory(clock).unwrap();
        let s = deermem_testkit::retrieval::scope(Some("alice"), "coder");
        let lexical = lexical
            .into_iter()
            .map(|h| Lexical {
                place: 0,
                fact_id: h.fact.id.as_str().to_owned(),
                scope: None,
                bm25: h.bm25,
                match_type: h.match_type,
                fact: Some(h.fact),
            })
            .collect();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(fuse(
            &index,
            &SearchQuery::new(query, s, top_k),
            lexical,
            semantic,
        ))
        .unwrap()
    }

    /// Hits ranked without their facts are read: those the fusion weighs by their words before
    /// it, those the answer keeps after it (`b` here, a word match filling a short list by
    /// meaning); a kept hit whose document is gone is dropped.
    #[test]
    fn unread_hits_the_answer_keeps_are_read() {
        let clock = Arc::new(deermem_testkit::clock::ManualClock::at(
            "2026-01-01T00:00:00Z",
        ));
        let index = deermem_retrieval_fts5::Fts5Retrieval::in_memory(clock).unwrap();
        let s = deermem_testkit::retrieval::scope(Some("alice"), "coder");
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        for id in ["a", "b", "d"] {
            rt.block_on(index.upsert(&s, &fact(id))).unwrap();
        }
        let unread = |id: &str, bm25: f64| Lexical {
            place: 0,
            fact_id: id.to_owned(),
            scope: Some(s.clone()),
            fact: None,
            bm25: Some(bm25),
            match_type: MatchType::Fts5,
        };
        // `c` is not in the index: it is dropped when read.
        let lexical = vec![unread("a", 3.0), unread("c", 2.5), unread("b", 2.0)];
        let semantic = vec![MeaningHit {
            fact: None,
            ..meaning("d", 0.5)
        }];
        let q = SearchQuery::new("zzz", s.clone(), 3);
        let got = rt.block_on(fuse(&index, &q, lexical, semantic)).unwrap();
        let seen: Vec<(&str, MatchType, &str)> = got
            .iter()
            .map(|h| (h.fact.id.as_str(), h.match_type, h.fact.content.as_str()))
            .collect();
        assert_eq!(
            seen,
            vec![
                ("d", MatchType::Vector, "fact d"),
                ("a", MatchType::Fts5, "fact a"),
            ]
        );
        let q = SearchQuery::new("zzz", s.clone(), 4);
        let lexical = vec![unread("a", 3.0), unread("c", 2.5), unread("b", 2.0)];
        let got = rt.block_on(fuse(&index, &q, lexical, Vec::new())).unwrap();
        let ids: Vec<&str> = got.iter().map(|h| h.fact.id.as_str()).collect();
        assert_eq!(ids, vec!["a", "b"]);
    }

    fn hit(id: &str, match_type: MatchType) -> SearchHit {
        SearchHit {
            fact: fact(id),
            score: 1.0,
            match_type,
            bm25: Some(2.0),
        }
    }

    /// A fact both lists found is `hybrid`, one only BM25 found keeps `fts5`/`cjk` and its
    /// BM25, one only the vectors found is `vector`; the order and scores are the core's
    /// hybrid policy (`a` is not among meaning's shortlist, so it does not vote and follows).
    #[test]
    fn fusion_sets_the_match_type_by_the_lists_that_found_a_fact() {
        let lexical = vec![hit("a", MatchType::Fts5), hit("b", MatchType::Cjk)];
        let semantic = vec![meaning("b", 0.9), meaning("c", 0.8)];
        let fused = fuse_hits("fact", lexical, semantic, 10);
        let got: Vec<(&str, MatchType)> = fused
            .iter()
            .map(|h| (h.fact.id.as_str(), h.match_type))
            .collect();
        assert_eq!(
            got,
            vec![
                ("b", MatchType::Hybrid),
                ("c", MatchType::Vector),
                ("a", MatchType::Fts5)
            ]
        );
        assert!((fused[0].score - (1.0 / 62.0 + 1.0 / 61.0)).abs() < 1e-12);
        assert_eq!(fused[1].bm25, None);
        assert_eq!(fused[2].bm25, Some(2.0));
        assert!(fused[2].score.abs() < 1e-12);
        // A decisive word match (the only BM25 hit) is first with the highest fused score.
        let decisive = fuse_hits(
            "fact a",
            vec![hit("a", MatchType::Fts5)],
            semantic_of(&["c", "d"]),
            10,
        );
        assert_eq!(decisive[0].fact.id.as_str(), "a");
        assert!((decisive[0].score - 2.0 / 61.0).abs() < 1e-12);
        // The same hit holding only half of a question's terms is weak: meaning leads.
        let weak = fuse_hits(
            "what about fact a",
            vec![hit("a", MatchType::Fts5)],
            semantic_of(&["c", "d"]),
            10,
        );
        assert_eq!(
            weak.iter().map(|h| h.fact.id.as_str()).collect::<Vec<_>>(),
            vec!["c", "d", "a"]
        );
        assert_eq!(
            fuse_hits(
                "a",
                vec![hit("a", MatchType::Fts5)],
                vec![meaning("c", 0.1)],
                1
            )
            .len(),
            1
        );
    }
}
