//! `write_fact` (single-fact creates one after another into one scope) and
//! `write_fact_parallel` (the same spread over several users from as many tasks), through
//! `MemoryStorage::upsert_fact` on the file storage with its FTS5 index.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use deermem_core::ports::MemoryStorage;
use deermem_core::{AgentName, UserId};

use super::floor::Floor;
use super::{Env, open};
use crate::stats::{Recorder, WorkloadResult};

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
    let drafts = env.drafts(n);
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
    let doc = storage.load(Some(&user), Some(&agent)).await?;
    anyhow::ensure!(
        doc.facts.len() == n,
        "expected {n} facts, found {}",
        doc.facts.len()
    );
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

pub(crate) async fn parallel(env: &Env) -> Result<WorkloadResult> {
    let storage = open(&env.root, true)?;
    let writers = env.sizes.writers.max(1);
    let n = env.sizes.write_parallel;
    let per = n.div_ceil(writers);
    let mut drafts = env.drafts(n);
    let started = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for w in 0..writers {
        let mine: Vec<_> = drafts.drain(..per.min(drafts.len())).collect();
        let s = storage.clone();
        set.spawn(async move {
            let user = UserId::new(format!("writer{w}@bench.example"))?;
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
    let mut samples = Vec::with_capacity(n);
    while let Some(r) = set.join_next().await {
        samples.extend(r.context("writer task")??);
    }
    let elapsed = started.elapsed();
    storage.close().await;
    let floor = parallel_floor(env, writers, n)?;
    let mut rec = Recorder::start(0);
    for s in samples {
        rec.push(s);
    }
    let mut result = rec.finish(n, Duration::ZERO);
    result.elapsed = elapsed;
    Ok(result.with("writers", writers.into()).with(
        "parallel_floor_ops_per_sec",
        ((floor * 10.0).round() / 10.0).into(),
    ))
}

/// The floor's operations from `writers` threads at once, each in its own user directory (what
/// the disk allows this protocol at that concurrency): `n` creates in all, creates/s.
fn parallel_floor(env: &Env, writers: usize, n: usize) -> Result<f64> {
    let base = env
        .root
        .parent()
        .unwrap_or(&env.root)
        .join("floor-parallel");
    std::fs::create_dir_all(&base)?;
    // As the storage does for `users/`: one block group per writer's tree.
    super::floor::mark_top_directory(&base);
    let per = n.div_ceil(writers);
    let mut floors = (0..writers)
        .map(|w| Floor::new(&base.join(format!("w{w}"))))
        .collect::<Result<Vec<_>>>()?;
    let started = Instant::now();
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
    Ok((per * writers) as f64 / started.elapsed().as_secs_f64().max(1e-9))
}
