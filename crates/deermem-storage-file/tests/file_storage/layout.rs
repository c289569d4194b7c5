//! Layout, formats, cache and journal details of the reference's on-disk protocol.

use std::sync::Arc;
use std::time::Duration;

use deermem_core::{ApplyOptions, ChangeSet, FactId, StorageError, SummaryPatch};
use deermem_storage_file::{FileStorage, FileStorageConfig};
use serde_json::{Value, json};

use crate::support::*;
use deermem_core::prelude::*;

#[tokio::test]
async fn manifest_holds_only_summaries_and_facts_are_sharded_markdown() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let s = open(tmp.path(), &c);
    let (u, a) = (user("alice"), agent("agent-a"));
    let d = draft(
        json!({"id": "fact_01HZZZZZZZZZZZZZZZZZZZZZZZ", "content": "Project uses Python 3.12",
        "category": "constraint", "topics": ["python", "runtime"], "confidence": 0.95,
        "createdAt": "2026-07-17T00:00:00Z", "source": {"type": "manual", "threadId": "thread-1"}, "revision": 1}),
    );
    s.apply_changes(
        Some(&u),
        Some(&a),
        ChangeSet {
            upserts: vec![d],
            upsert_revisions: Some(
                [(
                    FactId::new("fact_01HZZZZZZZZZZZZZZZZZZZZZZZ").unwrap(),
                    None,
                )]
                .into_iter()
                .collect(),
            ),
            ..ChangeSet::default()
        },
        ApplyOptions::default(),
    )
    .await
    .unwrap();
    let manifest = std::fs::read_to_string(tmp.path().join("users/alice/memory.json")).unwrap();
    let v: Value = serde_json::from_str(&manifest).unwrap();
    assert_eq!(
        v.as_object().unwrap().keys().collect::<Vec<_>>(),
        vec!["version", "revision", "lastUpdated", "user", "history"]
    );
    assert_eq!(v["version"], "2.0");
    assert_eq!(v["revision"], 1);
    assert_eq!(v["lastUpdated"], "2026-01-01T00:00:00Z");
    assert!(!manifest.ends_with('\n'));
    assert!(
        manifest.contains("\n  \"user\": {\n    \"workContext\": {\n      \"summary\": \"\",\n")
    );
    let md = std::fs::read_to_string(
        tmp.path()
            .join("users/alice/agents/agent-a/facts/9e/fact_01HZZZZZZZZZZZZZZZZZZZZZZZ.md"),
    )
    .unwrap();
    assert_eq!(
        md,
        "---\nid: fact_01HZZZZZZZZZZZZZZZZZZZZZZZ\ncategory: constraint\ntopics:\n- python\n- runtime\nconfidence: 0.95\ncreatedAt: '2026-07-17T00:00:00Z'\nsource:\n  type: manual\n  threadId: thread-1\nrevision: 1\nschemaVersion: 2\nstatus: active\nconsolidatedFrom: []\nupdatedAt: '2026-07-17T00:00:00Z'\nuser_id: alice\nagent_name: agent-a\n---\n\n# Project uses Python 3.12\n\nProject uses Python 3.12\n"
    );
    assert!(
        !tmp.path()
            .join("users/alice/agents/agent-a/memory.json")
            .exists()
    );
    assert!(!tmp.path().join("users/alice/.memory.journal.json").exists());
    assert!(tmp.path().join("users/alice/.memory.lock").exists());
    // A create-only commit writes no pre-image, so `.recovery/` is never created for it.
    assert!(!tmp.path().join("users/alice/.recovery").exists());
    // The legacy no-user layout lives at the root.
    s.apply_changes(None, None, ChangeSet::default(), ApplyOptions::default())
        .await
        .unwrap();
    assert!(tmp.path().join("memory.json").is_file());
}

#[tokio::test]
async fn strict_scope_and_custom_manifest_name() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let mut cfg = FileStorageConfig::new(tmp.path());
    cfg.strict_user_scope = true;
    cfg.manifest_filename = "index.json".into();
    let s = FileStorage::new(cfg.clone(), c.clone(), None).unwrap();
    let err = s.load(None, None).await.unwrap_err();
    assert!(
        matches!(&err, StorageError::InvalidInput { field, .. } if field == "user_id"),
        "{err:?}"
    );
    s.apply_changes(
        Some(&user("alice")),
        None,
        ChangeSet::default(),
        ApplyOptions::default(),
    )
    .await
    .unwrap();
    assert!(tmp.path().join("users/alice/index.json").is_file());
    assert!(!tmp.path().join("users/alice/memory.json").exists());
    cfg.manifest_filename = "../x.json".into();
    assert!(FileStorage::new(cfg, c, None).is_err());
}

