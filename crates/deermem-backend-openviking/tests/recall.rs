//! Recall, search and lifecycle contract tests against the fake OpenViking server: the fixed
//! injection query through `find`/`search`, request bodies and headers, content modes,
//! formatting, read failure policy and retry, warm-up, capabilities and unsupported operations.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use deermem_core::ports::MemoryManagerExt as _;
use std::sync::atomic::Ordering;

use deermem_backend_openviking::{BACKEND_NAME, OpenVikingConfig, OpenVikingManager};
use deermem_core::ports::{ContextRequest, MemoryManager, MemoryScope, NewFact, SearchRequest};
use deermem_core::{AgentName, ManagerError, MemoryMode, UserId};
use serde_json::{Value, json};
use support::{FakeOv, USER_ID, manager};

const QUERY: &str = "user profile preferences important entities events ongoing goals constraints and prior decisions";

fn alice(agent: Option<&str>) -> MemoryScope {
    MemoryScope::new(
        Some(UserId::new("alice").unwrap()),
        agent.map(|a| AgentName::parse(a).unwrap()),
    )
}

fn ctx(agent: Option<&str>, thread: Option<&str>) -> ContextRequest {
    ContextRequest {
        scope: alice(agent),
        thread_id: thread.map(str::to_owned),
    }
}

fn search_req(query: &str, top_k: usize, category: Option<&str>) -> SearchRequest {
    SearchRequest {
        query: query.into(),
        top_k,
        scope: alice(Some("research")),
        category: category.map(str::to_owned),
        mode: None,
    }
}

/// A uri in the fake user's memory space, as the server returns them.
fn u(path: &str) -> String {
    format!("viking://user/{USER_ID}/memories/{path}")
}

/// A memory file's hit. Current servers send the memory type as a `memory_type=` tag and no
/// `overview`; older ones sent `overview` (kept here: `content_mode` still prefers it).
fn hit(uri: &str, overview: Option<&str>, abstract_: &str, memory_type: Option<&str>) -> Value {
    let tags: Vec<String> = memory_type
        .map(|t| format!("memory_type={t}"))
        .into_iter()
        .collect();
    let mut h = json!({"context_type": "memory", "uri": uri, "level": 2, "score": 0.8,
                       "abstract": abstract_, "tags": tags});
    if let Some(o) = overview {
        h["overview"] = json!(o);
    }
    h
}

#[tokio::test]
async fn context_without_thread_uses_find_with_the_fixed_query() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&fake, dir.path(), json!({}));
    fake.set_hits(vec![hit(
        &u("preferences/concise.md"),
        Some("Prefers concise answers."),
        "concise",
        Some("preferences"),
    )]);
    let out = m.get_context(ctx(Some("Research"), None)).await.unwrap();
    assert_eq!(out, "- [preferences] Prefers concise answers.");
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].line(), "POST /api/v1/search/find");
    assert_eq!(reqs[0].header("x-openviking-actor-peer"), Some("research"));
    assert_eq!(
        reqs[0].body.as_ref().unwrap().to_string(),
        json!({"query": QUERY,
               "target_uri": ["viking://~/memories", "viking://~/peers/research/memories"],
               "limit": 8, "telemetry": false})
        .to_string(),
        "exact keys in the SDK's order"
    );
    fake.assert_clean();
}

#[tokio::test]
async fn context_with_thread_uses_search_with_the_session() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = manager(
        &fake,
        dir.path(),
        json!({"retrieval": {"top_k": 3, "score_threshold": 0.35}}),
    );
    fake.set_hits(vec![hit(&u("a.md"), None, "Uses Vim daily.", None)]);
    let out = m
        .get_context(ctx(Some("research"), Some("thread-1")))
        .await
        .unwrap();
    assert_eq!(
        out, "- [memory] Uses Vim daily.",
        "abstract when overview is absent"
    );
    let reqs = fake.requests();
    assert_eq!(reqs[0].line(), "POST /api/v1/search/search");
    assert_eq!(
        reqs[0].body.as_ref().unwrap().to_string(),
        json!({"query": QUERY,
               "target_uri": ["viking://~/memories", "viking://~/peers/research/memories"],
               "session_id": "df_37a681a43a6b7c1cea6b092d50b00150bb780f0c09bec010",
               "limit": 3, "score_threshold": 0.35, "telemetry": false})
        .to_string()
    );
    fake.assert_clean();
}

