//! The commit transaction: what to commit and what it did, and `commit`, which reads the
//! snapshot a commit decides from (the manifest and the facts the change set names), has
//! `plan` decide it without I/O, and has `execute` carry it out under the durability protocol.
//! The caller holds both locks and has run recovery.

mod execute;
mod plan;

use std::collections::{BTreeMap, HashMap};

use deermem_core::{AgentName, Fact, FactDraft, FactId, Scope, SummaryPatch, Timestamp};

use crate::error::Result;
use crate::manifest::{self, Manifest};
use crate::markdown;
use crate::paths::UserDir;

pub(crate) use plan::{agent_required, check_delete, duplicate_upsert, may_rebase};

/// A retrieval notification queued by a commit, dispatched after the locks are released.
#[derive(Debug, Clone)]
pub(crate) enum Notification {
    /// A fact was written.
    Upsert { scope: Scope, fact: Box<Fact> },
    /// A fact was deleted.
    Remove { scope: Scope, id: String },
}

/// What to commit.
#[derive(Debug, Default)]
pub(crate) struct CommitRequest {
    pub(crate) agent: Option<AgentName>,
    /// Drafts with their ids already assigned.
    pub(crate) upserts: Vec<(FactId, FactDraft)>,
    /// Per-fact expected revision (`None` = must not exist); absent ids are unchecked.
    pub(crate) upsert_revisions: HashMap<FactId, Option<u64>>,
    pub(crate) deletes: Vec<FactId>,
    /// Per-fact expected revision of deleted facts; absent ids are unchecked.
    pub(crate) delete_revisions: BTreeMap<FactId, u64>,
    /// Summary children to merge into `user` and `history`.
    pub(crate) summaries: Option<SummaryPatch>,
    pub(crate) expected_revision: Option<u64>,
    /// Set only by the global migration, whose commit rewrites a legacy manifest that still
    /// holds inline facts; every other commit refuses to drop them.
    pub(crate) allow_legacy_drop: bool,
}

impl CommitRequest {
    /// Whether the request touches facts.
    pub(crate) fn has_fact_changes(&self) -> bool {
        !self.upserts.is_empty() || !self.deletes.is_empty()
    }
}

/// What a commit did.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Committed {
    pub(crate) version: String,
    pub(crate) revision: u64,
    pub(crate) last_updated: String,
    pub(crate) written: Vec<Fact>,
    pub(crate) deleted: Vec<FactId>,
    /// The scope of the written and deleted facts.
    pub(crate) scope: Scope,
    /// Whether anything was written.
    pub(crate) wrote: bool,
}

impl Committed {
    /// The index notifications of what was written and deleted, in that order.
    pub(crate) fn notifications(&self) -> Vec<Notification> {
        let upserts = self.written.iter().map(|f| Notification::Upsert {
            scope: self.scope.clone(),
            fact: Box::new(f.clone()),
        });
        let removes = self.deleted.iter().map(|id| Notification::Remove {
            scope: self.scope.clone(),
            id: id.to_string(),
        });
        upserts.chain(removes).collect()
    }
}

/// Runs one commit. `known_manifest` is the manifest as the caller read it under the same locks
/// (`Some(None)`: none exists); `None` makes the commit read it.
///
/// # Errors
/// `ManifestConflict`, `FactConflict`, `Invalid`, corruption, `Io`.
pub(crate) fn commit(
    udir: &UserDir,
    req: &CommitRequest,
    known_manifest: Option<Option<Manifest>>,
    now: Timestamp,
) -> Result<Committed> {
    let manifest = match known_manifest {
        Some(m) => m,
        None => manifest::read_manifest(&udir.manifest())?,
    };
    // Each named fact is read once; a failed read is reported where the plan reaches it.
    let mut facts = HashMap::new();
    if let Some(agent) = &req.agent {
        let expected = udir.expected(agent);
        for id in req.upserts.iter().map(|(id, _)| id).chain(&req.deletes) {
            if !facts.contains_key(id) {
                let read = markdown::load_optional(&udir.fact(agent, id), expected, now);
                facts.insert(id.clone(), read);
            }
        }
    }
    let snapshot = plan::Snapshot { manifest, facts };
    let operation_id = uuid::Uuid::new_v4().simple().to_string();
    match plan::plan(udir, req, snapshot, now, &operation_id)? {
        plan::Plan::Unchanged(done) => Ok(done),
        plan::Plan::Write(p) => execute::execute(udir, p),
    }
}
