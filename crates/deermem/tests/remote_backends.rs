//! The two remote backends selected from configuration text through `build_backend` /
//! `build_manager`, against the strict fake servers of their crates on 127.0.0.1: captures reach
//! the fake (asserted request by request), recall and search return the fake's data, and
//! configuration mistakes fail at build time naming the reason.

#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg(all(feature = "honcho", feature = "openviking"))]

use deermem_core::ports::MemoryManagerExt as _;
use std::path::Path;
use std::time::Duration;

use deermem::{BuildError, BuildOptions, build_backend, build_manager};
use deermem_backend_honcho::fake::FakeHoncho;
use deermem_backend_openviking::fake::{API_KEY, FakeOv};
use deermem_core::ports::{AddRequest, ContextRequest, MemoryScope, SearchRequest};
use deermem_core::{ManagerError, MemoryConfig, Message, UserId};
use serde_json::json;

const FLUSH: Duration = Duration::from_secs(30);

/// Honcho identity of `bob@example.com`, derived as the reference derives it (sanitised id plus
/// the first 8 hex digits of the raw id's SHA-256).
const BOB: &str = "bob@example.com";
const BOB_WS: &str = "deerflow-u-bob-example-com-5ff860bf";
const BOB_PEER: &str = "bob-example-com-5ff860bf";
/// Honcho session of thread `t1`.
const T1_SESSION: &str = "df-t1-628b49d9";

/// The variable the OpenViking configs below name in `api_key_env`.
const OV_KEY_ENV: &str = "DEERMEM_TEST_OV_KEY";

fn ov_env(name: &str) -> Option<String> {
    (name == OV_KEY_ENV).then(|| API_KEY.to_owned())
}

fn no_env(_: &str) -> Option<String> {
    None
}

fn load(yaml: &str, env: &dyn Fn(&str) -> Option<String>) -> MemoryConfig {
    deermem::load_config_text(yaml, env)
        .unwrap_or_else(|e| panic!("config does not load: {e}\n{yaml}"))
        .memory
}

fn options<'a>(env: &'a dyn Fn(&str) -> Option<String>, root: &Path) -> BuildOptions<'a> {
    let mut opts = BuildOptions::new(env);
    opts.storage_path = Some(root.to_path_buf());
    opts
}

fn honcho_yaml(url: &str, extra: &str) -> String {
    format!("memory:\n  manager_class: honcho\n  backend_config:\n    base_url: {url}\n{extra}")
}

fn openviking_yaml(url: &str, mode: &str) -> String {
    format!(
        "memory:\n  manager_class: openviking\n  mode: {mode}\n  backend_config:\n    base_url: {url}\n    owner_user_id: alice\n    api_key_env: {OV_KEY_ENV}\n"
    )
}

fn scope(user: &str) -> MemoryScope {
    MemoryScope::user(UserId::new(user).unwrap())
}

fn conversation() -> Vec<Message> {
    vec![
        Message::system("you are helpful"),
        Message::human("I drink oolong tea every morning"),
        Message::ai("Noted: oolong tea in the morning."),
    ]
}

fn add(user: &str, thread: &str) -> AddRequest {
    AddRequest {
        thread_id: thread.into(),
        messages: conversation(),
        scope: scope(user),
        trace_id: Some("trace-remote".into()),
    }
}

