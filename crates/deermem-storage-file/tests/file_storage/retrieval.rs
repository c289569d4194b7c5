//! Retrieval integration: notifications after commits, dirty scopes, substring
//! fallback, rebuilds, status and close.

use std::sync::Arc;

use deermem_core::{ApplyOptions, ChangeSet, FactId, Scope, SearchQuery};

use crate::support::*;
use deermem_core::prelude::*;

#[tokio::test]
async fn commits_notify_upserts_and_removes_with_raw_scope() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let rec = Arc::new(Recording::default());
    let s = open_with(tmp.path(), &c, rec.clone());
    let (u, a) = (user("bob@example.com"), agent("agent-a"));
    s.upsert_fact(Some(&u), &a, fact("f1", "one"), None, None)
        .await
        .unwrap();
    let f2 = s
        .upsert_fact(Some(&u), &a, fact("f2", "two"), None, None)
        .await
        .unwrap()
        .upserted_facts[0]
        .clone();
    // A no-op writes and notifies nothing.
    s.upsert_fact(Some(&u), &a, f2.to_draft(), None, Some(1))
        .await
        .unwrap();
    s.delete_fact(Some(&u), &a, &FactId::new("f1").unwrap(), None, None)
        .await
        .unwrap();
    let raw = Some("bob@example.com".to_owned());
    assert_eq!(
        rec.calls(),
        vec![
            Call::Upsert(raw.clone(), "agent-a".into(), "f1".into()),
            Call::Upsert(raw.clone(), "agent-a".into(), "f2".into()),
            Call::Remove(raw, "agent-a".into(), "f1".into()),
        ]
    );
    let hits = s
        .search_facts(&SearchQuery::new("two", Scope::agent(&u, &a), 5))
        .await
        .unwrap();
    assert_eq!(hits.len(), 1);
    assert_eq!(
        hits[0].match_type,
        deermem_core::MatchType::Fts5,
        "the adapter's result is returned as is"
    );
    let status = s.retrieval_status().await;
    assert!(status.configured);
    assert_eq!(status.mode, "external");
    assert!(s.capabilities().names.contains("retrieval"));
}

#[tokio::test]
async fn failed_notification_marks_scope_dirty_and_search_rebuilds_it() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let rec = Arc::new(Recording::default());
    rec.fail_upserts.lock().unwrap().push("f1".into());
    let s = open_with(tmp.path(), &c, rec.clone());
    let (u, a) = (user("alice"), agent("agent-a"));
    s.upsert_fact(Some(&u), &a, fact("f1", "findable words"), None, None)
        .await
        .unwrap();
    assert_eq!(
        s.retrieval_status().await.dirty_scopes,
        vec!["alice|agent-a".to_owned()]
    );
    rec.fail_upserts.lock().unwrap().clear();
    let hits = s
        .search_facts(&SearchQuery::new("findable", Scope::agent(&u, &a), 5))
        .await
        .unwrap();
    assert_eq!(hits.len(), 1);
    assert!(rec.calls().contains(&Call::Rebuild(1)));
    assert!(s.retrieval_status().await.dirty_scopes.is_empty());
}

#[tokio::test]
async fn per_fact_rebuild_counts_failures_and_continues() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let rec = Arc::new(Recording {
        bulk_unsupported: true,
        ..Recording::default()
    });
    let s = open_with(tmp.path(), &c, rec.clone());
    let (u, a) = (user("alice"), agent("agent-a"));
    s.upsert_fact(Some(&u), &a, fact("good", "one"), None, None)
        .await
        .unwrap();
    s.upsert_fact(Some(&u), &a, fact("bad", "two"), None, None)
        .await
        .unwrap();
    rec.fail_upserts.lock().unwrap().push("bad".into());
    let r = s
        .rebuild_index(Some(&[(Some(u.clone()), a.clone())]))
        .await
        .unwrap();
    assert!(r.supported && !r.fatal);
    assert_eq!((r.indexed, r.failed), (1, 1));
    assert!(rec.calls().contains(&Call::Clear));
}

