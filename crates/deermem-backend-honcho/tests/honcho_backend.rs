//! Behaviour of the Honcho backend against a fake Honcho v3 server on 127.0.0.1: the exact
//! request sequences, the cursor (only new messages, batches of 100, restarts), reads under
//! both failure policies, identity and percent-encoding, and secret hygiene.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use deermem_core::ports::MemoryManagerExt as _;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deermem_backend_honcho::fake::{self, FakeHoncho};
use deermem_backend_honcho::{BACKEND_NAME, HonchoManager, from_backend_config};
use deermem_core::PublicMemoryDocument;
use deermem_core::config::MemoryMode;
use deermem_core::error::ManagerError;
use deermem_core::ids::UserId;
use deermem_core::message::Message;
use deermem_core::ports::{
    AddRequest, ContextRequest, FactPatch, MemoryManager, MemoryScope, NewFact, SearchRequest,
};
use deermem_testkit::clock::ManualClock;
use serde_json::{Value, json};

const USER: &str = "bob@example.com";
const WS: &str = "deerflow-u-bob-example-com-5ff860bf";
const PEER: &str = "bob-example-com-5ff860bf";
const FLUSH: Duration = Duration::from_secs(30);

fn build(fake: &FakeHoncho, extra: Value, root: &Path, mode: MemoryMode) -> HonchoManager {
    let mut bc = json!({"base_url": fake.url});
    if let (Some(b), Some(e)) = (bc.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            b.insert(k.clone(), v.clone());
        }
    }
    from_backend_config(
        bc.as_object().unwrap(),
        mode,
        root.to_path_buf(),
        Arc::new(ManualClock::at("2026-01-02T03:04:05Z")),
    )
    .unwrap()
}

fn manager(fake: &FakeHoncho, extra: Value, root: &Path) -> HonchoManager {
    build(fake, extra, root, MemoryMode::Middleware)
}

fn scope(user: &str) -> MemoryScope {
    MemoryScope::user(UserId::new(user).unwrap())
}

fn human(id: &str, text: &str) -> Message {
    let mut m = Message::human(text);
    m.id = Some(id.into());
    m
}

fn ai(id: &str, text: &str) -> Message {
    let mut m = Message::ai(text);
    m.id = Some(id.into());
    m
}

/// `n` question/answer turns.
fn transcript(turns: usize) -> Vec<Message> {
    (0..turns)
        .flat_map(|i| {
            [
                human(&format!("h{i}"), &format!("question {i}")),
                ai(&format!("a{i}"), &format!("answer {i}")),
            ]
        })
        .collect()
}

fn add_req(thread: &str, messages: Vec<Message>, user: Option<&str>) -> AddRequest {
    AddRequest {
        thread_id: thread.into(),
        messages,
        scope: MemoryScope::new(user.map(|u| UserId::new(u).unwrap()), None),
        trace_id: Some("trace-1".into()),
    }
}

async fn add_and_flush(m: &HonchoManager, thread: &str, messages: Vec<Message>) {
    m.add(add_req(thread, messages, Some(USER))).await.unwrap();
    assert!(
        m.shutdown_flush(FLUSH).await,
        "the capture queue must drain"
    );
}

fn ctx(user: Option<&str>) -> ContextRequest {
    ContextRequest {
        scope: MemoryScope::new(user.map(|u| UserId::new(u).unwrap()), None),
        thread_id: None,
    }
}

fn search_req(query: &str, top_k: usize, category: Option<&str>) -> SearchRequest {
    SearchRequest {
        query: query.into(),
        top_k,
        scope: scope(USER),
        category: category.map(str::to_owned),
        mode: None,
    }
}

fn messages_body(pairs: &[(&str, &str)]) -> Value {
    json!({"messages": pairs.iter().map(|(p, c)| json!({"peer_id": p, "content": c})).collect::<Vec<_>>()})
}

