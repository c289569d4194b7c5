//! Two storage instances (each with its own lock descriptors) writing the same user from
//! separate threads with expected revisions: every write is applied or reported as a conflict,
//! none is lost or torn, and revisions strictly increase.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use deermem_core::{FactId, StorageError};
use serde_json::json;

use crate::support::*;
use deermem_core::prelude::*;

#[test]
fn two_instances_on_threads_never_lose_a_write() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    let applied: Arc<Mutex<Vec<(String, u64)>>> = Arc::new(Mutex::new(Vec::new()));
    let conflicts = Arc::new(Mutex::new(0usize));
    let handles: Vec<_> = (0..2)
        .map(|w| {
            let root = root.clone();
            let applied = applied.clone();
            let conflicts = conflicts.clone();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let c = clock();
                    let s = open(&root, &c);
                    let (u, a) = (user("alice"), agent("agent-a"));
                    for i in 0..15 {
                        // Read-modify-write of a shared counter fact with both preconditions.
                        let doc = s.load(Some(&u), Some(&a)).await.unwrap();
                        let existing = doc.fact("counter").cloned();
                        let (d, expected_fact) = match &existing {
                            Some(f) => {
                                let n = f
                                    .content
                                    .trim_start_matches("count ")
                                    .parse::<u64>()
                                    .unwrap();
                                let mut d = f.to_draft();
                                d = d
                                    .with("content", json!(format!("count {}", n + 1)))
                                    .unwrap();
                                d = d.with("title", json!("")).unwrap();
                                (d, Some(f.revision))
                            }
                            None => (fact("counter", "count 1"), None),
                        };
                        match s
                            .upsert_fact(Some(&u), &a, d, Some(doc.revision), expected_fact)
                            .await
                        {
                            Ok(r) => applied
                                .lock()
                                .unwrap()
                                .push((format!("w{w}-{i}"), r.revision)),
                            Err(e) if e.is_conflict() => *conflicts.lock().unwrap() += 1,
                            Err(e) => panic!("unexpected error {e}"),
                        }
                        // Disjoint per-writer facts rebase over each other and always land.
                        let own = format!("w{w}_{i}");
                        let r = s
                            .upsert_fact(Some(&u), &a, fact(&own, &own), Some(doc.revision), None)
                            .await;
                        match r {
                            Ok(r) => applied.lock().unwrap().push((own, r.revision)),
                            Err(StorageError::ManifestConflict { .. }) => {
                                *conflicts.lock().unwrap() += 1
                            }
                            Err(e) => panic!("unexpected error {e}"),
                        }
                    }
                });
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let c = clock();
        let s = open(&root, &c);
        let (u, a) = (user("alice"), agent("agent-a"));
        let doc = s.reload(Some(&u), Some(&a)).await.unwrap();
        let applied = applied.lock().unwrap().clone();
        // Revisions of applied commits are unique (strictly increasing in commit order).
        let mut revs: Vec<u64> = applied.iter().map(|(_, r)| *r).collect();
        revs.sort_unstable();
        let before = revs.len();
        revs.dedup();
        assert_eq!(revs.len(), before, "two commits reported the same revision");
        assert_eq!(doc.revision, *revs.last().unwrap());
        assert_eq!(
            doc.revision as usize,
            applied.len(),
            "every revision belongs to an applied write"
        );
        // The counter equals the number of applied counter writes: no lost update.
        let counter_writes = applied.iter().filter(|(k, _)| k.contains('-')).count();
        let counter = doc.fact("counter").unwrap();
        assert_eq!(counter.content, format!("count {counter_writes}"));
        assert_eq!(counter.revision as usize, counter_writes);
        // Every applied per-writer fact exists.
        let present: BTreeMap<&str, ()> = doc.facts.iter().map(|f| (f.id.as_str(), ())).collect();
        for (k, _) in applied.iter().filter(|(k, _)| k.contains('_')) {
            assert!(present.contains_key(k.as_str()), "{k} lost");
            assert!(
                s.get_fact(Some(&u), &a, &FactId::new(k.as_str()).unwrap())
                    .await
                    .unwrap()
                    .is_some()
            );
        }
        let total = applied.len() + *conflicts.lock().unwrap();
        assert_eq!(total, 60, "every attempt was applied or reported");
    });
}