#[tokio::test]
async fn context_formatting_dedups_and_fits_the_budget() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = manager(
        &fake,
        dir.path(),
        json!({"retrieval": {"max_injection_chars": 256}}),
    );
    let long = "word ".repeat(100);
    fake.set_hits(vec![
        hit(&u("1.md"), Some("Likes  tea.\n"), "", Some("preferences")),
        hit(&u("2.md"), Some("likes TEA."), "", Some("preferences")),
        hit(&u("3.md"), Some(""), "", None),
        hit(&u("4.md"), Some(&long), "", None),
    ]);
    let out = m.get_context(ctx(None, None)).await.unwrap();
    assert_eq!(out.chars().count(), 256);
    assert!(out.starts_with("- [preferences] Likes tea.\n- [memory] word word"));
    assert!(out.ends_with('…'));
    assert!(!out.contains("RESOURCE TEXT"), "resources are ignored");
}

#[tokio::test]
async fn read_content_mode_reads_each_hit_and_falls_back_on_errors() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = manager(
        &fake,
        dir.path(),
        json!({"retrieval": {"content_mode": "read"}}),
    );
    fake.set_hits(vec![
        hit(&u("full.md"), Some("overview one"), "abs one", None),
        hit(&u("missing.md"), Some("overview two"), "abs two", None),
    ]);
    fake.state
        .contents
        .lock()
        .unwrap()
        .insert(u("full.md"), json!("The full text of memory one."));
    let out = m.get_context(ctx(None, None)).await.unwrap();
    assert_eq!(
        out,
        "- [memory] The full text of memory one.\n- [memory] overview two"
    );
    let reqs = fake.requests();
    let reads: Vec<_> = reqs
        .iter()
        .filter(|r| r.path == "/api/v1/content/read")
        .collect();
    assert_eq!(reads.len(), 2);
    assert_eq!(
        reads[0].query.as_deref(),
        Some("uri=viking%3A%2F%2Fuser%2Fov-alice%2Fmemories%2Ffull.md&offset=0&limit=-1")
    );
    assert!(
        reads
            .iter()
            .all(|r| r.header("x-openviking-actor-peer") == Some("deerflow"))
    );
    fake.assert_clean();
}

#[tokio::test]
async fn auto_content_mode_reads_only_level_2_hits() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = manager(
        &fake,
        dir.path(),
        json!({"retrieval": {"content_mode": "auto"}}),
    );
    let mut no_level = hit(&u("g.md"), Some("ov g"), "", None);
    no_level.as_object_mut().unwrap().remove("level");
    fake.set_hits(vec![hit(&u("f.md"), Some("ov"), "", None), no_level]);
    fake.state
        .contents
        .lock()
        .unwrap()
        .insert(u("f.md"), json!("file body"));
    let out = m.get_context(ctx(None, None)).await.unwrap();
    assert_eq!(out, "- [memory] file body\n- [memory] ov g");
    assert_eq!(
        fake.lines()
            .iter()
            .filter(|l| l.contains("content/read"))
            .count(),
        1
    );
}

/// Defect: every read sent `viking://user/memories` and `viking://user/peers/<peer>/memories`,
/// which a server in `api_key` mode refuses for a USER key (`INVALID_URI`: `memories` is a
/// reserved name, not a user id), so recall never worked. The current user's space is
/// `viking://~/…`.
#[tokio::test]
async fn reads_target_the_current_users_space() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = manager(
        &fake,
        dir.path(),
        json!({"failure_policy": {"read": "raise"}}),
    );
    fake.add_memory("preferences", "editor", "Uses Vim as the code editor.", 0.6);
    let out = m.get_context(ctx(Some("research"), None)).await.unwrap();
    assert_eq!(out, "- [preferences] Uses Vim as the code editor.");
    let facts = m.search(search_req("editor", 5, None)).await.unwrap();
    assert_eq!(facts.len(), 1);
    for r in fake.requests() {
        assert_eq!(
            r.body.as_ref().unwrap()["target_uri"],
            json!(["viking://~/memories", "viking://~/peers/research/memories"])
        );
    }
    fake.assert_clean();
}

