//! The pre-isolation layout migration (`migrate_user_isolation`): a legacy tree with a shared
//! manifest, agents with their configuration files and one conflicting agent moves into a
//! user's bucket keeping every file; a dry run leaves the tree byte-identical; a second run is
//! a no-op; the migrated data loads through the storage; the legacy agent-definition fallback.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use deermem_core::prelude::*;
use deermem_core::{AgentName, StorageError, UserId};
use deermem_storage_file::isolation::{
    AgentConfigDir, IsolationAction, IsolationItemKind, IsolationOptions, IsolationSummary,
    legacy_agent_config_dir, migrate_user_isolation, resolve_agent_config_dir,
};
use deermem_storage_file::{FileStorage, FileStorageConfig};
use deermem_testkit::clock::ManualClock;
use serde_json::{Value, json};

fn user(s: &str) -> UserId {
    UserId::new(s).unwrap()
}

fn agent(s: &str) -> AgentName {
    AgentName::parse(s).unwrap()
}

fn storage(root: &Path) -> FileStorage {
    let clock = Arc::new(ManualClock::at("2026-01-01T00:00:00Z"));
    FileStorage::new(FileStorageConfig::new(root), clock, None).unwrap()
}

fn options(dry_run: bool) -> IsolationOptions {
    IsolationOptions {
        dry_run,
        ..IsolationOptions::default()
    }
}

/// Every file (with its bytes), directory and symlink under `root`, by relative path.
fn snapshot(root: &Path) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                out.insert(rel, None);
                stack.push(p);
            } else {
                out.insert(rel, Some(std::fs::read(&p).unwrap()));
            }
        }
    }
    out
}

fn v1_doc(summary: &str, facts: Value) -> String {
    let empty = json!({"summary": "", "updatedAt": ""});
    serde_json::to_string_pretty(&json!({
        "version": "1.0",
        "lastUpdated": "2026-05-01T00:00:00Z",
        "user": {
            "workContext": if summary.is_empty() { empty.clone() } else {
                json!({"summary": summary, "updatedAt": "2026-05-01T00:00:00Z"})
            },
            "personalContext": empty, "topOfMind": empty
        },
        "history": {"recentMonths": empty, "earlierContext": empty, "longTermBackground": empty},
        "facts": facts
    }))
    .unwrap()
}

fn v1_fact(id: &str, content: &str) -> Value {
    json!({"id": id, "content": content, "category": "preference", "confidence": 0.9,
           "source": "manual", "createdAt": "2026-03-10T08:30:00Z"})
}

