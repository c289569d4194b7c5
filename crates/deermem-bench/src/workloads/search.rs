//! `search` (top-10 queries, each within one scope, over the indexed corpus) and
//! `rebuild_index` (a full rebuild of the FTS5 index from the fact files of that root).

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use deermem_core::{Scope, SearchQuery};

use super::{Env, open, scope_ids, seed_corpus};
use crate::corpus;
use crate::stats::{Recorder, WorkloadResult};
use deermem_core::prelude::*;

/// Seeds the corpus (without index notifications), then opens the storage with its index.
async fn seeded(env: &Env) -> Result<(deermem_storage_file::FileMemoryStorage, usize)> {
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
    let groups = corpus::by_scope(&env.corpus);
    let scopes: Vec<Scope> = groups
        .iter()
        .map(|((u, a), _)| {
            let (u, a) = scope_ids(u, a.as_deref())?;
            Ok(Scope::new(Some(u), Some(a)))
        })
        .collect::<Result<_>>()?;
    let queries = env.queries();
    let queries: Vec<String> = if env.queries.is_some() {
        queries
    } else {
        queries.into_iter().take(env.sizes.queries).collect()
    };
    let n = queries.len();
    let (mut hits, mut answered) = (0usize, 0usize);
    let mut rec = Recorder::start(n);
    for (i, q) in queries.iter().enumerate() {
        let query = SearchQuery::new(q.clone(), scopes[i % scopes.len()].clone(), 10);
        let t = Instant::now();
        let found = storage.search_facts(&query).await.context("search")?;
        rec.push(t.elapsed());
        hits += found.len();
        answered += usize::from(!found.is_empty());
    }
    storage.close().await;
    Ok(rec
        .finish(n, Duration::ZERO)
        .with("indexed", report.indexed.into())
        .with("hits", hits.into())
        .with("queries_with_hits", answered.into()))
}
