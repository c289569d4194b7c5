//! Crash recovery: a child process aborts at each step of the commit protocol; reopening the
//! root rolls the commit back (before the commit point, the durable unlink of the journal) or
//! forward (after it), every fact parses, the manifest revision matches, no acknowledged write
//! is lost and no leftover stays.

use std::path::Path;
use std::process::Command;

use deermem_core::{FactId, SummaryPatch};
use serde_json::json;

use crate::support::*;
use deermem_core::prelude::*;

const STEPS_ROLLED_BACK: [&str; 7] = [
    "after-preimages",
    "atomic-before-rename",
    "after-prepared",
    "after-fact-1",
    "after-fact-2",
    "after-delete-1",
    "after-manifest",
];
const STEPS_ROLLED_FORWARD: [&str; 2] = ["after-committed", "after-cleanup"];

async fn seed(root: &Path) -> u64 {
    let c = clock();
    let s = open(root, &c);
    let (u, a) = (user("alice"), agent("agent-a"));
    for (id, text) in [("f1", "first"), ("f2", "second"), ("f3", "third")] {
        s.upsert_fact(Some(&u), &a, fact(id, text), None, None)
            .await
            .unwrap();
    }
    let mut p = serde_json::Map::new();
    p.insert(
        "workContext".into(),
        json!({"summary": "acknowledged", "updatedAt": "t"}),
    );
    s.update_summaries(
        Some(&u),
        SummaryPatch {
            user: Some(p),
            history: None,
        },
        None,
    )
    .await
    .unwrap()
    .revision
}

fn run_child(root: &Path, step: Option<&str>) -> std::process::Output {
    run_child_with(root, step, &[])
}

fn run_child_with(root: &Path, step: Option<&str>, args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_deermem-storage-crash"));
    cmd.arg(root).args(args);
    match step {
        Some(s) => cmd.env("DEERMEM_FAULT_STEP", s),
        None => cmd.env_remove("DEERMEM_FAULT_STEP"),
    };
    cmd.output().unwrap()
}

fn assert_clean(root: &Path) {
    let files = snapshot(root);
    let udir = root.join("users/alice");
    assert!(!udir.join(".memory.journal.json").exists());
    let leftovers: Vec<_> = files
        .keys()
        .filter(|k| k.contains(".recovery/") || k.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "leftovers {leftovers:?}");
}

/// The state a crash leaves is exactly what the reference's recovery reads: the journal's keys,
/// order and values, and the pre-images under `.recovery/<operationId>/`.
fn assert_reference_journal(root: &Path) {
    let udir = root.join("users/alice");
    let text = std::fs::read_to_string(udir.join(".memory.journal.json")).unwrap();
    let j: serde_json::Value = serde_json::from_str(&text).unwrap();
    let keys: Vec<&str> = j.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        vec![
            "operationId",
            "state",
            "agentName",
            "expectedRevision",
            "nextRevision",
            "factIds",
            "oldEntries"
        ]
    );
    assert_eq!(j["state"], "prepared");
    assert_eq!(j["agentName"], "agent-a");
    assert_eq!(
        j["nextRevision"],
        j["expectedRevision"].as_u64().unwrap() + 1
    );
    assert_eq!(j["factIds"], json!(["f1", "f4", "f2"]));
    let path = |id: &str| {
        format!(
            "agents/agent-a/facts/{}/{id}.md",
            FactId::new(id).unwrap().shard()
        )
    };
    assert_eq!(
        j["oldEntries"],
        json!({"f1": {"path": path("f1")}, "f2": {"path": path("f2")}})
    );
    let op = j["operationId"].as_str().unwrap();
    assert!(op.len() == 32 && op.bytes().all(|b| b.is_ascii_hexdigit()));
    for pre in ["memory.json", "f1.md", "f2.md"] {
        assert!(udir.join(".recovery").join(op).join(pre).is_file(), "{pre}");
    }
    assert!(!text.ends_with('\n'), "Python JSON writer style");
}

