//! The backend against a real OpenViking 0.5.2 server (`openviking==0.5.2` from PyPI, installed
//! once per machine into a cached virtual environment; see `testserver`), in `api_key` mode with
//! a USER key made through the admin API, its models pointed at a stub in this process: the
//! `MemoryManager` contract suite, then capture → commit → the server's extraction → recall and
//! search, with the reference's target uris refused as the server refuses them.
//!
//! When the server cannot be installed (no Python 3.10+, no package index) the test fails with
//! what is missing. Everything it starts stops when it ends.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use deermem_core::ports::MemoryManagerExt as _;
use std::sync::Arc;
use std::time::Duration;

use deermem_backend_openviking::OpenVikingManager;
use deermem_backend_openviking::client::{OpenVikingClient, RetrievalRequest};
use deermem_backend_openviking::testserver::{ModelStub, OvServer};
use deermem_core::ports::{AddRequest, ContextRequest, MemoryManager, MemoryScope, SearchRequest};
use deermem_core::{MemoryMode, Message, UserId};
use deermem_testkit::manager::{self, ManagerFixture};
use serde_json::{Value, json};

/// The OpenViking user the key belongs to.
const OV_USER: &str = "deermem-rs";
/// How long the server's background extraction may take.
const EXTRACTION: Duration = Duration::from_secs(120);

fn manager_for(
    server: &OvServer,
    key: &str,
    owner: &str,
    extra: Value,
) -> (OpenVikingManager, tempfile::TempDir) {
    let root = tempfile::tempdir().unwrap();
    let mut cfg = json!({"base_url": server.url(), "owner_user_id": owner,
                         "api_key_env": "OV_REAL_KEY"});
    if let (Value::Object(c), Value::Object(e)) = (&mut cfg, extra) {
        c.extend(e);
    }
    let key = key.to_owned();
    let env = move |name: &str| (name == "OV_REAL_KEY").then(|| key.clone());
    let m = OpenVikingManager::from_backend_config(
        cfg.as_object().unwrap(),
        MemoryMode::Middleware,
        root.path().to_path_buf(),
        support::clock(),
        &env,
    )
    .unwrap();
    (m, root)
}

fn fixture(server: &OvServer, key: &str, owner: &str) -> ManagerFixture {
    let (m, root) = manager_for(server, key, owner, json!({}));
    ManagerFixture {
        manager: Arc::new(m),
        guard: Box::new(root),
    }
}

async fn contract_suite(server: &OvServer, key: &str) {
    let f = |owner: &str| fixture(server, key, owner);
    manager::capabilities_match_behaviour(f("cap-user")).await;
    manager::add_is_accepted_and_flush_succeeds(f("add-user")).await;
    manager::context_for_unknown_user_is_ok(f("nobody-here")).await;
    manager::blank_search_is_empty(f("blank-user")).await;
    manager::warm_reports(f("default")).await;
    // The behaviours of the other abilities are not run: OpenViking has only search, which
    // this checks against the backend itself.
    manager::declared_abilities_are_the_backends(f("cap-user"), &["searcher"]).await;
}

fn conversation() -> Vec<Message> {
    serde_json::from_value(json!([
        {"type": "system", "content": "You are DeerFlow."},
        {"type": "human", "id": "h1", "content": "Remember that I use Vim as my editor."},
        {"type": "ai", "id": "a1", "content": "", "tool_calls": [
            {"name": "web_search", "args": {"q": "vim cheat sheet"}, "id": "call-1", "type": "tool_call"}]},
        {"type": "tool", "id": "t1", "content": "Vim cheat sheet: :wq saves and quits.",
         "name": "web_search", "tool_call_id": "call-1", "status": "success"},
        {"type": "ai", "id": "a2", "content": "Noted: you use Vim. :wq saves and quits."}
    ]))
    .unwrap()
}

