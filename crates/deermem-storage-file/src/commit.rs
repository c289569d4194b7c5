//! The commit transaction in the reference's order: manifest revision check, per-fact preconditions
//! and normalisation, summary merge, no-op exit, durable pre-images (hard links where the
//! filesystem allows; none for a commit that only creates facts), prepared journal (written into a
//! recycled inode), fact writes and unlinks, manifest, then the commit point: the journal is taken
//! away (renamed back to its spare name) and the user directory fsynced (instead of the reference's
//! rewrite to `committed`; see `docs/compat.md`), and the pre-images are removed. The caller holds
//! both locks and has run recovery.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::PathBuf;

use deermem_core::fact::{FactScope, NormalizeContext, normalize_fact};
use deermem_core::{AgentName, Fact, FactDraft, FactId, Scope, SummarySection, Timestamp, py};
use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::fault;
use crate::fsutil;
use crate::journal::{Journal, PREPARED};
use crate::manifest::{self, Manifest};
use crate::markdown::{self, Expected};
use crate::paths::{RECOVERY_MANIFEST, UserDir};

/// A retrieval notification queued by a commit, dispatched after the locks are released.
#[derive(Debug, Clone)]
pub(crate) enum Notification {
    /// A fact was written.
    Upsert { scope: Scope, fact: Box<Fact> },
    /// A fact was deleted.
    Remove { scope: Scope, id: String },
}

/// Summary children to merge into `user` and `history`.
pub(crate) type SummaryChildren = (Option<Map<String, Value>>, Option<Map<String, Value>>);

/// What to commit.
#[derive(Debug, Default)]
pub(crate) struct CommitRequest {
    pub(crate) agent: Option<AgentName>,
    /// Drafts with their ids already assigned.
    pub(crate) upserts: Vec<(FactId, FactDraft)>,
    /// Per-fact expected revision (`None` = must not exist); absent ids are unchecked.
    pub(crate) upsert_revisions: Option<HashMap<FactId, Option<u64>>>,
    pub(crate) deletes: Vec<FactId>,
    pub(crate) delete_revisions: Option<BTreeMap<FactId, u64>>,
    /// Summary children to merge into `user` and `history`.
    pub(crate) summaries: Option<SummaryChildren>,
    pub(crate) expected_revision: Option<u64>,
    /// Set only by the global migration, whose commit rewrites a legacy manifest that still
    /// holds inline facts; every other commit refuses to drop them.
    pub(crate) allow_legacy_drop: bool,
    /// The manifest as the caller read it under the same locks (`Some(None)`: none exists);
    /// `None` makes the commit read it.
    pub(crate) current_manifest: Option<Option<Manifest>>,
}

/// What a commit did.
#[derive(Debug, Clone)]
pub(crate) struct Committed {
    pub(crate) version: String,
    pub(crate) revision: u64,
    pub(crate) last_updated: String,
    pub(crate) written: Vec<Fact>,
    pub(crate) deleted: Vec<FactId>,
    pub(crate) notifications: Vec<Notification>,
    /// Whether anything was written.
    pub(crate) wrote: bool,
}

struct Prepared {
    fact: Fact,
    path: PathBuf,
    rendered: String,
    existed: bool,
}

