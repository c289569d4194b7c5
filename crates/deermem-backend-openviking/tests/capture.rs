//! Capture-path contract tests against the fake OpenViking server: request sequences, batching,
//! commits and their retry, the hash-only cursor, failure policies and the owner rule.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use deermem_core::ports::MemoryManagerExt as _;
use std::time::Duration;

use deermem_backend_openviking::OpenVikingManager;
use deermem_core::ports::{AddRequest, MemoryManager, MemoryScope};
use deermem_core::{AgentName, InvalidInputCode, ManagerError, Message, UserId};
use serde_json::{Value, json};
use support::{FakeOv, manager};

const WAIT: Duration = Duration::from_secs(30);

fn scope(user: &str, agent: Option<&str>) -> MemoryScope {
    MemoryScope::new(
        Some(UserId::new(user).unwrap()),
        agent.map(|a| AgentName::parse(a).unwrap()),
    )
}

fn add_req(thread: &str, messages: Vec<Message>, agent: Option<&str>) -> AddRequest {
    AddRequest {
        thread_id: thread.into(),
        messages,
        scope: scope("alice", agent),
        trace_id: Some("trace-1".into()),
    }
}

fn transcript(n: usize) -> Vec<Message> {
    (0..n)
        .map(|i| {
            if i % 2 == 0 {
                Message::human(format!("user says secret-phrase-{i}"))
            } else {
                Message::ai(format!("assistant answers secret-phrase-{i}"))
            }
        })
        .collect()
}

fn payload_texts(batch_body: &Value) -> Vec<String> {
    batch_body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["parts"][0]["text"].as_str().unwrap_or("").to_owned())
        .collect()
}

fn cursor_json(m: &OpenVikingManager, sid: &str) -> Value {
    let text = std::fs::read_to_string(m.cursor_dir().join(format!("{sid}.json"))).unwrap();
    serde_json::from_str(&text).unwrap()
}

async fn add_and_wait(m: &OpenVikingManager, req: AddRequest) {
    m.add(req).await.unwrap();
    assert!(m.wait_idle(WAIT).await, "capture did not finish");
}

const RESEARCH_SID: &str = "df_37a681a43a6b7c1cea6b092d50b00150bb780f0c09bec010";

#[tokio::test]
async fn first_and_later_turns_send_only_the_new_suffix_then_commit() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&fake, dir.path(), json!({}));

    let turn1 = transcript(2);
    add_and_wait(&m, add_req("thread-1", turn1.clone(), Some("Research"))).await;
    let batch = format!("POST /api/v1/sessions/{RESEARCH_SID}/messages/batch");
    let commit = format!("POST /api/v1/sessions/{RESEARCH_SID}/commit");
    assert_eq!(fake.lines(), vec![batch.clone(), commit.clone()]);
    let reqs = fake.requests();
    assert_eq!(
        reqs[0].body.as_ref().unwrap(),
        &json!({"messages": [
            {"role": "user", "parts": [{"type": "text", "text": "user says secret-phrase-0"}], "peer_id": "research"},
            {"role": "assistant", "parts": [{"type": "text", "text": "assistant answers secret-phrase-1"}], "peer_id": "research"}
        ]})
    );
    for r in &reqs {
        assert_eq!(r.header("x-openviking-actor-peer"), Some("research"));
        assert_eq!(r.header("x-api-key"), Some(support::API_KEY));
        assert_eq!(r.header("authorization"), None);
    }
    assert_eq!(
        reqs[1].body.as_ref().unwrap(),
        &json!({"keep_recent_count": 0, "telemetry": false})
    );

    // Later turn: the full transcript again, with two new messages.
    fake.clear();
    let turn2 = transcript(4);
    add_and_wait(&m, add_req("thread-1", turn2.clone(), Some("research"))).await;
    assert_eq!(fake.lines(), vec![batch.clone(), commit.clone()]);
    assert_eq!(
        payload_texts(fake.requests()[0].body.as_ref().unwrap()),
        vec![
            "user says secret-phrase-2",
            "assistant answers secret-phrase-3"
        ]
    );

    // Same transcript again: nothing is sent.
    fake.clear();
    add_and_wait(&m, add_req("thread-1", turn2, Some("Research"))).await;
    assert!(fake.lines().is_empty(), "{:?}", fake.lines());
    assert_eq!(fake.session_messages(RESEARCH_SID).len(), 4);
    assert_eq!(fake.session_commits(RESEARCH_SID), 2);
    assert_eq!(m.live_session_locks(), 0, "session locks are released");
    let stats = m.stats();
    assert_eq!((stats.completed, stats.failed, stats.in_flight), (3, 0, 0));
    assert!(stats.last_success_at.is_some());
    fake.assert_clean();
}

