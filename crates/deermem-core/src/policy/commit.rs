//! The decision of one commit, shared by every storage adapter: from the scope's current
//! revision and summaries and the stored versions of the facts a change set names, which facts
//! to write (normalised, with their revisions), which to remove, the merged summaries and the
//! next revision; or the conflict or invalid input that refuses the commit. How the decision is
//! made durable (files and a journal, a database transaction) is the adapter's.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::{Map, Value};

use crate::document::{ChangeSet, SummaryPatch, SummarySection};
use crate::error::{FactError, StorageError};
use crate::fact::{Fact, FactDraft, FactScope, NormalizeContext, normalize_fact};
use crate::ids::{AgentName, FactId};
use crate::time::Timestamp;
use deermem_pycompat::py;

/// What to commit to one user (and agent).
#[derive(Debug, Default, Clone)]
pub struct CommitRequest {
    /// The agent whose facts change (required when facts change).
    pub agent: Option<AgentName>,
    /// Drafts with their ids already assigned.
    pub upserts: Vec<(FactId, FactDraft)>,
    /// Per-fact expected revision (`None` = must not exist); absent ids are unchecked.
    pub upsert_revisions: HashMap<FactId, Option<u64>>,
    /// Ids to delete; absent facts are skipped.
    pub deletes: Vec<FactId>,
    /// Per-fact expected revision of deleted facts; absent ids are unchecked.
    pub delete_revisions: BTreeMap<FactId, u64>,
    /// Summary children to merge into `user` and `history`.
    pub summaries: Option<SummaryPatch>,
    /// The shared revision the change was computed from; `None` skips the check.
    pub expected_revision: Option<u64>,
    /// Set only by the file adapter's global migration, whose commit rewrites a legacy
    /// manifest that still holds inline facts; every other commit refuses to drop them.
    pub allow_legacy_drop: bool,
}

impl CommitRequest {
    /// Whether the request touches facts.
    pub fn has_fact_changes(&self) -> bool {
        !self.upserts.is_empty() || !self.deletes.is_empty()
    }

    /// Validates a change set into a commit request, before any lock is taken: ids assigned
    /// (`fresh_id()` for a draft without one, written into the draft), each upsert's expected
    /// revision (from `upsertRevisions`, else the draft's own typed `revision`), and the id
    /// rules (a draft's id and revision were checked when the draft was built).
    ///
    /// # Errors
    /// `InvalidInput`: fact changes without an agent, a duplicate id, an id both upserted and
    /// deleted, an `upsertRevisions` value of 0.
    pub fn prepare(
        changes: ChangeSet,
        agent: Option<&AgentName>,
        fresh_id: impl Fn() -> FactId,
    ) -> Result<Self, StorageError> {
        if changes.has_fact_changes() && agent.is_none() {
            return Err(agent_required());
        }
        let mut req = Self {
            agent: agent.cloned(),
            upserts: Vec::with_capacity(changes.upserts.len()),
            deletes: changes.deletes,
            delete_revisions: changes.delete_revisions.unwrap_or_default(),
            summaries: changes.summaries,
            ..Self::default()
        };
        let bad_revision = || StorageError::InvalidInput {
            field: "change_set.upsertRevisions".into(),
            message: "change_set.upsertRevisions values must be null or integers >= 1".into(),
        };
        let mut seen: HashSet<FactId> = HashSet::new();
        for mut draft in changes.upserts {
            let id = match draft.id() {
                Some(id) => id.clone(),
                None => {
                    let id = fresh_id();
                    draft.set_id(id.clone());
                    id
                }
            };
            if !seen.insert(id.clone()) {
                return Err(duplicate_upsert(&id));
            }
            let expected = match changes.upsert_revisions.as_ref().and_then(|m| m.get(&id)) {
                Some(Some(0)) => return Err(bad_revision()),
                Some(e) => *e,
                None => draft.revision(),
            };
            req.upsert_revisions.insert(id.clone(), expected);
            req.upserts.push((id, draft));
        }
        let mut deleted = HashSet::new();
        for id in &req.deletes {
            check_delete(id, &mut deleted, &seen)?;
        }
        Ok(req)
    }
}

/// A fact as stored, as the decision needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredFact {
    /// The fact as the requesting user sees it.
    pub fact: Fact,
    /// Whether the stored record names another raw id of the same bucket; the next write of the
    /// fact records the requester's raw id even when nothing else changes.
    pub foreign_owner: bool,
}

