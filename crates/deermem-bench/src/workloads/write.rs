//! `write_fact` (single-fact creates one after another into one scope),
//! `write_fact_parallel` (the same spread over several users from as many tasks) and
//! `write_fact_one_user` (the same from as many tasks into one scope, where the storage's group
//! commit applies), through `MemoryStorageExt::upsert_fact` on the file storage with its FTS5
//! index.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use deermem_core::{AgentName, FactDraft, UserId};
use deermem_storage_file::FileStorage;

use super::floor::Floor;
use super::{Env, open};
use crate::machine::process_cpu_time_precise;
use crate::stats::{Recorder, WorkloadResult};
use deermem_core::ports::MemoryStorageExt;
use deermem_core::prelude::*;

/// Creates one after another. The floor's operations are measured alongside, in alternating
/// blocks of a tenth of the run on raw files next to the root (`paired_floor_ops_per_sec`), so
/// the 1.3× comparison holds for the same minutes of a shared disk whose speed drifts between
/// runs; the `fsync_floor` workload remains the floor measured on its own.
pub(crate) async fn sequential(env: &Env) -> Result<WorkloadResult> {
    let storage = open(&env.root, true)?;
    let mut floor = Floor::new(&env.root.parent().unwrap_or(&env.root).join("floor"))?;
    let user = UserId::new("writer@bench.example")?;
    let agent = AgentName::default_bucket();
    let n = env.sizes.write_fact;
    let block = (n / 10).max(1);
    let drafts = env.drafts(n)?;
    let mut floor_time = Duration::ZERO;
    let mut floor_ops = 0usize;
    let mut untimed = Duration::ZERO;
    let mut rec = Recorder::start(n);
    for (i, d) in drafts.into_iter().enumerate() {
        if i % block == 0 {
            let paused = Instant::now();
            for _ in 0..block {
                floor_time += floor.create()?;
                floor_ops += 1;
            }
            untimed += paused.elapsed();
        }
        let t = Instant::now();
        storage
            .upsert_fact(Some(&user), &agent, d, None, None)
            .await
            .context("create")?;
        rec.push(t.elapsed());
    }
    let doc = load_expecting(&storage, &user, &agent, n).await?;
    storage.close().await;
    let paired = floor_ops as f64 / floor_time.as_secs_f64().max(1e-9);
    Ok(rec
        .finish(n, untimed)
        .with("revision", doc.revision.into())
        .with(
            "paired_floor_ops_per_sec",
            ((paired * 10.0).round() / 10.0).into(),
        ))
}

