//! Criterion micro-benchmarks of hot pure functions not covered by the crates' own benches:
//! query sanitisation (FTS5 query planning), token counting (tiktoken and the character
//! estimate), and gate evaluation (one proposal through `apply_update`, and the capacity
//! decision). Front-matter parse/render is in `deermem-storage-file/benches/yaml.rs`; the
//! update cycle stages are in `deermem-updater/benches/apply.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{Criterion, criterion_group, criterion_main};
use deermem_core::fact::{FactDraft, NormalizeContext, normalize_fact};
use deermem_core::policy::eviction::FactUsageMap;
use deermem_core::{FactId, FactScope, MemoryDocument, Timestamp};
use deermem_retrieval_fts5::query::{NoSegmenter, plan};
use deermem_updater::FactIdSource;
use deermem_updater::SignalSet;
use deermem_updater::parse_update_response;
use deermem_updater::{ApplyContext, apply_update, capacity_decision};
use deermem_updater::{DeerMemConfig, TokenCounting};
use deermem_updater::{TokenCounter, char_estimate};
use serde_json::json;

fn now() -> Timestamp {
    Timestamp::parse_iso("2026-06-01T00:00:00Z")
        .unwrap_or_else(|| panic!("a valid literal timestamp"))
}

fn memory(scope: &FactScope, n: usize) -> MemoryDocument {
    let mut doc = MemoryDocument::empty(now());
    let unused = || FactId::new("unused").unwrap_or_else(|e| panic!("{e}"));
    let categories = ["preference", "context", "goal", "behavior"];
    for i in 0..n {
        let category = categories[i % 4];
        let draft = json!({
            "id": format!("fact_{i:08x}"),
            "content": format!("User fact {i}: prefers tool {i} for task family {} and writes notes in Markdown", i % 7),
            "category": category,
            "confidence": 0.6 + (i % 40) as f64 / 100.0,
            "createdAt": format!("2026-0{}-1{}T10:00:00Z", 1 + i % 5, i % 10),
        });
        let ctx = NormalizeContext {
            scope,
            existing: None,
            now: now(),
            new_id: &unused,
        };
        let fact = FactDraft::try_from(draft).and_then(|d| normalize_fact(&d, &ctx));
        doc.facts.push(fact.unwrap_or_else(|e| panic!("{e}")));
    }
    doc
}

fn bench_queries(c: &mut Criterion) {
    let seg = NoSegmenter;
    for (name, q) in [
        ("plain_words", "rust async runtime preferences"),
        (
            "advanced_syntax",
            "rust AND (tokio OR \"async std\") NOT python",
        ),
        (
            "hostile_quotes",
            "user's \"quoted\" (unbalanced AND -- * ^ ~ NEAR(",
        ),
        ("cjk_mixed", "用户喜欢喝乌龙茶 and 東京に住んでいる"),
    ] {
        c.bench_function(&format!("query_plan_{name}"), |b| {
            b.iter(|| plan(black_box(q), &seg))
        });
    }
}

fn bench_tokens(c: &mut Criterion) {
    let line = "- [preference | 0.92] User prefers Go for new services and reviews pull requests in the morning";
    let tik = TokenCounter::new(TokenCounting::Tiktoken);
    if !tik.warm() {
        panic!("the bundled cl100k_base table must load");
    }
    c.bench_function("tokens_tiktoken_fact_line", |b| {
        b.iter(|| tik.count(black_box(line)))
    });
    let block: String = (0..100).map(|i| format!("{line} #{i}\n")).collect();
    c.bench_function("tokens_tiktoken_100_lines", |b| {
        b.iter(|| tik.count(black_box(&block)))
    });
    c.bench_function("tokens_char_estimate_fact_line", |b| {
        b.iter(|| char_estimate(black_box(line)))
    });
}

fn bench_gates(c: &mut Criterion) {
    let cfg = DeerMemConfig::default();
    let scope = FactScope {
        user_id: Some("alice@example.com".into()),
        agent_name: Some("__default__".into()),
    };
    let doc = memory(&scope, 99);
    let answer = json!({
        "user": {}, "history": {},
        "newFacts": [{"content": "User prefers Go for new services", "category": "preference",
                      "confidence": 0.92, "scope": "user", "durability": "durable",
                      "authority": "descriptive"}],
        "factsToRemove": [],
    })
    .to_string();
    let update = parse_update_response(&answer).unwrap_or_else(|e| panic!("{e}"));
    let usage = FactUsageMap::new();
    let n = Arc::new(AtomicU64::new(0));
    let ids = FactIdSource::from_fn(move || {
        let i = n.fetch_add(1, Ordering::Relaxed);
        FactId::new(format!("fact_n{i:07}")).unwrap_or_else(|e| panic!("{e}"))
    });
    c.bench_function("gates_one_new_fact_99_facts", |b| {
        b.iter(|| {
            let ctx = ApplyContext {
                config: &cfg,
                now: now(),
                thread_id: "thread-1",
                turns: &[],
                signals: SignalSet::default(),
                scope: &scope,
                usage: &usage,
                ids: &ids,
                consolidation_allowed: None,
            };
            black_box(apply_update(&doc, &update, &ctx).document.facts.len())
        })
    });
    let over = memory(&scope, 105);
    c.bench_function("gates_capacity_decision_105_of_100", |b| {
        b.iter(|| {
            capacity_decision(black_box(&over.facts), &cfg, &usage, now())
                .map(|d| d.decision.evicted.len())
        })
    });
}

criterion_group!(benches, bench_queries, bench_tokens, bench_gates);
criterion_main!(benches);