#[tokio::test]
async fn full_rebuild_walks_only_memory_directories_and_accepts_original_ids() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let rec = Arc::new(Recording::default());
    let s = open_with(tmp.path(), &c, rec.clone());
    let u = user("test@example.com");
    s.upsert_fact(Some(&u), &agent("agent-a"), fact("f1", "one"), None, None)
        .await
        .unwrap();
    s.upsert_fact(
        None,
        &agent("agent-b"),
        fact("f2", "legacy layout"),
        None,
        None,
    )
    .await
    .unwrap();
    let bulk = (0..120)
        .map(|i| fact(&format!("m{i:03}"), "bulk"))
        .collect();
    s.apply_changes(
        Some(&user("many")),
        Some(&agent("a")),
        ChangeSet {
            upserts: bulk,
            ..ChangeSet::default()
        },
        ApplyOptions::default(),
    )
    .await
    .unwrap();
    // Non-memory Markdown in the shared DeerFlow home is not part of the walk.
    let thread_md = tmp.path().join("threads/t1/facts/notes.md");
    std::fs::create_dir_all(thread_md.parent().unwrap()).unwrap();
    std::fs::write(&thread_md, "# not a fact").unwrap();
    // A corrupt fact counts as a failure without stopping the rebuild.
    let broken = tmp.path().join("users/many/agents/a/facts/00/broken.md");
    std::fs::create_dir_all(broken.parent().unwrap()).unwrap();
    std::fs::write(&broken, "garbage").unwrap();
    let r = s.rebuild_index(None).await.unwrap();
    assert_eq!((r.indexed, r.failed, r.fatal), (122, 1, false));
    // Scoped rebuilds have no hidden 100-fact cap.
    std::fs::remove_file(&broken).unwrap();
    let r = s
        .rebuild_index(Some(&[(Some(user("many")), agent("a"))]))
        .await
        .unwrap();
    assert_eq!(r.indexed, 120);
    let hits = s
        .search_facts(&SearchQuery::new(
            "bulk",
            Scope::agent(&user("many"), &agent("a")),
            200,
        ))
        .await
        .unwrap();
    assert_eq!(hits.len(), 120);
}

/// An index that lists its scopes is rebuilt in batches of whole scopes of about
/// `rebuild_batch_facts` facts, never the whole store at once, and the scopes it held that no
/// fact file names any more are cleared at the end.
#[tokio::test]
async fn a_full_rebuild_streams_bounded_batches_and_clears_vanished_scopes() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let rec = Arc::new(Recording {
        lists_scopes: true,
        ..Recording::default()
    });
    let mut config = deermem_storage_file::FileStorageConfig::new(tmp.path());
    config.rebuild_batch_facts = 10;
    let s = deermem_storage_file::FileStorage::new(config, c.clone(), Some(rec.clone())).unwrap();
    // 40 users × 3 facts; one more user whose files are then deleted by hand.
    for i in 0..41 {
        let facts = (0..3).map(|k| fact(&format!("f{k}"), "bulk")).collect();
        s.apply_changes(
            Some(&user(&format!("u{i:02}"))),
            Some(&agent("a")),
            ChangeSet {
                upserts: facts,
                ..ChangeSet::default()
            },
            ApplyOptions::default(),
        )
        .await
        .unwrap();
    }
    std::fs::remove_dir_all(tmp.path().join("users/u40")).unwrap();
    rec.calls.lock().unwrap().clear();
    let r = s.rebuild_index(None).await.unwrap();
    assert_eq!((r.indexed, r.failed, r.fatal), (120, 0, false));
    let calls = rec.calls();
    let batches: Vec<usize> = calls
        .iter()
        .filter_map(|c| match c {
            Call::Rebuild(n) => Some(*n),
            _ => None,
        })
        .collect();
    assert!(batches.len() >= 4, "{batches:?}");
    // At most the batch plus the directories read in one go (8 scopes of 3 facts).
    assert!(batches.iter().all(|n| *n <= 10 + 8 * 3), "{batches:?}");
    assert_eq!(batches.iter().sum::<usize>(), 120);
    assert_eq!(calls.last(), Some(&Call::Clear), "{calls:?}");
    let docs = rec.docs.lock().unwrap();
    assert_eq!(docs.len(), 120);
    assert!(docs.keys().all(|(u, _, _)| u.as_deref() != Some("u40")));
}