#[tokio::test]
async fn corrupt_manifest_is_an_error_and_stays_untouched() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let s = open(tmp.path(), &c);
    let dir = tmp.path().join("users/alice");
    std::fs::create_dir_all(&dir).unwrap();
    for bad in ["{broken", "[1, 2]", "\u{feff}{}", "{\"revision\": \"abc\"}"] {
        std::fs::write(dir.join("memory.json"), bad).unwrap();
        let err = s.load(Some(&user("alice")), None).await.unwrap_err();
        assert!(
            matches!(err, StorageError::Corrupt { .. }),
            "{bad:?}: {err:?}"
        );
        let err = s
            .apply_changes(
                Some(&user("alice")),
                None,
                ChangeSet::default(),
                ApplyOptions::default(),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(err, StorageError::Corrupt { .. }),
            "{bad:?}: {err:?}"
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("memory.json")).unwrap(),
            bad
        );
    }
}

#[tokio::test]
async fn scope_mismatch_in_front_matter_is_corruption() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let s = open(tmp.path(), &c);
    let (u, a) = (user("alice"), agent("agent-a"));
    s.upsert_fact(Some(&u), &a, fact("f1", "one"), None, None)
        .await
        .unwrap();
    let id = FactId::new("f1").unwrap();
    let path = tmp.path().join(format!(
        "users/alice/agents/agent-a/facts/{}/f1.md",
        id.shard()
    ));
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replace("agent_name: agent-a", "agent_name: agent-b"),
    )
    .unwrap();
    let err = s.reload(Some(&u), Some(&a)).await.unwrap_err();
    assert!(
        err.to_string().starts_with("Fact scope mismatch for "),
        "{err}"
    );
    std::fs::write(&path, text.replace("user_id: alice", "user_id: mallory")).unwrap();
    let err = s.get_fact(Some(&u), &a, &id).await.unwrap_err();
    assert!(err.to_string().contains("scope mismatch"), "{err}");
    // Agent names compare case-insensitively.
    std::fs::write(
        &path,
        text.replace("agent_name: agent-a", "agent_name: Agent-A"),
    )
    .unwrap();
    assert_eq!(s.reload(Some(&u), Some(&a)).await.unwrap().facts.len(), 1);
}

#[tokio::test]
async fn cache_hits_never_scan_fact_files_and_track_other_writers() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let s1 = open(tmp.path(), &c);
    let s2 = open(tmp.path(), &c);
    let (u, a) = (user("alice"), agent("agent-a"));
    s1.upsert_fact(Some(&u), &a, fact("f1", "one"), None, None)
        .await
        .unwrap();
    assert_eq!(s1.load(Some(&u), Some(&a)).await.unwrap().facts.len(), 1);
    // An out-of-band corrupt file is not seen by a cache hit, only by reload.
    let shard = tmp.path().join("users/alice/agents/agent-a/facts/00");
    std::fs::create_dir_all(&shard).unwrap();
    std::fs::write(shard.join("junk.md"), "not a fact").unwrap();
    assert_eq!(s1.load(Some(&u), Some(&a)).await.unwrap().facts.len(), 1);
    assert!(matches!(
        s1.reload(Some(&u), Some(&a)).await,
        Err(StorageError::Corrupt { .. })
    ));
    std::fs::remove_file(shard.join("junk.md")).unwrap();
    assert_eq!(s1.reload(Some(&u), Some(&a)).await.unwrap().facts.len(), 1);
    // Another instance's commit invalidates this instance's cache through the signature,
    // even when mtime and size are forced to collide (the revision decides).
    let manifest = tmp.path().join("users/alice/memory.json");
    let meta = std::fs::metadata(&manifest).unwrap();
    let (mtime, size) = (meta.modified().unwrap(), meta.len());
    c.advance_secs(1);
    s2.upsert_fact(Some(&u), &a, fact("f2", "two"), None, None)
        .await
        .unwrap();
    let meta2 = std::fs::metadata(&manifest).unwrap();
    assert_eq!(
        meta2.len(),
        size,
        "same-size manifest for the collision check"
    );
    std::fs::File::options()
        .write(true)
        .open(&manifest)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    let doc = s1.load(Some(&u), Some(&a)).await.unwrap();
    assert_eq!(doc.facts.len(), 2);
    assert_eq!(doc.revision, 2);
}

