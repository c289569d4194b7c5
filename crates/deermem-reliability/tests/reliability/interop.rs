//! Interoperability under load: a Python writer speaking the reference's lock and format
//! (`tests/interop/py_writer.py`, ours) and a Rust writer share one root and one user at the
//! same time; afterwards Rust reads every fact of both and a revision equal to the number of
//! commits, and Python (PyYAML and `json`, the storage crate's `load_root.py`) reads every
//! file back. Skipped, with the reason printed, when Python with PyYAML is absent.

use std::path::Path;
use std::process::Command;

use deermem_core::{AgentName, UserId};
use deermem_reliability::{figure, pick, verify};
use serde_json::{Value, json};

use crate::support;
use deermem_core::prelude::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_writer_and_a_rust_writer_share_one_root() {
    if !verify::python_with_yaml("interop") {
        return;
    }
    let n: usize = pick(25, 300);
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    let raw = "bob@example.com";
    let uid = UserId::new(raw).unwrap();
    let agent = AgentName::parse("agent-a").unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/py_writer.py");
    let python = Command::new("python3")
        .arg(&script)
        .arg(&root)
        .arg(uid.bucket())
        .arg(raw)
        .arg(agent.as_str())
        .arg(n.to_string())
        .arg("py_")
        .spawn()
        .expect("python writer");
    let storage = support::storage(&root);
    for i in 0..n {
        let d = deermem_core::FactDraft::try_from(json!({"id": format!("rs_{i}"), "content": format!("Written by Rust {i}: yes: no, 1:30")})).unwrap();
        storage
            .upsert_fact(Some(&uid), &agent, d, None, None)
            .await
            .unwrap_or_else(|e| panic!("rust write {i}: {e}"));
    }
    let out = python.wait_with_output().expect("python exits");
    assert!(out.status.success(), "python writer failed");
    let doc = storage.load(Some(&uid), Some(&agent)).await.unwrap();
    assert_eq!(doc.facts.len(), 2 * n, "both writers' facts are present");
    assert_eq!(
        doc.revision as usize,
        2 * n,
        "one revision per commit, none lost"
    );
    for i in 0..n {
        let py = doc
            .fact(&format!("py_{i}"))
            .unwrap_or_else(|| panic!("py_{i} missing"));
        assert_eq!(
            py.content,
            format!("Written by Python {i}: likes 乌龙茶 and yes: no")
        );
        assert_eq!(py.topics, vec!["python", "yes", "1:30"]);
        assert!(doc.fact(&format!("rs_{i}")).is_some(), "rs_{i} missing");
    }
    // Python reads everything back.
    let loader = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deermem-storage-file/tests/interop/load_root.py");
    let out = Command::new("python3")
        .arg(loader)
        .arg(&root)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap();
    let facts = seen["facts"].as_object().unwrap();
    assert_eq!(facts.len(), 2 * n);
    for (path, f) in facts {
        let id = f["id"].as_str().unwrap();
        assert!(path.ends_with(&format!("{id}.md")), "{path}");
        assert_eq!(f["status"], "active");
        let expected = if let Some(i) = id.strip_prefix("rs_") {
            format!("Written by Rust {i}: yes: no, 1:30")
        } else {
            format!("Written by Python {}: likes 乌龙茶 and yes: no", &id[3..])
        };
        assert_eq!(f["content"], expected.as_str(), "{path}");
    }
    let manifest = &seen["json"][format!("users/{}/memory.json", uid.bucket())];
    assert_eq!(manifest["revision"], json!(2 * n));
    figure("interop", "facts_per_writer", n);
}
