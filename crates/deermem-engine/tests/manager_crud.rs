//! Manager management operations, as the reference's manager and router tests pin them: fact
//! CRUD with validation, capacity and revision rules, the snapshot-retry semantics, import as a
//! replace, clear, legacy migration on read, tool-mode injection, and `ingest_now` reports.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod manager_support;

use deermem_core::ports::MemoryManagerExt as _;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use deermem_core::ports::{
    ContextRequest, FactPatch, MemoryManager, MemoryScope, MemoryStorage, NewFact,
};
use deermem_core::prelude::*;
use deermem_core::{
    AgentName, InvalidInputCode, LlmError, ManagerError, MemoryMode, PublicMemoryDocument,
    SummaryPatch,
};
use deermem_engine::{DeerMemManager, IngestStatus, RemovalReason};
use deermem_testkit::llm::{Scripted, ScriptedLlm};
use deermem_testkit::storage::InMemoryStorage;
use deermem_updater::DeerMemConfig;
use deermem_updater::{ProposalKind, RejectReason};
use manager_support::{
    Competitor, HookedStorage, agent, answer, clock, competing_create, config, file_env,
    file_storage, hooked_manager, ids, labelled, markdown_files, memory_manager, parts, scope,
    search, turn, user,
};
use serde_json::{Value, json};

fn new_fact(content: &str, category: &str, confidence: f64) -> NewFact {
    NewFact {
        content: content.into(),
        category: category.into(),
        confidence,
    }
}

fn code_of<T: std::fmt::Debug>(r: Result<T, ManagerError>) -> InvalidInputCode {
    match r {
        Err(ManagerError::InvalidInput { code, .. }) => code,
        other => panic!("expected invalid input, got {other:?}"),
    }
}

fn contents(doc: &PublicMemoryDocument) -> Vec<String> {
    let mut c: Vec<String> = doc.facts.iter().map(|f| f.content.clone()).collect();
    c.sort();
    c
}