#[tokio::test]
async fn lock_registry_keeps_no_unused_entries() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let s = open(tmp.path(), &c);
    for i in 0..5 {
        let u = user(&format!("user{i}"));
        s.upsert_fact(Some(&u), &agent("a"), fact("f", "x"), None, None)
            .await
            .unwrap();
    }
    assert_eq!(s.live_lock_entries(), 0);
}

fn write_prepared_journal(
    udir: &std::path::Path,
    op: &str,
    old_id: &str,
    new_id: &str,
    agent: &str,
) {
    let old = FactId::new(old_id).unwrap();
    let journal = json!({
        "operationId": op,
        "state": "prepared",
        "agentName": agent,
        "expectedRevision": 1,
        "nextRevision": 2,
        "factIds": [new_id, old_id],
        "oldEntries": {old_id: {"path": format!("agents/{agent}/facts/{}/{old_id}.md", old.shard())}},
    });
    std::fs::write(
        udir.join(".memory.journal.json"),
        serde_json::to_string_pretty(&journal).unwrap(),
    )
    .unwrap();
}

#[tokio::test]
async fn a_prepared_journal_is_rolled_back_on_next_access() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let s = open(tmp.path(), &c);
    let (u, a) = (user("alice"), agent("agent-a"));
    s.upsert_fact(Some(&u), &a, fact("old1", "original"), None, None)
        .await
        .unwrap();
    let udir = tmp.path().join("users/alice");
    let old_path = udir.join(format!(
        "agents/agent-a/facts/{}/old1.md",
        FactId::new("old1").unwrap().shard()
    ));
    let new_path = udir.join(format!(
        "agents/agent-a/facts/{}/new1.md",
        FactId::new("new1").unwrap().shard()
    ));
    // Simulate the reference crashing mid-commit: pre-images and journal, then torn targets.
    let op = "3419415bbd3848a8b0c033a32bc4aadf";
    let op_dir = udir.join(".recovery").join(op);
    std::fs::create_dir_all(&op_dir).unwrap();
    std::fs::copy(udir.join("memory.json"), op_dir.join("memory.json")).unwrap();
    std::fs::copy(&old_path, op_dir.join("old1.md")).unwrap();
    let manifest_before = std::fs::read(udir.join("memory.json")).unwrap();
    let old_before = std::fs::read(&old_path).unwrap();
    write_prepared_journal(&udir, op, "old1", "new1", "agent-a");
    std::fs::write(&old_path, "---\ncorrupted").unwrap();
    std::fs::create_dir_all(new_path.parent().unwrap()).unwrap();
    std::fs::write(&new_path, "half-written").unwrap();
    std::fs::write(
        udir.join("memory.json"),
        "{\"version\": \"2.0\", \"revision\": 2}",
    )
    .unwrap();
    let doc = s.load(Some(&u), Some(&a)).await.unwrap();
    assert_eq!(doc.revision, 1);
    assert_eq!(doc.facts.len(), 1);
    assert_eq!(doc.facts[0].content, "original");
    assert_eq!(
        std::fs::read(udir.join("memory.json")).unwrap(),
        manifest_before
    );
    assert_eq!(std::fs::read(&old_path).unwrap(), old_before);
    assert!(!new_path.exists());
    assert!(!udir.join(".memory.journal.json").exists());
    assert!(!op_dir.exists());
}

