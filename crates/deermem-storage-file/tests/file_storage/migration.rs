//! Migration paths from v1: legacy per-agent documents, backups, summary adoption, the v2-preview
//! mapping, the old `lead-agent` bucket, and writes that meet a never-loaded v1 manifest.

use std::path::Path;

use deermem_core::{AgentName, ApplyOptions, ChangeSet, FactId};
use serde_json::json;

use crate::support::*;
use deermem_core::prelude::*;

fn v1_doc(summary: &str, facts: serde_json::Value) -> String {
    json!({
        "version": "1.0",
        "lastUpdated": "2026-01-01T00:00:00Z",
        "user": {"workContext": {"summary": summary, "updatedAt": "2026-01-01T00:00:00Z"}},
        "history": {},
        "facts": facts,
    })
    .to_string()
}

fn legacy_fact(id: &str, content: &str) -> serde_json::Value {
    json!({"id": id, "content": content, "category": "context", "confidence": 0.9,
           "createdAt": "2026-01-01T00:00:00Z", "source": "manual"})
}

fn write(p: &Path, text: &str) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

#[tokio::test]
async fn first_agent_load_migrates_the_legacy_per_agent_document() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let rec = std::sync::Arc::new(Recording::default());
    let s = open_with(tmp.path(), &c, rec.clone());
    let legacy = tmp.path().join("users/alice/agents/agent-a/memory.json");
    let text = v1_doc(
        "legacy summary",
        json!([legacy_fact("legacy", "From the old file")]),
    );
    write(&legacy, &text);
    let doc = s
        .load(Some(&user("alice")), Some(&agent("agent-a")))
        .await
        .unwrap();
    assert_eq!(doc.facts.len(), 1);
    assert_eq!(doc.facts[0].id.as_str(), "legacy");
    assert_eq!(
        doc.user.entry("workContext").summary,
        "legacy summary",
        "adopted into an empty global"
    );
    assert!(!legacy.exists());
    assert_eq!(
        std::fs::read_to_string(legacy.with_file_name("memory.json.v1.bak")).unwrap(),
        text
    );
    let manifest = std::fs::read_to_string(tmp.path().join("users/alice/memory.json")).unwrap();
    assert!(!manifest.contains("\"facts\""));
    assert_eq!(
        rec.calls(),
        vec![Call::Upsert(
            Some("alice".into()),
            "agent-a".into(),
            "legacy".into()
        )]
    );
    // A second load (and an explicit migrate) find nothing more to do.
    let r = s
        .migrate(Some(&user("alice")), &agent("agent-a"), false)
        .await
        .unwrap();
    assert!(!r.migrated);
    assert_eq!(rec.calls().len(), 1);
}

#[tokio::test]
async fn explicit_migrate_moves_global_facts_into_the_named_agent() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let s = open(tmp.path(), &c);
    let global = tmp.path().join("users/alice/memory.json");
    let text = v1_doc(
        "keep me",
        json!([legacy_fact("fact_legacy", "Global legacy fact")]),
    );
    write(&global, &text);
    let dry = s
        .migrate(Some(&user("alice")), &agent("agent-a"), true)
        .await
        .unwrap();
    assert!(dry.migrated && dry.dry_run);
    assert_eq!(dry.migrated_facts, 1);
    assert_eq!(
        std::fs::read_to_string(&global).unwrap(),
        text,
        "a dry run writes nothing"
    );
    let r = s
        .migrate(Some(&user("alice")), &agent("agent-a"), false)
        .await
        .unwrap();
    assert!(r.migrated);
    assert_eq!(r.from_version.as_deref(), Some("1.0"));
    assert_eq!(r.to_version, "2.0");
    assert_eq!(r.revision, 1);
    assert_eq!(
        std::fs::read_to_string(global.with_file_name("memory.json.v1.bak")).unwrap(),
        text
    );
    let doc = s
        .load(Some(&user("alice")), Some(&agent("agent-a")))
        .await
        .unwrap();
    assert_eq!(doc.facts[0].id.as_str(), "fact_legacy");
    assert_eq!(doc.user.entry("workContext").summary, "keep me");
}

#[tokio::test]
async fn a_differing_backup_stops_migration_with_nothing_modified() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let s = open(tmp.path(), &c);
    let legacy = tmp.path().join("users/alice/agents/agent-a/memory.json");
    write(&legacy, &v1_doc("", json!([legacy_fact("legacy", "x")])));
    write(&legacy.with_file_name("memory.json.v1.bak"), "different");
    let before = snapshot(tmp.path());
    let err = s
        .load(Some(&user("alice")), Some(&agent("agent-a")))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("migration backup"), "{err}");
    let after: std::collections::BTreeMap<_, _> = snapshot(tmp.path())
        .into_iter()
        .filter(|(k, _)| !k.ends_with(".memory.lock") && !k.ends_with(".memory.journal.spare"))
        .collect();
    assert_eq!(after, before);
}

