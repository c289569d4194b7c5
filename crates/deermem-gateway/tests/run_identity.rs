//! Run-level memory identity end to end: `GET /api/memory/context` with a
//! `thread_id` and `run_id` records one `context:memory` event in the file-backed run journal,
//! read back with `GET /api/threads/{thread_id}/runs/{run_id}/events`. Covers the hash of the
//! returned block, once per run, refusal of a different block, user isolation, restarts, the
//! memory text never reaching the journal, torn last lines, the bound, races and hostile ids.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::sync::Arc;

use axum::Router;
use axum::http::{Method, StatusCode};
use common::{FakeManager, INTERNAL_TOKEN, empty, ready_state, send, with_bearer};
use deermem_core::ports::run_journal::{EventQuery, EventsLookup, JournalError, RecordOutcome};
use deermem_core::{MemoryConfig, UserId};
use deermem_gateway::{GatewayConfig, router};
use deermem_storage_file::{RunJournal, RunJournalOptions};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const MARKER: &str = "Secret-Marker-Prefers-Oolong-7f3a";

fn journal(root: &Path, options: RunJournalOptions) -> Arc<RunJournal> {
    Arc::new(RunJournal::open(RunJournal::dir_for_storage_root(root), options).expect("open"))
}

fn app_with(m: &Arc<FakeManager>, j: &Arc<RunJournal>, gateway: GatewayConfig) -> Router {
    router(ready_state(m.clone(), MemoryConfig::default(), gateway).with_run_journal(j.clone()))
}

fn app(m: &Arc<FakeManager>, j: &Arc<RunJournal>) -> Router {
    app_with(m, j, GatewayConfig::default())
}

fn token_gateway() -> GatewayConfig {
    let mut cfg =
        GatewayConfig::with_tokens([("tok-alice", "alice"), ("tok-bob", "bob")]).expect("tokens");
    cfg.auth.internal_token = Some(deermem_core::config::ConfigSecret::new(INTERNAL_TOKEN));
    cfg
}

fn context_uri(thread: &str, run: &str) -> String {
    format!("/api/memory/context?thread_id={thread}&run_id={run}")
}

fn events_uri(thread: &str, run: &str) -> String {
    format!("/api/threads/{thread}/runs/{run}/events?event_types=context:memory")
}

fn sha256_hex(s: &str) -> String {
    Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn default_user() -> UserId {
    UserId::default_user()
}

/// Every byte of every file under `dir`.
fn all_files(dir: &Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((p.clone(), std::fs::read(&p).expect("read")));
            }
        }
    }
    out
}