#[tokio::test]
async fn invalid_journals_block_the_user_and_touch_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let s = open(tmp.path(), &c);
    let (u, a) = (user("alice"), agent("agent-a"));
    s.upsert_fact(Some(&u), &a, fact("f1", "one"), None, None)
        .await
        .unwrap();
    let udir = tmp.path().join("users/alice");
    let outside = tmp.path().join("outside.md");
    std::fs::write(&outside, "keep me").unwrap();
    let cases = [
        "{not json".to_owned(),
        json!({"state": "prepared"}).to_string(),
        json!({"operationId": "../x", "state": "prepared"}).to_string(),
        json!({"operationId": "op", "state": "weird"}).to_string(),
        json!({"operationId": "op", "state": "prepared", "agentName": 5}).to_string(),
        json!({"operationId": "op", "state": "prepared", "agentName": "agent-a", "factIds": ["../../x"], "oldEntries": {}}).to_string(),
        json!({"operationId": "op", "state": "prepared", "agentName": "agent-a", "factIds": [], "oldEntries": {"f1": {"path": "../../outside.md"}}}).to_string(),
        json!({"operationId": "op", "state": "prepared", "agentName": "agent-a", "factIds": [], "oldEntries": {"f1": {"path": "/etc/passwd"}}}).to_string(),
    ];
    let op_dir = udir.join(".recovery/op");
    std::fs::create_dir_all(&op_dir).unwrap();
    std::fs::write(op_dir.join("f1.md"), "malicious").unwrap();
    for j in &cases {
        std::fs::write(udir.join(".memory.journal.json"), j).unwrap();
        let before = snapshot(tmp.path());
        let err = s.load(Some(&u), Some(&a)).await.unwrap_err();
        assert!(matches!(err, StorageError::Corrupt { .. }), "{j}: {err:?}");
        let err = s
            .upsert_fact(Some(&u), &a, fact("f9", "x"), None, None)
            .await
            .unwrap_err();
        assert!(matches!(err, StorageError::Corrupt { .. }), "{j}: {err:?}");
        assert_eq!(snapshot(tmp.path()), before, "{j}: nothing touched");
    }
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "keep me");
}

#[tokio::test]
async fn stale_recovery_dirs_and_orphaned_temps_are_cleaned() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let s = open(tmp.path(), &c);
    let (u, a) = (user("alice"), agent("agent-a"));
    s.upsert_fact(Some(&u), &a, fact("f1", "one"), None, None)
        .await
        .unwrap();
    let udir = tmp.path().join("users/alice");
    // A crash before the prepared journal: a pre-image dir and temps, no journal.
    std::fs::create_dir_all(udir.join(".recovery/deadbeef")).unwrap();
    std::fs::write(udir.join(".recovery/deadbeef/memory.json"), "{}").unwrap();
    let tmp_name = ".memory.json.0123456789abcdef0123456789abcdef.tmp";
    std::fs::write(udir.join(tmp_name), "partial").unwrap();
    let shard = udir.join(format!(
        "agents/agent-a/facts/{}",
        FactId::new("f1").unwrap().shard()
    ));
    std::fs::write(
        shard.join(".f1.md.0123456789abcdef0123456789abcdef.tmp"),
        "partial",
    )
    .unwrap();
    std::fs::write(shard.join("notes.tmp"), "not ours").unwrap();
    s.upsert_fact(Some(&u), &a, fact("f2", "two"), None, None)
        .await
        .unwrap();
    assert!(!udir.join(".recovery/deadbeef").exists());
    assert!(!udir.join(tmp_name).exists());
    assert!(
        !shard
            .join(".f1.md.0123456789abcdef0123456789abcdef.tmp")
            .exists()
    );
    assert!(
        shard.join("notes.tmp").exists(),
        "files not of our format stay"
    );
}

#[tokio::test]
async fn clear_all_keeps_agent_configuration_files() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let s = open(tmp.path(), &c);
    let (u, a) = (user("alice"), agent("agent-a"));
    s.upsert_fact(Some(&u), &a, fact("f1", "one"), None, None)
        .await
        .unwrap();
    let adir = tmp.path().join("users/alice/agents/agent-a");
    std::fs::write(adir.join("config.yaml"), "name: agent-a\n").unwrap();
    std::fs::write(adir.join("SOUL.md"), "soul").unwrap();
    std::fs::create_dir_all(tmp.path().join("users/alice/agents/Host_Dir")).unwrap();
    s.record_fact_accesses(Some(&u), &a, &[FactId::new("f1").unwrap()], None)
        .await
        .unwrap();
    let doc = s.clear_all(Some(&u)).await.unwrap();
    assert!(doc.facts.is_empty());
    assert_eq!(
        std::fs::read_to_string(adir.join("config.yaml")).unwrap(),
        "name: agent-a\n"
    );
    assert_eq!(
        std::fs::read_to_string(adir.join("SOUL.md")).unwrap(),
        "soul"
    );
    assert!(!adir.join(".metadata").exists());
    assert!(tmp.path().join("users/alice/agents/Host_Dir").is_dir());
    assert!(s.load(Some(&u), Some(&a)).await.unwrap().facts.is_empty());
}