fn hooked_file(cfg: DeerMemConfig) -> (Arc<DeerMemManager>, Arc<HookedStorage>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let clock = clock();
    let storage = file_storage(dir.path(), clock.clone());
    let hooked = Arc::new(HookedStorage::new(Arc::new(storage)));
    (hooked_manager(cfg, hooked.clone(), clock), hooked, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_validates_and_stores_a_manual_fact() {
    let env = file_env(config(), None);
    let m = &env.manager;
    let s = scope("alice", None);
    let (doc, id) = m
        .create_fact(
            new_fact("  User prefers DARK mode \n", "preference", 0.88),
            s.clone(),
        )
        .await
        .unwrap();
    let id = id.unwrap();
    assert!(id.starts_with("fact_") && id.len() == 13, "{id}");
    let f = &doc.facts[0];
    assert_eq!(
        (
            f.content.as_str(),
            f.category.as_str(),
            f.confidence,
            f.source.as_str()
        ),
        ("User prefers DARK mode", "preference", 0.88, "manual")
    );
    assert_eq!(f.revision, Some(1));
    assert_eq!(f.created_at, "2026-06-01T00:00:00Z");
    assert_eq!(
        doc,
        m.get_memory(s.clone()).await.unwrap(),
        "a fresh full view"
    );
    // Stable validation codes; nothing stored on failure.
    assert_eq!(
        code_of(m.create_fact(NewFact::new(" \t\n"), s.clone()).await),
        InvalidInputCode::Content
    );
    for c in [-0.1, 1.1, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        assert_eq!(
            code_of(
                m.create_fact(new_fact("fine", "context", c), s.clone())
                    .await
            ),
            InvalidInputCode::Confidence,
            "{c}"
        );
    }
    assert_eq!(
        code_of(
            m.create_fact(
                new_fact("  user prefers dark MODE ", "context", 0.5),
                s.clone()
            )
            .await
        ),
        InvalidInputCode::DuplicateFact
    );
    // A blank category is `context`.
    let (doc, id2) = m
        .create_fact(new_fact("Second fact", "   ", 0.5), s.clone())
        .await
        .unwrap();
    let f = doc
        .facts
        .iter()
        .find(|f| Some(&f.id) == id2.as_ref())
        .unwrap();
    assert_eq!(f.category, "context");
    assert_eq!(m.get_memory(s).await.unwrap().facts.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_trims_to_max_facts_by_confidence() {
    let (m, _storage, _clock) = memory_manager(
        DeerMemConfig {
            max_facts: 2,
            ..config()
        },
        None,
    );
    let s = scope("u", None);
    m.create_fact(new_fact("keep", "context", 0.95), s.clone())
        .await
        .unwrap();
    m.create_fact(new_fact("drop", "context", 0.2), s.clone())
        .await
        .unwrap();
    let (doc, id) = m
        .create_fact(new_fact("new", "context", 0.8), s.clone())
        .await
        .unwrap();
    assert!(id.is_some());
    assert_eq!(contents(&doc), vec!["keep", "new"]);
    assert_eq!(
        contents(&m.get_memory(s).await.unwrap()),
        vec!["keep", "new"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_evicted_at_once_returns_none_and_writes_the_audit() {
    let env = file_env(
        DeerMemConfig {
            max_facts: 10,
            ..config()
        },
        None,
    );
    let m = &env.manager;
    let s = scope("alice", None);
    for i in 0..10 {
        m.create_fact(
            new_fact(&format!("solid fact {i}"), "context", 0.9),
            s.clone(),
        )
        .await
        .unwrap();
    }
    let (doc, id) = m
        .create_fact(new_fact("weak fact", "context", 0.1), s.clone())
        .await
        .unwrap();
    assert_eq!(id, None);
    assert_eq!(doc.facts.len(), 10);
    assert!(!contents(&doc).contains(&"weak fact".to_owned()));
    let audit = env
        .root()
        .join("users/alice/agents/__default__/.metadata/eviction-audit.json");
    let text = std::fs::read_to_string(audit).unwrap();
    assert!(
        !text.contains("content") && !text.contains("weak fact"),
        "{text}"
    );
    let v: Value = serde_json::from_str(&text).unwrap();
    let events = v.as_array().or_else(|| v["events"].as_array()).unwrap();
    let evicted = events[0]["evicted"][0]["factId"].as_str().unwrap();
    assert!(!ids(&doc).contains(&evicted.to_owned()));
}

/// A create refused by capacity changes nothing, even in a bucket that is already over the
/// cap (`max_facts` lowered after the facts were stored): the stored facts stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_refused_by_capacity_evicts_nothing_from_an_over_full_bucket() {
    let env = file_env(
        DeerMemConfig {
            max_facts: 20,
            ..config()
        },
        None,
    );
    let s = scope("alice", None);
    for i in 0..18 {
        env.manager
            .create_fact(
                new_fact(
                    &format!("solid fact {i}"),
                    "context",
                    0.5 + f64::from(i) / 100.0,
                ),
                s.clone(),
            )
            .await
            .unwrap();
    }
    let before = markdown_files(&env.root());
    assert_eq!(before.len(), 18);
    // The same root under a configuration with a smaller cap.
    let lowered = DeerMemManager::new(parts(
        DeerMemConfig {
            max_facts: 10,
            ..config()
        },
        Arc::new(env.storage.clone()),
        env.clock.clone(),
        None,
    ))
    .unwrap();
    let (doc, id) = lowered
        .create_fact(new_fact("another low", "context", 0.2), s.clone())
        .await
        .unwrap();
    assert_eq!(id, None, "the new fact is the one capacity drops");
    assert_eq!(doc.facts.len(), 18, "nothing was evicted for it");
    assert_eq!(markdown_files(&env.root()), before);
    assert_eq!(lowered.get_memory(s.clone()).await.unwrap().facts.len(), 18);
    assert!(
        !env.root()
            .join("users/alice/agents/__default__/.metadata/eviction-audit.json")
            .exists(),
        "no eviction happened, so none is audited"
    );
    // A fact that survives the cap is stored, and the trim it causes is part of that success.
    let (doc, id) = lowered
        .create_fact(new_fact("a strong fact", "context", 0.99), s.clone())
        .await
        .unwrap();
    assert!(id.is_some());
    assert_eq!(doc.facts.len(), 10);
    assert!(contents(&doc).contains(&"a strong fact".to_owned()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_recomputes_after_a_competing_create() {
    let (m, hooked, _dir) = hooked_file(config());
    hooked.compete(competing_create(
        "alice",
        "__default__",
        "fact_rival",
        "Rival fact",
        0.7,
    ));
    let (doc, id) = m
        .create_fact(NewFact::new("My fact"), scope("alice", None))
        .await
        .unwrap();
    assert!(id.is_some());
    assert_eq!(contents(&doc), vec!["My fact", "Rival fact"]);
    assert_eq!(doc, m.get_memory(scope("alice", None)).await.unwrap());
    assert_eq!(
        hooked.applies.load(Ordering::SeqCst),
        2,
        "one conflict, one retry"
    );
}

/// A write without an expected revision keeps recomputing while other writers (other
/// processes on the same root) win the race, more times than the reference's three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_outlasts_a_run_of_competing_writers() {
    let (m, hooked, _dir) = hooked_file(config());
    for i in 0..5 {
        hooked.compete(competing_create(
            "alice",
            "__default__",
            &format!("fact_rival{i}"),
            &format!("Rival fact {i}"),
            0.7,
        ));
    }
    let (doc, id) = m
        .create_fact(NewFact::new("My fact"), scope("alice", None))
        .await
        .unwrap();
    assert!(id.is_some());
    assert_eq!(doc.facts.len(), 6);
    assert_eq!(
        hooked.applies.load(Ordering::SeqCst),
        6,
        "five losses, then a win"
    );
}

/// A competing write of the same fact at `revision`, committed between the manager's read and
/// its write.
fn competing_edit(id: &str, revision: u64, content: &str, confidence: f64) -> Competitor {
    let draft = json!({"id": id, "content": content, "category": "context", "confidence": confidence, "source": "manual"});
    let id = deermem_core::FactId::new(id).unwrap();
    Competitor {
        user: Some(user("alice")),
        agent: agent("__default__"),
        changes: deermem_core::ChangeSet {
            upserts: vec![deermem_core::FactDraft::try_from(draft).unwrap()],
            upsert_revisions: Some([(id, Some(revision))].into_iter().collect()),
            ..deermem_core::ChangeSet::default()
        },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_and_delete_without_a_revision_retry_a_concurrent_edit_of_the_fact() {
    let (m, hooked, _dir) = hooked_file(config());
    let s = scope("alice", None);
    let (_, id) = m
        .create_fact(new_fact("Drinks tea", "preference", 0.6), s.clone())
        .await
        .unwrap();
    let id = id.unwrap();

    // No revision named: the patch lands on the fresh fact (its confidence from the rival).
    hooked.compete(competing_edit(&id, 1, "Drinks green tea", 0.9));
    let doc = m
        .update_fact(
            &id,
            FactPatch {
                category: Some("knowledge".into()),
                ..FactPatch::default()
            },
            s.clone(),
        )
        .await
        .unwrap();
    let f = &doc.facts[0];
    assert_eq!(
        (f.content.as_str(), f.confidence, f.revision),
        ("Drinks green tea", 0.9, Some(3))
    );
    assert_eq!(f.category_extension.as_deref(), Some("knowledge"));

    // A named revision that a rival made stale is the caller's conflict.
    hooked.compete(competing_edit(&id, 3, "Drinks oolong", 0.9));
    let r = m
        .update_fact(
            &id,
            FactPatch {
                content: Some("Drinks coffee".into()),
                expected_revision: Some(3),
                ..FactPatch::default()
            },
            s.clone(),
        )
        .await;
    assert!(matches!(r, Err(ManagerError::Conflict { .. })), "{r:?}");
    let applies = hooked.applies.load(Ordering::SeqCst);

    // Delete without a revision deletes the fact a rival just edited.
    hooked.compete(competing_edit(&id, 4, "Drinks rooibos", 0.9));
    let doc = m.delete_fact(&id, None, s.clone()).await.unwrap();
    assert!(doc.facts.is_empty());
    assert_eq!(
        hooked.applies.load(Ordering::SeqCst),
        applies + 2,
        "one lost race, one retry"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_of_one_user_through_one_manager_all_succeed() {
    // Sixteen callers create at once for one user (two agents share the user's revision):
    // the manager's writes of one user take turns, so none runs out of retries into a 409.
    let env = file_env(config(), None);
    let mut tasks = Vec::new();
    for i in 0..16 {
        let m = env.manager.clone();
        let agent = if i % 2 == 0 { None } else { Some("coder") };
        tasks.push(tokio::spawn(async move {
            m.create_fact(
                NewFact::new(format!("Parallel fact {i}")),
                scope("alice", agent),
            )
            .await
        }));
    }
    for t in tasks {
        let (_, id) = t.await.unwrap().expect("no create is refused");
        assert!(id.is_some());
    }
    let default = env.manager.get_memory(scope("alice", None)).await.unwrap();
    let coder = env
        .manager
        .get_memory(scope("alice", Some("coder")))
        .await
        .unwrap();
    assert_eq!(default.facts.len() + coder.facts.len(), 16);
    assert_eq!(default.revision, Some(16), "one commit per create");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_facts_is_recomputed_after_a_competing_create() {
    let (m, hooked, _dir) = hooked_file(DeerMemConfig {
        max_facts: 10,
        ..config()
    });
    let s = scope("alice", None);
    for i in 0..9 {
        m.create_fact(
            new_fact(&format!("existing {i}"), "context", 0.9),
            s.clone(),
        )
        .await
        .unwrap();
    }
    hooked.compete(competing_create(
        "alice",
        "__default__",
        "fact_rival",
        "Rival",
        0.95,
    ));
    let (doc, id) = m
        .create_fact(new_fact("newcomer", "context", 0.5), s.clone())
        .await
        .unwrap();
    assert_eq!(
        id, None,
        "the recomputed capacity evicts the least confident new fact"
    );
    let reloaded = m.get_memory(s).await.unwrap();
    assert_eq!(ids(&doc), ids(&reloaded));
    assert_eq!(reloaded.facts.len(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_committed_during_a_conflict_retry_is_rejected() {
    let (m, hooked, _dir) = hooked_file(config());
    hooked.compete(competing_create(
        "alice",
        "__default__",
        "fact_rival",
        "Same Content",
        0.7,
    ));
    let r = m
        .create_fact(NewFact::new("  same content "), scope("alice", None))
        .await;
    assert_eq!(code_of(r), InvalidInputCode::DuplicateFact);
    assert_eq!(
        ids(&m.get_memory(scope("alice", None)).await.unwrap()),
        vec!["fact_rival"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scoped_clear_recomputes_after_a_competing_create() {
    let (m, hooked, _dir) = hooked_file(config());
    let coder = scope("alice", Some("coder"));
    m.create_fact(NewFact::new("a"), coder.clone())
        .await
        .unwrap();
    m.create_fact(NewFact::new("b"), coder.clone())
        .await
        .unwrap();
    m.create_fact(NewFact::new("default fact"), scope("alice", None))
        .await
        .unwrap();
    hooked.compete(competing_create("alice", "coder", "fact_late", "late", 0.7));
    let doc = m.clear_memory(coder.clone()).await.unwrap();
    assert!(doc.facts.is_empty());
    assert!(m.get_memory(coder).await.unwrap().facts.is_empty());
    assert_eq!(
        contents(&m.get_memory(scope("alice", None)).await.unwrap()),
        vec!["default fact"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_changes_only_the_given_fields_of_that_fact() {
    let env = file_env(config(), None);
    let m = &env.manager;
    let s = scope("alice", None);
    let (_, id) = m
        .create_fact(new_fact("Works in Berlin", "context", 0.5), s.clone())
        .await
        .unwrap();
    let (_, other) = m
        .create_fact(NewFact::new("Other fact"), s.clone())
        .await
        .unwrap();
    let (id, other) = (id.unwrap(), other.unwrap());
    env.clock.advance_days(1);
    let doc = m
        .update_fact(
            &id,
            FactPatch {
                content: Some("  Works in Munich ".into()),
                category: Some("identity".into()),
                confidence: Some(0.9),
                expected_revision: None,
            },
            s.clone(),
        )
        .await
        .unwrap();
    let f = doc.facts.iter().find(|f| f.id == id).unwrap();
    assert_eq!(
        (f.content.as_str(), f.category.as_str(), f.confidence),
        ("Works in Munich", "identity", 0.9)
    );
    assert_eq!(f.revision, Some(2));
    assert_eq!(f.created_at, "2026-06-01T00:00:00Z", "createdAt kept");
    assert_eq!(f.updated_at.as_deref(), Some("2026-06-02T00:00:00Z"));
    assert_eq!(f.source, "manual", "source kept");
    assert_eq!(
        f.title.as_deref(),
        Some("Works in Munich"),
        "derived title follows"
    );
    let o = doc.facts.iter().find(|f| f.id == other).unwrap();
    assert_eq!(o.revision, Some(1));
    // Omitted fields are kept; re-sending the same values is not a change.
    let doc = m
        .update_fact(
            &id,
            FactPatch {
                confidence: Some(0.9),
                ..FactPatch::default()
            },
            s.clone(),
        )
        .await
        .unwrap();
    let f = doc.facts.iter().find(|f| f.id == id).unwrap();
    assert_eq!(
        (f.content.as_str(), f.revision),
        ("Works in Munich", Some(2))
    );
    // Validation, missing facts and stale revisions.
    let patch = |content: Option<&str>, confidence: Option<f64>| FactPatch {
        content: content.map(str::to_owned),
        confidence,
        ..FactPatch::default()
    };
    assert_eq!(
        code_of(m.update_fact(&id, patch(Some("  "), None), s.clone()).await),
        InvalidInputCode::Content
    );
    assert_eq!(
        code_of(m.update_fact(&id, patch(None, Some(2.0)), s.clone()).await),
        InvalidInputCode::Confidence
    );
    assert!(matches!(
        m.update_fact("fact_missing", patch(Some("x"), None), s.clone()).await,
        Err(ManagerError::NotFound { ref fact_id }) if fact_id == "fact_missing"
    ));
    assert!(matches!(
        m.update_fact(
            &id,
            FactPatch {
                content: Some("stale".into()),
                expected_revision: Some(1),
                ..FactPatch::default()
            },
            s.clone()
        )
        .await,
        Err(ManagerError::Conflict { .. })
    ));
    let doc = m
        .update_fact(
            &id,
            FactPatch {
                category: Some(" ".into()),
                ..FactPatch::default()
            },
            s.clone(),
        )
        .await
        .unwrap();
    let f = doc.facts.iter().find(|f| f.id == id).unwrap();
    assert_eq!((f.category.as_str(), f.revision), ("context", Some(3)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn category_changes_recompute_the_extension() {
    let (m, _storage, _clock) = memory_manager(config(), None);
    let s = scope("u", None);
    let (doc, id) = m
        .create_fact(new_fact("Knows Kubernetes", "knowledge", 0.9), s.clone())
        .await
        .unwrap();
    let id = id.unwrap();
    assert_eq!(doc.facts[0].category, "other");
    assert_eq!(
        doc.facts[0].category_extension.as_deref(),
        Some("knowledge")
    );
    let set = |c: &str| FactPatch {
        category: Some(c.into()),
        ..FactPatch::default()
    };
    let doc = m
        .update_fact(&id, set("preference"), s.clone())
        .await
        .unwrap();
    assert_eq!(doc.facts[0].category, "preference");
    assert_eq!(doc.facts[0].category_extension, None);
    let doc = m
        .update_fact(&id, set("workflow"), s.clone())
        .await
        .unwrap();
    assert_eq!(doc.facts[0].category, "other");
    assert_eq!(doc.facts[0].category_extension.as_deref(), Some("workflow"));
}

/// An edit that resends the stored category (DeerFlow's edit dialog always sends
/// `{content, category, confidence}`) keeps the category extension.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resending_the_stored_category_keeps_the_extension() {
    let (m, _storage, _clock) = memory_manager(config(), None);
    let s = scope("u", None);
    let (_, id) = m
        .create_fact(new_fact("Plays the cello", "hobby", 0.9), s.clone())
        .await
        .unwrap();
    let id = id.unwrap();
    let doc = m
        .update_fact(
            &id,
            FactPatch {
                content: Some("Plays the cello on weekends".into()),
                category: Some("other".into()),
                confidence: Some(0.8),
                ..FactPatch::default()
            },
            s.clone(),
        )
        .await
        .unwrap();
    assert_eq!(doc.facts[0].content, "Plays the cello on weekends");
    assert_eq!(doc.facts[0].category, "other");
    assert_eq!(doc.facts[0].category_extension.as_deref(), Some("hobby"));
    let block = m
        .get_context(ContextRequest {
            scope: s.clone(),
            thread_id: None,
        })
        .await
        .unwrap();
    assert!(
        block.contains("[hobby | 0.80] Plays the cello on weekends"),
        "{block}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn point_operations_rebase_over_unrelated_commits() {
    let (m, hooked, _dir) = hooked_file(config());
    let s = scope("alice", None);
    let (_, a) = m
        .create_fact(NewFact::new("first"), s.clone())
        .await
        .unwrap();
    let (_, b) = m
        .create_fact(NewFact::new("second"), s.clone())
        .await
        .unwrap();
    hooked.compete(competing_create(
        "alice",
        "__default__",
        "fact_x",
        "unrelated x",
        0.7,
    ));
    m.update_fact(
        &a.unwrap(),
        FactPatch {
            content: Some("first, edited".into()),
            ..FactPatch::default()
        },
        s.clone(),
    )
    .await
    .unwrap();
    hooked.compete(competing_create(
        "alice",
        "__default__",
        "fact_y",
        "unrelated y",
        0.7,
    ));
    let doc = m.delete_fact(&b.unwrap(), None, s.clone()).await.unwrap();
    assert_eq!(
        contents(&doc),
        vec!["first, edited", "unrelated x", "unrelated y"]
    );
    assert!(matches!(
        m.delete_fact("fact_missing", None, s).await,
        Err(ManagerError::NotFound { .. })
    ));
}

async fn set_summaries(storage: &dyn MemoryStorage, u: &str, work: &str, personal: &str) {
    let mut user_children = serde_json::Map::new();
    user_children.insert(
        "workContext".into(),
        json!({"summary": work, "updatedAt": "2026-05-01T00:00:00Z"}),
    );
    user_children.insert(
        "personalContext".into(),
        json!({"summary": personal, "updatedAt": "2026-05-01T00:00:00Z"}),
    );
    storage
        .update_summaries(
            Some(&user(u)),
            SummaryPatch {
                user: Some(user_children),
                history: None,
            },
            None,
        )
        .await
        .unwrap();
}

fn doc_from(v: Value) -> PublicMemoryDocument {
    serde_json::from_value(v).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_replaces_the_bucket() {
    let env = file_env(config(), None);
    let m = &env.manager;
    let s = scope("alice", None);
    let (_, a) = m
        .create_fact(NewFact::new("alpha"), s.clone())
        .await
        .unwrap();
    m.create_fact(NewFact::new("beta"), s.clone())
        .await
        .unwrap();
    set_summaries(&env.storage, "alice", "old work", "likes cats").await;
    let exported = m.get_memory(s.clone()).await.unwrap();
    let beta = exported.facts.iter().find(|f| f.content == "beta").unwrap();
    let mut payload = doc_from(json!({
        "version": "9.9", "revision": 999, "lastUpdated": "ignored",
        "user": {"workContext": {"summary": "Works on DeerMem", "updatedAt": "2026-06-01T00:00:00Z"}},
        "facts": [
            {"id": "fact_import_c", "content": "gamma", "category": "workflow", "confidence": 0.8,
             "source": "thread-9", "sourceError": "said delta"}
        ]
    }));
    payload.facts.insert(0, beta.clone());
    let doc = m.import_memory(payload, s.clone()).await.unwrap();
    assert_eq!(contents(&doc), vec!["beta", "gamma"]);
    assert!(
        !ids(&doc).contains(&a.unwrap()),
        "facts missing from the import are deleted"
    );
    let beta_after = doc.facts.iter().find(|f| f.content == "beta").unwrap();
    assert_eq!(
        beta_after.revision,
        Some(1),
        "an unchanged fact is not rewritten"
    );
    let gamma = doc.facts.iter().find(|f| f.id == "fact_import_c").unwrap();
    assert_eq!(gamma.category, "other");
    assert_eq!(gamma.category_extension.as_deref(), Some("workflow"));
    assert_eq!(gamma.source, "thread-9");
    assert_eq!(gamma.source_error.as_deref(), Some("said delta"));
    assert_eq!(doc.user.work_context.summary, "Works on DeerMem");
    assert_eq!(
        doc.user.personal_context.summary, "",
        "left-out children are reset"
    );
    assert_eq!(doc.version, "2.0");
    assert_ne!(doc.revision, Some(999), "the payload's revision is ignored");
    assert_eq!(doc, m.get_memory(s).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_without_agent_writes_the_default_markdown_bucket() {
    let env = file_env(config(), None);
    let doc = env
        .manager
        .import_memory(
            doc_from(json!({"facts": [{"id": "fact_default_import", "content": "Imported"}]})),
            scope("alice", None),
        )
        .await
        .unwrap();
    assert_eq!(ids(&doc), vec!["fact_default_import"]);
    let files = markdown_files(&env.root().join("users/alice/agents/__default__/facts"));
    let stems: Vec<String> = files
        .iter()
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(stems, vec!["fact_default_import"]);
    assert_eq!(markdown_files(&env.root()).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_enforces_the_revision_rule() {
    let env = file_env(config(), None);
    let m = &env.manager;
    let s = scope("alice", None);
    let (_, id) = m
        .create_fact(NewFact::new("Version one"), s.clone())
        .await
        .unwrap();
    let id = id.unwrap();
    let export = m.get_memory(s.clone()).await.unwrap();
    // Straight back: no change, no conflict.
    let back = m.import_memory(export.clone(), s.clone()).await.unwrap();
    assert_eq!(back.facts, export.facts);
    // The payload may omit the revision while the stored one is 1.
    let mut no_rev = export.clone();
    no_rev.facts[0].revision = None;
    m.import_memory(no_rev.clone(), s.clone()).await.unwrap();
    // After an edit, the old export is a conflict (409), and nothing changes.
    m.update_fact(
        &id,
        FactPatch {
            content: Some("Version two".into()),
            ..FactPatch::default()
        },
        s.clone(),
    )
    .await
    .unwrap();
    let before = m.get_memory(s.clone()).await.unwrap();
    for payload in [export, no_rev] {
        assert!(matches!(
            m.import_memory(payload, s.clone()).await,
            Err(ManagerError::Conflict { .. })
        ));
    }
    assert_eq!(m.get_memory(s.clone()).await.unwrap(), before);
    // Export, clear, import keeps revisions.
    let fresh = m.get_memory(s.clone()).await.unwrap();
    m.clear_memory(s.clone()).await.unwrap();
    let restored = m.import_memory(fresh.clone(), s.clone()).await.unwrap();
    assert_eq!(restored.facts[0].revision, Some(2));
    assert_eq!(restored.facts[0].content, "Version two");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_applies_capacity_and_rejects_bad_documents() {
    let env = file_env(
        DeerMemConfig {
            max_facts: 2,
            ..config()
        },
        None,
    );
    let m = &env.manager;
    let s = scope("alice", None);
    let doc = m
        .import_memory(
            doc_from(json!({"facts": [
                {"id": "fact_hi", "content": "high", "confidence": 0.9},
                {"id": "fact_lo", "content": "low", "confidence": 0.5},
                {"id": "fact_mid", "content": "mid", "confidence": 0.8}
            ]})),
            s.clone(),
        )
        .await
        .unwrap();
    let mut kept = ids(&doc);
    kept.sort();
    assert_eq!(kept, vec!["fact_hi", "fact_mid"]);
    assert!(
        env.root()
            .join("users/alice/agents/__default__/.metadata/eviction-audit.json")
            .is_file()
    );
    let before = m.get_memory(s.clone()).await.unwrap();
    for (bad, want) in [
        (
            json!({"facts": [{"id": "../x", "content": "escape"}]}),
            "memory_data.facts[0].id: Fact id may contain only letters, numbers, '_' and '-'.",
        ),
        (
            json!({"facts": [{"id": "fact_a", "content": "one"}, {"id": "fact_a", "content": "two"}]}),
            "memory_data.facts: duplicate fact id 'fact_a'",
        ),
        (
            json!({"facts": [{"id": "fact_ok", "content": "fine"},
                             {"id": "fact_b", "content": "conf", "confidence": 1.5}]}),
            "memory_data.facts[1]: fact.confidence must be a number between 0 and 1",
        ),
        (
            json!({"facts": [{"id": "fact_c", "content": "   "}]}),
            "memory_data.facts[0]: fact.content must not be empty",
        ),
        (
            json!({"facts": [{"id": "fact_ok", "content": "fine"},
                             {"id": "fact_d", "content": "x", "revision": 0}]}),
            "memory_data.facts[1]: fact.revision must be an integer >= 1",
        ),
        // Every id is checked before any fact's fields: a later duplicate wins over an
        // earlier blank content.
        (
            json!({"facts": [{"id": "fact_e", "content": " "}, {"id": "fact_e", "content": "x"}]}),
            "memory_data.facts: duplicate fact id 'fact_e'",
        ),
    ] {
        match m.import_memory(doc_from(bad.clone()), s.clone()).await {
            Err(ManagerError::InvalidInput {
                code: InvalidInputCode::MemoryData,
                message,
            }) => assert_eq!(message, want, "{bad}"),
            other => panic!("{bad}: {other:?}"),
        }
    }
    // More facts than an import document may hold: refused before any is normalised.
    let many: Vec<Value> = (0..=deermem_core::MAX_IMPORT_FACTS)
        .map(|i| json!({"id": format!("fact_{i}"), "content": format!("fact {i}")}))
        .collect();
    match m
        .import_memory(doc_from(json!({ "facts": many })), s.clone())
        .await
    {
        Err(ManagerError::InvalidInput {
            code: InvalidInputCode::MemoryData,
            message,
        }) => assert_eq!(
            message,
            "memory_data.facts holds 2001 facts; an import document may hold at most 2000"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(m.get_memory(s).await.unwrap(), before, "nothing written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clear_all_resets_summaries_and_every_agent_but_keeps_agent_config() {
    let env = file_env(
        DeerMemConfig {
            fact_eviction_policy: deermem_core::policy::eviction::EvictionPolicy::HybridV1,
            ..config()
        },
        None,
    );
    let m = &env.manager;
    m.create_fact(NewFact::new("default fact"), scope("alice", None))
        .await
        .unwrap();
    m.create_fact(NewFact::new("coder fact"), scope("alice", Some("coder")))
        .await
        .unwrap();
    m.create_fact(NewFact::new("bob fact"), scope("bob", Some("coder")))
        .await
        .unwrap();
    set_summaries(&env.storage, "alice", "work", "personal").await;
    let agent_dir = env.root().join("users/alice/agents/coder");
    std::fs::write(agent_dir.join("config.yaml"), "name: coder\n").unwrap();
    // Scoped clear: that bucket only; summaries kept; its usage sidecar removed.
    m.search(search("coder", 5, scope("alice", Some("coder"))))
        .await
        .unwrap();
    assert!(agent_dir.join(".metadata/fact-usage.json").is_file());
    let doc = m.clear_memory(scope("alice", Some("coder"))).await.unwrap();
    assert!(doc.facts.is_empty());
    assert_eq!(doc.user.work_context.summary, "work");
    assert!(!agent_dir.join(".metadata").exists());
    assert_eq!(
        m.get_memory(scope("alice", None))
            .await
            .unwrap()
            .facts
            .len(),
        1
    );
    // Everything: summaries reset, every agent's facts gone, agent config kept.
    m.create_fact(NewFact::new("coder again"), scope("alice", Some("coder")))
        .await
        .unwrap();
    let doc = m
        .clear_memory(MemoryScope::new(Some(user("alice")), None))
        .await
        .unwrap();
    assert!(doc.facts.is_empty());
    assert_eq!(doc.user.work_context.summary, "");
    assert_eq!(doc.user.personal_context.summary, "");
    for a in [None, Some("coder")] {
        assert!(
            m.get_memory(scope("alice", a))
                .await
                .unwrap()
                .facts
                .is_empty()
        );
    }
    assert!(agent_dir.join("config.yaml").is_file());
    assert_eq!(
        m.get_memory(scope("bob", Some("coder")))
            .await
            .unwrap()
            .facts
            .len(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_global_json_is_migrated_into_the_default_bucket() {
    let env = file_env(config(), None);
    let m = &env.manager;
    let udir = env.root().join("users/alice");
    std::fs::create_dir_all(&udir).unwrap();
    let legacy = json!({
        "version": "1.0", "lastUpdated": "2026-01-01T00:00:00Z",
        "user": {"workContext": {"summary": "keep me", "updatedAt": "2026-01-01T00:00:00Z"}},
        "history": {},
        "facts": [{"id": "fact_legacy", "content": "Legacy fact", "category": "context",
                   "confidence": 0.9, "createdAt": "2026-01-01T00:00:00Z", "source": "thread-1"}]
    });
    std::fs::write(udir.join("memory.json"), legacy.to_string()).unwrap();
    let s = scope("alice", None);
    let doc = m.get_memory(s.clone()).await.unwrap();
    assert_eq!(ids(&doc), vec!["fact_legacy"]);
    assert_eq!(doc.facts[0].source, "thread-1");
    assert_eq!(doc.user.work_context.summary, "keep me");
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(udir.join("memory.json")).unwrap()).unwrap();
    assert!(manifest.get("facts").is_none());
    // Create, then the sorted view with string sources.
    let (doc, id) = m
        .create_fact(NewFact::new("Settings fact"), s.clone())
        .await
        .unwrap();
    let id = id.unwrap();
    assert_eq!(ids(&doc), vec![id.clone(), "fact_legacy".to_owned()]);
    assert!(doc.facts.iter().all(|f| !f.source.is_empty()));
    let doc = m
        .update_fact(
            "fact_legacy",
            FactPatch {
                content: Some("Legacy fact, edited".into()),
                ..FactPatch::default()
            },
            s.clone(),
        )
        .await
        .unwrap();
    assert!(contents(&doc).contains(&"Legacy fact, edited".to_owned()));
    m.delete_fact(&id, None, s.clone()).await.unwrap();
    m.delete_fact("fact_legacy", None, s.clone()).await.unwrap();
    assert!(markdown_files(&udir.join("agents/__default__/facts")).is_empty());
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(udir.join("memory.json")).unwrap()).unwrap();
    assert!(manifest.get("facts").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_v1_fixture_reads_like_the_reference() {
    let expected = deermem_testkit::fixtures::python_expected();
    let env = file_env(config(), None);
    deermem_testkit::fixtures::copy_tree(
        &deermem_testkit::fixtures::python_deermem_path("v1-root"),
        &env.root(),
    );
    for (key, want) in expected["v1-migrated"].as_object().unwrap() {
        let (u, a) = key.split_once('|').unwrap();
        let s = MemoryScope::new(Some(user(u)), Some(AgentName::parse(a).unwrap()));
        let doc = env.manager.get_memory(s).await.unwrap();
        let got: Vec<(String, String)> = doc
            .facts
            .iter()
            .map(|f| (f.id.clone(), f.content.clone()))
            .collect();
        let want_facts: Vec<(String, String)> = want["facts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                (
                    f["id"].as_str().unwrap().to_owned(),
                    f["content"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        assert_eq!(got, want_facts, "{key}");
        assert_eq!(doc.version, want["version"].as_str().unwrap(), "{key}");
        assert_eq!(
            doc.user.work_context.summary,
            want["user"]["workContext"]["summary"].as_str().unwrap(),
            "{key}"
        );
        for (f, w) in doc.facts.iter().zip(want["facts"].as_array().unwrap()) {
            assert_eq!(
                f.category,
                w["category"].as_str().unwrap_or("context"),
                "{key}"
            );
            assert_eq!(
                Some(f.revision.unwrap_or(0)),
                w["revision"].as_u64(),
                "{key}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_bucket_and_lead_agent_stay_apart() {
    for default_first in [true, false] {
        let env = file_env(config(), None);
        let m = &env.manager;
        let lead = env.root().join("users/alice/agents/lead-agent");
        std::fs::create_dir_all(&lead).unwrap();
        std::fs::write(lead.join("config.yaml"), "name: lead-agent\n").unwrap();
        let steps = [(None, "default fact"), (Some("lead-agent"), "lead fact")];
        let order: Vec<_> = if default_first {
            steps.to_vec()
        } else {
            steps.iter().rev().cloned().collect()
        };
        for (a, c) in order {
            m.create_fact(NewFact::new(c), scope("alice", a))
                .await
                .unwrap();
        }
        assert_eq!(
            contents(&m.get_memory(scope("alice", None)).await.unwrap()),
            vec!["default fact"]
        );
        assert_eq!(
            contents(
                &m.get_memory(scope("alice", Some("Lead-Agent")))
                    .await
                    .unwrap()
            ),
            vec!["lead fact"]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_mode_injects_summaries_only() {
    let env = file_env(config(), None);
    set_summaries(&env.storage, "alice", "Builds DeerMem", "").await;
    env.manager
        .create_fact(NewFact::new("Prefers tabs"), scope("alice", None))
        .await
        .unwrap();
    let req = || ContextRequest {
        scope: scope("alice", None),
        thread_id: None,
    };
    let middleware = env.manager.get_context(req()).await.unwrap();
    assert!(middleware.contains("Work: Builds DeerMem"), "{middleware}");
    assert!(middleware.contains("Facts:") && middleware.contains("Prefers tabs"));
    let storage: Arc<dyn MemoryStorage> = Arc::new(env.storage.clone());
    let mut p = parts(config(), storage.clone(), env.clock.clone(), None);
    p.mode = MemoryMode::Tool;
    let tool = DeerMemManager::new(p).unwrap();
    assert_eq!(tool.mode(), MemoryMode::Tool);
    assert!(tool.allows_tool_mode() && tool.can_search() && !tool.passive_writes_in_tool_mode());
    let text = tool.get_context(req()).await.unwrap();
    assert!(text.contains("Work: Builds DeerMem"), "{text}");
    assert!(
        !text.contains("Facts:") && !text.contains("Prefers tabs"),
        "{text}"
    );
    // The tools reach the facts through search.
    assert_eq!(
        tool.search(search("tabs", 5, scope("alice", None)))
            .await
            .unwrap()
            .len(),
        1
    );
    // injection_enabled: false suppresses everything in either mode.
    let mut p = parts(config(), storage, env.clock.clone(), None);
    p.injection_enabled = false;
    let off = DeerMemManager::new(p).unwrap();
    assert_eq!(off.get_context(req()).await.unwrap(), "");
    let block = off.get_context_block(req()).await.unwrap();
    assert!(block.block.is_empty() && block.content_sha256.is_none());
}

fn removal(id: &str, scope: &str, replacement: Option<usize>) -> Value {
    let mut v = json!({"id": id, "scope": scope, "reason": "changed"});
    if let Some(i) = replacement {
        v["replacementFactIndex"] = json!(i);
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_now_reports_added_removed_and_rejected() {
    let llm = Arc::new(ScriptedLlm::new([json!({
        "user": {"workContext": {"summary": "Backend engineer", "shouldUpdate": true,
                                 "scope": "user", "authority": "descriptive"},
                 "topOfMind": {"summary": "Fixing bug 12", "shouldUpdate": true,
                               "scope": "thread", "authority": "descriptive"}},
        "history": {},
        "newFacts": [
            labelled("User prefers Go for services", "preference", 0.9),
            labelled("User maybe likes jazz", "preference", 0.3),
            {"content": "Temporary task detail", "category": "context", "confidence": 0.9,
             "scope": "thread", "durability": "temporary", "authority": "transactional"},
            {"content": "Unlabelled fact", "category": "context", "confidence": 0.9},
            labelled("user prefers rust for services", "preference", 0.95)
        ],
        "factsToRemove": [removal("fact_00000001", "user", Some(0)), removal("fact_00000001", "thread", None)]
    })
    .to_string()]));
    let (m, _storage, _clock) = memory_manager(config(), Some(llm.clone()));
    let s = scope("u", Some("coder"));
    let (_, old) = m
        .create_fact(
            new_fact("User prefers Rust for services", "preference", 0.9),
            s.clone(),
        )
        .await
        .unwrap();
    assert_eq!(old.as_deref(), Some("fact_00000001"));
    let report = m
        .ingest_now(turn("t1", s.clone(), "I switched to Go for services"))
        .await
        .unwrap();
    assert!(
        matches!(report.status, IngestStatus::Committed { .. }),
        "{report:?}"
    );
    assert_eq!(report.origin.as_deref(), Some("scripted"));
    assert_eq!(report.added.len(), 1);
    assert_eq!(report.added[0].content, "User prefers Go for services");
    assert_eq!(report.removed.len(), 1);
    assert_eq!(report.removed[0].id, "fact_00000001");
    assert_eq!(report.removed[0].reason, RemovalReason::Contradiction);
    let rejected: Vec<(ProposalKind, &str, RejectReason)> = report
        .rejected
        .iter()
        .map(|r| (r.kind, r.item.as_str(), r.reason))
        .collect();
    for want in [
        (
            ProposalKind::Summary,
            "user.topOfMind",
            RejectReason::NotUserScope,
        ),
        (
            ProposalKind::NewFact,
            "User maybe likes jazz",
            RejectReason::LowConfidence,
        ),
        (
            ProposalKind::NewFact,
            "Temporary task detail",
            RejectReason::NotUserScope,
        ),
        (
            ProposalKind::NewFact,
            "Unlabelled fact",
            RejectReason::MissingLabels,
        ),
        (
            ProposalKind::NewFact,
            "user prefers rust for services",
            RejectReason::Duplicate,
        ),
        (
            ProposalKind::Removal,
            "fact_00000001",
            RejectReason::NotUserScope,
        ),
    ] {
        assert!(
            rejected.contains(&want),
            "{want:?} missing from {rejected:?}"
        );
    }
    assert_eq!(report.summaries_updated, vec!["user.workContext"]);
    let metrics = report.metrics.unwrap();
    assert_eq!(metrics.facts_extracted, 5);
    let doc = m.get_memory(s).await.unwrap();
    assert_eq!(contents(&doc), vec!["User prefers Go for services"]);
    // The report serialises for the CLI.
    let v = serde_json::to_value(&report).unwrap();
    assert_eq!(v["status"], "committed");
    assert_eq!(v["removed"][0]["reason"], "contradiction");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_now_edge_cases() {
    // Not admitted: no assistant turn, no model call.
    let llm = Arc::new(ScriptedLlm::new(Vec::<String>::new()));
    let (m, _s, _c) = memory_manager(config(), Some(llm.clone()));
    let mut req = turn("t", scope("u", None), "I prefer tea");
    req.messages.truncate(1);
    let r = m.ingest_now(req).await.unwrap();
    assert_eq!(r.status, IngestStatus::NotAdmitted);
    assert_eq!(llm.calls(), 0);
    // The watermark is bypassed: the same conversation is extracted every time.
    let llm = Arc::new(ScriptedLlm::always(answer(&[])));
    let (m, _s, _c) = memory_manager(config(), Some(llm.clone()));
    for _ in 0..2 {
        let r = m
            .ingest_now(turn("t", scope("u", None), "Hello there"))
            .await
            .unwrap();
        assert_eq!(r.status, IngestStatus::NoChange);
    }
    assert_eq!(llm.calls(), 2);
    // A transient model failure is Unavailable; an unusable one is a backend error.
    let llm = Arc::new(ScriptedLlm::new(Vec::<String>::new()));
    llm.push(Scripted::Fail(LlmError::Server {
        status: 503,
        message: "busy".into(),
    }));
    llm.push(Scripted::Reply("not json at all".into()));
    let (m, _s, _c) = memory_manager(config(), Some(llm));
    let r = m.ingest_now(turn("t", scope("u", None), "Hello")).await;
    assert!(matches!(r, Err(ManagerError::Unavailable { .. })), "{r:?}");
    let r = m.ingest_now(turn("t", scope("u", None), "Hello")).await;
    assert!(matches!(r, Err(ManagerError::Backend { .. })), "{r:?}");
    // A new fact evicted at once is reported as rejected, and nothing changes.
    let llm = Arc::new(ScriptedLlm::new([answer(&[labelled(
        "User likes marginal things",
        "preference",
        0.75,
    )])]));
    let (m, _s, _c) = memory_manager(
        DeerMemConfig {
            max_facts: 2,
            ..config()
        },
        Some(llm),
    );
    let s = scope("u", None);
    m.create_fact(new_fact("strong one", "context", 0.95), s.clone())
        .await
        .unwrap();
    m.create_fact(new_fact("strong two", "context", 0.9), s.clone())
        .await
        .unwrap();
    let r = m.ingest_now(turn("t", s.clone(), "Hello")).await.unwrap();
    assert_eq!(r.status, IngestStatus::NoChange);
    assert!(r.added.is_empty() && r.removed.is_empty());
    assert_eq!(r.rejected.len(), 1);
    assert_eq!(r.rejected[0].reason, RejectReason::Evicted);
    assert_eq!(r.rejected[0].item, "User likes marginal things");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_competing_write_in_another_bucket_needs_no_retry() {
    // A competing write in another user's bucket never conflicts with ours.
    let (m, hooked, _dir) = hooked_file(config());
    hooked.compete(Competitor {
        user: Some(user("bob")),
        agent: agent("coder"),
        changes: competing_create("bob", "coder", "fact_bob", "bob's", 0.7).changes,
    });
    let (doc, id) = m
        .create_fact(NewFact::new("alice's"), scope("alice", None))
        .await
        .unwrap();
    assert!(id.is_some());
    assert_eq!(contents(&doc), vec!["alice's"]);
    assert_eq!(hooked.applies.load(Ordering::SeqCst), 1, "no retry needed");
    assert_eq!(
        ids(&m.get_memory(scope("bob", Some("coder"))).await.unwrap()),
        vec!["fact_bob"]
    );
}

fn copy_files(from: &Path, to: &Path, skip: Option<&str>) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if Some(e.file_name().to_string_lossy().as_ref()) != skip {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_directories_are_loaded_at_construction() {
    // The updater crate ships the default patterns and prompts.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deermem-updater/src");
    let dir = tempfile::tempdir().unwrap();
    let (patterns, prompts) = (dir.path().join("patterns"), dir.path().join("prompts"));
    copy_files(&src.join("patterns"), &patterns, None);
    copy_files(&src.join("prompts"), &prompts, None);
    let clock = clock();
    let build = |cfg: DeerMemConfig, llm: Option<Arc<ScriptedLlm>>| {
        let storage = Arc::new(InMemoryStorage::new(clock.clone()));
        DeerMemManager::new(parts(
            cfg,
            storage,
            clock.clone(),
            llm.map(|l| l as Arc<dyn deermem_core::ports::LanguageModel>),
        ))
    };
    let cfg = DeerMemConfig {
        patterns_dir: Some(patterns.display().to_string()),
        prompts_dir: Some(prompts.display().to_string()),
        ..config()
    };
    let llm = Arc::new(ScriptedLlm::always(answer(&[labelled(
        "User prefers tea",
        "preference",
        0.9,
    )])));
    let m = build(cfg.clone(), Some(llm.clone())).unwrap();
    let r = m
        .ingest_now(turn("t", scope("u", None), "I prefer tea"))
        .await
        .unwrap();
    assert_eq!(r.added.len(), 1);
    assert!(
        r.signals.contains(&"preference".to_owned()),
        "{:?}",
        r.signals
    );
    assert_eq!(llm.calls(), 1);
    // A missing pattern file or template fails construction, naming it.
    let broken = dir.path().join("broken-patterns");
    copy_files(&src.join("patterns"), &broken, Some("goal.yaml"));
    let err = build(
        DeerMemConfig {
            patterns_dir: Some(broken.display().to_string()),
            ..config()
        },
        None,
    )
    .unwrap_err();
    assert!(matches!(err, ManagerError::InvalidInput { .. }));
    assert!(err.to_string().contains("goal.yaml"), "{err}");
    let broken = dir.path().join("broken-prompts");
    copy_files(&src.join("prompts"), &broken, Some("staleness_review.yaml"));
    let err = build(
        DeerMemConfig {
            prompts_dir: Some(broken.display().to_string()),
            ..config()
        },
        None,
    )
    .unwrap_err();
    assert!(err.to_string().contains("staleness_review.yaml"), "{err}");
}

#[test]
fn construction_outside_a_runtime_is_unavailable() {
    let clock = clock();
    let r = DeerMemManager::new(parts(
        config(),
        Arc::new(InMemoryStorage::new(clock.clone())),
        clock,
        None,
    ));
    assert!(matches!(r, Err(ManagerError::Unavailable { .. })), "{r:?}");
}

fn merge(ids: &[&str], content: &str, confidence: f64, scope: &str) -> Value {
    json!({"sourceIds": ids, "consolidated": {"content": content, "category": "preference",
           "confidence": confidence, "scope": scope, "durability": "durable",
           "authority": "descriptive"}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_now_reports_consolidation_merges_and_refusals() {
    let llm = Arc::new(ScriptedLlm::new([json!({
        "user": {}, "history": {}, "newFacts": [],
        "factsToConsolidate": [
            merge(&["fact_00000001", "fact_nope"], "Hallucinated", 0.9, "user"),
            merge(&["fact_00000001", "fact_00000002"], "Too unsure", 0.5, "user"),
            merge(&["fact_00000001", "fact_00000002"], "Thread only", 0.9, "thread"),
            merge(&["fact_00000001", "fact_00000002"], "Likes tea and coffee", 0.9, "user"),
            merge(&["fact_00000002", "fact_00000003"], "Reuses a source", 0.9, "user"),
        ]
    })
    .to_string()]));
    let (m, _storage, _clock) = memory_manager(
        DeerMemConfig {
            consolidation_enabled: true,
            consolidation_min_facts: 3,
            ..config()
        },
        Some(llm),
    );
    let s = scope("u", None);
    for c in ["Likes tea", "Likes coffee", "Likes juice", "Likes water"] {
        m.create_fact(new_fact(c, "preference", 0.9), s.clone())
            .await
            .unwrap();
    }
    let r = m.ingest_now(turn("t", s.clone(), "Hello")).await.unwrap();
    assert!(matches!(r.status, IngestStatus::Committed { .. }), "{r:?}");
    let added: Vec<&str> = r.added.iter().map(|a| a.content.as_str()).collect();
    assert_eq!(added, vec!["Likes tea and coffee"]);
    let removed: Vec<(&str, RemovalReason)> = r
        .removed
        .iter()
        .map(|x| (x.id.as_str(), x.reason))
        .collect();
    assert_eq!(
        removed,
        vec![
            ("fact_00000001", RemovalReason::Consolidation),
            ("fact_00000002", RemovalReason::Consolidation)
        ]
    );
    let rejected: Vec<(&str, RejectReason)> = r
        .rejected
        .iter()
        .filter(|x| x.kind == ProposalKind::Consolidation)
        .map(|x| (x.item.as_str(), x.reason))
        .collect();
    assert_eq!(
        rejected,
        vec![
            ("Hallucinated", RejectReason::SourcesUnavailable),
            ("Too unsure", RejectReason::LowConfidence),
            ("Thread only", RejectReason::NotUserScope),
            ("Reuses a source", RejectReason::SourcesUnavailable),
        ]
    );
    assert_eq!(
        contents(&m.get_memory(s).await.unwrap()),
        vec!["Likes juice", "Likes tea and coffee", "Likes water"]
    );
}

/// As the reference: an import fact whose id is `""` or absent gets a generated `fact_…` id
/// that names no stored fact and no other fact of the document.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_generates_ids_for_blank_and_missing_ones() {
    let env = file_env(config(), None);
    let m = &env.manager;
    let s = scope("alice", None);
    let doc = m
        .import_memory(
            doc_from(json!({"facts": [
                {"id": "", "content": "blank id"},
                {"content": "no id"},
                {"id": "fact_named", "content": "named"}
            ]})),
            s.clone(),
        )
        .await
        .unwrap();
    let got = ids(&doc);
    assert_eq!(got.len(), 3, "{got:?}");
    assert!(got.contains(&"fact_named".to_owned()));
    for id in got.iter().filter(|id| *id != "fact_named") {
        assert!(id.starts_with("fact_") && id.len() == 13, "{id}");
    }
    assert_eq!(contents(&doc), vec!["blank id", "named", "no id"]);
    // The stored copies read back with their generated ids (nothing blank was written).
    let reread = m.reload_memory(s).await.unwrap();
    let mut again = ids(&reread);
    again.sort();
    let mut want = got.clone();
    want.sort();
    assert_eq!(again, want);
}

/// The manager stores a long manual fact, as the reference does (no 20,000-character cap):
/// create, update and import alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_facts_are_stored() {
    let env = file_env(config(), None);
    let m = &env.manager;
    let s = scope("alice", None);
    let long = "x".repeat(20_001);
    let (doc, id) = m
        .create_fact(new_fact(&long, "context", 0.5), s.clone())
        .await
        .unwrap();
    let id = id.unwrap();
    assert_eq!(doc.facts[0].content, long);
    let longer = "y".repeat(50_000);
    let patch = FactPatch {
        content: Some(longer.clone()),
        ..FactPatch::default()
    };
    let doc = m.update_fact(&id, patch, s.clone()).await.unwrap();
    assert_eq!(doc.facts[0].content, longer);
    let doc = m
        .import_memory(
            doc_from(json!({"facts": [{"id": "fact_long", "content": "z".repeat(30_000)}]})),
            s.clone(),
        )
        .await
        .unwrap();
    assert_eq!(doc.facts[0].content.chars().count(), 30_000);
}

/// Trimming an import as its facts arrive keeps exactly what one capacity decision over the
/// whole list keeps, under both eviction policies (corrections' reserved slots included).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_trimmed_as_it_arrives_keeps_what_one_decision_keeps() {
    use deermem_core::policy::eviction::EvictionPolicy;
    for policy in [EvictionPolicy::Confidence, EvictionPolicy::HybridV1] {
        let cfg = DeerMemConfig {
            max_facts: 7,
            fact_eviction_policy: policy,
            ..config()
        };
        let env = file_env(cfg, None);
        let m = &env.manager;
        let facts: Vec<Value> = (0..95)
            .map(|i| {
                let category = if i % 11 == 0 { "correction" } else { "context" };
                // Repeating confidences, so ties are decided by document order.
                let confidence = f64::from((i * 37) % 10) / 10.0;
                let id = if i % 13 == 0 {
                    String::new()
                } else {
                    format!("fact_{i:03}")
                };
                json!({"id": id, "content": format!("fact number {i}"),
                       "category": category, "confidence": confidence})
            })
            .collect();
        let whole = m
            .import_memory(doc_from(json!({ "facts": facts })), scope("whole", None))
            .await
            .unwrap();
        let streamed_scope = scope("streamed", None);
        let mut trim = m.as_ref().import_trim(&streamed_scope).await.unwrap();
        for f in &facts {
            trim.push(serde_json::from_value(f.clone()).unwrap())
                .unwrap();
        }
        assert_eq!(trim.received(), 95);
        let kept = trim.finish();
        assert_eq!(kept.len(), 7, "{policy:?}");
        let streamed = m
            .import_memory(
                doc_from(json!({ "facts": serde_json::to_value(&kept).unwrap() })),
                streamed_scope,
            )
            .await
            .unwrap();
        assert_eq!(contents(&streamed), contents(&whole), "{policy:?}");
    }
}

/// A trim checks every fact as the import does, naming its index in the document.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_trim_refuses_what_the_import_refuses() {
    let env = file_env(config(), None);
    let m = &env.manager;
    let s = scope("alice", None);
    let fact = |v: Value| -> deermem_core::PublicFact { serde_json::from_value(v).unwrap() };
    let mut trim = m.as_ref().import_trim(&s).await.unwrap();
    trim.push(fact(json!({"id": "fact_a", "content": "one"})))
        .unwrap();
    let dup = trim.push(fact(json!({"id": "fact_a", "content": "two"})));
    assert_eq!(code_of(dup), InvalidInputCode::MemoryData);
    let bad = trim.push(fact(json!({"id": "../x", "content": "three"})));
    match bad {
        Err(ManagerError::InvalidInput { message, .. }) => {
            assert!(message.starts_with("memory_data.facts[2].id"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    let blank = trim.push(fact(json!({"id": "", "content": "  "})));
    match blank {
        Err(ManagerError::InvalidInput { message, .. }) => {
            assert_eq!(
                message,
                "memory_data.facts[3]: fact.content must not be empty"
            )
        }
        other => panic!("{other:?}"),
    }
}
