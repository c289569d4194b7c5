//! Isolation and access on every surface: manager methods, gateway routes, MCP tools and CLI
//! commands, tried with ids built to escape (`../`, absolute paths, NUL, unicode look-alikes,
//! very long), with another user's fact ids, and with forged or missing tokens. Never another
//! user's data, never a file outside the root, always a typed client error (4xx, a tool
//! error, exit code 4 or 5).

use deermem_core::ports::MemoryManagerExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use deermem_core::ports::{FactPatch, MemoryManager, MemoryScope, NewFact, SearchRequest};
use deermem_core::{ManagerError, MemoryConfig, UserId};
use deermem_gateway::{GatewayConfig, GatewayState};
use deermem_reliability::verify;
use http_body_util::BodyExt as _;
use serde_json::{Value, json};
use tower::ServiceExt as _;

use crate::support;

const BOB_SECRET: &str = "bob's secret: allergic to penicillin";

fn long(n: usize) -> String {
    "x".repeat(n)
}

fn hostile_fact_ids() -> Vec<String> {
    vec![
        "../bob".into(),
        "../../users/bob/memory".into(),
        "/etc/passwd".into(),
        "f\u{0}1".into(),
        "ｆact_1".into(),
        "a/b".into(),
        "..".into(),
        ".".into(),
        "fact\u{202e}1".into(),
        long(100_000),
    ]
}

fn hostile_users() -> Vec<String> {
    vec![
        "../bob".into(),
        "/abs/bob".into(),
        "bob/../bob".into(),
        "bоb".into(), // Cyrillic о: a different user
        "BOB".into(),
        "..".into(),
        ".".into(),
        "bob\u{0}".into(),
        long(100_000),
    ]
}

fn hostile_agents() -> Vec<String> {
    vec![
        "../bob".into(),
        "A/B".into(),
        "x\u{0}".into(),
        "__default__/../x".into(),
        "ｓhared".into(),
        "..".into(),
        long(10_000),
    ]
}

struct World {
    _tmp: tempfile::TempDir,
    parent: PathBuf,
    root: PathBuf,
    manager: Arc<dyn MemoryManager>,
    bob_fact: String,
    bob_before: std::collections::BTreeMap<String, Vec<u8>>,
    outside_before: Vec<PathBuf>,
}

async fn world() -> World {
    let tmp = tempfile::tempdir().unwrap();
    let parent = tmp.path().to_path_buf();
    let root = parent.join("root");
    std::fs::write(parent.join("bob"), "a file next to the root").unwrap();
    let manager = support::manager(&root);
    let bob = MemoryScope::user(UserId::new("bob").unwrap());
    let (_, id) = manager
        .create_fact(NewFact::new(BOB_SECRET), bob.clone())
        .await
        .unwrap();
    let alice = MemoryScope::user(UserId::new("alice").unwrap());
    manager
        .create_fact(NewFact::new("alice likes tea"), alice)
        .await
        .unwrap();
    let bob_before = verify::files(&root.join("users/bob"));
    let outside_before = outside(&parent);
    World {
        _tmp: tmp,
        parent,
        root,
        manager,
        bob_fact: id.expect("bob's fact stored"),
        bob_before,
        outside_before,
    }
}

/// Paths below `parent` that are not below `parent/root`.
fn outside(parent: &Path) -> Vec<PathBuf> {
    verify::paths(parent)
        .into_iter()
        .filter(|p| !p.starts_with("root"))
        .collect()
}

impl World {
    fn check_untouched(&self, surface: &str) {
        assert_eq!(
            verify::files(&self.root.join("users/bob")),
            self.bob_before,
            "{surface}: bob's files changed"
        );
        assert_eq!(
            outside(&self.parent),
            self.outside_before,
            "{surface}: a file outside the root"
        );
    }
}