/// OpenViking ranks on its server: `hybrid` (or no mode) is its ranking; `bm25` and `vector`
/// are refused with a typed error and send nothing.
#[tokio::test]
async fn search_modes_other_than_hybrid_are_refused_without_a_request() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&fake, dir.path(), json!({}));
    fake.add_memory("preferences", "editor", "Uses Vim as the code editor.", 0.6);
    for mode in [
        deermem_core::SearchMode::Bm25,
        deermem_core::SearchMode::Vector,
    ] {
        let req = SearchRequest {
            mode: Some(mode),
            ..search_req("editor", 5, None)
        };
        match m.search(req).await.unwrap_err() {
            ManagerError::InvalidInput { message, .. } => assert_eq!(
                message,
                format!(
                    "search mode {} is not available with the openviking backend: the remote server ranks results itself (use hybrid or leave mode unset)",
                    mode.as_str()
                )
            ),
            other => panic!("{mode:?}: {other:?}"),
        }
    }
    assert!(fake.requests().is_empty());
    let req = SearchRequest {
        mode: Some(deermem_core::SearchMode::Hybrid),
        ..search_req("editor", 5, None)
    };
    let facts = m.search(req).await.unwrap();
    assert_eq!(facts.len(), 1);
    assert_eq!(facts[0].content, "Uses Vim as the code editor.");
    fake.assert_clean();
}

/// The fake answers the reference's uris as the real server does.
#[tokio::test]
async fn the_fake_refuses_the_reference_uris_like_the_server() {
    let fake = FakeOv::start().await;
    let client = deermem_backend_openviking::client::OpenVikingClient::new(
        &fake.url(),
        deermem_core::config::ConfigSecret::new(support::API_KEY),
        std::time::Duration::from_secs(5),
    )
    .unwrap();
    let request = |uris: &[&str]| deermem_backend_openviking::client::RetrievalRequest {
        query: "q".into(),
        target_uri: uris.iter().map(|u| (*u).to_owned()).collect(),
        session_id: None,
        limit: 8,
        score_threshold: None,
        filter: None,
        tags: None,
    };
    let e = client
        .retrieve("deerflow", &request(&["viking://user/memories"]))
        .await
        .unwrap_err();
    assert_eq!((e.code.as_str(), e.status), ("INVALID_URI", Some(400)));
    assert!(e.message.contains("Use 'viking://~/memories'"), "{e}");
    let e = client
        .retrieve(
            "deerflow",
            &request(&["viking://user/someone-else/memories"]),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code, "PERMISSION_DENIED");
    assert_eq!(fake.violations().len(), 2);
}

/// Defect: the server's directory summaries (level 0/1 entries such as `.overview.md`, whose
/// text lists the files of a directory) were injected as memories, and every line said
/// `[memory]`. Only memory files are recalled, each with the type from its tag.
#[tokio::test]
async fn directory_entries_are_left_out_and_the_type_comes_from_the_tag() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    for mode in ["overview", "read", "auto", "abstract"] {
        let m = manager(
            &fake,
            dir.path(),
            json!({"retrieval": {"content_mode": mode}}),
        );
        fake.set_hits(Vec::new());
        fake.add_memory("preferences", "diet", "Vegetarian; no mushrooms.", 0.61);
        fake.add_memory("entities", "miso", "Miso is the user's cat.", 0.6);
        let out = m.get_context(ctx(None, None)).await.unwrap();
        assert_eq!(
            out, "- [preferences] Vegetarian; no mushrooms.\n- [entities] Miso is the user's cat.",
            "{mode}"
        );
        assert!(
            !out.contains("Overview") && !out.contains("---"),
            "{mode}: {out}"
        );
        let facts = m.search(search_req("diet", 10, None)).await.unwrap();
        let ids: Vec<&str> = facts.iter().map(|f| f.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                format!("viking://user/{USER_ID}/memories/preferences/{USER_ID}/diet.md"),
                format!("viking://user/{USER_ID}/memories/entities/{USER_ID}/miso.md"),
            ],
            "{mode}"
        );
        assert_eq!(facts[0].category, "preferences");
    }
    fake.assert_clean();
}

