//! The decision of a commit, without I/O: from the manifest and the stored versions of the facts
//! a change set names, the plan of what to write (fact files with their bytes and revisions,
//! unlinks, pre-images, the prepared journal, the new manifest) or the conflict or invalid input
//! that refuses it. Time and the operation id come in as arguments; `execute` carries a plan out.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use deermem_core::document::DOCUMENT_VERSION;
use deermem_core::fact::{FactScope, NormalizeContext, normalize_fact};
use deermem_core::{Fact, FactId, Scope, SummarySection, Timestamp};
use deermem_pycompat::py;
use serde_json::{Map, Value};

use super::{CommitRequest, Committed};
use crate::error::{Error, Result};
use crate::journal::{Journal, PREPARED};
use crate::manifest::{self, Manifest};
use crate::markdown::{self, LoadedFact};
use crate::paths::{RECOVERY_MANIFEST, UserDir};

/// What a commit decides from: the state of the user's files under the locks.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    /// The current manifest (`None`: none exists).
    pub(crate) manifest: Option<Manifest>,
    /// The stored version of each fact the change set names, or why it could not be read (the
    /// plan reports that error when it reaches the fact). An id missing here does not exist.
    pub(crate) facts: HashMap<FactId, Result<Option<LoadedFact>>>,
}

/// One fact file to write.
#[derive(Debug, PartialEq)]
pub(crate) struct FactWrite {
    pub(crate) fact: Fact,
    pub(crate) path: PathBuf,
    /// The file's bytes.
    pub(crate) rendered: String,
    /// Whether the file exists (it then has a pre-image).
    pub(crate) existed: bool,
}

/// One fact file to unlink.
#[derive(Debug, PartialEq)]
pub(crate) struct Removal {
    pub(crate) id: FactId,
    pub(crate) path: PathBuf,
}

/// The durable pre-images of a commit: `.recovery/<operation>` and `(source, copy)` pairs.
#[derive(Debug, PartialEq)]
pub(crate) struct Preimages {
    pub(crate) dir: PathBuf,
    pub(crate) files: Vec<(PathBuf, PathBuf)>,
}

/// A commit that writes: everything its execution does, in order.
#[derive(Debug, PartialEq)]
pub(crate) struct WritePlan {
    /// The scope of the index notifications.
    pub(crate) scope: Scope,
    /// `None` for a commit that only creates facts and leaves the summaries alone.
    pub(crate) preimages: Option<Preimages>,
    pub(crate) journal: Journal,
    pub(crate) writes: Vec<FactWrite>,
    pub(crate) removals: Vec<Removal>,
    /// The manifest's new text.
    pub(crate) manifest: String,
    /// The shared revision after the commit.
    pub(crate) revision: u64,
    pub(crate) last_updated: String,
}

/// What a commit does.
#[derive(Debug, PartialEq)]
pub(crate) enum Plan {
    /// Nothing changes: the result of the no-op.
    Unchanged(Committed),
    /// Files change.
    Write(WritePlan),
}

impl WritePlan {
    /// The result of the executed plan: exactly its writes and unlinks.
    pub(crate) fn into_committed(self) -> Committed {
        Committed {
            version: DOCUMENT_VERSION.to_owned(),
            revision: self.revision,
            last_updated: self.last_updated,
            written: self.writes.into_iter().map(|w| w.fact).collect(),
            deleted: self.removals.into_iter().map(|r| r.id).collect(),
            scope: self.scope,
            wrote: true,
        }
    }
}

