//! The durable turn path of the manager over the file storage and the file turn journal: a turn
//! is in the journal when `add` returns and gone once committed; a failing model is retried and
//! then dead-lettered, and `retry` applies the turn; a second manager over the same root replays
//! what the first one accepted but never processed; a turn the queue cannot take (at its depth)
//! is kept in the journal and applied later, never acknowledged and lost; `queue.durable: false`
//! writes no journal; a turn replayed after its commit (its done-mark lost in a crash) is
//! recognised by its id in the facts' sources and not extracted again.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../deermem-updater/tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{a, answer, clock, h, labelled};
use deermem_core::ports::turn_journal::{NewTurn, TurnFilter, TurnState};
use deermem_core::ports::{AddRequest, MemoryManager, MemoryScope, TurnJournal};
use deermem_core::{AgentName, LlmError, UserId};
use deermem_engine::{DeerMemManager, DeerMemParts, QueueConfig};
use deermem_storage_file::{
    FileStorage, FileStorageConfig, FileTurnJournal, FileTurnJournalOptions,
};
use deermem_testkit::llm::{Scripted, ScriptedLlm};
use deermem_updater::DeerMemConfig;

fn alice() -> UserId {
    UserId::new("alice").unwrap()
}

fn request(thread: &str, text: &str) -> AddRequest {
    AddRequest {
        thread_id: thread.into(),
        messages: vec![
            h(&format!("{thread}-1"), text),
            a(&format!("{thread}-2"), "noted"),
        ],
        scope: MemoryScope {
            user: Some(alice()),
            agent: None,
        },
        trace_id: Some(format!("trace-{thread}")),
    }
}

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// The root's journal; a manager just dropped may still hold its lock for a moment (its
    /// worker task is aborted asynchronously), so a refused open is tried again.
    async fn journal(&self) -> Arc<dyn TurnJournal> {
        for _ in 0..500 {
            match FileTurnJournal::open_in_root(self.dir.path(), FileTurnJournalOptions::default())
            {
                Ok(j) => return Arc::new(j),
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
        panic!("the turn journal stayed locked");
    }

    fn manager(
        &self,
        llm: Arc<ScriptedLlm>,
        journal: Option<Arc<dyn TurnJournal>>,
        cfg: DeerMemConfig,
        recover: bool,
    ) -> DeerMemManager {
        self.manager_with_depth(llm, journal, cfg, recover, 100)
    }

    fn manager_with_depth(
        &self,
        llm: Arc<ScriptedLlm>,
        journal: Option<Arc<dyn TurnJournal>>,
        cfg: DeerMemConfig,
        recover: bool,
        max_depth: u64,
    ) -> DeerMemManager {
        let clock = clock();
        let storage =
            FileStorage::new(FileStorageConfig::new(self.dir.path()), clock.clone(), None).unwrap();
        let mut parts = DeerMemParts::new(cfg, Arc::new(storage), clock);
        parts.llm = Some(llm);
        parts.turns = journal;
        parts.recover_turns = recover;
        parts.queue = Some(QueueConfig {
            debounce: Duration::from_secs(300),
            max_depth,
            max_concurrency: 1,
            max_user_bytes: 0,
            max_total_bytes: 0,
        });
        DeerMemManager::new(parts).unwrap()
    }
}

fn fast_retries(max_attempts: u32) -> DeerMemConfig {
    let mut cfg = DeerMemConfig::default();
    cfg.queue.retry.max_attempts = max_attempts;
    cfg.queue.retry.initial_backoff_ms = 1;
    cfg.queue.retry.max_backoff = 1;
    cfg
}

async fn facts(m: &DeerMemManager) -> Vec<String> {
    let doc = m
        .storage()
        .load(Some(&alice()), Some(&AgentName::default_bucket()))
        .await
        .unwrap();
    doc.facts.iter().map(|f| f.content.clone()).collect()
}

/// Waits until `cond` holds, polling (a guard against a hang, not a speed assertion).
async fn eventually(mut cond: impl AsyncFnMut() -> bool) {
    for _ in 0..2000 {
        if cond().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the condition never held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accepted_turn_is_journaled_until_its_commit() {
    let env = Env::new();
    let journal = env.journal().await;
    let llm = Arc::new(ScriptedLlm::always(answer(&[labelled(
        "User prefers tea",
        0.9,
    )])));
    let m = env.manager(llm, Some(journal.clone()), DeerMemConfig::default(), false);
    m.add(request("t1", "I prefer tea")).await.unwrap();
    let pending = journal.list(&TurnFilter::default()).await.unwrap();
    assert_eq!(
        pending.len(),
        1,
        "the turn is in the journal when add returns"
    );
    let item = &pending[0];
    assert_eq!(item.identity.thread_id, "t1");
    assert_eq!(item.identity.trace_id.as_deref(), Some("trace-t1"));
    assert_eq!(item.identity.user, Some(alice()));
    assert_eq!(item.messages.len(), 2);
    assert!(item.identity.signals.iter().any(|s| s == "preference"));
    assert!(m.shutdown_flush(Duration::from_secs(30)).await);
    assert!(
        journal
            .list(&TurnFilter::default())
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(facts(&m).await, ["User prefers tea"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_retried_then_dead_lettered_and_retry_applies_them() {
    let env = Env::new();
    let journal = env.journal().await;
    let llm = Arc::new(ScriptedLlm::default());
    for _ in 0..3 {
        llm.push(Scripted::Fail(LlmError::Server {
            status: 503,
            message: "down".into(),
        }));
    }
    llm.push(Scripted::Reply(answer(&[labelled(
        "User prefers tea",
        0.9,
    )])));
    let m = env.manager(llm.clone(), Some(journal.clone()), fast_retries(3), false);
    m.add_nowait(request("t1", "I prefer tea")).await.unwrap();
    eventually(async || {
        journal
            .list(&TurnFilter::default())
            .await
            .unwrap()
            .first()
            .is_some_and(|i| i.state == TurnState::Dead)
    })
    .await;
    assert_eq!(llm.calls(), 3, "three attempts, then the dead letter");
    let dead = journal.list(&TurnFilter::default()).await.unwrap();
    assert_eq!(dead[0].attempts, 3);
    assert!(
        dead[0].last_error.as_deref().unwrap().contains("503"),
        "{dead:?}"
    );
    assert!(facts(&m).await.is_empty());
    // An operator retries it: it is pending again and applied once queued.
    journal.retry(dead[0].id()).await.unwrap().unwrap();
    assert_eq!(m.recover_turns().await.unwrap(), 1);
    eventually(async || {
        journal
            .list(&TurnFilter::default())
            .await
            .unwrap()
            .is_empty()
    })
    .await;
    assert_eq!(facts(&m).await, ["User prefers tea"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_manager_replays_what_the_first_accepted() {
    let env = Env::new();
    {
        let journal = env.journal().await;
        let llm = Arc::new(ScriptedLlm::default());
        let m = env.manager(llm.clone(), Some(journal), DeerMemConfig::default(), false);
        m.add(request("t1", "I prefer tea")).await.unwrap();
        m.add(request("t2", "I prefer green tea")).await.unwrap();
        // Gone without a flush (as a killed process would be): nothing was processed.
        assert_eq!(llm.calls(), 0);
    }
    let journal = env.journal().await;
    assert_eq!(journal.list(&TurnFilter::default()).await.unwrap().len(), 2);
    let llm = Arc::new(ScriptedLlm::always(answer(&[
        labelled("User prefers tea", 0.9),
        labelled("User prefers green tea", 0.9),
    ])));
    let m = env.manager(llm, Some(journal.clone()), DeerMemConfig::default(), true);
    m.turns_recovered().await;
    assert!(m.shutdown_flush(Duration::from_secs(30)).await);
    assert!(
        journal
            .list(&TurnFilter::default())
            .await
            .unwrap()
            .is_empty()
    );
    let mut got = facts(&m).await;
    got.sort();
    // Both replays propose both facts; the dedup gate keeps each once.
    assert_eq!(got, ["User prefers green tea", "User prefers tea"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_durable_writes_no_journal() {
    let env = Env::new();
    let journal = env.journal().await;
    let llm = Arc::new(ScriptedLlm::always(answer(&[labelled(
        "User prefers tea",
        0.9,
    )])));
    let mut cfg = DeerMemConfig::default();
    cfg.queue.durable = false;
    let m = env.manager(llm, Some(journal.clone()), cfg, false);
    m.add(request("t1", "I prefer tea")).await.unwrap();
    assert!(
        journal
            .list(&TurnFilter::default())
            .await
            .unwrap()
            .is_empty()
    );
    assert!(m.turn_journal().is_none());
    assert!(m.shutdown_flush(Duration::from_secs(30)).await);
    assert_eq!(facts(&m).await, ["User prefers tea"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_refused_for_queue_depth_is_kept_in_the_journal_and_applied_later() {
    let env = Env::new();
    let journal = env.journal().await;
    let llm = Arc::new(ScriptedLlm::always(answer(&[labelled(
        "User prefers tea",
        0.9,
    )])));
    let m = env.manager_with_depth(
        llm,
        Some(journal.clone()),
        DeerMemConfig::default(),
        false,
        1,
    );
    // No signal in either turn, so the depth limit applies to the second conversation.
    m.add(request("t1", "We talked about the weather today"))
        .await
        .unwrap();
    m.add(request("t2", "Then we talked about trains"))
        .await
        .unwrap();
    let pending = journal.list(&TurnFilter::default()).await.unwrap();
    let threads: Vec<_> = pending
        .iter()
        .map(|i| i.identity.thread_id.as_str())
        .collect();
    assert_eq!(
        threads,
        ["t1", "t2"],
        "both acknowledged turns are in the journal, the one the queue refused included"
    );
    // The first drains; the refused one is still pending on disk, not lost.
    assert!(m.shutdown_flush(Duration::from_secs(30)).await);
    let left = journal.list(&TurnFilter::default()).await.unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].identity.thread_id, "t2");
    drop(m);
    drop(journal);
    // The next start (or claim round) queues it and applies it.
    let llm = Arc::new(ScriptedLlm::always(answer(&[labelled(
        "User lives in Lyon",
        0.9,
    )])));
    let journal = env.journal().await;
    let m = env.manager(
        llm.clone(),
        Some(journal.clone()),
        DeerMemConfig::default(),
        true,
    );
    m.turns_recovered().await;
    assert!(m.shutdown_flush(Duration::from_secs(30)).await);
    assert!(
        journal
            .list(&TurnFilter::default())
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(llm.calls(), 1, "the kept turn was extracted once");
    let mut got = facts(&m).await;
    got.sort();
    assert_eq!(got, ["User lives in Lyon", "User prefers tea"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_replayed_after_its_commit_is_recognised_by_its_id_and_not_extracted_again() {
    let env = Env::new();
    let item = {
        let journal = env.journal().await;
        let llm = Arc::new(ScriptedLlm::always(answer(&[labelled(
            "User prefers tea",
            0.9,
        )])));
        let m = env.manager(
            llm.clone(),
            Some(journal.clone()),
            DeerMemConfig::default(),
            false,
        );
        m.add(request("t1", "I prefer tea")).await.unwrap();
        let item = journal
            .list(&TurnFilter::default())
            .await
            .unwrap()
            .remove(0);
        assert!(m.shutdown_flush(Duration::from_secs(30)).await);
        assert_eq!(llm.calls(), 1);
        let doc = m
            .storage()
            .load(Some(&alice()), Some(&AgentName::default_bucket()))
            .await
            .unwrap();
        let recorded: Vec<&str> = doc.facts[0].source.turn_ids().collect();
        assert_eq!(recorded, [item.id().as_str()], "the fact records its turn");
        item
    };
    // The crash between the commit and the done-mark: the journal holds the committed turn.
    let journal = env.journal().await;
    journal
        .append(NewTurn {
            identity: item.identity.clone(),
            messages: item.messages.clone(),
            accepted_at: item.accepted_at,
        })
        .await
        .unwrap();
    // The model would phrase the same fact differently this time (the content dedup gate would
    // let that through); the replay must not ask it at all.
    let rephrasing = Arc::new(ScriptedLlm::always(answer(&[labelled(
        "The user likes drinking tea",
        0.9,
    )])));
    let m = env.manager(
        rephrasing.clone(),
        Some(journal.clone()),
        DeerMemConfig::default(),
        true,
    );
    m.turns_recovered().await;
    assert!(m.shutdown_flush(Duration::from_secs(30)).await);
    assert_eq!(
        rephrasing.calls(),
        0,
        "an applied turn is not extracted again"
    );
    assert_eq!(facts(&m).await, ["User prefers tea"]);
    assert!(
        journal
            .list(&TurnFilter::default())
            .await
            .unwrap()
            .is_empty(),
        "the replayed turn is marked done"
    );
}