#[tokio::test]
async fn conflicting_summaries_keep_the_legacy_file() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let s = open(tmp.path(), &c);
    let (u, a) = (user("alice"), agent("agent-a"));
    let mut p = serde_json::Map::new();
    p.insert(
        "workContext".into(),
        json!({"summary": "canonical", "updatedAt": "now"}),
    );
    s.update_summaries(
        Some(&u),
        deermem_core::SummaryPatch {
            user: Some(p),
            history: None,
        },
        None,
    )
    .await
    .unwrap();
    let legacy = tmp.path().join("users/alice/agents/agent-a/memory.json");
    write(
        &legacy,
        &v1_doc("legacy", json!([legacy_fact("legacy", "x")])),
    );
    let err = s.migrate(Some(&u), &a, false).await.unwrap_err();
    assert!(
        err.to_string().contains("summary migration conflict"),
        "{err}"
    );
    assert!(legacy.exists());
    assert!(!tmp.path().join("users/alice/agents/agent-a/facts").exists());
    // clear_all ignores the legacy summaries, migrates the facts, then removes them.
    let doc = s.clear_all(Some(&u)).await.unwrap();
    assert!(doc.facts.is_empty());
    assert!(!legacy.exists());
    assert!(legacy.with_file_name("memory.json.v1.bak").exists());
    assert!(s.load(Some(&u), Some(&a)).await.unwrap().facts.is_empty());
}

#[tokio::test]
async fn same_id_with_different_content_is_a_migration_conflict() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let s = open(tmp.path(), &c);
    let (u, a) = (user("alice"), agent("agent-a"));
    s.upsert_fact(Some(&u), &a, fact("legacy", "canonical text"), None, None)
        .await
        .unwrap();
    s.upsert_fact(Some(&u), &a, fact("other", "kept"), None, None)
        .await
        .unwrap();
    let legacy = tmp.path().join("users/alice/agents/agent-a/memory.json");
    write(
        &legacy,
        &v1_doc("", json!([legacy_fact("legacy", "different text")])),
    );
    let err = s.load(Some(&u), Some(&a)).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("Fact migration conflict for 'legacy'"),
        "{err}"
    );
    std::fs::remove_file(&legacy).unwrap();
    assert_eq!(s.reload(Some(&u), Some(&a)).await.unwrap().facts.len(), 2);
    // Different ids merge.
    write(
        &legacy,
        &v1_doc("", json!([legacy_fact("new-one", "merged")])),
    );
    let doc = s.load(Some(&u), Some(&a)).await.unwrap();
    assert_eq!(
        doc.facts.iter().map(|f| f.id.as_str()).collect::<Vec<_>>(),
        vec!["legacy", "new-one", "other"]
    );
}

#[tokio::test]
async fn preview_mapping_paths_must_stay_below_the_user_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let s = open(tmp.path(), &c);
    write(
        &tmp.path().join("outside.md"),
        "---\nid: x\n---\n\n# x\n\nx\n",
    );
    let global = tmp.path().join("users/alice/memory.json");
    write(
        &global,
        &json!({"version": "2.0", "facts": {"x": {"path": "../../outside.md"}}}).to_string(),
    );
    let err = s
        .migrate(Some(&user("alice")), &agent("agent-a"), false)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("escapes"), "{err}");
    // A valid mapping with a matching hash migrates.
    let md = "---\nid: p1\ncontent_hint: 1\nuser_id: alice\nagent_name: old\n---\n\n# Preview fact\n\nPreview fact\n";
    write(&tmp.path().join("users/alice/preview/p1.md"), md);
    let hash = format!("sha256:{}", {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(md.as_bytes()))
    });
    write(
        &global,
        &json!({"version": "2.0", "facts": {"p1": {"path": "preview/p1.md", "contentHash": hash}}})
            .to_string(),
    );
    let r = s
        .migrate(Some(&user("alice")), &agent("agent-a"), false)
        .await
        .unwrap();
    assert!(r.migrated);
    let doc = s
        .load(Some(&user("alice")), Some(&agent("agent-a")))
        .await
        .unwrap();
    assert_eq!(doc.facts[0].content, "Preview fact");
    assert_eq!(doc.facts[0].scope.agent_name.as_deref(), Some("agent-a"));
    // A hash mismatch is corruption.
    write(&global, &json!({"version": "1.0", "facts": {"p1": {"path": "preview/p1.md", "contentHash": "sha256:00"}}}).to_string());
    let err = s
        .migrate(Some(&user("alice")), &agent("agent-b"), false)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("Hash mismatch"), "{err}");
}