/// Whether a manifest revision conflict may be retried against the revision found (the
/// reference's rebase of point operations): only when the caller allows it, for fact changes
/// without summaries whose every fact carries its own revision check.
pub(crate) fn may_rebase(req: &CommitRequest, allowed: bool) -> bool {
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
pub(crate) fn agent_required() -> Error {
    Error::invalid(
        "agent_name",
        "agent_name is required for fact repository changes",
    )
}

/// The error for an id upserted twice.
pub(crate) fn duplicate_upsert(id: &FactId) -> Error {
    Error::invalid(
        "change_set.upserts",
        format!("Duplicate fact id '{id}' in upserts"),
    )
}

/// Checks one deleted id: deleted once (`seen` collects them), and not upserted too.
pub(crate) fn check_delete<'a>(
    id: &'a FactId,
    seen: &mut HashSet<&'a FactId>,
    upserted: &HashSet<FactId>,
) -> Result<()> {
    if !seen.insert(id) {
        return Err(Error::invalid(
            "change_set.deletes",
            "Duplicate fact ids are not allowed in deletes",
        ));
    }
    if upserted.contains(id) {
        return Err(Error::invalid(
            "change_set",
            format!("Fact '{id}' cannot be upserted and deleted together"),
        ));
    }
    Ok(())
}

