//! The decision of a commit, without I/O: from the manifest and the stored versions of the facts
//! a change set names, the plan of what to write (fact files with their bytes and revisions,
//! unlinks, pre-images, the prepared journal, the new manifest) or the conflict or invalid input
//! that refuses it. The decision itself is the core's `policy::commit::decide`, shared with every
//! storage adapter; this adds the file layout. Time and the operation id come in as arguments;
//! `execute` carries a plan out.

use std::collections::HashMap;
use std::path::PathBuf;

use deermem_core::document::DOCUMENT_VERSION;
use deermem_core::policy::commit::{self, CurrentRecord, Decision, StoredFact};
use deermem_core::{Fact, FactId, Scope, SummarySection, Timestamp};
use deermem_pycompat::py;

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

/// Decides one commit: the legacy-manifest guard, then the shared decision
/// ([`commit::decide`]: preconditions, normalisation, deletes, the summary merge, the no-op
/// exit), then what the file layout needs for it: the rendered fact files, the journal and the
/// pre-images.
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
    if let Some(m) = current
        && !req.allow_legacy_drop
        && m.map.get("facts").is_some_and(py::truthy)
    {
        return Err(Error::Corrupt(format!(
            "Global memory JSON {} still holds legacy facts; refusing to rewrite it before they are migrated",
            m.path.display()
        )));
    }
    let record = current.map(|m| CurrentRecord {
        revision: m.revision,
        needs_rewrite: m.needs_migration(),
    });
    let stored = |id: &FactId| {
        snapshot.facts.remove(id).unwrap_or(Ok(None)).map(|found| {
            found.map(|l| StoredFact {
                fact: l.fact,
                foreign_owner: l.foreign_owner,
            })
        })
    };
    let sections = || match current {
        Some(m) => Ok((m.user()?, m.history()?)),
        None => Ok((
            SummarySection::default_user(),
            SummarySection::default_history(),
        )),
    };
    let decided = commit::decide(req, udir.raw_user(), record, stored, sections, now)?;
    let scope = Scope::new(udir.user.clone(), req.agent.clone());
    let w = match decided {
        Decision::Unchanged => {
            // `decide` answers `Unchanged` only for an existing manifest.
            let (version, revision, last_updated) = current.map_or_else(
                || (DOCUMENT_VERSION.to_owned(), 0, String::new()),
                |m| (m.version(), m.revision, m.last_updated()),
            );
            return Ok(Plan::Unchanged(Committed {
                version,
                revision,
                last_updated,
                written: Vec::new(),
                deleted: Vec::new(),
                scope,
                wrote: false,
            }));
        }
        Decision::Write(w) => *w,
    };
    let agent = req.agent.as_ref();
    let mut writes = Vec::with_capacity(w.writes.len());
    let mut removals = Vec::with_capacity(w.removals.len());
    if let Some(agent) = agent {
        for d in w.writes {
            writes.push(FactWrite {
                rendered: markdown::render(&d.fact)?,
                path: udir.fact(agent, &d.fact.id),
                existed: d.existed,
                fact: d.fact,
            });
        }
        removals.extend(w.removals.into_iter().map(|id| Removal {
            path: udir.fact(agent, &id),
            id,
        }));
    }
    let (current_rev, next) = (w.revision, w.next_revision);
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
    let preimages = (!existed.is_empty() || (current.is_some() && w.record_changes)).then(|| {
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
    let manifest = manifest::render(next, &last_updated, &w.user.0, &w.history.0);
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