#[tokio::test]
async fn default_agent_uses_default_peer_and_reference_session() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = serde_json::Map::new();
    cfg.insert("base_url".into(), Value::String(fake.url()));
    cfg.insert("owner_user_id".into(), json!("default"));
    let m = OpenVikingManager::from_backend_config(
        &cfg,
        deermem_core::MemoryMode::Middleware,
        dir.path().to_path_buf(),
        support::clock(),
        &support::env,
    )
    .unwrap();
    let req = AddRequest {
        thread_id: "thread-1".into(),
        messages: transcript(1),
        scope: MemoryScope::default(),
        trace_id: None,
    };
    add_and_wait(&m, req).await;
    let reqs = fake.requests();
    assert_eq!(
        reqs[0].path,
        "/api/v1/sessions/df_1d19d462a04e2873521cb087a47161fb2a19888176ef828a/messages/batch"
    );
    assert_eq!(reqs[0].header("x-openviking-actor-peer"), Some("deerflow"));
    assert_eq!(
        reqs[0].body.as_ref().unwrap()["messages"][0]["peer_id"],
        "deerflow"
    );
    fake.assert_clean();
}

#[tokio::test]
async fn a_250_message_thread_goes_in_batches_of_100_100_50_then_one_commit() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&fake, dir.path(), json!({"max_seen_message_ids": 16}));
    add_and_wait(&m, add_req("t-250", transcript(250), None)).await;
    let reqs = fake.requests();
    let sizes: Vec<usize> = reqs
        .iter()
        .filter(|r| r.path.ends_with("/messages/batch"))
        .map(|r| {
            r.body.as_ref().unwrap()["messages"]
                .as_array()
                .unwrap()
                .len()
        })
        .collect();
    assert_eq!(sizes, vec![100, 100, 50]);
    assert!(reqs[3].path.ends_with("/commit"));
    assert_eq!(reqs.len(), 4);
    let sid = m.session_for(&add_req("t-250", vec![], None)).unwrap().1;
    let texts: Vec<String> = fake
        .session_messages(&sid)
        .iter()
        .map(|p| p["parts"][0]["text"].as_str().unwrap().to_owned())
        .collect();
    let want: Vec<String> = transcript(250).iter().map(Message::text).collect();
    assert_eq!(texts, want, "order preserved across batches");
    let cursor = cursor_json(&m, &sid);
    assert_eq!(cursor["submitted_signatures"].as_array().unwrap().len(), 16);
    assert_eq!(cursor["submitted_prefix_count"], 250);
    fake.assert_clean();
}

#[tokio::test]
async fn a_failed_later_batch_keeps_confirmed_progress_and_resends_only_the_rest() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = manager(
        &fake,
        dir.path(),
        json!({"failure_policy": {"write": "raise"}}),
    );
    *fake.state.fail_batch_number.lock().unwrap() = Some(2);
    let err = m
        .capture(add_req("t-partial", transcript(250), None))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("partially recorded 100 of 250"),
        "{err}"
    );
    assert_eq!(
        fake.lines().len(),
        2,
        "no commit after a failed batch, no retry"
    );
    let sid = m
        .session_for(&add_req("t-partial", vec![], None))
        .unwrap()
        .1;
    let cursor = cursor_json(&m, &sid);
    assert_eq!(cursor["submitted_prefix_count"], 100);
    assert_eq!(cursor["commit_pending"], false);

    fake.clear();
    m.capture(add_req("t-partial", transcript(250), None))
        .await
        .unwrap();
    let sizes: Vec<usize> = fake
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/messages/batch"))
        .map(|r| {
            r.body.as_ref().unwrap()["messages"]
                .as_array()
                .unwrap()
                .len()
        })
        .collect();
    assert_eq!(sizes, vec![100, 50]);
    assert_eq!(
        fake.session_messages(&sid).len(),
        250,
        "nothing resubmitted"
    );
    assert_eq!(fake.session_commits(&sid), 1);
    assert_eq!(cursor_json(&m, &sid)["submitted_prefix_count"], 250);
    fake.assert_clean();
}

#[tokio::test]
async fn a_failed_first_batch_leaves_the_cursor_untouched_and_is_never_retried() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&fake, dir.path(), json!({}));
    fake.state
        .unavailable_writes
        .store(1, std::sync::atomic::Ordering::SeqCst);
    // log_and_drop: the error is logged, not returned.
    m.capture(add_req("t-fail", transcript(2), None))
        .await
        .unwrap();
    assert_eq!(
        fake.lines().len(),
        1,
        "a write is sent once, even when UNAVAILABLE"
    );
    let sid = m.session_for(&add_req("t-fail", vec![], None)).unwrap().1;
    assert!(
        !m.cursor_dir().join(format!("{sid}.json")).exists(),
        "cursor not advanced"
    );
    assert_eq!(m.stats().failed, 1);
    fake.clear();
    m.capture(add_req("t-fail", transcript(2), None))
        .await
        .unwrap();
    assert_eq!(
        payload_texts(fake.requests()[0].body.as_ref().unwrap()).len(),
        2,
        "the same messages are resubmitted"
    );
    fake.assert_clean();
}

