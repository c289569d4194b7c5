//! Property tests of the commit plan: random manifests, stored facts and change sets, checked
//! against the revision, conflict, rebase and result rules the plan must keep.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use deermem_core::fact::{FactScope, NormalizeContext, normalize_fact};
use deermem_core::policy::commit::may_rebase;
use deermem_core::{AgentName, FactDraft, FactId, SummaryPatch, Timestamp, UserId};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

use super::*;
use crate::paths::Layout;

const IDS: [&str; 5] = ["fact_a", "fact_b", "fact_c", "fact_d", "fact_e"];
const CONTENTS: [&str; 3] = ["Likes green tea", "Works at night", "Speaks Dutch"];
const SUMMARIES: [&str; 3] = ["", "Prefers short answers", "Lives in Ghent"];

fn udir() -> UserDir {
    let layout = Layout {
        root: PathBuf::from("/nonexistent/root"),
        manifest_name: "memory.json".into(),
        strict_user_scope: false,
    };
    layout
        .user_dir(Some(&UserId::new("alice").unwrap()))
        .unwrap()
}

fn agent() -> AgentName {
    AgentName::parse("helper").unwrap()
}

fn now() -> Timestamp {
    Timestamp::parse_iso("2026-03-01T12:00:00Z").unwrap()
}

fn id(i: usize) -> FactId {
    FactId::new(IDS[i]).unwrap()
}

/// A fact stored before the commit.
#[derive(Debug, Clone)]
struct Stored {
    content: usize,
    revision: u64,
    foreign_owner: bool,
}

/// Which revision a draft or a precondition names.
#[derive(Debug, Clone, Copy)]
enum Rev {
    /// No revision.
    None,
    /// The stored fact's revision (none when the fact is absent).
    Stored,
    /// This one.
    Fixed(u64),
}

/// An upsert's precondition in `upsert_revisions`.
#[derive(Debug, Clone, Copy)]
enum Precondition {
    Unchecked,
    MustNotExist,
    Revision(Rev),
}

#[derive(Debug, Clone)]
struct Upsert {
    id: usize,
    content: usize,
    draft_revision: Rev,
    precondition: Precondition,
}

#[derive(Debug, Clone)]
struct Delete {
    id: usize,
    /// `None`: unchecked.
    precondition: Option<Rev>,
}

#[derive(Debug, Clone)]
struct ManifestCase {
    revision: u64,
    /// A v1 version string (the manifest needs migration).
    legacy_version: bool,
    /// Inline legacy facts (only the global migration may drop them).
    inline_facts: bool,
    summary: usize,
}

/// The shared-revision precondition.
#[derive(Debug, Clone, Copy)]
enum Shared {
    Unchecked,
    Current,
    Stale(u64),
}

#[derive(Debug, Clone)]
struct Case {
    manifest: Option<ManifestCase>,
    stored: Vec<Option<Stored>>,
    with_agent: bool,
    upserts: Vec<Upsert>,
    deletes: Vec<Delete>,
    summaries: Option<(Option<usize>, Option<usize>)>,
    shared: Shared,
    allow_legacy_drop: bool,
}

