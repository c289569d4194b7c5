//! `fsync_floor`: the durable file operations of one single-fact create in the storage's
//! commit protocol, performed on raw files with no parsing, locking or rendering: the physical
//! floor `write_fact` is judged against.
//!
//! Per create into a scope whose manifest exists (counted from
//! `deermem-storage-file/src/commit.rs` and `fsutil.rs`; a create-only commit needs no
//! pre-image, so no `.recovery/<op>`):
//! 1. the prepared journal: temp file, write, fsync, rename, fsync of the user directory;
//! 2. the fact file: the same atomic replace into its shard directory;
//! 3. the manifest: the same atomic replace;
//! 4. the commit point: unlink the journal, fsync of the user directory.
//!
//! That is 3 file fsyncs and 4 directory fsyncs, 3 renames, 3 new inodes.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use deermem_core::FactId;

use super::Env;
use crate::stats::{Recorder, WorkloadResult};

/// File fsyncs per create.
pub(crate) const FILE_FSYNCS: usize = 3;
/// Directory fsyncs per create.
pub(crate) const DIR_FSYNCS: usize = 4;

fn fsync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|f| f.sync_all())
        .with_context(|| format!("fsync {}", dir.display()))
}

fn atomic_write(path: &Path, bytes: &[u8], n: usize) -> Result<()> {
    let dir = path.parent().context("no parent")?;
    fs::create_dir_all(dir)?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("x");
    let tmp = dir.join(format!(".{name}.{n:032x}.tmp"));
    let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    fs::rename(&tmp, path)?;
    fsync_dir(dir)
}

/// Bytes of the size the storage writes: a manifest with the default summaries (~600 B), a
/// fact file (~450 B), a journal (~250 B).
fn filler(len: usize, tag: &str) -> Vec<u8> {
    let mut s = String::with_capacity(len);
    while s.len() < len {
        s.push_str(tag);
        s.push(' ');
    }
    s.truncate(len);
    s.into_bytes()
}

/// Sets ext4's `FS_TOPDIR_FL` on `dir` where the filesystem has it, as the storage does on a
/// new root's `users/`, so parallel floors get the same block-group placement.
pub(crate) fn mark_top_directory(dir: &Path) {
    #[cfg(target_os = "linux")]
    if let Ok(f) = File::open(dir)
        && let Ok(flags) = rustix::fs::ioctl_getflags(&f)
    {
        let _ = rustix::fs::ioctl_setflags(&f, flags | rustix::fs::IFlags::TOPDIR);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = dir;
}

/// The raw-file state of the floor: one user directory with a manifest.
pub(crate) struct Floor {
    udir: PathBuf,
    facts: PathBuf,
    manifest: PathBuf,
    journal: PathBuf,
    fact_bytes: Vec<u8>,
    manifest_bytes: Vec<u8>,
    journal_bytes: Vec<u8>,
    next: usize,
}

impl Floor {
    /// A floor user directory under `base` (created), with its manifest written.
    pub(crate) fn new(base: &Path) -> Result<Self> {
        let udir = base.join("users").join("bench");
        let facts = udir.join("agents").join("__default__").join("facts");
        fs::create_dir_all(&facts)?;
        let floor = Self {
            manifest: udir.join("memory.json"),
            journal: udir.join(".memory.journal.json"),
            udir,
            facts,
            fact_bytes: filler(450, "fact"),
            manifest_bytes: filler(620, "manifest"),
            journal_bytes: filler(250, "journal"),
            next: 0,
        };
        atomic_write(&floor.manifest, &floor.manifest_bytes, 0)?;
        Ok(floor)
    }

    /// The durable operations of one single-fact create; returns their duration.
    pub(crate) fn create(&mut self) -> Result<Duration> {
        let i = self.next;
        self.next += 1;
        let id = FactId::new(format!("fact_{i:032x}")).context("fact id")?;
        let fact_path = self.facts.join(id.shard()).join(format!("{id}.md"));
        let t = Instant::now();
        atomic_write(&self.journal, &self.journal_bytes, 3 * i + 1)?;
        atomic_write(&fact_path, &self.fact_bytes, 3 * i + 2)?;
        atomic_write(&self.manifest, &self.manifest_bytes, 3 * i + 3)?;
        fs::remove_file(&self.journal)?;
        fsync_dir(&self.udir)?;
        Ok(t.elapsed())
    }
}

pub(crate) fn run(env: &Env) -> Result<WorkloadResult> {
    let mut floor = Floor::new(&env.root)?;
    let n = env.sizes.fsync_floor;
    let mut rec = Recorder::start(n);
    for _ in 0..n {
        rec.push(floor.create()?);
    }
    Ok(rec
        .finish(n, std::time::Duration::ZERO)
        .with("file_fsyncs_per_op", FILE_FSYNCS.into())
        .with("dir_fsyncs_per_op", DIR_FSYNCS.into()))
}