#[tokio::test]
async fn first_turn_sends_setup_then_one_filtered_batch() {
    let fake = FakeHoncho::start().await;
    let root = tempfile::tempdir().unwrap();
    let m = manager(
        &fake,
        json!({"api_key": "sk-test", "allow_insecure_http": true, "message_char_limit": 20}),
        root.path(),
    );
    let tool_call: Message = serde_json::from_value(json!({"type": "ai", "content": "", "tool_calls": [{"name": "search", "args": {}, "id": "c1"}]})).unwrap();
    let blocks: Message = serde_json::from_value(json!({"type": "ai", "content": [{"type": "text", "text": "part A"}, {"type": "text", "text": "part B"}]})).unwrap();
    let msgs = vec![
        Message::system("you are helpful"),
        Message::human("hello there, this is a long question"),
        tool_call,
        Message::tool("tool result"),
        blocks,
    ];
    add_and_flush(&m, "thread.1", msgs).await;

    let s = "df-thread-1-6b74530e";
    assert_eq!(
        fake.calls(),
        vec![
            (format!("/v3/workspaces/{WS}/peers"), json!({"id": PEER})),
            (
                format!("/v3/workspaces/{WS}/peers"),
                json!({"id": "deerflow"})
            ),
            (format!("/v3/workspaces/{WS}/sessions"), json!({"id": s})),
            (
                format!("/v3/workspaces/{WS}/sessions/{s}/peers"),
                json!({PEER: {}, "deerflow": {}})
            ),
            (
                format!("/v3/workspaces/{WS}/sessions/{s}/messages"),
                messages_body(&[
                    (PEER, "hello there, this is"),
                    ("deerflow", "part A\npart B")
                ])
            ),
        ]
    );
    for r in fake.requests() {
        assert_eq!(r.method, "POST");
        assert_eq!(r.authorization.as_deref(), Some("Bearer sk-test"));
        assert_eq!(r.content_type.as_deref(), Some("application/json"));
        assert!(r.status == 200 || r.status == 201, "{r:?}");
    }
}

#[tokio::test]
async fn second_turn_sends_only_the_new_messages() {
    let fake = FakeHoncho::start().await;
    let root = tempfile::tempdir().unwrap();
    let m = manager(&fake, json!({}), root.path());
    add_and_flush(&m, "t1", transcript(1)).await;
    assert_eq!(fake.requests().len(), 5);
    fake.clear_requests();

    add_and_flush(&m, "t1", transcript(2)).await;
    let s = "df-t1-628b49d9";
    assert_eq!(
        fake.calls(),
        vec![(
            format!("/v3/workspaces/{WS}/sessions/{s}/messages"),
            messages_body(&[(PEER, "question 1"), ("deerflow", "answer 1")])
        )]
    );
    fake.clear_requests();

    // The same transcript again: nothing new, no request at all.
    add_and_flush(&m, "t1", transcript(2)).await;
    assert!(fake.requests().is_empty(), "{:?}", fake.calls());
    assert_eq!(fake.messages().len(), 4, "Honcho holds no duplicates");
}

#[tokio::test]
async fn a_250_message_thread_goes_out_in_batches_of_100_100_50() {
    let fake = FakeHoncho::start().await;
    let root = tempfile::tempdir().unwrap();
    let m = manager(&fake, json!({}), root.path());
    let msgs = transcript(125);
    add_and_flush(&m, "long", msgs).await;
    let reqs = fake.requests();
    let batches: Vec<&fake::Recorded> = reqs
        .iter()
        .filter(|r| r.raw_path.ends_with("/messages"))
        .collect();
    assert_eq!(reqs.len(), 4 + 3);
    assert!(reqs[..4].iter().all(|r| !r.raw_path.ends_with("/messages")));
    let sizes: Vec<usize> = batches
        .iter()
        .map(|r| r.body["messages"].as_array().unwrap().len())
        .collect();
    assert_eq!(sizes, vec![100, 100, 50]);
    assert!(batches.iter().all(|r| r.status == 201));
    let stored: Vec<String> = fake.messages().into_iter().map(|m| m.content).collect();
    let expected: Vec<String> = (0..125)
        .flat_map(|i| [format!("question {i}"), format!("answer {i}")])
        .collect();
    assert_eq!(stored, expected, "order is kept across batches");

    // One more turn: only the two new messages.
    fake.clear_requests();
    add_and_flush(&m, "long", transcript(126)).await;
    assert_eq!(fake.requests().len(), 1);
    assert_eq!(
        fake.requests()[0].body,
        messages_body(&[(PEER, "question 125"), ("deerflow", "answer 125")])
    );
}

#[tokio::test]
async fn the_cursor_survives_a_restart() {
    let fake = FakeHoncho::start().await;
    let root = tempfile::tempdir().unwrap();
    {
        let m = manager(&fake, json!({}), root.path());
        add_and_flush(&m, "t", transcript(3)).await;
        m.close().await;
    }
    assert_eq!(fake.messages().len(), 6);
    fake.clear_requests();

    let m = manager(&fake, json!({}), root.path());
    add_and_flush(&m, "t", transcript(3)).await;
    assert!(fake.requests().is_empty(), "a restart sends nothing old");
    add_and_flush(&m, "t", transcript(4)).await;
    assert_eq!(fake.requests().len(), 1, "{:?}", fake.calls());
    assert_eq!(
        fake.requests()[0].body,
        messages_body(&[(PEER, "question 3"), ("deerflow", "answer 3")])
    );
    assert_eq!(fake.messages().len(), 8);
}