fn rev() -> impl Strategy<Value = Rev> {
    prop_oneof![
        1 => Just(Rev::None),
        3 => Just(Rev::Stored),
        1 => (1u64..5).prop_map(Rev::Fixed),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    let manifest = proptest::option::weighted(
        0.8,
        (
            0u64..6,
            proptest::bool::weighted(0.15),
            proptest::bool::weighted(0.1),
            0..SUMMARIES.len(),
        )
            .prop_map(
                |(revision, legacy_version, inline_facts, summary)| ManifestCase {
                    revision,
                    legacy_version,
                    inline_facts,
                    summary,
                },
            ),
    );
    let stored = proptest::collection::vec(
        proptest::option::of(
            (0..CONTENTS.len(), 1u64..4, proptest::bool::weighted(0.15)).prop_map(
                |(content, revision, foreign_owner)| Stored {
                    content,
                    revision,
                    foreign_owner,
                },
            ),
        ),
        IDS.len(),
    );
    let precondition = prop_oneof![
        1 => Just(Precondition::Unchecked),
        1 => Just(Precondition::MustNotExist),
        2 => rev().prop_map(Precondition::Revision),
    ];
    let upsert = (0..IDS.len(), 0..CONTENTS.len(), rev(), precondition).prop_map(
        |(id, content, draft_revision, precondition)| Upsert {
            id,
            content,
            draft_revision,
            precondition,
        },
    );
    let delete = (0..IDS.len(), proptest::option::of(rev()))
        .prop_map(|(id, precondition)| Delete { id, precondition });
    let section = proptest::option::of(0..SUMMARIES.len());
    let shared = prop_oneof![
        Just(Shared::Unchecked),
        Just(Shared::Current),
        (1u64..3).prop_map(Shared::Stale),
    ];
    (
        manifest,
        stored,
        proptest::bool::weighted(0.95),
        proptest::collection::vec(upsert, 0..4),
        proptest::collection::vec(delete, 0..3),
        proptest::option::weighted(0.3, (section.clone(), section)),
        shared,
        proptest::bool::weighted(0.2),
    )
        .prop_map(
            |(
                manifest,
                stored,
                with_agent,
                upserts,
                deletes,
                summaries,
                shared,
                allow_legacy_drop,
            )| {
                Case {
                    manifest,
                    stored,
                    with_agent,
                    upserts,
                    deletes,
                    summaries,
                    shared,
                    allow_legacy_drop,
                }
            },
        )
}

fn summary_section(i: usize) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert(
        "workContext".into(),
        json!({"summary": SUMMARIES[i], "updatedAt": ""}),
    );
    m
}

impl Case {
    fn current_revision(&self) -> u64 {
        self.manifest.as_ref().map_or(0, |m| m.revision)
    }

    fn stored_revision(&self, i: usize) -> Option<u64> {
        self.stored[i].as_ref().map(|s| s.revision)
    }

    fn resolve(&self, rev: Rev, i: usize) -> Option<u64> {
        match rev {
            Rev::None => None,
            Rev::Stored => self.stored_revision(i),
            Rev::Fixed(n) => Some(n),
        }
    }

    fn manifest(&self) -> Option<Manifest> {
        let m = self.manifest.as_ref()?;
        let mut v = json!({
            "version": if m.legacy_version { "1.0" } else { DOCUMENT_VERSION },
            "revision": m.revision,
            "lastUpdated": "2026-01-01T00:00:00Z",
            "user": summary_section(m.summary),
            "history": {},
        });
        if m.inline_facts {
            v["facts"] = json!([{"id": "legacy"}]);
        }
        let path = Path::new("/nonexistent/root/users/alice/memory.json");
        Some(manifest::parse_manifest(path, v.to_string().as_bytes()).unwrap())
    }

    fn stored_fact(&self, i: usize) -> Option<LoadedFact> {
        let s = self.stored[i].as_ref()?;
        let owner = if s.foreign_owner { "ALICE" } else { "alice" };
        let scope = FactScope {
            user_id: Some(owner.to_owned()),
            agent_name: Some(agent().as_str().to_owned()),
        };
        let draft = FactDraft::try_from(json!({
            "id": IDS[i],
            "content": CONTENTS[s.content],
            "revision": s.revision,
            "createdAt": "2026-01-01T00:00:00Z",
        }))
        .unwrap();
        let ctx = NormalizeContext {
            scope: &scope,
            existing: None,
            now: now(),
            new_id: &|| id(i),
        };
        let mut fact = normalize_fact(&draft, &ctx).unwrap();
        // As a load hands it over: owned by the requester, the other raw id remembered.
        fact.scope.user_id = Some("alice".to_owned());
        Some(LoadedFact {
            fact,
            foreign_owner: s.foreign_owner,
        })
    }

    fn snapshot(&self) -> Snapshot {
        let facts = (0..IDS.len())
            .map(|i| (id(i), Ok(self.stored_fact(i))))
            .collect();
        Snapshot {
            manifest: self.manifest(),
            facts,
        }
    }