/// Defect: `search --category` sent `filter: {field: category}`, which matches nothing on the
/// server (memories carry `tags: ["memory_type=<type>"]`). The type is sent as a tag, and the
/// hits are checked against it.
#[tokio::test]
async fn category_narrows_search_by_the_memory_type_tag() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&fake, dir.path(), json!({}));
    fake.add_memory("preferences", "editor", "Uses Vim.", 0.7);
    fake.add_memory("events", "move", "Moved to Lyon in May.", 0.65);
    let all = m.search(search_req("vim lyon", 10, None)).await.unwrap();
    assert_eq!(all.len(), 2);
    let prefs = m
        .search(search_req("vim lyon", 10, Some(" Preferences ")))
        .await
        .unwrap();
    assert_eq!(
        prefs.iter().map(|f| f.content.as_str()).collect::<Vec<_>>(),
        ["Uses Vim."]
    );
    assert_eq!(prefs[0].category, "preferences");
    let body = fake.requests().last().unwrap().body.clone().unwrap();
    assert_eq!(body["tags"], json!(["memory_type=preferences"]));
    assert!(body.get("filter").is_none());
    assert!(
        m.search(search_req("vim", 10, Some("goals")))
            .await
            .unwrap()
            .is_empty()
    );
    // A value the server would refuse as a tag is nothing to find, not an error.
    fake.clear();
    assert!(
        m.search(search_req("vim", 10, Some("a=b")))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(fake.requests().is_empty());
    // The reference's filter finds nothing on the server (and in the fake).
    let client = deermem_backend_openviking::client::OpenVikingClient::new(
        &fake.url(),
        deermem_core::config::ConfigSecret::new(support::API_KEY),
        std::time::Duration::from_secs(5),
    )
    .unwrap();
    let old = client
        .retrieve(
            "deerflow",
            &deermem_backend_openviking::client::RetrievalRequest {
                query: "vim".into(),
                target_uri: vec!["viking://~/memories".into()],
                session_id: None,
                limit: 10,
                score_threshold: None,
                filter: Some(json!({"op": "must", "field": "category", "conds": ["preferences"]})),
                tags: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(old["memories"], json!([]));
    fake.assert_clean();
}

/// Defect: under `failure_policy.read: fail_open` a failed read was visible only as a log
/// line. It is kept as the last backend failure (with a count), which hosts show.
#[tokio::test]
async fn failed_reads_are_kept_as_the_last_backend_failure() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&fake, dir.path(), json!({}));
    assert_eq!(m.last_backend_failure(), None);
    fake.add_memory("preferences", "tea", "Drinks tea.", 0.7);
    assert_eq!(
        m.get_context(ctx(None, None)).await.unwrap(),
        "- [preferences] Drinks tea."
    );
    assert_eq!(m.last_backend_failure(), None, "a success is no failure");
    fake.state.failing_retrievals.store(1, Ordering::SeqCst);
    assert_eq!(m.get_context(ctx(None, None)).await.unwrap(), "");
    let f = m.last_backend_failure().unwrap();
    assert_eq!((f.operation.as_str(), f.count), ("recall", 1));
    assert!(
        f.message.contains("[INTERNAL] index offline"),
        "{}",
        f.message
    );
    fake.state.failing_retrievals.store(1, Ordering::SeqCst);
    assert!(
        m.search(search_req("tea", 3, None))
            .await
            .unwrap()
            .is_empty()
    );
    let f = m.last_backend_failure().unwrap();
    assert_eq!((f.operation.as_str(), f.count), ("search", 2));
}