/// Point creates of one user that arrive while its lock is busy share a commit: eight
/// concurrent writers, blocked behind a lock held elsewhere, land in one or two commits
/// instead of eight, each gets its own fact back and the shared revision, and every fact is
/// on disk and in a fresh instance's view.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_point_writes_of_one_user_share_a_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let s = Arc::new(open(tmp.path(), &c));
    let (u, a) = (user("alice"), agent("agent-a"));
    s.upsert_fact(Some(&u), &a, fact("seed", "seeded"), None, None)
        .await
        .unwrap();
    let base = s.load(Some(&u), Some(&a)).await.unwrap().revision;
    let holder = hold_user_lock(tmp.path(), "alice");
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let (s, u, a) = (Arc::clone(&s), u.clone(), a.clone());
            tokio::spawn(async move {
                s.upsert_fact(
                    Some(&u),
                    &a,
                    fact(&format!("f{i}"), &format!("fact {i}")),
                    None,
                    None,
                )
                .await
            })
        })
        .collect();
    // Every writer reaches the storage while the lock is held.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    holder.unlock().unwrap();
    let mut revisions = Vec::new();
    for (i, t) in tasks.into_iter().enumerate() {
        let r = t.await.unwrap().unwrap();
        let ids: Vec<&str> = r.upserted_facts.iter().map(|f| f.id.as_str()).collect();
        assert_eq!(ids, vec![format!("f{i}")], "each writer gets its own fact");
        revisions.push(r.revision);
    }
    let fresh = open(tmp.path(), &c);
    let doc = fresh.load(Some(&u), Some(&a)).await.unwrap();
    assert_eq!(doc.facts.len(), 9);
    assert!(
        doc.revision - base <= 2,
        "eight writers in {} commits",
        doc.revision - base
    );
    assert!(revisions.iter().all(|r| *r > base && *r <= doc.revision));
}

/// A writer whose own precondition fails (here: a create of a fact that exists) fails alone:
/// the writers grouped with it still commit, and the existing fact is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_writer_in_a_group_fails_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let s = Arc::new(open(tmp.path(), &c));
    let (u, a) = (user("alice"), agent("agent-a"));
    s.upsert_fact(Some(&u), &a, fact("taken", "the original"), None, None)
        .await
        .unwrap();
    let holder = hold_user_lock(tmp.path(), "alice");
    let tasks: Vec<_> = (0..6)
        .map(|i| {
            let (s, u, a) = (Arc::clone(&s), u.clone(), a.clone());
            tokio::spawn(async move {
                let (id, text) = if i == 3 {
                    ("taken".to_owned(), "a conflicting create".to_owned())
                } else {
                    (format!("f{i}"), format!("fact {i}"))
                };
                // Without an expected fact revision the fact must not exist yet.
                s.upsert_fact(Some(&u), &a, fact(&id, &text), None, None)
                    .await
            })
        })
        .collect();
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    holder.unlock().unwrap();
    for (i, t) in tasks.into_iter().enumerate() {
        let r = t.await.unwrap();
        if i == 3 {
            assert!(matches!(r, Err(StorageError::FactConflict { .. })), "{r:?}");
        } else {
            assert_eq!(r.unwrap().upserted_facts.len(), 1);
        }
    }
    let fresh = open(tmp.path(), &c);
    let doc = fresh.load(Some(&u), Some(&a)).await.unwrap();
    assert_eq!(doc.facts.len(), 6);
    let taken = doc.facts.iter().find(|f| f.id.as_str() == "taken").unwrap();
    assert_eq!(taken.content, "the original");
}
