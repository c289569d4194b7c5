//! The commit transaction: what to commit and what it did, and `commit`, which reads the
//! snapshot a commit decides from (the manifest and the facts the change set names), has
//! `plan` decide it without I/O, and has `execute` carry it out under the durability protocol.
//! The caller holds both locks and has run recovery.

mod execute;
mod plan;

use std::collections::HashMap;

use deermem_core::{Fact, FactId, Scope, Timestamp};

use crate::error::Result;
use crate::manifest::{self, Manifest};
use crate::markdown;
use crate::paths::UserDir;

pub(crate) use deermem_core::policy::commit::{CommitRequest, may_rebase};

/// A retrieval notification queued by a commit, dispatched after the locks are released.
#[derive(Debug, Clone)]
pub(crate) enum Notification {
    /// A fact was written.
    Upsert { scope: Scope, fact: Box<Fact> },
    /// A fact was deleted.
    Remove { scope: Scope, id: String },
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
