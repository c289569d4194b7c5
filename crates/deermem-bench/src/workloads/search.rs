//! `search` (top-10 queries, each within one scope, over the indexed corpus) and
//! `rebuild_index` (a full rebuild of the FTS5 index from the fact files of that root).

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use deermem_core::ports::ScopedSearch;
use deermem_core::{MatchType, Scope, SearchMode, SearchQuery};

use super::{Env, open, scope_ids, seed_corpus};
use crate::corpus;
use crate::stats::{Recorder, WorkloadResult};
use deermem_core::prelude::*;

/// Seeds the corpus (without index notifications), then opens the storage with its index.
async fn seeded(env: &Env) -> Result<(deermem_storage_file::FileStorage, usize)> {
    let writer = open(&env.root, false)?;
    let scopes = seed_corpus(&writer, env).await?;
    Ok((open(&env.root, true)?, scopes))
}

pub(crate) async fn rebuild(env: &Env) -> Result<WorkloadResult> {
    let (storage, scopes) = seeded(env).await?;
    let t = Instant::now();
    let report = storage.rebuild_index(None).await.context("rebuild")?;
    let took = t.elapsed();
    anyhow::ensure!(
        report.supported && !report.fatal && report.failed == 0,
        "rebuild failed: {report:?}"
    );
    storage.close().await;
    let mut rec = Recorder::start(1);
    rec.push(took);
    let mut r = rec.finish(report.indexed, Duration::ZERO);
    r.elapsed = took;
    Ok(r.with("scopes", scopes.into()).with("unit", "facts".into()))
}

pub(crate) async fn search(env: &Env) -> Result<WorkloadResult> {
    let (storage, _) = seeded(env).await?;
    let report = storage.rebuild_index(None).await.context("rebuild")?;
    anyhow::ensure!(
        report.failed == 0 && !report.fatal,
        "rebuild failed: {report:?}"
    );
    let run = run_queries(&storage, env, &corpus_scopes(env)?, None).await?;
    storage.close().await;
    Ok(run.finish().with("indexed", report.indexed.into()))
}

/// The corpus's scopes as search scopes, in corpus order.
pub(crate) fn corpus_scopes(env: &Env) -> Result<Vec<Scope>> {
    corpus::by_scope(&env.corpus)
        .iter()
        .map(|((u, a), _)| {
            let (u, a) = scope_ids(u, a.as_deref())?;
            Ok(Scope::new(Some(u), Some(a)))
        })
        .collect()
}

/// What a run of queries found, with their latencies.
pub(crate) struct QueryRun {
    rec: Recorder,
    n: usize,
    /// Hits returned in all.
    pub(crate) hits: usize,
    /// Queries with at least one hit.
    answered: usize,
    /// Hits both retrievals of a hybrid search found.
    pub(crate) fused: usize,
}

impl QueryRun {
    /// The latencies with the hit counts beside them.
    pub(crate) fn finish(self) -> WorkloadResult {
        self.rec
            .finish(self.n, Duration::ZERO)
            .with("hits", self.hits.into())
            .with("queries_with_hits", self.answered.into())
    }
}

/// Top-10 queries in `mode` (the configured default when `None`), each within the next of
/// `scopes` in turn: every query of a queries file, else the first `sizes.queries` generated.
pub(crate) async fn run_queries(
    storage: &dyn ScopedSearch,
    env: &Env,
    scopes: &[Scope],
    mode: Option<SearchMode>,
) -> Result<QueryRun> {
    run_queries_with(storage, env, scopes, mode, false).await
}

/// [`run_queries`], each query searched once untimed just before its timed search when
/// `warm` (so a hybrid search finds the query's embedding in the engine's cache and the
/// latency is the search's alone).
pub(crate) async fn run_queries_with(
    storage: &dyn ScopedSearch,
    env: &Env,
    scopes: &[Scope],
    mode: Option<SearchMode>,
    warm: bool,
) -> Result<QueryRun> {
    let queries = env.queries();
    let queries: Vec<String> = if env.queries.is_some() {
        queries
    } else {
        queries.into_iter().take(env.sizes.queries).collect()
    };
    let n = queries.len();
    let mut run = QueryRun {
        rec: Recorder::start(n),
        n,
        hits: 0,
        answered: 0,
        fused: 0,
    };
    for (i, q) in queries.iter().enumerate() {
        let mut query = SearchQuery::new(q.clone(), scopes[i % scopes.len()].clone(), 10);
        query.mode = mode;
        if warm {
            storage.search_facts(&query).await.context("search")?;
        }
        let t = Instant::now();
        let found = storage.search_facts(&query).await.context("search")?;
        run.rec.push(t.elapsed());
        run.hits += found.len();
        run.answered += usize::from(!found.is_empty());
        run.fused += found
            .iter()
            .filter(|h| h.match_type == MatchType::Hybrid)
            .count();
    }
    Ok(run)
}