#[tokio::test]
async fn reads_are_retried_once_on_unavailable() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = manager(
        &fake,
        dir.path(),
        json!({"failure_policy": {"read": "raise"}}),
    );
    fake.set_hits(vec![hit(&u("a.md"), Some("Uses Rust."), "", None)]);
    fake.state.unavailable_reads.store(1, Ordering::SeqCst);
    assert_eq!(
        m.get_context(ctx(None, None)).await.unwrap(),
        "- [memory] Uses Rust."
    );
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 2, "one retry");
    assert_eq!(reqs[0].body, reqs[1].body, "identical retry");

    fake.clear();
    fake.state.unavailable_reads.store(2, Ordering::SeqCst);
    let e = m.get_context(ctx(None, None)).await.unwrap_err();
    assert!(matches!(e, ManagerError::Unavailable { .. }), "{e}");
    assert_eq!(fake.requests().len(), 2, "only one retry");

    // Non-recoverable errors are not retried.
    fake.clear();
    fake.state.failing_retrievals.store(1, Ordering::SeqCst);
    let e = m.search(search_req("vim", 5, None)).await.unwrap_err();
    assert!(matches!(e, ManagerError::Backend { .. }), "{e}");
    assert!(e.to_string().contains("INTERNAL"), "{e}");
    assert_eq!(fake.requests().len(), 1);
}

#[tokio::test]
async fn read_failures_fail_open_by_default() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&fake, dir.path(), json!({}));
    fake.state.failing_retrievals.store(2, Ordering::SeqCst);
    assert_eq!(m.get_context(ctx(None, Some("t"))).await.unwrap(), "");
    assert!(
        m.search(search_req("vim", 5, None))
            .await
            .unwrap()
            .is_empty()
    );
    // An unreachable server is a failure too.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut cfg = serde_json::Map::new();
    cfg.insert("base_url".into(), json!(format!("http://127.0.0.1:{dead}")));
    cfg.insert("owner_user_id".into(), json!("alice"));
    cfg.insert("timeout_seconds".into(), json!(5));
    let m = OpenVikingManager::from_backend_config(
        &cfg,
        MemoryMode::Middleware,
        dir.path().to_path_buf(),
        support::clock(),
        &support::env,
    )
    .unwrap();
    assert_eq!(m.get_context(ctx(None, None)).await.unwrap(), "");
    cfg.insert("failure_policy".into(), json!({"read": "raise"}));
    let m = OpenVikingManager::from_backend_config(
        &cfg,
        MemoryMode::Middleware,
        dir.path().to_path_buf(),
        support::clock(),
        &support::env,
    )
    .unwrap();
    let e = m.get_context(ctx(None, None)).await.unwrap_err();
    assert!(matches!(e, ManagerError::Unavailable { .. }), "{e}");
}

#[tokio::test]
async fn search_sends_category_tag_and_threshold_and_maps_results() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = manager(
        &fake,
        dir.path(),
        json!({"retrieval": {"score_threshold": 0.2}}),
    );
    fake.set_hits(vec![
        hit(&u("a.md"), Some("Uses Vim."), "", Some("preferences")),
        hit(&u("b.md"), Some("uses vim."), "", None),
    ]);
    let facts = m.search(search_req("  editor  ", 500, None)).await.unwrap();
    assert_eq!(facts.len(), 2, "no dedup in search");
    assert_eq!(facts[1].category, "memory", "no type tag");
    let facts = m
        .search(search_req("  editor  ", 500, Some("preferences")))
        .await
        .unwrap();
    let body = fake.requests()[1].body.clone().unwrap();
    assert_eq!(
        body.to_string(),
        json!({"query": "editor",
               "target_uri": ["viking://~/memories", "viking://~/peers/research/memories"],
               "limit": 100, "score_threshold": 0.2,
               "tags": ["memory_type=preferences"],
               "telemetry": false})
        .to_string()
    );
    assert_eq!(fake.requests()[1].line(), "POST /api/v1/search/find");
    assert_eq!(facts.len(), 1);
    assert_eq!(facts[0].id, u("a.md"));
    assert_eq!(facts[0].source, u("a.md"));
    assert_eq!(facts[0].content, "Uses Vim.");
    assert_eq!(facts[0].category, "preferences");
    assert_eq!(facts[0].confidence, 0.8);

    let scored = m
        .search_scored(search_req("editor", 1, Some("")))
        .await
        .unwrap();
    assert_eq!(scored[0].score, Some(0.8));
    let body = fake.requests()[2].body.clone().unwrap();
    assert_eq!(body["limit"], 1);
    assert!(
        body.get("filter").is_none() && body.get("tags").is_none(),
        "an empty category is no filter"
    );
    assert!(
        m.search(search_req("editor", 0, None))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(fake.requests().len(), 3, "top_k 0 sends nothing");

    fake.clear();
    assert!(
        m.search(search_req("   ", 5, None))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(fake.requests().is_empty(), "blank query sends nothing");
    fake.assert_clean();
}

#[tokio::test]
async fn blank_search_is_empty_even_for_another_user() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&fake, dir.path(), json!({}));
    let req = SearchRequest {
        query: " ".into(),
        top_k: 5,
        scope: MemoryScope::user(UserId::new("bob").unwrap()),
        category: None,
        mode: None,
    };
    assert!(m.search(req).await.unwrap().is_empty());
}