/// Creates from `writers` tasks at once, one user each. The run is cut into ten rounds; each
/// round first performs a tenth of `write_fact`'s creates one after another into a separate
/// scope of the same root (untimed for the parallel figures), then a tenth of the parallel
/// creates. `ops_per_sec` covers the parallel blocks only, and the sequential blocks are
/// reported as `paired_sequential_ops_per_sec`: the 3× target compares the two measured in the
/// same minutes, as `write_fact` is judged against its paired floor.
pub(crate) async fn parallel(env: &Env) -> Result<WorkloadResult> {
    let storage = open(&env.root, true)?;
    let writers = env.sizes.writers.max(1);
    let n = env.sizes.write_parallel;
    let rounds = 10.min(n.max(1));
    let mut drafts = env.drafts(n)?;
    let seq_n = env.sizes.write_fact;
    let mut seq_drafts = env.drafts(seq_n)?;
    let seq_user = UserId::new("sequential@bench.example")?;
    let agent = AgentName::default_bucket();
    let mut samples = Vec::with_capacity(n);
    let mut parallel_time = Duration::ZERO;
    let mut seq_time = Duration::ZERO;
    let mut seq_done = 0usize;
    let (mut seq_cpu, mut parallel_cpu) = (Duration::ZERO, Duration::ZERO);
    for round in 0..rounds {
        let seq_block = seq_n * (round + 1) / rounds - seq_n * round / rounds;
        for d in seq_drafts.drain(..seq_block.min(seq_drafts.len())) {
            let t = Instant::now();
            let cpu = process_cpu_time_precise();
            storage
                .upsert_fact(Some(&seq_user), &agent, d, None, None)
                .await
                .context("sequential create")?;
            seq_time += t.elapsed();
            seq_cpu += process_cpu_time_precise().saturating_sub(cpu);
            seq_done += 1;
        }
        let block = n * (round + 1) / rounds - n * round / rounds;
        let tasks = spread(drafts.drain(..block.min(drafts.len())), writers)
            .into_iter()
            .enumerate()
            .map(|(w, mine)| Ok((UserId::new(format!("writer{w}@bench.example"))?, mine)))
            .collect::<Result<Vec<_>>>()?;
        let started = Instant::now();
        let cpu = process_cpu_time_precise();
        samples.extend(concurrent_creates(&storage, tasks).await?);
        parallel_time += started.elapsed();
        parallel_cpu += process_cpu_time_precise().saturating_sub(cpu);
    }
    storage.close().await;
    let (floor, floor_cpu, seq_floor) = floors(env, writers, n)?;
    let mut rec = Recorder::start(0);
    for s in samples {
        rec.push(s);
    }
    let mut result = rec.finish(n, Duration::ZERO);
    result.elapsed = parallel_time;
    let paired = seq_done as f64 / seq_time.as_secs_f64().max(1e-9);
    let per_op_us = |cpu: Duration, ops: usize| {
        ((cpu.as_secs_f64() * 1e6 / ops.max(1) as f64) * 10.0).round() / 10.0
    };
    Ok(result
        .with("writers", writers.into())
        .with("cpu_us_per_op", per_op_us(parallel_cpu, n).into())
        .with(
            "paired_sequential_cpu_us_per_op",
            per_op_us(seq_cpu, seq_done).into(),
        )
        .with(
            "paired_sequential_ops_per_sec",
            ((paired * 10.0).round() / 10.0).into(),
        )
        .with(
            "parallel_floor_ops_per_sec",
            ((floor * 10.0).round() / 10.0).into(),
        )
        .with("parallel_floor_cpu_us_per_op", floor_cpu.into())
        .with(
            "sequential_floor_ops_per_sec",
            ((seq_floor * 10.0).round() / 10.0).into(),
        )
        .with(
            "floor_scaling",
            ((floor / seq_floor.max(1e-9) * 100.0).round() / 100.0).into(),
        ))
}

/// Creates from `writers` tasks at once into one (user, agent) scope: concurrent point writes
/// of one user share commits (the storage's group commit). Reports `commits`, the shared
/// revisions the creates took, and `facts_per_commit`.
pub(crate) async fn one_user(env: &Env) -> Result<WorkloadResult> {
    let storage = open(&env.root, true)?;
    let writers = env.sizes.writers.max(1);
    let n = env.sizes.write_parallel;
    let user = UserId::new("shared@bench.example")?;
    let agent = AgentName::default_bucket();
    let tasks = spread(env.drafts(n)?, writers)
        .into_iter()
        .map(|mine| (user.clone(), mine))
        .collect();
    let started = Instant::now();
    let cpu = process_cpu_time_precise();
    let latencies = concurrent_creates(&storage, tasks).await?;
    let elapsed = started.elapsed();
    let mut rec = Recorder::start(n);
    for s in latencies {
        rec.push(s);
    }
    let cpu = process_cpu_time_precise().saturating_sub(cpu);
    let doc = load_expecting(&storage, &user, &agent, n).await?;
    storage.close().await;
    let commits = doc.revision;
    let mut result = rec.finish(n, Duration::ZERO);
    result.elapsed = elapsed;
    Ok(result
        .with("writers", writers.into())
        .with("commits", commits.into())
        .with(
            "facts_per_commit",
            ((n as f64 / commits.max(1) as f64 * 100.0).round() / 100.0).into(),
        )
        .with(
            "cpu_us_per_op",
            ((cpu.as_secs_f64() * 1e6 / n.max(1) as f64 * 10.0).round() / 10.0).into(),
        ))
}

