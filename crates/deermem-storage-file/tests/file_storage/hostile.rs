//! Hostile input: traversal ids and names, NUL, huge content, malformed files. Every case is a
//! typed error or works; nothing outside the root is touched and no data is lost.

use deermem_core::{AgentName, FactDraft, FactId, StorageError, UserId};
use serde_json::json;

use crate::support::*;
use deermem_core::prelude::*;

#[tokio::test]
async fn traversal_ids_never_leave_the_root() {
    let outer = tempfile::tempdir().unwrap();
    let root = outer.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(outer.path().join("sentinel"), "keep").unwrap();
    let c = clock();
    let s = open(&root, &c);
    // Core types reject hostile names before any path is built.
    for bad in ["../x", "a/b", "a\0b", "", "..", "a b"] {
        assert!(AgentName::parse(bad).is_err(), "{bad:?}");
        assert!(FactId::new(bad).is_err(), "{bad:?}");
    }
    assert!(UserId::new("a\0b").is_err());
    // Hostile but valid user ids map to safe buckets.
    for raw in ["../../etc", "..", "/abs/path", "a/../../b", "用户/.."] {
        let u = UserId::new(raw).unwrap();
        s.upsert_fact(Some(&u), &agent("a"), fact("f", raw), None, None)
            .await
            .unwrap();
        assert_eq!(
            s.load(Some(&u), Some(&agent("a"))).await.unwrap().facts[0].content,
            raw
        );
    }
    // Hostile draft ids are typed errors, with the storage error's field, before any write.
    for bad in ["../../sentinel", "a/b", "x\u{0}y", "é"] {
        let err = FactDraft::try_from(json!({"id": bad, "content": "x"})).unwrap_err();
        let err = StorageError::from(err);
        assert!(
            matches!(&err, StorageError::InvalidInput { field, .. } if field == "fact.id"),
            "{bad:?}: {err:?}"
        );
    }
    let entries: Vec<String> = std::fs::read_dir(outer.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let mut entries = entries;
    entries.sort();
    assert_eq!(entries, vec!["root", "sentinel"]);
    assert_eq!(
        std::fs::read_to_string(outer.path().join("sentinel")).unwrap(),
        "keep"
    );
}

#[tokio::test]
async fn huge_and_strange_content_round_trips() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let s = open(tmp.path(), &c);
    let (u, a) = (user("alice"), agent("agent-a"));
    let big = "x".repeat(10 * 1024 * 1024);
    s.upsert_fact(Some(&u), &a, fact("big", &big), None, None)
        .await
        .unwrap();
    let got = s
        .get_fact(Some(&u), &a, &FactId::new("big").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.content.len(), big.len());
    assert_eq!(got.title.chars().count(), 160);
    let strange = "---\nnot front matter\n---\n# heading\n\ttabs \u{1F600} \u{202E}rtl \\ \"q\" 'q' : # yes no ~ null";
    s.upsert_fact(Some(&u), &a, fact("strange", strange), None, None)
        .await
        .unwrap();
    let got = s
        .get_fact(Some(&u), &a, &FactId::new("strange").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.content, strange);
    let huge_title = draft(json!({"id": "t", "content": "c", "title": "T".repeat(5000)}));
    s.upsert_fact(Some(&u), &a, huge_title, None, None)
        .await
        .unwrap();
    let t = s
        .get_fact(Some(&u), &a, &FactId::new("t").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(t.title.len(), 160);
}

#[tokio::test]
async fn malformed_fact_files_are_typed_corruption_and_untouched() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let s = open(tmp.path(), &c);
    let (u, a) = (user("alice"), agent("agent-a"));
    s.upsert_fact(Some(&u), &a, fact("f1", "one"), None, None)
        .await
        .unwrap();
    let path = fact_path(tmp.path(), "alice", "agent-a", "f1");
    let good = std::fs::read(&path).unwrap();
    let good_text = String::from_utf8(good.clone()).unwrap();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        ("truncated", good[..good.len() / 3].to_vec()),
        ("bom", [b"\xEF\xBB\xBF".as_slice(), &good].concat()),
        ("no front matter", b"# title\n\nbody\n".to_vec()),
        ("unterminated", b"---\nid: f1\n".to_vec()),
        (
            "bad yaml",
            b"---\nid: [unclosed\n---\n\n# t\n\nb\n".to_vec(),
        ),
        (
            "not a mapping",
            b"---\n- a\n- b\n---\n\n# t\n\nb\n".to_vec(),
        ),
        (
            "invalid utf-8",
            [&good[..10], b"\xff\xfe".as_slice(), &good[10..]].concat(),
        ),
        (
            "id mismatch",
            good_text.replace("id: f1", "id: other").into_bytes(),
        ),
        (
            "bad confidence",
            good_text
                .replace("confidence: 0.9", "confidence: 7.0")
                .into_bytes(),
        ),
        (
            "unquoted timestamp",
            good_text
                .replace(
                    "createdAt: '2026-01-01T00:00:00Z'",
                    "createdAt: 2026-01-01T00:00:00Z",
                )
                .into_bytes(),
        ),
        (
            "status",
            good_text
                .replace("status: active", "status: deleted")
                .into_bytes(),
        ),
    ];
    for (name, bytes) in cases {
        std::fs::write(&path, &bytes).unwrap();
        let before = snapshot(tmp.path());
        let err = s.reload(Some(&u), Some(&a)).await.unwrap_err();
        assert!(
            matches!(err, StorageError::Corrupt { .. }),
            "{name}: {err:?}"
        );
        let err = s
            .get_fact(Some(&u), &a, &FactId::new("f1").unwrap())
            .await
            .unwrap_err();
        assert!(
            matches!(err, StorageError::Corrupt { .. }),
            "{name}: {err:?}"
        );
        let err = s
            .delete_fact(Some(&u), &a, &FactId::new("f1").unwrap(), None, None)
            .await
            .unwrap_err();
        assert!(
            matches!(err, StorageError::Corrupt { .. }),
            "{name}: {err:?}"
        );
        let after: std::collections::BTreeMap<_, _> = snapshot(tmp.path());
        assert_eq!(after, before, "{name}: nothing touched");
    }
    std::fs::write(&path, &good).unwrap();
    assert_eq!(s.reload(Some(&u), Some(&a)).await.unwrap().facts.len(), 1);
    // CRLF files are accepted (universal newlines).
    std::fs::write(&path, good_text.replace('\n', "\r\n")).unwrap();
    assert_eq!(
        s.reload(Some(&u), Some(&a)).await.unwrap().facts[0].content,
        "one"
    );
}

