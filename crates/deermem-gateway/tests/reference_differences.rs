//! The behaviours a differential run of the reference router against `deermem serve` found to
//! differ, each pinned: where we now match the reference (trailing-slash redirects, FastAPI's
//! body decoding and its `json_invalid` items, pydantic's bounds for non-finite confidence, the
//! PATCH order, import coercions, a stored empty category, our own message formats), and where
//! we keep a declared difference (`HEAD`, `Allow`, `/docs`, `status` on import; see the gateway
//! section of docs/compat.md).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use common::{FakeManager, app, empty, fact_ids, json_req, send};
use deermem_core::MemoryConfig;
use deermem_core::ports::MemoryManager;
use serde_json::{Value, json};

fn deermem_at(root: &Path) -> Arc<dyn MemoryManager> {
    let cfg = MemoryConfig::default();
    let env = |_: &str| None;
    let mut opts = deermem::BuildOptions::new(&env);
    opts.storage_path = Some(root.to_path_buf());
    deermem::build_manager(&cfg, opts).expect("DeerMem builds on a temp root")
}

fn raw(method: Method, uri: &str, body: impl Into<Body>) -> Request<Body> {
    common::req(method, uri)
        .header("content-type", "application/json")
        .body(body.into())
        .expect("request")
}

fn md_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    out
}

// ----------------------------------------------------------------------------------------
// Routing.

/// Declared: the reference (FastAPI) registers no `HEAD`; we answer it like `GET`, without a
/// body, as HTTP asks.
#[tokio::test]
async fn head_is_answered_like_get_without_a_body() {
    let m = FakeManager::new();
    let a = app(m.clone());
    let r = send(&a, empty(Method::HEAD, "/api/memory")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.text.is_empty(), "{}", r.text);
    assert_eq!(m.calls().len(), 1);
}

/// Declared: a 405's `Allow` lists every method of the path (the reference lists only the
/// methods of the first route registered for it).
#[tokio::test]
async fn method_not_allowed_lists_every_method_of_the_path() {
    let a = app(FakeManager::new());
    let r = send(&a, empty(Method::PUT, "/api/memory")).await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    let allow = r.headers["allow"].to_str().expect("ascii");
    let methods: Vec<&str> = allow.split(',').map(str::trim).collect();
    assert!(
        methods.contains(&"GET") && methods.contains(&"DELETE"),
        "{allow}"
    );
}

#[tokio::test]
async fn a_trailing_slash_is_redirected_to_the_route_like_fastapi() {
    let m = FakeManager::new();
    let a = app(m.clone());
    for (method, from, to) in [
        (Method::GET, "/api/memory/", "/api/memory"),
        (Method::POST, "/api/memory/facts/", "/api/memory/facts"),
        (Method::GET, "/api/memory/export/", "/api/memory/export"),
        (
            Method::GET,
            "/api/memory/export//?agent=coder",
            "/api/memory/export?agent=coder",
        ),
        (
            Method::PATCH,
            "/api/memory/facts/fact_a/",
            "/api/memory/facts/fact_a",
        ),
        (Method::GET, "/healthz/", "/healthz"),
    ] {
        let r = send(&a, empty(method.clone(), from)).await;
        assert_eq!(
            (
                r.status,
                r.headers.get("location").and_then(|v| v.to_str().ok())
            ),
            (StatusCode::TEMPORARY_REDIRECT, Some(to)),
            "{method} {from}"
        );
        assert!(r.text.is_empty());
    }
    // Following it reaches the route.
    assert_eq!(
        send(&a, empty(Method::GET, "/api/memory")).await.status,
        StatusCode::OK
    );
    // Only paths that match a route once the slash is gone.
    for path in [
        "/api/nothing/",
        "/api/memory/facts/a/b/",
        "//evil.example/",
        "/",
    ] {
        let r = send(&a, empty(Method::GET, path)).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(r.body, json!({"detail": "Not Found"}));
    }
    assert_eq!(m.calls().len(), 1, "redirects never reach the backend");
}

