//! Search and index types shared by the storage and retrieval ports: queries, ranked hits,
//! rebuild reports and index status.

use serde::{Deserialize, Serialize};

use crate::error::RetrievalError;
use crate::fact::Fact;
use crate::ids::Scope;

/// How a hit was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum MatchType {
    /// FTS5 full-text match ranked by BM25.
    Fts5,
    /// The CJK n-gram side index (runs of Chinese/Japanese/Korean text).
    Cjk,
    /// Case-insensitive substring scan over canonical facts.
    Substring,
    /// A remote backend's own ranking.
    Remote,
    /// Nearest by embedding similarity only (`search.mode: vector`).
    Vector,
    /// Found by both rankings fused (`search.mode: hybrid`: reciprocal rank fusion where a
    /// decisive word match stays first).
    Hybrid,
}

impl MatchType {
    /// The name the reference reports (`fts5`, `substring`...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fts5 => "fts5",
            Self::Cjk => "cjk",
            Self::Substring => "substring",
            Self::Remote => "remote",
            Self::Vector => "vector",
            Self::Hybrid => "hybrid",
        }
    }
}

/// How a search ranks (`search.mode`, `deermem search --mode`, `?mode=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum SearchMode {
    /// Words only: BM25 (plus CJK bigrams).
    Bm25,
    /// Meaning only: exact nearest neighbours of the query's embedding within the scope.
    Vector,
    /// Both rankings fused: reciprocal rank fusion (k = 60) where only word matches holding
    /// most of the query's terms count, a decisive one stays first and the others only re-rank
    /// meaning's shortlist ([`crate::policy::fusion::hybrid_fusion`]).
    Hybrid,
}

impl SearchMode {
    /// The mode's name (`bm25`, `vector`, `hybrid`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Bm25 => "bm25",
            Self::Vector => "vector",
            Self::Hybrid => "hybrid",
        }
    }

    /// Whether this mode needs an embedder.
    pub fn uses_vectors(self) -> bool {
        !matches!(self, Self::Bm25)
    }
}

/// A `mode` value that names no search mode.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a search mode; use bm25, vector or hybrid")]
pub struct UnknownSearchMode(pub String);

impl std::str::FromStr for SearchMode {
    type Err = UnknownSearchMode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "bm25" => Ok(Self::Bm25),
            "vector" => Ok(Self::Vector),
            "hybrid" => Ok(Self::Hybrid),
            _ => Err(UnknownSearchMode(s.to_owned())),
        }
    }
}

/// A search over one or more scopes.
#[derive(Clone, Debug, PartialEq)]
pub struct SearchQuery {
    /// The query text (plain words, or FTS5 syntax when it is valid).
    pub text: String,
    /// The scopes to search; results never leave them.
    pub scopes: Vec<Scope>,
    /// How many hits to return at most.
    pub top_k: usize,
    /// Only facts of this category (filtered before the `top_k` cut).
    pub category: Option<String>,
    /// How to rank; `None` takes the adapter's configured default (`hybrid` when it has an
    /// embedder, else `bm25`). An adapter without an embedder answers every mode with BM25.
    pub mode: Option<SearchMode>,
}

impl SearchQuery {
    /// A query over a single scope.
    pub fn new(text: impl Into<String>, scope: Scope, top_k: usize) -> Self {
        Self {
            text: text.into(),
            scopes: vec![scope],
            top_k,
            category: None,
            mode: None,
        }
    }

    /// Whether the query can have no results (blank text or `top_k == 0`).
    pub fn is_trivially_empty(&self) -> bool {
        deermem_pycompat::py::strip(&self.text).is_empty()
            || self.top_k == 0
            || self.scopes.is_empty()
    }
}

/// One ranked result.
#[derive(Clone, Debug, PartialEq)]
pub struct SearchHit {
    /// The fact as indexed (its canonical form at index time).
    pub fact: Fact,
    /// Higher is better.
    pub score: f64,
    /// How it matched.
    pub match_type: MatchType,
    /// The raw BM25 relevance (positive), when FTS ranked it.
    pub bm25: Option<f64>,
}

/// The outcome of an index rebuild.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RebuildReport {
    /// Whether a retrieval adapter is configured.
    pub supported: bool,
    /// Facts written to the index.
    pub indexed: usize,
    /// Facts (or files) that could not be indexed; they are logged and skipped.
    pub failed: usize,
    /// The rebuild as a whole failed (the index is unusable; lazy retry stays enabled).
    pub fatal: bool,
    /// Why nothing was done, when `supported` is false.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Retrieval configuration and health as storage reports it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RetrievalStatus {
    /// Whether an index adapter is configured.
    pub configured: bool,
    /// `external` (an adapter) or `substring_fallback`.
    pub mode: String,
    /// Adapter kind (`fts5`), when configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adapter: Option<String>,
    /// Rows (documents) in the index.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_docs: Option<u64>,
    /// Scopes waiting for a rebuild, as `user|agent`.
    #[serde(default)]
    pub dirty_scopes: Vec<String>,
    /// The last adapter error, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Index file size in bytes, when on disk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub db_bytes: Option<u64>,
    /// Index file path, when on disk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub db_path: Option<String>,
    /// Embedding coverage, when an embedder is configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vectors: Option<VectorCoverage>,
}

/// One document an index holds, as an inventory entry: enough to compare the index with the
/// canonical facts without reading the documents back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexedDoc {
    /// The scope the document was indexed under.
    pub scope: Scope,
    /// The fact id.
    pub fact_id: String,
    /// The fact revision the document was indexed at, when it carried one.
    pub revision: Option<u64>,
}

/// Statistics an index adapter reports about itself.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RetrievalStats {
    /// Adapter kind.
    pub adapter: String,
    /// Indexed documents.
    pub total_docs: u64,
    /// Index file path, if persistent.
    pub db_path: Option<String>,
    /// Index file size in bytes.
    pub db_bytes: Option<u64>,
    /// Whether word segmentation for Chinese is compiled in.
    pub jieba: bool,
    /// The last error the adapter saw.
    pub last_error: Option<String>,
    /// Embedding coverage, when the adapter has an embedder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vectors: Option<VectorCoverage>,
}

/// How much of an index has vectors of the configured model (`deermem index status`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VectorCoverage {
    /// The embedder's model id (`Embedder::model_id`).
    pub model_id: String,
    /// Its vector dimension.
    pub dimension: usize,
    /// Indexed documents with a vector of this model for their current content.
    pub embedded: u64,
    /// Indexed documents in all.
    pub total: u64,
    /// Scopes marked for re-embedding after an embedder failure, as `user|agent`.
    #[serde(default)]
    pub pending_scopes: Vec<String>,
    /// The last embedder error, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// The document a retrieval index stores for `fact` under `scope`: the fact's internal map
/// with `scope` set to the scope the index holds it under (what every index decodes back).
///
/// # Errors
/// `InvalidInput` when the scope has no agent (facts always live in an agent bucket).
pub fn index_document(
    scope: &Scope,
    fact: &Fact,
) -> Result<serde_json::Map<String, serde_json::Value>, RetrievalError> {
    if scope.agent.is_none() {
        return Err(RetrievalError::InvalidInput(
            "retrieval scope agentName must be set to index a fact".into(),
        ));
    }
    let mut map = fact.to_internal_map();
    map.insert("scope".into(), scope.to_fact_scope().to_value());
    Ok(map)
}
