//! Queue mechanics with a recording processor: coalescing, isolation by thread/user/agent,
//! per-conversation debounce, emergency items, backpressure, flushing, failures and panics. Paused
//! tokio time drives the debounce; tests assert order and counts, never durations.

#![allow(clippy::unwrap_used, clippy::expect_used)]

// The updater crate's test helpers (clock, spy storage, scripted answers), shared rather than copied.
#[path = "../../deermem-updater/tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::{a, h};
use deermem_core::{AgentName, UserId};
use deermem_engine::{QueueConfig, QueueError, UpdateQueue};
use deermem_updater::UpdateProcessor;
use deermem_updater::{
    Signal, SignalSet, UpdateOutcome, UpdateRequest, UpdateStatus, UpdaterError,
};
use tokio::sync::Semaphore;

#[derive(Debug, Default)]
struct Recorder {
    seen: Mutex<Vec<UpdateRequest>>,
    running: Mutex<HashMap<String, usize>>,
    overlap: Mutex<bool>,
    gate: Option<Arc<Semaphore>>,
    fail_threads: Vec<String>,
    panic_threads: Vec<String>,
}

impl Recorder {
    fn threads(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.thread_id.clone())
            .collect()
    }
}

#[async_trait]
impl UpdateProcessor for Recorder {
    async fn process(&self, request: UpdateRequest) -> Result<UpdateOutcome, UpdaterError> {
        let key = format!("{}|{:?}|{}", request.thread_id, request.user, request.agent);
        {
            let mut r = self.running.lock().unwrap();
            let n = r.entry(key.clone()).or_default();
            *n += 1;
            if *n > 1 {
                *self.overlap.lock().unwrap() = true;
            }
        }
        self.seen.lock().unwrap().push(request.clone());
        if let Some(g) = &self.gate {
            let _permit = g.acquire().await;
        }
        *self.running.lock().unwrap().get_mut(&key).unwrap() -= 1;
        if self.panic_threads.contains(&request.thread_id) {
            panic!("processor bug for {}", request.thread_id);
        }
        if self.fail_threads.contains(&request.thread_id) {
            return Err(UpdaterError::Storage(deermem_core::StorageError::corrupt(
                "disk on fire",
            )));
        }
        Ok(UpdateOutcome {
            status: UpdateStatus::NoChange,
            origin: None,
            metrics: None,
            report: None,
            attempts: 1,
        })
    }
}

fn cfg(debounce_secs: u64, depth: u64) -> QueueConfig {
    QueueConfig {
        debounce: Duration::from_secs(debounce_secs),
        max_depth: depth,
        max_concurrency: 1,
        max_user_bytes: 0,
        max_total_bytes: 0,
    }
}

fn item(thread: &str, user: Option<&str>, agent: Option<&str>, text: &str) -> UpdateRequest {
    UpdateRequest {
        thread_id: thread.into(),
        messages: vec![
            h(&format!("{thread}-{text}"), text),
            a(&format!("{thread}-{text}-a"), "ok"),
        ],
        user: user.map(|u| UserId::new(u).unwrap()),
        agent: AgentName::resolve(agent).unwrap(),
        trace_id: None,
        bypass_watermark: false,
        signals: SignalSet::new(),
        turns: Vec::new(),
    }
}

fn with_signal(mut r: UpdateRequest, s: Signal) -> UpdateRequest {
    r.signals.insert(s);
    r
}

async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

fn queue(rec: &Arc<Recorder>, c: QueueConfig) -> UpdateQueue {
    UpdateQueue::new(rec.clone(), c).unwrap()
}

#[tokio::test(start_paused = true)]
async fn coalescing_keeps_the_latest_messages_and_unions_signals() {
    let rec = Arc::new(Recorder::default());
    let q = queue(&rec, cfg(30, 0));
    q.add(with_signal(
        item("t1", Some("u1"), None, "first"),
        Signal::Correction,
    ))
    .unwrap();
    q.add(with_signal(
        item("t1", Some("u1"), None, "second"),
        Signal::Reinforcement,
    ))
    .unwrap();
    let mut third = item("t1", Some("u1"), None, "third");
    third.trace_id = Some("trace-3".into());
    q.add(third).unwrap();
    assert_eq!(q.pending_count(), 1);
    assert!(q.flush(Duration::from_secs(5)).await);
    let seen = rec.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].messages[0].text(), "third");
    assert!(seen[0].signals.contains(Signal::Correction));
    assert!(seen[0].signals.contains(Signal::Reinforcement));
    assert_eq!(seen[0].trace_id.as_deref(), Some("trace-3"));
    assert_eq!(
        seen[0].user.as_ref().unwrap().as_str(),
        "u1",
        "user captured at enqueue"
    );
    assert!(!seen[0].bypass_watermark);
    assert_eq!(q.stats().coalesced, 2);
}