#[tokio::test]
async fn the_cursor_holds_hashes_only() {
    let fake = FakeHoncho::start().await;
    let root = tempfile::tempdir().unwrap();
    let m = manager(&fake, json!({}), root.path());
    add_and_flush(
        &m,
        "t",
        vec![
            human("h", "my secret diary entry"),
            ai("a", "noted, private reply"),
        ],
    )
    .await;
    let dir = root.path().join("honcho").join("cursors");
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1);
    let text = std::fs::read_to_string(&files[0]).unwrap();
    assert!(
        !text.contains("diary") && !text.contains("private"),
        "{text}"
    );
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["prefix_count"], 2);
    assert_eq!(v["recent"].as_array().unwrap().len(), 2);
    assert_eq!(v["session_peers"], json!([PEER, "deerflow"]));
}

#[tokio::test]
async fn a_corrupt_cursor_fails_closed_without_requests() {
    let fake = FakeHoncho::start().await;
    let root = tempfile::tempdir().unwrap();
    let m = manager(&fake, json!({}), root.path());
    add_and_flush(&m, "t", transcript(1)).await;
    let dir = root.path().join("honcho").join("cursors");
    let file = std::fs::read_dir(&dir)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    std::fs::write(&file, b"{not json").unwrap();
    fake.clear_requests();
    add_and_flush(&m, "t", transcript(2)).await;
    assert!(fake.requests().is_empty());
    assert_eq!(
        std::fs::read(&file).unwrap(),
        b"{not json",
        "the file is left for repair"
    );
}

#[tokio::test]
async fn write_failures_do_not_advance_the_cursor() {
    let fake = FakeHoncho::start().await;
    let root = tempfile::tempdir().unwrap();
    let m = manager(&fake, json!({}), root.path());
    fake.fail(500, usize::MAX);
    add_and_flush(&m, "t", transcript(1)).await;
    let failure = m
        .last_backend_failure()
        .expect("a failed capture is kept for the status");
    assert_eq!((failure.operation.as_str(), failure.count), ("capture", 1));
    let reqs = fake.requests();
    assert_eq!(
        reqs.len(),
        3,
        "the first write is tried 3 times, then dropped"
    );
    assert!(
        reqs.iter()
            .all(|r| r.status == 500 && r.raw_path.ends_with("/peers"))
    );

    fake.fail(0, 0);
    fake.clear_requests();
    add_and_flush(&m, "t", transcript(1)).await;
    assert_eq!(fake.requests().len(), 5, "setup and the whole batch again");
    assert_eq!(fake.messages().len(), 2);
}

#[tokio::test]
async fn a_failed_middle_batch_resends_only_what_was_not_accepted() {
    let fake = FakeHoncho::start().await;
    let root = tempfile::tempdir().unwrap();
    let m = manager(&fake, json!({}), root.path());
    add_and_flush(&m, "t", transcript(1)).await;
    fake.clear_requests();
    // Next turn has 150 new messages; the first batch passes, the second fails 3 times.
    let msgs = transcript(76);
    fake.fail_messages_after(1, 503, 3);
    add_and_flush(&m, "t", msgs.clone()).await;
    assert_eq!(fake.messages().len(), 102);
    fake.clear_requests();
    add_and_flush(&m, "t", msgs).await;
    assert_eq!(fake.requests().len(), 1);
    assert_eq!(
        fake.requests()[0].body["messages"]
            .as_array()
            .unwrap()
            .len(),
        50
    );
    assert_eq!(fake.messages().len(), 152);
}

#[tokio::test]
async fn an_invalid_batch_is_skipped_so_memory_keeps_growing() {
    let fake = FakeHoncho::start().await;
    let root = tempfile::tempdir().unwrap();
    let m = manager(&fake, json!({}), root.path());
    fake.reject_next_messages(422);
    add_and_flush(&m, "t", transcript(1)).await;
    assert_eq!(fake.messages().len(), 0);
    assert_eq!(
        m.last_backend_failure().map(|f| f.operation),
        Some("capture".to_owned()),
        "a rejected batch is a failure the status shows"
    );
    fake.clear_requests();
    add_and_flush(&m, "t", transcript(2)).await;
    assert_eq!(fake.requests().len(), 1);
    assert_eq!(
        fake.requests()[0].body,
        messages_body(&[(PEER, "question 1"), ("deerflow", "answer 1")])
    );
}

#[tokio::test]
async fn a_lost_session_is_set_up_again() {
    let fake = FakeHoncho::start().await;
    let root = tempfile::tempdir().unwrap();
    let m = manager(&fake, json!({}), root.path());
    add_and_flush(&m, "t", transcript(1)).await;
    fake.forget_sessions();
    fake.clear_requests();
    add_and_flush(&m, "t", transcript(2)).await;
    let paths: Vec<(String, u16)> = fake
        .requests()
        .into_iter()
        .map(|r| (r.raw_path.rsplit('/').next().unwrap().to_owned(), r.status))
        .collect();
    assert_eq!(
        paths,
        vec![
            ("messages".into(), 404),
            ("peers".into(), 200),
            ("peers".into(), 200),
            ("sessions".into(), 201),
            ("peers".into(), 200),
            ("messages".into(), 201),
        ]
    );
    assert_eq!(fake.messages().len(), 4);
}

