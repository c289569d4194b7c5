//! The write paths: a change set validated into a commit request, the rebase loop for
//! everything but point upserts, the group commit that lets concurrent point upserts of one
//! user share a commit, clearing a user, and the sidecar cleanup of deleted facts.

use std::collections::HashSet;

use deermem_core::{
    AgentName, ApplyOptions, FactId, SummaryPatch, SummarySection, Timestamp, UserId,
};

use super::Inner;
use crate::commit::{self, CommitRequest, Committed, Notification};
use crate::error::{Error, Result};
use crate::group::{Member, Turn};
use crate::journal;
use crate::manifest::{self, Manifest};
use crate::markdown;
use crate::migrate;
use crate::paths::{AUDIT_FILE, USAGE_FILE, UserDir};
use crate::sidecar;

/// One writer's share of a group commit: its point upserts (the agent is always set).
pub(super) type GroupedWrite = CommitRequest;

/// What a group commit gives one of its writers.
pub(super) type Applied = Result<Committed>;

/// Writers taken into one group commit at most (the leader included).
const GROUP_MAX: usize = 64;

/// One writer's part of a group's commit: the shared revision and time stamps, and its own
/// facts.
fn share_of(done: &Committed, w: &GroupedWrite) -> Committed {
    let ids: HashSet<&FactId> = w.upserts.iter().map(|(id, _)| id).collect();
    Committed {
        version: done.version.clone(),
        revision: done.revision,
        last_updated: done.last_updated.clone(),
        written: done
            .written
            .iter()
            .filter(|f| ids.contains(&f.id))
            .cloned()
            .collect(),
        deleted: Vec::new(),
        scope: done.scope.clone(),
        wrote: done.wrote,
    }
}

/// How far `clear_all` got: the notifications of the commits that landed, the agents cleared,
/// the agent whose step was running when it failed, and the outcome.
#[derive(Default)]
pub(super) struct ClearProgress {
    pub(super) notes: Vec<Notification>,
    pub(super) agents: Vec<AgentName>,
    pub(super) failed_at: Option<AgentName>,
}

impl Inner {
    /// Commits under the locks (the caller ran recovery), dropping the user's cached documents
    /// when anything was written.
    fn commit_locked(
        &self,
        udir: &UserDir,
        req: &CommitRequest,
        known_manifest: Option<Option<Manifest>>,
        now: Timestamp,
    ) -> Result<Committed> {
        let done = commit::commit(udir, req, known_manifest, now)?;
        if done.wrote {
            self.invalidate_user(&udir.user);
        }
        Ok(done)
    }

    /// Applies a validated change set and returns the commit with every index notification
    /// to send (the read migrations' first). Point upserts without a shared-revision check go
    /// through a group commit, everything else through the rebase loop.
    pub(super) fn apply(
        &self,
        user: Option<&UserId>,
        req: CommitRequest,
        options: ApplyOptions,
    ) -> Result<(Committed, Vec<Notification>)> {
        let (done, mut notes) = if req.agent.is_some()
            && options.expected_manifest_revision.is_none()
            && !req.upserts.is_empty()
            && req.deletes.is_empty()
            && req.summaries.is_none()
        {
            self.apply_grouped(user, req)?
        } else {
            self.apply_alone(user, req, options)?
        };
        notes.extend(done.notifications());
        Ok((done, notes))
    }