/// Runs one commit.
///
/// # Errors
/// `ManifestConflict`, `FactConflict`, `Invalid`, corruption, `Io`.
pub(crate) fn commit(udir: &UserDir, req: CommitRequest, now: Timestamp) -> Result<Committed> {
    // 1–2. Manifest and the shared revision precondition.
    let current = match req.current_manifest {
        Some(m) => m,
        None => manifest::read_manifest(&udir.manifest())?,
    };
    let current_rev = current.as_ref().map_or(0, |m| m.revision);
    if let Some(m) = &current {
        let holds_facts = m.map.get("facts").is_some_and(py::truthy);
        if holds_facts && !req.allow_legacy_drop {
            return Err(Error::Corrupt(format!(
                "Global memory JSON {} still holds legacy facts; refusing to rewrite it before they are migrated",
                m.path.display()
            )));
        }
    }
    if let Some(expected) = req.expected_revision
        && expected != current_rev
    {
        return Err(Error::ManifestConflict {
            expected,
            found: current_rev,
        });
    }
    // 3. Fact changes need an agent.
    let has_fact_changes = !req.upserts.is_empty() || !req.deletes.is_empty();
    let agent = match (&req.agent, has_fact_changes) {
        (Some(a), _) => Some(a.clone()),
        (None, true) => {
            return Err(Error::invalid(
                "agent_name",
                "agent_name is required for fact repository changes",
            ));
        }
        (None, false) => None,
    };
    let scope = FactScope {
        user_id: udir.raw_user(),
        agent_name: agent.as_ref().map(|a| a.as_str().to_owned()),
    };
    let note_scope = Scope::new(udir.user.clone(), agent.clone());

    // 4. Upserts.
    let mut prepared: Vec<Prepared> = Vec::new();
    let mut seen: HashSet<FactId> = HashSet::new();
    let upsert_ids: BTreeSet<FactId> = req.upserts.iter().map(|(id, _)| id.clone()).collect();
    if let Some(agent) = &agent {
        let expected_scope = Expected {
            user: udir.user.as_ref(),
            agent: agent.as_str(),
        };
        for (id, draft) in &req.upserts {
            if !seen.insert(id.clone()) {
                return Err(Error::invalid(
                    "change_set.upserts",
                    format!("Duplicate fact id '{id}' in upserts"),
                ));
            }
            let path = udir.fact(agent, id);
            let existing = markdown::load_optional(&path, expected_scope, now)?;
            if let Some(expected) = req.upsert_revisions.as_ref().and_then(|r| r.get(id)) {
                let actual = existing.as_ref().map(|e| e.fact.revision);
                match (expected, actual) {
                    (None, Some(_)) => {
                        return Err(Error::FactConflict {
                            id: id.to_string(),
                            message: format!("Fact '{id}' must not already exist"),
                        });
                    }
                    (Some(e), a) if Some(*e) != a => {
                        return Err(Error::FactConflict {
                            id: id.to_string(),
                            message: format!(
                                "Expected fact '{id}' revision {e}, found {}",
                                a.map_or("None".to_owned(), |a| a.to_string())
                            ),
                        });
                    }
                    _ => {}
                }
            }
            let mut draft = draft.clone();
            draft.insert("id".into(), Value::String(id.as_str().to_owned()));
            let ctx = NormalizeContext {
                scope: &scope,
                existing: existing.as_ref().map(|e| &e.fact),
                now,
                new_id: &crate::fresh_fact_id,
            };
            let normalized = normalize_fact(&draft, &ctx)?;
            let changed = match &existing {
                None => true,
                Some(e) => e.foreign_owner || e.fact != normalized,
            };
            if changed {
                let rendered = markdown::render(&normalized)?;
                prepared.push(Prepared {
                    fact: normalized,
                    path,
                    rendered,
                    existed: existing.is_some(),
                });
            }
        }
    }

    // 5. Deletes.
    let mut removals: Vec<(FactId, PathBuf)> = Vec::new();
    if let Some(agent) = &agent {
        let expected_scope = Expected {
            user: udir.user.as_ref(),
            agent: agent.as_str(),
        };
        let mut seen_del: HashSet<&FactId> = HashSet::new();
        for id in &req.deletes {
            if !seen_del.insert(id) {
                return Err(Error::invalid(
                    "change_set.deletes",
                    "Duplicate fact ids are not allowed in deletes",
                ));
            }
            if upsert_ids.contains(id) {
                return Err(Error::invalid(
                    "change_set",
                    format!("Fact '{id}' cannot be upserted and deleted together"),
                ));
            }
            let path = udir.fact(agent, id);
            let Some(existing) = markdown::load_optional(&path, expected_scope, now)? else {
                continue;
            };
            if let Some(expected) = req.delete_revisions.as_ref().and_then(|r| r.get(id))
                && *expected != existing.fact.revision
            {
                return Err(Error::FactConflict {
                    id: id.to_string(),
                    message: format!(
                        "Expected fact '{id}' revision {expected}, found {}",
                        existing.fact.revision
                    ),
                });
            }
            removals.push((id.clone(), path));
        }
    }

    // 6. Summaries: shallow per-child merge.
    let (base_user, base_hist) = match &current {
        Some(m) => (m.user()?, m.history()?),
        None => (
            SummarySection::default_user(),
            SummarySection::default_history(),
        ),
    };
    // Without a patch the sections stay borrowed (no copy, no comparison).
    let (user_patch, hist_patch) = match &req.summaries {
        Some((u, h)) => (u.as_ref(), h.as_ref()),
        None => (None, None),
    };
    let merged = |base: &Map<String, Value>, patch: Option<&Map<String, Value>>| {
        patch.map(|p| {
            let mut out = base.clone();
            for (k, v) in p {
                out.insert(k.clone(), v.clone());
            }
            out
        })
    };
    let user_new = merged(&base_user.0, user_patch);
    let hist_new = merged(&base_hist.0, hist_patch);
    let differs = |new: &Option<Map<String, Value>>, base: &Map<String, Value>| {
        new.as_ref().is_some_and(|n| {
            n.len() != base.len()
                || !n
                    .iter()
                    .all(|(k, v)| base.get(k).is_some_and(|w| py::py_eq(v, w)))
        })
    };
    let summaries_changed = differs(&user_new, &base_user.0) || differs(&hist_new, &base_hist.0);
    let user_sec = user_new.as_ref().unwrap_or(&base_user.0);
    let hist_sec = hist_new.as_ref().unwrap_or(&base_hist.0);

    // 7. No-op exit.
    let needs_cleanup = current.as_ref().is_none_or(Manifest::needs_migration);
    if prepared.is_empty() && removals.is_empty() && !summaries_changed && !needs_cleanup {
        let (version, last_updated) = current
            .as_ref()
            .map_or((String::new(), String::new()), |m| {
                (m.version(), m.last_updated())
            });
        return Ok(Committed {
            version,
            revision: current_rev,
            last_updated,
            written: Vec::new(),
            deleted: Vec::new(),
            notifications: Vec::new(),
            wrote: false,
        });
    }

    // 8. The journal.
    let next = current_rev + 1;
    let op = uuid::Uuid::new_v4().simple().to_string();
    let agent_dir_name = agent.as_ref().map(|a| a.as_str().to_owned());
    let mut old_entries: Vec<(String, String)> = Vec::new();
    if let Some(agent) = &agent {
        for p in prepared.iter().filter(|p| p.existed) {
            old_entries.push((p.fact.id.to_string(), udir.fact_rel(agent, &p.fact.id)));
        }
        for (id, _) in &removals {
            old_entries.push((id.to_string(), udir.fact_rel(agent, id)));
        }
    }
    let fact_ids: Vec<String> = prepared
        .iter()
        .map(|p| p.fact.id.to_string())
        .chain(removals.iter().map(|(id, _)| id.to_string()))
        .collect();
    let journal = Journal {
        operation_id: op.clone(),
        state: PREPARED,
        agent_name: agent_dir_name,
        expected_revision: current_rev,
        next_revision: next,
        fact_ids,
        old_entries,
    };

    // 9. Durable pre-images, then the prepared journal. A commit that only creates facts and
    // leaves the summaries alone needs none: rolling it back unlinks the new facts, and its
    // manifest differs from the current one only in `revision` and `lastUpdated`, so recovery
    // rolls such a commit forward once the manifest holds `nextRevision` (every fact write
    // precedes it) and otherwise leaves the manifest alone, as the reference's recovery does
    // without a manifest pre-image. No `.recovery/<op>` is created for it (the reference's
    // recovery skips a missing one): two directory fsyncs, a mkdir and an rmdir less.
    let manifest_path = udir.manifest();
    let manifest_changes =
        summaries_changed || current.as_ref().is_some_and(Manifest::needs_migration);
    let has_fact_preimages = prepared.iter().any(|p| p.existed) || !removals.is_empty();
    let op_dir = (has_fact_preimages || (current.is_some() && manifest_changes))
        .then(|| udir.recovery_root().join(&op));
    if let Some(op_dir) = &op_dir {
        fsutil::create_dir_all(op_dir)?;
        if current.is_some() {
            fsutil::preserve_preimage(&manifest_path, &op_dir.join(RECOVERY_MANIFEST))?;
        }
        for p in prepared.iter().filter(|p| p.existed) {
            fsutil::preserve_preimage(&p.path, &op_dir.join(format!("{}.md", p.fact.id)))?;
        }
        for (id, path) in &removals {
            fsutil::preserve_preimage(path, &op_dir.join(format!("{id}.md")))?;
        }
        fsutil::fsync_dir(op_dir)?;
        fsutil::fsync_dir(&udir.recovery_root())?;
    }
    fault::point("after-preimages");
    // One handle on the user directory for its three fsyncs (journal, manifest, commit point).
    let udir_file = fsutil::open_dir(&udir.dir)?;
    journal.write(udir, &udir_file)?;
    fault::point("after-prepared");

    // 10. Fact writes: one atomic replace, or for several facts every temporary file made
    // durable together, then the renames; their directories are fsynced with the unlinks'
    // below. Nothing orders one fact's durability before another's, only all of them before the
    // manifest, so the fsyncs are issued together and share the disk's cache flushes.
    let mut notifications = Vec::new();
    let mut written = Vec::new();
    let mut touched_dirs: BTreeSet<PathBuf> = BTreeSet::new();
    if let [single] = prepared.as_slice() {
        fsutil::atomic_write(&single.path, single.rendered.as_bytes())?;
        fault::point("after-fact-1");
    } else if !prepared.is_empty() {
        let items: Vec<(&std::path::Path, &[u8])> = prepared
            .iter()
            .map(|p| (p.path.as_path(), p.rendered.as_bytes()))
            .collect();
        let temps = fsutil::write_temps(&items)?;
        let mut renamed = 0;
        let result = temps.iter().try_for_each(|(tmp, target)| {
            fault::point("atomic-before-rename");
            fault::io(crate::fault::IoOp::Rename, target)
                .and_then(|()| std::fs::rename(tmp, target))
                .map_err(|e| Error::io("Failed to replace", target, e))?;
            renamed += 1;
            fault::point(&format!("after-fact-{renamed}"));
            if let Some(d) = target.parent() {
                touched_dirs.insert(d.to_path_buf());
            }
            Ok::<(), Error>(())
        });
        if let Err(e) = result {
            for (tmp, _) in temps.iter().skip(renamed) {
                let _ = std::fs::remove_file(tmp);
            }
            return Err(e);
        }
    }
    for p in prepared {
        notifications.push(Notification::Upsert {
            scope: note_scope.clone(),
            fact: Box::new(p.fact.clone()),
        });
        written.push(p.fact);
    }
    // 11. Unlinks.
    let mut deleted = Vec::new();
    for (i, (id, path)) in removals.into_iter().enumerate() {
        fsutil::remove_file_if_exists(&path)?;
        if let Some(d) = path.parent() {
            touched_dirs.insert(d.to_path_buf());
        }
        fault::point(&format!("after-delete-{}", i + 1));
        notifications.push(Notification::Remove {
            scope: note_scope.clone(),
            id: id.to_string(),
        });
        deleted.push(id);
    }
    let touched_dirs: Vec<PathBuf> = touched_dirs.into_iter().collect();
    fsutil::fsync_dirs(&touched_dirs)?;
    // 12. Manifest.
    let last_updated = now.to_iso_z();
    let text = manifest::render(next, &last_updated, user_sec, hist_sec);
    fsutil::atomic_write_in(&udir_file, &udir.dir, &manifest_path, text.as_bytes())?;
    fault::point("after-manifest");
    // 13. The commit point: with the manifest durable, the journal goes and its unlink is made
    // durable. A crash before this rolls the operation back; after it, nothing is undone.
    // (The reference rewrites the journal as `committed` first, one more file, fsync and
    // rename for the same guarantee; recovery still understands such journals.)
    // The journal's inode goes back to the spare name for the next commit (an unlink for
    // every reader: `fsutil::retire_recycled`).
    fsutil::retire_recycled(&udir.journal(), &udir.journal_spare())?;
    fsutil::sync_dir_file(&udir_file, &udir.dir)?;
    fault::point("after-committed");
    // 14. Cleanup: a crash here leaves a recovery directory without a journal, which the next
    // recovery sweeps.
    if let Some(op_dir) = &op_dir {
        let _ = std::fs::remove_dir_all(op_dir);
    }
    fault::point("after-cleanup");
    Ok(Committed {
        version: deermem_core::document::DOCUMENT_VERSION.to_owned(),
        revision: next,
        last_updated,
        written,
        deleted,
        notifications,
        wrote: true,
    })
}