/// Declared: `/docs` is our own page, generated from `/openapi.json`, self-contained (the
/// reference serves Swagger UI, which loads its assets from a CDN).
#[tokio::test]
async fn the_docs_page_lists_the_routes_without_loading_anything() {
    let a = app(FakeManager::new());
    let r = send(&a, empty(Method::GET, "/docs")).await;
    assert_eq!(r.status, StatusCode::OK);
    let ctype = r.headers["content-type"].to_str().expect("ascii");
    assert!(ctype.starts_with("text/html"), "{ctype}");
    assert!(r.text.contains("<a href=\"/openapi.json\">"));
    assert!(
        r.text
            .contains("<code>PATCH /api/memory/facts/{fact_id}</code>")
    );
    assert!(r.text.contains("<code>GET /api/memory/search</code>"));
    assert!(!r.text.contains("<script"));
    assert!(!r.text.contains("https://") && !r.text.contains("http://"));
    assert!(
        r.headers["content-security-policy"]
            .to_str()
            .expect("ascii")
            .contains("default-src 'none'")
    );
}

// ----------------------------------------------------------------------------------------
// Body decoding.

#[tokio::test]
async fn a_null_body_is_a_missing_body() {
    let m = FakeManager::new();
    let a = app(m.clone());
    for uri in ["/api/memory/facts", "/api/memory/import"] {
        let r = send(&a, raw(Method::POST, uri, "null")).await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(
            r.body,
            json!({"detail": [{"type": "missing", "loc": ["body"], "msg": "Field required", "input": null}]})
        );
    }
    assert!(m.calls().is_empty());
}

#[tokio::test]
async fn malformed_json_is_reported_where_and_as_python_reports_it() {
    let a = app(FakeManager::new());
    for (body, pos, error) in [
        ("{\"content\": ", 12, "Expecting value"),
        ("{x", 1, "Expecting property name enclosed in double quotes"),
        (
            "{'content': 'x'}",
            1,
            "Expecting property name enclosed in double quotes",
        ),
        (
            "{\"content\": \"x\",}",
            16,
            "Expecting property name enclosed in double quotes",
        ),
        ("{\"content\": \"x\"}}", 16, "Extra data"),
        (
            "{\"content\": \"a\tb\"}",
            14,
            "Invalid control character at",
        ),
        // Positions count code points, not bytes.
        ("{\"content\": \"é\" x}", 16, "Expecting ',' delimiter"),
    ] {
        let r = send(&a, raw(Method::POST, "/api/memory/facts", body)).await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert_eq!(
            r.body,
            json!({"detail": [{"type": "json_invalid", "loc": ["body", pos], "msg": "JSON decode error",
                               "input": {}, "ctx": {"error": error}}]}),
            "{body}"
        );
    }
}

#[tokio::test]
async fn bodies_python_cannot_decode_are_400() {
    let m = FakeManager::new();
    let a = app(m.clone());
    let parse_error = json!({"detail": "There was an error parsing the body"});
    let invalid_utf8 = b"{\"content\": \"\xff\xfe\"}".to_vec();
    let deep = "[".repeat(5000);
    // Declared: our parser gives up at 128 levels (the reference's at Python's recursion
    // limit, about 1000).
    let deep_in_a_field = format!("{{\"content\": {}1{}}}", "[".repeat(200), "]".repeat(200));
    for body in [
        invalid_utf8,
        deep.into_bytes(),
        deep_in_a_field.into_bytes(),
    ] {
        let r = send(&a, raw(Method::POST, "/api/memory/facts", body)).await;
        assert_eq!(
            (r.status, r.body.clone()),
            (StatusCode::BAD_REQUEST, parse_error.clone())
        );
    }
    assert!(m.calls().is_empty());
}