#[test]
fn real_server_contract_and_capture_commit_recall() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let stub = ModelStub::start().await.unwrap();
        let server = OvServer::start(&stub.base_url())
            .await
            .unwrap_or_else(|e| panic!("the real OpenViking server is needed: {e}"));
        let key = server.create_user("deermem", OV_USER).await.unwrap();
        stub.remember(
            "I use Vim",
            &format!(
                r#"sdk.create_preferences(user="""{OV_USER}""", topic="""editor""", content="""- Uses Vim as the code editor.""")"#
            ),
        );

        contract_suite(&server, &key).await;

        // The reference's target uris: the server refuses them for a USER key.
        let client = OpenVikingClient::new(
            &server.url(),
            deermem_core::config::ConfigSecret::new(&key),
            Duration::from_secs(30),
        )
        .unwrap();
        let e = client
            .retrieve(
                "deerflow",
                &RetrievalRequest {
                    query: "editor".into(),
                    target_uri: vec![
                        "viking://user/memories".into(),
                        "viking://user/peers/deerflow/memories".into(),
                    ],
                    session_id: None,
                    limit: 8,
                    score_threshold: None,
                    filter: None,
                    tags: None,
                },
            )
            .await
            .unwrap_err();
        assert_eq!((e.code.as_str(), e.status), ("INVALID_URI", Some(400)), "{e}");

        // Capture → commit → extraction → recall, with both failure policies raising.
        let (m, _root) = manager_for(
            &server,
            &key,
            "alice",
            json!({"failure_policy": {"read": "raise", "write": "raise"}}),
        );
        assert!(m.startup_check().await.unwrap());
        let alice = MemoryScope::user(UserId::new("alice").unwrap());
        let req = AddRequest {
            thread_id: "thread-real-1".into(),
            messages: conversation(),
            scope: alice.clone(),
            trace_id: None,
        };
        let report = m.capture(req.clone()).await.unwrap();
        assert_eq!((report.sent, report.committed), (4, true), "the system message is not sent");
        let sid = m.session_for(&req).unwrap().1;
        assert_eq!(
            server.session_counts(&key, "deerflow", &sid).await.unwrap(),
            Some((0, 4)),
            "four messages, committed"
        );
        let again = m.capture(req).await.unwrap();
        assert_eq!(again.sent, 0, "nothing new");
        server
            .wait_for_memory(&key, "Uses Vim", EXTRACTION)
            .await
            .unwrap_or_else(|e| panic!("{e}"));

        let context = m
            .get_context(ContextRequest {
                scope: alice.clone(),
                thread_id: None,
            })
            .await
            .unwrap();
        assert!(
            context.contains("- [preferences] - Uses Vim as the code editor."),
            "{context}"
        );
        assert!(
            !context.contains("Overview") && !context.contains("](./"),
            "no directory summaries: {context}"
        );
        let with_thread = m
            .get_context(ContextRequest {
                scope: alice.clone(),
                thread_id: Some("thread-real-1".into()),
            })
            .await
            .unwrap();
        assert!(with_thread.contains("Uses Vim"), "{with_thread}");

        let search = |category: Option<&str>| SearchRequest {
            query: "vim editor".into(),
            top_k: 10,
            scope: alice.clone(),
            category: category.map(str::to_owned), mode: None,
        };
        let all = m.search(search(None)).await.unwrap();
        let editor = format!("viking://user/{OV_USER}/memories/preferences/{OV_USER}/editor.md");
        assert!(all.iter().any(|f| f.id == editor), "{all:?}");
        assert!(
            all.iter().all(|f| !f.id.contains("/.")),
            "no directory entries: {all:?}"
        );
        let prefs = m.search(search(Some("preferences"))).await.unwrap();
        assert!(prefs.iter().any(|f| f.id == editor), "{prefs:?}");
        assert!(prefs.iter().all(|f| f.category == "preferences"), "{prefs:?}");
        let events = m.search(search(Some("events"))).await.unwrap();
        assert!(events.is_empty(), "{events:?}");
        assert_eq!(m.last_backend_failure(), None);
        assert!(m.shutdown_flush(Duration::from_secs(30)).await);
        assert!(stub.chat_calls() > 0, "the extractor asked the stub");
        drop(server);
    });
}