#[tokio::test]
async fn oversized_messages_are_cut_to_the_server_limit() {
    let fake = FakeHoncho::start().await;
    let root = tempfile::tempdir().unwrap();
    let m = manager(&fake, json!({"message_char_limit": 30000}), root.path());
    let big = "語".repeat(30_000);
    add_and_flush(&m, "t", vec![human("h", &big), ai("a", "ok")]).await;
    let stored = fake.messages();
    assert_eq!(stored.len(), 2);
    assert_eq!(stored[0].content.chars().count(), 25_000);
}

#[tokio::test]
async fn a_missing_user_sends_nothing_anywhere() {
    let fake = FakeHoncho::start().await;
    let root = tempfile::tempdir().unwrap();
    let m = manager(
        &fake,
        json!({"failure_policy": {"read": "fail_closed"}}),
        root.path(),
    );
    m.add(add_req("t", transcript(2), None)).await.unwrap();
    assert!(m.shutdown_flush(FLUSH).await);
    assert_eq!(m.get_context(ctx(None)).await.unwrap(), "");
    let hits = m
        .search(SearchRequest {
            query: "q".into(),
            top_k: 5,
            scope: MemoryScope::default(),
            category: None,
            mode: None,
        })
        .await
        .unwrap();
    assert!(hits.is_empty());
    let doc = m.get_memory(MemoryScope::default()).await.unwrap();
    assert!(doc.facts.is_empty());
    assert_eq!(doc.user.work_context.summary, "");
    assert_eq!(doc.last_updated, "2026-01-02T03:04:05Z");
    assert!(fake.requests().is_empty());
    assert!(!root.path().join("honcho").exists(), "no cursor either");
}

#[tokio::test]
async fn get_context_truncates_on_a_character_boundary() {
    let fake = FakeHoncho::start().await;
    let root = tempfile::tempdir().unwrap();
    let m = manager(&fake, json!({"max_injection_chars": 5}), root.path());
    fake.set_representation(WS, PEER, "  \n日本語のメモリー表現です\n ");
    let text = m.get_context(ctx(Some(USER))).await.unwrap();
    assert_eq!(text, "日本語のメ");
    assert_eq!(
        fake.calls(),
        vec![(
            format!("/v3/workspaces/{WS}/peers/{PEER}/representation"),
            json!({"max_conclusions": 25})
        )]
    );
    let block = m.get_context_block(ctx(Some(USER))).await.unwrap();
    assert_eq!(block.block, "<memory>\n日本語のメ\n</memory>\n");
}

#[tokio::test]
async fn get_context_tolerates_odd_representation_bodies() {
    let fake = FakeHoncho::start().await;
    let root = tempfile::tempdir().unwrap();
    let m = manager(&fake, json!({}), root.path());
    for (body, expected) in [
        (json!({"representation": null}), ""),
        (json!([1, 2]), ""),
        (json!({"other": "x"}), ""),
        (json!({"representation": 42}), "42"),
    ] {
        fake.set_raw_representation(body);
        assert_eq!(m.get_context(ctx(Some(USER))).await.unwrap(), expected);
    }
}

#[tokio::test]
async fn get_memory_maps_the_representation_into_the_public_shape() {
    let fake = FakeHoncho::start().await;
    let root = tempfile::tempdir().unwrap();
    let m = manager(&fake, json!({"max_injection_chars": 12}), root.path());
    fake.set_representation(WS, PEER, "## Explicit Observations\n- likes tea");
    let doc: PublicMemoryDocument = m.get_memory(scope(USER)).await.unwrap();
    assert_eq!(doc.user.work_context.summary, "## Explicit ");
    assert_eq!(doc.user.work_context.updated_at, "2026-01-02T03:04:05Z");
    assert_eq!(doc.last_updated, "2026-01-02T03:04:05Z");
    assert!(doc.facts.is_empty());
    assert_eq!(doc.user.top_of_mind.summary, "");
    // Even an empty representation fills workContext's timestamp (reference shape).
    fake.set_representation(WS, PEER, "");
    let doc = m.get_memory(scope(USER)).await.unwrap();
    assert_eq!(doc.user.work_context.summary, "");
    assert_eq!(doc.user.work_context.updated_at, "2026-01-02T03:04:05Z");
}