/// Deals `drafts` round robin into `writers` lists.
/// Loads the written scope and checks that every create is there.
async fn load_expecting(
    storage: &FileStorage,
    user: &UserId,
    agent: &AgentName,
    n: usize,
) -> Result<deermem_core::MemoryDocument> {
    let doc = storage.load(Some(user), Some(agent)).await?;
    anyhow::ensure!(
        doc.facts.len() == n,
        "expected {n} facts, found {}",
        doc.facts.len()
    );
    Ok(doc)
}

fn spread(drafts: impl IntoIterator<Item = FactDraft>, writers: usize) -> Vec<Vec<FactDraft>> {
    let mut mine: Vec<Vec<FactDraft>> = (0..writers.max(1)).map(|_| Vec::new()).collect();
    let count = mine.len();
    for (i, d) in drafts.into_iter().enumerate() {
        if let Some(m) = mine.get_mut(i % count) {
            m.push(d);
        }
    }
    mine
}

/// One task per `(user, drafts)` at once, each creating its drafts one after another in the
/// user's default scope; the latency of every create.
async fn concurrent_creates(
    storage: &FileStorage,
    tasks: Vec<(UserId, Vec<FactDraft>)>,
) -> Result<Vec<Duration>> {
    let mut set = tokio::task::JoinSet::new();
    for (user, mine) in tasks {
        let s = storage.clone();
        set.spawn(async move {
            let agent = AgentName::default_bucket();
            let mut samples = Vec::with_capacity(mine.len());
            for d in mine {
                let t = Instant::now();
                s.upsert_fact(Some(&user), &agent, d, None, None)
                    .await
                    .context("create")?;
                samples.push(t.elapsed());
            }
            anyhow::Ok(samples)
        });
    }
    let mut samples = Vec::new();
    while let Some(r) = set.join_next().await {
        samples.extend(r.context("writer task")??);
    }
    Ok(samples)
}

/// The floor's operations from `writers` threads at once, each in its own user directory (what
/// the disk allows this protocol at that concurrency), alternating in four rounds with the same
/// number of creates one after another in another directory: parallel creates/s, the process's
/// CPU µs per parallel create, and sequential creates/s. Their quotient (`floor_scaling`) is
/// how far the protocol's raw file operations themselves scale with 8 writers on this disk in
/// these minutes: the ceiling for `write_fact_parallel`'s ratio.
fn floors(env: &Env, writers: usize, n: usize) -> Result<(f64, f64, f64)> {
    let dir = env.root.parent().unwrap_or(&env.root);
    let base = dir.join("floor-parallel");
    std::fs::create_dir_all(&base)?;
    // As the storage does for `users/`: one block group per writer's tree.
    super::floor::mark_top_directory(&base);
    let rounds = 4;
    let per = n.div_ceil(writers * rounds).max(1);
    let mut floors = (0..writers)
        .map(|w| Floor::new(&base.join(format!("w{w}"))))
        .collect::<Result<Vec<_>>>()?;
    let mut single = Floor::new(&dir.join("floor-sequential"))?;
    let (mut par_time, mut par_cpu, mut seq_time) =
        (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    for _ in 0..rounds {
        for _ in 0..per * writers {
            seq_time += single.create()?;
        }
        let started = Instant::now();
        let cpu = process_cpu_time_precise();
        std::thread::scope(|scope| {
            let handles: Vec<_> = floors
                .iter_mut()
                .map(|f| {
                    scope.spawn(move || -> Result<()> {
                        for _ in 0..per {
                            f.create()?;
                        }
                        Ok(())
                    })
                })
                .collect();
            for h in handles {
                h.join()
                    .map_err(|_| anyhow::anyhow!("a floor thread panicked"))??;
            }
            anyhow::Ok(())
        })?;
        par_time += started.elapsed();
        par_cpu += process_cpu_time_precise().saturating_sub(cpu);
    }
    let ops = (per * writers * rounds) as f64;
    Ok((
        ops / par_time.as_secs_f64().max(1e-9),
        ((par_cpu.as_secs_f64() * 1e6 / ops.max(1.0)) * 10.0).round() / 10.0,
        ops / seq_time.as_secs_f64().max(1e-9),
    ))
}