/// The legacy shared layout: a v1 manifest, three agent directories (two with configuration
/// files, one also with a v1 per-agent document, one with Markdown facts written without a
/// user), and an existing per-user `writer` agent the legacy `writer` conflicts with.
fn legacy_tree(root: &Path) {
    let w = |rel: &str, text: &str| {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    w(
        "memory.json",
        &v1_doc(
            "legacy summary",
            json!([v1_fact("fact_legacy1", "Prefers tea")]),
        ),
    );
    w("agents/Researcher/SOUL.md", "# Researcher\nDigs deep.\n");
    w(
        "agents/Researcher/config.yaml",
        "name: researcher\ntools: [web]\n",
    );
    w(
        "agents/Researcher/memory.json",
        &v1_doc("", json!([v1_fact("fact_res1", "Reads papers on Fridays")])),
    );
    w("agents/coder/config.yaml", "name: coder\n");
    w("agents/coder/notes/extra.txt", "keep me\n");
    w("agents/writer/SOUL.md", "legacy writer soul\n");
    w(
        "users/default/agents/writer/SOUL.md",
        "current writer soul\n",
    );
    w("agents/README.txt", "a plain file next to the agents\n");
}

/// Writes two Markdown facts into the user-less layout's `coder` bucket, the way DeerMem does
/// without a user (`user_id: null`).
async fn userless_facts(root: &Path) {
    let s = storage(root);
    for (id, content) in [
        ("fact_c1", "Uses Rust 2024"),
        ("fact_c2", "Ships on Tuesdays"),
    ] {
        let draft = json!({"id": id, "content": content, "category": "preference",
                           "confidence": 0.9, "source": "manual"});
        s.upsert_fact(
            None,
            &agent("coder"),
            deermem_core::FactDraft::try_from(draft).unwrap(),
            None,
            None,
        )
        .await
        .unwrap();
    }
}

fn kinds_and_actions(report: &deermem_storage_file::isolation::IsolationReport) -> Vec<String> {
    report
        .items
        .iter()
        .map(|i| format!("{} {}", i.kind, i.action.label()))
        .collect()
}

#[tokio::test]
async fn legacy_tree_migrates_into_the_bucket_keeping_every_file() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    // Facts first: the user-less commit writes a v2 manifest, which the v1 one then replaces
    // so that the lazy v1 -> v2 migration runs after the move.
    userless_facts(root).await;
    legacy_tree(root);
    let v1 = std::fs::read_to_string(root.join("memory.json")).unwrap();
    let before = snapshot(root);
    let coder_facts: Vec<PathBuf> = before
        .keys()
        .filter(|p| p.starts_with("agents/coder/facts") && p.extension().is_some_and(|e| e == "md"))
        .cloned()
        .collect();
    assert_eq!(coder_facts.len(), 2);

    let report = migrate_user_isolation(root, &user("default"), &options(false)).unwrap();
    assert_eq!(
        kinds_and_actions(&report),
        vec![
            "manifest moved",
            "agent Researcher moved",
            "agent coder moved",
            "agent writer conflict",
        ]
    );
    assert_eq!(
        report.summary(),
        IsolationSummary {
            migrated: 3,
            conflicts: 1,
            planned: 0,
            current: 0,
            failed: 0
        }
    );
    assert_eq!(report.exit_code(), 0);
    let text = report.to_string();
    assert!(
        text.ends_with("Summary: migrated=3 conflicts=1 planned=0 current=0 failed=0"),
        "{text}"
    );
    assert!(text.contains("agent writer: CONFLICT"), "{text}");
    assert!(
        text.contains("rescoped 2 fact file(s) written without a user to user default"),
        "{text}"
    );

    // The manifest moved as is (still v1; the storage migrates it lazily).
    assert!(!root.join("memory.json").exists());
    let bucket = root.join("users/default");
    assert_eq!(
        std::fs::read_to_string(bucket.join("memory.json")).unwrap(),
        v1
    );
    // Every agent file moved byte-identical, the directory name lowercased.
    for (rel, bytes) in &before {
        let Some(bytes) = bytes else { continue };
        let Ok(inside) = rel.strip_prefix("agents") else {
            continue;
        };
        let mut parts = inside.components();
        let Some(name) = parts.next() else { continue };
        let name = name.as_os_str().to_str().unwrap();
        let rest = parts.as_path();
        if rest.as_os_str().is_empty() {
            // README.txt: a plain file next to the agents stays where it was.
            assert_eq!(&std::fs::read(root.join(rel)).unwrap(), bytes);
            continue;
        }
        let moved = if name == "writer" {
            root.join("migration-conflicts/agents/writer").join(rest)
        } else {
            bucket.join("agents").join(name.to_lowercase()).join(rest)
        };
        let now = std::fs::read(&moved).unwrap_or_else(|e| panic!("{}: {e}", moved.display()));
        if coder_facts.contains(rel) {
            // Rescoped: only the user line differs.
            let old = String::from_utf8(bytes.clone()).unwrap();
            let new = String::from_utf8(now).unwrap();
            assert!(old.contains("\nuser_id: null\n"), "{old}");
            assert_eq!(
                new,
                old.replace("\nuser_id: null\n", "\nuser_id: default\n")
            );
        } else {
            assert_eq!(&now, bytes, "{}", moved.display());
        }
        assert!(!root.join(rel).exists(), "{} still there", rel.display());
    }
    // The existing per-user writer took precedence and is untouched.
    assert_eq!(
        std::fs::read_to_string(bucket.join("agents/writer/SOUL.md")).unwrap(),
        "current writer soul\n"
    );
    // The legacy agents folder still holds the plain file, so it stays.
    assert!(root.join("agents/README.txt").is_file());

    // The storage reads everything under the user: v1 manifest facts into __default__, the
    // v1 per-agent document of researcher, the rescoped Markdown facts of coder.
    let s = storage(root);
    let u = user("default");
    let doc = s.load(Some(&u), Some(&agent("__default__"))).await.unwrap();
    assert_eq!(doc.user.0["workContext"]["summary"], "legacy summary");
    assert_eq!(
        doc.facts.iter().map(|f| f.id.as_str()).collect::<Vec<_>>(),
        vec!["fact_legacy1"]
    );
    let doc = s.load(Some(&u), Some(&agent("researcher"))).await.unwrap();
    assert_eq!(
        doc.facts.iter().map(|f| f.id.as_str()).collect::<Vec<_>>(),
        vec!["fact_res1"]
    );
    let doc = s.load(Some(&u), Some(&agent("coder"))).await.unwrap();
    let ids: Vec<_> = doc.facts.iter().map(|f| f.id.as_str().to_owned()).collect();
    assert_eq!(ids, vec!["fact_c1", "fact_c2"]);
    for f in &doc.facts {
        assert_eq!(f.scope.user_id.as_deref(), Some("default"));
    }
    // Agent configuration survives the storage's own migrations.
    assert_eq!(
        std::fs::read_to_string(bucket.join("agents/researcher/config.yaml")).unwrap(),
        "name: researcher\ntools: [web]\n"
    );
}