#[tokio::test]
async fn a_failed_commit_is_retried_on_the_next_capture_only_with_pending_tokens() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&fake, dir.path(), json!({}));
    let sid = m.session_for(&add_req("t-commit", vec![], None)).unwrap().1;
    fake.state
        .commit_html_500
        .store(1, std::sync::atomic::Ordering::SeqCst);
    m.capture(add_req("t-commit", transcript(2), None))
        .await
        .unwrap();
    let cursor = cursor_json(&m, &sid);
    assert_eq!(cursor["commit_pending"], true);
    assert_eq!(cursor["submitted_prefix_count"], 2);

    // Next capture with nothing new: GET session (pending > 0) then commit; no batch.
    fake.clear();
    m.capture(add_req("t-commit", transcript(2), None))
        .await
        .unwrap();
    assert_eq!(
        fake.lines(),
        vec![
            format!("GET /api/v1/sessions/{sid}"),
            format!("POST /api/v1/sessions/{sid}/commit"),
        ]
    );
    assert_eq!(fake.requests()[0].query, None);
    assert_eq!(
        fake.requests()[0].header("x-openviking-actor-peer"),
        Some("deerflow")
    );
    assert_eq!(cursor_json(&m, &sid)["commit_pending"], false);
    assert_eq!(fake.session_messages(&sid).len(), 2, "nothing resubmitted");

    // Commit fails again; this time the server reports no pending tokens: no commit.
    fake.state
        .commit_html_500
        .store(1, std::sync::atomic::Ordering::SeqCst);
    m.capture(add_req("t-commit", transcript(4), None))
        .await
        .unwrap();
    assert_eq!(cursor_json(&m, &sid)["commit_pending"], true);
    fake.state
        .report_zero_pending
        .store(true, std::sync::atomic::Ordering::SeqCst);
    fake.clear();
    m.capture(add_req("t-commit", transcript(6), None))
        .await
        .unwrap();
    assert_eq!(
        fake.lines(),
        vec![
            format!("GET /api/v1/sessions/{sid}"),
            format!("POST /api/v1/sessions/{sid}/messages/batch"),
            format!("POST /api/v1/sessions/{sid}/commit"),
        ],
        "no commit for the retry, then the new suffix with its own commit"
    );
    assert_eq!(
        payload_texts(fake.requests()[1].body.as_ref().unwrap()).len(),
        2
    );
    fake.assert_clean();
}

#[tokio::test]
async fn a_pending_commit_on_a_missing_session_means_nothing_is_pending() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&fake, dir.path(), json!({}));
    let sid = m.session_for(&add_req("t-gone", vec![], None)).unwrap().1;
    std::fs::create_dir_all(m.cursor_dir()).unwrap();
    std::fs::write(
        m.cursor_dir().join(format!("{sid}.json")),
        r#"{"schema_version": 1, "submitted_signatures": [], "commit_pending": true,
            "submitted_prefix_count": 0, "submitted_prefix_digest": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"}"#,
    )
    .unwrap();
    m.capture(add_req("t-gone", vec![], None)).await.unwrap();
    assert_eq!(fake.lines(), vec![format!("GET /api/v1/sessions/{sid}")]);
    assert_eq!(cursor_json(&m, &sid)["commit_pending"], false);
}

#[tokio::test]
async fn a_failed_commit_retry_sends_nothing_new_and_follows_the_write_policy() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = manager(
        &fake,
        dir.path(),
        json!({"failure_policy": {"write": "raise"}}),
    );
    let sid = m.session_for(&add_req("t-r", vec![], None)).unwrap().1;
    fake.state
        .commit_html_500
        .store(1, std::sync::atomic::Ordering::SeqCst);
    let e = m
        .capture(add_req("t-r", transcript(2), None))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("HTTP 500"), "{e}");
    fake.state
        .commit_html_500
        .store(1, std::sync::atomic::Ordering::SeqCst);
    fake.clear();
    let e = m
        .capture(add_req("t-r", transcript(4), None))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("pending commit retry failed"), "{e}");
    assert_eq!(
        fake.lines(),
        vec![
            format!("GET /api/v1/sessions/{sid}"),
            format!("POST /api/v1/sessions/{sid}/commit"),
        ],
        "the new messages wait until the commit went through"
    );
    assert_eq!(cursor_json(&m, &sid)["commit_pending"], true);
}

#[tokio::test]
async fn another_user_is_refused_before_any_file_or_network_access() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = manager(
        &fake,
        dir.path(),
        json!({"failure_policy": {"read": "fail_open", "write": "log_and_drop"}}),
    );
    let bob = |thread: &str| AddRequest {
        thread_id: thread.into(),
        messages: transcript(2),
        scope: scope("bob", None),
        trace_id: None,
    };
    for e in [
        m.add(bob("t")).await.unwrap_err(),
        m.add_nowait(bob("t")).await.unwrap_err(),
        m.capture(bob("t")).await.unwrap_err(),
        m.get_context(deermem_core::ports::ContextRequest {
            scope: scope("bob", None),
            thread_id: Some("t".into()),
        })
        .await
        .unwrap_err(),
        m.search(deermem_core::ports::SearchRequest {
            query: "vim".into(),
            top_k: 5,
            scope: scope("bob", Some("research")),
            category: None,
            mode: None,
        })
        .await
        .unwrap_err(),
    ] {
        assert!(
            matches!(
                e,
                ManagerError::InvalidInput {
                    code: InvalidInputCode::UserId,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("owner_user_id 'alice'"), "{e}");
        assert!(e.to_string().contains("'bob'"), "{e}");
    }
    // A missing user is `default`, which is not the owner either.
    let anon = AddRequest {
        thread_id: "t".into(),
        messages: transcript(1),
        scope: MemoryScope::default(),
        trace_id: None,
    };
    assert!(m.add(anon).await.is_err());
    assert!(m.wait_idle(WAIT).await);
    assert!(fake.requests().is_empty(), "{:?}", fake.lines());
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "no file written"
    );
}

