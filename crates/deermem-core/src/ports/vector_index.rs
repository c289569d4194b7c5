//! The `VectorIndex` port: embedding vectors stored beside a retrieval index, as derived data
//! tagged with the model that made them.

use std::fmt::Debug;

use async_trait::async_trait;

use crate::error::RetrievalError;
use crate::fact::Fact;
use crate::ids::Scope;
use crate::policy::fusion::nearest_calibrated;
use crate::policy::language::{ScriptGroup, script_group};
use crate::search::{MatchType, SearchQuery};

/// An indexed document that has no vector of the current model for its current text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmbedTask {
    /// The scope the document is indexed under.
    pub scope: Scope,
    /// The fact id.
    pub fact_id: String,
    /// The text to embed (the fact's content).
    pub text: String,
}

/// A ranking by meaning asked of [`VectorIndex::nearest`].
#[derive(Clone, Copy, Debug)]
pub struct MeaningQuery<'a> {
    /// The scopes searched.
    pub scopes: &'a [Scope],
    /// The model whose vectors are ranked.
    pub model_id: &'a str,
    /// The query's embedding (documents of another dimension are not ranked).
    pub vector: &'a [f32],
    /// The query's script group, for the calibration by script.
    pub group: ScriptGroup,
    /// Only facts of this category (`Fact::category_or_default`), when set.
    pub category: Option<&'a str>,
    /// The most hits answered.
    pub limit: usize,
}

/// A fact found by meaning: where it is, its score, and the fact once read.
#[derive(Clone, Debug)]
pub struct MeaningHit {
    /// The scope the fact is indexed under.
    pub scope: Scope,
    /// The fact id.
    pub fact_id: String,
    /// The corrected similarity (`policy::fusion::nearest_calibrated`).
    pub score: f32,
    /// The fact as indexed; `None` until [`VectorIndex::read_hits`] reads it (an index may
    /// rank without reading the facts, so only the hits a search keeps are read).
    pub fact: Option<Fact>,
}

/// A BM25 hit of [`VectorIndex::word_ranking`]: where it is, how it matched, its fact unread.
#[derive(Clone, Debug)]
pub struct WordHit {
    /// The scope the fact is indexed under.
    pub scope: Scope,
    /// The fact id.
    pub fact_id: String,
    /// Its raw BM25 relevance (positive, higher is better).
    pub bm25: f64,
    /// How it matched (`Fts5`, or `Cjk` when only the CJK side did).
    pub match_type: MatchType,
}

/// What [`VectorIndex::nearest`] answers.
#[derive(Clone, Debug, Default)]
pub struct MeaningRanking {
    /// The best hits, best first.
    pub hits: Vec<MeaningHit>,
    /// Whether some document of the scopes may lack a current vector (an index that cannot
    /// tell cheaply answers `true`): the caller embeds the missing ones and asks again.
    pub missing: bool,
}

/// Vectors kept beside a search index (the same SQLite file, the same database).
///
/// # Contract
/// - A vector belongs to one indexed document `(scope, fact id)` and is tagged with the model
///   id that made it and the text it was made from; it is current only while the document
///   still holds that text and the model id matches. Removing a document or clearing its
///   scope deletes its vector; rebuilding a scope deletes the vectors of the documents the
///   rebuild no longer holds and keeps those whose document has the same text again (a
///   vector is a function of the text, so re-embedding it would give the same vector).
/// - At most one vector is kept per document: storing one of another model replaces it.
/// - `missing_vectors` lists documents without a current vector of the model, so a failed or
///   interrupted embedding is simply found again (nothing else records it).
/// - `put_vectors` ignores a task whose document vanished or whose text changed since it was
///   listed (its newer text is listed again).
/// - `scope_vectors` returns only documents of the given scopes with a current vector.
/// - A stored vector that cannot be read back (a damaged row) is treated as missing, never
///   as an error or a panic.
#[async_trait]
pub trait VectorIndex: Send + Sync + Debug {
    /// Up to `limit` documents (of `scopes`, or of the whole index) without a current vector
    /// of `model_id`.
    ///
    /// # Errors
    /// `Unavailable`/`Backend` on index failure.
    async fn missing_vectors(
        &self,
        model_id: &str,
        scopes: Option<&[Scope]>,
        limit: usize,
    ) -> Result<Vec<EmbedTask>, RetrievalError>;

    /// Stores one vector per task (same order); returns how many were stored.
    ///
    /// # Errors
    /// `InvalidInput` when the lengths differ; `Unavailable`/`Backend` on index failure.
    async fn put_vectors(
        &self,
        model_id: &str,
        tasks: &[EmbedTask],
        vectors: &[Vec<f32>],
    ) -> Result<usize, RetrievalError>;

