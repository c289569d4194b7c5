//! `get_context`: the `<memory>` injection block of a 100-fact scope through the DeerMem
//! manager, with tiktoken counting (the default), the token table loaded beforehand; and
//! `count_long_fact`: the token count of one long fact without spaces, which the block's first
//! build pays for a fact it has not counted before.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use deermem_core::ports::{ContextRequest, MemoryManager, MemoryScope, MemoryStorage};
use deermem_core::{AgentName, UserId};
use deermem_engine::{DeerMemManager, DeerMemParts};
use deermem_updater::TokenCounter;
use deermem_updater::TokenCounting;

use super::{Env, clock, config, open, seed_scope, settle};
use crate::stats::{Recorder, WorkloadResult};

/// A DeerMem manager over the storage with the default configuration.
pub(crate) fn manager(storage: Arc<dyn MemoryStorage>) -> Result<DeerMemManager> {
    DeerMemManager::new(DeerMemParts::new(config(), storage, clock())).context("manager")
}

pub(crate) async fn run(env: &Env) -> Result<WorkloadResult> {
    run_on(env, Arc::new(open(&env.root, true)?)).await
}

/// `get_context` over `storage` (the file store, or PostgreSQL for `--store postgres`).
pub(crate) async fn run_on(env: &Env, storage: Arc<dyn MemoryStorage>) -> Result<WorkloadResult> {
    let user = UserId::new("context@bench.example")?;
    let agent = AgentName::default_bucket();
    seed_scope(&*storage, &user, &agent, env.drafts(env.sizes.scope_facts)?).await?;
    let mgr = manager(storage)?;
    anyhow::ensure!(mgr.warm().await == Some(true), "tiktoken table unavailable");
    let request = ContextRequest {
        scope: MemoryScope::new(Some(user), Some(agent)),
        thread_id: None,
    };
    let first = mgr.get_context(request.clone()).await?;
    settle().await;
    anyhow::ensure!(
        first.contains("Facts"),
        "no facts in the injection block: {first:?}"
    );
    let n = env.sizes.get_context;
    let mut rec = Recorder::start(n);
    for _ in 0..n {
        let t = Instant::now();
        let text = mgr.get_context(request.clone()).await?;
        rec.push(t.elapsed());
        anyhow::ensure!(text.len() == first.len(), "context changed");
    }
    mgr.close().await;
    Ok(rec
        .finish(n, Duration::ZERO)
        .with("context_chars", first.chars().count().into()))
}

/// Characters of the long fact `count_long_fact` counts (the longest manual fact accepted).
pub(crate) const LONG_FACT_CHARS: usize = 20_000;

/// A CJK text of [`LONG_FACT_CHARS`] characters without a space, different for every `i` (so
/// the counter's memo never answers).
fn long_cjk_fact(i: usize) -> String {
    const BASE: u32 = 0x4E00;
    const SPAN: usize = 20_000;
    (0..LONG_FACT_CHARS)
        .map(|k| {
            let offset = (k * 7_919 + i * 104_729) % SPAN;
            char::from_u32(BASE + offset as u32).unwrap_or('\u{4E00}')
        })
        .collect()
}

/// `count_long_fact`: tiktoken counting of a 20,000-character CJK fact never counted before
/// (what the first `get_context` after such a `memory_add` pays), the table loaded beforehand.
pub(crate) fn long_fact(env: &Env) -> Result<WorkloadResult> {
    let counter = TokenCounter::new(TokenCounting::Tiktoken);
    anyhow::ensure!(counter.warm(), "tiktoken table unavailable");
    let n = env.sizes.count_long_fact;
    let texts: Vec<String> = (0..n).map(long_cjk_fact).collect();
    let mut rec = Recorder::start(n);
    let mut tokens = 0usize;
    for text in &texts {
        let t = Instant::now();
        tokens = counter.count(text);
        rec.push(t.elapsed());
        anyhow::ensure!(tokens > 0, "no tokens counted");
    }
    Ok(rec
        .finish(n, Duration::ZERO)
        .with("fact_chars", LONG_FACT_CHARS.into())
        .with("tokens", tokens.into()))
}
