//! The storage contract suite and the in-memory storage fake.
//!
//! Every behaviour is a public async function taking a [`StorageFixture`]; the
//! [`storage_contract!`](crate::storage_contract) macro expands one named test per behaviour,
//! so an adapter's `tests/contract.rs` is a single line. The assertions follow the sentences of
//! the `MemoryStorage` contract in `deermem-core`.

mod memory;

use crate::fixtures::{agent, user};
use std::any::Any;
use std::sync::Arc;

use deermem_core::policy::eviction::{EvictedFact, EvictionDecision, EvictionPolicy};
use deermem_core::ports::{ListQuery, MemoryStorage};
use deermem_core::{
    AgentName, ApplyOptions, ChangeSet, Fact, FactDraft, FactId, FactSource, MatchType, Scope,
    SearchQuery, StorageError, SummaryPatch, Timestamp, UserId,
};
use serde_json::json;

use crate::clock::ManualClock;

use deermem_core::ports::MemoryStorageExt;
pub use memory::InMemoryStorage;

/// The storage under test, the clock it reads, and whatever must outlive it.
pub struct StorageFixture {
    /// The storage.
    pub storage: Arc<dyn MemoryStorage>,
    /// The clock the storage was built with; the suite sets and advances it.
    pub clock: Arc<ManualClock>,
    /// Temp dirs and the like, dropped after the test.
    pub guard: Box<dyn Any + Send>,
}

impl std::fmt::Debug for StorageFixture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StorageFixture")
            .field("storage", &self.storage)
            .finish_non_exhaustive()
    }
}

/// The time every fixture's clock should start at.
pub const START: &str = "2026-01-01T00:00:00Z";

fn fid(s: &str) -> FactId {
    FactId::new(s).unwrap_or_else(|e| panic!("test fact id {s:?}: {e}"))
}

fn new_fact(id: &str, content: &str) -> FactDraft {
    FactDraft::identified(fid(id), content)
        .and_then(|d| d.with_category("preference").with_confidence(0.8))
        .unwrap_or_else(|e| panic!("test draft: {e}"))
        .with_source(FactSource::manual())
}

/// A stored fact's draft with new content and the title derived from it again.
fn edited(fact: &Fact, content: &str) -> FactDraft {
    let mut d = fact.to_draft();
    d.remove("title");
    d.with_content(content)
        .unwrap_or_else(|e| panic!("test content: {e}"))
}

fn ts(s: &str) -> Timestamp {
    Timestamp::parse_iso(s).unwrap_or_else(|| panic!("timestamp {s}"))
}

async fn create(f: &StorageFixture, u: &UserId, a: &AgentName, id: &str, content: &str) -> Fact {
    let r = f
        .storage
        .upsert_fact(Some(u), a, new_fact(id, content), None, None)
        .await
        .unwrap_or_else(|e| panic!("create {id}: {e}"));
    assert_eq!(r.upserted_facts.len(), 1, "create {id} writes one fact");
    r.upserted_facts[0].clone()
}

fn ids(facts: &[Fact]) -> Vec<String> {
    facts.iter().map(|f| f.id.to_string()).collect()
}

/// A user never written to reads as the empty template: version 1.0, revision 0, default
/// summary sections, no facts.
pub async fn empty_user_reads_as_template(f: StorageFixture) {
    let doc = f
        .storage
        .load(Some(&user("nobody")), Some(&agent("coder")))
        .await
        .unwrap();
    assert_eq!(doc.version, "1.0");
    assert_eq!(doc.revision, 0);
    assert!(doc.facts.is_empty());
    assert_eq!(
        doc.user.as_map().keys().collect::<Vec<_>>(),
        vec!["workContext", "personalContext", "topOfMind"]
    );
    assert_eq!(
        doc.history.as_map().keys().collect::<Vec<_>>(),
        vec!["recentMonths", "earlierContext", "longTermBackground"]
    );
    let s = f
        .storage
        .get_summaries(Some(&user("nobody")))
        .await
        .unwrap();
    assert_eq!(s.revision, 0);
}