    /// The documents of `scopes` that have a current vector of `model_id`, with the fact as
    /// indexed and its vector.
    ///
    /// # Errors
    /// `Unavailable`/`Backend` on index failure.
    async fn scope_vectors(
        &self,
        scopes: &[Scope],
        model_id: &str,
    ) -> Result<Vec<(Fact, Vec<f32>)>, RetrievalError>;

    /// [`VectorIndex::scope_vectors`] with each document's script group, the tag the ranking
    /// by meaning calibrates by (`policy::language`). An index that stores the tag as a
    /// derived field (the FTS5 adapter's `docs.script`) answers it from there; the default
    /// derives it from the fact's text.
    ///
    /// # Errors
    /// As [`VectorIndex::scope_vectors`].
    async fn scope_vectors_tagged(
        &self,
        scopes: &[Scope],
        model_id: &str,
    ) -> Result<Vec<(Fact, Vec<f32>, ScriptGroup)>, RetrievalError> {
        Ok(self
            .scope_vectors(scopes, model_id)
            .await?
            .into_iter()
            .map(|(fact, v)| {
                let group = script_group(&fact.content);
                (fact, v, group)
            })
            .collect())
    }

    /// The `limit` facts of the query's scopes nearest to its vector, ranked by
    /// `policy::fusion::nearest_calibrated` over the documents with a current vector of the
    /// model (of the category, when one is set, and of the query's dimension).
    ///
    /// The default reads [`VectorIndex::scope_vectors_tagged`] and answers the hits with their
    /// facts, `missing: true`. An index may answer hits without facts (read later by
    /// [`VectorIndex::read_hits`]) and tell whether anything is missing.
    ///
    /// # Errors
    /// As [`VectorIndex::scope_vectors`].
    async fn nearest(&self, query: &MeaningQuery<'_>) -> Result<MeaningRanking, RetrievalError> {
        let candidates: Vec<((Fact, ScriptGroup), Vec<f32>)> = self
            .scope_vectors_tagged(query.scopes, query.model_id)
            .await?
            .into_iter()
            .filter(|(fact, v, _)| {
                v.len() == query.vector.len()
                    && query
                        .category
                        .is_none_or(|c| fact.category_or_default() == c)
            })
            .map(|(fact, v, group)| ((fact, group), v))
            .collect();
        let hits = nearest_calibrated(
            query.vector,
            query.group,
            &candidates,
            |(_, group)| *group,
            query.limit,
        )
        .into_iter()
        .filter_map(|((fact, _), score)| {
            let scope = query
                .scopes
                .iter()
                .find(|s| s.to_fact_scope() == fact.scope)?;
            Some(MeaningHit {
                scope: scope.clone(),
                fact_id: fact.id.as_str().to_owned(),
                score,
                fact: Some(fact.clone()),
            })
        })
        .collect();
        Ok(MeaningRanking {
            hits,
            missing: true,
        })
    }

    /// The BM25 hits [`crate::ports::Retrieval::search`] answers `query` in `bm25` mode, in the
    /// same order, without reading their facts: for a caller that keeps a few of them and reads
    /// those with [`VectorIndex::read_hits`] (the hybrid search). `None`, the default: the index
    /// cannot, and the caller searches.
    ///
    /// # Errors
    /// As `search`.
    async fn word_ranking(
        &self,
        _query: &SearchQuery,
    ) -> Result<Option<Vec<WordHit>>, RetrievalError> {
        Ok(None)
    }

    /// Reads the fact of every hit that has none; a hit whose document is gone meanwhile is
    /// dropped. The default keeps the hits that have their fact (the default
    /// [`VectorIndex::nearest`] answers them all with one).
    ///
    /// # Errors
    /// `Unavailable`/`Backend` on index failure.
    async fn read_hits(&self, hits: &mut Vec<MeaningHit>) -> Result<(), RetrievalError> {
        hits.retain(|h| h.fact.is_some());
        Ok(())
    }

    /// `(documents with a current vector of model_id, documents)` in the whole index.
    ///
    /// # Errors
    /// `Unavailable`/`Backend` on index failure.
    async fn vector_coverage(&self, model_id: &str) -> Result<(u64, u64), RetrievalError>;
}

/// The input check every [`VectorIndex::put_vectors`] makes before storing anything: one vector
/// per task, each non-empty with finite components.
///
/// # Errors
/// `InvalidInput` naming the first problem.
pub fn check_put_vectors(tasks: &[EmbedTask], vectors: &[Vec<f32>]) -> Result<(), RetrievalError> {
    if tasks.len() != vectors.len() {
        return Err(RetrievalError::InvalidInput(format!(
            "{} vectors for {} documents",
            vectors.len(),
            tasks.len()
        )));
    }
    match vectors
        .iter()
        .position(|v| v.is_empty() || v.iter().any(|x| !x.is_finite()))
    {
        Some(i) => Err(RetrievalError::InvalidInput(format!(
            "vector {i} is empty or has a component that is not a finite number"
        ))),
        None => Ok(()),
    }
}
