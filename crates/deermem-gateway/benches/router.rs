//! Gateway overhead per request, through the whole layer stack (request id, metrics, timeout,
//! body limit, authentication) over the in-memory recording manager: a token-authenticated
//! `GET /api/memory` of a 100-fact document, a `POST /api/memory/facts` rejected by validation
//! (422), and a `/metrics` scrape.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::hint::black_box;

use axum::http::Method;
use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let manager = common::FakeManager::new();
    let app = common::token_app(manager.clone(), &[("tok-a", "alice")]);
    rt.block_on(async {
        for i in 0..100 {
            let body = json!({"content": format!("Fact number {i} about tools and habits")});
            let r = common::send(
                &app,
                common::with_bearer(
                    common::json_req(Method::POST, "/api/memory/facts", &body),
                    "tok-a",
                ),
            )
            .await;
            assert!(r.status.is_success(), "{}", r.text);
        }
    });
    manager.clear_calls();
    c.bench_function("get_memory_100_facts", |b| {
        b.iter(|| {
            rt.block_on(async {
                let r = common::send(
                    &app,
                    common::with_bearer(common::empty(Method::GET, "/api/memory"), "tok-a"),
                )
                .await;
                black_box(r.status)
            })
        });
        manager.clear_calls();
    });
    c.bench_function("create_fact_422", |b| {
        b.iter(|| {
            rt.block_on(async {
                let r = common::send(
                    &app,
                    common::with_bearer(
                        common::json_req(
                            Method::POST,
                            "/api/memory/facts",
                            &json!({"confidence": 2}),
                        ),
                        "tok-a",
                    ),
                )
                .await;
                black_box(r.status)
            })
        });
    });
    c.bench_function("metrics_scrape", |b| {
        b.iter(|| {
            rt.block_on(async {
                let r = common::send(&app, common::empty(Method::GET, "/metrics")).await;
                black_box(r.text.len())
            })
        });
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
