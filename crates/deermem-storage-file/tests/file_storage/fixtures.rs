//! The Python reference's fixtures: every v2 fact loads equal to `expected.json`; migrating a
//! copy of `v1-root` yields what the reference's `v1-migrated` holds; lossy user ids read.

use std::path::Path;

use deermem_core::{AgentName, Fact, UserId};
use deermem_pycompat::py;
use serde_json::Value;

use crate::support::*;
use deermem_core::prelude::*;

fn expected(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap()
}

fn split_key(k: &str) -> (UserId, AgentName) {
    let (u, a) = k.split_once('|').unwrap();
    (user(u), agent(a))
}

fn fact_json(f: &Fact) -> Value {
    Value::Object(f.to_internal_map())
}

/// Compares loaded facts with the reference's view, optionally ignoring fields the reference
/// generated at migration time.
fn assert_facts(label: &str, got: &[Fact], want: &Value, ignore: &[&str]) {
    let want = want.as_array().unwrap();
    assert_eq!(got.len(), want.len(), "{label}: fact count");
    for (g, w) in got.iter().zip(want) {
        let mut g = fact_json(g);
        let mut w = w.clone();
        for k in ignore {
            g.as_object_mut().unwrap().shift_remove(*k);
            w.as_object_mut().unwrap().shift_remove(*k);
        }
        assert!(
            py::py_eq(&g, &w),
            "{label}: fact differs\n got {g}\nwant {w}"
        );
    }
}

