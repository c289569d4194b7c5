//! The `GET /api/memory` body of a 100-fact document (about 40 KB): the gateway's writer
//! (`src/body.rs`: `serde_json::to_writer` over a borrowing view of the HTTP shape, into a
//! pre-sized buffer) against `serde_json::to_vec` of a `for_http` clone (what the gateway did
//! before body.rs existed). Figures and the decision they led to are in docs/benchmarks.md.

#![allow(dead_code)]

#[path = "../src/body.rs"]
mod body;

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use deermem_core::document::SummaryEntry;
use deermem_core::{FactScope, PublicFact, PublicMemoryDocument};

/// A document shaped like the bench corpus's 100-fact scopes.
fn document() -> PublicMemoryDocument {
    let mut d = PublicMemoryDocument::empty();
    d.revision = Some(100);
    d.last_updated = "2026-12-02T09:40:05.778374Z".into();
    let entry = |s: &str| SummaryEntry {
        summary: s.to_owned(),
        updated_at: "2026-12-02T09:40:05.778374Z".to_owned(),
    };
    d.user.work_context =
        entry("Builds a memory engine in Rust; reviews storage and gateway code.");
    d.user.personal_context = entry("Prefers short answers with code samples; drinks oolong tea.");
    d.history.recent_months =
        entry("Moved the YAML codec into its own crate; measured the gateway.");
    d.facts = (0..100)
        .map(|i| PublicFact {
            id: format!("fact_{i:032x}"),
            content: format!(
                "User {i} prefers \"short\" answers with code samples in Rust, reviews storage \
                 and gateway changes on Mondays, and keeps notes in Markdown (乌龙茶 {i})."
            ),
            category: "preference".into(),
            category_extension: None,
            topics: Some(vec!["rust".into(), "reviews".into(), format!("topic-{i}")]),
            confidence: 0.5 + f64::from(i) / 250.0,
            created_at: "2026-12-02T09:40:05.778374Z".into(),
            source: format!("thread-{i:08x}"),
            source_error: None,
            schema_version: Some(2),
            status: Some("active".into()),
            scope: Some(FactScope {
                user_id: Some("alice".into()),
                agent_name: Some("__default__".into()),
            }),
            revision: Some(u64::from(i) + 1),
            updated_at: Some("2026-12-02T09:40:05.778374Z".into()),
            consolidated_at: None,
            consolidated_from: None,
            title: Some("a title".into()),
            expected_valid_days: None,
            last_confirmed_at: None,
            confirmation_count: None,
        })
        .collect();
    d
}

fn bench(c: &mut Criterion) {
    let doc = document();
    let bytes = body::document_bytes(&doc);
    assert_eq!(
        bytes,
        serde_json::to_vec(&doc.clone().for_http()).expect("serialise")
    );
    eprintln!("document body: {} bytes", bytes.len());
    c.bench_function("body_gateway_writer_100_facts", |b| {
        b.iter(|| black_box(body::document_bytes(black_box(&doc))).len())
    });
    c.bench_function("body_to_vec_of_for_http_clone_100_facts", |b| {
        b.iter(|| {
            black_box(serde_json::to_vec(&black_box(&doc).clone().for_http()))
                .map_or(0, |v| v.len())
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
