//! `load_scope_cold` (a fresh storage instance per load: every fact file is read and parsed)
//! and `load_scope_warm` (one instance: served from its cache after validation).

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use deermem_core::{AgentName, UserId};

use super::{Env, open, quiesce, seed_scope, settle};
use crate::stats::{Recorder, WorkloadResult};
use deermem_core::prelude::*;

async fn seeded(env: &Env) -> Result<(UserId, AgentName)> {
    let user = UserId::new("reader@bench.example")?;
    let agent = AgentName::default_bucket();
    let storage = open(&env.root, false)?;
    seed_scope(&storage, &user, &agent, env.drafts(env.sizes.scope_facts)?).await?;
    quiesce();
    Ok((user, agent))
}

pub(crate) async fn cold(env: &Env) -> Result<WorkloadResult> {
    let (user, agent) = seeded(env).await?;
    let n = env.sizes.load_cold;
    let mut untimed = Duration::ZERO;
    let mut rec = Recorder::start(n);
    for _ in 0..n {
        let setup = Instant::now();
        let storage = open(&env.root, false)?;
        untimed += setup.elapsed();
        let t = Instant::now();
        let doc = storage
            .load(Some(&user), Some(&agent))
            .await
            .context("load")?;
        rec.push(t.elapsed());
        anyhow::ensure!(doc.facts.len() == env.sizes.scope_facts, "short load");
    }
    Ok(rec
        .finish(n, untimed)
        .with("facts_per_scope", env.sizes.scope_facts.into()))
}

pub(crate) async fn warm(env: &Env) -> Result<WorkloadResult> {
    let (user, agent) = seeded(env).await?;
    let storage = open(&env.root, false)?;
    storage.load(Some(&user), Some(&agent)).await?;
    settle().await;
    storage.load(Some(&user), Some(&agent)).await?;
    let n = env.sizes.load_warm;
    let mut rec = Recorder::start(n);
    for _ in 0..n {
        let t = Instant::now();
        let doc = storage
            .load(Some(&user), Some(&agent))
            .await
            .context("load")?;
        rec.push(t.elapsed());
        anyhow::ensure!(doc.facts.len() == env.sizes.scope_facts, "short load");
    }
    Ok(rec
        .finish(n, Duration::ZERO)
        .with("facts_per_scope", env.sizes.scope_facts.into()))
}
