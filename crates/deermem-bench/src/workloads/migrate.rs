//! `migrate_v1`: users whose manifest still holds legacy v1 facts inline, migrated as
//! `deermem migrate --all-users` does (list the users, then migrate each into the default
//! bucket), on the storage with its FTS5 index.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use deermem_core::{AgentName, UserId};
use serde_json::{Value, json};

use super::{Env, open};
use crate::stats::{Recorder, WorkloadResult};
use deermem_core::prelude::*;

fn summary(text: &str) -> Value {
    json!({"summary": text, "updatedAt": if text.is_empty() { "" } else { "2026-05-01T00:00:00Z" }})
}

/// A v1 manifest as the reference wrote it: summaries plus `facts` inline.
fn legacy_manifest(env: &Env, user: usize) -> Value {
    let per = env.sizes.migrate_facts;
    let facts: Vec<Value> = (0..per)
        .map(|k| {
            let f = &env.corpus[(user * per + k) % env.corpus.len()];
            json!({
                "id": format!("fact_{user:06x}{k:04x}"),
                "content": format!("{} ({user}/{k})", f.content),
                "category": f.category,
                "confidence": f.confidence,
                "createdAt": format!("2026-0{}-1{}T10:00:00Z", 1 + k % 9, k % 10),
                "source": if k % 2 == 0 { "import" } else { "thread-legacy" },
            })
        })
        .collect();
    json!({
        "version": "1.0",
        "lastUpdated": "2026-05-01T00:00:00Z",
        "user": {
            "workContext": summary("Legacy work context."),
            "personalContext": summary(""),
            "topOfMind": summary(""),
        },
        "history": {
            "recentMonths": summary(""),
            "earlierContext": summary(""),
            "longTermBackground": summary(""),
        },
        "facts": facts,
    })
}

pub(crate) async fn run(env: &Env) -> Result<WorkloadResult> {
    let users = env.sizes.migrate_users;
    for u in 0..users {
        let id = UserId::new(format!("legacy{u:05}"))?;
        let dir = env.root.join("users").join(id.bucket());
        std::fs::create_dir_all(&dir)?;
        let text = serde_json::to_string_pretty(&legacy_manifest(env, u))?;
        std::fs::write(dir.join("memory.json"), text)?;
    }
    let storage = open(&env.root, true)?;
    let agent = AgentName::default_bucket();
    let mut rec = Recorder::start(users);
    let listed = storage.list_users().await.context("list users")?;
    anyhow::ensure!(
        listed.len() == users,
        "listed {} of {users} users",
        listed.len()
    );
    let mut facts = 0usize;
    for user in &listed {
        let t = Instant::now();
        let report = storage
            .migrate(Some(user), &agent, false)
            .await
            .with_context(|| format!("migrating {user}"))?;
        rec.push(t.elapsed());
        anyhow::ensure!(report.migrated, "{user} was not migrated: {report:?}");
        facts += report.migrated_facts;
    }
    let r = rec.finish(users, Duration::ZERO);
    let facts_per_sec = facts as f64 / r.elapsed.as_secs_f64().max(1e-9);
    let sample = storage.load(listed.first(), Some(&agent)).await?;
    anyhow::ensure!(
        sample.facts.len() == env.sizes.migrate_facts && sample.version == "2.0",
        "migrated document looks wrong: {} facts, version {}",
        sample.facts.len(),
        sample.version
    );
    storage.close().await;
    Ok(r.with("facts_migrated", facts.into())
        .with("facts_per_sec", (facts_per_sec.round()).into())
        .with("unit", "users".into()))
}