#[tokio::test]
async fn search_is_workspace_scoped_and_mapped() {
    let fake = FakeHoncho::start().await;
    let root = tempfile::tempdir().unwrap();
    let m = manager(&fake, json!({}), root.path());
    add_and_flush(
        &m,
        "t",
        vec![human("h", "I drink green tea"), ai("a", "Tea noted")],
    )
    .await;
    fake.clear_requests();
    let hits = m.search(search_req("tea", 3, None)).await.unwrap();
    assert_eq!(
        fake.calls(),
        vec![(
            format!("/v3/workspaces/{WS}/search"),
            json!({"query": "tea", "limit": 3})
        )]
    );
    let got: Vec<(&str, &str, &str)> = hits
        .iter()
        .map(|f| (f.content.as_str(), f.category.as_str(), f.source.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("I drink green tea", "memory", "df-t-e3b98a4d"),
            ("Tea noted", "memory", "df-t-e3b98a4d")
        ]
    );
    let hits = m
        .search(search_req("tea", 1, Some("preference")))
        .await
        .unwrap();
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].category, "preference");

    fake.clear_requests();
    m.search(search_req("tea", 500, None)).await.unwrap();
    assert_eq!(
        fake.requests()[0].body["limit"],
        100,
        "clamped to Honcho's maximum"
    );
    fake.clear_requests();
    assert!(
        m.search(search_req("tea", 0, None))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        m.search(search_req(" \n\t", 5, None))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        fake.requests().is_empty(),
        "blank queries and top_k 0 send nothing"
    );
}

/// Honcho ranks on its server: `hybrid` (or no mode) is its ranking; `bm25` and `vector` are
/// refused with a typed error and send nothing.
#[tokio::test]
async fn search_modes_other_than_hybrid_are_refused_without_a_request() {
    let fake = FakeHoncho::start().await;
    let root = tempfile::tempdir().unwrap();
    let m = manager(&fake, json!({}), root.path());
    add_and_flush(&m, "t", vec![human("h", "I drink green tea")]).await;
    fake.clear_requests();
    for mode in [
        deermem_core::SearchMode::Bm25,
        deermem_core::SearchMode::Vector,
    ] {
        let req = SearchRequest {
            mode: Some(mode),
            ..search_req("tea", 3, None)
        };
        match m.search(req).await.unwrap_err() {
            ManagerError::InvalidInput { message, .. } => assert_eq!(
                message,
                format!(
                    "search mode {} is not available with the honcho backend: the remote server ranks results itself (use hybrid or leave mode unset)",
                    mode.as_str()
                )
            ),
            other => panic!("{mode:?}: {other:?}"),
        }
    }
    assert!(fake.requests().is_empty());
    let req = SearchRequest {
        mode: Some(deermem_core::SearchMode::Hybrid),
        ..search_req("tea", 3, None)
    };
    let hits = m.search_scored(req).await.unwrap();
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].fact.content, "I drink green tea");
    assert_eq!(fake.requests().len(), 1);
}

#[tokio::test]
async fn reads_fail_open_by_default_on_server_errors() {
    let fake = FakeHoncho::start().await;
    let root = tempfile::tempdir().unwrap();
    let m = manager(&fake, json!({}), root.path());
    assert_eq!(m.last_backend_failure(), None);
    fake.fail(500, usize::MAX);
    assert_eq!(m.get_context(ctx(Some(USER))).await.unwrap(), "");
    let recall = m
        .last_backend_failure()
        .expect("a failed read is kept for the status");
    assert_eq!((recall.operation.as_str(), recall.count), ("recall", 1));
    assert!(recall.message.contains("500"), "{}", recall.message);
    assert!(m.search(search_req("x", 5, None)).await.unwrap().is_empty());
    let search = m.last_backend_failure().unwrap();
    assert_eq!((search.operation.as_str(), search.count), ("search", 2));
    let doc = m.get_memory(scope(USER)).await.unwrap();
    assert_eq!(doc.user.work_context.summary, "");
    assert_eq!(doc.user.work_context.updated_at, "");
    assert_eq!(doc.last_updated, "2026-01-02T03:04:05Z");
    assert_eq!(fake.requests().len(), 3, "reads are not retried");
}

#[tokio::test]
async fn reads_fail_closed_when_configured() {
    let fake = FakeHoncho::start().await;
    let root = tempfile::tempdir().unwrap();
    let m = manager(
        &fake,
        json!({"failure_policy": {"read": "fail_closed"}}),
        root.path(),
    );
    fake.fail(500, usize::MAX);
    let e = m.get_context(ctx(Some(USER))).await.unwrap_err();
    assert!(matches!(e, ManagerError::Unavailable { .. }), "{e:?}");
    assert!(e.to_string().contains("honcho memory recall failed"), "{e}");
    assert!(matches!(
        m.search(search_req("x", 5, None)).await,
        Err(ManagerError::Unavailable { .. })
    ));
    assert!(matches!(
        m.get_memory(scope(USER)).await,
        Err(ManagerError::Unavailable { .. })
    ));
}

