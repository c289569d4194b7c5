//! The `GET /api/memory` body of a 100-fact document (about 50 KB), three ways: the gateway's
//! hand-written writer (`src/body.rs`, one pre-sized buffer, word-at-a-time string escaping),
//! `serde_json::to_writer` over a borrowing view of the HTTP shape into the same pre-sized
//! buffer (the library alternative, below), and `serde_json::to_vec` of a `for_http` clone
//! (what the gateway did before `body.rs`). All three write the same bytes (checked first).
//! The figures, and why `body.rs` stays, are in docs/benchmarks.md.

#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(dead_code)]

#[path = "../src/body.rs"]
mod body;

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use deermem_core::document::{PublicHistorySummaries, PublicUserSummaries, SummaryEntry};
use deermem_core::{FactScope, PublicFact, PublicMemoryDocument};

/// The document in its HTTP shape, borrowed.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct HttpDocument<'a> {
    version: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    revision: Option<u64>,
    last_updated: &'a str,
    user: &'a PublicUserSummaries,
    history: &'a PublicHistorySummaries,
    #[serde(serialize_with = "http_facts")]
    facts: &'a [PublicFact],
}

impl<'a> HttpDocument<'a> {
    pub(crate) fn new(doc: &'a PublicMemoryDocument) -> Self {
        let PublicMemoryDocument {
            version,
            revision,
            last_updated,
            user,
            history,
            facts,
        } = doc;
        Self {
            version,
            revision: *revision,
            last_updated,
            user,
            history,
            facts,
        }
    }
}

fn http_facts<S: serde::Serializer>(facts: &&[PublicFact], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(facts.iter().map(HttpFact::new))
}

/// One fact in the HTTP shape, borrowed: `title`, `expected_valid_days`, `lastConfirmedAt` and
/// `confirmationCount` are left out (what `PublicFact::for_http` clears); other `None` options
/// are skipped as `PublicFact`'s serde attributes say.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct HttpFact<'a> {
    id: &'a str,
    content: &'a str,
    category: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    category_extension: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    topics: Option<&'a [String]>,
    confidence: f64,
    created_at: &'a str,
    source: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    source_error: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    schema_version: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    scope: Option<&'a FactScope>,
    #[serde(skip_serializing_if = "Option::is_none")]
    revision: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    updated_at: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    consolidated_at: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    consolidated_from: Option<&'a [String]>,
}

impl<'a> HttpFact<'a> {
    fn new(f: &'a PublicFact) -> Self {
        let PublicFact {
            id,
            content,
            category,
            category_extension,
            topics,
            confidence,
            created_at,
            source,
            source_error,
            schema_version,
            status,
            scope,
            revision,
            updated_at,
            consolidated_at,
            consolidated_from,
            title: _,
            expected_valid_days: _,
            last_confirmed_at: _,
            confirmation_count: _,
        } = f;
        Self {
            id,
            content,
            category,
            category_extension: category_extension.as_deref(),
            topics: topics.as_deref(),
            confidence: *confidence,
            created_at,
            source,
            source_error: source_error.as_deref(),
            schema_version: *schema_version,
            status: status.as_deref(),
            scope: scope.as_ref(),
            revision: *revision,
            updated_at: updated_at.as_deref(),
            consolidated_at: consolidated_at.as_deref(),
            consolidated_from: consolidated_from.as_deref(),
        }
    }
}

/// `serde_json::to_writer` over [`HttpDocument`] into a buffer of `body::size_hint` bytes.
fn serde_view_bytes(doc: &PublicMemoryDocument) -> Vec<u8> {
    let mut out = Vec::with_capacity(body::size_hint(doc));
    serde_json::to_writer(&mut out, &HttpDocument::new(doc)).expect("serialise");
    out
}

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
    d.facts = (0..100_u32)
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
    assert_eq!(serde_view_bytes(&doc), bytes);
    c.bench_function("body_hand_written_writer_100_facts", |b| {
        b.iter(|| black_box(body::document_bytes(black_box(&doc))).len())
    });
    c.bench_function("body_serde_view_to_writer_100_facts", |b| {
        b.iter(|| black_box(serde_view_bytes(black_box(&doc))).len())
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