#[tokio::test]
async fn a_utf8_bom_before_the_json_is_skipped() {
    let m = FakeManager::new();
    let a = app(m.clone());
    let mut body = b"\xEF\xBB\xBF".to_vec();
    body.extend_from_slice(br#"{"content": "Written by a BOM-happy editor"}"#);
    let r = send(&a, raw(Method::POST, "/api/memory/facts", body)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    // One BOM only, as Python's utf-8-sig decoding.
    let r = send(
        &a,
        raw(
            Method::POST,
            "/api/memory/facts",
            b"\xEF\xBB\xBF\xEF\xBB\xBF{}".to_vec(),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(r.body["detail"][0]["loc"], json!(["body", 0]));
    assert_eq!(r.body["detail"][0]["ctx"]["error"], "Expecting value");
}

// ----------------------------------------------------------------------------------------
// Validation.

#[tokio::test]
async fn non_finite_confidence_fails_the_bounds_as_in_pydantic() {
    let m = FakeManager::new();
    let a = app(m.clone());
    for (method, uri) in [
        (Method::POST, "/api/memory/facts"),
        (Method::PATCH, "/api/memory/facts/fact_a"),
    ] {
        for (value, kind, msg, ctx) in [
            (
                "inf",
                "less_than_equal",
                "Input should be less than or equal to 1",
                json!({"le": 1.0}),
            ),
            (
                "nan",
                "less_than_equal",
                "Input should be less than or equal to 1",
                json!({"le": 1.0}),
            ),
            (
                "-inf",
                "greater_than_equal",
                "Input should be greater than or equal to 0",
                json!({"ge": 0.0}),
            ),
        ] {
            let body = json!({"content": "x", "confidence": value});
            let r = send(&a, json_req(method.clone(), uri, &body)).await;
            assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
            assert_eq!(
                r.body["detail"],
                json!([{"type": kind, "loc": ["body", "confidence"], "msg": msg,
                        "input": value, "ctx": ctx}]),
                "{method} {value}"
            );
        }
    }
    assert!(m.calls().is_empty());
}

#[tokio::test]
async fn our_own_messages_follow_the_documented_formats() {
    let a = app(FakeManager::new());
    let long = "a".repeat(129);
    let r = send(&a, empty(Method::GET, &format!("/api/memory?agent={long}"))).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        r.detail(),
        format!(
            "Invalid agent name '{}…': names must be at most 128 bytes (got 129)",
            "a".repeat(32)
        )
    );
    let r = send(&a, empty(Method::GET, "/api/memory?agent=a_b")).await;
    assert_eq!(
        r.detail(),
        "Invalid agent name 'a_b': names must match ^[A-Za-z0-9-]+$"
    );
    let r = send(&a, empty(Method::DELETE, "/api/memory/facts/%FF%FE")).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        r.detail(),
        "Invalid fact id: the path segment is not valid percent-encoded UTF-8."
    );
}

// ----------------------------------------------------------------------------------------
// Against the real DeerMem manager.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_fact_is_stored_and_empty_content_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let a = app(deermem_at(dir.path()));
    // No length cap beyond the body limit, as the reference.
    let long = "x".repeat(20_024);
    let r = send(
        &a,
        json_req(Method::POST, "/api/memory/facts", &json!({"content": long})),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["facts"][0]["content"], json!(long));
    let r = send(
        &a,
        json_req(
            Method::POST,
            "/api/memory/facts",
            &json!({"content": " \t "}),
        ),
    )
    .await;
    assert_eq!(
        (r.status, r.detail()),
        (
            StatusCode::BAD_REQUEST,
            "Memory fact content cannot be empty."
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patch_checks_the_body_first_and_the_fact_before_its_new_values() {
    let dir = tempfile::tempdir().expect("temp dir");
    let a = app(deermem_at(dir.path()));
    // An invalid id and an invalid body: the body is reported (422).
    let r = send(
        &a,
        json_req(
            Method::PATCH,
            "/api/memory/facts/bad.id",
            &json!({"confidence": 5}),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    // A missing fact with values that would be refused: 404 (the fact is looked up first).
    for body in [
        json!({"content": "   "}),
        json!({"content": "y".repeat(20_001)}),
    ] {
        let r = send(
            &a,
            json_req(Method::PATCH, "/api/memory/facts/fact_missing", &body),
        )
        .await;
        assert_eq!(
            (r.status, r.detail()),
            (
                StatusCode::NOT_FOUND,
                "Memory fact 'fact_missing' not found."
            ),
        );
    }
    // An existing fact with those values: the values are refused.
    let r = send(
        &a,
        json_req(
            Method::POST,
            "/api/memory/facts",
            &json!({"content": "Likes tea"}),
        ),
    )
    .await;
    let id = fact_ids(&r.body)[0].clone();
    let r = send(
        &a,
        json_req(
            Method::PATCH,
            &format!("/api/memory/facts/{id}"),
            &json!({"content": "   "}),
        ),
    )
    .await;
    assert_eq!(
        (r.status, r.detail()),
        (
            StatusCode::BAD_REQUEST,
            "Memory fact content cannot be empty."
        )
    );
    let r = send(
        &a,
        json_req(
            Method::PATCH,
            &format!("/api/memory/facts/{id}"),
            &json!({"content": "y".repeat(20_001)}),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["facts"][0]["content"], json!("y".repeat(20_001)));
}

fn import_fact(id: &str, extra: Value) -> Value {
    let mut f = json!({"id": id, "content": "Imported fact"});
    if let (Some(f), Some(extra)) = (f.as_object_mut(), extra.as_object()) {
        f.extend(extra.clone());
    }
    json!({"facts": [f]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_coerces_source_and_confidence_like_the_reference() {
    let dir = tempfile::tempdir().expect("temp dir");
    let a = app(deermem_at(dir.path()));
    for (i, (extra, field, want)) in [
        (json!({"source": 7}), "source", json!("unknown")),
        (json!({"source": null}), "source", json!("unknown")),
        (json!({"source": ["x"]}), "source", json!("unknown")),
        (json!({"confidence": 5}), "confidence", json!(1.0)),
        (json!({"confidence": -1}), "confidence", json!(0.0)),
        (json!({"confidence": "0.25"}), "confidence", json!(0.25)),
    ]
    .into_iter()
    .enumerate()
    {
        let body = import_fact(&format!("fact_imported{i}"), extra.clone());
        let r = send(&a, json_req(Method::POST, "/api/memory/import", &body)).await;
        assert_eq!(r.status, StatusCode::OK, "{extra}: {}", r.text);
        assert_eq!(r.body["facts"][0][field], want, "{extra}");
    }
}

/// As the reference: an import fact whose `id` is `""` or absent gets a generated `fact_…` id
/// (a backup that leaves ids blank restores).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_generates_blank_and_missing_fact_ids() {
    let dir = tempfile::tempdir().expect("temp dir");
    let a = app(deermem_at(dir.path()));
    let body = json!({"facts": [
        {"id": "", "content": "Blank id"},
        {"content": "No id at all"},
        {"id": "fact_kept", "content": "Named"},
    ]});
    let r = send(&a, json_req(Method::POST, "/api/memory/import", &body)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let ids = fact_ids(&r.body);
    assert_eq!(ids.len(), 3, "{ids:?}");
    assert!(ids.contains(&"fact_kept".to_owned()), "{ids:?}");
    let generated: Vec<&String> = ids.iter().filter(|id| *id != "fact_kept").collect();
    assert_eq!(generated.len(), 2);
    for id in &generated {
        assert!(
            id.starts_with("fact_") && id.len() == 13,
            "a generated id: {id}"
        );
    }
    assert_ne!(generated[0], generated[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_refuses_facts_that_are_not_active() {
    let dir = tempfile::tempdir().expect("temp dir");
    let m = deermem_at(dir.path());
    let a = app(Arc::clone(&m));
    let r = send(
        &a,
        json_req(
            Method::POST,
            "/api/memory/import",
            &import_fact("fact_imported", json!({"status": "archived"})),
        ),
    )
    .await;
    assert_eq!(
        (r.status, r.detail()),
        (
            StatusCode::BAD_REQUEST,
            "Invalid memory data: facts[0] ('fact_imported') has status 'archived'; only active \
             facts can be imported (leave status out or set it to \"active\")."
        )
    );
    assert!(md_files(dir.path()).is_empty(), "nothing was stored");
    let r = send(
        &a,
        json_req(
            Method::POST,
            "/api/memory/import",
            &import_fact("fact_imported", json!({"status": "active"})),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_empty_category_is_returned_as_stored() {
    let dir = tempfile::tempdir().expect("temp dir");
    let a = app(deermem_at(dir.path()));
    let r = send(
        &a,
        json_req(
            Method::POST,
            "/api/memory/facts",
            &json!({"content": "Category edited by hand", "category": "goal"}),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let files = md_files(dir.path());
    assert_eq!(files.len(), 1);
    let text = std::fs::read_to_string(&files[0]).expect("fact file");
    assert!(text.contains("\ncategory: goal\n"), "{text}");
    std::fs::write(
        &files[0],
        text.replace("\ncategory: goal\n", "\ncategory: ''\n"),
    )
    .expect("edit");
    let r = send(&a, empty(Method::POST, "/api/memory/reload")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["facts"][0]["category"], "");
    let r = send(&a, empty(Method::GET, "/api/memory")).await;
    assert_eq!(r.body["facts"][0]["category"], "");
}
