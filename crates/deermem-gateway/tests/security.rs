//! Identity and isolation (who owns a request, and that no user reaches another's memory):
//! owner header rules for internal callers and browsers (the reference's router tests), bearer
//! tokens, forged internal tokens, cross-user access through every route, hostile ids and agent
//! names, oversized bodies, the loopback guard, and secrets kept out of responses and logs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Write;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, StatusCode};
use common::{
    Call, FakeManager, INTERNAL_TOKEN, empty, json_req, ready_state, send, token_app, with_bearer,
};
use deermem_core::MemoryConfig;
use deermem_core::config::ConfigSecret;
use deermem_gateway::{GatewayConfig, router};
use serde_json::json;

fn internal(
    mut r: axum::http::Request<Body>,
    token: &str,
    owner: Option<&str>,
) -> axum::http::Request<Body> {
    r.headers_mut()
        .insert("x-deerflow-internal-token", token.parse().expect("header"));
    if let Some(o) = owner {
        r.headers_mut()
            .insert("x-deerflow-owner-user-id", o.parse().expect("header"));
    }
    r
}

fn users(calls: &[Call]) -> Vec<Option<String>> {
    calls
        .iter()
        .filter_map(|c| c.user().map(|u| u.map(str::to_owned)))
        .collect()
}

// ----------------------------------------------------------------------------------------
// Owner resolution (the reference's router tests).