/// The scope's record before the commit (`None` to [`decide`]: nothing stored yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CurrentRecord {
    /// The shared revision.
    pub revision: u64,
    /// Whether the record is in an old format that any commit rewrites.
    pub needs_rewrite: bool,
}

/// One fact to write.
#[derive(Debug, Clone, PartialEq)]
pub struct DecidedWrite {
    /// The normalised fact with its new revision.
    pub fact: Fact,
    /// Whether a stored version exists (it is replaced).
    pub existed: bool,
}

/// A commit that writes.
#[derive(Debug, Clone, PartialEq)]
pub struct Writes {
    /// Facts to write, in the change set's order (unchanged upserts are left out).
    pub writes: Vec<DecidedWrite>,
    /// Stored facts to remove, in the change set's order (absent ones are left out).
    pub removals: Vec<FactId>,
    /// The `user` summary section after the merge.
    pub user: SummarySection,
    /// The `history` summary section after the merge.
    pub history: SummarySection,
    /// Whether the summaries (or the record's format) change.
    pub record_changes: bool,
    /// The shared revision before.
    pub revision: u64,
    /// The shared revision after: one more.
    pub next_revision: u64,
}

/// What a commit does.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Nothing changes (an existing record, no material change): the revision stays.
    Unchanged,
    /// Something is written.
    Write(Box<Writes>),
}

/// Whether a shared-revision conflict may be retried against the revision found (the
/// reference's rebase of point operations): only when the caller allows it, for fact changes
/// without summaries whose every fact carries its own revision check.
pub fn may_rebase(req: &CommitRequest, allowed: bool) -> bool {
    allowed
        && req.has_fact_changes()
        && req.summaries.is_none()
        && req
            .upserts
            .iter()
            .all(|(id, _)| req.upsert_revisions.contains_key(id))
        && req
            .deletes
            .iter()
            .all(|id| req.delete_revisions.contains_key(id))
}

/// The error for fact changes without an agent.
pub fn agent_required() -> StorageError {
    StorageError::InvalidInput {
        field: "agent_name".into(),
        message: "agent_name is required for fact repository changes".into(),
    }
}

/// The error for an id upserted twice.
pub fn duplicate_upsert(id: &FactId) -> StorageError {
    StorageError::InvalidInput {
        field: "change_set.upserts".into(),
        message: format!("Duplicate fact id '{id}' in upserts"),
    }
}

/// Checks one deleted id: deleted once (`seen` collects them), and not upserted too.
///
/// # Errors
/// `InvalidInput` naming the change set.
pub fn check_delete<'a>(
    id: &'a FactId,
    seen: &mut HashSet<&'a FactId>,
    upserted: &HashSet<FactId>,
) -> Result<(), StorageError> {
    if !seen.insert(id) {
        return Err(StorageError::InvalidInput {
            field: "change_set.deletes".into(),
            message: "Duplicate fact ids are not allowed in deletes".into(),
        });
    }
    if upserted.contains(id) {
        return Err(StorageError::InvalidInput {
            field: "change_set".into(),
            message: format!("Fact '{id}' cannot be upserted and deleted together"),
        });
    }
    Ok(())
}

fn revision_conflict(id: &FactId, expected: u64, found: Option<u64>) -> StorageError {
    FactError::RevisionConflict {
        id: id.to_string(),
        expected,
        found,
    }
    .into()
}

/// The children of `base` with `patch`'s replaced (shallow merge); `None` without a patch.
fn merged(
    base: &Map<String, Value>,
    patch: Option<&Map<String, Value>>,
) -> Option<Map<String, Value>> {
    patch.map(|p| {
        let mut out = base.clone();
        out.extend(p.iter().map(|(k, v)| (k.clone(), v.clone())));
        out
    })
}

/// Whether a merged section differs from its base (by Python equality).
fn differs(new: Option<&Map<String, Value>>, base: &Map<String, Value>) -> bool {
    new.is_some_and(|n| {
        n.len() != base.len()
            || !n
                .iter()
                .all(|(k, v)| base.get(k).is_some_and(|w| py::py_eq(v, w)))
    })
}