#[tokio::test]
async fn a_fact_in_the_wrong_shard_is_listed_but_not_addressable() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let s = open(tmp.path(), &c);
    let (u, a) = (user("alice"), agent("agent-a"));
    s.upsert_fact(Some(&u), &a, fact("f1", "one"), None, None)
        .await
        .unwrap();
    let path = fact_path(tmp.path(), "alice", "agent-a", "f1");
    let wrong = tmp.path().join("users/alice/agents/agent-a/facts/zz/f1.md");
    std::fs::create_dir_all(wrong.parent().unwrap()).unwrap();
    std::fs::rename(&path, &wrong).unwrap();
    let doc = s.reload(Some(&u), Some(&a)).await.unwrap();
    assert_eq!(doc.facts.len(), 1, "listed like the reference");
    assert!(
        s.get_fact(Some(&u), &a, &FactId::new("f1").unwrap())
            .await
            .unwrap()
            .is_none()
    );
    // An update then writes the canonical copy; the listing shows the id once, the canonical.
    let mut d = doc.facts[0].to_draft();
    d = d.with("content", serde_json::json!("rewritten")).unwrap();
    d = d.with("title", serde_json::json!("")).unwrap();
    s.upsert_fact(Some(&u), &a, d, None, None).await.unwrap();
    let doc = s.reload(Some(&u), Some(&a)).await.unwrap();
    assert_eq!(doc.facts.len(), 1);
    assert_eq!(doc.facts[0].content, "rewritten");
    assert!(
        wrong.exists(),
        "the misplaced file is left for the operator"
    );
}

/// A root shared with the reference may hold a fact whose id is 201 to about 251 bytes: the
/// reference stores any id its file-name limit allows, ours are at most 200 bytes. Loading
/// that bucket is refused with a corruption error naming the file and the id rule; nothing
/// is dropped silently and no file is changed, so the reference still reads it.
#[tokio::test]
async fn a_stored_fact_id_longer_than_ours_is_refused_clearly_and_kept() {
    use sha2::{Digest, Sha256};
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let u = user("alice");
    let s = open(tmp.path(), &c);
    for (id, content) in [
        ("fact_short", "short one"),
        ("fact_temp", "from the reference"),
    ] {
        s.upsert_fact(Some(&u), &agent("a"), fact(id, content), None, None)
            .await
            .unwrap();
    }
    s.close().await;
    // What the reference writes for a 220-byte id: the same file under that id.
    let long = format!("fact_{}", "a".repeat(215));
    let src = fact_path(tmp.path(), "alice", "a", "fact_temp");
    let text = std::fs::read_to_string(&src)
        .unwrap()
        .replace("fact_temp", &long);
    let shard = hex::encode(&Sha256::digest(long.as_bytes())[..1]);
    let dst = tmp
        .path()
        .join(format!("users/alice/agents/a/facts/{shard}/{long}.md"));
    std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
    std::fs::write(&dst, &text).unwrap();
    std::fs::remove_file(&src).unwrap();
    let facts_before = md_bytes(tmp.path());

    let s = open(tmp.path(), &c);
    let err = s.load(Some(&u), Some(&agent("a"))).await.unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, StorageError::Corrupt { .. }), "{err:?}");
    assert!(message.contains(&long[..40]), "{message}");
    assert!(
        message.contains("fact.id is 220 bytes; fact ids are at most 200 bytes here"),
        "{message}"
    );
    assert_eq!(md_bytes(tmp.path()), facts_before, "no fact file changed");
}

/// Every Markdown file under `root` with its bytes.
fn md_bytes(root: &std::path::Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    snapshot(root)
        .into_iter()
        .filter(|(k, _)| k.ends_with(".md"))
        .collect()
}