#[tokio::test]
async fn timeouts_follow_the_failure_policy() {
    let fake = FakeHoncho::start().await;
    let root = tempfile::tempdir().unwrap();
    fake.delay(Duration::from_secs(3));
    let open = manager(&fake, json!({"timeout_seconds": 0.2}), root.path());
    assert_eq!(open.get_context(ctx(Some(USER))).await.unwrap(), "");
    assert!(
        open.search(search_req("x", 5, None))
            .await
            .unwrap()
            .is_empty()
    );
    let closed = manager(
        &fake,
        json!({"timeout_seconds": 0.2, "failure_policy": {"read": "fail_closed"}}),
        root.path(),
    );
    let e = closed.get_context(ctx(Some(USER))).await.unwrap_err();
    assert!(matches!(e, ManagerError::Timeout { .. }), "{e:?}");
    assert!(matches!(
        closed.search(search_req("x", 5, None)).await,
        Err(ManagerError::Timeout { .. })
    ));
}

#[tokio::test]
async fn non_json_and_empty_success_bodies() {
    // A server answering HTML with 200 is an invalid response; an empty 200 reads as "".
    use axum::Router;
    use axum::routing::post;
    let app = Router::new()
        .route(
            "/html/v3/workspaces/{w}/peers/{p}/representation",
            post(|| async { "<html>proxy</html>" }),
        )
        .route(
            "/empty/v3/workspaces/{w}/peers/{p}/representation",
            post(|| async { "" }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let root = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::at("2026-01-01T00:00:00Z"));
    let mk = |prefix: &str, policy: &str| {
        from_backend_config(
            json!({"base_url": format!("http://{addr}/{prefix}"), "failure_policy": {"read": policy}})
                .as_object()
                .unwrap(),
            MemoryMode::Middleware,
            root.path().to_path_buf(),
            clock.clone(),
        )
        .unwrap()
    };
    let e = mk("html", "fail_closed")
        .get_context(ctx(Some(USER)))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("invalid response"), "{e}");
    assert_eq!(
        mk("html", "fail_open")
            .get_context(ctx(Some(USER)))
            .await
            .unwrap(),
        ""
    );
    assert_eq!(
        mk("empty", "fail_closed")
            .get_context(ctx(Some(USER)))
            .await
            .unwrap(),
        ""
    );
}

#[tokio::test]
async fn overrides_pick_the_workspace_and_user_peer() {
    let fake = FakeHoncho::start().await;
    let root = tempfile::tempdir().unwrap();
    let m = manager(
        &fake,
        json!({"workspace_overrides": {USER: "team-ws"}, "user_peer_overrides": {USER: "bobby"}, "assistant_peer": "helper"}),
        root.path(),
    );
    add_and_flush(&m, "t", transcript(1)).await;
    let calls = fake.calls();
    assert_eq!(
        calls[0],
        (
            "/v3/workspaces/team-ws/peers".into(),
            json!({"id": "bobby"})
        )
    );
    assert_eq!(
        calls[1],
        (
            "/v3/workspaces/team-ws/peers".into(),
            json!({"id": "helper"})
        )
    );
    assert_eq!(calls[3].1, json!({"bobby": {}, "helper": {}}));
    assert_eq!(
        calls[4].1,
        messages_body(&[("bobby", "question 0"), ("helper", "answer 0")])
    );
    // A user without an override gets the derived identity.
    fake.clear_requests();
    m.get_context(ctx(Some("carol"))).await.unwrap();
    assert_eq!(
        fake.requests()[0].raw_path,
        "/v3/workspaces/deerflow-u-carol-4c26d907/peers/carol-4c26d907/representation"
    );
}

#[tokio::test]
async fn the_same_peer_for_user_and_assistant_is_added_once() {
    let fake = FakeHoncho::start().await;
    let root = tempfile::tempdir().unwrap();
    let m = manager(
        &fake,
        json!({"user_peer_overrides": {USER: "deerflow"}}),
        root.path(),
    );
    add_and_flush(&m, "t", transcript(1)).await;
    let calls = fake.calls();
    assert_eq!(calls.len(), 4);
    assert_eq!(calls[2].1, json!({"deerflow": {}}));
}

#[tokio::test]
async fn hostile_ids_are_percent_encoded_or_refused() {
    let fake = FakeHoncho::start().await;
    let root = tempfile::tempdir().unwrap();
    let m = manager(
        &fake,
        json!({"workspace_overrides": {USER: "team ws?x/../y"}, "user_peer_overrides": {USER: "alice/b"}}),
        root.path(),
    );
    m.get_context(ctx(Some(USER))).await.unwrap();
    let r = &fake.requests()[0];
    assert_eq!(
        r.raw_path,
        "/v3/workspaces/team%20ws%3Fx%2F..%2Fy/peers/alice%2Fb/representation"
    );
    assert_eq!(r.segments[1], "team ws?x/../y");
    assert_eq!(r.segments[3], "alice/b");

    // Honcho rejects the peer id in the body (422); the capture is dropped, nothing else sent.
    fake.clear_requests();
    add_and_flush(&m, "../../etc/passwd\0", transcript(1)).await;
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(
        reqs[0].raw_path,
        "/v3/workspaces/team%20ws%3Fx%2F..%2Fy/peers"
    );
    assert_eq!(reqs[0].status, 422);

    // Ids a URL parser would swallow as dot-segments are never sent.
    fake.clear_requests();
    let dots = manager(
        &fake,
        json!({"workspace_overrides": {USER: ".."}, "failure_policy": {"read": "fail_closed"}}),
        root.path(),
    );
    assert!(matches!(
        dots.get_context(ctx(Some(USER))).await,
        Err(ManagerError::Unavailable { .. })
    ));
    add_and_flush(&dots, "t", transcript(1)).await;
    assert!(fake.requests().is_empty());
}