#[tokio::test]
async fn summaries_keep_unknown_children_and_extra_keys_are_dropped_on_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let s = open(tmp.path(), &c);
    let u = user("alice");
    let dir = tmp.path().join("users/alice");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("memory.json"),
        r#"{"version": "2.0", "revision": 4, "lastUpdated": "x", "extraKey": 1, "user": {"workContext": {"summary": "w", "updatedAt": "t"}, "custom": {"summary": "c", "updatedAt": ""}}, "history": {}}"#,
    )
    .unwrap();
    let doc = s.load(Some(&u), None).await.unwrap();
    assert_eq!(doc.extra.get("extraKey"), Some(&json!(1)));
    assert_eq!(doc.revision, 4);
    let mut p = serde_json::Map::new();
    p.insert(
        "topOfMind".into(),
        json!({"summary": "t", "updatedAt": "now"}),
    );
    let doc = s
        .update_summaries(
            Some(&u),
            SummaryPatch {
                user: Some(p),
                history: None,
            },
            Some(4),
        )
        .await
        .unwrap();
    assert_eq!(doc.revision, 5);
    assert!(doc.extra.is_empty());
    assert_eq!(doc.user.entry("custom").summary, "c");
    assert_eq!(doc.user.entry("workContext").summary, "w");
    let doc = s.clear_all(Some(&u)).await.unwrap();
    assert_eq!(
        doc.user.entry("custom").summary,
        "c",
        "clear resets only the default children"
    );
    assert_eq!(doc.user.entry("workContext").summary, "");
}

#[tokio::test]
async fn lock_timeout_is_typed_and_does_not_block_the_runtime() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let mut cfg = FileStorageConfig::new(tmp.path());
    cfg.lock_timeout = Duration::from_millis(300);
    let s = Arc::new(FileStorage::new(cfg, c.clone(), None).unwrap());
    let holder = hold_user_lock(tmp.path(), "alice");
    let err = s
        .apply_changes(
            Some(&user("alice")),
            None,
            ChangeSet::default(),
            ApplyOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StorageError::LockTimeout { .. }), "{err:?}");
    // Another user is not blocked.
    s.apply_changes(
        Some(&user("bob")),
        None,
        ChangeSet::default(),
        ApplyOptions::default(),
    )
    .await
    .unwrap();
    holder.unlock().unwrap();
    s.apply_changes(
        Some(&user("alice")),
        None,
        ChangeSet::default(),
        ApplyOptions::default(),
    )
    .await
    .unwrap();
}

/// A new root's `users/` is marked as the top of per-user trees (`chattr +T`) wherever the
/// filesystem has that flag, so user directories are spread over its block groups; the root of
/// an existing installation is never touched.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_new_users_directory_is_marked_as_a_top_directory() {
    use rustix::fs::{IFlags, ioctl_getflags, ioctl_setflags};
    let tmp = tempfile::tempdir().unwrap();
    // Does this filesystem take the flag at all?
    let probe = tmp.path().join("probe");
    std::fs::create_dir(&probe).unwrap();
    let supported = std::fs::File::open(&probe)
        .ok()
        .and_then(|f| {
            let flags = ioctl_getflags(&f).ok()?;
            ioctl_setflags(&f, flags | IFlags::TOPDIR).ok()?;
            Some(ioctl_getflags(&f).ok()?.contains(IFlags::TOPDIR))
        })
        .unwrap_or(false);
    let root = tmp.path().join("root");
    let c = clock();
    let s = open(&root, &c);
    s.upsert_fact(
        Some(&user("alice")),
        &agent("agent-a"),
        fact("f1", "one"),
        None,
        None,
    )
    .await
    .unwrap();
    let users = std::fs::File::open(root.join("users")).unwrap();
    let flags = ioctl_getflags(&users);
    if supported {
        assert!(flags.unwrap().contains(IFlags::TOPDIR), "users/ not marked");
    } else {
        eprintln!("this filesystem has no FS_TOPDIR_FL; the storage must still work");
        assert!(
            s.get_fact(
                Some(&user("alice")),
                &agent("agent-a"),
                &deermem_core::FactId::new("f1").unwrap()
            )
            .await
            .unwrap()
            .is_some()
        );
    }

    // An existing users/ directory keeps its flags.
    let old = tmp.path().join("old");
    std::fs::create_dir_all(old.join("users")).unwrap();
    let s = open(&old, &c);
    s.upsert_fact(
        Some(&user("bob")),
        &agent("agent-a"),
        fact("f1", "one"),
        None,
        None,
    )
    .await
    .unwrap();
    if supported {
        let f = std::fs::File::open(old.join("users")).unwrap();
        assert!(!ioctl_getflags(&f).unwrap().contains(IFlags::TOPDIR));
    }
}

