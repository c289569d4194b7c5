//! Criterion benchmarks of the file storage: loading a 100-fact scope cold (a fresh instance,
//! so the cache is empty and every fact file is parsed) and warm (a cache hit), and the full
//! commit protocol for a one-fact write.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{Criterion, criterion_group, criterion_main};
use deermem_core::ports::Clock;
use deermem_core::prelude::*;
use deermem_core::{AgentName, ApplyOptions, ChangeSet, FactId, Timestamp, UserId};
use deermem_storage_file::{FileStorage, FileStorageConfig};
use serde_json::json;

#[derive(Debug)]
struct BenchClock;

impl Clock for BenchClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_unix_seconds(1_800_000_000)
    }
}

fn open(root: &std::path::Path) -> FileStorage {
    FileStorage::new(FileStorageConfig::new(root), Arc::new(BenchClock), None)
        .unwrap_or_else(|e| panic!("storage: {e}"))
}

fn bench_storage(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let user = UserId::new("bench@example.com").unwrap_or_else(|e| panic!("{e}"));
    let agent = AgentName::parse("coder").unwrap_or_else(|e| panic!("{e}"));
    let seed = open(dir.path());
    let drafts = (0..100)
        .map(|i| {
            json!({
                "id": format!("fact_{i:08x}"),
                "content": format!("Fact number {i}: prefers descriptive names and small functions in Rust code."),
                "category": "preference",
                "confidence": 0.8,
                "topics": ["rust", "style"],
                "source": "thread-bench",
            })
            .try_into()
            .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    rt.block_on(seed.apply_changes(
        Some(&user),
        Some(&agent),
        ChangeSet {
            upserts: drafts,
            ..ChangeSet::default()
        },
        ApplyOptions::default(),
    ))
    .unwrap_or_else(|e| panic!("seed: {e}"));

    c.bench_function("load_100_facts_cold", |b| {
        b.iter(|| {
            let s = open(dir.path());
            let doc = rt
                .block_on(s.load(Some(&user), Some(&agent)))
                .unwrap_or_else(|e| panic!("{e}"));
            black_box(doc.facts.len())
        });
    });

    let warm = open(dir.path());
    rt.block_on(warm.load(Some(&user), Some(&agent)))
        .unwrap_or_else(|e| panic!("{e}"));
    c.bench_function("load_100_facts_warm", |b| {
        b.iter(|| {
            let doc = rt
                .block_on(warm.load(Some(&user), Some(&agent)))
                .unwrap_or_else(|e| panic!("{e}"));
            black_box(doc.facts.len())
        });
    });

    let writer = open(dir.path());
    let counter = AtomicU64::new(0);
    let id = FactId::new("fact_00000000").unwrap_or_else(|e| panic!("{e}"));
    c.bench_function("write_one_fact", |b| {
        b.iter(|| {
            let n = counter.fetch_add(1, Ordering::Relaxed);
            let current = rt
                .block_on(writer.get_fact(Some(&user), &agent, &id))
                .unwrap_or_else(|e| panic!("{e}"))
                .unwrap_or_else(|| panic!("seeded fact"));
            let mut d = current.to_draft();
            d.remove("title");
            let d = d
                .with_content(&format!("Rewritten {n}"))
                .unwrap_or_else(|e| panic!("{e}"));
            let r = rt
                .block_on(writer.upsert_fact(Some(&user), &agent, d, None, Some(current.revision)))
                .unwrap_or_else(|e| panic!("{e}"));
            black_box(r.revision)
        });
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(3));
    targets = bench_storage
}
criterion_main!(benches);