fn client_error(e: &ManagerError) -> bool {
    matches!(
        e,
        ManagerError::InvalidInput { .. } | ManagerError::NotFound { .. }
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manager_methods_refuse_escapes_and_other_users_ids() {
    let w = world().await;
    let alice = MemoryScope::user(UserId::new("alice").unwrap());
    let mut ids = hostile_fact_ids();
    ids.push(w.bob_fact.clone());
    for id in &ids {
        let patch = FactPatch {
            content: Some("pwned".into()),
            ..FactPatch::default()
        };
        match w.manager.update_fact(id, patch, alice.clone()).await {
            Err(e) => assert!(client_error(&e), "update {:.40}: {e:?}", id),
            Ok(_) => panic!("update of {:.40} as alice succeeded", id),
        }
        match w.manager.delete_fact(id, None, alice.clone()).await {
            Err(e) => assert!(client_error(&e), "delete {:.40}: {e:?}", id),
            Ok(_) => panic!("delete of {:.40} as alice succeeded", id),
        }
    }
    for raw in hostile_users() {
        let Ok(user) = UserId::new(raw.clone()) else {
            continue; // refused at the type boundary (NUL, too long): nothing to call
        };
        let scope = MemoryScope::user(user);
        let doc = w.manager.get_memory(scope.clone()).await;
        if let Ok(doc) = &doc {
            assert!(
                doc.facts.iter().all(|f| f.content != BOB_SECRET),
                "{raw:.40} sees bob's fact"
            );
        }
        let hits = w
            .manager
            .search(SearchRequest {
                query: "penicillin".into(),
                top_k: 10,
                scope: scope.clone(),
                category: None,
                mode: None,
            })
            .await;
        if let Ok(hits) = hits {
            assert!(hits.is_empty(), "{raw:.40} finds bob's fact");
        }
        match w
            .manager
            .create_fact(NewFact::new("written by a hostile id"), scope.clone())
            .await
        {
            Ok(_) | Err(ManagerError::InvalidInput { .. }) => {}
            Err(e) => panic!("{raw:.40}: {e:?}"),
        }
        match w.manager.clear_memory(scope).await {
            Ok(_) | Err(ManagerError::InvalidInput { .. }) => {}
            Err(e) => panic!("{raw:.40}: {e:?}"),
        }
    }
    for raw in ["bob\u{0}", &long(100_000)] {
        assert!(UserId::new(raw).is_err(), "{raw:.10} must be refused");
    }
    w.check_untouched("manager");
    // Bob's fact is still his.
    let bob = w
        .manager
        .get_memory(MemoryScope::user(UserId::new("bob").unwrap()))
        .await
        .unwrap();
    assert_eq!(bob.facts.len(), 1);
    assert_eq!(bob.facts[0].content, BOB_SECRET);
}

async fn send(
    app: &axum::Router,
    method: Method,
    uri: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (StatusCode, String) {
    let mut b = Request::builder()
        .method(method)
        .uri(uri)
        .header("host", "127.0.0.1");
    if let Some(t) = token {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    let req = match body {
        Some(v) => b
            .header("content-type", "application/json")
            .body(Body::from(v.to_string())),
        None => b.body(Body::empty()),
    }
    .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// Percent-encodes everything but ASCII letters and digits.
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Ids a URI can carry (the HTTP stack refuses URIs over 64 KiB before any route runs).
fn fits_uri(s: &str) -> bool {
    enc(s).len() < 60_000
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_routes_refuse_escapes_other_users_ids_and_bad_tokens() {
    let w = world().await;
    let mut cfg = GatewayConfig::with_tokens([
        ("alice-token-0123456789", "alice"),
        ("bob-token-0123456789ab", "bob"),
    ])
    .unwrap();
    cfg.auth.internal_token = Some(deermem_core::config::ConfigSecret::new(
        "internal-0123456789abcdef",
    ));
    let state = GatewayState::new(Arc::clone(&w.manager), MemoryConfig::default(), cfg);
    state.mark_ready();
    let app = deermem_gateway::router(state);
    let alice = Some("alice-token-0123456789");
    let routes: Vec<(Method, String, Option<Value>)> = vec![
        (Method::GET, "/api/memory".into(), None),
        (Method::DELETE, "/api/memory".into(), None),
        (Method::POST, "/api/memory/reload".into(), None),
        (
            Method::POST,
            "/api/memory/facts".into(),
            Some(json!({"content": "x", "category": "context", "confidence": 0.5})),
        ),
        (
            Method::PATCH,
            "/api/memory/facts/f1".into(),
            Some(json!({"content": "x"})),
        ),
        (Method::DELETE, "/api/memory/facts/f1".into(), None),
        (Method::GET, "/api/memory/export".into(), None),
        (
            Method::POST,
            "/api/memory/import".into(),
            Some(json!({"version": "1.0", "facts": []})),
        ),
        (Method::GET, "/api/memory/config".into(), None),
        (Method::GET, "/api/memory/status".into(), None),
        (
            Method::POST,
            "/api/memory/messages".into(),
            Some(json!({"thread_id": "t", "messages": []})),
        ),
        (Method::GET, "/api/memory/context".into(), None),
        (Method::GET, "/api/memory/search?q=tea".into(), None),
        (Method::POST, "/api/memory/index/rebuild".into(), None),
        (Method::GET, "/api/threads/t1/runs/r1/events".into(), None),
    ];
    let mut checked = 0;
    for (m, uri, body) in &routes {
        // Missing and forged tokens: 401, never data.
        for token in [
            None,
            Some("forged-token-0123456789"),
            Some("alice-token-012345678"),
        ] {
            let (s, text) = send(&app, m.clone(), uri, token, body.clone()).await;
            assert_eq!(
                s,
                StatusCode::UNAUTHORIZED,
                "{m} {uri} with {token:?}: {text}"
            );
            assert!(!text.contains("penicillin"));
            checked += 1;
        }
        // A forged internal token claiming bob.
        let mut b = Request::builder()
            .method(m.clone())
            .uri(uri.as_str())
            .header("host", "127.0.0.1")
            .header("x-deerflow-internal-token", "forged-internal-0123456")
            .header("x-deerflow-owner-user-id", "bob");
        if body.is_some() {
            b = b.header("content-type", "application/json");
        }
        let req = b
            .body(Body::from(
                body.as_ref().map(|v| v.to_string()).unwrap_or_default(),
            ))
            .unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        assert!(
            matches!(resp.status().as_u16(), 401 | 403),
            "{m} {uri}: forged internal token got {}",
            resp.status()
        );
        // Hostile agents: 400.
        if uri.starts_with("/api/memory")
            && uri != "/api/memory/config"
            && uri != "/api/memory/status"
            && !uri.contains("rebuild")
        {
            for agent in hostile_agents() {
                let sep = if uri.contains('?') { '&' } else { '?' };
                let u = format!("{uri}{sep}agent={}", enc(&agent));
                let (s, text) = send(&app, m.clone(), &u, alice, body.clone()).await;
                assert!(
                    s.is_client_error(),
                    "{m} {uri} agent {agent:.20}: {s} {text:.200}"
                );
                assert!(!text.contains("penicillin"));
                checked += 1;
            }
        }
    }
    // Hostile and foreign fact ids in the path: 4xx.
    let mut ids = hostile_fact_ids();
    ids.push(w.bob_fact.clone());
    ids.retain(|i| fits_uri(i));
    ids.push(long(50_000));
    for id in &ids {
        for (m, body) in [
            (Method::PATCH, Some(json!({"content": "pwned"}))),
            (Method::DELETE, None),
        ] {
            let (s, text) = send(
                &app,
                m.clone(),
                &format!("/api/memory/facts/{}", enc(id)),
                alice,
                body,
            )
            .await;
            assert!(s.is_client_error(), "{m} {id:.40}: {s} {text:.200}");
            assert!(!text.contains("penicillin"));
            checked += 1;
        }
    }
    // Alice's reads never show bob's data.
    for uri in [
        "/api/memory",
        "/api/memory/export",
        "/api/memory/search?q=penicillin",
        "/api/memory/context",
    ] {
        let (s, text) = send(&app, Method::GET, uri, alice, None).await;
        assert_eq!(s, StatusCode::OK, "{uri}");
        assert!(!text.contains("penicillin"), "{uri}: {text}");
    }
    w.check_untouched("gateway");
    deermem_reliability::figure("isolation", "gateway_requests_checked", checked);
}

struct Mcp {
    writer: tokio::io::WriteHalf<tokio::io::DuplexStream>,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>>,
    next: i64,
}

impl Mcp {
    async fn request(&mut self, method: &str, params: Value) -> Value {
        use tokio::io::AsyncWriteExt as _;
        self.next += 1;
        let id = self.next;
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.writer
            .write_all(format!("{msg}\n").as_bytes())
            .await
            .unwrap();
        loop {
            let line =
                tokio::time::timeout(std::time::Duration::from_secs(60), self.lines.next_line())
                    .await
                    .expect("answer in time")
                    .unwrap()
                    .expect("open");
            let v: Value = serde_json::from_str(&line).unwrap();
            if v["id"] == json!(id) {
                return v;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_tools_refuse_escapes_and_other_users_ids() {
    use tokio::io::AsyncWriteExt as _;
    let w = world().await;
    let (client, server) = tokio::io::duplex(1 << 20);
    let (sr, sw) = tokio::io::split(server);
    let identity = deermem_mcp::McpIdentity {
        user: UserId::new("alice").unwrap(),
        agent: None,
    };
    let task = tokio::spawn(deermem_mcp::serve_io(
        Arc::clone(&w.manager),
        identity,
        sr,
        sw,
    ));
    let (cr, cw) = tokio::io::split(client);
    let mut c = Mcp {
        writer: cw,
        lines: tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(cr)),
        next: 0,
    };
    c.request("initialize", json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "rel", "version": "0"}})).await;
    c.writer
        .write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n")
        .await
        .unwrap();
    let mut ids = hostile_fact_ids();
    ids.push(w.bob_fact.clone());
    for id in &ids {
        for (tool, args) in [
            ("memory_update", json!({"fact_id": id, "content": "pwned"})),
            ("memory_delete", json!({"fact_id": id})),
        ] {
            let r = c
                .request("tools/call", json!({"name": tool, "arguments": args}))
                .await;
            let is_error = r["result"]["isError"] == json!(true) || r.get("error").is_some();
            assert!(is_error, "{tool} {id:.40}: {r}");
            assert!(!r.to_string().contains("penicillin"));
        }
    }
    let r = c
        .request(
            "tools/call",
            json!({"name": "memory_search", "arguments": {"query": "penicillin"}}),
        )
        .await;
    assert!(
        !r.to_string().contains("penicillin allergy") && !r.to_string().contains(BOB_SECRET),
        "{r}"
    );
    let r = c
        .request("resources/read", json!({"uri": "memory://facts"}))
        .await;
    assert!(!r.to_string().contains("penicillin"), "{r}");
    c.writer.shutdown().await.unwrap();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(30), task).await;
    w.check_untouched("mcp");
}

/// The `deermem` binary next to this test's executable (built by `cargo test --workspace`).
fn deermem_bin() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?.parent()?;
    let bin = dir.join("deermem");
    bin.is_file().then_some(bin)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_commands_refuse_escapes_and_other_users_ids() {
    let Some(bin) = deermem_bin() else {
        println!(
            "SKIPPED cli isolation: the deermem binary is not built (cargo build -p deermem-cli)"
        );
        return;
    };
    let w = world().await;
    w.manager.close().await;
    let run = |args: Vec<String>| {
        let out = std::process::Command::new(&bin)
            .env_remove("DEERMEM_CONFIG")
            .env_remove("DEERMEM_DATA_DIR")
            .env("DEERMEM_LOG", "error")
            .arg("--storage-path")
            .arg(&w.root)
            .arg("--json")
            .args(&args)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code().unwrap_or(-1), text)
    };
    let mut ids = hostile_fact_ids();
    ids.retain(|i| !i.contains('\u{0}') && i.len() < 50_000); // argv cannot carry NUL
    ids.push(w.bob_fact.clone());
    for id in &ids {
        for args in [
            vec![
                "facts".into(),
                "get".into(),
                id.clone(),
                "--user".into(),
                "alice".into(),
            ],
            vec![
                "facts".into(),
                "update".into(),
                id.clone(),
                "--user".into(),
                "alice".into(),
                "--content".into(),
                "pwned".into(),
            ],
            vec![
                "facts".into(),
                "delete".into(),
                id.clone(),
                "--user".into(),
                "alice".into(),
            ],
        ] {
            let (code, text) = run(args.clone());
            assert!(matches!(code, 4 | 5), "{args:?}: exit {code}: {text:.300}");
            assert!(!text.contains("penicillin"));
        }
    }
    for agent in hostile_agents()
        .into_iter()
        .filter(|a| !a.contains('\u{0}'))
    {
        let (code, text) = run(vec![
            "export".into(),
            "--user".into(),
            "alice".into(),
            "--agent".into(),
            agent.clone(),
        ]);
        assert_eq!(code, 5, "agent {agent:.20}: {text:.300}");
    }
    for user in hostile_users()
        .into_iter()
        .filter(|u| !u.contains('\u{0}') && u.len() < 50_000)
    {
        let (code, text) = run(vec!["export".into(), "--user".into(), user.clone()]);
        assert!(
            matches!(code, 0 | 5),
            "user {user:.20}: exit {code}: {text:.300}"
        );
        assert!(
            !text.contains("penicillin"),
            "user {user:.20} sees bob's data"
        );
    }
    w.check_untouched("cli");
}