    fn request(&self) -> CommitRequest {
        let mut req = CommitRequest {
            agent: self.with_agent.then(agent),
            allow_legacy_drop: self.allow_legacy_drop,
            expected_revision: match self.shared {
                Shared::Unchecked => None,
                Shared::Current => Some(self.current_revision()),
                Shared::Stale(d) => Some(self.current_revision() + d),
            },
            summaries: self.summaries.map(|(u, h)| SummaryPatch {
                user: u.map(summary_section),
                history: h.map(summary_section),
            }),
            ..CommitRequest::default()
        };
        for u in &self.upserts {
            let mut draft = FactDraft::new(CONTENTS[u.content]).unwrap();
            if let Some(r) = self.resolve(u.draft_revision, u.id) {
                draft = draft.with_revision(r).unwrap();
            }
            match u.precondition {
                Precondition::Unchecked => {}
                Precondition::MustNotExist => {
                    req.upsert_revisions.insert(id(u.id), None);
                }
                Precondition::Revision(r) => {
                    // A revision precondition always names some revision.
                    let r = self.resolve(r, u.id).unwrap_or(1);
                    req.upsert_revisions.insert(id(u.id), Some(r));
                }
            }
            req.upserts.push((id(u.id), draft));
        }
        for d in &self.deletes {
            req.deletes.push(id(d.id));
            if let Some(r) = d.precondition {
                let r = self.resolve(r, d.id).unwrap_or(1);
                req.delete_revisions.insert(id(d.id), r);
            }
        }
        req
    }

    fn plan(&self) -> Result<Plan> {
        plan(&udir(), &self.request(), self.snapshot(), now(), "op1")
    }

    /// The first rule the case breaks, in the order the plan checks them (`None`: it plans).
    fn first_broken_rule(&self) -> Option<&'static str> {
        let req = self.request();
        if self.manifest.as_ref().is_some_and(|m| m.inline_facts) && !self.allow_legacy_drop {
            return Some("corrupt");
        }
        if matches!(self.shared, Shared::Stale(_)) {
            return Some("manifest-conflict");
        }
        if !self.with_agent {
            return (!self.upserts.is_empty() || !self.deletes.is_empty()).then_some("invalid");
        }
        let mut upserted = BTreeSet::new();
        for u in &self.upserts {
            if !upserted.insert(u.id) {
                return Some("invalid");
            }
            let stored = self.stored_revision(u.id);
            match req.upsert_revisions.get(&id(u.id)) {
                Some(None) if stored.is_some() => return Some("fact-conflict"),
                Some(Some(e)) if Some(*e) != stored => return Some("fact-conflict"),
                _ => {}
            }
            // An update must carry the stored revision (a draft without one carries 1).
            let draft = self.resolve(u.draft_revision, u.id).unwrap_or(1);
            if stored.is_some_and(|s| s != draft) {
                return Some("fact-conflict");
            }
        }
        let mut deleted = BTreeSet::new();
        for d in &self.deletes {
            if !deleted.insert(d.id) || upserted.contains(&d.id) {
                return Some("invalid");
            }
            let (Some(stored), Some(e)) = (
                self.stored_revision(d.id),
                req.delete_revisions.get(&id(d.id)),
            ) else {
                continue;
            };
            if *e != stored {
                return Some("fact-conflict");
            }
        }
        None
    }
}