#[tokio::test]
async fn invalid_write_requests_are_rejected_synchronously() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&fake, dir.path(), json!({}));
    let e = m.add(add_req("", transcript(1), None)).await.unwrap_err();
    assert!(e.to_string().contains("requires thread_id"), "{e}");
    let e = m
        .add(AddRequest {
            scope: MemoryScope::new(
                Some(UserId::new("alice").unwrap()),
                Some(AgentName::default_bucket()),
            ),
            ..add_req("t", transcript(1), None)
        })
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("Invalid OpenViking peer scope"),
        "{e}"
    );
    assert!(fake.requests().is_empty());
}

#[tokio::test]
async fn cursor_files_hold_hashes_only_and_stay_bounded() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&fake, dir.path(), json!({"max_seen_message_ids": 16}));
    let mut msgs = transcript(40);
    msgs.push(
        serde_json::from_value(json!({"type": "ai", "content": "", "tool_calls": [
        {"name": "web_search", "args": {"q": "secret-phrase-tool"}, "id": "call-1"}]}))
        .unwrap(),
    );
    add_and_wait(&m, add_req("t-hash", msgs.clone(), None)).await;
    let mut files = Vec::new();
    for entry in walk(dir.path()) {
        let text = std::fs::read_to_string(&entry).unwrap();
        assert!(
            !text.contains("secret-phrase"),
            "message text on disk in {entry:?}"
        );
        assert!(
            !text.contains("web_search"),
            "tool data on disk in {entry:?}"
        );
        files.push(entry);
    }
    assert_eq!(files.len(), 1, "{files:?}");
    let cursor: Value = serde_json::from_str(&std::fs::read_to_string(&files[0]).unwrap()).unwrap();
    let keys: Vec<&str> = cursor
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        vec![
            "schema_version",
            "submitted_signatures",
            "commit_pending",
            "submitted_prefix_count",
            "submitted_prefix_digest"
        ]
    );
    let sigs = cursor["submitted_signatures"].as_array().unwrap();
    assert_eq!(sigs.len(), 16);
    assert!(sigs.iter().all(|s| {
        let s = s.as_str().unwrap();
        s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
    }));
    assert_eq!(cursor["submitted_prefix_count"], 41);
    fake.assert_clean();
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
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
async fn the_cursor_survives_a_restart() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    {
        let m = manager(&fake, dir.path(), json!({}));
        add_and_wait(&m, add_req("t-restart", transcript(6), Some("research"))).await;
        assert!(m.shutdown_flush(WAIT).await);
    }
    fake.clear();
    let m2 = manager(&fake, dir.path(), json!({}));
    add_and_wait(&m2, add_req("t-restart", transcript(6), Some("research"))).await;
    assert!(fake.requests().is_empty(), "{:?}", fake.lines());
    add_and_wait(&m2, add_req("t-restart", transcript(7), Some("research"))).await;
    assert_eq!(
        payload_texts(fake.requests()[0].body.as_ref().unwrap()),
        vec!["user says secret-phrase-6"]
    );
    fake.assert_clean();
}

#[tokio::test]
async fn compacted_history_rebases_without_replaying_known_messages() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&fake, dir.path(), json!({"max_seen_message_ids": 16}));
    let all = transcript(21);
    add_and_wait(&m, add_req("t-compact", all[..20].to_vec(), None)).await;
    fake.clear();
    let mut compacted = all[12..20].to_vec();
    compacted.push(all[20].clone());
    add_and_wait(&m, add_req("t-compact", compacted, None)).await;
    assert_eq!(
        payload_texts(fake.requests()[0].body.as_ref().unwrap()),
        vec!["user says secret-phrase-20"]
    );
    fake.assert_clean();
}

#[tokio::test]
async fn a_corrupt_cursor_fails_closed_with_no_request() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&fake, dir.path(), json!({}));
    let sid = m.session_for(&add_req("t-bad", vec![], None)).unwrap().1;
    std::fs::create_dir_all(m.cursor_dir()).unwrap();
    let path = m.cursor_dir().join(format!("{sid}.json"));
    std::fs::write(&path, "{not json").unwrap();
    // Even under log_and_drop, a corrupt cursor is an error.
    let e = m
        .capture(add_req("t-bad", transcript(2), None))
        .await
        .unwrap_err();
    assert!(matches!(e, ManagerError::Corruption { .. }), "{e}");
    assert!(e.to_string().contains("refusing unsafe replay"), "{e}");
    // Through the queue: the next add reports it.
    m.add(add_req("t-bad", transcript(2), None)).await.unwrap();
    assert!(m.wait_idle(WAIT).await);
    let e = m
        .add(add_req("t-other", transcript(1), None))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("refusing unsafe replay"), "{e}");
    assert!(m.wait_idle(WAIT).await);
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "{not json",
        "left for repair"
    );
    assert!(
        fake.lines().iter().all(|l| !l.contains(&sid)),
        "nothing sent for the corrupt session: {:?}",
        fake.lines()
    );
}