#[tokio::test]
async fn dry_run_plans_and_leaves_the_tree_byte_identical() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    userless_facts(root).await;
    legacy_tree(root);
    let before = snapshot(root);
    let report = migrate_user_isolation(root, &user("default"), &options(true)).unwrap();
    assert_eq!(snapshot(root), before, "a dry run touched the tree");
    assert!(report.dry_run);
    assert_eq!(
        kinds_and_actions(&report),
        vec![
            "manifest would-move",
            "agent Researcher would-move",
            "agent coder would-move",
            "agent writer would-conflict",
        ]
    );
    assert_eq!(report.summary().planned, 4);
    assert_eq!(report.summary().migrated + report.summary().conflicts, 0);
    let text = report.to_string();
    assert!(
        text.contains("would rescope 2 fact file(s) written without a user to user default"),
        "{text}"
    );
    let writer = &report.items[3];
    assert_eq!(
        writer.destination,
        root.join("migration-conflicts/agents/writer")
    );
    assert_eq!(
        writer.action,
        IsolationAction::WouldConflict {
            existing: root.join("users/default/agents/writer")
        }
    );
}

#[tokio::test]
async fn a_second_run_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    legacy_tree(root);
    let first = migrate_user_isolation(root, &user("default"), &options(false)).unwrap();
    assert_eq!(first.summary().failed, 0);
    let after_first = snapshot(root);
    let second = migrate_user_isolation(root, &user("default"), &options(false)).unwrap();
    assert_eq!(
        snapshot(root),
        after_first,
        "the second run changed the tree"
    );
    assert_eq!(
        kinds_and_actions(&second),
        vec!["manifest already-migrated"]
    );
    assert_eq!(
        second.summary().to_string(),
        "Summary: migrated=0 conflicts=0 planned=0 current=1 failed=0"
    );
    assert_eq!(second.exit_code(), 0);
    // Dry run of a migrated tree: the same, and still nothing touched.
    let third = migrate_user_isolation(root, &user("default"), &options(true)).unwrap();
    assert_eq!(snapshot(root), after_first);
    assert_eq!(third.summary().planned, 0);
}

#[test]
fn the_legacy_agents_folder_goes_once_empty_and_users_get_their_bucket() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    std::fs::create_dir_all(root.join("agents/helper")).unwrap();
    std::fs::write(root.join("agents/helper/SOUL.md"), "hi\n").unwrap();
    std::fs::write(root.join("memory.json"), "{\"version\": \"2.0\"}").unwrap();
    let alice = user("alice@example.com");
    let report = migrate_user_isolation(root, &alice, &options(false)).unwrap();
    assert_eq!(report.bucket, alice.bucket());
    assert_eq!(report.summary().migrated, 2);
    let bucket = root.join("users").join(alice.bucket());
    assert_eq!(
        std::fs::read_to_string(bucket.join("agents/helper/SOUL.md")).unwrap(),
        "hi\n"
    );
    assert!(bucket.join("memory.json").is_file());
    assert!(!root.join("agents").exists(), "empty legacy folder removed");
}

#[test]
fn a_conflicting_manifest_is_kept_for_review_under_a_free_name() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    std::fs::create_dir_all(root.join("users/default")).unwrap();
    std::fs::write(root.join("users/default/memory.json"), "current").unwrap();
    std::fs::create_dir_all(root.join("migration-conflicts")).unwrap();
    std::fs::write(root.join("migration-conflicts/memory.json"), "older review").unwrap();
    std::fs::write(root.join("memory.json"), "legacy").unwrap();
    std::fs::write(root.join("memory.json.v1.bak"), "backup").unwrap();
    let report = migrate_user_isolation(root, &user("default"), &options(false)).unwrap();
    assert_eq!(
        kinds_and_actions(&report),
        vec!["manifest conflict", "manifest backup moved"]
    );
    assert_eq!(
        report.items[0].destination,
        root.join("migration-conflicts/memory.json.2")
    );
    let read = |rel: &str| std::fs::read_to_string(root.join(rel)).unwrap();
    assert_eq!(read("users/default/memory.json"), "current");
    assert_eq!(read("migration-conflicts/memory.json"), "older review");
    assert_eq!(read("migration-conflicts/memory.json.2"), "legacy");
    assert_eq!(read("users/default/memory.json.v1.bak"), "backup");
    assert!(!root.join("memory.json").exists());
}