/// Decides one commit in the reference's order: the shared-revision precondition, per-fact
/// preconditions and normalisation of the upserts, the deletes, the summary merge, then the
/// no-op exit. `raw_user` is the requesting user's raw id (recorded in written facts);
/// `stored(id)` answers the stored version of a named fact (each id is asked at most once per
/// place it appears); `sections()` the stored summaries, asked once after the facts.
///
/// # Errors
/// `ManifestConflict`, `FactConflict`, `InvalidInput` as [`StorageError`] (converted into the
/// adapter's error), and whatever `stored` or `sections` report.
pub fn decide<E: From<StorageError>>(
    req: &CommitRequest,
    raw_user: Option<String>,
    current: Option<CurrentRecord>,
    mut stored: impl FnMut(&FactId) -> Result<Option<StoredFact>, E>,
    sections: impl FnOnce() -> Result<(SummarySection, SummarySection), E>,
    now: Timestamp,
) -> Result<Decision, E> {
    let current_rev = current.map_or(0, |c| c.revision);
    if let Some(expected) = req.expected_revision
        && expected != current_rev
    {
        return Err(StorageError::ManifestConflict {
            expected,
            found: current_rev,
        }
        .into());
    }
    let agent = match &req.agent {
        None if req.has_fact_changes() => return Err(agent_required().into()),
        agent => agent.as_ref(),
    };
    let mut writes: Vec<DecidedWrite> = Vec::new();
    let mut upserted: HashSet<FactId> = HashSet::new();
    let mut removals: Vec<FactId> = Vec::new();
    if let Some(agent) = agent {
        let fact_scope = FactScope {
            user_id: raw_user,
            agent_name: Some(agent.as_str().to_owned()),
        };
        for (id, draft) in &req.upserts {
            if !upserted.insert(id.clone()) {
                return Err(duplicate_upsert(id).into());
            }
            let existing = stored(id)?;
            let actual = existing.as_ref().map(|e| e.fact.revision);
            match req.upsert_revisions.get(id) {
                Some(None) if actual.is_some() => {
                    return Err(StorageError::FactConflict {
                        id: id.to_string(),
                        message: format!("Fact '{id}' must not already exist"),
                    }
                    .into());
                }
                Some(Some(e)) if Some(*e) != actual => {
                    return Err(revision_conflict(id, *e, actual).into());
                }
                _ => {}
            }
            let owned;
            let draft = if draft.id() == Some(id) {
                draft
            } else {
                owned = draft.clone().with_id(id.clone());
                &owned
            };
            let ctx = NormalizeContext {
                scope: &fact_scope,
                existing: existing.as_ref().map(|e| &e.fact),
                now,
                // The draft carries its id, so no id is ever made here.
                new_id: &|| id.clone(),
            };
            let fact = normalize_fact(draft, &ctx).map_err(StorageError::from)?;
            let changed = existing
                .as_ref()
                .is_none_or(|e| e.foreign_owner || e.fact != fact);
            if changed {
                writes.push(DecidedWrite {
                    existed: existing.is_some(),
                    fact,
                });
            }
        }
        let mut deleted: HashSet<&FactId> = HashSet::new();
        for id in &req.deletes {
            check_delete(id, &mut deleted, &upserted)?;
            let Some(existing) = stored(id)? else {
                continue;
            };
            if let Some(expected) = req.delete_revisions.get(id)
                && *expected != existing.fact.revision
            {
                return Err(revision_conflict(id, *expected, Some(existing.fact.revision)).into());
            }
            removals.push(id.clone());
        }
    }

    // Summaries: a shallow per-child merge.
    let (base_user, base_hist) = sections()?;
    let patch = req.summaries.as_ref();
    let user_new = merged(&base_user.0, patch.and_then(|p| p.user.as_ref()));
    let hist_new = merged(&base_hist.0, patch.and_then(|p| p.history.as_ref()));
    let summaries_changed =
        differs(user_new.as_ref(), &base_user.0) || differs(hist_new.as_ref(), &base_hist.0);
    let rewrite = current.is_some_and(|c| c.needs_rewrite);
    if current.is_some()
        && !rewrite
        && !summaries_changed
        && writes.is_empty()
        && removals.is_empty()
    {
        return Ok(Decision::Unchanged);
    }
    Ok(Decision::Write(Box::new(Writes {
        writes,
        removals,
        user: user_new.map_or(base_user, SummarySection),
        history: hist_new.map_or(base_hist, SummarySection),
        record_changes: summaries_changed || rewrite,
        revision: current_rev,
        next_revision: current_rev + 1,
    })))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn now() -> Timestamp {
        Timestamp::parse_iso("2026-06-01T00:00:00Z").unwrap()
    }

    fn id(s: &str) -> FactId {
        FactId::new(s).unwrap()
    }

    fn draft(content: &str) -> FactDraft {
        FactDraft::new(content)
            .unwrap()
            .with_category("preference")
            .with_confidence(0.9)
            .unwrap()
    }

    fn defaults() -> Result<(SummarySection, SummarySection), StorageError> {
        Ok((
            SummarySection::default_user(),
            SummarySection::default_history(),
        ))
    }

    fn request(upserts: Vec<(FactId, FactDraft)>) -> CommitRequest {
        CommitRequest {
            agent: Some(AgentName::parse("coder").unwrap()),
            upserts,
            ..CommitRequest::default()
        }
    }

    fn none(_: &FactId) -> Result<Option<StoredFact>, StorageError> {
        Ok(None)
    }

    #[test]
    fn a_create_writes_at_the_next_revision_and_the_same_fact_again_is_a_no_op() {
        let req = request(vec![(id("fact_a"), draft("Likes tea"))]);
        let current = Some(CurrentRecord {
            revision: 4,
            needs_rewrite: false,
        });
        let Decision::Write(w) =
            decide(&req, Some("alice".into()), current, none, defaults, now()).unwrap()
        else {
            panic!("a create writes");
        };
        assert_eq!((w.revision, w.next_revision), (4, 5));
        assert_eq!(w.writes.len(), 1);
        assert!(!w.writes[0].existed);
        assert!(!w.record_changes);
        let stored = StoredFact {
            fact: w.writes[0].fact.clone(),
            foreign_owner: false,
        };
        let again = decide::<StorageError>(
            &req,
            Some("alice".into()),
            current,
            |_| Ok(Some(stored.clone())),
            defaults,
            now(),
        )
        .unwrap();
        assert_eq!(again, Decision::Unchanged);
        // The same fact recorded under another raw id of the bucket is rewritten.
        let foreign = StoredFact {
            foreign_owner: true,
            ..stored
        };
        let rewritten = decide::<StorageError>(
            &req,
            Some("alice".into()),
            current,
            |_| Ok(Some(foreign.clone())),
            defaults,
            now(),
        )
        .unwrap();
        assert!(matches!(rewritten, Decision::Write(w) if w.writes.len() == 1));
    }

    #[test]
    fn preconditions_refuse_before_anything_is_decided() {
        let mut req = request(vec![(id("fact_a"), draft("x"))]);
        req.expected_revision = Some(3);
        let current = Some(CurrentRecord {
            revision: 4,
            needs_rewrite: false,
        });
        assert!(matches!(
            decide(&req, None, current, none, defaults, now()),
            Err(StorageError::ManifestConflict {
                expected: 3,
                found: 4
            })
        ));
        let mut req = request(vec![(id("fact_a"), draft("x"))]);
        req.upsert_revisions.insert(id("fact_a"), Some(2));
        assert!(matches!(
            decide(&req, None, current, none, defaults, now()),
            Err(StorageError::FactConflict { .. })
        ));
        let mut req = request(vec![(id("fact_a"), draft("x")), (id("fact_a"), draft("y"))]);
        req.agent = Some(AgentName::parse("coder").unwrap());
        assert!(matches!(
            decide(&req, None, current, none, defaults, now()),
            Err(StorageError::InvalidInput { .. })
        ));
        let mut req = request(vec![(id("fact_a"), draft("x"))]);
        req.agent = None;
        assert!(matches!(
            decide(&req, None, current, none, defaults, now()),
            Err(StorageError::InvalidInput { field, .. }) if field == "agent_name"
        ));
    }

    #[test]
    fn a_fresh_user_is_written_even_without_changes_and_a_summary_patch_merges() {
        let req = CommitRequest::default();
        assert!(matches!(
            decide(&req, None, None, none, defaults, now()).unwrap(),
            Decision::Write(w) if w.next_revision == 1 && w.writes.is_empty()
        ));
        let mut patch = Map::new();
        patch.insert(
            "workContext".into(),
            json!({"summary": "Rust", "updatedAt": "x"}),
        );
        let req = CommitRequest {
            summaries: Some(SummaryPatch {
                user: Some(patch),
                history: None,
            }),
            ..CommitRequest::default()
        };
        let current = Some(CurrentRecord {
            revision: 1,
            needs_rewrite: false,
        });
        let Decision::Write(w) = decide(&req, None, current, none, defaults, now()).unwrap() else {
            panic!("a summary change writes");
        };
        assert!(w.record_changes);
        assert_eq!(w.user.0["workContext"]["summary"], "Rust");
        assert_eq!(w.history, SummarySection::default_history());
    }
}
