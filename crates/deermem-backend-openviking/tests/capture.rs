//! Capture-path contract tests against the fake OpenViking server: request sequences, batching,
//! commits and their retry, the hash-only cursor, failure policies and the owner rule.

mod support;

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
    assert!(
        !m.shutdown_flush(WAIT).await,
        "a failed drain is not a clean flush"
    );
    assert!(m.shutdown_flush(WAIT).await, "reported once");

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