#[tokio::test(start_paused = true)]
async fn different_agents_and_users_stay_separate() {
    let rec = Arc::new(Recorder::default());
    let q = queue(&rec, cfg(30, 0));
    q.add(item("t1", Some("u1"), Some("coder"), "x")).unwrap();
    q.add(item("t1", Some("u1"), Some("writer"), "y")).unwrap();
    q.add(item("t1", Some("u2"), Some("coder"), "z")).unwrap();
    q.add(item("t1", Some("u1"), Some("CODER"), "x2")).unwrap();
    assert_eq!(q.pending_count(), 3);
    assert!(q.flush(Duration::from_secs(5)).await);
    let seen = rec.seen.lock().unwrap().clone();
    let got: Vec<(String, String, String)> = seen
        .iter()
        .map(|r| {
            (
                r.user.as_ref().unwrap().as_str().to_owned(),
                r.agent.as_str().to_owned(),
                r.messages[0].text(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("u1".to_owned(), "writer".to_owned(), "y".to_owned()),
            ("u2".to_owned(), "coder".to_owned(), "z".to_owned()),
            ("u1".to_owned(), "coder".to_owned(), "x2".to_owned()),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn one_busy_thread_does_not_delay_another() {
    let rec = Arc::new(Recorder::default());
    let q = queue(&rec, cfg(30, 0));
    q.add(item("quiet", None, None, "hello")).unwrap();
    // The busy thread adds a turn every 10 s; the global timer of the reference would never
    // have fired.
    for i in 0..5 {
        tokio::time::advance(Duration::from_secs(10)).await;
        settle().await;
        q.add(item("busy", None, None, &format!("turn {i}")))
            .unwrap();
        settle().await;
    }
    assert_eq!(rec.threads(), vec!["quiet"]);
    assert_eq!(q.pending_count(), 1, "busy is still debouncing");
    tokio::time::advance(Duration::from_secs(31)).await;
    settle().await;
    assert_eq!(rec.threads(), vec!["quiet", "busy"]);
    assert_eq!(rec.seen.lock().unwrap()[1].messages[0].text(), "turn 4");
}

#[tokio::test(start_paused = true)]
async fn emergency_items_run_at_once_beside_pending_normal_items() {
    let rec = Arc::new(Recorder::default());
    let q = queue(&rec, cfg(30, 0));
    q.add(item("t1", None, None, "normal")).unwrap();
    q.add_nowait(item("t1", None, None, "emergency")).unwrap();
    settle().await;
    let seen = rec.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert!(seen[0].bypass_watermark);
    assert_eq!(seen[0].messages[0].text(), "emergency");
    assert_eq!(
        q.pending_count(),
        1,
        "the normal item still waits for its debounce"
    );
    tokio::time::advance(Duration::from_secs(31)).await;
    settle().await;
    assert_eq!(rec.seen.lock().unwrap().len(), 2);
    assert!(!rec.seen.lock().unwrap()[1].bypass_watermark);
}

#[tokio::test(start_paused = true)]
async fn backpressure_refuses_only_plain_new_conversations() {
    let rec = Arc::new(Recorder::default());
    let q = queue(&rec, cfg(30, 1));
    q.add(item("t1", None, None, "a")).unwrap();
    let err = q.add(item("t2", None, None, "b")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "memory update queue is full (depth 1 >= 1); non-signal update for thread t2 rejected"
    );
    assert!(matches!(
        err,
        QueueError::Full {
            depth: 1,
            max: 1,
            ..
        }
    ));
    q.add(item("t1", None, None, "a2")).unwrap(); // same conversation coalesces
    q.add(with_signal(item("t3", None, None, "c"), Signal::Correction))
        .unwrap();
    q.add_nowait(item("t4", None, None, "d")).unwrap();
    assert_eq!(q.stats().rejected, 1);
    assert!(q.flush(Duration::from_secs(5)).await);
    let mut threads = rec.threads();
    threads.sort();
    assert_eq!(threads, vec!["t1", "t3", "t4"]);
    let unlimited = queue(&rec, cfg(30, 0));
    for i in 0..50 {
        unlimited
            .add(item(&format!("x{i}"), None, None, "m"))
            .unwrap();
    }
    assert_eq!(unlimited.pending_count(), 50);
}

#[tokio::test(start_paused = true)]
async fn flush_drains_sequentially_and_reports_success() {
    let rec = Arc::new(Recorder::default());
    let q = queue(&rec, cfg(30, 0));
    assert!(
        q.flush(Duration::from_secs(1)).await,
        "an empty queue is drained"
    );
    for t in ["a", "b", "c"] {
        q.add(item(t, None, None, "m")).unwrap();
    }
    assert!(q.flush(Duration::from_secs(5)).await);
    assert_eq!(rec.threads(), vec!["a", "b", "c"]);
    assert_eq!(q.pending_count(), 0);
    assert!(!q.is_processing());
    assert_eq!(q.stats().succeeded, 3);
}

#[tokio::test(start_paused = true)]
async fn flush_returns_false_when_work_outlives_the_budget() {
    let gate = Arc::new(Semaphore::new(0));
    let rec = Arc::new(Recorder {
        gate: Some(gate.clone()),
        ..Recorder::default()
    });
    let q = queue(&rec, cfg(30, 0));
    q.add(item("slow", None, None, "m")).unwrap();
    q.add(item("next", None, None, "m")).unwrap();
    assert!(!q.flush(Duration::from_secs(1)).await);
    assert!(q.is_processing(), "the drain keeps running");
    assert_eq!(q.pending_count(), 1);
    // Once the slow item is let through, a new flush completes.
    gate.add_permits(10);
    assert!(q.shutdown_flush(Duration::from_secs(5)).await);
    assert_eq!(rec.threads(), vec!["slow", "next"]);
    // After the shutdown drain, new items are processed without debounce.
    q.add(item("late", None, None, "m")).unwrap();
    settle().await;
    assert_eq!(rec.threads().last().unwrap(), "late");
}

#[tokio::test(start_paused = true)]
async fn errors_and_panics_never_kill_the_queue() {
    let rec = Arc::new(Recorder {
        fail_threads: vec!["bad".into()],
        panic_threads: vec!["boom".into()],
        ..Recorder::default()
    });
    let q = queue(&rec, cfg(1, 0));
    for t in ["bad", "boom", "good"] {
        q.add(item(t, None, None, "m")).unwrap();
    }
    assert!(q.flush(Duration::from_secs(5)).await);
    let s = q.stats();
    assert_eq!((s.failed, s.panicked, s.succeeded), (1, 1, 1));
    q.add(item("after", None, None, "m")).unwrap();
    assert!(q.flush(Duration::from_secs(5)).await);
    assert_eq!(rec.threads(), vec!["bad", "boom", "good", "after"]);
}

#[tokio::test(start_paused = true)]
async fn one_conversation_never_runs_twice_at_once() {
    let gate = Arc::new(Semaphore::new(0));
    let rec = Arc::new(Recorder {
        gate: Some(gate.clone()),
        ..Recorder::default()
    });
    let q = queue(
        &rec,
        QueueConfig {
            max_concurrency: 4,
            max_user_bytes: 0,
            max_total_bytes: 0,
            ..cfg(30, 0)
        },
    );
    q.add_nowait(item("t1", None, None, "e1")).unwrap();
    settle().await;
    q.add_nowait(item("t1", None, None, "e2")).unwrap();
    q.add_nowait(item("t2", None, None, "other")).unwrap();
    settle().await;
    // t2 runs beside t1, but the second t1 item waits.
    assert_eq!(rec.threads(), vec!["t1", "t2"]);
    gate.add_permits(10);
    assert!(q.flush(Duration::from_secs(5)).await);
    assert_eq!(rec.threads(), vec!["t1", "t2", "t1"]);
    assert!(!*rec.overlap.lock().unwrap());
}

#[tokio::test(start_paused = true)]
async fn clear_and_close() {
    let rec = Arc::new(Recorder::default());
    let q = queue(&rec, cfg(30, 0));
    q.add(item("t1", None, None, "m")).unwrap();
    q.add(item("t2", None, None, "m")).unwrap();
    assert_eq!(q.clear(), 2);
    assert!(q.flush(Duration::from_secs(1)).await);
    assert!(rec.threads().is_empty());
    q.close();
    assert_eq!(q.add(item("t3", None, None, "m")), Err(QueueError::Closed));
    q.flush_now();
}

#[test]
fn a_queue_needs_a_runtime() {
    let rec = Arc::new(Recorder::default());
    assert!(matches!(
        UpdateQueue::new(rec, cfg(30, 0)),
        Err(QueueError::NoRuntime)
    ));
}

fn byte_cfg(user: u64, total: u64) -> QueueConfig {
    QueueConfig {
        max_user_bytes: user,
        max_total_bytes: total,
        ..cfg(30, 0)
    }
}

/// An item of about `kib` KiB of user text, with a signal (signals bypass the depth limit,
/// never the byte limits).
fn big(thread: &str, user: &str, kib: usize) -> UpdateRequest {
    with_signal(
        item(thread, Some(user), None, &"x".repeat(kib * 1024)),
        Signal::Preference,
    )
}

#[tokio::test(start_paused = true)]
async fn pending_bytes_are_bounded_per_user_and_in_total() {
    let rec = Arc::new(Recorder::default());
    let one = deermem_engine::request_bytes(&big("t0", "u1", 100));
    // The text, counted three times (`item` repeats it in the two message ids), and a little
    // for the structures around it.
    assert!(one > 300 * 1024 && one < 301 * 1024, "{one}");
    // Room for two items of a user, three in total.
    let q = queue(&rec, byte_cfg(2 * one + one / 2, 3 * one + one / 2));
    q.add(big("t1", "u1", 100)).unwrap();
    q.add(big("t2", "u1", 100)).unwrap();
    let err = q.add(big("t3", "u1", 100)).unwrap_err();
    assert!(
        matches!(
            &err,
            QueueError::TooManyBytes { scope: deermem_core::OverloadScope::User, pending, item, .. }
                if *pending == 2 * one && *item == one
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("for this user"), "{err}");
    // The emergency path is bounded too.
    assert!(matches!(
        q.add_nowait(big("t3", "u1", 100)),
        Err(QueueError::TooManyBytes { .. })
    ));
    // Another user fits once more, then everyone's limit is reached.
    q.add(big("t4", "u2", 100)).unwrap();
    let err = q.add(big("t5", "u3", 100)).unwrap_err();
    assert!(
        matches!(
            &err,
            QueueError::TooManyBytes {
                scope: deermem_core::OverloadScope::Global,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("in total"), "{err}");
    assert_eq!(q.stats().rejected, 3);
    assert_eq!(
        q.pending_bytes(Some(&UserId::new("u1").unwrap())),
        (2 * one, 3 * one)
    );
    // A later turn of a pending conversation replaces it: only the difference counts.
    q.add(big("t1", "u1", 100)).unwrap();
    assert_eq!(q.pending_bytes(None).1, 3 * one);
    // Processing releases the bytes when each item ends.
    assert!(q.flush(Duration::from_secs(5)).await);
    assert_eq!(q.pending_bytes(Some(&UserId::new("u1").unwrap())), (0, 0));
    q.add(big("t5", "u3", 100)).unwrap();
    q.add(big("t6", "u1", 100)).unwrap();
    // Dropping pending items releases them too.
    assert_eq!(q.clear(), 2);
    assert_eq!(q.pending_bytes(None).1, 0);
    for i in 0..3 {
        q.add(big(&format!("r{i}"), &format!("v{i}"), 100)).unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn an_item_being_processed_still_counts_until_it_ends() {
    let gate = Arc::new(Semaphore::new(0));
    let rec = Arc::new(Recorder {
        gate: Some(gate.clone()),
        ..Recorder::default()
    });
    let one = deermem_engine::request_bytes(&big("t0", "u1", 64));
    let q = queue(&rec, byte_cfg(one, 0));
    q.add_nowait(big("t1", "u1", 64)).unwrap();
    settle().await;
    assert_eq!(rec.threads(), vec!["t1"], "the item is being processed");
    assert_eq!(q.pending_count(), 0);
    assert!(matches!(
        q.add(big("t2", "u1", 64)),
        Err(QueueError::TooManyBytes { .. })
    ));
    gate.add_permits(10);
    assert!(q.flush(Duration::from_secs(5)).await);
    q.add(big("t2", "u1", 64)).unwrap();
    // Unlimited (0) refuses nothing.
    let free = queue(&rec, byte_cfg(0, 0));
    for i in 0..20 {
        free.add(big(&format!("f{i}"), "u1", 64)).unwrap();
    }
}