/// The journal is written into one recycled inode, `.memory.journal.spare` between commits:
/// no journal is left after a commit, the spare's inode is the same from commit to commit, and
/// its bytes are the last journal's (never read back, so they need no cleaning).
#[cfg(unix)]
#[tokio::test]
async fn the_journal_recycles_one_inode_between_commits() {
    use std::os::unix::fs::MetadataExt;
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let s = open(tmp.path(), &c);
    let (u, a) = (user("alice"), agent("agent-a"));
    let udir = tmp.path().join("users/alice");
    s.upsert_fact(Some(&u), &a, fact("f1", "one"), None, None)
        .await
        .unwrap();
    assert!(!udir.join(".memory.journal.json").exists());
    let spare = udir.join(".memory.journal.spare");
    let first = std::fs::metadata(&spare).unwrap();
    assert!(first.is_file());
    let text = std::fs::read_to_string(&spare).unwrap();
    let j: Value = serde_json::from_str(&text).expect("the last journal, whole");
    assert_eq!(j["factIds"], json!(["f1"]));
    for (id, content) in [("f2", "two"), ("f3", "three")] {
        s.upsert_fact(Some(&u), &a, fact(id, content), None, None)
            .await
            .unwrap();
        let now = std::fs::metadata(&spare).unwrap();
        assert_eq!(now.ino(), first.ino(), "the same inode is reused");
        assert_eq!(now.nlink(), 1);
        let j: Value = serde_json::from_str(&std::fs::read_to_string(&spare).unwrap()).unwrap();
        assert_eq!(
            j["factIds"],
            json!([id]),
            "no bytes of a longer journal stay behind"
        );
    }
    assert!(!udir.join(".memory.journal.json").exists());
    let doc = s.reload(Some(&u), Some(&a)).await.unwrap();
    assert_eq!(doc.facts.len(), 3);
    assert_eq!(doc.revision, 3);
}

/// Whatever sits at the spare's name is never written through: a symbolic link (to a file
/// outside the root), a hard link shared with another file, a directory or garbage from a crash
/// mid-rewrite. Commits go through with a fresh journal file and nothing outside is touched.
#[cfg(unix)]
#[tokio::test]
async fn a_foreign_journal_spare_is_never_written_through() {
    use std::os::unix::fs::MetadataExt;
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let s = open(tmp.path(), &c);
    let (u, a) = (user("alice"), agent("agent-a"));
    let udir = tmp.path().join("users/alice");
    s.upsert_fact(Some(&u), &a, fact("f0", "zero"), None, None)
        .await
        .unwrap();
    let spare = udir.join(".memory.journal.spare");
    let outside = tmp.path().join("outside.txt");

    // A symbolic link to a file outside.
    std::fs::remove_file(&spare).unwrap();
    std::fs::write(&outside, "keep me").unwrap();
    std::os::unix::fs::symlink(&outside, &spare).unwrap();
    s.upsert_fact(Some(&u), &a, fact("f1", "one"), None, None)
        .await
        .unwrap();
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "keep me");

    // A hard link shared with another file.
    let _ = std::fs::remove_file(&spare);
    std::fs::hard_link(&outside, &spare).unwrap();
    s.upsert_fact(Some(&u), &a, fact("f2", "two"), None, None)
        .await
        .unwrap();
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "keep me");
    assert_eq!(std::fs::metadata(&outside).unwrap().nlink(), 1);

    // A directory with something in it.
    let _ = std::fs::remove_file(&spare);
    std::fs::create_dir(&spare).unwrap();
    std::fs::write(spare.join("x"), "x").unwrap();
    s.upsert_fact(Some(&u), &a, fact("f3", "three"), None, None)
        .await
        .unwrap();
    assert_eq!(std::fs::read_to_string(spare.join("x")).unwrap(), "x");
    std::fs::remove_dir_all(&spare).unwrap();

    // Garbage left by a crash while the spare was being rewritten.
    std::fs::write(&spare, "{\"operationId\": \"torn").unwrap();
    s.upsert_fact(Some(&u), &a, fact("f4", "four"), None, None)
        .await
        .unwrap();

    assert!(!udir.join(".memory.journal.json").exists());
    let fresh = open(tmp.path(), &c);
    let doc = fresh.load(Some(&u), Some(&a)).await.unwrap();
    assert_eq!(doc.facts.len(), 5);
    assert_eq!(doc.revision, 5);
}