#[tokio::test]
async fn v2_root_loads_exactly_like_the_reference() {
    let fx = fixtures_dir();
    let tmp = tempfile::tempdir().unwrap();
    copy_dir(&fx.join("v2-root"), tmp.path());
    let no_locks = |m: std::collections::BTreeMap<String, Vec<u8>>| {
        m.into_iter()
            .filter(|(k, _)| !k.ends_with(".memory.lock") && !k.ends_with(".memory.journal.spare"))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let before = no_locks(snapshot(tmp.path()));
    let c = clock();
    let s = open(tmp.path(), &c);
    let exp = expected(&fx);
    let mut checked = 0;
    for (key, want) in exp["v2"].as_object().unwrap() {
        let (u, a) = split_key(key);
        assert_eq!(u.bucket(), want["bucket"], "{key}: bucket");
        let doc = s.load(Some(&u), Some(&a)).await.unwrap();
        assert_eq!(doc.version, want["version"], "{key}");
        assert_eq!(Value::from(doc.revision), want["revision"], "{key}");
        assert!(
            py::py_eq(&Value::Object(doc.user.0.clone()), &want["user"]),
            "{key}: user"
        );
        assert!(
            py::py_eq(&Value::Object(doc.history.0.clone()), &want["history"]),
            "{key}: history"
        );
        assert_facts(key, &doc.facts, &want["facts"], &[]);
        // Every fact is also reachable by id at its shard path.
        for f in &doc.facts {
            assert_eq!(
                s.get_fact(Some(&u), &a, &f.id).await.unwrap().as_ref(),
                Some(f)
            );
        }
        checked += doc.facts.len();
    }
    assert!(checked > 50, "the fixture holds many facts ({checked})");
    // Reads never modify the reference's files (only lock files may appear).
    let after = no_locks(snapshot(tmp.path()));
    let changed: Vec<&String> = before
        .keys()
        .chain(after.keys())
        .filter(|k| before.get(*k) != after.get(*k))
        .collect();
    assert!(changed.is_empty(), "reads changed {changed:?}");
}

#[tokio::test]
async fn v2_root_files_rewrite_byte_identically() {
    let fx = fixtures_dir();
    let root = fx.join("v2-root");
    let files = snapshot(&root);
    // JSON: the manifests and sidecars re-render to the same bytes.
    let mut json_files = 0;
    for (rel, bytes) in files.iter().filter(|(k, _)| k.ends_with(".json")) {
        let text = std::str::from_utf8(bytes).unwrap();
        let v = deermem_pycompat::json::parse_lenient(text).unwrap();
        assert_eq!(deermem_pycompat::json::to_python_json(&v), text, "{rel}");
        json_files += 1;
    }
    assert!(json_files >= 20);
    // Markdown: every fact renders back to the reference's exact bytes.
    let c = clock();
    let s = open(&root, &c);
    let exp = expected(&fx);
    let mut md_files = 0;
    let mut mismatches = Vec::new();
    for key in exp["v2"].as_object().unwrap().keys() {
        let (u, a) = split_key(key);
        for f in s.load(Some(&u), Some(&a)).await.unwrap().facts {
            let rel = format!(
                "users/{}/agents/{}/facts/{}/{}.md",
                u.bucket(),
                a,
                f.id.shard(),
                f.id
            );
            let want = std::str::from_utf8(&files[&rel]).unwrap().to_owned();
            let got = deermem_storage_file::render_fact_markdown(&f).unwrap();
            if got != want {
                mismatches.push(format!("{rel}:\n--- got\n{got}\n--- want\n{want}"));
            }
            md_files += 1;
        }
    }
    assert!(md_files > 50);
    assert!(
        mismatches.is_empty(),
        "{} of {md_files} facts differ:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}

#[tokio::test]
async fn v1_root_migrates_to_what_the_reference_produced() {
    let fx = fixtures_dir();
    let tmp = tempfile::tempdir().unwrap();
    copy_dir(&fx.join("v1-root"), tmp.path());
    let sources = snapshot(tmp.path());
    let c = clock();
    let s = open(tmp.path(), &c);
    let exp = expected(&fx);
    for (key, want) in exp["v1-migrated"].as_object().unwrap() {
        let (u, a) = split_key(key);
        let doc = s.load(Some(&u), Some(&a)).await.unwrap();
        assert_eq!(doc.version, "2.0", "{key}");
        assert_eq!(
            Value::from(doc.revision),
            want["revision"],
            "{key}: revision"
        );
        assert!(
            py::py_eq(&Value::Object(doc.user.0.clone()), &want["user"]),
            "{key}: user {:?}",
            doc.user
        );
        assert!(
            py::py_eq(&Value::Object(doc.history.0.clone()), &want["history"]),
            "{key}: history"
        );
        assert_facts(key, &doc.facts, &want["facts"], &[]);
    }
    // Backups are byte-exact copies of the v1 sources, like the reference's.
    let migrated_ref = snapshot(&fx.join("v1-migrated"));
    let now = snapshot(tmp.path());
    for (rel, bytes) in &sources {
        let bak = format!("{rel}.v1.bak");
        assert_eq!(now.get(&bak), Some(bytes), "{bak} holds the original bytes");
        assert_eq!(
            migrated_ref.get(&bak),
            Some(bytes),
            "the reference's {bak} matches too"
        );
    }
    // The manifests equal the reference's except for the commit time.
    for (rel, theirs) in migrated_ref
        .iter()
        .filter(|(k, _)| k.ends_with("/memory.json"))
    {
        let parse = |b: &[u8]| {
            let mut v: Value = serde_json::from_slice(b).unwrap();
            v.as_object_mut().unwrap().shift_remove("lastUpdated");
            v
        };
        assert_eq!(parse(&now[rel]), parse(theirs), "{rel}");
    }
    // The same fact files exist at the same shard paths, and no legacy per-agent file stays.
    let md = |m: &std::collections::BTreeMap<String, Vec<u8>>| {
        m.keys()
            .filter(|k| k.ends_with(".md"))
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(md(&now), md(&migrated_ref));
    // Every field of those facts is deterministic, so the files are byte-identical too.
    for rel in md(&migrated_ref) {
        assert_eq!(
            String::from_utf8_lossy(&now[&rel]),
            String::from_utf8_lossy(&migrated_ref[&rel]),
            "{rel}"
        );
    }
    assert!(
        !now.keys()
            .any(|k| k.ends_with("agents/researcher/memory.json"))
    );
    // Migration is idempotent: an explicit migrate afterwards reports nothing to do.
    for u in ["carol", "dave@corp.example"] {
        let r = s
            .migrate(Some(&user(u)), &AgentName::default_bucket(), false)
            .await
            .unwrap();
        assert!(!r.migrated, "{u}: second migration is a no-op");
        assert_eq!(r.to_version, "2.0");
    }
}

#[tokio::test]
async fn lossy_user_ids_read_through_their_bucket() {
    let fx = fixtures_dir();
    let tmp = tempfile::tempdir().unwrap();
    copy_dir(&fx.join("v2-root"), tmp.path());
    let c = clock();
    let s = open(tmp.path(), &c);
    let bob = user("bob@example.com");
    assert_eq!(bob.bucket(), "bob-example-com-5ff860bf1190596c");
    let doc = s.load(Some(&bob), Some(&agent("coder"))).await.unwrap();
    assert_eq!(doc.facts.len(), 7);
    assert!(
        doc.facts
            .iter()
            .all(|f| f.scope.user_id.as_deref() == Some("bob@example.com"))
    );
    // The bucket name used as an id (the reference's --all-users) reads the same facts,
    // reported under the requester's id.
    let as_bucket = user("bob-example-com-5ff860bf1190596c");
    let doc2 = s
        .load(Some(&as_bucket), Some(&agent("coder")))
        .await
        .unwrap();
    assert_eq!(doc2.facts.len(), 7);
    assert!(
        doc2.facts
            .iter()
            .all(|f| f.scope.user_id.as_deref() == Some("bob-example-com-5ff860bf1190596c"))
    );
    // list_users names raw ids learned from front matter.
    let users: Vec<String> = s
        .list_users()
        .await
        .unwrap()
        .iter()
        .map(|u| u.as_str().to_owned())
        .collect();
    assert_eq!(
        users,
        vec!["Team_Lead-7", "alice", "bob@example.com", "default", "用户"]
    );
}