#[tokio::test]
async fn warm_probes_health_without_the_actor_header() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&fake, dir.path(), json!({}));
    assert_eq!(m.warm().await, Some(true));
    let reqs = fake.requests();
    assert_eq!(reqs[0].line(), "GET /health");
    assert_eq!(reqs[0].header("x-openviking-actor-peer"), None);
    assert_eq!(reqs[0].header("x-api-key"), Some(support::API_KEY));

    fake.state.unhealthy.store(true, Ordering::SeqCst);
    let e = m.startup_check().await.unwrap_err();
    assert!(e.to_string().contains("unhealthy response"), "{e}");
    assert_eq!(m.warm().await, Some(false));
    let warn = manager(&fake, dir.path(), json!({"startup_policy": "warn"}));
    assert!(!warn.startup_check().await.unwrap());
    assert_eq!(warn.warm().await, Some(false));

    fake.state.unhealthy.store(false, Ordering::SeqCst);
    fake.state.unavailable_reads.store(1, Ordering::SeqCst);
    fake.clear();
    assert_eq!(m.warm().await, Some(true), "health is a read: retried once");
    assert_eq!(fake.requests().len(), 2);

    m.close().await;
    fake.clear();
    assert_eq!(m.warm().await, Some(false));
    assert!(fake.requests().is_empty());
    fake.assert_clean();
}

#[tokio::test]
async fn capabilities_and_unsupported_operations() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&fake, dir.path(), json!({}));
    assert!(m.searcher().is_some());
    assert!(!m.allows_tool_mode());
    assert!(!m.passive_writes_in_tool_mode());
    assert!(m.reader().is_none() && m.admin().is_none());
    assert!(m.reloader().is_none() && m.facts().is_none());
    assert_eq!(m.mode(), MemoryMode::Middleware);
    assert_eq!(m.name(), BACKEND_NAME);
    let scope = alice(None);
    let errors = [
        ("get memory", m.get_memory(scope.clone()).await.unwrap_err()),
        (
            "reload memory",
            m.reload_memory(scope.clone()).await.unwrap_err(),
        ),
        (
            "clear memory",
            m.clear_memory(scope.clone()).await.unwrap_err(),
        ),
        (
            "export memory",
            m.export_memory(scope.clone()).await.unwrap_err(),
        ),
        (
            "delete memory",
            m.delete_memory(scope.clone()).await.unwrap_err(),
        ),
        (
            "create fact",
            m.create_fact(NewFact::new("x"), scope.clone())
                .await
                .unwrap_err(),
        ),
        (
            "delete fact",
            m.delete_fact("f", None, scope.clone()).await.unwrap_err(),
        ),
    ];
    for (label, e) in errors {
        assert!(matches!(e, ManagerError::Unsupported { .. }), "{e}");
        assert_eq!(
            e.to_string(),
            format!("{label} not supported by OpenVikingMemoryManager")
        );
    }
    assert!(fake.requests().is_empty());
}