#[tokio::test]
async fn writes_migrate_a_never_loaded_v1_manifest_first() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let s = open(tmp.path(), &c);
    let global = tmp.path().join("users/alice/memory.json");
    write(
        &global,
        &v1_doc(
            "summary",
            json!([legacy_fact("fact_legacy", "Do not lose me")]),
        ),
    );
    // The reference's apply_changes would rewrite the manifest and drop the legacy facts.
    s.upsert_fact(
        Some(&user("alice")),
        &agent("agent-a"),
        fact("f1", "new"),
        None,
        None,
    )
    .await
    .unwrap();
    let doc = s
        .load(Some(&user("alice")), Some(&AgentName::default_bucket()))
        .await
        .unwrap();
    assert_eq!(doc.facts.len(), 1);
    assert_eq!(doc.facts[0].content, "Do not lose me");
    assert!(global.with_file_name("memory.json.v1.bak").exists());
}

#[tokio::test]
async fn old_lead_agent_bucket_moves_into_the_default_bucket() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let s = open(tmp.path(), &c);
    let (u, lead) = (user("alice"), agent("lead-agent"));
    s.upsert_fact(Some(&u), &lead, fact("old", "from lead"), None, None)
        .await
        .unwrap();
    s.record_fact_accesses(Some(&u), &lead, &[FactId::new("old").unwrap()], None)
        .await
        .unwrap();
    let lead_dir = tmp.path().join("users/alice/agents/lead-agent");
    std::fs::write(
        lead_dir.join(format!(
            "facts/{}/.old.md.0123456789abcdef0123456789abcdef.tmp",
            FactId::new("old").unwrap().shard()
        )),
        "x",
    )
    .unwrap();
    let doc = s
        .load(Some(&u), Some(&AgentName::default_bucket()))
        .await
        .unwrap();
    assert_eq!(doc.facts.len(), 1);
    assert_eq!(
        doc.facts[0].scope.agent_name.as_deref(),
        Some("__default__")
    );
    assert!(!lead_dir.exists(), "the old bucket is removed");
    let usage = s
        .get_fact_usage(Some(&u), &AgentName::default_bucket())
        .await
        .unwrap();
    assert!(usage.contains_key("old"), "usage sidecar moved along");
    // A real custom agent (config.yaml) is never touched; unexpected files block the move.
    s.upsert_fact(
        Some(&u),
        &lead,
        fact("custom", "custom agent fact"),
        None,
        None,
    )
    .await
    .unwrap();
    std::fs::write(lead_dir.join("config.yaml"), "x: 1\n").unwrap();
    assert_eq!(
        s.load(Some(&u), Some(&AgentName::default_bucket()))
            .await
            .unwrap()
            .facts
            .len(),
        1
    );
    assert!(lead_dir.join("config.yaml").exists());
    std::fs::remove_file(lead_dir.join("config.yaml")).unwrap();
    std::fs::write(lead_dir.join("SOUL.md"), "soul").unwrap();
    let before = snapshot(&lead_dir);
    let err = s
        .load(Some(&u), Some(&AgentName::default_bucket()))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("unexpected entries"), "{err}");
    assert_eq!(snapshot(&lead_dir), before);
}

#[tokio::test]
async fn concurrent_lazy_migrations_by_two_instances_give_one_result() {
    let tmp = tempfile::tempdir().unwrap();
    let c = clock();
    let legacy = tmp.path().join("users/alice/agents/agent-a/memory.json");
    write(
        &legacy,
        &v1_doc("", json!([legacy_fact("legacy", "only once")])),
    );
    let s1 = open(tmp.path(), &c);
    let s2 = open(tmp.path(), &c);
    let (u, a) = (user("alice"), agent("agent-a"));
    let (r1, r2) = tokio::join!(s1.load(Some(&u), Some(&a)), s2.load(Some(&u), Some(&a)));
    for doc in [r1.unwrap(), r2.unwrap()] {
        assert_eq!(
            doc.facts.iter().map(|f| f.id.as_str()).collect::<Vec<_>>(),
            vec!["legacy"]
        );
    }
    assert!(!legacy.exists());
    assert_eq!(s1.load(Some(&u), None).await.unwrap().revision, 1);
    let r = s1
        .apply_changes(
            Some(&u),
            Some(&a),
            ChangeSet::default(),
            ApplyOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(r.revision, 1);
}