#[tokio::test]
async fn queued_write_failures_follow_the_write_policy() {
    let fake = FakeOv::start().await;
    // raise: the next add reports the failure, shutdown_flush reports it too.
    let dir = tempfile::tempdir().unwrap();
    let m = manager(
        &fake,
        dir.path(),
        json!({"failure_policy": {"write": "raise"}}),
    );
    fake.state
        .unavailable_writes
        .store(1, std::sync::atomic::Ordering::SeqCst);
    m.add(add_req("t-w", transcript(2), None)).await.unwrap();
    assert!(m.wait_idle(WAIT).await);
    let e = m
        .add(add_req("t-w2", transcript(2), None))
        .await
        .unwrap_err();
    assert!(matches!(e, ManagerError::Unavailable { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("recording failed; capture cursor was not advanced"),
        "{e}"
    );
    assert!(m.wait_idle(WAIT).await);
    fake.state
        .unavailable_writes
        .store(1, std::sync::atomic::Ordering::SeqCst);
    m.add(add_req("t-w3", transcript(2), None)).await.unwrap();
    // A failed capture is not a timeout: the flush drained in time (hosts log "did not finish
    // in time" only for `false`), and the failure is kept as the last backend failure.
    assert!(
        m.shutdown_flush(WAIT).await,
        "a drained queue is a clean flush"
    );
    let f = m.last_backend_failure().unwrap();
    assert_eq!((f.operation.as_str(), f.count), ("capture", 2));
    assert!(f.message.contains("[UNAVAILABLE] busy"), "{}", f.message);

    // log_and_drop: nothing is reported.
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&fake, dir.path(), json!({}));
    fake.state
        .unavailable_writes
        .store(1, std::sync::atomic::Ordering::SeqCst);
    m.add(add_req("t-w", transcript(2), None)).await.unwrap();
    assert!(m.wait_idle(WAIT).await);
    m.add(add_req("t-w", transcript(2), None)).await.unwrap();
    assert!(m.shutdown_flush(WAIT).await);
    assert_eq!(m.stats().failed, 1);
    assert_eq!(m.stats().completed, 1);
}

#[tokio::test]
async fn hidden_messages_are_dropped_and_tool_history_is_kept() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&fake, dir.path(), json!({}));
    let msgs: Vec<Message> = serde_json::from_value(json!([
        {"type": "system", "content": "You are DeerFlow."},
        {"type": "human", "content": "<memory>old</memory>", "additional_kwargs": {"hide_from_ui": true}},
        {"type": "human", "content": "find vim docs"},
        {"type": "ai", "content": "", "tool_calls": [{"name": "web_search", "args": {"q": "vim"}, "id": "call-1", "type": "tool_call"}]},
        {"type": "tool", "content": "search output", "name": "web_search", "additional_kwargs": {"tool_call_id": "call-1"}},
        {"type": "ai", "content": "Here you go."},
        {"type": "human", "content": "summary", "additional_kwargs": {"lc_source": "summarization"}}
    ]))
    .unwrap();
    add_and_wait(&m, add_req("t-hidden", msgs, None)).await;
    let body = fake.requests()[0].body.clone().unwrap();
    assert_eq!(
        body["messages"],
        json!([
            {"role": "user", "parts": [{"type": "text", "text": "find vim docs"}], "peer_id": "deerflow"},
            {"role": "assistant", "parts": [{"type": "tool", "tool_id": "call-1", "tool_name": "web_search", "tool_input": {"q": "vim"}, "tool_status": "pending"}], "peer_id": "deerflow"},
            {"role": "assistant", "parts": [{"type": "tool", "tool_id": "call-1", "tool_name": "web_search", "tool_output": "search output", "tool_status": "completed"}], "peer_id": "deerflow"},
            {"role": "assistant", "parts": [{"type": "text", "text": "Here you go."}], "peer_id": "deerflow"}
        ])
    );
    fake.assert_clean();
}

#[tokio::test]
async fn only_unrecordable_messages_send_nothing_but_advance_the_cursor() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&fake, dir.path(), json!({}));
    add_and_wait(
        &m,
        add_req("t-sys", vec![Message::system("s"), Message::ai("")], None),
    )
    .await;
    assert!(fake.requests().is_empty());
    let sid = m.session_for(&add_req("t-sys", vec![], None)).unwrap().1;
    assert_eq!(cursor_json(&m, &sid)["submitted_prefix_count"], 2);
}

