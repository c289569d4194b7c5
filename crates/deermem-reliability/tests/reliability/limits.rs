//! Resource limits: 10 MB messages, large fact scopes (100,000 facts in the long run), many
//! users (10,000 in the long run), and an LLM that accepts connections and never answers.
//! Memory and time stay bounded (measured and printed as figures; hang guards only, no timing
//! assertions), nothing panics, and the update queue's backpressure holds.

use std::sync::Arc;
use std::time::{Duration, Instant};

use deermem_core::ports::{AddRequest, ContextRequest, MemoryScope, NewFact, SearchRequest};
use deermem_core::{AgentName, ManagerError, Message, Timestamp, UserId};
use deermem_reliability::{figure, pick, verify};
use serde_json::json;

use crate::support;
use deermem_core::prelude::*;

/// Generous guard against a hang; never an assertion about speed.
const HANG_GUARD: Duration = Duration::from_secs(600);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_megabyte_messages_are_bounded() {
    let tmp = tempfile::tempdir().unwrap();
    let manager = support::manager(tmp.path());
    let scope = MemoryScope::user(UserId::new("alice").unwrap());
    let huge = format!(
        "I love tea. {}",
        "lorem ipsum ".repeat(10 * 1024 * 1024 / 12)
    );
    let started = Instant::now();
    manager
        .add(AddRequest {
            thread_id: "t-huge".into(),
            messages: vec![Message::human(huge.clone()), Message::ai("Noted.")],
            scope: scope.clone(),
            trace_id: None,
        })
        .await
        .expect("add accepts a huge turn (it is filtered and bounded, not refused)");
    assert!(
        tokio::time::timeout(HANG_GUARD, manager.shutdown_flush(Duration::from_secs(60)))
            .await
            .is_ok()
    );
    figure(
        "limits",
        "ten_mb_add_and_flush_ms",
        started.elapsed().as_millis(),
    );
    // A 10 MB manual fact is stored, as the reference stores it (the host's boundary bounds a
    // request; the context below stays within its budget because injection skips it).
    match manager
        .create_fact(NewFact::new(huge.clone()), scope.clone())
        .await
    {
        Ok((doc, _)) => assert!(doc.facts.iter().any(|f| f.content.len() > 9 * 1024 * 1024)),
        Err(e) => panic!("a 10 MB fact is stored: {e}"),
    }
    // A 10 MB search query too, and the context stays within its budget.
    let r = manager
        .search(SearchRequest {
            query: huge.clone(),
            top_k: 5,
            scope: scope.clone(),
            category: None,
            mode: None,
        })
        .await;
    assert!(
        matches!(r, Err(ManagerError::InvalidInput { .. }) | Ok(_)),
        "{r:?}"
    );
    let ctx = manager
        .get_context(ContextRequest {
            scope,
            thread_id: None,
        })
        .await
        .unwrap();
    assert!(ctx.len() < 64 * 1024, "context of {} bytes", ctx.len());
    figure(
        "limits",
        "peak_rss_kib_after_10mb",
        verify::peak_rss_kib().unwrap_or(0),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_fact_scope_stays_bounded() {
    let n: usize = pick(3_000, 100_000);
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    let storage = support::storage(&root);
    let (u, a) = (UserId::new("alice").unwrap(), AgentName::default_bucket());
    // One commit through storage for the manifest, then facts written the way an operator's
    // bulk import or the reference would leave them (rendered by our writer).
    let d =
        deermem_core::FactDraft::try_from(json!({"id": "seed", "content": "seed fact"})).unwrap();
    storage
        .upsert_fact(Some(&u), &a, d, None, None)
        .await
        .unwrap();
    let scope = deermem_core::Scope::agent(&u, &a).to_fact_scope();
    let written = Instant::now();
    for i in 0..n {
        let d = deermem_core::FactDraft::try_from(json!({"id": format!("bulk_{i}"), "content": format!("bulk fact {i} about topic{} and tea", i % 97)})).unwrap();
        let ctx = deermem_core::fact::NormalizeContext {
            scope: &scope,
            existing: None,
            now: Timestamp::from_unix_seconds(1_800_000_000),
            new_id: &|| deermem_core::FactId::new("unused").unwrap(),
        };
        let fact = deermem_core::fact::normalize_fact(&d, &ctx).unwrap();
        let text = deermem_storage_file::render_fact_markdown(&fact).unwrap();
        let dir = root
            .join("users/alice/agents/__default__/facts")
            .join(fact.id.shard());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{}.md", fact.id)), text).unwrap();
    }
    storage.close().await;
    figure("limits", "large_scope_facts", n + 1);
    figure(
        "limits",
        "large_scope_write_ms",
        written.elapsed().as_millis(),
    );
    let manager = support::manager(&root);
    let scope = MemoryScope::user(u.clone());
    let t = Instant::now();
    let doc = tokio::time::timeout(HANG_GUARD, manager.get_memory(scope.clone()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(doc.facts.len(), n + 1);
    figure(
        "limits",
        "large_scope_get_memory_ms",
        t.elapsed().as_millis(),
    );
    let t = Instant::now();
    let hits = manager
        .search(SearchRequest {
            query: "topic42 tea".into(),
            top_k: 5,
            scope: scope.clone(),
            category: None,
            mode: None,
        })
        .await
        .unwrap();
    assert!(!hits.is_empty() && hits.len() <= 5);
    figure(
        "limits",
        "large_scope_first_search_ms",
        t.elapsed().as_millis(),
    );
    let t = Instant::now();
    let ctx = manager
        .get_context(ContextRequest {
            scope,
            thread_id: None,
        })
        .await
        .unwrap();
    assert!(ctx.len() < 64 * 1024, "context of {} bytes", ctx.len());
    figure("limits", "large_scope_context_ms", t.elapsed().as_millis());
    figure(
        "limits",
        "large_scope_peak_rss_kib",
        verify::peak_rss_kib().unwrap_or(0),
    );
    manager.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_users_stay_isolated_and_listable() {
    let n: usize = pick(150, 10_000);
    let tmp = tempfile::tempdir().unwrap();
    let storage = support::storage(tmp.path());
    let a = AgentName::default_bucket();
    let t = Instant::now();
    for i in 0..n {
        let u = UserId::new(format!("user{i}@example.com")).unwrap();
        let d = deermem_core::FactDraft::try_from(
            json!({"id": "only", "content": format!("the fact of user {i}")}),
        )
        .unwrap();
        storage
            .upsert_fact(Some(&u), &a, d, None, None)
            .await
            .unwrap();
    }
    figure("limits", "users", n);
    figure("limits", "users_write_ms", t.elapsed().as_millis());
    let users = storage.list_users().await.unwrap();
    assert_eq!(users.len(), n);
    for i in (0..n).step_by((n / 50).max(1)) {
        let u = UserId::new(format!("user{i}@example.com")).unwrap();
        let doc = storage.load(Some(&u), Some(&a)).await.unwrap();
        assert_eq!(doc.facts.len(), 1);
        assert_eq!(doc.facts[0].content, format!("the fact of user {i}"));
    }
    let t = Instant::now();
    let report = storage.rebuild_index(None).await.unwrap();
    figure("limits", "users_full_rebuild_ms", t.elapsed().as_millis());
    figure(
        "limits",
        "users_rebuild_report",
        format!("{report:?}").replace(' ', ""),
    );
    figure(
        "limits",
        "users_peak_rss_kib",
        verify::peak_rss_kib().unwrap_or(0),
    );
    storage.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_llm_that_never_answers_blocks_nothing_and_the_queue_holds() {
    // A server that accepts connections and never says a word.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let held = Arc::new(tokio::sync::Mutex::new(Vec::new()));
    let h2 = held.clone();
    let server = tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            h2.lock().await.push(sock);
        }
    });
    let depth = 4u64;
    let section = json!({
        "enabled": true,
        "manager_class": "deermem",
        "backend_config": {
            "queue_max_depth": depth,
            "debounce_seconds": 1,
            "model": {"model": "silent", "api_key": "k", "base_url": format!("http://{addr}/v1"),
                      "timeout_seconds": 2, "max_retries": 0}
        }
    });
    let (cfg, _) = deermem::memory_config_from_section(&section).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let env = |_: &str| None;
    let mut opts = deermem::BuildOptions::new(&env);
    opts.storage_path = Some(tmp.path().to_path_buf());
    let backend = deermem::build_backend(&cfg, opts).unwrap();
    let dm = backend.deermem().expect("the DeerMem backend").clone();
    let manager = backend.manager();
    let conversations = pick(40u64, 400);
    let t = Instant::now();
    let mut max_pending = 0usize;
    for i in 0..conversations {
        manager
            .add(AddRequest {
                thread_id: format!("thread-{i}"),
                // No memory signal: such turns are subject to the queue's depth (turns carrying
                // a signal are never refused, by design).
                messages: vec![
                    Message::human(format!(
                        "Can you summarise the history of the printing press, part {i}?"
                    )),
                    Message::ai(
                        "The printing press spread across Europe in the fifteenth century.",
                    ),
                ],
                scope: MemoryScope::user(UserId::new(format!("u{}", i % 7)).unwrap()),
                trace_id: None,
            })
            .await
            .expect("add never fails for backpressure");
        max_pending = max_pending.max(dm.pipeline().queue().pending_count());
    }
    figure("limits", "silent_llm_adds", conversations);
    figure("limits", "silent_llm_add_ms_total", t.elapsed().as_millis());
    assert!(
        max_pending as u64 <= depth,
        "queue grew to {max_pending} over its depth {depth}"
    );
    let stats = dm.pipeline().queue().stats();
    assert!(stats.rejected > 0, "backpressure never engaged: {stats:?}");
    figure("limits", "silent_llm_queue_rejected", stats.rejected);
    // Reads keep answering while the model hangs.
    let ctx = manager
        .get_context(ContextRequest {
            scope: MemoryScope::user(UserId::new("u1").unwrap()),
            thread_id: None,
        })
        .await;
    assert!(ctx.is_ok(), "{ctx:?}");
    // A direct extraction fails typed after the client timeout instead of hanging.
    let r = tokio::time::timeout(
        HANG_GUARD,
        dm.ingest_now(AddRequest {
            thread_id: "direct".into(),
            messages: vec![
                Message::human("I am allergic to peanuts"),
                Message::ai("noted"),
            ],
            scope: MemoryScope::user(UserId::new("u1").unwrap()),
            trace_id: None,
        }),
    )
    .await
    .expect("ingest_now returns");
    assert!(
        matches!(
            r,
            Err(ManagerError::Timeout { .. }) | Err(ManagerError::Unavailable { .. })
        ),
        "{r:?}"
    );
    let t = Instant::now();
    let flushed = tokio::time::timeout(HANG_GUARD, manager.shutdown_flush(Duration::from_secs(3)))
        .await
        .expect("shutdown_flush returns");
    figure(
        "limits",
        "silent_llm_shutdown_flush_ms",
        t.elapsed().as_millis(),
    );
    figure("limits", "silent_llm_flushed_in_budget", flushed);
    figure("limits", "silent_llm_max_queue_depth", max_pending);
    manager.close().await;
    server.abort();
}