fn build_err(config: &MemoryConfig, env: &dyn Fn(&str) -> Option<String>, root: &Path) -> String {
    match build_backend(config, options(env, root)) {
        Ok(b) => panic!("built {} where an error was expected", b.class()),
        Err(e) => e.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn honcho_from_config_captures_recalls_and_searches_through_the_fake() {
    let fake = FakeHoncho::start().await;
    let dir = tempfile::tempdir().unwrap();
    let yaml = honcho_yaml(
        &fake.url,
        "    api_key: sk-facade\n    allow_insecure_http: true\n",
    );
    let config = load(&yaml, &no_env);
    let backend = build_backend(&config, options(&no_env, dir.path())).unwrap();
    assert_eq!(backend.class(), "honcho");
    let m = backend.manager();
    assert_eq!(m.name(), deermem_backend_honcho::BACKEND_NAME);
    assert!(fake.requests().is_empty(), "building sends no request");

    m.add(add(BOB, "t1")).await.unwrap();
    assert!(m.shutdown_flush(FLUSH).await, "the capture drained");
    let calls = fake.calls();
    assert_eq!(
        calls,
        vec![
            (
                format!("/v3/workspaces/{BOB_WS}/peers"),
                json!({"id": BOB_PEER})
            ),
            (
                format!("/v3/workspaces/{BOB_WS}/peers"),
                json!({"id": "deerflow"})
            ),
            (
                format!("/v3/workspaces/{BOB_WS}/sessions"),
                json!({"id": T1_SESSION})
            ),
            (
                format!("/v3/workspaces/{BOB_WS}/sessions/{T1_SESSION}/peers"),
                json!({BOB_PEER: {}, "deerflow": {}})
            ),
            (
                format!("/v3/workspaces/{BOB_WS}/sessions/{T1_SESSION}/messages"),
                json!({"messages": [
                    {"peer_id": BOB_PEER, "content": "I drink oolong tea every morning"},
                    {"peer_id": "deerflow", "content": "Noted: oolong tea in the morning."}
                ]})
            ),
        ]
    );
    for r in fake.requests() {
        assert_eq!(r.authorization.as_deref(), Some("Bearer sk-facade"));
        assert!(r.status == 200 || r.status == 201, "{r:?}");
    }
    let stored: Vec<(String, String)> = fake
        .messages()
        .into_iter()
        .map(|s| (s.session, s.content))
        .collect();
    assert_eq!(
        stored,
        vec![
            (
                T1_SESSION.to_owned(),
                "I drink oolong tea every morning".to_owned()
            ),
            (
                T1_SESSION.to_owned(),
                "Noted: oolong tea in the morning.".to_owned()
            ),
        ]
    );

    // Reads go straight to the fake.
    fake.clear_requests();
    fake.set_representation(BOB_WS, BOB_PEER, "  Bob drinks oolong tea.  ");
    let context = m
        .get_context(ContextRequest {
            scope: scope(BOB),
            thread_id: Some("t1".into()),
        })
        .await
        .unwrap();
    assert_eq!(context, "Bob drinks oolong tea.");
    let block = m
        .get_context_block(ContextRequest {
            scope: scope(BOB),
            thread_id: None,
        })
        .await
        .unwrap();
    assert_eq!(block.block, "<memory>\nBob drinks oolong tea.\n</memory>\n");
    let hits = m
        .search(SearchRequest {
            query: "OOLONG".into(),
            top_k: 5,
            scope: scope(BOB),
            category: None,
            mode: None,
        })
        .await
        .unwrap();
    let found: Vec<(&str, &str, &str)> = hits
        .iter()
        .map(|f| (f.content.as_str(), f.source.as_str(), f.category.as_str()))
        .collect();
    assert_eq!(
        found,
        vec![
            ("I drink oolong tea every morning", T1_SESSION, "memory"),
            ("Noted: oolong tea in the morning.", T1_SESSION, "memory"),
        ]
    );
    let doc = m.get_memory(scope(BOB)).await.unwrap();
    assert_eq!(doc.user.work_context.summary, "Bob drinks oolong tea.");
    let paths: Vec<String> = fake.requests().into_iter().map(|r| r.raw_path).collect();
    assert_eq!(
        paths,
        vec![
            format!("/v3/workspaces/{BOB_WS}/peers/{BOB_PEER}/representation"),
            format!("/v3/workspaces/{BOB_WS}/peers/{BOB_PEER}/representation"),
            format!("/v3/workspaces/{BOB_WS}/search"),
            format!("/v3/workspaces/{BOB_WS}/peers/{BOB_PEER}/representation"),
        ]
    );
    // Another user's workspace holds nothing of Bob's.
    let other = m
        .search(SearchRequest {
            query: "oolong".into(),
            top_k: 5,
            scope: scope("carol"),
            category: None,
            mode: None,
        })
        .await
        .unwrap();
    assert!(other.is_empty(), "{other:?}");
    m.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn honcho_build_manager_supports_tool_mode_and_unsupported_edits_are_typed() {
    let fake = FakeHoncho::start().await;
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "memory:\n  manager_class: honcho\n  mode: tool\n  backend_config:\n    base_url: {}\n",
        fake.url
    );
    let m = build_manager(&load(&yaml, &no_env), options(&no_env, dir.path())).unwrap();
    assert!(m.allows_tool_mode() && m.searcher().is_some() && m.reader().is_some());
    assert!(m.facts().is_none());
    // Tool mode keeps passive writes.
    m.add(add(BOB, "t1")).await.unwrap();
    assert!(m.shutdown_flush(FLUSH).await);
    assert_eq!(fake.messages().len(), 2);
    let err = m
        .create_fact(deermem_core::ports::NewFact::new("likes tea"), scope(BOB))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ManagerError::Unsupported { .. }),
        "fact CRUD is unsupported: {err:?}"
    );
    m.close().await;
}

