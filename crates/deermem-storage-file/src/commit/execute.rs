//! Carries out a commit's plan in the reference's order: durable pre-images (hard links where
//! the filesystem allows), the prepared journal (written into a recycled inode), fact writes
//! and unlinks, the manifest, then the commit point: the journal is taken away (renamed back to
//! its spare name) and the user directory fsynced (instead of the reference's rewrite to
//! `committed`; see `docs/compat.md`), and the pre-images are removed.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::Committed;
use super::plan::WritePlan;
use crate::error::{Error, Result};
use crate::fault;
use crate::fsutil;
use crate::paths::UserDir;

/// Executes a write plan; the caller holds both locks.
///
/// # Errors
/// `Io`: what was done before the commit point is rolled back by the next recovery.
pub(super) fn execute(udir: &UserDir, plan: WritePlan) -> Result<Committed> {
    if let Some(pre) = &plan.preimages {
        fsutil::create_dir_all(&pre.dir)?;
        for (source, copy) in &pre.files {
            fsutil::preserve_preimage(source, copy)?;
        }
        fsutil::fsync_dir(&pre.dir)?;
        fsutil::fsync_dir(&udir.recovery_root())?;
    }
    fault::point("after-preimages");
    // One handle on the user directory for its three fsyncs (journal, manifest, commit point).
    let udir_file = fsutil::open_dir(&udir.dir)?;
    plan.journal.write(udir, &udir_file)?;
    fault::point("after-prepared");

    // Fact writes: one atomic replace, or for several facts every temporary file made durable
    // together, then the renames; their directories are fsynced with the unlinks' below.
    // Nothing orders one fact's durability before another's, only all of them before the
    // manifest, so the fsyncs are issued together and share the disk's cache flushes.
    let mut touched_dirs: BTreeSet<PathBuf> = BTreeSet::new();
    if let [single] = plan.writes.as_slice() {
        fsutil::atomic_write(&single.path, single.rendered.as_bytes())?;
        fault::point("after-fact-1");
    } else if !plan.writes.is_empty() {
        let items: Vec<(&Path, &[u8])> = plan
            .writes
            .iter()
            .map(|w| (w.path.as_path(), w.rendered.as_bytes()))
            .collect();
        let temps = fsutil::write_temps(&items)?;
        let mut renamed = 0;
        let result = temps.iter().try_for_each(|(tmp, target)| {
            fault::point("atomic-before-rename");
            fault::io(fault::IoOp::Rename, target)
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
    for (i, removal) in plan.removals.iter().enumerate() {
        fsutil::remove_file_if_exists(&removal.path)?;
        if let Some(d) = removal.path.parent() {
            touched_dirs.insert(d.to_path_buf());
        }
        fault::point(&format!("after-delete-{}", i + 1));
    }
    let touched_dirs: Vec<PathBuf> = touched_dirs.into_iter().collect();
    fsutil::each_in_parallel(&touched_dirs, |d| fsutil::fsync_dir(d))?;
    fsutil::atomic_write_in(
        &udir_file,
        &udir.dir,
        &udir.manifest(),
        plan.manifest.as_bytes(),
    )?;
    fault::point("after-manifest");
    // The commit point: with the manifest durable, the journal goes and its unlink is made
    // durable. A crash before this rolls the operation back; after it, nothing is undone.
    // (The reference rewrites the journal as `committed` first, one more file, fsync and
    // rename for the same guarantee; recovery still understands such journals.)
    // The journal's inode goes back to the spare name for the next commit (an unlink for
    // every reader: `fsutil::retire_recycled`).
    fsutil::retire_recycled(&udir.journal(), &udir.journal_spare())?;
    fsutil::sync_dir_file(&udir_file, &udir.dir)?;
    fault::point("after-committed");
    // Cleanup: a crash here leaves a recovery directory without a journal, which the next
    // recovery sweeps.
    if let Some(pre) = &plan.preimages {
        let _ = std::fs::remove_dir_all(&pre.dir);
    }
    fault::point("after-cleanup");
    Ok(plan.into_committed())
}