#[tokio::test]
async fn without_an_adapter_search_scans_all_facts() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let s = open(tmp.path(), &c);
    let (u, a) = (user("alice"), agent("agent-a"));
    let many = (0..130)
        .map(|i| fact(&format!("f{i:03}"), "needle in a haystack"))
        .collect();
    s.apply_changes(
        Some(&u),
        Some(&a),
        ChangeSet {
            upserts: many,
            ..ChangeSet::default()
        },
        ApplyOptions::default(),
    )
    .await
    .unwrap();
    let hits = s
        .search_facts(&SearchQuery::new("NEEDLE", Scope::agent(&u, &a), 500))
        .await
        .unwrap();
    assert_eq!(hits.len(), 130);
    assert_eq!(s.retrieval_status().await.mode, "substring_fallback");
    let r = s.rebuild_index(None).await.unwrap();
    assert!(!r.supported);
    assert_eq!(r.reason.as_deref(), Some("retrieval_not_configured"));
    assert!(s.capabilities().names.contains("substring-fallback"));
}

#[tokio::test]
async fn close_closes_the_adapter_once() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let rec = Arc::new(Recording::default());
    let s = open_with(tmp.path(), &c, rec.clone());
    s.close().await;
    s.close().await;
    assert_eq!(rec.calls().iter().filter(|c| **c == Call::Close).count(), 1);
}

#[tokio::test]
async fn reload_reindexes_the_scope_after_out_of_band_edits() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let rec = Arc::new(Recording::default());
    let s = open_with(tmp.path(), &c, rec.clone());
    let (u, a) = (user("alice"), agent("agent-a"));
    s.upsert_fact(Some(&u), &a, fact("f1", "old words"), None, None)
        .await
        .unwrap();
    let path = tmp.path().join(format!(
        "users/alice/agents/agent-a/facts/{}/f1.md",
        FactId::new("f1").unwrap().shard()
    ));
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("old words", "new words")).unwrap();
    s.reload(Some(&u), Some(&a)).await.unwrap();
    let scope = Scope::agent(&u, &a);
    assert_eq!(
        s.search_facts(&SearchQuery::new("new words", scope.clone(), 5))
            .await
            .unwrap()
            .len(),
        1
    );
    assert!(
        s.search_facts(&SearchQuery::new("old words", scope, 5))
            .await
            .unwrap()
            .is_empty()
    );
}

/// A create-only commit that failed after its manifest was written is completed by the next
/// access (it has no pre-image to roll back to), here by a second instance on the same root and
/// index, and the index, which was never told about it, learns its facts through the dirty
/// scope before the next search. One that failed after its commit point (no journal left) is
/// on disk, and its own instance marks the scope dirty. One that failed earlier is rolled back
/// and never reaches the index.
#[tokio::test]
async fn an_interrupted_commit_completed_by_recovery_reaches_the_index() {
    use deermem_storage_file::fault::inject::{IoFault, arm, disarm};
    let (u, a) = (user("alice"), agent("agent-a"));
    let mut outcomes = (0, 0);
    for skip in 0.. {
        let tmp = tempfile::tempdir().unwrap();
        let c = clock();
        let rec = Arc::new(Recording::default());
        let s = open_with(tmp.path(), &c, rec.clone());
        let seeded = s
            .upsert_fact(Some(&u), &a, fact("f1", "seeded words"), None, None)
            .await
            .unwrap()
            .revision;
        arm(tmp.path(), IoFault::FsyncEio, skip);
        let r = s
            .upsert_fact(Some(&u), &a, fact("f2", "interrupted words"), None, None)
            .await;
        disarm(tmp.path());
        if r.is_ok() {
            break;
        }
        let journal_left = tmp.path().join("users/alice/.memory.journal.json").exists();
        let other = open_with(tmp.path(), &c, rec.clone());
        let s = if journal_left { &other } else { &s };
        let doc = s.load(Some(&u), Some(&a)).await.unwrap();
        let hits = s
            .search_facts(&SearchQuery::new("interrupted", Scope::agent(&u, &a), 5))
            .await
            .unwrap();
        if doc.facts.len() == 2 {
            outcomes.1 += 1;
            assert_eq!(doc.revision, seeded + 1, "skip {skip}");
            assert_eq!(
                hits.len(),
                1,
                "skip {skip}: the completed fact is searchable"
            );
        } else {
            outcomes.0 += 1;
            assert_eq!(doc.revision, seeded, "skip {skip}");
            assert!(hits.is_empty(), "skip {skip}");
        }
        assert!(s.retrieval_status().await.dirty_scopes.is_empty());
    }
    assert!(outcomes.0 > 0 && outcomes.1 > 0, "{outcomes:?}");
}