#[tokio::test]
async fn get_memory_honors_bound_owner_header() {
    let m = FakeManager::new();
    let a = token_app(m.clone(), &[("tok-a", "alice")]);
    let r = send(
        &a,
        internal(
            empty(Method::GET, "/api/memory"),
            INTERNAL_TOKEN,
            Some("owner-1"),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(
        m.calls(),
        vec![Call::GetMemory {
            user: Some("owner-1".into()),
            agent: None
        }]
    );
}

#[tokio::test]
async fn get_memory_sanitizes_unsafe_owner_header() {
    let m = FakeManager::new();
    let a = token_app(m.clone(), &[("tok-a", "alice")]);
    let raw = "feishu|ou_AbC/123";
    let r = send(
        &a,
        internal(empty(Method::GET, "/api/memory"), INTERNAL_TOKEN, Some(raw)),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let expected = deermem_core::ids::safe_user_id(raw).expect("safe id");
    assert_ne!(expected, raw);
    assert_eq!(expected, "feishu-ou_AbC-123-bbd8f53c62c2d1ce");
    assert_eq!(
        m.calls(),
        vec![Call::GetMemory {
            user: Some(expected),
            agent: None
        }]
    );
}

#[tokio::test]
async fn internal_caller_without_owner_header_is_the_default_user() {
    let m = FakeManager::new();
    let a = token_app(m.clone(), &[("tok-a", "alice")]);
    for owner in [None, Some("   ")] {
        m.clear_calls();
        let r = send(
            &a,
            internal(empty(Method::GET, "/api/memory"), INTERNAL_TOKEN, owner),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(users(&m.calls()), vec![Some("default".to_owned())]);
    }
}

#[tokio::test]
async fn get_memory_falls_back_to_effective_user_for_browser_requests() {
    let m = FakeManager::new();
    let a = token_app(m.clone(), &[("tok-a", "alice")]);
    let mut r = with_bearer(empty(Method::GET, "/api/memory"), "tok-a");
    r.headers_mut().insert(
        "x-deerflow-owner-user-id",
        "owner-1".parse().expect("header"),
    );
    let resp = send(&a, r).await;
    assert_eq!(resp.status, StatusCode::OK);
    assert_eq!(
        m.calls(),
        vec![Call::GetMemory {
            user: Some("alice".into()),
            agent: None
        }]
    );
}

#[tokio::test]
async fn owner_header_is_ignored_without_auth_too() {
    let m = FakeManager::new();
    let a = common::app(m.clone());
    let mut r = empty(Method::GET, "/api/memory");
    r.headers_mut().insert(
        "x-deerflow-owner-user-id",
        "victim".parse().expect("header"),
    );
    assert_eq!(send(&a, r).await.status, StatusCode::OK);
    assert_eq!(users(&m.calls()), vec![Some("default".to_owned())]);
}

#[tokio::test]
async fn clear_memory_scopes_destructive_write_to_bound_owner() {
    let m = FakeManager::new();
    let a = token_app(m.clone(), &[("tok-a", "alice")]);
    let r = send(
        &a,
        internal(
            empty(Method::DELETE, "/api/memory"),
            INTERNAL_TOKEN,
            Some("owner-1"),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let mut spoof = with_bearer(empty(Method::DELETE, "/api/memory"), "tok-a");
    spoof.headers_mut().insert(
        "x-deerflow-owner-user-id",
        "owner-1".parse().expect("header"),
    );
    assert_eq!(send(&a, spoof).await.status, StatusCode::OK);
    assert_eq!(
        m.calls(),
        vec![
            Call::Clear {
                user: Some("owner-1".into()),
                agent: None
            },
            Call::Clear {
                user: Some("alice".into()),
                agent: None
            }
        ]
    );
}

#[tokio::test]
async fn import_memory_scopes_overwrite_to_bound_owner() {
    let m = FakeManager::new();
    let a = token_app(m.clone(), &[("tok-a", "alice")]);
    let doc = json!({"facts": [{"id": "fact_a", "content": "x"}]});
    let r = send(
        &a,
        internal(
            json_req(Method::POST, "/api/memory/import", &doc),
            INTERNAL_TOKEN,
            Some("owner-1"),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let mut spoof = with_bearer(json_req(Method::POST, "/api/memory/import", &doc), "tok-a");
    spoof.headers_mut().insert(
        "x-deerflow-owner-user-id",
        "owner-1".parse().expect("header"),
    );
    assert_eq!(send(&a, spoof).await.status, StatusCode::OK);
    assert_eq!(
        users(&m.calls()),
        vec![Some("owner-1".to_owned()), Some("alice".to_owned())]
    );
}

// ----------------------------------------------------------------------------------------
// Authentication.

#[tokio::test]
async fn token_mode_requires_a_valid_bearer_token() {
    let m = FakeManager::new();
    let a = token_app(m.clone(), &[("tok-a", "alice")]);
    for token in [None, Some("wrong"), Some("tok-a-but-longer"), Some("")] {
        let mut r = empty(Method::GET, "/api/memory");
        if let Some(t) = token {
            r.headers_mut().insert(
                "authorization",
                format!("Bearer {t}").parse().expect("header"),
            );
        }
        let resp = send(&a, r).await;
        assert_eq!(resp.status, StatusCode::UNAUTHORIZED, "{token:?}");
        assert_eq!(resp.body, json!({"detail": "Not authenticated"}));
        assert_eq!(resp.headers["www-authenticate"], "Bearer");
    }
    let resp = send(&a, empty(Method::GET, "/api/memory/config")).await;
    assert_eq!(
        resp.status,
        StatusCode::UNAUTHORIZED,
        "config needs auth too"
    );
    assert!(m.calls().is_empty());
    // Operational routes stay open.
    for path in ["/healthz", "/readyz", "/metrics", "/openapi.json"] {
        assert_eq!(
            send(&a, empty(Method::GET, path)).await.status,
            StatusCode::OK,
            "{path}"
        );
    }
}

#[tokio::test]
async fn a_forged_internal_token_is_rejected_not_ignored() {
    let m = FakeManager::new();
    let a = token_app(m.clone(), &[("tok-a", "alice")]);
    let r = send(
        &a,
        internal(
            empty(Method::GET, "/api/memory"),
            "guessed-token",
            Some("victim"),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(r.detail(), "Invalid internal token");
    // Even with a valid bearer token, a wrong internal token is refused.
    let r = send(
        &a,
        with_bearer(
            internal(empty(Method::GET, "/api/memory"), "guessed", Some("victim")),
            "tok-a",
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    // Without a configured internal token, any internal token is refused (no-auth mode too).
    let plain = common::app(m.clone());
    let r = send(
        &plain,
        internal(
            empty(Method::GET, "/api/memory"),
            INTERNAL_TOKEN,
            Some("victim"),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert!(m.calls().is_empty());
}

#[tokio::test]
async fn internal_token_works_in_no_auth_mode_when_configured() {
    let m = FakeManager::new();
    let mut cfg = GatewayConfig::default();
    cfg.auth.internal_token = Some(ConfigSecret::new(INTERNAL_TOKEN));
    let a = router(ready_state(m.clone(), MemoryConfig::default(), cfg));
    let r = send(
        &a,
        internal(
            empty(Method::GET, "/api/memory"),
            INTERNAL_TOKEN,
            Some("im-user"),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(users(&m.calls()), vec![Some("im-user".to_owned())]);
}

#[tokio::test]
async fn hostile_owner_headers_are_400() {
    let m = FakeManager::new();
    let a = token_app(m.clone(), &[("tok-a", "alice")]);
    let huge = "x".repeat(10_000);
    let r = send(
        &a,
        internal(
            empty(Method::GET, "/api/memory"),
            INTERNAL_TOKEN,
            Some(&huge),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(
        r.detail()
            .starts_with("Invalid X-DeerFlow-Owner-User-Id header"),
        "{}",
        r.text
    );
    let mut bytes = internal(empty(Method::GET, "/api/memory"), INTERNAL_TOKEN, None);
    bytes.headers_mut().insert(
        "x-deerflow-owner-user-id",
        axum::http::HeaderValue::from_bytes(b"caf\xe9").expect("opaque header"),
    );
    assert_eq!(send(&a, bytes).await.status, StatusCode::BAD_REQUEST);
    assert!(m.calls().is_empty());
}

// ----------------------------------------------------------------------------------------
// Cross-user access through every route.

#[tokio::test]
async fn user_a_reaches_only_user_a_through_every_route() {
    let m = FakeManager::new();
    let a = token_app(m.clone(), &[("tok-a", "alice"), ("tok-b", "bob")]);
    let r = send(
        &a,
        with_bearer(
            json_req(
                Method::POST,
                "/api/memory/facts",
                &json!({"content": "Bob's fact"}),
            ),
            "tok-b",
        ),
    )
    .await;
    let bob_fact = common::fact_ids(&r.body)[0].clone();
    m.clear_calls();
    let requests = vec![
        empty(Method::GET, "/api/memory"),
        empty(Method::GET, "/api/memory/export"),
        empty(Method::GET, "/api/memory/status"),
        empty(Method::POST, "/api/memory/reload"),
        empty(Method::GET, "/api/memory/search?q=Bob"),
        empty(Method::GET, "/api/memory/context?thread_id=t"),
        json_req(
            Method::PATCH,
            &format!("/api/memory/facts/{bob_fact}"),
            &json!({"content": "pwned"}),
        ),
        empty(Method::DELETE, &format!("/api/memory/facts/{bob_fact}")),
        json_req(
            Method::POST,
            "/api/memory/facts",
            &json!({"content": "alice fact"}),
        ),
        json_req(
            Method::POST,
            "/api/memory/messages",
            &json!({"thread_id": "t", "messages": []}),
        ),
        json_req(Method::POST, "/api/memory/import", &json!({"facts": []})),
        empty(Method::DELETE, "/api/memory"),
    ];
    let n = requests.len();
    for r in requests {
        let uri = r.uri().to_string();
        let resp = send(&a, with_bearer(r, "tok-a")).await;
        assert!(
            !resp.text.contains("Bob's fact"),
            "{uri} leaked bob's data: {}",
            resp.text
        );
    }
    let seen = users(&m.calls());
    assert_eq!(seen.len(), n, "{:?}", m.calls());
    assert!(
        seen.iter().all(|u| u.as_deref() == Some("alice")),
        "{seen:?}"
    );
    // Bob's fact survived everything alice did.
    let r = send(&a, with_bearer(empty(Method::GET, "/api/memory"), "tok-b")).await;
    assert_eq!(common::fact_ids(&r.body), vec![bob_fact]);
}

// ----------------------------------------------------------------------------------------
// Hostile ids and agent names never reach the manager.

#[tokio::test]
async fn hostile_fact_ids_and_agent_names_are_400() {
    let m = FakeManager::new();
    let a = common::app(m.clone());
    let long_id = "a".repeat(300);
    let long_agent = "b".repeat(60_000);
    let cases = vec![
        (
            Method::DELETE,
            "/api/memory/facts/..%2F..%2Fetc%2Fpasswd".to_owned(),
        ),
        (Method::DELETE, "/api/memory/facts/fact%00x".to_owned()),
        (Method::DELETE, "/api/memory/facts/fact.md".to_owned()),
        (Method::DELETE, format!("/api/memory/facts/{long_id}")),
        (Method::DELETE, "/api/memory/facts/%FF%FE".to_owned()),
        (Method::PATCH, "/api/memory/facts/..%2Fx".to_owned()),
        (
            Method::GET,
            "/api/memory?agent=..%2F..%2Fusers%2Fbob".to_owned(),
        ),
        (Method::GET, "/api/memory?agent=a%00b".to_owned()),
        (Method::GET, "/api/memory?agent=a_b".to_owned()),
        (Method::GET, "/api/memory?agent=agent%0A".to_owned()),
        (Method::GET, format!("/api/memory?agent={long_agent}")),
        (Method::DELETE, "/api/memory?agent=..".to_owned()),
        (
            Method::GET,
            "/api/memory/search?q=x&agent=%2Fetc".to_owned(),
        ),
        (Method::POST, "/api/memory/facts?agent=x%2Fy".to_owned()),
    ];
    for (method, uri) in cases {
        let req = if method == Method::GET || method == Method::DELETE {
            empty(method.clone(), &uri)
        } else {
            json_req(method.clone(), &uri, &json!({"content": "x"}))
        };
        let r = send(&a, req).await;
        assert_eq!(
            r.status,
            StatusCode::BAD_REQUEST,
            "{method} {}: {}",
            &uri[..uri.len().min(80)],
            r.text
        );
        assert!(
            r.detail().contains("fact id")
                || r.detail().contains("agent name")
                || r.detail().contains("Agent name"),
            "{}",
            r.text
        );
        assert!(r.text.len() < 1024, "error echoes are bounded");
    }
    let r = send(
        &a,
        json_req(
            Method::POST,
            "/api/memory/messages",
            &json!({"thread_id": "t", "agent": "../x", "messages": []}),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(m.calls().is_empty(), "{:?}", m.calls());
}

// ----------------------------------------------------------------------------------------
// Body size limit.

#[tokio::test]
async fn oversized_bodies_get_413() {
    let m = FakeManager::new();
    let cfg = GatewayConfig {
        max_body_bytes: 1024,
        ..GatewayConfig::default()
    };
    let a = router(ready_state(m.clone(), MemoryConfig::default(), cfg));
    let big = json!({"content": "x".repeat(4096)}).to_string();
    // Declared length: refused before the body is read.
    let declared = common::req(Method::POST, "/api/memory/facts")
        .header("content-type", "application/json")
        .header("content-length", big.len())
        .body(Body::from(big.clone()))
        .expect("request");
    let r = send(&a, declared).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        r.detail(),
        "Request body is larger than the limit of 1024 bytes."
    );
    // No declared length: refused while reading.
    let streamed = common::req(Method::POST, "/api/memory/import")
        .header("content-type", "application/json")
        .body(Body::from(big))
        .expect("request");
    let r = send(&a, streamed).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        r.detail(),
        "Request body is larger than the limit of 1024 bytes."
    );
    assert!(m.calls().is_empty());
    // The default limit (2 MiB) refuses a 10 MB string.
    let d = common::app(m.clone());
    let huge = json!({"content": "y".repeat(10 * 1024 * 1024)});
    assert_eq!(
        send(&d, json_req(Method::POST, "/api/memory/facts", &huge))
            .await
            .status,
        StatusCode::PAYLOAD_TOO_LARGE
    );
    assert!(m.calls().is_empty());
}

// ----------------------------------------------------------------------------------------
// Loopback guard of the unauthenticated mode.

#[tokio::test]
async fn unauthenticated_mode_answers_only_loopback_hosts_and_origins() {
    let m = FakeManager::new();
    let a = common::app(m.clone());
    let mut rebinding = empty(Method::GET, "/api/memory");
    rebinding
        .headers_mut()
        .insert("host", "attacker.example:8765".parse().expect("header"));
    let r = send(&a, rebinding).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let mut cross_site = json_req(Method::POST, "/api/memory/facts", &json!({"content": "x"}));
    cross_site
        .headers_mut()
        .insert("host", "127.0.0.1:8765".parse().expect("header"));
    cross_site.headers_mut().insert(
        "origin",
        "https://attacker.example".parse().expect("header"),
    );
    assert_eq!(send(&a, cross_site).await.status, StatusCode::FORBIDDEN);
    let mut local = empty(Method::GET, "/api/memory");
    local
        .headers_mut()
        .insert("host", "localhost:8765".parse().expect("header"));
    local
        .headers_mut()
        .insert("origin", "http://localhost:3000".parse().expect("header"));
    assert_eq!(send(&a, local).await.status, StatusCode::OK);
    assert_eq!(m.calls().len(), 1);
    // Opting in to remote unauthenticated access lifts the guard.
    let mut cfg = GatewayConfig::default();
    cfg.auth.allow_unauthenticated_remote = true;
    let open = router(ready_state(m.clone(), MemoryConfig::default(), cfg));
    let mut remote = empty(Method::GET, "/api/memory");
    remote
        .headers_mut()
        .insert("host", "memory.lan:8765".parse().expect("header"));
    assert_eq!(send(&open, remote).await.status, StatusCode::OK);
}

// ----------------------------------------------------------------------------------------
// Secrets stay out of logs.

#[derive(Clone, Default)]
struct Captured(Arc<parking_lot::Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn secrets_never_reach_the_logs() {
    // Log capture races with other test threads over tracing's call-site cache.
    if !deermem_testkit::isolation::run_alone("secrets_never_reach_the_logs") {
        return;
    }
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let m = FakeManager::new();
    m.fail("get_memory", || {
        deermem_core::ManagerError::corruption("bad yaml in fact_x.md")
    });
    let memory = MemoryConfig {
        backend_config: json!({"model": {"api_key": "sk-LOGSECRET"}})
            .as_object()
            .cloned()
            .unwrap_or_default(),
        ..MemoryConfig::default()
    };
    let mut cfg = GatewayConfig::with_tokens([("tok-LOGSECRET-alice", "alice")]).expect("tokens");
    cfg.auth.internal_token = Some(ConfigSecret::new("internal-LOGSECRET"));
    let state = ready_state(m.clone(), memory, cfg);
    tracing::info!(state = ?state, "state built");
    let a = router(state);
    let mut requests = vec![
        with_bearer(
            empty(Method::GET, "/api/memory/config"),
            "tok-LOGSECRET-alice",
        ),
        with_bearer(empty(Method::GET, "/api/memory"), "tok-LOGSECRET-alice"),
        with_bearer(empty(Method::GET, "/api/memory"), "tok-LOGSECRET-wrong"),
        internal(
            empty(Method::GET, "/api/memory/status"),
            "internal-LOGSECRET",
            Some("owner"),
        ),
        internal(
            empty(Method::GET, "/api/memory/status"),
            "internal-LOGSECRET-forged",
            Some("owner"),
        ),
    ];
    let mut id_req = with_bearer(
        empty(Method::GET, "/api/memory/config"),
        "tok-LOGSECRET-alice",
    );
    id_req
        .headers_mut()
        .insert("x-request-id", "req-12345".parse().expect("header"));
    requests.push(id_req);
    for r in requests {
        send(&a, r).await;
    }
    let logs = String::from_utf8_lossy(&captured.0.lock()).into_owned();
    assert!(logs.contains("request finished"), "capture works: {logs}");
    assert!(logs.contains("req-12345"), "request ids are logged");
    assert!(
        logs.contains("bad yaml in fact_x.md"),
        "private error details go to the log"
    );
    assert!(
        !logs.contains("LOGSECRET"),
        "a secret reached the logs:\n{logs}"
    );
}
