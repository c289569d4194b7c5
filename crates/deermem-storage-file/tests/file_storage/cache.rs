//! The document cache's validation: a load served from the cache after only `stat` calls must
//! still see every commit made by another instance (another process, as far as the cache
//! knows), whether that commit lands inside the time-stamp granularity window of the cached
//! manifest or long after it, and whether the manifest's size changes or not.

use std::time::Duration;

use deermem_core::ports::MemoryStorage;
use deermem_core::{AgentName, ApplyOptions, ChangeSet};

use crate::support::{clock, fact, open, user};
use deermem_core::prelude::*;

async fn write(s: &dyn MemoryStorage, n: usize) {
    let u = user("cache@example.com");
    s.apply_changes(
        Some(&u),
        Some(&AgentName::default_bucket()),
        ChangeSet {
            upserts: vec![fact(&format!("fact_{n:04}"), &format!("fact {n}"))],
            ..ChangeSet::default()
        },
        ApplyOptions::default(),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn commits_by_another_instance_are_seen_inside_and_after_the_window() {
    let dir = tempfile::tempdir().unwrap();
    let c = clock();
    let reader = open(dir.path(), &c);
    let writer = open(dir.path(), &c);
    let u = user("cache@example.com");
    let a = AgentName::default_bucket();
    write(&writer, 0).await;
    let mut expected = 1;
    for round in 0..6 {
        // Cache the current document in the reader.
        let doc = reader.load(Some(&u), Some(&a)).await.unwrap();
        assert_eq!(doc.facts.len(), expected, "round {round}");
        assert_eq!(
            reader.load(Some(&u), Some(&a)).await.unwrap().revision,
            doc.revision
        );
        if round % 2 == 1 {
            // Let the cached manifest age past the granularity window, so the next load
            // may be served after `stat` calls alone.
            tokio::time::sleep(Duration::from_millis(120)).await;
            assert_eq!(
                reader.load(Some(&u), Some(&a)).await.unwrap().facts.len(),
                expected
            );
        }
        // Same-size manifests (revision 2 → 3 ...), written by the other instance.
        write(&writer, round + 1).await;
        expected += 1;
        let seen = reader.load(Some(&u), Some(&a)).await.unwrap();
        assert_eq!(
            seen.facts.len(),
            expected,
            "round {round}: a stale document was served"
        );
        assert_eq!(seen.revision, doc.revision + 1, "round {round}");
    }
}

#[tokio::test]
async fn an_out_of_band_manifest_edit_is_seen() {
    let dir = tempfile::tempdir().unwrap();
    let c = clock();
    let s = open(dir.path(), &c);
    let u = user("cache@example.com");
    write(&s, 0).await;
    let before = s.get_summaries(Some(&u)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert_eq!(
        s.get_summaries(Some(&u)).await.unwrap().revision,
        before.revision
    );
    // A hand edit in place (no rename): the size and the time stamps change.
    let path = dir
        .path()
        .join("users")
        .join(u.bucket())
        .join("memory.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let edited = text.replacen(
        &format!("\"revision\": {}", before.revision),
        &format!("\"revision\": {}", before.revision + 40),
        1,
    );
    assert_ne!(text, edited);
    std::fs::write(&path, edited).unwrap();
    let after = s.get_summaries(Some(&u)).await.unwrap();
    assert_eq!(after.revision, before.revision + 40);
}

/// The cache keeps at most `cache_max_scopes` documents however many users are read, forgets
/// the least recently loaded first, and a forgotten scope still loads (from its files).
#[tokio::test]
async fn the_cache_holds_at_most_its_configured_scopes() {
    let dir = tempfile::tempdir().unwrap();
    let c = clock();
    let mut config = deermem_storage_file::FileStorageConfig::new(dir.path());
    config.cache_max_scopes = 3;
    let s = deermem_storage_file::FileStorage::new(config, c.clone(), None).unwrap();
    let a = AgentName::default_bucket();
    for i in 0..8 {
        let u = user(&format!("u{i}@example.com"));
        s.apply_changes(
            Some(&u),
            Some(&a),
            ChangeSet {
                upserts: vec![fact("fact_0001", &format!("fact of user {i}"))],
                ..ChangeSet::default()
            },
            ApplyOptions::default(),
        )
        .await
        .unwrap();
        assert_eq!(s.load(Some(&u), Some(&a)).await.unwrap().facts.len(), 1);
        let usage = s.cache_usage();
        assert!(usage.scopes <= 3, "{usage:?}");
        assert_eq!(usage.max_scopes, 3);
        // The port reports the same bound and size (no index: nothing else).
        assert_eq!(
            s.cache_bounds(),
            vec![deermem_core::CacheBound::entries(
                deermem_storage_file::SCOPE_CACHE_NAME,
                3,
                Some(usage.scopes)
            )]
        );
    }
    assert_eq!(s.cache_usage().scopes, 3);
    let first = user("u0@example.com");
    let doc = s.load(Some(&first), Some(&a)).await.unwrap();
    assert_eq!(doc.facts[0].content, "fact of user 0");
    assert_eq!(s.cache_usage().scopes, 3);
}