    /// A point upsert (no deletes, no summaries, no shared-revision check) through the user's
    /// write group (`group.rs`): writers that arrive while the leader waits for the user lock
    /// or commits are taken into its next commit when they write the same agent and other fact
    /// ids: one journal, one manifest revision and one set of fsyncs for all of them. Each
    /// writer's own fact preconditions still hold: when the shared commit fails (a fact
    /// conflict, an I/O error), each writer's changes are committed alone under the same lock,
    /// so each gets exactly the result it would have had alone.
    fn apply_grouped(
        &self,
        user: Option<&UserId>,
        mine: GroupedWrite,
    ) -> Result<(Committed, Vec<Notification>)> {
        let (mine, leader) = match self.groups.join(user.cloned(), mine) {
            Turn::Lead(mine, leader) => (mine, leader),
            Turn::Done(result) => return result.map(|done| (done, Vec::new())),
            Turn::Abandoned => {
                return Err(Error::io(
                    "The group commit this write joined stopped without an answer under",
                    &self.layout.root,
                    std::io::Error::other("the leading writer failed"),
                ));
            }
        };
        let udir = self.user_dir(user)?;
        let now = self.now();
        let lock = match self.lock(&udir) {
            Ok(lock) => lock,
            Err(Error::LockTimeout { lock }) => {
                // Everyone queued behind this leader waited for the same lock: they time out
                // with it instead of each waiting the whole timeout again.
                for m in leader.take(usize::MAX, |_| true) {
                    m.finish(Err(Error::LockTimeout { lock: lock.clone() }));
                }
                return Err(Error::LockTimeout { lock });
            }
            Err(e) => return Err(e),
        };
        let (notes, current_manifest) =
            self.read_migrations_locked(&udir, mine.agent.as_ref(), now)?;
        // Other writers of this agent whose fact ids no member writes.
        let mut ids: HashSet<FactId> = mine.upserts.iter().map(|(id, _)| id.clone()).collect();
        let members = leader.take(GROUP_MAX - 1, |w| {
            w.agent == mine.agent && w.upserts.iter().all(|(id, _)| !ids.contains(id)) && {
                ids.extend(w.upserts.iter().map(|(id, _)| id.clone()));
                true
            }
        });
        let result = if members.is_empty() {
            self.commit_locked(&udir, &mine, current_manifest, now)
        } else {
            self.commit_group(&udir, mine, members, current_manifest, now)
        };
        drop(lock);
        drop(leader);
        Ok((result?, notes))
    }

    /// Commits the leader's and its members' upserts together, or, when that fails, each
    /// alone; answers the members and returns the leader's result.
    fn commit_group(
        &self,
        udir: &UserDir,
        mine: GroupedWrite,
        members: Vec<Member<GroupedWrite, Applied>>,
        current_manifest: Option<Option<Manifest>>,
        now: Timestamp,
    ) -> Result<Committed> {
        let mut all = CommitRequest {
            agent: mine.agent.clone(),
            ..CommitRequest::default()
        };
        for w in std::iter::once(&mine).chain(members.iter().map(|m| &m.work)) {
            all.upserts.extend(w.upserts.iter().cloned());
            all.upsert_revisions
                .extend(w.upsert_revisions.iter().map(|(k, v)| (k.clone(), *v)));
        }
        match self.commit_locked(udir, &all, current_manifest, now) {
            Ok(done) => {
                tracing::debug!(
                    writers = members.len() + 1,
                    revision = done.revision,
                    "group commit"
                );
                for m in members {
                    let share = share_of(&done, &m.work);
                    m.finish(Ok(share));
                }
                Ok(share_of(&done, &mine))
            }
            Err(e) => {
                tracing::debug!(error = %e, writers = members.len() + 1,
                    "group commit failed; committing each writer alone");
                let alone = |w: &GroupedWrite| {
                    let (_, current) = self.read_migrations_locked(udir, w.agent.as_ref(), now)?;
                    self.commit_locked(udir, w, current, now)
                };
                let own = alone(&mine);
                for m in members {
                    let r = alone(&m.work);
                    m.finish(r);
                }
                own
            }
        }
    }

