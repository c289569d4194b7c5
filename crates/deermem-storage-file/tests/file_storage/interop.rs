//! Python interoperability: files this adapter writes read back with PyYAML and `json` (a small
//! loader of our own in `tests/interop/`) to the same values, and a Python process holding
//! `fcntl.flock` on the lock file excludes our writers.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use deermem_core::policy::eviction::{EvictedFact, EvictionDecision, EvictionPolicy};
use deermem_core::{ApplyOptions, ChangeSet, FactId, StorageError, SummaryPatch};
use deermem_pycompat::py;
use deermem_storage_file::{FileStorage, FileStorageConfig};
use serde_json::{Value, json};

use crate::support::*;
use deermem_core::prelude::*;

fn interop_script(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/interop")
        .join(name)
}

const HOSTILE: [&str; 30] = [
    "yes",
    "No",
    "ON",
    "off",
    "y",
    "n",
    "~",
    "null",
    "NULL",
    "",
    " ",
    "0123",
    "0x1F",
    "1_000",
    "1:30",
    ".5",
    "1e-5",
    "1.0e+5",
    ".inf",
    ".NaN",
    "2026-01-01",
    "2026-01-01T00:00:00Z",
    "<<",
    "=",
    "- dash",
    "# hash",
    "key: value",
    "trailing ",
    "'quoted'",
    "\"dq\"",
];

#[tokio::test]
async fn files_we_write_read_back_identically_in_python() {
    if !python_with_yaml() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let s = open(tmp.path(), &c);
    let (u, a) = (user("bob@example.com"), agent("agent-a"));
    let mut drafts = Vec::new();
    for (i, h) in HOSTILE.iter().enumerate() {
        let confidence = [0.0, 1.0, 0.1, 1e-5, 0.95][i % 5];
        drafts.push(draft(json!({
            "id": format!("h{i:02}"),
            "content": format!("content {h} end"),
            "category": if i % 3 == 0 { (*h).to_owned() } else { "preference".to_owned() },
            "topics": [h, format!("{h}{h}"), "tab\there", "multi\nline", "emoji 🦌", "用户"],
            "source": *h,
            "confidence": confidence,
            "lastConfirmedAt": if i % 2 == 0 { Value::Null } else { json!(h) },
            "extraNested": {"k": h, "list": [1, 2.5, 1e16, -0.0, true, null], "deep": {"x": [h]}},
            "expected_valid_days": 90 + i,
            "title": format!("Title {h}"),
        })));
    }
    drafts.push(draft(
        json!({"id": "long", "content": "word ".repeat(200), "topics": ["x".repeat(300)]}),
    ));
    drafts.push(draft(json!({"id": "ctrl", "content": "bell \u{7} and \u{1b}[0m escape\u{85}nel", "topics": ["\u{7}", "a\u{0}b", "\u{feff}bom", "\u{2028}"]})));
    s.apply_changes(
        Some(&u),
        Some(&a),
        ChangeSet {
            upserts: drafts,
            ..ChangeSet::default()
        },
        ApplyOptions::default(),
    )
    .await
    .unwrap();
    let mut patch = serde_json::Map::new();
    patch.insert(
        "workContext".into(),
        json!({"summary": "yes: no # 2026-01-01 \u{1} 😀", "updatedAt": "now"}),
    );
    s.update_summaries(
        Some(&u),
        SummaryPatch {
            user: Some(patch),
            history: None,
        },
        None,
    )
    .await
    .unwrap();
    s.record_fact_accesses(Some(&u), &a, &[FactId::new("h01").unwrap()], None)
        .await
        .unwrap();
    let decision = EvictionDecision {
        kept: Vec::new(),
        evicted: vec![EvictedFact {
            fact_id: "h02".into(),
            category: "other".into(),
            score: 1e-7,
            components: serde_json::Map::new(),
        }],
        scores: Default::default(),
        policy: EvictionPolicy::HybridV1,
        reserved_correction_slots: 1,
    };
    s.record_capacity_eviction(Some(&u), &a, &decision, 10, Some(&decision), None)
        .await
        .unwrap();

    let out = Command::new("python3")
        .arg(interop_script("load_root.py"))
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python loader failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let py_view: Value = serde_json::from_slice(&out.stdout).unwrap();

    // Facts: Python's view equals ours (front matter + title + content).
    let doc = s.reload(Some(&u), Some(&a)).await.unwrap();
    let py_facts = py_view["facts"].as_object().unwrap();
    assert_eq!(py_facts.len(), doc.facts.len());
    for f in &doc.facts {
        let rel = format!(
            "users/{}/agents/agent-a/facts/{}/{}.md",
            u.bucket(),
            f.id.shard(),
            f.id
        );
        let mut ours = f.front_matter();
        ours.insert("title".into(), json!(f.title));
        ours.insert("content".into(), json!(f.content));
        let theirs = &py_facts[&rel];
        assert!(
            py::py_eq(&Value::Object(ours.clone()), theirs),
            "{}:\n ours   {}\n theirs {theirs}",
            f.id,
            Value::Object(ours)
        );
    }
    // JSON files: identical values.
    for (rel, theirs) in py_view["json"].as_object().unwrap() {
        let text = std::fs::read_to_string(tmp.path().join(rel)).unwrap();
        let ours = deermem_pycompat::json::parse_lenient(&text).unwrap();
        assert!(py::py_eq(&ours, theirs), "{rel}");
    }
    assert!(
        py_view["json"]
            .as_object()
            .unwrap()
            .keys()
            .any(|k| k.ends_with("eviction-audit.json"))
    );
}

#[tokio::test]
async fn a_python_flock_holder_excludes_our_writers() {
    if !python_with_yaml() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let mut cfg = FileStorageConfig::new(tmp.path());
    cfg.lock_timeout = Duration::from_millis(400);
    let s = Arc::new(FileStorage::new(cfg, c.clone(), None).unwrap());
    let u = user("alice");
    s.apply_changes(
        Some(&u),
        None,
        ChangeSet::default(),
        ApplyOptions::default(),
    )
    .await
    .unwrap();
    let lock = tmp.path().join("users/alice/.memory.lock");
    let mut child = Command::new("python3")
        .arg(interop_script("hold_flock.py"))
        .arg(&lock)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "locked");
    let mut patch = serde_json::Map::new();
    patch.insert(
        "workContext".into(),
        json!({"summary": "x", "updatedAt": "y"}),
    );
    let changes = ChangeSet {
        summaries: Some(SummaryPatch {
            user: Some(patch),
            history: None,
        }),
        ..ChangeSet::default()
    };
    let manifest_before = std::fs::read(tmp.path().join("users/alice/memory.json")).unwrap();
    let err = s
        .apply_changes(Some(&u), None, changes.clone(), ApplyOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(err, StorageError::LockTimeout { .. }), "{err:?}");
    assert!(err.to_string().contains(".memory.lock"));
    assert_eq!(
        std::fs::read(tmp.path().join("users/alice/memory.json")).unwrap(),
        manifest_before,
        "nothing written while locked"
    );
    child.stdin.take().unwrap().write_all(b"release\n").unwrap();
    assert!(child.wait().unwrap().success());
    let r = s
        .apply_changes(Some(&u), None, changes, ApplyOptions::default())
        .await
        .unwrap();
    assert_eq!(r.revision, 2);
}
