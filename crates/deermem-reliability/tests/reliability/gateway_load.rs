//! The gateway under load: 64 concurrent HTTP clients (8 users by bearer token) mixing reads
//! and writes against the real router and DeerMem manager over TCP on 127.0.0.1. Every request
//! is answered, none with a 5xx, only with the statuses the contract allows, and afterwards
//! each user holds exactly their own facts.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use deermem_core::MemoryConfig;
use deermem_gateway::{GatewayConfig, GatewayState};
use deermem_reliability::{figure, pick};
use parking_lot_free::Counts;
use serde_json::{Value, json};

use crate::support;

/// Status counts without extra dependencies.
mod parking_lot_free {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    #[derive(Default)]
    pub(crate) struct Counts(pub(crate) Mutex<BTreeMap<u16, usize>>);

    impl Counts {
        pub(crate) fn add(&self, status: u16) {
            *self.0.lock().unwrap().entry(status).or_default() += 1;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_clients_mixing_reads_and_writes_get_no_5xx() {
    let clients = 64usize;
    let rounds: usize = pick(3, 25);
    let users = 8usize;
    let started = Instant::now();
    let tmp = tempfile::tempdir().unwrap();
    let manager = support::manager(tmp.path());
    let tokens: Vec<(String, String)> = (0..users)
        .map(|u| {
            (
                format!("token-{u}-0123456789abcdef"),
                format!("user{u}@example.com"),
            )
        })
        .collect();
    let cfg =
        GatewayConfig::with_tokens(tokens.iter().map(|(t, u)| (t.as_str(), u.as_str()))).unwrap();
    let state = GatewayState::new(manager, MemoryConfig::default(), cfg);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(deermem_gateway::serve(listener, state, async move {
        let _ = stop_rx.await;
    }));
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(clients)
        .build()
        .unwrap();
    let counts = Arc::new(Counts::default());
    let base = format!("http://{addr}");
    let handles: Vec<_> = (0..clients)
        .map(|c| {
            let (http, counts, base) = (http.clone(), counts.clone(), base.clone());
            let (token, user) = tokens[c % users].clone();
            tokio::spawn(async move {
                let auth = format!("Bearer {token}");
                for r in 0..rounds {
                    let content = format!("client {c} round {r} of {user} likes tea");
                    let resp = http
                        .post(format!("{base}/api/memory/facts"))
                        .header("authorization", &auth)
                        .json(&json!({"content": content, "category": "preference", "confidence": 0.8}))
                        .send()
                        .await
                        .expect("create answered");
                    counts.add(resp.status().as_u16());
                    let doc: Value = resp.json().await.unwrap_or(Value::Null);
                    let id = doc["facts"]
                        .as_array()
                        .and_then(|fs| fs.iter().find(|f| f["content"] == content.as_str()))
                        .and_then(|f| f["id"].as_str())
                        .map(str::to_owned);
                    for path in [
                        "/api/memory".to_owned(),
                        format!("/api/memory/search?q=client%20{c}&top_k=5"),
                        "/api/memory/context".to_owned(),
                    ] {
                        let resp = http
                            .get(format!("{base}{path}"))
                            .header("authorization", &auth)
                            .send()
                            .await
                            .expect("read answered");
                        counts.add(resp.status().as_u16());
                    }
                    if let Some(id) = id {
                        let resp = http
                            .patch(format!("{base}/api/memory/facts/{id}"))
                            .header("authorization", &auth)
                            .json(&json!({"content": format!("{content} (edited)")}))
                            .send()
                            .await
                            .expect("patch answered");
                        counts.add(resp.status().as_u16());
                        if r % 2 == 0 {
                            let resp = http
                                .delete(format!("{base}/api/memory/facts/{id}"))
                                .header("authorization", &auth)
                                .send()
                                .await
                                .expect("delete answered");
                            counts.add(resp.status().as_u16());
                        }
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.await.expect("client task");
    }
    // Each user holds only their own facts.
    for (token, user) in &tokens {
        let doc: Value = http
            .get(format!("{base}/api/memory"))
            .header("authorization", format!("Bearer {token}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        for f in doc["facts"].as_array().unwrap() {
            let content = f["content"].as_str().unwrap();
            assert!(
                content.contains(&format!("of {user} ")),
                "{user} sees {content}"
            );
        }
    }
    let _ = stop_tx.send(());
    server.await.unwrap().unwrap();
    let counts: BTreeMap<u16, usize> = counts.0.lock().unwrap().clone();
    let total: usize = counts.values().sum();
    let bad: Vec<_> = counts
        .keys()
        .filter(|s| !matches!(s, 200 | 404 | 409))
        .collect();
    assert!(bad.is_empty(), "unexpected statuses {counts:?}");
    assert!(
        counts.get(&200).copied().unwrap_or(0) > total / 2,
        "{counts:?}"
    );
    let test = "gateway_load";
    figure(test, "concurrent_clients", clients);
    figure(test, "requests", total);
    figure(test, "statuses", format!("{counts:?}"));
    figure(test, "seconds", started.elapsed().as_secs());
}