/// An index write acknowledged and then lost (reported through `take_stale_scopes`) marks its
/// scope dirty: the status shows it and the next search there rebuilds it from the files.
#[tokio::test]
async fn scopes_whose_acknowledged_index_writes_failed_are_rebuilt_before_search() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let rec = Arc::new(Recording::default());
    let s = open_with(tmp.path(), &c, rec.clone());
    let (u, a) = (user("alice"), agent("agent-a"));
    s.upsert_fact(Some(&u), &a, fact("f1", "findable words"), None, None)
        .await
        .unwrap();
    // The adapter lost the write after acknowledging it.
    rec.docs.lock().unwrap().clear();
    rec.stale.lock().unwrap().push(Scope::agent(&u, &a));
    assert_eq!(
        s.retrieval_status().await.dirty_scopes,
        vec!["alice|agent-a".to_owned()]
    );
    let hits = s
        .search_facts(&SearchQuery::new("findable", Scope::agent(&u, &a), 5))
        .await
        .unwrap();
    assert_eq!(hits.len(), 1);
    assert!(rec.calls().contains(&Call::Rebuild(1)));
    assert!(s.retrieval_status().await.dirty_scopes.is_empty());
}

#[tokio::test]
async fn clear_all_failing_midway_still_reports_what_it_deleted() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let rec = Arc::new(Recording::default());
    let s = open_with(tmp.path(), &c, rec.clone());
    let u = user("alice");
    let (a, b) = (agent("agent-a"), agent("agent-b"));
    for (ag, id) in [(&a, "fa1"), (&a, "fa2"), (&b, "fb1")] {
        s.upsert_fact(Some(&u), ag, fact(id, "remember this"), None, None)
            .await
            .unwrap();
    }
    // Cached before the clear.
    assert_eq!(s.load(Some(&u), Some(&a)).await.unwrap().facts.len(), 2);
    // agent-b (cleared after agent-a) holds a damaged file: its step fails.
    let damaged = fact_path(tmp.path(), "alice", "agent-b", "fb1");
    std::fs::write(&damaged, b"---\nid: [unclosed\n---\n").unwrap();
    let err = s.clear_all(Some(&u)).await.expect_err("agent-b is damaged");
    assert!(
        matches!(err, deermem_core::StorageError::Corrupt { .. }),
        "{err:?}"
    );
    // agent-a's commit landed: the index was told and the cache forgot the old document.
    let raw = Some("alice".to_owned());
    let calls = rec.calls();
    for id in ["fa1", "fa2"] {
        assert!(
            calls.contains(&Call::Remove(raw.clone(), "agent-a".into(), id.into())),
            "{calls:?}"
        );
    }
    assert!(s.load(Some(&u), Some(&a)).await.unwrap().facts.is_empty());
    // The damaged file is left as it was for a person to look at.
    assert_eq!(
        std::fs::read(&damaged).unwrap(),
        b"---\nid: [unclosed\n---\n"
    );
}

/// A root filled by unsynced snapshot writes (the bulk path) reads back exactly what was
/// written, and a full rebuild makes it searchable.
#[tokio::test]
async fn unsynced_snapshot_writes_fill_a_root_that_reads_back_and_rebuilds() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let source = open(tmp.path(), &c);
    let (u, a) = (user("bulk1"), agent("a"));
    source
        .apply_changes(
            Some(&u),
            Some(&a),
            ChangeSet {
                upserts: vec![fact("f1", "violin lessons"), fact("f2", "cello")],
                ..ChangeSet::default()
            },
            ApplyOptions::default(),
        )
        .await
        .unwrap();
    let snap = source.read_snapshot("bulk1").await.unwrap().unwrap();
    let other = tempfile::tempdir().unwrap();
    let rec = Arc::new(Recording {
        lists_scopes: true,
        ..Recording::default()
    });
    let target = open_with(other.path(), &c, rec.clone());
    target.write_snapshot_unsynced(snap.clone()).await.unwrap();
    assert_eq!(target.read_snapshot("bulk1").await.unwrap(), Some(snap));
    let r = target.rebuild_index(None).await.unwrap();
    assert_eq!((r.indexed, r.failed), (2, 0));
    let hits = target
        .search_facts(&SearchQuery::new("violin", Scope::agent(&u, &a), 5))
        .await
        .unwrap();
    assert_eq!(hits.len(), 1);
}
