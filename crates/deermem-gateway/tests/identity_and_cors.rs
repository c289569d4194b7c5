//! Issue-46 rules at the router: a session cookie whose `sub` is another user's storage bucket
//! is refused (403, saying why) on every identity path, and CORS preflights are logged,
//! counted in `/metrics` with origin and verdict, refused with 403 for origins not allowed, and
//! the credentials header is only sent alongside a granted origin.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use common::{FakeManager, INTERNAL_TOKEN, Resp, empty, ready_state, send, with_bearer};
use deermem_core::MemoryConfig;
use deermem_core::config::ConfigSecret;
use deermem_gateway::config::CorsConfig;
use deermem_gateway::{GatewayConfig, Metrics, router};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::json;

const SECRET: &str = "test-secret-of-the-deerflow-install";
const VICTIM: &str = "victim@corp.com";
const VICTIM_BUCKET: &str = "victim-corp-com-7b46e3848256709a";
const APP_ORIGIN: &str = "http://localhost:3000";
const WHY: &str = "storage bucket derived from another user id";

fn session(sub: &str) -> String {
    let now = i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap();
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &json!({"sub": sub, "exp": now + 3600, "iat": now, "ver": 0}),
        &EncodingKey::from_secret(SECRET.as_bytes()).unwrap(),
    )
    .unwrap()
}

fn with_cookie(mut r: Request<Body>, token: &str) -> Request<Body> {
    r.headers_mut()
        .insert("cookie", format!("access_token={token}").parse().unwrap());
    r
}

fn header<'a>(r: &'a Resp, name: &str) -> Option<&'a str> {
    r.headers.get(name).and_then(|v| v.to_str().ok())
}

#[tokio::test]
async fn a_session_cookie_naming_another_users_bucket_is_refused_with_the_reason() {
    let m = FakeManager::new();
    let mut cfg = GatewayConfig::with_deerflow_session(SECRET).unwrap();
    cfg.auth.internal_token = Some(ConfigSecret::new(INTERNAL_TOKEN));
    let a = router(ready_state(m.clone(), MemoryConfig::default(), cfg));

    // The victim's own subject reads the victim's memory.
    let r = send(
        &a,
        with_cookie(empty(Method::GET, "/api/memory"), &session(VICTIM)),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);

    // Their bucket name as a subject does not, with or without surrounding blanks.
    let calls_before = m.calls().len();
    for sub in [VICTIM_BUCKET.to_owned(), format!(" {VICTIM_BUCKET} ")] {
        let r = send(
            &a,
            with_cookie(empty(Method::GET, "/api/memory"), &session(&sub)),
        )
        .await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text);
        assert!(
            r.detail().contains("session cookie") && r.detail().contains(WHY),
            "{}",
            r.text
        );
    }
    assert_eq!(
        m.calls().len(),
        calls_before,
        "no manager call for a refused cookie"
    );

    // The owner header obeys the same rule in the same mode.
    let mut owner = empty(Method::GET, "/api/memory");
    owner
        .headers_mut()
        .insert("x-deerflow-internal-token", INTERNAL_TOKEN.parse().unwrap());
    owner
        .headers_mut()
        .insert("x-deerflow-owner-user-id", VICTIM_BUCKET.parse().unwrap());
    let r = send(&a, owner).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text);
    assert!(r.detail().contains(WHY), "{}", r.text);

    // A UUID subject, as DeerFlow issues, is unaffected.
    let r = send(
        &a,
        with_cookie(
            empty(Method::GET, "/api/memory"),
            &session("5b0c3d1e-8f4a-4c39-9a52-2f1e7c3b9d10"),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
}

#[test]
fn a_bearer_token_table_naming_another_users_bucket_is_refused_in_session_mode_too() {
    // Session mode's bearer tokens come from the same table, checked where it is built.
    let root = json!({"gateway": {"auth": {"mode": "deerflow_session", "jwt_secret": SECRET,
        "tokens": {"tok-m": VICTIM_BUCKET}}}});
    let err = GatewayConfig::from_root(&root).unwrap_err();
    assert_eq!(err.key, "gateway.auth.tokens");
    assert!(err.message.contains(WHY), "{err}");
}

fn cors_app(origins: &[&str], credentials: bool) -> (axum::Router, Metrics) {
    let mut cfg = GatewayConfig::with_tokens([("tok-a", "alice")]).unwrap();
    cfg.cors = Some(CorsConfig {
        allowed_origins: origins.iter().map(|o| (*o).to_owned()).collect(),
        allow_credentials: credentials,
    });
    let metrics = Metrics::new();
    let state =
        ready_state(FakeManager::new(), MemoryConfig::default(), cfg).with_metrics(metrics.clone());
    (router(state), metrics)
}

fn preflight(origin: &str) -> Request<Body> {
    common::req(Method::OPTIONS, "/api/memory")
        .header("origin", origin)
        .header("access-control-request-method", "DELETE")
        .header("access-control-request-headers", "authorization")
        .body(Body::empty())
        .unwrap()
}

#[tokio::test]
async fn preflights_are_counted_and_a_refused_origin_gets_403_without_credentials() {
    let (a, metrics) = cors_app(&[APP_ORIGIN], true);

    let r = send(&a, preflight(APP_ORIGIN)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(header(&r, "access-control-allow-origin"), Some(APP_ORIGIN));
    assert_eq!(header(&r, "access-control-allow-credentials"), Some("true"));

    let r = send(&a, preflight("https://evil.example")).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text);
    assert!(
        r.detail().contains("https://evil.example")
            && r.detail().contains("gateway.cors.allowed_origins"),
        "{}",
        r.text
    );
    assert_eq!(header(&r, "access-control-allow-origin"), None);
    assert_eq!(header(&r, "access-control-allow-credentials"), None);

    // A plain request from a foreign origin: served (the token is valid), but with no grant
    // and so no credentials header.
    let mut foreign = with_bearer(empty(Method::GET, "/api/memory"), "tok-a");
    foreign
        .headers_mut()
        .insert("origin", "https://evil.example".parse().unwrap());
    let r = send(&a, foreign).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(header(&r, "access-control-allow-origin"), None);
    assert_eq!(header(&r, "access-control-allow-credentials"), None);

    assert_eq!(metrics.preflight_count(APP_ORIGIN, "allowed"), 1);
    assert_eq!(metrics.preflight_count("other", "refused"), 1);
    let r = send(&a, empty(Method::GET, "/metrics")).await;
    assert!(
        r.text.contains(&format!(
            "deermem_cors_preflights_total{{origin=\"{APP_ORIGIN}\",verdict=\"allowed\"}} 1"
        )) && r
            .text
            .contains("deermem_cors_preflights_total{origin=\"other\",verdict=\"refused\"} 1"),
        "{}",
        r.text
    );
}

#[tokio::test]
async fn a_wildcard_origin_counts_under_the_wildcard() {
    let (a, metrics) = cors_app(&["*"], false);
    for origin in ["https://a.example", "https://b.example"] {
        let r = send(&a, preflight(origin)).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        assert_eq!(header(&r, "access-control-allow-origin"), Some("*"));
    }
    assert_eq!(metrics.preflight_count("*", "allowed"), 2);
}
