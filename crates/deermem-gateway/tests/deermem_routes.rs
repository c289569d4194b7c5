//! The route suites and the reference's end-to-end router tests (ported as our own) against the
//! real DeerMem manager: file storage with its FTS5 index on a temporary root.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::http::{Method, StatusCode};
use common::{app, empty, fact_ids, json_req, send, with_bearer};
use deermem_core::MemoryConfig;
use deermem_core::ports::MemoryManager;
use serde_json::{Value, json};

struct Fixture {
    manager: Arc<dyn MemoryManager>,
    dir: tempfile::TempDir,
}

fn deermem_at(root: &Path) -> Arc<dyn MemoryManager> {
    let cfg = MemoryConfig::default();
    let env = |_: &str| None;
    let mut opts = deermem::BuildOptions::new(&env);
    opts.storage_path = Some(root.to_path_buf());
    deermem::build_manager(&cfg, opts).expect("DeerMem builds on a temp root")
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("temp dir");
    Fixture {
        manager: deermem_at(dir.path()),
        dir,
    }
}

fn md_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fact_crud() {
    let f = fixture();
    common::suite_fact_crud(Arc::clone(&f.manager)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_clear_import_round_trip() {
    let f = fixture();
    common::suite_export_clear_import(Arc::clone(&f.manager)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_buckets() {
    let f = fixture();
    common::suite_agent_buckets(Arc::clone(&f.manager)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search() {
    let f = fixture();
    common::suite_search(Arc::clone(&f.manager)).await;
}

/// `?mode=` reaches the manager: `bm25` (and an empty value, meaning unset) rank by words and
/// say `fts5`; `vector`/`hybrid` without an embedder are a 400 naming the missing
/// `backend_config.embedding`; an unknown mode is a 422 before the manager is asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_mode_parameter() {
    let f = fixture();
    let app = app(Arc::clone(&f.manager));
    let r = send(
        &app,
        json_req(
            Method::POST,
            "/api/memory/facts",
            &json!({"content": "Prefers oolong tea", "category": "preference"}),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    for uri in [
        "/api/memory/search?q=oolong&mode=bm25",
        "/api/memory/search?q=oolong&mode=BM25",
        "/api/memory/search?q=oolong&mode=",
    ] {
        let r = send(&app, empty(Method::GET, uri)).await;
        assert_eq!(r.status, StatusCode::OK, "{uri}: {}", r.text);
        assert_eq!(r.body["count"], 1, "{uri}");
        assert_eq!(r.body["results"][0]["matchType"], "fts5", "{uri}");
    }
    for mode in ["vector", "hybrid"] {
        let uri = format!("/api/memory/search?q=oolong&mode={mode}");
        let r = send(&app, empty(Method::GET, &uri)).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{uri}: {}", r.text);
        assert_eq!(
            r.body,
            json!({"detail": format!("Invalid input: search mode {mode} needs an embedder: set backend_config.embedding")})
        );
    }
    let r = send(
        &app,
        empty(Method::GET, "/api/memory/search?q=oolong&mode=semantic"),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    let item = &r.body["detail"][0];
    assert_eq!(item["loc"], json!(["query", "mode"]));
    assert_eq!(item["type"], "value_error");
    assert_eq!(
        item["msg"],
        "Value error, \"semantic\" is not a search mode; use bm25, vector or hybrid"
    );
    assert_eq!(item["input"], "semantic");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_isolation() {
    let f = fixture();
    common::suite_user_isolation(Arc::clone(&f.manager)).await;
}

/// `test_import_route_without_agent_name_persists_default_bucket_markdown`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_without_agent_writes_default_bucket_markdown() {
    let f = fixture();
    let app = app(Arc::clone(&f.manager));
    let body = json!({
        "version": "1.0",
        "user": {}, "history": {},
        "facts": [{"id": "fact_gateway_import", "content": "Imported through the gateway", "category": "context", "confidence": 0.9, "source": "import"}]
    });
    let r = send(&app, json_req(Method::POST, "/api/memory/import", &body)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(fact_ids(&r.body), vec!["fact_gateway_import"]);
    let files = md_files(&f.dir.path().join("users/default/agents/__default__/facts"));
    assert_eq!(files.len(), 1);
    assert!(files[0].ends_with("fact_gateway_import.md"), "{files:?}");
}

/// `test_settings_fact_crud_without_agent_name_uses_default_agent`, end to end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_crud_on_a_legacy_user_uses_the_default_bucket() {
    let dir = tempfile::tempdir().expect("temp dir");
    let user_dir = dir.path().join("users/default");
    std::fs::create_dir_all(&user_dir).expect("mkdir");
    std::fs::write(
        user_dir.join("memory.json"),
        r#"{"version": "1.0", "user": {}, "history": {}, "facts": [{"id": "fact_legacy", "content": "Legacy fact", "category": "context", "confidence": 0.9, "createdAt": "2026-01-01T00:00:00Z", "source": "manual"}]}"#,
    )
    .expect("write");
    let app = app(deermem_at(dir.path()));
    let r = send(&app, empty(Method::GET, "/api/memory")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(fact_ids(&r.body), vec!["fact_legacy"]);
    let r = send(&app, empty(Method::GET, "/api/memory/export")).await;
    assert_eq!(fact_ids(&r.body), vec!["fact_legacy"]);

    let r = send(
        &app,
        json_req(
            Method::POST,
            "/api/memory/facts",
            &json!({"content": "New fact", "category": "preference", "confidence": 0.8}),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(
        r.body["facts"]
            .as_array()
            .expect("facts")
            .iter()
            .all(|f| f["source"].is_string())
    );
    let ids = fact_ids(&r.body);
    assert_eq!(ids.len(), 2);
    // Sorted by id: `fact_xxxxxxxx` (8 hex) sorts before `fact_legacy`.
    assert_eq!(ids[1], "fact_legacy");
    let new_id = ids[0].clone();

    let r = send(
        &app,
        json_req(
            Method::PATCH,
            &format!("/api/memory/facts/{new_id}"),
            &json!({"content": "Edited fact"}),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let edited = r.body["facts"]
        .as_array()
        .expect("facts")
        .iter()
        .find(|f| f["id"] == new_id.as_str())
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(edited["content"], "Edited fact");
    assert_eq!(edited["category"], "preference");

    for id in [&new_id, &"fact_legacy".to_owned()] {
        let r = send(
            &app,
            empty(Method::DELETE, &format!("/api/memory/facts/{id}")),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    }
    assert!(md_files(&user_dir.join("agents/__default__/facts")).is_empty());
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(user_dir.join("memory.json")).expect("manifest"))
            .expect("json");
    assert!(manifest.get("facts").is_none());
    assert_eq!(manifest["version"], "2.0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_map_to_the_reference_statuses() {
    let f = fixture();
    let app = app(Arc::clone(&f.manager));
    let r = send(
        &app,
        json_req(
            Method::POST,
            "/api/memory/facts",
            &json!({"content": "Drinks oolong tea"}),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    // Duplicate content is a 409 with the reference's detail.
    let r = send(
        &app,
        json_req(
            Method::POST,
            "/api/memory/facts",
            &json!({"content": "  DRINKS OOLONG TEA "}),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    assert_eq!(
        r.body["detail"],
        "A fact with the same content already exists."
    );
    // Missing fact: 404.
    let r = send(
        &app,
        empty(Method::DELETE, "/api/memory/facts/fact_missing"),
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.body["detail"], "Memory fact 'fact_missing' not found.");
    let r = send(
        &app,
        json_req(
            Method::PATCH,
            "/api/memory/facts/fact_missing",
            &json!({"content": "x"}),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    // Whitespace-only content passes schema validation and is a 400 from the manager.
    let r = send(
        &app,
        json_req(
            Method::POST,
            "/api/memory/facts",
            &json!({"content": "   "}),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    // Out-of-range confidence is a schema error.
    let r = send(
        &app,
        json_req(
            Method::POST,
            "/api/memory/facts",
            &json!({"content": "x", "confidence": 1.5}),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);

    // A corrupt fact file: 500 with the fixed body, the private detail never shown.
    let facts_dir = f.dir.path().join("users/default/agents/__default__/facts");
    let file = md_files(&facts_dir)
        .into_iter()
        .next()
        .expect("a fact file");
    std::fs::write(&file, "---\nid: [unclosed\n---\n\n# x\n\nx\n").expect("corrupt");
    let r = send(&app, empty(Method::POST, "/api/memory/reload")).await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", r.text);
    assert_eq!(r.body["detail"], "Stored memory data is corrupted.");
    assert!(
        !r.text.contains(".md"),
        "the private path stays private: {}",
        r.text
    );
}

/// The `caches` entry named `name` of a status body.
fn cache<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["caches"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no cache {name} in {status}"))
}

/// `GET /api/memory/status` lists the caches of the serving process with the bounds the
/// configuration gives them: the file storage's scope cache at the configured (non-default)
/// `cache_max_scopes`, filling up as users are served and never past its bound, and the FTS5
/// index's page caches in bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_every_cache_bound_and_the_scope_cache_stays_within_it() {
    const MAX_SCOPES: u64 = 5;
    let dir = tempfile::tempdir().expect("temp dir");
    let backend_config = json!({"cache_max_scopes": MAX_SCOPES});
    let memory = MemoryConfig {
        backend_config: backend_config.as_object().cloned().unwrap_or_default(),
        ..MemoryConfig::default()
    };
    let env = |_: &str| None;
    let mut opts = deermem::BuildOptions::new(&env);
    opts.storage_path = Some(dir.path().to_path_buf());
    let manager = deermem::build_manager(&memory, opts).expect("DeerMem builds on a temp root");
    let users: Vec<(String, String)> = (0..12)
        .map(|i| (format!("tok-{i}"), format!("user-{i}")))
        .collect();
    let gateway = deermem_gateway::GatewayConfig::with_tokens(
        users.iter().map(|(t, u)| (t.as_str(), u.as_str())),
    )
    .expect("tokens");
    let a = deermem_gateway::router(common::ready_state(manager, memory, gateway));
    let status = |token: &'static str| {
        let a = a.clone();
        async move {
            let r = send(
                &a,
                with_bearer(empty(Method::GET, "/api/memory/status"), token),
            )
            .await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.text);
            r.body
        }
    };
    let scopes = |body: &Value| {
        cache(body, "file_storage.scopes")["current"]
            .as_u64()
            .unwrap()
    };

    let first = status("tok-0").await;
    assert_eq!(
        first["config"]["backend_config"]["cache_max_scopes"],
        MAX_SCOPES
    );
    let scope_cache = cache(&first, "file_storage.scopes");
    assert_eq!(scope_cache["bound"], MAX_SCOPES, "{first}");
    assert_eq!(scope_cache["unit"], "entries");
    let before = scopes(&first);
    assert!((1..MAX_SCOPES).contains(&before), "{first}");
    // SQLite's page cache, 8 MiB for the writer and each of at most 4 idle readers, and their
    // mapped windows (16 MiB each): `deermem_retrieval_fts5::memory_bound_bytes`, 120 MiB.
    let page_cache = cache(&first, "fts5.page_cache");
    assert_eq!(page_cache["unit"], "bytes");
    assert_eq!(page_cache["bound"], 5 * 8 * 1024 * 1024);
    assert_eq!(page_cache["current"], Value::Null);
    assert_eq!(cache(&first, "fts5.mmap")["bound"], 5 * 16 * 1024 * 1024);
    for name in [
        "fts5.decoded_facts",
        "fts5.scope_vectors",
        "engine.rendered_blocks",
        "engine.rendered_text",
        "engine.warmed_scopes",
        "updater.watermarks",
        "updater.token_counts",
        "updater.token_count_text",
    ] {
        let c = cache(&first, name);
        assert!(c["bound"].as_u64().is_some_and(|b| b > 0), "{name}: {c}");
        assert!(
            matches!(c["unit"].as_str(), Some("entries" | "bytes")),
            "{c}"
        );
    }
    assert_eq!(cache(&first, "updater.watermarks")["bound"], 4096);

    // Another user's document is cached too.
    let r = send(&a, with_bearer(empty(Method::GET, "/api/memory"), "tok-1")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let grown = scopes(&status("tok-0").await);
    assert!(grown > before, "{before} -> {grown}");

    // More users than the bound: the cache is full and stays at its bound.
    for (token, _) in &users {
        let r = send(&a, with_bearer(empty(Method::GET, "/api/memory"), token)).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        let body = status("tok-0").await;
        assert!(scopes(&body) <= MAX_SCOPES, "{body}");
    }
    assert_eq!(scopes(&status("tok-0").await), MAX_SCOPES);
}