#[tokio::test]
async fn the_hash_is_the_sha256_of_the_returned_block_and_one_event_records_it() {
    let tmp = tempfile::tempdir().expect("tmp");
    let m = FakeManager::new();
    m.set_context_body(&format!("User Context:\n- {MARKER}"));
    let j = journal(tmp.path(), RunJournalOptions::default());
    let a = app(&m, &j);
    let r = send(&a, empty(Method::GET, &context_uri("t-1", "r-1"))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let block = r.body["context"].as_str().expect("block");
    assert!(block.starts_with("<memory>\n") && block.ends_with("</memory>\n"));
    let sha = sha256_hex(block);
    assert_eq!(r.body["content_sha256"], json!(sha));

    let r = send(&a, empty(Method::GET, &events_uri("t-1", "r-1"))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let events = r.body.as_array().expect("list");
    assert_eq!(events.len(), 1);
    let e = &events[0];
    assert_eq!(e["event_type"], "context:memory");
    assert_eq!(e["category"], "context");
    assert_eq!(e["content"], json!({ "content_sha256": sha }));
    assert_eq!(e["thread_id"], "t-1");
    assert_eq!(e["run_id"], "r-1");
    assert_eq!(e["seq"], 1);
    assert_eq!(e["metadata"], json!({"agent_name": "__default__"}));
    let created = e["created_at"].as_str().expect("created_at");
    assert!(
        deermem_core::time::Timestamp::parse_iso(created).is_some() && created.ends_with('Z'),
        "{created}"
    );
    // Without a filter the same event; a filter that matches nothing gives an empty list.
    let r = send(&a, empty(Method::GET, "/api/threads/t-1/runs/r-1/events")).await;
    assert_eq!(r.body.as_array().map(Vec::len), Some(1));
    let r = send(
        &a,
        empty(
            Method::GET,
            "/api/threads/t-1/runs/r-1/events?event_types=llm.ai.response",
        ),
    )
    .await;
    assert_eq!((r.status, r.body), (StatusCode::OK, json!([])));
    // A context call without a run records nothing.
    send(&a, empty(Method::GET, "/api/memory/context?thread_id=t-1")).await;
    assert_eq!(j.retained_events(&default_user()).expect("count"), 1);
}

#[tokio::test]
async fn a_run_records_once_and_refuses_a_different_block() {
    let tmp = tempfile::tempdir().expect("tmp");
    let m = FakeManager::new();
    let j = journal(tmp.path(), RunJournalOptions::default());
    let a = app(&m, &j);
    let first = send(&a, empty(Method::GET, &context_uri("t-1", "r-1"))).await;
    assert_eq!(first.status, StatusCode::OK);
    for _ in 0..3 {
        let again = send(&a, empty(Method::GET, &context_uri("t-1", "r-1"))).await;
        assert_eq!(again.status, StatusCode::OK);
        assert_eq!(again.body, first.body);
    }
    let file = j.events_file(&default_user());
    assert_eq!(lines(&file).len(), 1, "a repeated call records nothing new");

    m.set_context_body("User Context:\n- changed meanwhile");
    let r = send(&a, empty(Method::GET, &context_uri("t-1", "r-1"))).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    let detail = r.detail();
    assert!(
        detail.contains("Run 'r-1' of thread 't-1' already recorded a different memory block"),
        "{detail}"
    );
    assert!(detail.contains(first.body["content_sha256"].as_str().expect("sha")));
    assert!(
        r.body.get("context").is_none(),
        "the refused block is not served"
    );
    assert_eq!(lines(&file).len(), 1);
    let r = send(&a, empty(Method::GET, &events_uri("t-1", "r-1"))).await;
    assert_eq!(
        r.body[0]["content"]["content_sha256"],
        first.body["content_sha256"]
    );
    // A new run of the same thread sees the new block.
    let r = send(&a, empty(Method::GET, &context_uri("t-1", "r-2"))).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_ne!(r.body["content_sha256"], first.body["content_sha256"]);
    assert_eq!(lines(&file).len(), 2);
    // An empty block records nothing (there is no identity to record).
    m.set_context_body("  ");
    let r = send(&a, empty(Method::GET, &context_uri("t-1", "r-3"))).await;
    assert_eq!(r.body, json!({"context": "", "content_sha256": null}));
    assert_eq!(lines(&file).len(), 2);
    let r = send(&a, empty(Method::GET, &events_uri("t-1", "r-3"))).await;
    assert_eq!(
        (r.status, r.detail()),
        (
            StatusCode::NOT_FOUND,
            "Run 'r-3' not found in thread 't-1'."
        )
    );
}

#[tokio::test]
async fn users_are_isolated_and_another_users_thread_is_404() {
    let tmp = tempfile::tempdir().expect("tmp");
    let m = FakeManager::new();
    let j = journal(tmp.path(), RunJournalOptions::default());
    let a = app_with(&m, &j, token_gateway());
    let alice = |uri: &str| with_bearer(empty(Method::GET, uri), "tok-alice");
    let bob = |uri: &str| with_bearer(empty(Method::GET, uri), "tok-bob");

    let ra = send(&a, alice(&context_uri("t-shared", "r-1"))).await;
    assert_eq!(ra.status, StatusCode::OK, "{}", ra.text);
    // Bob cannot read alice's thread: 404, never 403, never her data.
    let r = send(&a, bob(&events_uri("t-shared", "r-1"))).await;
    assert_eq!(
        (r.status, r.detail()),
        (StatusCode::NOT_FOUND, "Thread 't-shared' not found.")
    );
    // Bob's own run with the same ids and another block is his own, not a conflict.
    m.set_context_body("User Context:\n- bob's block");
    let rb = send(&a, bob(&context_uri("t-shared", "r-1"))).await;
    assert_eq!(rb.status, StatusCode::OK, "{}", rb.text);
    assert_ne!(rb.body["content_sha256"], ra.body["content_sha256"]);
    let r = send(&a, bob(&events_uri("t-shared", "r-1"))).await;
    assert_eq!(
        r.body[0]["content"]["content_sha256"],
        rb.body["content_sha256"]
    );
    let r = send(&a, alice(&events_uri("t-shared", "r-1"))).await;
    assert_eq!(r.body.as_array().map(Vec::len), Some(1));
    assert_eq!(
        r.body[0]["content"]["content_sha256"],
        ra.body["content_sha256"]
    );
    // An internal caller acting for alice sees alice's events.
    let mut req = empty(Method::GET, &events_uri("t-shared", "r-1"));
    req.headers_mut().insert(
        "x-deerflow-internal-token",
        INTERNAL_TOKEN.parse().expect("h"),
    );
    req.headers_mut()
        .insert("x-deerflow-owner-user-id", "alice".parse().expect("h"));
    let r = send(&a, req).await;
    assert_eq!(
        r.body[0]["content"]["content_sha256"],
        ra.body["content_sha256"]
    );
    // Separate files per user bucket; unauthenticated callers get nothing.
    let dir = RunJournal::dir_for_storage_root(tmp.path());
    assert_eq!(lines(&dir.join("alice/events.jsonl")).len(), 1);
    assert_eq!(lines(&dir.join("bob/events.jsonl")).len(), 1);
    let r = send(&a, empty(Method::GET, &events_uri("t-shared", "r-1"))).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn events_survive_a_restart_and_the_rules_still_hold() {
    let tmp = tempfile::tempdir().expect("tmp");
    let m = FakeManager::new();
    let sha = {
        let j = journal(tmp.path(), RunJournalOptions::default());
        let a = app(&m, &j);
        let r = send(&a, empty(Method::GET, &context_uri("t-1", "r-1"))).await;
        assert_eq!(r.status, StatusCode::OK);
        // While it is open, a second journal on the directory is refused.
        let second = RunJournal::open(
            RunJournal::dir_for_storage_root(tmp.path()),
            RunJournalOptions::default(),
        );
        assert!(
            matches!(second, Err(JournalError::Busy { .. })),
            "{second:?}"
        );
        r.body["content_sha256"].clone()
    };
    // Restarted: a new journal on the same directory.
    let j = journal(tmp.path(), RunJournalOptions::default());
    let a = app(&m, &j);
    let r = send(&a, empty(Method::GET, &events_uri("t-1", "r-1"))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body[0]["content"]["content_sha256"], sha);
    let r = send(&a, empty(Method::GET, &context_uri("t-1", "r-1"))).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(lines(&j.events_file(&default_user())).len(), 1);
    m.set_context_body("User Context:\n- something else");
    let r = send(&a, empty(Method::GET, &context_uri("t-1", "r-1"))).await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    // Sequence numbers continue after the restart.
    let r = send(&a, empty(Method::GET, &context_uri("t-1", "r-2"))).await;
    assert_eq!(r.status, StatusCode::OK);
    let r = send(&a, empty(Method::GET, &events_uri("t-1", "r-2"))).await;
    assert_eq!(r.body[0]["seq"], 2);
}

#[tokio::test]
async fn the_journal_never_holds_the_memory_text() {
    let tmp = tempfile::tempdir().expect("tmp");
    let m = FakeManager::new();
    m.set_context_body(&format!("User Context:\n- {MARKER}"));
    let j = journal(
        tmp.path(),
        RunJournalOptions {
            max_events_per_user: 2,
            ..RunJournalOptions::default()
        },
    );
    let a = app(&m, &j);
    let mut block = String::new();
    for i in 0..6 {
        // Enough runs to compact the file at least once.
        let r = send(
            &a,
            empty(Method::GET, &context_uri("t-1", &format!("r-{i}"))),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK);
        block = r.body["context"].as_str().expect("block").to_owned();
    }
    assert!(block.contains(MARKER));
    let files = all_files(tmp.path());
    assert!(files.iter().any(|(p, _)| p.ends_with("events.jsonl")));
    for (path, bytes) in files {
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            !text.contains(MARKER),
            "{} holds memory text",
            path.display()
        );
        assert!(
            !text.contains("<memory>"),
            "{} holds the block",
            path.display()
        );
    }
}

#[tokio::test]
async fn a_torn_last_line_is_ignored_and_never_fatal() {
    let tmp = tempfile::tempdir().expect("tmp");
    let m = FakeManager::new();
    let file = {
        let j = journal(tmp.path(), RunJournalOptions::default());
        let a = app(&m, &j);
        send(&a, empty(Method::GET, &context_uri("t-1", "r-1"))).await;
        j.events_file(&default_user())
    };
    // A crash in the middle of the second append.
    let mut bytes = std::fs::read(&file).expect("read");
    bytes.extend_from_slice(
        br#"{"seq":2,"user_id":"default","thread_id":"t-1","run_id":"r-2","event_ty"#,
    );
    std::fs::write(&file, &bytes).expect("write");

    let j = journal(tmp.path(), RunJournalOptions::default());
    let a = app(&m, &j);
    let r = send(&a, empty(Method::GET, &events_uri("t-1", "r-1"))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = send(&a, empty(Method::GET, &events_uri("t-1", "r-2"))).await;
    assert_eq!(
        r.status,
        StatusCode::NOT_FOUND,
        "the torn event does not count"
    );
    // The run can record now; the new line does not merge with the fragment.
    let r = send(&a, empty(Method::GET, &context_uri("t-1", "r-2"))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    drop(a);
    drop(j);
    let j = journal(tmp.path(), RunJournalOptions::default());
    let user = default_user();
    for run in ["r-1", "r-2"] {
        let found = j
            .events_blocking(&user, "t-1", run, &EventQuery::default())
            .expect("events");
        assert!(
            matches!(&found, EventsLookup::Events(e) if e.len() == 1 && e[0].run_id == run),
            "{run}: {found:?}"
        );
    }
    // Garbage in the middle of the file is skipped too.
    let mut text = std::fs::read_to_string(&file).expect("read");
    text.insert_str(0, "not json at all\n{\"seq\": \"x\"}\n\n");
    std::fs::write(&file, text).expect("write");
    drop(j);
    let j = journal(tmp.path(), RunJournalOptions::default());
    assert_eq!(j.retained_events(&user).expect("count"), 2);
}

#[tokio::test]
async fn the_bound_is_respected_in_memory_and_on_disk() {
    let tmp = tempfile::tempdir().expect("tmp");
    let m = FakeManager::new();
    let options = RunJournalOptions {
        max_events_per_user: 3,
        max_cached_users: 8,
    };
    let j = journal(tmp.path(), options);
    let a = app(&m, &j);
    let file = j.events_file(&default_user());
    for i in 0..20 {
        let r = send(
            &a,
            empty(Method::GET, &context_uri("t-1", &format!("r-{i}"))),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK);
        assert!(
            lines(&file).len() <= 3 + 1,
            "file grew past the bound: {}",
            lines(&file).len()
        );
    }
    assert_eq!(j.retained_events(&default_user()).expect("count"), 3);
    // `/status` shows the journal's in-memory bound (the fake manager reports no cache).
    let r = send(&a, empty(Method::GET, "/api/memory/status")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(
        r.body["caches"],
        json!([{"name": "run_journal.users", "bound": 8, "unit": "entries", "current": 1}])
    );
    for i in 0..17 {
        let r = send(
            &a,
            empty(Method::GET, &events_uri("t-1", &format!("r-{i}"))),
        )
        .await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "r-{i} should be forgotten");
    }
    for i in 17..20 {
        let r = send(
            &a,
            empty(Method::GET, &events_uri("t-1", &format!("r-{i}"))),
        )
        .await;
        assert_eq!(r.body[0]["seq"], i + 1, "r-{i}");
    }
    // After a restart the same three remain.
    drop(a);
    drop(j);
    let j = journal(tmp.path(), options);
    assert_eq!(j.retained_events(&default_user()).expect("count"), 3);
    // A thread whose runs were all forgotten is unknown again.
    let found = j
        .events_blocking(&default_user(), "t-1", "r-0", &EventQuery::default())
        .expect("events");
    assert_eq!(found, EventsLookup::UnknownRun);
    let found = j
        .events_blocking(&default_user(), "t-2", "r-0", &EventQuery::default())
        .expect("events");
    assert_eq!(found, EventsLookup::UnknownThread);
}

#[test]
fn idle_users_leave_the_cache_and_are_reloaded_from_their_files() {
    let tmp = tempfile::tempdir().expect("tmp");
    let j = journal(
        tmp.path(),
        RunJournalOptions {
            max_events_per_user: 10,
            max_cached_users: 2,
        },
    );
    let sha = "a".repeat(64);
    let users: Vec<UserId> = (0..5)
        .map(|i| UserId::new(format!("user{i}")).expect("user"))
        .collect();
    for u in &users {
        j.record_context_blocking(u, None, "t", "r", &sha)
            .expect("record");
        assert!(j.cached_users() <= 2, "{}", j.cached_users());
    }
    for u in &users {
        let again = j
            .record_context_blocking(u, None, "t", "r", &sha)
            .expect("record");
        assert!(matches!(again, RecordOutcome::AlreadyRecorded(_)), "{u:?}");
        let other = j.record_context_blocking(u, None, "t", "r", &"b".repeat(64));
        assert!(matches!(other, Err(JournalError::Conflict { .. })));
    }
}

#[test]
fn concurrent_records_of_one_run_keep_exactly_one_event() {
    let tmp = tempfile::tempdir().expect("tmp");
    let j = journal(tmp.path(), RunJournalOptions::default());
    let user = default_user();
    let hashes = ["1".repeat(64), "2".repeat(64)];
    let outcomes: Vec<Result<RecordOutcome, JournalError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..16)
            .map(|i| {
                let (j, user, sha) = (&j, &user, &hashes[i % 2]);
                s.spawn(move || j.record_context_blocking(user, None, "t-race", "r-race", sha))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    });
    let recorded: Vec<&RecordOutcome> = outcomes
        .iter()
        .filter_map(|o| o.as_ref().ok())
        .filter(|o| matches!(o, RecordOutcome::Recorded(_)))
        .collect();
    assert_eq!(recorded.len(), 1, "{outcomes:?}");
    let winner = recorded[0]
        .event()
        .content_sha256()
        .expect("sha")
        .to_owned();
    for o in &outcomes {
        match o {
            Ok(o) => assert_eq!(o.event().content_sha256(), Some(winner.as_str())),
            Err(JournalError::Conflict { recorded, .. }) => assert_eq!(recorded, &winner),
            Err(e) => panic!("unexpected {e}"),
        }
    }
    assert_eq!(lines(&j.events_file(&user)).len(), 1);
}

#[tokio::test]
async fn hostile_ids_and_parameters_are_refused() {
    let tmp = tempfile::tempdir().expect("tmp");
    let m = FakeManager::new();
    let j = journal(tmp.path(), RunJournalOptions::default());
    let a = app(&m, &j);
    let long = "a".repeat(300);
    for (thread, run) in [
        ("..", "r"),
        ("t", ".."),
        ("a%20b", "r"),
        ("t", "r%00x"),
        ("%2E%2E%2Fetc", "r"),
        (long.as_str(), "r"),
        ("t", long.as_str()),
        ("%C3%A9", "r"),
    ] {
        let r = send(&a, empty(Method::GET, &events_uri(thread, run))).await;
        assert_eq!(
            r.status,
            StatusCode::BAD_REQUEST,
            "{thread} {run}: {}",
            r.text
        );
        let r = send(&a, empty(Method::GET, &context_uri(thread, run))).await;
        assert!(
            r.status == StatusCode::BAD_REQUEST || r.status == StatusCode::UNPROCESSABLE_ENTITY,
            "{thread} {run}: {}",
            r.text
        );
    }
    assert!(m.calls().is_empty(), "hostile ids never reach the backend");
    let r = send(
        &a,
        empty(
            Method::GET,
            &events_uri("t", "r").replace("context:memory", "a%20b"),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    for bad in ["limit=0", "limit=2001", "limit=x", "after_seq=-1"] {
        let r = send(
            &a,
            empty(Method::GET, &format!("/api/threads/t/runs/r/events?{bad}")),
        )
        .await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{bad}: {}",
            r.text
        );
    }
    // Nothing was written for any of them.
    assert!(!j.events_file(&default_user()).exists());
}

#[tokio::test]
async fn limit_and_after_seq_page_through_a_runs_events() {
    let tmp = tempfile::tempdir().expect("tmp");
    let m = FakeManager::new();
    let j = journal(tmp.path(), RunJournalOptions::default());
    let a = app(&m, &j);
    send(&a, empty(Method::GET, &context_uri("t-1", "r-1"))).await;
    let r = send(
        &a,
        empty(
            Method::GET,
            "/api/threads/t-1/runs/r-1/events?limit=1&after_seq=1",
        ),
    )
    .await;
    assert_eq!((r.status, r.body), (StatusCode::OK, json!([])));
    let r = send(
        &a,
        empty(Method::GET, "/api/threads/t-1/runs/r-1/events?limit=1"),
    )
    .await;
    assert_eq!(r.body.as_array().map(Vec::len), Some(1));
}

#[tokio::test]
async fn without_a_journal_the_events_route_is_501() {
    let m = FakeManager::new();
    let a = router(ready_state(
        m.clone(),
        MemoryConfig::default(),
        GatewayConfig::default(),
    ));
    let r = send(&a, empty(Method::GET, &events_uri("t-1", "r-1"))).await;
    assert_eq!(
        (r.status, r.detail()),
        (
            StatusCode::NOT_IMPLEMENTED,
            "Run events are not recorded: this gateway has no run journal."
        )
    );
    // Context still works and records nothing anywhere.
    let r = send(&a, empty(Method::GET, &context_uri("t-1", "r-1"))).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["content_sha256"].as_str().map(str::len), Some(64));
    let _: &Value = &r.body;
}