#[tokio::test]
async fn a_crash_at_any_step_rolls_back_or_forward() {
    for step in STEPS_ROLLED_BACK.iter().chain(STEPS_ROLLED_FORWARD.iter()) {
        let tmp = tempfile::tempdir().unwrap();
        let before_rev = seed(tmp.path()).await;
        let out = run_child(tmp.path(), Some(step));
        assert!(
            !out.status.success(),
            "{step}: the child must have aborted: {out:?}"
        );
        if *step == "after-fact-1" {
            assert_reference_journal(tmp.path());
        }
        // A fresh instance recovers on first access.
        let c = clock();
        let s = open(tmp.path(), &c);
        let (u, a) = (user("alice"), agent("agent-a"));
        let doc = s
            .load(Some(&u), Some(&a))
            .await
            .unwrap_or_else(|e| panic!("{step}: {e}"));
        let ids: Vec<&str> = doc.facts.iter().map(|f| f.id.as_str()).collect();
        if STEPS_ROLLED_BACK.contains(step) {
            assert_eq!(doc.revision, before_rev, "{step}");
            assert_eq!(ids, vec!["f1", "f2", "f3"], "{step}");
            assert_eq!(doc.facts[0].content, "first", "{step}");
            assert_eq!(doc.facts[0].revision, 1, "{step}");
            assert_eq!(
                doc.user.entry("workContext").summary,
                "acknowledged",
                "{step}"
            );
        } else {
            assert_eq!(doc.revision, before_rev + 1, "{step}");
            assert_eq!(ids, vec!["f1", "f3", "f4"], "{step}");
            assert_eq!(
                doc.facts[0].content, "f1 rewritten by the crashing commit",
                "{step}"
            );
            assert_eq!(doc.facts[0].revision, 2, "{step}");
            assert_eq!(
                doc.user.entry("workContext").summary,
                "crashing commit",
                "{step}"
            );
        }
        assert_clean(tmp.path());
        // Every fact file parses and is readable at its shard path.
        for f in &doc.facts {
            assert!(
                s.get_fact(Some(&u), &a, &f.id).await.unwrap().is_some(),
                "{step}: {}",
                f.id
            );
        }
        // The storage keeps working after recovery.
        let r = s
            .upsert_fact(Some(&u), &a, fact("after", "post-crash write"), None, None)
            .await
            .unwrap();
        assert_eq!(r.revision, doc.revision + 1, "{step}");
    }
}

#[tokio::test]
async fn the_child_commits_normally_without_a_fault() {
    let tmp = tempfile::tempdir().unwrap();
    let before = seed(tmp.path()).await;
    let out = run_child(tmp.path(), None);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("committed revision {}", before + 1)
    );
    assert_clean(tmp.path());
}

/// A commit that only creates facts writes no pre-image and no `.recovery/<op>`: a crash
/// before its manifest is written rolls it back (the new facts are unlinked), a crash after it
/// completes it, since the manifest is written after every fact file. Either way the revision
/// matches the facts, and the journal left behind is one the reference's recovery reads.
#[tokio::test]
async fn a_create_only_commit_has_no_preimages_and_recovers_either_way() {
    const BACK: [&str; 5] = [
        "after-preimages",
        "atomic-before-rename",
        "after-prepared",
        "after-fact-1",
        "after-fact-2",
    ];
    const FORWARD: [&str; 3] = ["after-manifest", "after-committed", "after-cleanup"];
    for step in BACK.iter().chain(FORWARD.iter()) {
        let tmp = tempfile::tempdir().unwrap();
        let before_rev = seed(tmp.path()).await;
        let out = run_child_with(tmp.path(), Some(step), &["create"]);
        assert!(!out.status.success(), "{step}: the child must have aborted");
        let udir = tmp.path().join("users/alice");
        let ops: Vec<_> = std::fs::read_dir(udir.join(".recovery"))
            .map(|d| d.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(ops.is_empty(), "{step}: no pre-image directory: {ops:?}");
        let journal = udir.join(".memory.journal.json");
        if [
            "after-prepared",
            "after-fact-1",
            "after-fact-2",
            "after-manifest",
        ]
        .contains(step)
        {
            let j: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&journal).unwrap()).unwrap();
            assert_eq!(j["state"], "prepared", "{step}");
            assert_eq!(j["factIds"], json!(["f4", "f5"]), "{step}");
            assert_eq!(j["oldEntries"], json!({}), "{step}");
            assert_eq!(j["expectedRevision"], json!(before_rev), "{step}");
        }
        let c = clock();
        let s = open(tmp.path(), &c);
        let (u, a) = (user("alice"), agent("agent-a"));
        let doc = s
            .load(Some(&u), Some(&a))
            .await
            .unwrap_or_else(|e| panic!("{step}: {e}"));
        let ids: Vec<&str> = doc.facts.iter().map(|f| f.id.as_str()).collect();
        if BACK.contains(step) {
            assert_eq!(doc.revision, before_rev, "{step}");
            assert_eq!(ids, vec!["f1", "f2", "f3"], "{step}");
        } else {
            assert_eq!(doc.revision, before_rev + 1, "{step}");
            assert_eq!(ids, vec!["f1", "f2", "f3", "f4", "f5"], "{step}");
        }
        assert_eq!(
            doc.user.entry("workContext").summary,
            "acknowledged",
            "{step}"
        );
        assert_clean(tmp.path());
        let r = s
            .upsert_fact(Some(&u), &a, fact("after", "post-crash write"), None, None)
            .await
            .unwrap();
        assert_eq!(r.revision, doc.revision + 1, "{step}");
    }
}