#[tokio::test]
async fn add_returns_before_the_server_answers_and_shutdown_respects_its_budget() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&fake, dir.path(), json!({}));
    fake.close_gate();
    tokio::time::timeout(WAIT, m.add(add_req("t-gate", transcript(2), None)))
        .await
        .expect("add must not wait for HTTP")
        .unwrap();
    fake.state.batch_arrived.notified().await;
    assert_eq!(m.stats().in_flight, 1);
    assert!(
        !m.shutdown_flush(Duration::ZERO).await,
        "a write is still running"
    );
    // Closed: new writes are ignored, reads return nothing, warm is false.
    m.add(add_req("t-late", transcript(2), None)).await.unwrap();
    assert_eq!(
        m.get_context(deermem_core::ports::ContextRequest {
            scope: scope("alice", None),
            thread_id: None
        })
        .await
        .unwrap(),
        ""
    );
    assert_eq!(m.warm().await, Some(false));
    fake.open_gate();
    assert!(
        m.shutdown_flush(WAIT).await,
        "drained once the write finished"
    );
    assert!(m.shutdown_flush(Duration::ZERO).await, "idempotent");
    let lines = fake.lines();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines
            .iter()
            .all(|l| !l.contains("search") && !l.contains("health"))
    );
    let late_sid = m.session_for(&add_req("t-late", vec![], None)).unwrap().1;
    assert!(lines.iter().all(|l| !l.contains(&late_sid)));
    m.close().await;
    m.close().await;
}

#[tokio::test]
async fn a_full_queue_drops_captures_without_failing_the_caller() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&fake, dir.path(), json!({}));
    m.set_queue_capacity(1);
    fake.close_gate();
    for i in 0..4 {
        m.add(add_req(&format!("t-q{i}"), transcript(2), None))
            .await
            .unwrap();
    }
    assert!(m.stats().dropped >= 2, "{:?}", m.stats());
    fake.open_gate();
    assert!(m.shutdown_flush(WAIT).await);
}

#[tokio::test]
async fn session_locks_are_weak() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&fake, dir.path(), json!({}));
    for i in 0..5 {
        m.capture(add_req(&format!("t-lock{i}"), transcript(1), None))
            .await
            .unwrap();
    }
    assert_eq!(m.live_session_locks(), 0);
}

fn slow_manager(fake: &FakeOv, dir: &std::path::Path) -> OpenVikingManager {
    manager(
        fake,
        dir,
        json!({"timeout_seconds": 0.5, "failure_policy": {"write": "raise"}}),
    )
}

fn set_slow(fake: &FakeOv, stored: usize, lost: usize) {
    *fake.state.slow_delay.lock().unwrap() = Duration::from_secs(3);
    fake.state
        .slow_batches
        .store(stored, std::sync::atomic::Ordering::SeqCst);
    fake.state
        .lost_batches
        .store(lost, std::sync::atomic::Ordering::SeqCst);
}

/// Defect (shared with the reference): a batch whose request timed out although the server
/// stored it was sent again by the next capture (8 messages on the server instead of 4). The
/// next capture first asks the session how many messages it holds since its last commit.
#[tokio::test]
async fn a_timed_out_batch_the_server_stored_is_not_sent_again() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = slow_manager(&fake, dir.path());
    let req = |n| add_req("t-slow", transcript(n), None);
    let sid = &m.session_for(&req(1)).unwrap().1;
    // An earlier turn, committed: the session's uncommitted count is back to 0.
    let r = m.capture(req(2)).await.unwrap();
    assert_eq!((r.sent, r.committed), (2, true));
    set_slow(&fake, 1, 0);
    let e = m.capture(req(6)).await.unwrap_err();
    assert!(matches!(e, ManagerError::Timeout { .. }), "{e}");
    assert!(
        e.to_string().contains("may have stored the last batch"),
        "{e}"
    );
    assert_eq!(
        fake.session_counts(sid),
        Some((4, 6)),
        "stored, not committed"
    );
    let cursor = cursor_json(&m, sid);
    assert_eq!(cursor["in_doubt_batch"]["payload_count"], 4);
    assert_eq!(cursor["in_doubt_batch"]["uncommitted_before"], 0);

    fake.clear();
    let r = m.capture(req(7)).await.unwrap();
    assert_eq!((r.sent, r.found_on_server, r.committed), (1, 4, true));
    assert_eq!(
        fake.lines(),
        [
            format!("GET /api/v1/sessions/{sid}"),
            format!("POST /api/v1/sessions/{sid}/messages/batch"),
            format!("POST /api/v1/sessions/{sid}/commit"),
        ]
    );
    let texts: Vec<String> = fake
        .session_messages(sid)
        .iter()
        .map(|m| m["parts"][0]["text"].as_str().unwrap().to_owned())
        .collect();
    let want: Vec<String> = transcript(7)
        .iter()
        .map(|m| m.content.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(texts, want, "every message once, in order");
    assert_eq!(fake.session_counts(sid), Some((0, 7)));
    let cursor = cursor_json(&m, sid);
    assert!(cursor.get("in_doubt_batch").is_none(), "{cursor}");
    assert_eq!(cursor["submitted_prefix_count"], 7);

    // Nothing new after a stored in-doubt batch: only the commit is sent.
    set_slow(&fake, 1, 0);
    m.capture(req(9)).await.unwrap_err();
    fake.clear();
    let r = m.capture(req(9)).await.unwrap();
    assert_eq!((r.sent, r.found_on_server, r.committed), (0, 2, true));
    assert_eq!(
        fake.lines(),
        [
            format!("GET /api/v1/sessions/{sid}"),
            format!("POST /api/v1/sessions/{sid}/commit"),
        ]
    );
    assert_eq!(fake.session_counts(sid), Some((0, 9)));
    fake.assert_clean();
}

