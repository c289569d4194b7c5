//! Benchmark of one update cycle without the model call: build the prompt for a 100-fact
//! memory, parse a scripted answer (5 new facts, 1 removal with its replacement), apply it
//! through the gates and compute the change set.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{Criterion, criterion_group, criterion_main};
use deermem_core::fact::{FactDraft, NormalizeContext, normalize_fact};
use deermem_core::policy::eviction::FactUsageMap;
use deermem_core::{FactId, FactScope, MemoryDocument, Message, Timestamp};
use deermem_updater::DeerMemConfig;
use deermem_updater::FactIdSource;
use deermem_updater::PatternSet;
use deermem_updater::change_set;
use deermem_updater::parse_update_response;
use deermem_updater::{ApplyContext, apply_update};
use deermem_updater::{PromptInput, PromptTemplates, build_update_prompt};
use serde_json::json;

fn now() -> Timestamp {
    Timestamp::parse_iso("2026-06-01T00:00:00Z").expect("a valid literal timestamp")
}

fn memory(scope: &FactScope) -> MemoryDocument {
    let mut doc = MemoryDocument::empty(now());
    doc.revision = 42;
    let gen_id = || FactId::new("unused").expect("a valid literal id");
    let categories = ["preference", "context", "goal", "behavior", "correction"];
    for i in 0..100 {
        let category = categories[i % 5];
        let draft = json!({
            "id": format!("fact_{i:08x}"),
            "content": format!("User fact number {i}: prefers tool {i} for task family {} and writes notes in Markdown", i % 7),
            "category": category,
            "confidence": 0.6 + (i % 40) as f64 / 100.0,
            "createdAt": format!("2026-0{}-1{}T10:00:00Z", 1 + i % 5, i % 10),
            "source": {"type": "conversation", "threadId": format!("thread-{}", i % 9)},
        });
        let ctx = NormalizeContext {
            scope,
            existing: None,
            now: now(),
            new_id: &gen_id,
        };
        let draft = FactDraft::try_from(draft).expect("a valid draft");
        doc.facts
            .push(normalize_fact(&draft, &ctx).expect("a valid fact"));
    }
    doc.user.0.insert(
        "workContext".into(),
        json!({"summary": "Backend engineer on payment services; prefers Rust.", "updatedAt": "2026-05-01T00:00:00Z"}),
    );
    doc
}

fn response() -> String {
    let label = |c: &str, conf: f64| {
        json!({"content": c, "category": "preference", "confidence": conf,
               "scope": "user", "durability": "durable", "authority": "descriptive"})
    };
    let body = json!({
        "user": {"topOfMind": {"summary": "Migrating billing to Go.", "shouldUpdate": true, "scope": "user", "authority": "descriptive"}},
        "history": {},
        "newFacts": [
            label("User prefers Go for new services", 0.92),
            label("User reviews pull requests in the morning", 0.8),
            label("User wants answers with code first", 0.85),
            label("User works in UTC+8", 0.9),
            label("User keeps runbooks in Notion", 0.75),
        ],
        "factsToRemove": [{"id": "fact_00000003", "scope": "user", "reason": "changed preference", "replacementFactIndex": 0}],
    });
    format!("<think>checking memory</think>\n```json\n{body}\n```")
}

fn bench(c: &mut Criterion) {
    let cfg = DeerMemConfig::default();
    let scope = FactScope {
        user_id: Some("alice@example.com".into()),
        agent_name: Some("__default__".into()),
    };
    let doc = memory(&scope);
    let templates = PromptTemplates::bundled();
    let patterns = PatternSet::bundled();
    let feed = vec![
        Message::human(
            "Actually I now prefer Go for new services, and I review PRs in the morning.",
        ),
        Message::ai("Understood, Go for new services."),
    ];
    let answer = response();
    let usage = FactUsageMap::new();
    let n = Arc::new(AtomicU64::new(0));
    let ids = FactIdSource::from_fn(move || {
        let i = n.fetch_add(1, Ordering::Relaxed);
        FactId::new(format!("fact_n{i:07}")).expect("a valid generated id")
    });
    let cycle = || {
        let signals = patterns.detect_in(&feed);
        let input = PromptInput {
            memory: &doc,
            feed: &feed,
            signals,
            config: &cfg,
            now: now(),
        };
        let prompt = build_update_prompt(&templates, &input);
        let update = parse_update_response(black_box(&answer));
        let (Ok(Some(prompt)), Ok(update)) = (prompt, update) else {
            return (0, 0);
        };
        let ctx = ApplyContext {
            config: &cfg,
            now: now(),
            thread_id: "thread-1",
            turns: &[],
            signals,
            scope: &scope,
            usage: &usage,
            ids: &ids,
            consolidation_allowed: prompt.consolidation_shown.as_ref(),
        };
        let outcome = apply_update(&doc, &update, &ctx);
        let changes = change_set(&doc, &outcome);
        (changes.upserts.len(), changes.deletes.len())
    };
    // The scripted answer really creates five facts and removes one (plus capacity evictions).
    let (upserts, deletes) = cycle();
    assert_eq!(upserts, 5, "five new facts");
    assert!(deletes >= 1, "the replaced fact is deleted");
    c.bench_function("update_cycle_100_facts_5_new_1_removal", |b| {
        b.iter(|| black_box(cycle()));
    });

    // The stages on their own, to see where the time goes.
    let signals = patterns.detect_in(&feed);
    let input = PromptInput {
        memory: &doc,
        feed: &feed,
        signals,
        config: &cfg,
        now: now(),
    };
    c.bench_function("stage_prompt_build_100_facts", |b| {
        b.iter(|| {
            black_box(build_update_prompt(&templates, &input).map(|p| p.map(|p| p.messages.len())))
        });
    });
    c.bench_function("stage_parse_response", |b| {
        b.iter(|| black_box(parse_update_response(black_box(&answer)).map(|u| u.new_facts.len())));
    });
    let update = parse_update_response(&answer).expect("the scripted answer parses");
    c.bench_function("stage_apply_and_diff_100_facts", |b| {
        b.iter(|| {
            let ctx = ApplyContext {
                config: &cfg,
                now: now(),
                thread_id: "thread-1",
                turns: &[],
                signals,
                scope: &scope,
                usage: &usage,
                ids: &ids,
                consolidation_allowed: None,
            };
            let outcome = apply_update(&doc, &update, &ctx);
            black_box(change_set(&doc, &outcome).upserts.len())
        });
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
