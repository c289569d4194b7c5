//! The DeerFlow web app's deployments, as its browser client talks to the gateway: a
//! multi-user install with `auth.mode: deerflow_session` (session cookies forged here with a
//! test secret for two users, DeerFlow's 401 bodies, its CSRF double-submit rule, bearer and
//! internal tokens beside it), CORS for an app served from another origin, and the app opened
//! on a non-loopback name in unauthenticated mode.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::{
    Call, FakeManager, INTERNAL_TOKEN, Resp, empty, fact_ids, json_req, ready_state, send,
};
use deermem_core::MemoryConfig;
use deermem_core::config::ConfigSecret;
use deermem_core::ports::MemoryManager;
use deermem_gateway::config::CorsConfig;
use deermem_gateway::{GatewayConfig, router};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};

/// DeerFlow's `AUTH_JWT_SECRET` in these tests.
const SECRET: &str = "test-secret-of-the-deerflow-install";
/// DeerFlow user ids are UUIDs.
const ALICE: &str = "5b0c3d1e-8f4a-4c39-9a52-2f1e7c3b9d10";
const BOB: &str = "c7e2a9f4-1d6b-47e8-b3a0-64f5d2c8e911";
const CSRF: &str = "csrf-value-the-app-read-from-its-cookie";
const APP_ORIGIN: &str = "http://localhost:3000";

fn now() -> i64 {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs();
    i64::try_from(secs).expect("seconds fit")
}

fn sign(alg: Algorithm, claims: &Value, secret: &str) -> String {
    jsonwebtoken::encode(
        &Header::new(alg),
        claims,
        &EncodingKey::from_secret(secret.as_bytes()).expect("key"),
    )
    .expect("token")
}

/// A session cookie as DeerFlow issues it: `sub`, `exp` a week ahead, `iat`, `ver`.
fn session(sub: &str) -> String {
    sign(
        Algorithm::HS256,
        &json!({"sub": sub, "exp": now() + 7 * 86_400, "iat": now(), "ver": 0}),
        SECRET,
    )
}

/// A request as the browser sends it: the session cookie and, when given, the CSRF cookie and
/// the header repeating it.
fn browser(mut r: Request<Body>, token: &str, csrf: Option<&str>) -> Request<Body> {
    let mut cookie = format!("{}={token}", "access_token");
    if let Some(c) = csrf {
        cookie.push_str(&format!("; csrf_token={c}"));
        r.headers_mut()
            .insert("x-csrf-token", c.parse().expect("header"));
    }
    r.headers_mut()
        .insert("cookie", cookie.parse().expect("header"));
    r
}

fn session_config() -> GatewayConfig {
    GatewayConfig::with_deerflow_session(SECRET).expect("secret")
}

fn deermem_at(root: &Path) -> Arc<dyn MemoryManager> {
    let cfg = MemoryConfig::default();
    let env = |_: &str| None;
    let mut opts = deermem::BuildOptions::new(&env);
    opts.storage_path = Some(root.to_path_buf());
    deermem::build_manager(&cfg, opts).expect("DeerMem builds on a temp root")
}

fn session_app(manager: Arc<dyn MemoryManager>, cfg: GatewayConfig) -> Router {
    router(ready_state(manager, MemoryConfig::default(), cfg))
}

fn auth_error(r: &Resp) -> (StatusCode, Value) {
    (r.status, r.body["detail"].clone())
}

fn deerflow_401(code: &str, message: &str) -> (StatusCode, Value) {
    (
        StatusCode::UNAUTHORIZED,
        json!({"code": code, "message": message}),
    )
}

// ----------------------------------------------------------------------------------------
// auth.mode: deerflow_session