/// The other outcome: the batch never reached the session, so it is sent again.
#[tokio::test]
async fn a_timed_out_batch_the_server_lost_is_sent_again() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = slow_manager(&fake, dir.path());
    set_slow(&fake, 0, 1);
    let req = add_req("t-lost", transcript(4), None);
    let sid = m.session_for(&req).unwrap().1;
    let e = m.capture(req.clone()).await.unwrap_err();
    assert!(matches!(e, ManagerError::Timeout { .. }), "{e}");
    assert_eq!(fake.session_counts(&sid), None);
    let r = m.capture(req).await.unwrap();
    assert_eq!((r.sent, r.found_on_server), (4, 0));
    assert_eq!(fake.session_counts(&sid), Some((0, 4)));
    fake.assert_clean();
}

/// A later batch of a long transcript times out after the first one was confirmed: the
/// in-doubt batch starts from the count the first batch's answer reported.
#[tokio::test]
async fn a_timed_out_later_batch_is_settled_against_the_confirmed_ones() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = slow_manager(&fake, dir.path());
    let req = add_req("t-long", transcript(150), None);
    let sid = m.session_for(&req).unwrap().1;
    set_slow(&fake, 0, 0);
    *fake.state.slow_batch_number.lock().unwrap() = Some(2);
    let e = m.capture(req.clone()).await.unwrap_err();
    assert!(
        e.to_string().contains("partially recorded 100 of 150"),
        "{e}"
    );
    let cursor = cursor_json(&m, &sid);
    assert_eq!(cursor["submitted_prefix_count"], 100);
    assert_eq!(cursor["in_doubt_batch"]["uncommitted_before"], 100);
    assert_eq!(cursor["in_doubt_batch"]["payload_count"], 50);
    assert_eq!(fake.session_counts(&sid), Some((150, 150)));
    let r = m.capture(req).await.unwrap();
    assert_eq!((r.sent, r.found_on_server, r.committed), (0, 50, true));
    assert_eq!(fake.session_counts(&sid), Some((0, 150)));
    assert_eq!(fake.session_commits(&sid), 1);
    fake.assert_clean();
}

/// When the count before the batch is unknown (or the session holds something else), the
/// batch is sent again: a possible duplicate, never a loss.
#[tokio::test]
async fn an_unsettled_batch_is_sent_again() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = slow_manager(&fake, dir.path());
    let req = add_req("t-unknown", transcript(2), None);
    let sid = m.session_for(&req).unwrap().1;
    set_slow(&fake, 1, 0);
    m.capture(req.clone()).await.unwrap_err();
    // The cursor no longer knows the count before the batch.
    let path = m.cursor_dir().join(format!("{sid}.json"));
    let mut cursor = cursor_json(&m, &sid);
    cursor["in_doubt_batch"]["uncommitted_before"] = Value::Null;
    std::fs::write(&path, serde_json::to_string_pretty(&cursor).unwrap()).unwrap();
    let r = m.capture(req.clone()).await.unwrap();
    assert_eq!((r.sent, r.found_on_server), (2, 0));
    assert_eq!(
        fake.session_counts(&sid),
        Some((0, 4)),
        "sent twice, nothing lost"
    );
    // A hostile record (counts at the top of the range) is no panic: the batch is sent again.
    let mut cursor = cursor_json(&m, &sid);
    cursor["submitted_prefix_count"] = json!(0);
    cursor["submitted_prefix_digest"] = json!(deermem_backend_openviking::cursor::seq_digest(&[]));
    cursor["submitted_signatures"] = json!([]);
    cursor["in_doubt_batch"] = json!({"signatures": [], "payload_count": u64::MAX,
                                      "uncommitted_before": u64::MAX});
    cursor["uncommitted_on_server"] = json!(u64::MAX);
    std::fs::write(&path, serde_json::to_string_pretty(&cursor).unwrap()).unwrap();
    let r = m.capture(req).await.unwrap();
    assert_eq!(r.sent, 2);
}

/// A tool-using turn as a LangChain dump: the tool results carry their call id and status.
fn tool_turn() -> Vec<Message> {
    serde_json::from_value(json!([
        {"type": "human", "id": "h1", "content": "Search the web for vim tips."},
        {"type": "ai", "id": "a1", "content": "", "tool_calls": [
            {"name": "web_search", "args": {"q": "vim tips"}, "id": "call-1", "type": "tool_call"}]},
        {"type": "tool", "id": "t1", "content": "1. Use :wq", "name": "web_search",
         "tool_call_id": "call-1", "status": "success"},
        {"type": "tool", "id": "t2", "content": "rate limited", "name": "web_search",
         "tool_call_id": "call-2", "status": "error"},
        {"type": "ai", "id": "a2", "content": "Use :wq to save and quit."}
    ]))
    .unwrap()
}