#[tokio::test]
async fn honcho_api_key_over_plain_http_fails_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = honcho_yaml("http://127.0.0.1:9", "    api_key: sk-secret-value\n");
    let err = build_err(&load(&yaml, &no_env), &no_env, dir.path());
    assert!(
        err.contains("memory.backend_config.api_key")
            && err.contains("allow_insecure_http")
            && err.contains("honcho"),
        "{err}"
    );
    assert!(
        !err.contains("sk-secret-value"),
        "the key leaked into: {err}"
    );
    assert!(matches!(
        build_backend(&load(&yaml, &no_env), options(&no_env, dir.path())),
        Err(BuildError::Config(c)) if c.key == "memory.backend_config.api_key"
    ));
    // `$VAR` strings resolve from the environment given to the loader: the same rule holds.
    let env = |name: &str| (name == "HONCHO_KEY").then(|| "sk-from-env".to_owned());
    let yaml = honcho_yaml("http://127.0.0.1:9", "    api_key: $HONCHO_KEY\n");
    let err = build_err(&load(&yaml, &env), &env, dir.path());
    assert!(err.contains("memory.backend_config.api_key"), "{err}");
    // https needs no opt-in, and building sends nothing.
    let yaml = honcho_yaml("https://127.0.0.1:9", "    api_key: sk-secret-value\n");
    let b = build_backend(&load(&yaml, &no_env), options(&no_env, dir.path())).unwrap();
    assert_eq!(b.class(), "honcho");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openviking_from_config_captures_recalls_and_searches_through_the_fake() {
    let fake = FakeOv::start().await;
    let tea = fake.add_memory(
        "preferences",
        "tea",
        "Drinks oolong tea every morning.",
        0.82,
    );
    let dir = tempfile::tempdir().unwrap();
    let config = load(&openviking_yaml(&fake.url(), "middleware"), &ov_env);
    let backend = build_backend(&config, options(&ov_env, dir.path())).unwrap();
    assert_eq!(backend.class(), "openviking");
    let m = backend.manager();
    assert_eq!(m.name(), deermem_backend_openviking::BACKEND_NAME);
    assert!(fake.requests().is_empty(), "building sends no request");

    m.add(add("alice", "t1")).await.unwrap();
    assert!(m.shutdown_flush(FLUSH).await, "the capture drained");
    let sid = deermem_backend_openviking::scope::session_id("alice", "deerflow", "t1");
    assert_eq!(
        fake.lines(),
        vec![
            format!("POST /api/v1/sessions/{sid}/messages/batch"),
            format!("POST /api/v1/sessions/{sid}/commit"),
        ]
    );
    let reqs = fake.requests();
    assert_eq!(
        reqs[0].body,
        Some(json!({"messages": [
            {"role": "user", "parts": [{"type": "text", "text": "I drink oolong tea every morning"}], "peer_id": "deerflow"},
            {"role": "assistant", "parts": [{"type": "text", "text": "Noted: oolong tea in the morning."}], "peer_id": "deerflow"}
        ]}))
    );
    for r in &reqs {
        assert_eq!(r.header("x-api-key"), Some(API_KEY));
        assert_eq!(r.header("x-openviking-actor-peer"), Some("deerflow"));
    }
    assert_eq!(fake.session_ids(), vec![sid.clone()]);
    assert_eq!(fake.session_messages(&sid).len(), 2);
    assert_eq!(fake.session_commits(&sid), 1);
    // The hash-only cursor lives under the storage root the facade resolved.
    assert!(
        dir.path()
            .join("openviking/sessions")
            .join(format!("{sid}.json"))
            .is_file()
    );

    // A fresh manager (the first one is closed by the flush) reads through the fake.
    fake.clear();
    let m = build_manager(&config, options(&ov_env, dir.path())).unwrap();
    let block = m
        .get_context_block(ContextRequest {
            scope: scope("alice"),
            thread_id: None,
        })
        .await
        .unwrap();
    assert_eq!(
        block.block,
        "<memory>\n- [preferences] Drinks oolong tea every morning.\n</memory>\n"
    );
    let hits = m
        .search_scored(SearchRequest {
            query: "tea".into(),
            top_k: 3,
            scope: scope("alice"),
            category: None,
            mode: None,
        })
        .await
        .unwrap();
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].fact.content, "Drinks oolong tea every morning.");
    assert_eq!(hits[0].fact.id, tea);
    assert_eq!(hits[0].fact.category, "preferences");
    assert_eq!(hits[0].score, Some(0.82));
    assert_eq!(
        fake.lines(),
        vec!["POST /api/v1/search/find", "POST /api/v1/search/find"]
    );
    // The single-owner rule: another user is refused before any request.
    fake.clear();
    let err = m.add(add("bob", "t1")).await.unwrap_err();
    assert!(matches!(err, ManagerError::InvalidInput { .. }), "{err:?}");
    assert!(fake.requests().is_empty());
    // Reading the document is not supported by this backend.
    assert!(matches!(
        m.get_memory(scope("alice")).await,
        Err(ManagerError::Unsupported { .. })
    ));
    assert!(m.shutdown_flush(FLUSH).await);
    fake.assert_clean();
}

