//! Operational behaviour: `/healthz`, `/readyz`, `/metrics`, `/openapi.json` (checked against
//! the router), request ids, JSON error bodies, the request timeout, the `memory.enabled`
//! gate, and `serve` on a real loopback listener (warm-up in the background, graceful
//! shutdown, flush and close, refusal of remote addresses without auth), the last backend
//! failure in `/readyz` and the status document, and 501 answers kept out of the error log.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{Method, StatusCode};
use common::{Call, FakeManager, app, empty, json_req, ready_state, send};
use deermem_core::MemoryConfig;
use deermem_gateway::{GatewayConfig, GatewayState, Metrics, router, serve};
use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

#[tokio::test]
async fn healthz_and_readyz_follow_the_lifecycle() {
    let m = FakeManager::new();
    let state = GatewayState::new(m, MemoryConfig::default(), GatewayConfig::default());
    let a = router(state.clone());
    assert_eq!(
        send(&a, empty(Method::GET, "/healthz")).await.body,
        json!({"status": "ok"})
    );
    let r = send(&a, empty(Method::GET, "/readyz")).await;
    assert_eq!(
        (r.status, r.body),
        (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "starting"})
        )
    );
    state.mark_ready();
    let r = send(&a, empty(Method::GET, "/readyz")).await;
    assert_eq!(
        (r.status, r.body),
        (StatusCode::OK, json!({"status": "ready"}))
    );
    state.mark_stopping();
    let r = send(&a, empty(Method::GET, "/readyz")).await;
    assert_eq!(
        (r.status, r.body),
        (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "stopping"})
        )
    );
}

/// A remote backend's last failure (a fail-open read answered with empty memory) is shown in
/// the `/readyz` body and the status document; readiness itself does not change.
#[tokio::test]
async fn readyz_and_status_show_the_last_backend_failure() {
    let m = FakeManager::new();
    let state = ready_state(m.clone(), MemoryConfig::default(), GatewayConfig::default());
    let a = router(state);
    let r = send(&a, empty(Method::GET, "/api/memory/status")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.body.get("last_backend_failure").is_none(), "{}", r.body);
    m.set_backend_failure(Some(deermem_core::ports::BackendFailure {
        operation: "recall".into(),
        message: "OpenViking recall failed: [UNAUTHENTICATED] Invalid API key".into(),
        at: deermem_core::Timestamp::from_unix_seconds(1_780_000_000),
        count: 3,
    }));
    let want = json!({"operation": "recall",
        "message": "OpenViking recall failed: [UNAUTHENTICATED] Invalid API key",
        "at": "2026-05-28T20:26:40Z", "count": 3});
    let r = send(&a, empty(Method::GET, "/readyz")).await;
    assert_eq!(
        (r.status, r.body),
        (
            StatusCode::OK,
            json!({"status": "ready", "last_backend_failure": want.clone()})
        )
    );
    let r = send(&a, empty(Method::GET, "/api/memory/status")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["last_backend_failure"], want);
    let r = send(&a, empty(Method::GET, "/healthz")).await;
    assert_eq!(r.body, json!({"status": "ok"}));
}

/// An operation the backend does not offer is answered 501 and logged at debug level, not as
/// an error.
#[tokio::test]
async fn unsupported_operations_are_not_logged_as_errors() {
    if !deermem_testkit::isolation::run_alone("unsupported_operations_are_not_logged_as_errors") {
        return;
    }
    let captured = std::sync::Arc::new(parking_lot::Mutex::new(Vec::<u8>::new()));
    let writer = {
        let c = std::sync::Arc::clone(&captured);
        move || LogSink(std::sync::Arc::clone(&c))
    };
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(writer)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let m = FakeManager::new();
    m.fail("get_memory", || {
        deermem_core::ManagerError::unsupported("get memory", "OpenVikingMemoryManager")
    });
    let a = app(m);
    let r = send(&a, empty(Method::GET, "/api/memory")).await;
    assert_eq!(r.status, StatusCode::NOT_IMPLEMENTED);
    let logs = String::from_utf8_lossy(&captured.lock()).into_owned();
    assert!(logs.contains("memory operation refused"), "{logs}");
    assert!(!logs.contains("ERROR"), "{logs}");
}

struct LogSink(std::sync::Arc<parking_lot::Mutex<Vec<u8>>>);

