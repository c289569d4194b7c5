//! `get_context`: the `<memory>` injection block of a 100-fact scope through the DeerMem
//! manager, with tiktoken counting (the default), the token table loaded beforehand.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use deermem_core::ports::{ContextRequest, MemoryManager, MemoryScope, MemoryStorage};
use deermem_core::{AgentName, UserId};
use deermem_updater::{DeerMemManager, DeerMemParts};

use super::{Env, clock, config, open, seed_scope, settle};
use crate::stats::{Recorder, WorkloadResult};

/// A DeerMem manager over the storage with the default configuration.
pub(crate) fn manager(storage: Arc<dyn MemoryStorage>) -> Result<DeerMemManager> {
    DeerMemManager::new(DeerMemParts::new(config(), storage, clock())).context("manager")
}

pub(crate) async fn run(env: &Env) -> Result<WorkloadResult> {
    let user = UserId::new("context@bench.example")?;
    let agent = AgentName::default_bucket();
    let storage = open(&env.root, true)?;
    seed_scope(&storage, &user, &agent, env.drafts(env.sizes.scope_facts)).await?;
    let mgr = manager(Arc::new(storage))?;
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