#[tokio::test]
async fn openviking_tool_mode_fails_at_build_naming_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let config = load(&openviking_yaml("http://127.0.0.1:9", "tool"), &ov_env);
    let err = build_err(&config, &ov_env, dir.path());
    assert!(
        err.contains("openviking") && err.contains("middleware") && err.contains("memory.mode"),
        "{err}"
    );
    // A configuration mistake, typed as one (not as a backend that failed to start).
    assert!(matches!(
        build_backend(&config, options(&ov_env, dir.path())),
        Err(BuildError::Config(c)) if c.key == "memory.mode"
    ));
}

#[tokio::test]
async fn openviking_without_its_key_fails_at_build_naming_the_variable() {
    let dir = tempfile::tempdir().unwrap();
    let config = load(
        &openviking_yaml("http://127.0.0.1:9", "middleware"),
        &no_env,
    );
    let err = build_err(&config, &no_env, dir.path());
    assert!(
        err.contains("memory.backend_config.api_key_env") && err.contains(OV_KEY_ENV),
        "{err}"
    );
    assert!(matches!(
        build_backend(&config, options(&no_env, dir.path())),
        Err(BuildError::Config(c)) if c.key == "memory.backend_config.api_key_env"
    ));
    // Plain http to a non-loopback host is refused (the key would travel in clear text).
    let yaml = openviking_yaml("http://memory.example:1933", "middleware");
    let err = build_err(&load(&yaml, &ov_env), &ov_env, dir.path());
    assert!(err.contains("memory.backend_config.base_url"), "{err}");
    assert!(!err.contains(API_KEY), "the key leaked into: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openviking_cursor_root_is_the_storage_root_the_facade_resolved() {
    let fake = FakeOv::start().await;
    let home = tempfile::tempdir().unwrap();
    let home_path = home.path().to_str().unwrap().to_owned();
    let env = move |name: &str| match name {
        OV_KEY_ENV => Some(API_KEY.to_owned()),
        "DEER_FLOW_HOME" => Some(home_path.clone()),
        _ => None,
    };
    let sid = deermem_backend_openviking::scope::session_id("alice", "deerflow", "t1");
    let cursor = |root: &Path| root.join("openviking/sessions").join(format!("{sid}.json"));
    let yaml = |storage_path: &str| {
        format!(
            "{}    storage_path: {storage_path}\n",
            openviking_yaml(&fake.url(), "middleware")
        )
    };

    // A relative storage_path resolves against $DEER_FLOW_HOME, once.
    let m = build_manager(&load(&yaml("mem"), &env), BuildOptions::new(&env)).unwrap();
    m.add(add("alice", "t1")).await.unwrap();
    assert!(m.shutdown_flush(FLUSH).await);
    assert!(cursor(&home.path().join("mem")).is_file());
    assert!(!home.path().join("mem/mem").exists());

    // The host's override (the CLI's --storage-path) wins over an absolute storage_path.
    let elsewhere = tempfile::tempdir().unwrap();
    let chosen = tempfile::tempdir().unwrap();
    let config = load(&yaml(elsewhere.path().to_str().unwrap()), &env);
    let m = build_manager(&config, options(&env, chosen.path())).unwrap();
    m.add(add("alice", "t1")).await.unwrap();
    assert!(m.shutdown_flush(FLUSH).await);
    assert!(cursor(chosen.path()).is_file());
    assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
    // Each root holds its own cursor, so the second root sent the thread again.
    assert_eq!(fake.session_messages(&sid).len(), 4);
    fake.assert_clean();
}