impl std::io::Write for LogSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn metrics_count_requests_by_route_and_status() {
    let m = FakeManager::new();
    let metrics = Metrics::new();
    let state = ready_state(m, MemoryConfig::default(), GatewayConfig::default())
        .with_metrics(metrics.clone());
    let a = router(state);
    send(&a, empty(Method::GET, "/api/memory")).await;
    send(&a, empty(Method::GET, "/api/memory")).await;
    send(&a, empty(Method::DELETE, "/api/memory/facts/fact_missing")).await;
    send(&a, empty(Method::GET, "/no/such/route/12345")).await;
    metrics.set_queue_depth(4);
    metrics.inc_extraction_outcome("committed");
    metrics.inc_gate_rejection("scope");
    let r = send(&a, empty(Method::GET, "/metrics")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.headers["content-type"],
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    let text = r.text;
    for line in [
        "deermem_http_requests_total{route=\"/api/memory\",method=\"GET\",status=\"200\"} 2",
        "deermem_http_requests_total{route=\"/api/memory/facts/{fact_id}\",method=\"DELETE\",status=\"404\"} 1",
        "deermem_http_requests_total{route=\"unmatched\",method=\"GET\",status=\"404\"} 1",
        "deermem_http_request_duration_seconds_count{route=\"/api/memory\",method=\"GET\"} 2",
        "deermem_http_requests_in_flight 1",
        "deermem_memory_queue_depth 4",
        "deermem_extraction_outcomes_total{outcome=\"committed\"} 1",
        "deermem_gate_rejections_total{gate=\"scope\"} 1",
        "deermem_gateway_ready 1",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    assert!(!text.contains("12345"), "raw paths never become labels");
    assert_eq!(metrics.in_flight(), 0);
}

fn concrete(path: &str) -> String {
    path.replace("{fact_id}", "fact_probe")
        .replace("{thread_id}", "thread-probe")
        .replace("{run_id}", "run-probe")
        .replace("{turn_id}", "turn_probe")
}

#[tokio::test]
async fn openapi_lists_exactly_the_served_routes() {
    let a = app(FakeManager::new());
    let r = send(&a, empty(Method::GET, "/openapi.json")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.headers["content-type"], "application/json");
    assert_eq!(r.body["openapi"], "3.1.0");
    // Generated once: the same bytes every time, from any router.
    let again = send(&a, empty(Method::GET, "/openapi.json")).await;
    assert_eq!(again.text, r.text);
    let other = send(
        &app(FakeManager::new()),
        empty(Method::GET, "/openapi.json"),
    )
    .await;
    assert_eq!(other.text, r.text);
    let paths = r.body["paths"].as_object().cloned().unwrap_or_default();
    let mut documented: BTreeSet<(String, String)> = BTreeSet::new();
    for (path, ops) in &paths {
        for method in ops
            .as_object()
            .map(|o| o.keys().cloned().collect::<Vec<_>>())
            .unwrap_or_default()
        {
            documented.insert((method.to_ascii_uppercase(), path.clone()));
        }
    }
    // The routes, spelled out: one added or dropped shows here (and in the snapshot).
    let expected: BTreeSet<(String, String)> = [
        ("GET", "/api/memory"),
        ("DELETE", "/api/memory"),
        ("POST", "/api/memory/reload"),
        ("POST", "/api/memory/facts"),
        ("PATCH", "/api/memory/facts/{fact_id}"),
        ("DELETE", "/api/memory/facts/{fact_id}"),
        ("GET", "/api/memory/export"),
        ("POST", "/api/memory/import"),
        ("GET", "/api/memory/config"),
        ("GET", "/api/memory/status"),
        ("POST", "/api/memory/messages"),
        ("GET", "/api/memory/context"),
        ("GET", "/api/memory/search"),
        ("POST", "/api/memory/index/rebuild"),
        ("GET", "/api/threads/{thread_id}/runs/{run_id}/events"),
        ("GET", "/api/memory/turns"),
        ("POST", "/api/memory/turns/{turn_id}/retry"),
        ("DELETE", "/api/memory/turns/{turn_id}"),
        ("GET", "/healthz"),
        ("GET", "/readyz"),
        ("GET", "/metrics"),
        ("GET", "/openapi.json"),
        ("GET", "/docs"),
    ]
    .into_iter()
    .map(|(m, p)| (m.to_owned(), p.to_owned()))
    .collect();
    assert_eq!(documented, expected);
    for (method, path) in &documented {
        // The router serves it: not the router's 404/405.
        let m = Method::from_bytes(method.as_bytes()).expect("method");
        let req = if method == "POST" || method == "PATCH" {
            json_req(m, &concrete(path), &json!({}))
        } else {
            empty(m, &concrete(path))
        };
        let resp = send(&a, req).await;
        assert_ne!(
            resp.status,
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path}"
        );
        assert_ne!(resp.detail(), "Not Found", "{method} {path} is not served");
    }
    // And on every documented path, the undocumented methods are refused.
    for path in paths.keys() {
        for method in ["GET", "POST", "PATCH", "DELETE", "PUT"] {
            if documented.contains(&(method.to_owned(), path.clone())) {
                continue;
            }
            let resp = send(
                &a,
                empty(
                    Method::from_bytes(method.as_bytes()).expect("m"),
                    &concrete(path),
                ),
            )
            .await;
            assert_eq!(
                resp.status,
                StatusCode::METHOD_NOT_ALLOWED,
                "{method} {path} is served but undocumented"
            );
        }
    }
    // `/docs` lists every operation.
    let page = send(&a, empty(Method::GET, "/docs")).await.text;
    for (method, path) in &documented {
        assert!(
            page.contains(&format!("<code>{method} {path}</code>")),
            "{method} {path}"
        );
    }
}

#[tokio::test]
async fn request_ids_are_echoed_or_generated() {
    let a = app(FakeManager::new());
    let r = send(&a, empty(Method::GET, "/healthz")).await;
    let generated = r.headers["x-request-id"]
        .to_str()
        .expect("ascii")
        .to_owned();
    assert_eq!(generated.len(), 36, "a UUID: {generated}");
    let mut req = empty(Method::GET, "/api/memory");
    req.headers_mut()
        .insert("x-request-id", "client-req-1".parse().expect("header"));
    assert_eq!(send(&a, req).await.headers["x-request-id"], "client-req-1");
    let mut bad = empty(Method::GET, "/healthz");
    bad.headers_mut()
        .insert("x-request-id", "has spaces in it".parse().expect("header"));
    let r = send(&a, bad).await;
    assert_ne!(r.headers["x-request-id"], "has spaces in it");
}

#[tokio::test]
async fn router_errors_have_json_details() {
    let a = app(FakeManager::new());
    let r = send(&a, empty(Method::GET, "/api/nothing")).await;
    assert_eq!(
        (r.status, r.body),
        (StatusCode::NOT_FOUND, json!({"detail": "Not Found"}))
    );
    let r = send(&a, empty(Method::PUT, "/api/memory")).await;
    assert_eq!(
        (r.status, r.body.clone()),
        (
            StatusCode::METHOD_NOT_ALLOWED,
            json!({"detail": "Method Not Allowed"})
        )
    );
    assert!(r.headers.contains_key("allow"));
}

#[tokio::test]
async fn slow_requests_time_out_without_cancelling_the_write() {
    let m = FakeManager::new();
    let gate = m.pause("create_fact");
    let cfg = GatewayConfig {
        request_timeout: Duration::from_millis(200),
        ..GatewayConfig::default()
    };
    let a = router(ready_state(m.clone(), MemoryConfig::default(), cfg));
    let r = send(
        &a,
        json_req(
            Method::POST,
            "/api/memory/facts",
            &json!({"content": "slow write"}),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(r.detail(), "Request timed out after 0.2 seconds.");
    gate.open();
    // The manager call runs on its own task: it completes after the client gave up.
    let mut stored = false;
    for _ in 0..1000 {
        let r = send(&a, empty(Method::GET, "/api/memory")).await;
        if common::fact_contents(&r.body) == vec!["slow write".to_owned()] {
            stored = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(stored, "the write must not be cancelled by the timeout");
}

#[tokio::test]
async fn disabled_memory_answers_503_except_config() {
    let m = FakeManager::new();
    let memory = MemoryConfig {
        enabled: false,
        ..MemoryConfig::default()
    };
    let a = router(ready_state(m.clone(), memory, GatewayConfig::default()));
    // Every /api operation of the document; the gated ones are those it documents with the
    // backend's errors (501).
    let doc = send(&a, empty(Method::GET, "/openapi.json")).await.body;
    let mut checked = 0;
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        if !path.starts_with("/api/") {
            continue;
        }
        for (method, op) in ops.as_object().expect("operations") {
            let route = format!("{method} {path}");
            let needs_enabled = op["responses"].get("501").is_some();
            let method = Method::from_bytes(method.to_ascii_uppercase().as_bytes()).expect("m");
            let r = send(
                &a,
                json_req(method, &concrete(path), &json!({"content": "x"})),
            )
            .await;
            if needs_enabled {
                assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{route}");
                assert_eq!(r.detail(), "Memory is disabled (memory.enabled is false).");
            } else {
                assert_eq!(path, "/api/memory/config");
                assert_eq!(r.status, StatusCode::OK, "{route}");
                assert_eq!(r.body["enabled"], false);
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 18);
    assert!(m.calls().is_empty());
}

// ----------------------------------------------------------------------------------------
// serve() on a real loopback listener.

async fn http(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.expect("write");
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.expect("read");
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
    (status, body)
}

#[tokio::test]
async fn serve_drains_in_flight_requests_then_flushes_and_closes() {
    let m = FakeManager::new();
    let gate = m.pause("get_memory");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let memory = MemoryConfig {
        shutdown_flush_timeout_seconds: 7.0,
        ..MemoryConfig::default()
    };
    let state = GatewayState::new(m.clone(), memory, GatewayConfig::default());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(listener, state.clone(), async move {
        let _ = stop_rx.await;
    }));
    let client = tokio::spawn(async move { http(addr, "GET", "/api/memory").await });
    gate.entered.notified().await;
    stop_tx.send(()).expect("stop");
    // Give a wrong implementation the chance to flush before the request finishes.
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !m.calls().contains(&Call::Close),
        "closed with a request in flight"
    );
    gate.open();
    let (status, body) = client.await.expect("client");
    assert_eq!(status, 200, "{body}");
    server.await.expect("server task").expect("serve");
    let calls = m.calls();
    let pos = |c: &Call| calls.iter().position(|x| x == c);
    let get = pos(&Call::GetMemory {
        user: Some("default".into()),
        agent: None,
    })
    .expect("get");
    let flush = pos(&Call::ShutdownFlush(Duration::from_secs(7))).expect("flush");
    let close = pos(&Call::Close).expect("close");
    assert!(get < flush && flush < close, "{calls:?}");
    assert_eq!(close, calls.len() - 1);
    assert!(calls.contains(&Call::Warm), "warm-up ran at start");
    assert_eq!(state.lifecycle(), deermem_gateway::Lifecycle::Stopping);
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "no longer accepting"
    );
}

#[tokio::test]
async fn readiness_does_not_wait_for_the_warm_up() {
    let m = FakeManager::new();
    let gate = m.pause("warm");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let state = GatewayState::new(m.clone(), MemoryConfig::default(), GatewayConfig::default());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(listener, state, async move {
        let _ = stop_rx.await;
    }));
    gate.entered.notified().await;
    let (status, body) = http(addr, "GET", "/readyz").await;
    assert_eq!((status, body.as_str()), (200, "{\"status\":\"ready\"}"));
    let (status, _) = http(addr, "POST", "/api/memory/index/rebuild").await;
    assert_eq!(status, 409, "the start-up warm-up is still running");
    gate.open();
    stop_tx.send(()).expect("stop");
    server.await.expect("server task").expect("serve");
    assert_eq!(m.calls().last(), Some(&Call::Close));
}

#[tokio::test]
async fn disabled_memory_skips_warm_up_and_flush() {
    let m = FakeManager::new();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let memory = MemoryConfig {
        enabled: false,
        ..MemoryConfig::default()
    };
    let state = GatewayState::new(m.clone(), memory, GatewayConfig::default());
    serve(listener, state, async {}).await.expect("serve");
    assert_eq!(m.calls(), vec![Call::Close]);
}

#[tokio::test]
async fn serve_refuses_remote_addresses_without_authentication() {
    let m = FakeManager::new();
    let listener = TcpListener::bind("0.0.0.0:0").await.expect("bind");
    let state = GatewayState::new(m.clone(), MemoryConfig::default(), GatewayConfig::default());
    let err = serve(listener, state, async {})
        .await
        .expect_err("must refuse");
    assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied);
    assert!(
        err.to_string().contains("gateway.auth.mode: token"),
        "{err}"
    );
    assert!(m.calls().is_empty(), "nothing started");
    // With token auth the same address is fine.
    let listener = TcpListener::bind("0.0.0.0:0").await.expect("bind");
    let cfg = GatewayConfig::with_tokens([("t", "alice")]).expect("tokens");
    let state = GatewayState::new(Arc::clone(&m) as _, MemoryConfig::default(), cfg);
    serve(listener, state, async {})
        .await
        .expect("serve with auth");
}
