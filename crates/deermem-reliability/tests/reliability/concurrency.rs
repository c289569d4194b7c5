//! Multi-process concurrency: 4 writer processes × 4 tokio tasks increment shared counter facts
//! of the same two users with both revision preconditions, and create their own facts. Every
//! write is applied or answered with a conflict, no update is lost (each counter equals the
//! number of its applied increments), no file is torn, every commit's revision is reported to
//! a writer (writes grouped into one commit share it, never two writes of one fact), each task
//! sees its revisions strictly increase, and the final revision equals the number of commits.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use deermem_core::{AgentName, UserId};
use deermem_reliability::{figure, pick, verify};
use serde_json::Value;

use crate::support;
use deermem_core::prelude::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_processes_by_four_tasks_lose_no_update() {
    let (processes, tasks) = (4u64, 4u64);
    let iterations: u64 = pick(12, 100);
    let started = Instant::now();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let children: Vec<_> = (0..processes)
        .map(|w| {
            let out = tmp.path().join(format!("out-{w}.json"));
            let child = support::writer()
                .arg("concurrent")
                .arg(&root)
                .arg(w.to_string())
                .arg(tasks.to_string())
                .arg(iterations.to_string())
                .arg(&out)
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn writer");
            (child, out)
        })
        .collect();
    let mut records: Vec<(String, Value)> = Vec::new();
    for (child, out) in children {
        let o = child.wait_with_output().expect("wait");
        assert!(
            o.status.success(),
            "writer failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let v: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
        for t in v["tasks"].as_array().unwrap() {
            let key = format!("{}-{}", v["worker"], t["task"]);
            // Revisions a task sees strictly increase per user.
            let mut last: BTreeMap<String, u64> = BTreeMap::new();
            for r in t["records"].as_array().unwrap() {
                if let Some(rev) = r["revision"].as_u64() {
                    let user = r["user"].as_str().unwrap().to_owned();
                    let prev = last.insert(user.clone(), rev).unwrap_or(0);
                    assert!(
                        rev > prev,
                        "task {key}: revision {rev} after {prev} for {user}"
                    );
                }
                records.push((key.clone(), r.clone()));
            }
        }
    }
    let errors: Vec<_> = records
        .iter()
        .filter(|(_, r)| r["kind"] == "error")
        .collect();
    assert!(errors.is_empty(), "writes failed with errors: {errors:?}");
    assert_eq!(
        records.len() as u64,
        processes * tasks * iterations * 2,
        "every attempt was applied or answered with a conflict"
    );
    let storage = support::storage(&root);
    let agent = AgentName::parse("shared").unwrap();
    let mut applied_total = 0usize;
    let mut conflicts_total = 0usize;
    for user in ["carol", "dave"] {
        let mine: Vec<&Value> = records
            .iter()
            .map(|(_, r)| r)
            .filter(|r| r["user"] == user)
            .collect();
        let applied: Vec<&&Value> = mine.iter().filter(|r| r["revision"].is_u64()).collect();
        conflicts_total += mine.iter().filter(|r| r["kind"] == "conflict").count();
        applied_total += applied.len();
        // Concurrent point writes of one process may share a commit (the storage's group
        // commit): writes that report one revision were one commit, which never holds two
        // writes of the same fact.
        let mut by_revision: BTreeMap<u64, Vec<&str>> = BTreeMap::new();
        for r in &applied {
            by_revision
                .entry(r["revision"].as_u64().unwrap())
                .or_default()
                .push(r["id"].as_str().unwrap());
        }
        for (rev, ids) in &by_revision {
            let distinct: BTreeSet<&&str> = ids.iter().collect();
            assert_eq!(
                distinct.len(),
                ids.len(),
                "{user}: revision {rev} holds two writes of one fact: {ids:?}"
            );
        }
        let revs: BTreeSet<u64> = by_revision.keys().copied().collect();
        let uid = UserId::new(user).unwrap();
        let doc = storage.load(Some(&uid), Some(&agent)).await.unwrap();
        // Every commit was reported to a writer: the revisions are exactly 1..=revision.
        assert_eq!(
            revs.iter().copied().collect::<Vec<_>>(),
            (1..=doc.revision).collect::<Vec<_>>(),
            "{user}: revisions reported != commits"
        );
        assert!(applied.len() >= revs.len());
        for c in 0..3 {
            let id = format!("counter_{c}");
            let n = applied
                .iter()
                .filter(|r| r["id"] == id.as_str() && r["kind"] == "increment")
                .count();
            match doc.fact(&id) {
                Some(f) => {
                    assert_eq!(f.content, format!("count {n}"), "{user} {id}: lost update");
                    assert_eq!(f.revision as usize, n, "{user} {id}");
                }
                None => assert_eq!(n, 0, "{user} {id} missing"),
            }
        }
        for r in applied.iter().filter(|r| r["kind"] == "own") {
            assert!(
                doc.fact(r["id"].as_str().unwrap()).is_some(),
                "{user}: {r} lost"
            );
        }
        // No torn file: every fact file parsed in the load above, nothing left behind.
        let left = verify::leftovers(&root.join("users").join(user));
        assert!(left.is_empty(), "{user}: {left:?}");
        assert_eq!(
            verify::fact_files(&root.join("users").join(user)).len(),
            doc.facts.len()
        );
    }
    let test = "concurrency";
    figure(test, "processes_x_tasks", format!("{processes}x{tasks}"));
    figure(test, "attempts", records.len());
    figure(test, "applied_commits", applied_total);
    figure(test, "conflicts_answered", conflicts_total);
    figure(test, "seconds", started.elapsed().as_secs());
    assert!(applied_total > 0);
}