/// The memory settings page of two users, each with their own cookie, over the real DeerMem
/// manager: load, add, edit, delete, export, import and clear act on the cookie's user only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_deerflow_users_have_separate_memories() {
    let dir = tempfile::tempdir().expect("temp dir");
    let a = session_app(deermem_at(dir.path()), session_config());
    let (alice, bob) = (session(ALICE), session(BOB));

    // Load: both start empty.
    for token in [&alice, &bob] {
        let r = send(&a, browser(empty(Method::GET, "/api/memory"), token, None)).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        assert!(fact_ids(&r.body).is_empty());
    }
    // Add: Alice's fact is hers.
    let add = json_req(
        Method::POST,
        "/api/memory/facts",
        &json!({"content": "Alice writes Rust", "category": "hobby", "confidence": 0.9}),
    );
    let r = send(&a, browser(add, &alice, Some(CSRF))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let alice_fact = fact_ids(&r.body)[0].clone();
    assert_eq!(r.body["facts"][0]["scope"]["userId"], ALICE);
    let add = json_req(
        Method::POST,
        "/api/memory/facts",
        &json!({"content": "Bob writes Go"}),
    );
    let r = send(&a, browser(add, &bob, Some(CSRF))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let bob_fact = fact_ids(&r.body)[0].clone();
    assert_eq!(r.body["facts"][0]["scope"]["userId"], BOB);
    // Each sees only their own.
    let r = send(&a, browser(empty(Method::GET, "/api/memory"), &alice, None)).await;
    assert_eq!(fact_ids(&r.body), vec![alice_fact.clone()]);
    let r = send(&a, browser(empty(Method::GET, "/api/memory"), &bob, None)).await;
    assert_eq!(fact_ids(&r.body), vec![bob_fact.clone()]);
    // Bob cannot edit or delete Alice's fact: for him it does not exist.
    let edit = json_req(
        Method::PATCH,
        &format!("/api/memory/facts/{alice_fact}"),
        &json!({"content": "hijacked"}),
    );
    let r = send(&a, browser(edit, &bob, Some(CSRF))).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    let del = empty(Method::DELETE, &format!("/api/memory/facts/{alice_fact}"));
    let r = send(&a, browser(del, &bob, Some(CSRF))).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    // Edit as the app does it: content, category and confidence together.
    let edit = json_req(
        Method::PATCH,
        &format!("/api/memory/facts/{alice_fact}"),
        &json!({"content": "Alice writes Rust daily", "category": "other", "confidence": 0.8}),
    );
    let r = send(&a, browser(edit, &alice, Some(CSRF))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["facts"][0]["content"], "Alice writes Rust daily");
    // Export, clear, import back.
    let r = send(
        &a,
        browser(empty(Method::GET, "/api/memory/export"), &alice, None),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let backup = r.body.clone();
    let r = send(
        &a,
        browser(empty(Method::DELETE, "/api/memory"), &alice, Some(CSRF)),
    )
    .await;
    assert_eq!((r.status, fact_ids(&r.body).len()), (StatusCode::OK, 0));
    let import = json_req(Method::POST, "/api/memory/import", &backup);
    let r = send(&a, browser(import, &alice, Some(CSRF))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(fact_ids(&r.body), vec![alice_fact]);
    // Bob's memory was never touched.
    let r = send(&a, browser(empty(Method::GET, "/api/memory"), &bob, None)).await;
    assert_eq!(fact_ids(&r.body), vec![bob_fact]);
    assert_eq!(r.body["facts"][0]["content"], "Bob writes Go");
}

#[tokio::test]
async fn refused_session_cookies_get_deerflows_401_bodies() {
    let m = FakeManager::new();
    let a = session_app(m.clone(), session_config());
    let get = |token: &str| browser(empty(Method::GET, "/api/memory"), token, None);

    let r = send(&a, empty(Method::GET, "/api/memory")).await;
    assert_eq!(
        auth_error(&r),
        deerflow_401("not_authenticated", "Authentication required")
    );
    let expired = sign(
        Algorithm::HS256,
        &json!({"sub": ALICE, "exp": now() - 60, "ver": 0}),
        SECRET,
    );
    let r = send(&a, get(&expired)).await;
    assert_eq!(
        auth_error(&r),
        deerflow_401("token_expired", "Token error: expired")
    );
    let forged = sign(
        Algorithm::HS256,
        &json!({"sub": ALICE, "exp": now() + 3600}),
        "someone-elses-secret",
    );
    let r = send(&a, get(&forged)).await;
    assert_eq!(
        auth_error(&r),
        deerflow_401("token_invalid", "Token error: invalid_signature")
    );
    // alg "none": an unsigned token.
    let b64 = |v: &Value| URL_SAFE_NO_PAD.encode(v.to_string());
    let unsigned = format!(
        "{}.{}.",
        b64(&json!({"alg": "none", "typ": "JWT"})),
        b64(&json!({"sub": ALICE, "exp": now() + 3600}))
    );
    let malformed = deerflow_401("token_invalid", "Token error: malformed");
    assert_eq!(auth_error(&send(&a, get(&unsigned)).await), malformed);
    // Another algorithm, even with the right secret; claims DeerFlow would refuse.
    let hs512 = sign(
        Algorithm::HS512,
        &json!({"sub": ALICE, "exp": now() + 3600}),
        SECRET,
    );
    for token in [
        hs512,
        "not-a-jwt".to_owned(),
        sign(Algorithm::HS256, &json!({"sub": ALICE}), SECRET),
        sign(
            Algorithm::HS256,
            &json!({"sub": ALICE, "exp": "never"}),
            SECRET,
        ),
        sign(
            Algorithm::HS256,
            &json!({"sub": ALICE, "exp": now() + 3600, "nbf": now() + 3000}),
            SECRET,
        ),
        sign(
            Algorithm::HS256,
            &json!({"sub": ALICE, "exp": now() + 3600, "nbf": "later"}),
            SECRET,
        ),
        sign(
            Algorithm::HS256,
            &json!({"sub": ALICE, "exp": now() + 3600, "aud": "elsewhere"}),
            SECRET,
        ),
        sign(Algorithm::HS256, &json!({"exp": now() + 3600}), SECRET),
        sign(
            Algorithm::HS256,
            &json!({"sub": 42, "exp": now() + 3600}),
            SECRET,
        ),
        sign(
            Algorithm::HS256,
            &json!({"sub": "  ", "exp": now() + 3600}),
            SECRET,
        ),
    ] {
        let r = send(&a, get(&token)).await;
        assert_eq!(auth_error(&r), malformed, "{token}");
    }
    // The owner header of a browser is ignored; the cookie decides.
    let mut r = get(&session(ALICE));
    r.headers_mut()
        .insert("x-deerflow-owner-user-id", BOB.parse().expect("header"));
    assert_eq!(send(&a, r).await.status, StatusCode::OK);
    assert_eq!(
        m.calls(),
        vec![Call::GetMemory {
            user: Some(ALICE.into()),
            agent: None
        }]
    );
}

#[tokio::test]
async fn cookie_authenticated_writes_follow_deerflows_csrf_rule() {
    let m = FakeManager::new();
    let a = session_app(m.clone(), session_config());
    let alice = session(ALICE);
    let add = || {
        json_req(
            Method::POST,
            "/api/memory/facts",
            &json!({"content": "Likes tea"}),
        )
    };
    let missing = (
        StatusCode::FORBIDDEN,
        json!("CSRF token missing. Include X-CSRF-Token header."),
    );
    // No pair, a header without the cookie, a cookie without the header, an empty pair.
    let r = send(&a, browser(add(), &alice, None)).await;
    assert_eq!(auth_error(&r), missing);
    let mut only_header = browser(add(), &alice, None);
    only_header
        .headers_mut()
        .insert("x-csrf-token", CSRF.parse().expect("header"));
    assert_eq!(auth_error(&send(&a, only_header).await), missing);
    let mut only_cookie = add();
    only_cookie.headers_mut().insert(
        "cookie",
        format!("access_token={alice}; csrf_token={CSRF}")
            .parse()
            .expect("header"),
    );
    assert_eq!(auth_error(&send(&a, only_cookie).await), missing);
    let mut mismatch = browser(add(), &alice, Some(CSRF));
    mismatch
        .headers_mut()
        .insert("x-csrf-token", "other-value".parse().expect("header"));
    assert_eq!(
        auth_error(&send(&a, mismatch).await),
        (StatusCode::FORBIDDEN, json!("CSRF token mismatch."))
    );
    // Every state-changing method is covered; a write without any credential is refused by the
    // CSRF rule first, as DeerFlow's outer CSRF middleware does.
    for (method, uri) in [
        (Method::DELETE, "/api/memory"),
        (Method::DELETE, "/api/memory/facts/fact_a"),
        (Method::PATCH, "/api/memory/facts/fact_a"),
        (Method::POST, "/api/memory/import"),
        (Method::POST, "/api/memory/reload"),
    ] {
        let r = send(&a, browser(empty(method.clone(), uri), &alice, None)).await;
        assert_eq!(auth_error(&r), missing, "{method} {uri}");
    }
    assert_eq!(auth_error(&send(&a, add()).await), missing);
    assert!(m.calls().is_empty(), "{:?}", m.calls());
    // With the pair the write goes through; reads never need it.
    let r = send(&a, browser(add(), &alice, Some(CSRF))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = send(
        &a,
        browser(empty(Method::GET, "/api/memory/status"), &alice, None),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    // A valid pair does not make up for a missing session.
    let mut no_session = add();
    no_session.headers_mut().insert(
        "cookie",
        format!("csrf_token={CSRF}").parse().expect("header"),
    );
    no_session
        .headers_mut()
        .insert("x-csrf-token", CSRF.parse().expect("header"));
    assert_eq!(
        auth_error(&send(&a, no_session).await),
        deerflow_401("not_authenticated", "Authentication required")
    );
}

#[tokio::test]
async fn bearer_and_internal_tokens_keep_working_beside_the_cookie() {
    let m = FakeManager::new();
    let mut cfg = session_config();
    cfg.auth.internal_token = Some(ConfigSecret::new(INTERNAL_TOKEN));
    cfg.auth.tokens = GatewayConfig::with_tokens([("tok-carol", "carol")])
        .expect("tokens")
        .auth
        .tokens;
    let a = session_app(m.clone(), cfg);
    let add = || {
        json_req(
            Method::POST,
            "/api/memory/facts",
            &json!({"content": "Likes tea"}),
        )
    };
    // A bearer token needs no CSRF pair (a browser never sends one on its own).
    let r = send(&a, common::with_bearer(add(), "tok-carol")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    // A present Authorization header never falls back to the cookie.
    let r = send(
        &a,
        common::with_bearer(
            browser(empty(Method::GET, "/api/memory"), &session(ALICE), None),
            "tok-unknown",
        ),
    )
    .await;
    assert_eq!(
        auth_error(&r),
        deerflow_401("token_invalid", "Invalid bearer token")
    );
    // The internal token acts for the owner header's user, without a CSRF pair.
    let mut internal = add();
    internal.headers_mut().insert(
        "x-deerflow-internal-token",
        INTERNAL_TOKEN.parse().expect("header"),
    );
    internal.headers_mut().insert(
        "x-deerflow-owner-user-id",
        "feishu-user".parse().expect("header"),
    );
    let r = send(&a, internal).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let users: Vec<Option<String>> = m
        .calls()
        .iter()
        .filter_map(|c| c.user().map(|u| u.map(str::to_owned)))
        .collect();
    assert_eq!(
        users,
        vec![Some("carol".to_owned()), Some("feishu-user".to_owned())]
    );
}

// ----------------------------------------------------------------------------------------
// CORS: the app on another origin calls the gateway directly.

fn cors_config(origins: &[&str], credentials: bool) -> CorsConfig {
    CorsConfig {
        allowed_origins: origins.iter().map(|o| (*o).to_owned()).collect(),
        allow_credentials: credentials,
    }
}

fn preflight(uri: &str, origin: &str, method: &str, headers: &str) -> Request<Body> {
    common::req(Method::OPTIONS, uri)
        .header("origin", origin)
        .header("access-control-request-method", method)
        .header("access-control-request-headers", headers)
        .body(Body::empty())
        .expect("request")
}

fn header<'a>(r: &'a Resp, name: &str) -> Option<&'a str> {
    r.headers.get(name).and_then(|v| v.to_str().ok())
}

#[tokio::test]
async fn a_cross_origin_app_gets_cors_with_credentials_and_preflights_need_no_auth() {
    let m = FakeManager::new();
    let mut cfg = session_config();
    cfg.cors = Some(cors_config(&[APP_ORIGIN], true));
    let a = session_app(m.clone(), cfg);

    // The preflight of the edit dialog's PATCH: answered without a cookie.
    let r = send(
        &a,
        preflight(
            "/api/memory/facts/fact_a",
            APP_ORIGIN,
            "PATCH",
            "content-type,x-csrf-token",
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(header(&r, "access-control-allow-origin"), Some(APP_ORIGIN));
    assert_eq!(header(&r, "access-control-allow-credentials"), Some("true"));
    assert_eq!(header(&r, "access-control-allow-methods"), Some("PATCH"));
    assert_eq!(
        header(&r, "access-control-allow-headers"),
        Some("content-type,x-csrf-token")
    );
    assert!(m.calls().is_empty());

    // The request itself, with the cookie and the CSRF pair: answered with the CORS headers.
    let mut add = browser(
        json_req(
            Method::POST,
            "/api/memory/facts",
            &json!({"content": "Likes tea"}),
        ),
        &session(ALICE),
        Some(CSRF),
    );
    add.headers_mut()
        .insert("origin", APP_ORIGIN.parse().expect("header"));
    let r = send(&a, add).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(header(&r, "access-control-allow-origin"), Some(APP_ORIGIN));
    assert_eq!(header(&r, "access-control-allow-credentials"), Some("true"));
    assert!(
        header(&r, "access-control-expose-headers").is_some_and(|h| h.contains("x-request-id"))
    );
    // Errors carry them too, so the app can read the 401 and send the user to log in.
    let mut anon = empty(Method::GET, "/api/memory");
    anon.headers_mut()
        .insert("origin", APP_ORIGIN.parse().expect("header"));
    let r = send(&a, anon).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(header(&r, "access-control-allow-origin"), Some(APP_ORIGIN));

    // Another origin gets no CORS grant (the browser then blocks the response).
    let r = send(
        &a,
        preflight(
            "/api/memory",
            "https://evil.example",
            "DELETE",
            "x-csrf-token",
        ),
    )
    .await;
    assert_eq!(header(&r, "access-control-allow-origin"), None);
    let mut foreign = browser(empty(Method::GET, "/api/memory"), &session(ALICE), None);
    foreign
        .headers_mut()
        .insert("origin", "https://evil.example".parse().expect("header"));
    let r = send(&a, foreign).await;
    assert_eq!(header(&r, "access-control-allow-origin"), None);
}

#[tokio::test]
async fn cors_is_off_by_default() {
    let a = session_app(FakeManager::new(), session_config());
    // Not answered as a preflight: an OPTIONS request like any other (refused).
    let r = send(
        &a,
        preflight("/api/memory", APP_ORIGIN, "GET", "x-csrf-token"),
    )
    .await;
    assert!(r.status.is_client_error(), "{}", r.status);
    assert_eq!(header(&r, "access-control-allow-origin"), None);
    assert_eq!(header(&r, "access-control-allow-methods"), None);
    let mut get = browser(empty(Method::GET, "/api/memory"), &session(ALICE), None);
    get.headers_mut()
        .insert("origin", APP_ORIGIN.parse().expect("header"));
    let r = send(&a, get).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(header(&r, "access-control-allow-origin"), None);
}

#[tokio::test]
async fn without_credentials_a_wildcard_origin_is_allowed() {
    let mut cfg = GatewayConfig::with_tokens([("tok-a", "alice")]).expect("tokens");
    cfg.cors = Some(cors_config(&["*"], false));
    let a = session_app(FakeManager::new(), cfg);
    let r = send(
        &a,
        preflight("/api/memory", "https://any.example", "GET", "authorization"),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(header(&r, "access-control-allow-origin"), Some("*"));
    assert_eq!(header(&r, "access-control-allow-credentials"), None);
}

// ----------------------------------------------------------------------------------------
// The app opened on a non-loopback name (`http://deerflow.test`) in unauthenticated mode.

fn from_page(mut r: Request<Body>, host: &str, origin: Option<&str>) -> Request<Body> {
    r.headers_mut()
        .insert("host", host.parse().expect("header"));
    if let Some(o) = origin {
        r.headers_mut().insert("origin", o.parse().expect("header"));
    }
    r
}

#[tokio::test]
async fn a_refused_name_is_named_with_the_setting_that_allows_it() {
    let m = FakeManager::new();
    let a = router(ready_state(
        m.clone(),
        MemoryConfig::default(),
        GatewayConfig::default(),
    ));
    let add = || {
        json_req(
            Method::POST,
            "/api/memory/facts",
            &json!({"content": "Likes tea"}),
        )
    };
    // The app's pages proxied to the gateway: Host is the gateway's, Origin the page's.
    let r = send(
        &a,
        from_page(add(), "localhost:8001", Some("http://deerflow.test")),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let detail = r.detail();
    assert!(
        detail.contains("Origin \"http://deerflow.test\""),
        "{detail}"
    );
    assert!(
        detail.contains("add \"deerflow.test\" to gateway.auth.allowed_hosts"),
        "{detail}"
    );
    // Reached by that name directly: the Host is named.
    let r = send(
        &a,
        from_page(empty(Method::GET, "/api/memory"), "deerflow.test", None),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let detail = r.detail();
    assert!(detail.contains("Host \"deerflow.test\""), "{detail}");
    assert!(
        detail.contains("add \"deerflow.test\" to gateway.auth.allowed_hosts"),
        "{detail}"
    );
    assert!(m.calls().is_empty());
}

#[tokio::test]
async fn allowed_hosts_serve_the_app_on_its_name_and_keep_the_protection() {
    let m = FakeManager::new();
    let cfg = GatewayConfig::from_root(&json!({"gateway": {"auth": {
        "allowed_hosts": ["DeerFlow.test"]
    }}}))
    .expect("config");
    let a = router(ready_state(m.clone(), MemoryConfig::default(), cfg));
    let add = |content: &str| {
        json_req(
            Method::POST,
            "/api/memory/facts",
            &json!({"content": content}),
        )
    };
    for (host, origin) in [
        ("localhost:8001", Some("http://deerflow.test")),
        ("deerflow.test", Some("http://deerflow.test:3000")),
        ("deerflow.test:80", None),
    ] {
        let r = send(&a, from_page(add(host), host, origin)).await;
        assert_eq!(r.status, StatusCode::OK, "{host} {origin:?}: {}", r.text);
    }
    // Every other name is still refused.
    let r = send(
        &a,
        from_page(add("evil"), "localhost:8001", Some("https://evil.example")),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let r = send(&a, from_page(add("rebind"), "rebind.evil.example", None)).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(m.calls().len(), 3);
}

#[tokio::test]
async fn a_cors_origin_is_an_allowed_origin_in_unauthenticated_mode() {
    let m = FakeManager::new();
    let cfg = GatewayConfig {
        cors: Some(cors_config(&["http://deerflow.test:3000"], false)),
        ..GatewayConfig::default()
    };
    let a = router(ready_state(m.clone(), MemoryConfig::default(), cfg));
    let r = send(
        &a,
        from_page(
            empty(Method::GET, "/api/memory"),
            "localhost:8001",
            Some("http://deerflow.test:3000"),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(
        header(&r, "access-control-allow-origin"),
        Some("http://deerflow.test:3000")
    );
    // The same host on another port is another origin.
    let r = send(
        &a,
        from_page(
            empty(Method::GET, "/api/memory"),
            "localhost:8001",
            Some("http://deerflow.test:4000"),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
}
