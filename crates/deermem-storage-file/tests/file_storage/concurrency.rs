//! Two storage instances (each with its own lock descriptors) writing the same user from
//! separate threads with expected revisions: every write is applied or reported as a conflict,
//! none is lost or torn, and revisions strictly increase.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use deermem_core::ports::MemoryStorage;
use deermem_core::{FactId, StorageError};
use serde_json::json;

use crate::support::*;

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
                                d.insert("content".into(), json!(format!("count {}", n + 1)));
                                d.insert("title".into(), json!(""));
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
