//! Criterion bench of the YAML front-matter codec: parse and render of a typical fact front matter.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use deermem_pycompat::yaml::{
    parse_front_matter, parse_front_matter_fast, parse_front_matter_full, render_mapping,
};

/// A front matter as the reference writes it for a consolidated, confirmed fact.
const TYPICAL: &str = "id: fact_6624de2e72f548599395858571fc9ab6
category: preference
confidence: 0.95
createdAt: '2026-12-02T09:40:05.778374Z'
source:
  type: conversation
  threadId: thread-7f3a9c
schemaVersion: 2
status: active
topics:
- python
- '2026-01-02'
- 'yes'
- 中文
- emoji 🦌
consolidatedFrom:
- fact_4c6bdcabdf00403a8000717963b65559
- fact_5f290de347ed4046967e10a473881443
updatedAt: '2026-12-02T09:40:05.778374Z'
revision: 3
lastConfirmedAt: '2026-10-01T12:00:00Z'
confirmationCount: 2
consolidatedAt: '2026-12-02T09:40:05.778374Z'
expected_valid_days: 365
user_id: alice
agent_name: researcher";

fn bench(c: &mut Criterion) {
    let parsed = match parse_front_matter(TYPICAL) {
        Ok(fm) => fm.map,
        Err(e) => panic!("bench input must parse: {e}"),
    };
    c.bench_function("yaml_parse_typical_front_matter", |b| {
        b.iter(|| parse_front_matter(black_box(TYPICAL)))
    });
    c.bench_function("yaml_parse_typical_front_matter_fast_path_only", |b| {
        b.iter(|| parse_front_matter_fast(black_box(TYPICAL)))
    });
    c.bench_function("yaml_parse_typical_front_matter_full_reader_only", |b| {
        b.iter(|| parse_front_matter_full(black_box(TYPICAL)))
    });
    c.bench_function("yaml_render_typical_front_matter", |b| {
        b.iter(|| render_mapping(black_box(&parsed)))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