/// Defect: tool results were sent as `"tool_id": "", "tool_status": "completed"` because the
/// message's `tool_call_id` and `status` were dropped; the reference sends both (`error` stays
/// `error`), also for chat-completions `{"role": "tool", "tool_call_id": …}` messages.
#[tokio::test]
async fn tool_results_keep_their_call_id_and_status() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&fake, dir.path(), json!({}));
    let mut msgs = tool_turn();
    msgs.push(
        serde_json::from_value(json!({"role": "tool", "tool_call_id": "call-3", "content": "ok"}))
            .unwrap(),
    );
    let r = m.capture(add_req("t-tools", msgs, None)).await.unwrap();
    assert_eq!(r.sent, 6);
    let sid = m.session_for(&add_req("t-tools", vec![], None)).unwrap().1;
    let parts: Vec<Value> = fake
        .session_messages(&sid)
        .iter()
        .map(|m| m["parts"][0].clone())
        .collect();
    assert_eq!(
        parts[2],
        json!({"type": "tool", "tool_id": "call-1", "tool_name": "web_search",
               "tool_output": "1. Use :wq", "tool_status": "completed"})
    );
    assert_eq!(parts[3]["tool_id"], "call-2");
    assert_eq!(parts[3]["tool_status"], "error");
    assert_eq!(parts[5]["tool_id"], "call-3");
    assert_eq!(parts[5]["tool_status"], "completed");
    fake.assert_clean();
}

/// Defect: with a cursor the Python reference wrote for a thread with tool results, the tool
/// messages hashed differently here, so they were sent again (duplicates on the server).
/// The hashes below are the reference's: SHA-256 of `json.dumps({id, role, content,
/// tool_calls, tool_call_id, tool_name, tool_status}, ensure_ascii=False, sort_keys=True,
/// separators=(",", ":"))` for each message of `tool_turn()`.
#[tokio::test]
async fn resuming_from_a_reference_cursor_sends_only_new_messages() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&fake, dir.path(), json!({}));
    let sid = m.session_for(&add_req("t-ref", vec![], None)).unwrap().1;
    let reference_cursor = json!({
        "schema_version": 1,
        "submitted_signatures": [
            "bc93e9f644bdc273c3ea43b54544f7e74fe7786314bd03d6a24d82a24a20101e",
            "e976ed77a6df5feaaf685e91dbef236ee67d1a42c5609c1ea483846e68724ced",
            "5e514fedca006a12b23fb5c5324ef1701f5ca822317a7d9d573386e1e1e93f46",
            "362d7996a357bfb744f13685c3ea2c0aaa6295e1d52d1a4f770fbbe835a1963c",
            "47b0674856d2e06b68b9c1b197f34cba270e40dc319c94ffd7d3c5e12ced702c"
        ],
        "commit_pending": false,
        "submitted_prefix_count": 5,
        "submitted_prefix_digest": "1398c1b3dd489e3d34d053fa13ca6cc46773f1ab0da9d97fe96de6f99b748305"
    });
    std::fs::create_dir_all(m.cursor_dir()).unwrap();
    std::fs::write(
        m.cursor_dir().join(format!("{sid}.json")),
        serde_json::to_string_pretty(&reference_cursor).unwrap(),
    )
    .unwrap();
    let mut msgs = tool_turn();
    msgs.push(Message::human("Thanks!"));
    let r = m.capture(add_req("t-ref", msgs, None)).await.unwrap();
    assert_eq!(r.sent, 1);
    let texts: Vec<String> = fake
        .session_messages(&sid)
        .iter()
        .map(|m| m["parts"][0]["text"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(texts, ["Thanks!"]);
    assert_eq!(cursor_json(&m, &sid)["submitted_prefix_count"], 6);
    fake.assert_clean();
}

/// Defect: a capture reported the input's message count, not what reached the server. The
/// report counts the messages the server confirmed in this capture.
#[tokio::test]
async fn the_capture_report_counts_what_the_server_confirmed() {
    let fake = FakeOv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&fake, dir.path(), json!({}));
    let mut msgs = vec![Message::system("You are DeerFlow.")];
    msgs.extend(transcript(4));
    let (r, result) = m.capture_now(add_req("t-count", msgs.clone(), None)).await;
    result.unwrap();
    assert_eq!(
        (r.sent, r.committed),
        (4, true),
        "the system message is not sent"
    );
    msgs.extend(transcript(6).into_iter().skip(4));
    let (r, result) = m.capture_now(add_req("t-count", msgs.clone(), None)).await;
    result.unwrap();
    assert_eq!(r.sent, 2, "7 messages given, 2 new");
    // Under log_and_drop capture() swallows a failure; capture_now() still returns it.
    fake.state
        .unavailable_writes
        .store(1, std::sync::atomic::Ordering::SeqCst);
    msgs.push(Message::human("one more"));
    let (r, result) = m.capture_now(add_req("t-count", msgs, None)).await;
    assert_eq!(r.sent, 0);
    let e = result.unwrap_err();
    assert!(matches!(e, ManagerError::Unavailable { .. }), "{e}");
    assert_eq!(m.last_backend_failure().unwrap().operation, "capture");
}