#[tokio::test]
async fn tool_mode_is_refused_at_construction() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = json!({"owner_user_id": "alice"});
    let e = OpenVikingManager::from_backend_config(
        cfg.as_object().unwrap(),
        MemoryMode::Tool,
        dir.path().to_path_buf(),
        support::clock(),
        &support::env,
    )
    .unwrap_err();
    assert!(e.to_string().contains("middleware"), "{e}");
    let e = OpenVikingManager::new(
        OpenVikingConfig::new("alice", "k"),
        MemoryMode::Tool,
        dir.path().to_path_buf(),
        support::clock(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("MCP"), "{e}");
}

#[tokio::test]
async fn construction_rejects_bad_config_and_sends_nothing() {
    let dir = tempfile::tempdir().unwrap();
    for (cfg, needle) in [
        (
            json!({"owner_user_id": "a", "auth_mode": "trusted"}),
            "trusted mode",
        ),
        (
            json!({"owner_user_id": "a", "max_connections": 5}),
            "custom HTTP client fields",
        ),
        (
            json!({"owner_user_id": "a", "retreival": {}}),
            "Unknown OpenViking backend_config fields: retreival",
        ),
        (
            json!({"owner_user_id": "a", "base_url": "http://ov.example.com"}),
            "allow_insecure_http",
        ),
        (json!({}), "owner_user_id"),
    ] {
        let e = OpenVikingManager::from_backend_config(
            cfg.as_object().unwrap(),
            MemoryMode::Middleware,
            dir.path().to_path_buf(),
            support::clock(),
            &support::env,
        )
        .unwrap_err();
        assert!(e.to_string().contains(needle), "{cfg}: {e}");
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[tokio::test]
async fn cursors_live_under_the_storage_root_the_host_resolved() {
    // The host (the facade) resolves `storage_path` into the storage root it passes; applying
    // a relative `storage_path` again would nest it (`ov-data/ov-data/...`), and an absolute one
    // would override the CLI's `--storage-path`.
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let want = dir.path().join("openviking").join("sessions");
    for extra in [
        json!({}),
        json!({"storage_path": "ov-data"}),
        json!({"storage_path": "/somewhere/else"}),
    ] {
        let m = manager(&fake, dir.path(), extra.clone());
        assert_eq!(m.cursor_dir(), want, "{extra}");
    }
    let m = manager(&fake, dir.path(), json!({"storage_path": "ov-data"}));
    m.add(deermem_core::ports::AddRequest {
        thread_id: "t".into(),
        messages: vec![deermem_core::Message::human("hello")],
        scope: alice(None),
        trace_id: None,
    })
    .await
    .unwrap();
    assert!(m.shutdown_flush(std::time::Duration::from_secs(30)).await);
    let files: Vec<_> = std::fs::read_dir(&want).unwrap().flatten().collect();
    assert_eq!(files.len(), 1, "one cursor file under the storage root");
    assert!(!dir.path().join("ov-data").exists());
    fake.assert_clean();
}

#[tokio::test]
async fn secrets_never_appear_in_debug_or_errors() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = manager(
        &fake,
        dir.path(),
        json!({"failure_policy": {"read": "raise"}}),
    );
    let dbg = format!("{m:?} {:?}", m.config());
    assert!(!dbg.contains(support::API_KEY), "{dbg}");
    assert!(dbg.contains("alice"));
    fake.state.failing_retrievals.store(1, Ordering::SeqCst);
    let e = m.get_context(ctx(None, None)).await.unwrap_err();
    assert!(!format!("{e} {e:?}").contains(support::API_KEY));
    // A server that rejects the key: the error names the code, not the key.
    let mut cfg = serde_json::Map::new();
    cfg.insert("base_url".into(), json!(fake.url()));
    cfg.insert("owner_user_id".into(), json!("alice"));
    cfg.insert("failure_policy".into(), json!({"read": "raise"}));
    let wrong_env = |_: &str| Some("wrong-key-123".to_owned());
    let wrong = OpenVikingManager::from_backend_config(
        &cfg,
        MemoryMode::Middleware,
        dir.path().to_path_buf(),
        support::clock(),
        &wrong_env,
    )
    .unwrap();
    let e = wrong.get_context(ctx(None, None)).await.unwrap_err();
    assert!(e.to_string().contains("UNAUTHENTICATED"), "{e}");
    assert!(!format!("{e} {e:?} {wrong:?}").contains("wrong-key-123"));
}