fn kind(e: &Error) -> &'static str {
    match e {
        Error::Corrupt(_) => "corrupt",
        Error::ManifestConflict { .. } => "manifest-conflict",
        Error::Invalid { .. } => "invalid",
        Error::FactConflict { .. } => "fact-conflict",
        _ => "other",
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The plan is a function of its inputs: no clock, no randomness, no filesystem.
    #[test]
    fn plans_are_deterministic(c in case()) {
        prop_assert_eq!(format!("{:?}", c.plan()), format!("{:?}", c.plan()));
    }

    /// Conflicts and invalid input: a create of an existing id, a stale fact revision, a stale
    /// shared revision, a legacy manifest, a missing agent, and duplicate or overlapping ids
    /// refuse the commit with the first broken rule's error; a case that breaks none plans.
    #[test]
    fn the_first_broken_rule_refuses_the_commit(c in case()) {
        match (c.plan(), c.first_broken_rule()) {
            (Ok(_), None) => {}
            (Err(e), Some(rule)) => {
                prop_assert_eq!(kind(&e), rule, "{}", e);
                if let Error::ManifestConflict { expected, found } = e {
                    prop_assert_eq!(found, c.current_revision());
                    prop_assert_eq!(Some(expected), c.request().expected_revision);
                }
            }
            (got, want) => prop_assert!(false, "planned {:?}, expected {:?}", got, want),
        }
    }

    /// Shared revisions: +1 exactly when something is written, unchanged for a no-op; the
    /// journal and the new manifest agree with the plan.
    #[test]
    fn the_shared_revision_moves_exactly_when_something_is_written(c in case()) {
        let current = c.current_revision();
        match c.plan() {
            Err(_) => {}
            Ok(Plan::Unchanged(done)) => {
                prop_assert_eq!(done.revision, current);
                prop_assert!(!done.wrote);
                prop_assert!(done.written.is_empty() && done.deleted.is_empty());
                let m = c.manifest.as_ref();
                prop_assert!(m.is_some_and(|m| !m.legacy_version && !m.inline_facts));
            }
            Ok(Plan::Write(p)) => {
                prop_assert_eq!(p.revision, current + 1);
                prop_assert_eq!(p.journal.expected_revision, current);
                prop_assert_eq!(p.journal.next_revision, p.revision);
                prop_assert_eq!(p.journal.state, PREPARED);
                prop_assert_eq!(&p.last_updated, &now().to_iso_z());
                let written = manifest::parse_manifest(Path::new("/m.json"), p.manifest.as_bytes()).unwrap();
                prop_assert_eq!(written.revision, p.revision);
                prop_assert!(!written.needs_migration());
                let before = c.manifest();
                let summaries_changed = before.as_ref().is_none_or(|b| {
                    b.user().unwrap() != written.user().unwrap()
                        || b.history().unwrap() != written.history().unwrap()
                });
                let cleanup = before.as_ref().is_none_or(Manifest::needs_migration);
                prop_assert!(!p.writes.is_empty() || !p.removals.is_empty() || summaries_changed || cleanup);
            }
        }
    }

    /// Per-fact revisions: a fact is written when it is new, recorded under another raw owner
    /// id, or materially changed; its revision goes up by one on a material change only.
    #[test]
    fn fact_revisions_move_on_material_change_only(c in case()) {
        let Ok(planned) = c.plan() else { return Ok(()) };
        let writes = match &planned {
            Plan::Write(p) => p.writes.iter().collect::<Vec<_>>(),
            Plan::Unchanged(_) => Vec::new(),
        };
        for u in &c.upserts {
            let w = writes.iter().find(|w| w.fact.id == id(u.id));
            match &c.stored[u.id] {
                None => {
                    let w = w.expect("a new fact is written");
                    prop_assert!(!w.existed);
                    prop_assert_eq!(w.fact.revision, c.resolve(u.draft_revision, u.id).unwrap_or(1));
                }
                Some(s) => {
                    let changed = s.content != u.content;
                    prop_assert_eq!(w.is_some(), changed || s.foreign_owner);
                    if let Some(w) = w {
                        prop_assert!(w.existed);
                        prop_assert_eq!(w.fact.revision, s.revision + u64::from(changed));
                    }
                }
            }
        }
        for w in &writes {
            prop_assert_eq!(&w.rendered, &markdown::render(&w.fact).unwrap());
            prop_assert_eq!(&w.path, &udir().fact(&agent(), &w.fact.id));
            prop_assert_eq!(w.fact.scope.user_id.as_deref(), Some("alice"));
        }
    }

    /// Upserts and deletes never overlap, each id appears once, only stored facts are
    /// unlinked, and the result delta, the journal and the pre-images are exactly the plan's
    /// writes and unlinks.
    #[test]
    fn the_result_is_the_plans_writes(c in case()) {
        let Ok(Plan::Write(p)) = c.plan() else { return Ok(()) };
        let written: Vec<&FactId> = p.writes.iter().map(|w| &w.fact.id).collect();
        let removed: Vec<&FactId> = p.removals.iter().map(|r| &r.id).collect();
        let all: BTreeSet<&FactId> = written.iter().chain(&removed).copied().collect();
        prop_assert_eq!(all.len(), written.len() + removed.len());
        for r in &p.removals {
            prop_assert!(c.snapshot().facts[&r.id].as_ref().unwrap().is_some());
            prop_assert_eq!(&r.path, &udir().fact(&agent(), &r.id));
        }
        for d in &c.deletes {
            prop_assert_eq!(c.stored[d.id].is_some(), removed.contains(&&id(d.id)));
        }
        let ids: Vec<String> = written.iter().chain(&removed).map(|i| i.to_string()).collect();
        prop_assert_eq!(&p.journal.fact_ids, &ids);
        let existed: Vec<&FactId> = p
            .writes
            .iter()
            .filter(|w| w.existed)
            .map(|w| &w.fact.id)
            .chain(removed.iter().copied())
            .collect();
        let old: Vec<String> = p.journal.old_entries.iter().map(|(i, _)| i.clone()).collect();
        prop_assert_eq!(old, existed.iter().map(|i| i.to_string()).collect::<Vec<_>>());
        // Pre-images unless the commit only creates facts and leaves an existing manifest's
        // summaries and format alone (or writes the first manifest).
        let after = manifest::parse_manifest(Path::new("/m.json"), p.manifest.as_bytes()).unwrap();
        let manifest_changes = c.manifest().is_some_and(|b| {
            b.needs_migration()
                || b.user().unwrap() != after.user().unwrap()
                || b.history().unwrap() != after.history().unwrap()
        });
        prop_assert_eq!(p.preimages.is_some(), !existed.is_empty() || manifest_changes);
        match &p.preimages {
            None => {}
            Some(pre) => {
                prop_assert_eq!(&pre.dir, &udir().recovery_root().join("op1"));
                let with_manifest = c.manifest.is_some();
                prop_assert_eq!(pre.files.len(), existed.len() + usize::from(with_manifest));
                if with_manifest {
                    prop_assert_eq!(&pre.files[0].0, &udir().manifest());
                }
            }
        }
        let scope = p.scope.clone();
        let facts: Vec<Fact> = p.writes.iter().map(|w| w.fact.clone()).collect();
        let deleted: Vec<FactId> = removed.iter().map(|i| (*i).clone()).collect();
        let done = p.into_committed();
        prop_assert!(done.wrote);
        prop_assert_eq!(&done.written, &facts);
        prop_assert_eq!(&done.deleted, &deleted);
        prop_assert_eq!(done.notifications().len(), facts.len() + deleted.len());
        prop_assert_eq!(done.scope, scope);
    }

    /// A stale shared revision: without rebase the conflict names the revision found; with
    /// it, the rebased request (expecting what was found) plans exactly as a request that
    /// never checked the shared revision, because every fact it names carries its own check.
    #[test]
    fn rebasing_replans_against_the_revision_found(c in case()) {
        let mut req = c.request();
        let rebase = may_rebase(&req, true);
        prop_assert!(!may_rebase(&req, false));
        if rebase {
            prop_assert!(req.summaries.is_none() && req.has_fact_changes());
            prop_assert!(req.upserts.iter().all(|(i, _)| req.upsert_revisions.contains_key(i)));
            prop_assert!(req.deletes.iter().all(|i| req.delete_revisions.contains_key(i)));
        }
        let found = match plan(&udir(), &req, c.snapshot(), now(), "op1") {
            Err(Error::ManifestConflict { found, .. }) => found,
            _ => return Ok(()),
        };
        req.expected_revision = Some(found);
        let rebased = plan(&udir(), &req, c.snapshot(), now(), "op1");
        req.expected_revision = None;
        let unchecked = plan(&udir(), &req, c.snapshot(), now(), "op1");
        prop_assert_eq!(format!("{rebased:?}"), format!("{unchecked:?}"));
    }
}

#[test]
fn a_failed_read_is_reported_where_the_plan_reaches_the_fact() {
    let mut snapshot = Snapshot::default();
    snapshot
        .facts
        .insert(id(1), Err(Error::Corrupt("unreadable".into())));
    let mut req = CommitRequest {
        agent: Some(agent()),
        expected_revision: Some(3),
        deletes: vec![id(1)],
        ..CommitRequest::default()
    };
    // The shared revision is checked first.
    let e = plan(&udir(), &req, snapshot, now(), "op1").unwrap_err();
    assert!(matches!(
        e,
        Error::ManifestConflict {
            expected: 3,
            found: 0
        }
    ));
    let mut snapshot = Snapshot::default();
    snapshot
        .facts
        .insert(id(1), Err(Error::Corrupt("unreadable".into())));
    req.expected_revision = None;
    let e = plan(&udir(), &req, snapshot, now(), "op1").unwrap_err();
    assert_eq!(e.to_string(), "unreadable");
}