#[test]
fn custom_manifest_names_are_honoured_and_bad_ones_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    std::fs::write(root.join("index.json"), "{}").unwrap();
    std::fs::write(root.join("memory.json"), "{}").unwrap();
    let opts = IsolationOptions {
        dry_run: false,
        manifest_filename: "index.json".into(),
    };
    let report = migrate_user_isolation(root, &user("default"), &opts).unwrap();
    assert_eq!(kinds_and_actions(&report), vec!["manifest moved"]);
    assert!(root.join("users/default/index.json").is_file());
    assert!(root.join("memory.json").is_file(), "not the manifest here");
    for bad in ["../x.json", "x.txt", "a/b.json", "x\0.json"] {
        let opts = IsolationOptions {
            dry_run: true,
            manifest_filename: bad.into(),
        };
        let err = migrate_user_isolation(root, &user("default"), &opts).unwrap_err();
        assert!(
            matches!(&err, StorageError::InvalidInput { field, .. } if field == "manifest_filename"),
            "{bad:?}: {err:?}"
        );
    }
}

#[test]
fn an_interrupted_legacy_write_blocks_the_migration_and_nothing_moves() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    legacy_tree(root);
    std::fs::write(root.join(".memory.journal.json"), "{}").unwrap();
    let before = snapshot(root);
    let err = migrate_user_isolation(root, &user("default"), &options(false)).unwrap_err();
    assert!(
        matches!(&err, StorageError::Corrupt { message } if message.contains("interrupted write")),
        "{err:?}"
    );
    assert_eq!(snapshot(root), before);
}

#[test]
fn missing_or_empty_roots_have_nothing_to_migrate() {
    let tmp = tempfile::tempdir().unwrap();
    let report = migrate_user_isolation(
        &tmp.path().join("absent"),
        &user("default"),
        &options(false),
    )
    .unwrap();
    assert!(report.items.is_empty());
    assert!(!tmp.path().join("absent").exists());
    let report = migrate_user_isolation(tmp.path(), &user("default"), &options(false)).unwrap();
    assert!(report.items.is_empty());
    assert!(report.to_string().contains("nothing to migrate"));
    assert_eq!(snapshot(tmp.path()), BTreeMap::new(), "no lock files made");
    let file = tmp.path().join("f");
    std::fs::write(&file, "").unwrap();
    assert!(matches!(
        migrate_user_isolation(&file, &user("default"), &options(false)),
        Err(StorageError::InvalidInput { .. })
    ));
}

#[test]
fn agent_definitions_fall_back_to_the_legacy_layout_until_migrated() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    legacy_tree(root);
    let u = user("default");
    // `coder` exists only in the legacy layout: read-only fallback.
    assert_eq!(
        legacy_agent_config_dir(root, &agent("Coder")),
        Some(root.join("agents/coder"))
    );
    assert_eq!(
        resolve_agent_config_dir(root, &u, &agent("coder")),
        Some(AgentConfigDir {
            path: root.join("agents/coder"),
            legacy: true
        })
    );
    // `writer` has its own per-user definition, which wins.
    assert_eq!(
        resolve_agent_config_dir(root, &u, &agent("writer")),
        Some(AgentConfigDir {
            path: root.join("users/default/agents/writer"),
            legacy: false
        })
    );
    // A fact bucket without definition files is not a definition; nor is the default bucket.
    std::fs::create_dir_all(root.join("agents/bare/facts")).unwrap();
    assert_eq!(legacy_agent_config_dir(root, &agent("bare")), None);
    assert_eq!(
        resolve_agent_config_dir(root, &u, &agent("__default__")),
        None
    );
    assert_eq!(resolve_agent_config_dir(root, &u, &agent("nobody")), None);

    migrate_user_isolation(root, &u, &options(false)).unwrap();
    assert_eq!(legacy_agent_config_dir(root, &agent("coder")), None);
    assert_eq!(
        resolve_agent_config_dir(root, &u, &agent("coder")),
        Some(AgentConfigDir {
            path: root.join("users/default/agents/coder"),
            legacy: false
        })
    );
    // Another user never sees default's migrated definitions.
    assert_eq!(
        resolve_agent_config_dir(root, &user("bob"), &agent("coder")),
        None
    );
}

#[test]
fn item_kinds_name_what_moved() {
    assert_eq!(IsolationItemKind::Manifest.to_string(), "manifest");
    assert_eq!(
        IsolationItemKind::Agent("Coder".into()).to_string(),
        "agent Coder"
    );
}
