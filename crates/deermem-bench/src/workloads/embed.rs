//! `embed_local` (sentences per second of the local embedding model, batches of 32) and
//! `search_hybrid` (hybrid search over the indexed corpus with its vectors computed beforehand,
//! each query's embedding with the local model included in its latency; then the same queries
//! again with their embeddings cached, reported as `cached_p50_us` and `cached_p99_us`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use deermem_core::SearchMode;
use deermem_core::config::EmbeddingProvider;
use deermem_core::ports::Embedder;
use deermem_embed_local::LocalEmbedder;

use super::{Env, clock, config, open, seed_corpus};
use crate::stats::{Recorder, WorkloadResult};
use deermem_core::prelude::*;

/// The batch `embed_local` measures.
const BATCH: usize = 32;
/// At most this many sentences are embedded by `embed_local`.
const MAX_SENTENCES: usize = 2_048;

/// The workloads that need the local model; the parent skips them with a one-line note when
/// [`model_dir`] finds none.
pub const NEED_MODEL: [&str; 2] = ["embed_local", "search_hybrid"];

/// The model directory: `$DEERMEM_TEST_MODEL_DIR`, else `$DEERMEM_MODEL_CACHE/all-MiniLM-L6-v2`,
/// else the workspace's `target/models/all-MiniLM-L6-v2` (where `cargo xtask model fetch` puts
/// it). A missing directory fails naming the command that fetches it.
///
/// # Errors
/// No model in the directory.
pub fn model_dir() -> Result<PathBuf> {
    let dir = std::env::var_os("DEERMEM_TEST_MODEL_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("DEERMEM_MODEL_CACHE")
                .map(|c| PathBuf::from(c).join("all-MiniLM-L6-v2"))
        })
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/models/all-MiniLM-L6-v2")
        });
    if !dir.join("model.safetensors").is_file() {
        bail!(
            "the local embedding model is not in {}: run `cargo xtask model fetch` (or set DEERMEM_TEST_MODEL_DIR to a directory holding all-MiniLM-L6-v2)",
            dir.display()
        );
    }
    Ok(dir)
}

pub(crate) async fn embed_local(env: &Env) -> Result<WorkloadResult> {
    let dir = model_dir()?;
    let load = Instant::now();
    let embedder = LocalEmbedder::load(&dir, BATCH).context("loading the local model")?;
    let load = load.elapsed();
    let texts: Vec<String> = env
        .corpus
        .iter()
        .take(MAX_SENTENCES)
        .map(|f| f.content.clone())
        .collect();
    anyhow::ensure!(!texts.is_empty(), "the corpus is empty");
    // Warm-up, not timed.
    embedder
        .embed(&texts[..BATCH.min(texts.len())])
        .await
        .context("embedding")?;
    let mut rec = Recorder::start(texts.len().div_ceil(BATCH));
    for batch in texts.chunks(BATCH) {
        let t = Instant::now();
        embedder.embed(batch).await.context("embedding")?;
        rec.push(t.elapsed());
    }
    let one = Instant::now();
    embedder.embed(&texts[..1]).await.context("embedding")?;
    let one = one.elapsed();
    Ok(rec
        .finish(texts.len(), Duration::ZERO)
        .with("unit", "sentences (p50/p99 per batch of 32)".into())
        .with("batch", BATCH.into())
        .with("one_sentence_us", (one.as_secs_f64() * 1e6).into())
        .with("model_load_s", load.as_secs_f64().into())
        .with("model", embedder.model_id().into()))
}

pub(crate) async fn search_hybrid(env: &Env) -> Result<WorkloadResult> {
    let dir = model_dir()?;
    let writer = open(&env.root, false)?;
    seed_corpus(&writer, env).await?;
    let mut cfg = config();
    cfg.embedding.provider = EmbeddingProvider::Local;
    cfg.embedding.model_path = Some(dir.display().to_string());
    cfg.embedding.batch_size = BATCH;
    let storage = deermem::embedded::open_storage(&cfg, env.root.clone(), clock(), true)
        .context("opening the storage with the hybrid index")?;
    // The rebuild indexes the words and embeds every fact before it returns (untimed).
    let t = Instant::now();
    let report = storage.rebuild_index(None).await.context("rebuild")?;
    let embed_all = t.elapsed();
    anyhow::ensure!(
        report.failed == 0 && !report.fatal,
        "rebuild failed: {report:?}"
    );
    let status = storage.retrieval_status().await;
    let coverage = status
        .vectors
        .context("the index reports no vector coverage: the embedder is not wired")?;
    anyhow::ensure!(
        coverage.embedded == coverage.total,
        "vectors missing after the rebuild: {coverage:?}"
    );
    let scopes = super::search::corpus_scopes(env)?;
    let run = super::search::run_queries(&storage, env, &scopes, Some(SearchMode::Hybrid)).await?;
    // The same queries with the query embedding cached: the search's own cost.
    let cached =
        super::search::run_queries_with(&storage, env, &scopes, Some(SearchMode::Hybrid), true)
            .await?
            .finish()
            .summary();
    storage.close().await;
    let fused = run.fused;
    Ok(run
        .finish()
        .with("indexed", report.indexed.into())
        .with("embedded", coverage.embedded.into())
        .with("embed_all_s", embed_all.as_secs_f64().into())
        .with("hits_found_by_both", fused.into())
        .with(
            "cached_p50_us",
            ((cached.p50_us * 10.0).round() / 10.0).into(),
        )
        .with(
            "cached_p99_us",
            ((cached.p99_us * 10.0).round() / 10.0).into(),
        )
        .with("model", coverage.model_id.into()))
}