    /// Commits under the locks, with recovery, read migrations, and the reference's rebase loop
    /// (up to three attempts; a manifest revision conflict is retried only when
    /// [`commit::may_rebase`] allows it).
    fn apply_alone(
        &self,
        user: Option<&UserId>,
        mut req: CommitRequest,
        options: ApplyOptions,
    ) -> Result<(Committed, Vec<Notification>)> {
        let udir = self.user_dir(user)?;
        let can_rebase = commit::may_rebase(&req, options.allow_manifest_rebase);
        req.expected_revision = options.expected_manifest_revision;
        let mut attempt = 0;
        loop {
            let now = self.now();
            let lock = self.lock(&udir)?;
            let (notes, current_manifest) =
                self.read_migrations_locked(&udir, req.agent.as_ref(), now)?;
            match self.commit_locked(&udir, &req, current_manifest, now) {
                Ok(done) => {
                    if let (Some(agent), false) = (&req.agent, req.deletes.is_empty()) {
                        let ids: Vec<String> = req.deletes.iter().map(|i| i.to_string()).collect();
                        if let Err(e) = clear_metadata_locked(&udir, agent, Some(&ids)) {
                            tracing::warn!(error = %e, "could not clear sidecar metadata of deleted facts");
                        }
                    }
                    drop(lock);
                    return Ok((done, notes));
                }
                Err(Error::ManifestConflict { expected: e, found })
                    if can_rebase && attempt < 2 =>
                {
                    drop(lock);
                    tracing::debug!(expected = e, found, "rebasing point operation");
                    req.expected_revision = Some(found);
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Clears every agent of a user, one commit per agent, then resets the summaries. What was
    /// committed before a failure stays committed, so `out` collects the notifications of each
    /// commit as it lands (the caller dispatches them whether or not a later step failed) and
    /// names the agent whose step failed.
    pub(super) fn clear_all(&self, user: Option<&UserId>, out: &mut ClearProgress) -> Result<()> {
        self.locked(user, |udir, now| {
            let result = clear_all_locked(self, udir, now, out);
            // Earlier agents' commits may have landed even when a later one failed.
            self.invalidate_user(&udir.user);
            result
        })
    }
}

fn clear_all_locked(
    inner: &Inner,
    udir: &UserDir,
    now: Timestamp,
    out: &mut ClearProgress,
) -> Result<()> {
    let (notes, _) = inner.read_migrations_locked(udir, None, now)?;
    out.notes.extend(notes);
    journal::sweep_temp_files(udir);
    for entry in crate::fsutil::sorted_entries(&udir.agents())? {
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(agent) = markdown::canonical_agent_dir(&name) else {
            tracing::warn!(dir = %entry.path().display(), "clear_all skips a directory that is not a DeerMem agent bucket");
            continue;
        };
        out.failed_at = Some(agent.clone());
        if udir.legacy_agent_doc(&agent).exists() {
            let migrated = migrate::migrate_locked(udir, &agent, false, false, false, now)?;
            out.notes.extend(migrated.notifications);
        }
        let facts = markdown::load_all(&udir.facts(&agent), udir.expected(&agent), now)?;
        if !facts.is_empty() {
            let current = manifest::read_manifest(&udir.manifest())?.map_or(0, |m| m.revision);
            let req = CommitRequest {
                agent: Some(agent.clone()),
                deletes: facts.iter().map(|l| l.fact.id.clone()).collect(),
                delete_revisions: facts
                    .iter()
                    .map(|l| (l.fact.id.clone(), l.fact.revision))
                    .collect(),
                expected_revision: Some(current),
                ..CommitRequest::default()
            };
            out.notes
                .extend(commit::commit(udir, &req, None, now)?.notifications());
        }
        out.failed_at = None;
        out.agents.push(agent);
    }
    let defaults = CommitRequest {
        summaries: Some(SummaryPatch {
            user: Some(SummarySection::default_user().0),
            history: Some(SummarySection::default_history().0),
        }),
        ..CommitRequest::default()
    };
    commit::commit(udir, &defaults, None, now)?;
    for agent in &out.agents {
        if let Err(e) = clear_metadata_locked(udir, agent, None) {
            tracing::warn!(error = %e, agent = %agent, "could not remove sidecar metadata");
        }
    }
    Ok(())
}

/// Removes an agent's sidecar records of some facts, or (`None`) its whole sidecar directory;
/// the caller holds the locks.
pub(super) fn clear_metadata_locked(
    udir: &UserDir,
    agent: &AgentName,
    ids: Option<&[String]>,
) -> Result<()> {
    let meta = udir.metadata(agent);
    match ids {
        None => match std::fs::remove_dir_all(&meta) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io("Failed to remove", &meta, e)),
        },
        Some([]) => Ok(()),
        Some(ids) => sidecar::clear_ids(&meta.join(USAGE_FILE), &meta.join(AUDIT_FILE), ids),
    }
}