fn revision_conflict(id: &FactId, expected: u64, found: Option<u64>) -> Error {
    Error::FactConflict {
        id: id.to_string(),
        message: format!(
            "Expected fact '{id}' revision {expected}, found {}",
            found.map_or("None".to_owned(), |a| a.to_string())
        ),
    }
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

/// Decides one commit in the reference's order: the legacy-manifest and shared-revision
/// preconditions, per-fact preconditions and normalisation of the upserts, the deletes, the
/// summary merge, the no-op exit, then the journal and the pre-images the write needs.
///
/// # Errors
/// `ManifestConflict`, `FactConflict`, `Invalid`, and corruption (a legacy manifest, a fact
/// file that could not be read, a summary section that is not an object).
pub(crate) fn plan(
    udir: &UserDir,
    req: &CommitRequest,
    mut snapshot: Snapshot,
    now: Timestamp,
    operation_id: &str,
) -> Result<Plan> {
    let current = snapshot.manifest.as_ref();
    let current_rev = current.map_or(0, |m| m.revision);
    if let Some(m) = current
        && !req.allow_legacy_drop
        && m.map.get("facts").is_some_and(py::truthy)
    {
        return Err(Error::Corrupt(format!(
            "Global memory JSON {} still holds legacy facts; refusing to rewrite it before they are migrated",
            m.path.display()
        )));
    }
    if let Some(expected) = req.expected_revision
        && expected != current_rev
    {
        return Err(Error::ManifestConflict {
            expected,
            found: current_rev,
        });
    }
    let agent = match &req.agent {
        None if req.has_fact_changes() => return Err(agent_required()),
        agent => agent.as_ref(),
    };
    let scope = Scope::new(udir.user.clone(), agent.cloned());
    let mut stored = |id: &FactId| snapshot.facts.remove(id).unwrap_or(Ok(None));

    let mut writes: Vec<FactWrite> = Vec::new();
    let mut upserted: HashSet<FactId> = HashSet::new();
    let mut removals: Vec<Removal> = Vec::new();
    if let Some(agent) = agent {
        let fact_scope = FactScope {
            user_id: udir.raw_user(),
            agent_name: Some(agent.as_str().to_owned()),
        };
        for (id, draft) in &req.upserts {
            if !upserted.insert(id.clone()) {
                return Err(duplicate_upsert(id));
            }
            let existing = stored(id)?;
            let actual = existing.as_ref().map(|e| e.fact.revision);
            match req.upsert_revisions.get(id) {
                Some(None) if actual.is_some() => {
                    return Err(Error::FactConflict {
                        id: id.to_string(),
                        message: format!("Fact '{id}' must not already exist"),
                    });
                }
                Some(Some(e)) if Some(*e) != actual => {
                    return Err(revision_conflict(id, *e, actual));
                }
                _ => {}
            }
            let mut draft = draft.clone();
            draft.insert("id".into(), Value::String(id.as_str().to_owned()));
            let ctx = NormalizeContext {
                scope: &fact_scope,
                existing: existing.as_ref().map(|e| &e.fact),
                now,
                // The draft carries its id, so no id is ever made here.
                new_id: &|| id.clone(),
            };
            let fact = normalize_fact(&draft, &ctx)?;
            let changed = existing
                .as_ref()
                .is_none_or(|e| e.foreign_owner || e.fact != fact);
            if changed {
                writes.push(FactWrite {
                    rendered: markdown::render(&fact)?,
                    path: udir.fact(agent, id),
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
                return Err(revision_conflict(
                    id,
                    *expected,
                    Some(existing.fact.revision),
                ));
            }
            removals.push(Removal {
                id: id.clone(),
                path: udir.fact(agent, id),
            });
        }
    }

    // Summaries: a shallow per-child merge. Without a patch the sections stay borrowed.
    let (base_user, base_hist) = match current {
        Some(m) => (m.user()?, m.history()?),
        None => (
            SummarySection::default_user(),
            SummarySection::default_history(),
        ),
    };
    let patch = req.summaries.as_ref();
    let user_new = merged(&base_user.0, patch.and_then(|p| p.user.as_ref()));
    let hist_new = merged(&base_hist.0, patch.and_then(|p| p.history.as_ref()));
    let summaries_changed =
        differs(user_new.as_ref(), &base_user.0) || differs(hist_new.as_ref(), &base_hist.0);

    let legacy = current.is_some_and(Manifest::needs_migration);
    if let Some(m) = current
        && !legacy
        && !summaries_changed
        && writes.is_empty()
        && removals.is_empty()
    {
        return Ok(Plan::Unchanged(Committed {
            version: m.version(),
            revision: current_rev,
            last_updated: m.last_updated(),
            written: Vec::new(),
            deleted: Vec::new(),
            scope,
            wrote: false,
        }));
    }

    let next = current_rev + 1;
    let existed: Vec<&FactId> = writes
        .iter()
        .filter(|w| w.existed)
        .map(|w| &w.fact.id)
        .chain(removals.iter().map(|r| &r.id))
        .collect();
    let journal = Journal {
        operation_id: operation_id.to_owned(),
        state: PREPARED,
        agent_name: agent.map(|a| a.as_str().to_owned()),
        expected_revision: current_rev,
        next_revision: next,
        fact_ids: writes
            .iter()
            .map(|w| w.fact.id.to_string())
            .chain(removals.iter().map(|r| r.id.to_string()))
            .collect(),
        old_entries: match agent {
            Some(agent) => existed
                .iter()
                .map(|id| (id.to_string(), udir.fact_rel(agent, id)))
                .collect(),
            None => Vec::new(),
        },
    };
    // A commit that only creates facts and leaves the summaries alone needs no pre-image:
    // rolling it back unlinks the new facts, and its manifest differs from the current one only
    // in `revision` and `lastUpdated`, so recovery rolls such a commit forward once the manifest
    // holds `nextRevision` (every fact write precedes it) and otherwise leaves the manifest
    // alone, as the reference's recovery does without a manifest pre-image. No
    // `.recovery/<op>` is created for it (the reference's recovery skips a missing one).
    let manifest_changes = summaries_changed || legacy;
    let preimages = (!existed.is_empty() || (current.is_some() && manifest_changes)).then(|| {
        let dir = udir.recovery_root().join(operation_id);
        let manifest = current.map(|_| (udir.manifest(), dir.join(RECOVERY_MANIFEST)));
        let facts = writes
            .iter()
            .filter(|w| w.existed)
            .map(|w| (&w.fact.id, &w.path))
            .chain(removals.iter().map(|r| (&r.id, &r.path)))
            .map(|(id, path)| (path.clone(), dir.join(format!("{id}.md"))));
        let files = manifest.into_iter().chain(facts).collect();
        Preimages { dir, files }
    });
    let last_updated = now.to_iso_z();
    let manifest = manifest::render(
        next,
        &last_updated,
        user_new.as_ref().unwrap_or(&base_user.0),
        hist_new.as_ref().unwrap_or(&base_hist.0),
    );
    Ok(Plan::Write(WritePlan {
        scope,
        preimages,
        journal,
        writes,
        removals,
        manifest,
        revision: next,
        last_updated,
    }))
}

#[cfg(test)]
mod tests;