#[tokio::test]
async fn hostile_thread_ids_map_to_safe_sessions_and_cursor_files() {
    let fake = FakeHoncho::start().await;
    let root = tempfile::tempdir().unwrap();
    let m = manager(&fake, json!({}), root.path());
    let thread = format!("../../{}\0/x", "z".repeat(1_000_000));
    add_and_flush(&m, &thread, transcript(1)).await;
    let sessions: Vec<Value> = fake
        .requests()
        .into_iter()
        .filter(|r| r.raw_path.ends_with("/sessions"))
        .map(|r| r.body)
        .collect();
    let sid = sessions[0]["id"].as_str().unwrap().to_owned();
    assert!(sid.starts_with("df-z") && sid.len() <= 60, "{sid}");
    assert_eq!(fake.messages().len(), 2);
    let cursor_dir = root.path().join("honcho").join("cursors");
    for entry in walk(root.path()) {
        assert!(
            entry.starts_with(&cursor_dir),
            "{entry:?} escaped the cursor folder"
        );
    }
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[tokio::test]
async fn add_returns_before_http_and_shutdown_flush_reports_the_drain() {
    let fake = FakeHoncho::start().await;
    let root = tempfile::tempdir().unwrap();
    let m = manager(&fake, json!({}), root.path());
    assert!(m.shutdown_flush(Duration::ZERO).await, "idle: true at once");
    fake.delay(Duration::from_secs(1));
    m.add(add_req("t", transcript(1), Some(USER)))
        .await
        .unwrap();
    assert_eq!(m.pending_captures(), 1, "queued, not sent inline");
    assert!(!m.shutdown_flush(Duration::ZERO).await, "not drained yet");
    assert!(m.shutdown_flush(FLUSH).await);
    assert_eq!(m.pending_captures(), 0);
    assert_eq!(fake.messages().len(), 2);

    // After close, captures are ignored without error.
    m.close().await;
    m.close().await;
    fake.delay(Duration::ZERO);
    fake.clear_requests();
    m.add(add_req("t", transcript(2), Some(USER)))
        .await
        .unwrap();
    assert!(m.shutdown_flush(FLUSH).await);
    assert!(fake.requests().is_empty());
}

#[tokio::test]
async fn add_nowait_uses_the_same_cursor() {
    let fake = FakeHoncho::start().await;
    let root = tempfile::tempdir().unwrap();
    let m = manager(&fake, json!({}), root.path());
    add_and_flush(&m, "t", transcript(2)).await;
    fake.clear_requests();
    // The summarisation hook hands over messages already captured: nothing is resent.
    m.add_nowait(add_req("t", transcript(2)[..2].to_vec(), Some(USER)))
        .await
        .unwrap();
    assert!(m.shutdown_flush(FLUSH).await);
    assert!(fake.requests().is_empty(), "{:?}", fake.calls());
}

#[tokio::test]
async fn compacted_transcripts_send_only_unseen_messages() {
    let fake = FakeHoncho::start().await;
    let root = tempfile::tempdir().unwrap();
    let m = manager(&fake, json!({}), root.path());
    add_and_flush(&m, "t", transcript(5)).await;
    fake.clear_requests();
    // The host summarised the first four turns away and a new turn arrived.
    let mut compacted = transcript(6)[8..].to_vec();
    compacted.insert(0, Message::system("summary of earlier turns"));
    add_and_flush(&m, "t", compacted).await;
    assert_eq!(fake.requests().len(), 1);
    assert_eq!(
        fake.requests()[0].body,
        messages_body(&[(PEER, "question 5"), ("deerflow", "answer 5")])
    );
}

#[tokio::test]
async fn unsupported_operations_say_so_with_reference_labels() {
    let fake = FakeHoncho::start().await;
    let root = tempfile::tempdir().unwrap();
    let m = manager(&fake, json!({}), root.path());
    let s = || scope(USER);
    let label = |e: ManagerError| match e {
        ManagerError::Unsupported { operation, backend } => {
            assert_eq!(backend, BACKEND_NAME);
            operation
        }
        other => panic!("expected Unsupported, got {other:?}"),
    };
    assert_eq!(
        label(m.create_fact(NewFact::new("x"), s()).await.unwrap_err()),
        "create fact"
    );
    assert_eq!(
        label(
            m.update_fact("f", FactPatch::default(), s())
                .await
                .unwrap_err()
        ),
        "update fact"
    );
    assert_eq!(
        label(m.delete_fact("f", None, s()).await.unwrap_err()),
        "delete fact"
    );
    assert_eq!(
        label(m.clear_memory(s()).await.unwrap_err()),
        "clear memory"
    );
    assert_eq!(
        label(
            m.import_memory(PublicMemoryDocument::empty(), s())
                .await
                .unwrap_err()
        ),
        "import memory"
    );
    assert_eq!(
        label(m.reload_memory(s()).await.unwrap_err()),
        "reload memory"
    );
    assert_eq!(
        label(m.export_memory(s()).await.unwrap_err()),
        "export memory"
    );
    assert_eq!(
        label(m.delete_memory(s()).await.unwrap_err()),
        "delete memory"
    );
    assert!(m.warm().await.is_none());
    assert!(fake.requests().is_empty());
}

#[tokio::test]
async fn capabilities_and_tool_mode() {
    let fake = FakeHoncho::start().await;
    let root = tempfile::tempdir().unwrap();
    let m = build(&fake, json!({}), root.path(), MemoryMode::Tool);
    assert_eq!(m.mode(), MemoryMode::Tool);
    assert_eq!(m.name(), "HonchoMemoryManager");
    assert!(m.searcher().is_some() && m.reader().is_some());
    assert!(m.allows_tool_mode() && m.passive_writes_in_tool_mode());
    assert!(m.admin().is_none() && m.reloader().is_none() && m.facts().is_none());
    // Passive writes keep working in tool mode.
    add_and_flush(&m, "t", transcript(1)).await;
    assert_eq!(fake.messages().len(), 2);
}

#[tokio::test]
async fn from_backend_config_reports_bad_keys() {
    let root = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::at("2026-01-01T00:00:00Z"));
    for (bc, key) in [
        (
            json!({"timeout_seconds": 0}),
            "memory.backend_config.timeout_seconds",
        ),
        (
            json!({"api_key": "k", "base_url": "http://h"}),
            "memory.backend_config.api_key",
        ),
        (
            json!({"workspace_overrides": {"u": " "}}),
            "memory.backend_config.workspace_overrides",
        ),
    ] {
        let e = from_backend_config(
            bc.as_object().unwrap(),
            MemoryMode::Middleware,
            root.path().to_path_buf(),
            clock.clone(),
        )
        .unwrap_err();
        assert!(matches!(e, ManagerError::InvalidInput { .. }), "{e:?}");
        assert!(e.to_string().contains(key), "{e}");
    }
}

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn secrets_never_reach_debug_output_errors_or_logs() {
    // Log capture races with other test threads over tracing's call-site cache.
    if !deermem_testkit::isolation::run_alone("secrets_never_reach_debug_output_errors_or_logs") {
        return;
    }
    const KEY: &str = "sk-honcho-SECRET-42";
    let captured = Captured::default();
    let sink = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || sink.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let fake = FakeHoncho::start().await;
        let root = tempfile::tempdir().unwrap();
        let m = manager(
            &fake,
            json!({"api_key": KEY, "allow_insecure_http": true, "failure_policy": {"read": "fail_closed"}}),
            root.path(),
        );
        assert!(!format!("{m:?}").contains(KEY));
        assert!(!format!("{:?}", m.config()).contains(KEY));
        add_and_flush(&m, "t", transcript(1)).await;
        fake.fail(500, usize::MAX);
        let e = m.get_context(ctx(Some(USER))).await.unwrap_err();
        assert!(!e.to_string().contains(KEY) && !format!("{e:?}").contains(KEY));
        add_and_flush(&m, "t", transcript(2)).await;
        assert!(fake
            .requests()
            .iter()
            .all(|r| r.authorization.as_deref() == Some(&format!("Bearer {KEY}"))));
    });
    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(
        logs.contains("honcho capture sent"),
        "logging must be on: {logs}"
    );
    assert!(logs.contains("honcho request"), "{logs}");
    assert!(!logs.contains(KEY), "the key leaked into the logs:\n{logs}");
    assert!(
        !logs.contains("question 0"),
        "message text must not be logged:\n{logs}"
    );
}

#[tokio::test]
async fn no_key_means_no_authorization_header() {
    let fake = FakeHoncho::start().await;
    let root = tempfile::tempdir().unwrap();
    let m = manager(&fake, json!({}), root.path());
    m.get_context(ctx(Some(USER))).await.unwrap();
    assert!(fake.requests()[0].authorization.is_none());
}
