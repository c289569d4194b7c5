//! Snapshot tests (`insta`) of the gateway's golden outputs: the served `/openapi.json`, and
//! `/metrics` after a fixed sequence of requests, with the timing-dependent figures (latency
//! sums and finite bucket counts) redacted and each family's samples sorted by series (the
//! library keeps them in hash order). A change fails with a diff; see CONTRIBUTING.md for how to review one.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use axum::http::{Method, StatusCode};
use common::{FakeManager, app, empty, json_req, ready_state, send};
use deermem_core::MemoryConfig;
use deermem_gateway::{GatewayConfig, Metrics, router};
use serde_json::json;

#[tokio::test]
async fn openapi_document() {
    let r = send(
        &app(FakeManager::new()),
        empty(Method::GET, "/openapi.json"),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let mut doc = r.body;
    // The crate version changes with releases, not with the API.
    doc["info"]["version"] = json!("[version]");
    let text = serde_json::to_string_pretty(&doc).expect("JSON");
    insta::assert_snapshot!("openapi", text);
}

/// The exposition with values that depend on timing replaced: `_sum` lines and the counts of
/// finite `le` buckets (`+Inf` is the request count); samples sorted within each family.
fn deterministic(text: &str) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut samples: Vec<String> = Vec::new();
    // Grouped by series (labels without `le`), keeping the exposition's order within one:
    // `_sum`, `_count`, then the buckets in increasing bounds.
    let flush = |out: &mut Vec<String>, samples: &mut Vec<String>| {
        samples.sort_by_key(|line| {
            let labels = line
                .split_once('{')
                .and_then(|(_, rest)| rest.split_once('}'))
                .map_or("", |(labels, _)| labels);
            match labels.strip_prefix("le=\"") {
                Some(rest) => rest.split_once("\",").map_or("", |(_, r)| r).to_owned(),
                None => labels.to_owned(),
            }
        });
        out.append(samples);
    };
    for line in text.lines() {
        if line.starts_with('#') {
            flush(&mut out, &mut samples);
            out.push(line.to_owned());
            continue;
        }
        let timing =
            line.contains("_sum{") || (line.contains("_bucket{") && !line.contains("le=\"+Inf\""));
        match line.rsplit_once(' ') {
            Some((series, _)) if timing => samples.push(format!("{series} [timing]")),
            _ => samples.push(line.to_owned()),
        }
    }
    flush(&mut out, &mut samples);
    out.join("\n")
}

#[tokio::test]
async fn metrics_after_a_fixed_sequence() {
    let metrics = Metrics::new();
    let state = ready_state(
        FakeManager::new(),
        MemoryConfig::default(),
        GatewayConfig::default(),
    )
    .with_metrics(metrics.clone());
    let a = router(state);
    let sequence = [
        (empty(Method::GET, "/healthz"), StatusCode::OK),
        (empty(Method::GET, "/api/memory"), StatusCode::OK),
        (empty(Method::GET, "/api/memory"), StatusCode::OK),
        (
            json_req(
                Method::POST,
                "/api/memory/facts",
                &json!({"content": "Prefers Rust"}),
            ),
            StatusCode::OK,
        ),
        (
            json_req(Method::POST, "/api/memory/facts", &json!({"confidence": 7})),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            empty(Method::DELETE, "/api/memory/facts/fact_missing"),
            StatusCode::NOT_FOUND,
        ),
        (empty(Method::GET, "/no/such/route"), StatusCode::NOT_FOUND),
        (
            empty(Method::PUT, "/api/memory"),
            StatusCode::METHOD_NOT_ALLOWED,
        ),
    ];
    for (request, status) in sequence {
        let uri = request.uri().clone();
        assert_eq!(send(&a, request).await.status, status, "{uri}");
    }
    metrics.set_queue_depth(4);
    metrics.inc_extraction_outcome("committed");
    metrics.inc_extraction_outcome("committed");
    metrics.inc_extraction_outcome("llm_error");
    metrics.inc_gate_rejection("scope");
    let r = send(&a, empty(Method::GET, "/metrics")).await;
    assert_eq!(r.status, StatusCode::OK);
    insta::assert_snapshot!("metrics", deterministic(&r.text));
}
