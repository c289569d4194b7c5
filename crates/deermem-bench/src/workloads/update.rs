//! `apply_update`: one scripted model answer (five new facts, one removal) applied to a
//! 100-fact memory through the real updater: feed, signals, snapshot load, prompt, model call
//! (a fake that answers at once), parse, gates, change set, commit, eviction audit. Everything
//! but the model. After each cycle the memory is restored (untimed) and the cache re-warmed, so
//! every cycle starts from the same 100 facts. The time spent in durable writes is reported
//! separately (`p50_write_us`), so the CPU path can be judged without the fsyncs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use async_trait::async_trait;
use deermem_core::ports::{ChatRequest, ChatResponse, LanguageModel, MemoryStorage};
use deermem_core::{AgentName, LlmError, Message, UserId};
use deermem_updater::{MemoryUpdater, SignalSet, UpdateRequest, UpdateStatus};
use serde_json::json;

use super::timed::TimedStorage;
use super::{Env, clock, config, open, quiesce, seed_scope};
use crate::stats::{Recorder, WorkloadResult, percentile};
use deermem_core::ports::MemoryStorageExt;
use deermem_core::prelude::*;

/// A model that always gives the same answer.
#[derive(Debug)]
struct ScriptedModel {
    answer: String,
}

#[async_trait]
impl LanguageModel for ScriptedModel {
    fn model_name(&self) -> &str {
        "scripted-bench-model"
    }

    async fn complete(&self, _request: &ChatRequest) -> Result<ChatResponse, LlmError> {
        Ok(ChatResponse {
            content: self.answer.clone(),
            model: Some("scripted-bench-model".into()),
            usage: None,
        })
    }
}

fn answer(removed_id: &str) -> String {
    let label = |c: &str, conf: f64| {
        json!({"content": c, "category": "preference", "confidence": conf,
               "scope": "user", "durability": "durable", "authority": "descriptive"})
    };
    let body = json!({
        "user": {"topOfMind": {"summary": "Migrating billing to Go.", "shouldUpdate": true,
                               "scope": "user", "authority": "descriptive"}},
        "history": {},
        "newFacts": [
            label("User prefers Go for new services", 0.92),
            label("User reviews pull requests in the morning", 0.8),
            label("User wants answers with code first", 0.85),
            label("User works in UTC+8", 0.9),
            label("User keeps runbooks in Notion", 0.75),
        ],
        "factsToRemove": [{"id": removed_id, "scope": "user", "reason": "changed preference",
                           "replacementFactIndex": 0}],
    });
    format!("```json\n{body}\n```")
}

pub(crate) async fn run(env: &Env) -> Result<WorkloadResult> {
    let user = UserId::new("update@bench.example")?;
    let agent = AgentName::default_bucket();
    let file = open(&env.root, true)?;
    seed_scope(&file, &user, &agent, env.drafts(env.sizes.scope_facts)?).await?;
    quiesce();
    let original = file.load(Some(&user), Some(&agent)).await?;
    // The removal names the most confident fact: capacity eviction (which runs before the
    // removals and trims the lowest-scoring facts) never takes it first, so every cycle
    // really removes it.
    let removed = original
        .facts
        .iter()
        .max_by(|a, b| a.confidence.total_cmp(&b.confidence))
        .map(|f| f.id.to_string())
        .context("the seeded scope is empty")?;
    let storage = Arc::new(TimedStorage::new(Arc::new(file.clone())));
    let model = Arc::new(ScriptedModel {
        answer: answer(&removed),
    });
    let updater = MemoryUpdater::builder(
        Arc::new(config()),
        storage.clone() as Arc<dyn MemoryStorage>,
        clock(),
    )
    .language_model(Some(model))
    .build();
    let feed = vec![
        Message::human(
            "Actually I now prefer Go for new services, and I review PRs in the morning.",
        ),
        Message::ai("Understood, Go for new services."),
    ];
    let request = UpdateRequest {
        thread_id: "bench-thread".into(),
        messages: feed,
        user: Some(user.clone()),
        agent: agent.clone(),
        trace_id: None,
        bypass_watermark: true,
        signals: SignalSet::default(),
        turns: Vec::new(),
    };
    let n = env.sizes.apply_update;
    let mut untimed = Duration::ZERO;
    let mut writes = Vec::with_capacity(n);
    let mut created = 0usize;
    let mut removed_count = 0usize;
    let mut rec = Recorder::start(n);
    for i in 0..n {
        let before = storage.write_ns();
        let t = Instant::now();
        let outcome = updater.update(request.clone()).await.context("update")?;
        rec.push(t.elapsed());
        writes.push(Duration::from_nanos(storage.write_ns() - before));
        let setup = Instant::now();
        anyhow::ensure!(
            matches!(outcome.status, UpdateStatus::Committed { .. }),
            "cycle {i} did not commit: {:?}",
            outcome.status
        );
        if i == 0 {
            let report = outcome.report.clone().unwrap_or_default();
            created = report.created.len();
            removed_count = report.removed.len();
            anyhow::ensure!(
                created == 5,
                "expected 5 new facts, the gates kept {created}: {report:?}"
            );
            anyhow::ensure!(removed_count == 1, "expected 1 removal: {report:?}");
        }
        // Restore the 100 facts and warm the cache again (not measured).
        file.save(Some(&user), Some(&agent), &original, None)
            .await
            .context("restore")?;
        file.load(Some(&user), Some(&agent)).await?;
        untimed += setup.elapsed();
    }
    let mut write_us: Vec<f64> = writes.iter().map(|d| d.as_secs_f64() * 1e6).collect();
    write_us.sort_by(f64::total_cmp);
    let mut r = rec.finish(n, untimed);
    let mut cpu_us: Vec<f64> = r
        .samples
        .iter()
        .zip(&writes)
        .map(|(t, w)| t.saturating_sub(*w).as_secs_f64() * 1e6)
        .collect();
    cpu_us.sort_by(f64::total_cmp);
    r = r
        .with(
            "p50_write_us",
            ((percentile(&write_us, 50.0) * 10.0).round() / 10.0).into(),
        )
        .with(
            "p50_without_writes_us",
            ((percentile(&cpu_us, 50.0) * 10.0).round() / 10.0).into(),
        )
        .with(
            "p99_without_writes_us",
            ((percentile(&cpu_us, 99.0) * 10.0).round() / 10.0).into(),
        )
        .with("created_per_cycle", created.into())
        .with("removed_per_cycle", removed_count.into());
    file.close().await;
    Ok(r)
}