/// The first commit creates revision 1 even when it changes nothing else; an identical second
/// commit is a no-op that keeps revision 1.
pub async fn first_commit_creates_revision_one_then_noop(f: StorageFixture) {
    let u = user("alice");
    let r1 = f
        .storage
        .apply_changes(
            Some(&u),
            None,
            ChangeSet::default(),
            ApplyOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(r1.revision, 1);
    assert_eq!(r1.version, "2.0");
    f.clock.advance_secs(5);
    let r2 = f
        .storage
        .apply_changes(
            Some(&u),
            None,
            ChangeSet::default(),
            ApplyOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(r2.revision, 1, "a no-op never increments");
    assert_eq!(
        r2.last_updated, r1.last_updated,
        "a no-op keeps lastUpdated"
    );
    let doc = f.storage.load(Some(&u), None).await.unwrap();
    assert_eq!((doc.version.as_str(), doc.revision), ("2.0", 1));
}

/// Create, update (material change bumps the fact revision, keeps createdAt, sets updatedAt)
/// and physical delete, each incrementing the shared revision by exactly one.
pub async fn create_update_delete_round_trip(f: StorageFixture) {
    let (u, a) = (user("alice"), agent("agent-a"));
    let created = f
        .storage
        .upsert_fact(Some(&u), &a, new_fact("f1", "Likes tea"), Some(0), None)
        .await
        .unwrap();
    assert_eq!(created.revision, 1);
    let fact = created.upserted_facts[0].clone();
    assert_eq!(fact.revision, 1);
    assert_eq!(fact.created_at, START);
    assert_eq!(fact.scope.user_id.as_deref(), Some("alice"));
    assert_eq!(fact.scope.agent_name.as_deref(), Some("agent-a"));
    let got = f.storage.get_fact(Some(&u), &a, &fid("f1")).await.unwrap();
    assert_eq!(got.as_ref(), Some(&fact));

    f.clock.advance_secs(60);
    let d = edited(&fact, "Likes green tea");
    let updated = f
        .storage
        .upsert_fact(Some(&u), &a, d, Some(1), Some(1))
        .await
        .unwrap();
    assert_eq!(updated.revision, 2);
    let u1 = &updated.upserted_facts[0];
    assert_eq!(u1.revision, 2);
    assert_eq!(u1.created_at, START);
    assert_eq!(u1.updated_at, "2026-01-01T00:01:00Z");
    assert_eq!(u1.content, "Likes green tea");

    let deleted = f
        .storage
        .delete_fact(Some(&u), &a, &fid("f1"), Some(2), Some(2))
        .await
        .unwrap();
    assert_eq!(deleted.revision, 3);
    assert_eq!(deleted.deleted_fact_ids, vec![fid("f1")]);
    assert!(deleted.upserted_facts.is_empty());
    assert!(
        f.storage
            .get_fact(Some(&u), &a, &fid("f1"))
            .await
            .unwrap()
            .is_none()
    );
    // Re-creating the id starts again from the provided revision.
    let again = create(&f, &u, &a, "f1", "Likes coffee").await;
    assert_eq!(again.revision, 1);
}

/// Upserting a fact identical to the stored one writes nothing: the revision stays and the
/// result holds no facts.
pub async fn identical_upsert_is_a_noop(f: StorageFixture) {
    let (u, a) = (user("alice"), agent("agent-a"));
    let fact = create(&f, &u, &a, "f1", "Likes tea").await;
    f.clock.advance_secs(10);
    let r = f
        .storage
        .upsert_fact(Some(&u), &a, fact.to_draft(), None, Some(1))
        .await
        .unwrap();
    assert_eq!(r.revision, 1);
    assert!(r.upserted_facts.is_empty());
    let stored = f
        .storage
        .get_fact(Some(&u), &a, &fid("f1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.updated_at, fact.updated_at);
}

/// Per-fact preconditions: creating an existing id, updating with a stale expected revision,
/// or with a draft whose own `revision` is stale, fail with `FactConflict` and write nothing.
pub async fn stale_fact_revision_is_a_fact_conflict(f: StorageFixture) {
    let (u, a) = (user("alice"), agent("agent-a"));
    let fact = create(&f, &u, &a, "f1", "Likes tea").await;
    let d = edited(&fact, "changed");
    let r = f
        .storage
        .upsert_fact(Some(&u), &a, d.clone(), None, Some(1))
        .await
        .unwrap();
    assert_eq!(r.upserted_facts[0].revision, 2);
    // Stale expected revision.
    let stale = d.clone().with_content("again").unwrap();
    let err = f
        .storage
        .upsert_fact(Some(&u), &a, stale.clone(), None, Some(1))
        .await
        .unwrap_err();
    assert!(matches!(err, StorageError::FactConflict { .. }), "{err:?}");
    // Draft's own revision (1) is stale even with the right expected revision.
    let err = f
        .storage
        .upsert_fact(Some(&u), &a, stale, None, Some(2))
        .await
        .unwrap_err();
    assert!(matches!(err, StorageError::FactConflict { .. }), "{err:?}");
    assert_eq!(err.to_string(), "Expected fact 'f1' revision 1, found 2");
    // Create-only on an existing id.
    let err = f
        .storage
        .upsert_fact(Some(&u), &a, new_fact("f1", "other"), None, None)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("must not already exist"), "{err}");
    // A draft carrying revision 1 for an absent fact is a conflict too.
    let ghost = new_fact("ghost", "x").with_revision(1).unwrap();
    let err = f
        .storage
        .apply_changes(
            Some(&u),
            Some(&a),
            ChangeSet {
                upserts: vec![ghost],
                ..ChangeSet::default()
            },
            ApplyOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StorageError::FactConflict { .. }), "{err:?}");
    let doc = f.storage.load(Some(&u), Some(&a)).await.unwrap();
    assert_eq!(doc.revision, 2, "failed writes change nothing");
    assert_eq!(doc.facts[0].content, "changed");
    assert_eq!(ids(&doc.facts), vec!["f1"]);
}

/// A stale expected manifest revision fails with `ManifestConflict` when the change cannot
/// rebase (summaries, or rebase not allowed); nothing is written.
pub async fn stale_manifest_revision_is_a_manifest_conflict(f: StorageFixture) {
    let (u, a) = (user("alice"), agent("agent-a"));
    create(&f, &u, &a, "f1", "one").await;
    create(&f, &u, &a, "f2", "two").await;
    let mut patch = serde_json::Map::new();
    patch.insert(
        "workContext".into(),
        json!({"summary": "new", "updatedAt": "now"}),
    );
    let changes = ChangeSet {
        upserts: vec![new_fact("f3", "three")],
        summaries: Some(SummaryPatch {
            user: Some(patch),
            history: None,
        }),
        ..ChangeSet::default()
    };
    let err = f
        .storage
        .apply_changes(
            Some(&u),
            Some(&a),
            changes,
            ApplyOptions {
                expected_manifest_revision: Some(1),
                allow_manifest_rebase: true,
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StorageError::ManifestConflict {
                expected: 1,
                found: 2
            }
        ),
        "{err:?}"
    );
    let err = f
        .storage
        .apply_changes(
            Some(&u),
            Some(&a),
            ChangeSet {
                upserts: vec![new_fact("f4", "four")],
                ..ChangeSet::default()
            },
            ApplyOptions {
                expected_manifest_revision: Some(1),
                allow_manifest_rebase: false,
            },
        )
        .await
        .unwrap_err();
    assert!(err.is_conflict());
    let doc = f.storage.load(Some(&u), Some(&a)).await.unwrap();
    assert_eq!(doc.revision, 2);
    assert_eq!(ids(&doc.facts), vec!["f1", "f2"]);
    assert_eq!(doc.user.entry("workContext").summary, "");
}

/// A point operation with a stale manifest revision rebases over an unrelated commit, while a
/// stale write to the fact that changed still fails.
pub async fn disjoint_point_operation_rebases(f: StorageFixture) {
    let (u, a) = (user("alice"), agent("agent-a"));
    let f1 = create(&f, &u, &a, "f1", "one").await;
    let f2 = create(&f, &u, &a, "f2", "two").await;
    let snapshot_rev = 2;
    // Someone else changes f1.
    let d1 = edited(&f1, "one changed");
    f.storage
        .upsert_fact(Some(&u), &a, d1, Some(2), Some(1))
        .await
        .unwrap();
    // Our stale-snapshot change to f2 rebases.
    let d2 = edited(&f2, "two changed");
    let r = f
        .storage
        .upsert_fact(Some(&u), &a, d2, Some(snapshot_rev), Some(1))
        .await
        .unwrap();
    assert_eq!(r.revision, 4);
    // Our stale-snapshot change to f1 does not.
    let stale = edited(&f1, "lost update");
    let err = f
        .storage
        .upsert_fact(Some(&u), &a, stale, Some(snapshot_rev), Some(1))
        .await
        .unwrap_err();
    assert!(err.is_conflict(), "{err:?}");
    // A delete with an expected fact revision rebases; one without cannot.
    let err = f
        .storage
        .delete_fact(Some(&u), &a, &fid("f2"), Some(snapshot_rev), None)
        .await
        .unwrap_err();
    assert!(
        matches!(err, StorageError::ManifestConflict { .. }),
        "{err:?}"
    );
    let r = f
        .storage
        .delete_fact(Some(&u), &a, &fid("f2"), Some(snapshot_rev), Some(2))
        .await
        .unwrap();
    assert_eq!(r.deleted_fact_ids, vec![fid("f2")]);
    let doc = f.storage.load(Some(&u), Some(&a)).await.unwrap();
    assert_eq!(doc.facts.len(), 1);
    assert_eq!(doc.facts[0].content, "one changed");
    assert_eq!(doc.revision, 5);
}

/// Deleting an absent id is a no-op: no error, no revision change, nothing reported.
pub async fn delete_of_absent_id_is_a_noop(f: StorageFixture) {
    let (u, a) = (user("alice"), agent("agent-a"));
    create(&f, &u, &a, "f1", "one").await;
    let r = f
        .storage
        .delete_fact(Some(&u), &a, &fid("missing"), None, None)
        .await
        .unwrap();
    assert_eq!(r.revision, 1);
    assert!(r.deleted_fact_ids.is_empty());
}

/// `apply_changes` reports only the facts it wrote and the ids it deleted, in order.
pub async fn results_hold_only_the_delta(f: StorageFixture) {
    let (u, a) = (user("alice"), agent("agent-a"));
    let f1 = create(&f, &u, &a, "f1", "one").await;
    let f2 = create(&f, &u, &a, "f2", "two").await;
    create(&f, &u, &a, "f3", "three").await;
    let d1 = edited(&f1, "one changed");
    let r = f
        .storage
        .apply_changes(
            Some(&u),
            Some(&a),
            ChangeSet {
                upserts: vec![d1, f2.to_draft(), new_fact("f4", "four")],
                deletes: vec![fid("f3"), fid("nope")],
                ..ChangeSet::default()
            },
            ApplyOptions {
                expected_manifest_revision: Some(3),
                allow_manifest_rebase: false,
            },
        )
        .await
        .unwrap();
    assert_eq!(ids(&r.upserted_facts), vec!["f1", "f4"]);
    assert_eq!(r.deleted_fact_ids, vec![fid("f3")]);
    assert_eq!(r.revision, 4);
    let doc = f.storage.load(Some(&u), Some(&a)).await.unwrap();
    assert_eq!(ids(&doc.facts), vec!["f1", "f2", "f4"]);
}

/// Summary patches merge per child: supplied children replace, omitted ones stay.
pub async fn summaries_merge_per_child(f: StorageFixture) {
    let u = user("alice");
    let mut p1 = serde_json::Map::new();
    p1.insert(
        "workContext".into(),
        json!({"summary": "Rust", "updatedAt": "now"}),
    );
    p1.insert(
        "topOfMind".into(),
        json!({"summary": "launch", "updatedAt": "now"}),
    );
    let doc = f
        .storage
        .update_summaries(
            Some(&u),
            SummaryPatch {
                user: Some(p1),
                history: None,
            },
            Some(0),
        )
        .await
        .unwrap();
    assert_eq!(doc.revision, 1);
    let mut p2 = serde_json::Map::new();
    p2.insert(
        "workContext".into(),
        json!({"summary": "Go", "updatedAt": "later"}),
    );
    let mut h = serde_json::Map::new();
    h.insert(
        "recentMonths".into(),
        json!({"summary": "moved", "updatedAt": "x"}),
    );
    let doc = f
        .storage
        .update_summaries(
            Some(&u),
            SummaryPatch {
                user: Some(p2),
                history: Some(h),
            },
            None,
        )
        .await
        .unwrap();
    assert_eq!(doc.revision, 2);
    assert_eq!(doc.user.entry("workContext").summary, "Go");
    assert_eq!(doc.user.entry("topOfMind").summary, "launch");
    assert_eq!(doc.history.entry("recentMonths").summary, "moved");
    let s = f.storage.get_summaries(Some(&u)).await.unwrap();
    assert_eq!(s.revision, 2);
    assert_eq!(s.user.entry("personalContext").summary, "");
    let err = f
        .storage
        .update_summaries(Some(&u), SummaryPatch::default(), Some(1))
        .await
        .unwrap_err();
    assert!(matches!(err, StorageError::ManifestConflict { .. }));
}

/// `clear_all` deletes every agent's facts and resets the summaries of that user only.
pub async fn clear_all_empties_every_agent(f: StorageFixture) {
    let (u, other) = (user("alice"), user("bob"));
    create(&f, &u, &agent("agent-a"), "a1", "one").await;
    create(&f, &u, &AgentName::default_bucket(), "d1", "two").await;
    create(&f, &other, &agent("agent-a"), "b1", "bob's").await;
    let mut p = serde_json::Map::new();
    p.insert(
        "workContext".into(),
        json!({"summary": "Rust", "updatedAt": "now"}),
    );
    f.storage
        .update_summaries(
            Some(&u),
            SummaryPatch {
                user: Some(p),
                history: None,
            },
            None,
        )
        .await
        .unwrap();
    let doc = f.storage.clear_all(Some(&u)).await.unwrap();
    assert!(doc.facts.is_empty());
    assert_eq!(doc.user.entry("workContext").summary, "");
    assert!(doc.revision > 3);
    let a_doc = f
        .storage
        .load(Some(&u), Some(&agent("agent-a")))
        .await
        .unwrap();
    assert!(a_doc.facts.is_empty());
    let b_doc = f
        .storage
        .load(Some(&other), Some(&agent("agent-a")))
        .await
        .unwrap();
    assert_eq!(ids(&b_doc.facts), vec!["b1"], "other users are untouched");
}

/// Loaded facts are sorted by id (code-point order).
pub async fn facts_are_sorted_by_id(f: StorageFixture) {
    let (u, a) = (user("alice"), agent("agent-a"));
    for id in ["b", "B", "a", "_x", "a-1", "10", "9"] {
        create(&f, &u, &a, id, &format!("fact {id}")).await;
    }
    let doc = f.storage.load(Some(&u), Some(&a)).await.unwrap();
    assert_eq!(ids(&doc.facts), vec!["10", "9", "B", "_x", "a", "a-1", "b"]);
    let listed = f
        .storage
        .list_facts(Some(&u), &a, &ListQuery::default())
        .await
        .unwrap();
    assert_eq!(ids(&listed), ids(&doc.facts));
}

/// Returned documents are owned copies: mutating them never changes storage.
pub async fn returned_documents_are_owned_copies(f: StorageFixture) {
    let (u, a) = (user("alice"), agent("agent-a"));
    create(&f, &u, &a, "f1", "one").await;
    let mut doc = f.storage.load(Some(&u), Some(&a)).await.unwrap();
    doc.facts[0].content = "mutated".into();
    doc.facts.clear();
    doc.user.0.clear();
    let again = f.storage.load(Some(&u), Some(&a)).await.unwrap();
    assert_eq!(again.facts.len(), 1);
    assert_eq!(again.facts[0].content, "one");
    assert_eq!(again.user.as_map().len(), 3);
}

/// Users and agents are isolated: facts and summaries of one never show in another.
pub async fn users_and_agents_are_isolated(f: StorageFixture) {
    let (alice, bob) = (user("alice"), user("bob@example.com"));
    let (a, b) = (agent("agent-a"), agent("agent-b"));
    create(&f, &alice, &a, "same", "alice a").await;
    create(&f, &alice, &b, "same", "alice b").await;
    create(&f, &bob, &a, "same", "bob a").await;
    let docs = [
        f.storage.load(Some(&alice), Some(&a)).await.unwrap(),
        f.storage.load(Some(&alice), Some(&b)).await.unwrap(),
        f.storage.load(Some(&bob), Some(&a)).await.unwrap(),
    ];
    let contents: Vec<&str> = docs.iter().map(|d| d.facts[0].content.as_str()).collect();
    assert_eq!(contents, vec!["alice a", "alice b", "bob a"]);
    assert!(docs.iter().all(|d| d.facts.len() == 1));
    assert_eq!(
        docs[2].facts[0].scope.user_id.as_deref(),
        Some("bob@example.com")
    );
    assert_eq!(docs[0].revision, 2, "agents of one user share the revision");
    assert_eq!(docs[2].revision, 1);
    assert!(
        f.storage
            .load(Some(&user("carol")), Some(&a))
            .await
            .unwrap()
            .facts
            .is_empty()
    );
}

/// Invalid inputs are `InvalidInput` and write nothing: fact changes without an agent, a fact
/// both upserted and deleted, duplicate ids, invalid drafts.
pub async fn invalid_inputs_are_rejected(f: StorageFixture) {
    let (u, a) = (user("alice"), agent("agent-a"));
    create(&f, &u, &a, "f1", "one").await;
    let apply = |changes: ChangeSet, agent: Option<AgentName>| {
        let s = f.storage.clone();
        let u = u.clone();
        async move {
            s.apply_changes(Some(&u), agent.as_ref(), changes, ApplyOptions::default())
                .await
        }
    };
    let no_agent = apply(
        ChangeSet {
            upserts: vec![new_fact("x", "x")],
            ..ChangeSet::default()
        },
        None,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&no_agent, StorageError::InvalidInput { field, .. } if field == "agent_name"),
        "{no_agent:?}"
    );
    let both = apply(
        ChangeSet {
            upserts: vec![new_fact("x", "x")],
            deletes: vec![fid("x")],
            ..ChangeSet::default()
        },
        Some(a.clone()),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(both, StorageError::InvalidInput { .. }),
        "{both:?}"
    );
    let dup = apply(
        ChangeSet {
            upserts: vec![new_fact("x", "x"), new_fact("x", "y")],
            ..ChangeSet::default()
        },
        Some(a.clone()),
    )
    .await
    .unwrap_err();
    assert!(matches!(dup, StorageError::InvalidInput { .. }), "{dup:?}");
    let dup_del = apply(
        ChangeSet {
            deletes: vec![fid("f1"), fid("f1")],
            ..ChangeSet::default()
        },
        Some(a.clone()),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(dup_del, StorageError::InvalidInput { .. }),
        "{dup_del:?}"
    );
    for (bad, field) in [
        (json!({"id": "x", "content": "   "}), "fact.content"),
        (
            json!({"id": "x", "content": "c", "confidence": 1.5}),
            "fact.confidence",
        ),
        (
            json!({"id": "x", "content": "c", "topics": "t"}),
            "fact.topics",
        ),
        (json!({"id": "../x", "content": "c"}), "fact.id"),
        (
            json!({"id": "x", "content": "c", "status": "deleted"}),
            "fact.status",
        ),
    ] {
        // An invalid fact never reaches storage: its draft is refused, with the error storage
        // reports for it.
        let err = StorageError::from(FactDraft::try_from(bad.clone()).unwrap_err());
        assert!(
            matches!(&err, StorageError::InvalidInput { field: got, .. } if got == field),
            "{bad}: {err:?}"
        );
    }
    let doc = f.storage.load(Some(&u), Some(&a)).await.unwrap();
    assert_eq!(doc.revision, 1);
    assert_eq!(ids(&doc.facts), vec!["f1"]);
}

/// `list_facts` has no hidden cap (more than 100 facts come back), pages with cursor and
/// limit, filters with Python equality, and rejects a zero limit.
pub async fn list_facts_pages_without_hidden_cap(f: StorageFixture) {
    let (u, a) = (user("alice"), agent("agent-a"));
    let drafts: Vec<FactDraft> = (0..150)
        .map(|i| {
            let d = new_fact(&format!("f{i:03}"), &format!("fact number {i}"));
            if i % 2 == 0 {
                d.with_category("goal")
            } else {
                d
            }
        })
        .collect();
    f.storage
        .apply_changes(
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
    let all = f
        .storage
        .list_facts(Some(&u), &a, &ListQuery::default())
        .await
        .unwrap();
    assert_eq!(all.len(), 150);
    let page = f
        .storage
        .list_facts(
            Some(&u),
            &a,
            &ListQuery {
                cursor: 140,
                limit: Some(5),
                ..ListQuery::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(ids(&page), vec!["f140", "f141", "f142", "f143", "f144"]);
    let mut filters = serde_json::Map::new();
    filters.insert("category".into(), json!("goal"));
    filters.insert("confidence".into(), json!(0.8));
    let goals = f
        .storage
        .list_facts(
            Some(&u),
            &a,
            &ListQuery {
                filters,
                ..ListQuery::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(goals.len(), 75);
    let err = f
        .storage
        .list_facts(
            Some(&u),
            &a,
            &ListQuery {
                limit: Some(0),
                ..ListQuery::default()
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StorageError::InvalidInput { .. }));
}

/// The usage sidecar records accesses only for existing facts, with heat decaying over the
/// access half-life (30 days by default), and is removed with the facts it describes.
pub async fn usage_sidecar_tracks_existing_facts(f: StorageFixture) {
    let (u, a) = (user("alice"), agent("agent-a"));
    create(&f, &u, &a, "f1", "one").await;
    create(&f, &u, &a, "f2", "two").await;
    f.storage
        .record_fact_accesses(
            Some(&u),
            &a,
            &[fid("f1"), fid("ghost"), fid("f1")],
            Some(ts("2026-08-01T00:00:00Z")),
        )
        .await
        .unwrap();
    f.storage
        .record_fact_accesses(
            Some(&u),
            &a,
            &[fid("f1"), fid("f2")],
            Some(ts("2026-08-31T00:00:00Z")),
        )
        .await
        .unwrap();
    let usage = f.storage.get_fact_usage(Some(&u), &a).await.unwrap();
    assert_eq!(usage.keys().collect::<Vec<_>>().len(), 2);
    assert!(!usage.contains_key("ghost"));
    let heat = usage["f1"]["accessHeat"].as_f64().unwrap_or(-1.0);
    assert!((heat - 1.5).abs() < 1e-9, "heat {heat}");
    assert_eq!(usage["f1"]["accessCount"], 2);
    assert_eq!(usage["f1"]["lastAccessedAt"], "2026-08-31T00:00:00Z");
    f.storage
        .delete_fact(Some(&u), &a, &fid("f1"), None, None)
        .await
        .unwrap();
    let usage = f.storage.get_fact_usage(Some(&u), &a).await.unwrap();
    assert_eq!(
        usage.keys().cloned().collect::<Vec<_>>(),
        vec!["f2".to_owned()]
    );
    f.storage
        .clear_fact_metadata(Some(&u), &a, None)
        .await
        .unwrap();
    assert!(
        f.storage
            .get_fact_usage(Some(&u), &a)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        f.storage
            .get_fact_usage(Some(&user("bob")), &a)
            .await
            .unwrap()
            .is_empty()
    );
}

/// Capacity-eviction events are recorded (metadata only) and sanitised when facts go.
pub async fn eviction_audit_records_and_clears(f: StorageFixture) {
    let (u, a) = (user("alice"), agent("agent-a"));
    let decision = EvictionDecision {
        kept: Vec::new(),
        evicted: vec![EvictedFact {
            fact_id: "gone".into(),
            category: "context".into(),
            score: 0.1,
            components: json!({"confidence": 0.1})
                .as_object()
                .cloned()
                .unwrap_or_default(),
        }],
        scores: Default::default(),
        policy: EvictionPolicy::Confidence,
        reserved_correction_slots: 0,
    };
    f.storage
        .record_capacity_eviction(Some(&u), &a, &decision, 10, None, Some(ts(START)))
        .await
        .unwrap();
    // Clearing other ids keeps the event; clearing its id drops it. Neither errors.
    f.storage
        .clear_fact_metadata(Some(&u), &a, Some(&[fid("other")]))
        .await
        .unwrap();
    f.storage
        .clear_fact_metadata(Some(&u), &a, Some(&[fid("gone")]))
        .await
        .unwrap();
    f.storage
        .clear_fact_metadata(Some(&u), &a, Some(&[]))
        .await
        .unwrap();
    let empty = EvictionDecision {
        evicted: Vec::new(),
        ..decision
    };
    f.storage
        .record_capacity_eviction(Some(&u), &a, &empty, 10, None, None)
        .await
        .unwrap();
}

/// The whole-document save makes the agent's facts exactly the document's facts.
pub async fn save_replaces_the_agent_fact_set(f: StorageFixture) {
    let (u, a) = (user("alice"), agent("agent-a"));
    create(&f, &u, &a, "f1", "one").await;
    create(&f, &u, &a, "f2", "two").await;
    let mut doc = f.storage.load(Some(&u), Some(&a)).await.unwrap();
    doc.facts.retain(|x| x.id.as_str() == "f2");
    f.storage
        .save(Some(&u), Some(&a), &doc, Some(2))
        .await
        .unwrap();
    let after = f.storage.load(Some(&u), Some(&a)).await.unwrap();
    assert_eq!(ids(&after.facts), vec!["f2"]);
    assert_eq!(after.revision, 3);
    let err = f
        .storage
        .save(Some(&u), Some(&a), &after, Some(1))
        .await
        .unwrap_err();
    assert!(matches!(err, StorageError::ManifestConflict { .. }));
    let mut bad = after.clone();
    bad.facts = after.facts.clone();
    let err = f
        .storage
        .save(Some(&u), None, &bad, None)
        .await
        .unwrap_err();
    assert!(
        matches!(err, StorageError::InvalidInput { .. }),
        "agent-less save with facts"
    );
}

/// A created fact keeps the revision it was created with.
pub async fn created_fact_keeps_given_revision(f: StorageFixture) {
    let (u, a) = (user("alice"), agent("agent-a"));
    let d = new_fact("f1", "one").with_revision(3).unwrap();
    let r = f
        .storage
        .upsert_fact(Some(&u), &a, d, None, None)
        .await
        .unwrap();
    assert_eq!(r.upserted_facts[0].revision, 3);
    let got = f
        .storage
        .get_fact(Some(&u), &a, &fid("f1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.revision, 3);
}

/// Drafts without an id get a fresh storage-style id; the fact id generator has that shape.
pub async fn missing_ids_are_generated(f: StorageFixture) {
    let (u, a) = (user("alice"), agent("agent-a"));
    let r = f
        .storage
        .apply_changes(
            Some(&u),
            Some(&a),
            ChangeSet {
                upserts: vec![FactDraft::new("no id").unwrap()],
                ..ChangeSet::default()
            },
            ApplyOptions::default(),
        )
        .await
        .unwrap();
    let id = r.upserted_facts[0].id.to_string();
    assert!(id.starts_with("fact_") && id.len() == 37, "{id}");
    let fresh = f.storage.new_fact_id();
    assert_ne!(fresh.as_str(), id);
}

/// Without an index, search falls back to a case-insensitive substring scan over all facts of
/// the scope, ranked by confidence, honouring category and `top_k`.
pub async fn search_falls_back_to_substring(f: StorageFixture) {
    let (u, a) = (user("alice"), agent("agent-a"));
    if f.storage.capabilities().retrieval {
        return;
    }
    let hi = new_fact("hi", "Uses PYTHON daily")
        .with_confidence(0.9)
        .unwrap();
    let lo = new_fact("lo", "python scripts")
        .with_confidence(0.3)
        .unwrap()
        .with_category("goal");
    f.storage
        .apply_changes(
            Some(&u),
            Some(&a),
            ChangeSet {
                upserts: vec![lo, hi, new_fact("other", "rust")],
                ..ChangeSet::default()
            },
            ApplyOptions::default(),
        )
        .await
        .unwrap();
    let scope = Scope::agent(&u, &a);
    let hits = f
        .storage
        .search_facts(&SearchQuery::new(" Python ", scope.clone(), 10))
        .await
        .unwrap();
    assert_eq!(
        hits.iter()
            .map(|h| h.fact.id.to_string())
            .collect::<Vec<_>>(),
        vec!["hi", "lo"]
    );
    assert!(hits.iter().all(|h| h.match_type == MatchType::Substring));
    let mut q = SearchQuery::new("python", scope.clone(), 10);
    q.category = Some("goal".into());
    let hits = f.storage.search_facts(&q).await.unwrap();
    assert_eq!(hits.len(), 1);
    assert_eq!(
        f.storage
            .search_facts(&SearchQuery::new("python", scope.clone(), 1))
            .await
            .unwrap()
            .len(),
        1
    );
    assert!(
        f.storage
            .search_facts(&SearchQuery::new("  ", scope, 10))
            .await
            .unwrap()
            .is_empty()
    );
    let other = Scope::agent(&user("bob"), &a);
    assert!(
        f.storage
            .search_facts(&SearchQuery::new("python", other, 10))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(!f.storage.retrieval_status().await.configured);
}

/// Expands one named test per behaviour of the storage contract for a fixture expression
/// (an expression evaluating to a future of [`StorageFixture`]).
#[macro_export]
macro_rules! storage_contract {
    ($fixture:expr) => {
        $crate::storage_contract!(@tests $fixture;
            empty_user_reads_as_template,
            first_commit_creates_revision_one_then_noop,
            create_update_delete_round_trip,
            identical_upsert_is_a_noop,
            stale_fact_revision_is_a_fact_conflict,
            stale_manifest_revision_is_a_manifest_conflict,
            disjoint_point_operation_rebases,
            delete_of_absent_id_is_a_noop,
            results_hold_only_the_delta,
            summaries_merge_per_child,
            clear_all_empties_every_agent,
            facts_are_sorted_by_id,
            returned_documents_are_owned_copies,
            users_and_agents_are_isolated,
            invalid_inputs_are_rejected,
            list_facts_pages_without_hidden_cap,
            usage_sidecar_tracks_existing_facts,
            eviction_audit_records_and_clears,
            save_replaces_the_agent_fact_set,
            created_fact_keeps_given_revision,
            missing_ids_are_generated,
            search_falls_back_to_substring,
        );
    };
    (@tests $fixture:expr; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::block_on(async {
                    let fixture = $fixture.await;
                    $crate::storage::$name(fixture).await;
                });
            }
        )*
    };
}

/// A fixture over a fresh [`InMemoryStorage`] with a manual clock at [`START`].
pub async fn in_memory_fixture() -> StorageFixture {
    let clock = Arc::new(ManualClock::at(START));
    StorageFixture {
        storage: Arc::new(InMemoryStorage::new(clock.clone())),
        clock,
        guard: Box::new(()),
    }
}
