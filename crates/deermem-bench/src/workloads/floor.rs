//! `fsync_floor`: the durable file operations of one single-fact create in the storage's
//! commit protocol, performed on raw files with no parsing, locking or rendering: the physical
//! floor `write_fact` is judged against.
//!
//! Per create into a scope whose manifest exists (counted from
//! `deermem-storage-file/src/commit/execute.rs` and `fsutil.rs`; a create-only commit needs
//! no pre-image, so no `.recovery/<op>`):
//! 1. the prepared journal, written into the recycled spare inode: write at offset 0, set the
//!    length, `fdatasync`, rename onto the journal name, fsync of the user directory;
//! 2. the fact file: temp file, write, fsync, rename, fsync of its shard directory;
//! 3. the manifest: the same atomic replace in the user directory;
//! 4. the commit point: rename the journal back to the spare name, fsync of the user
//!    directory.
//!
//! That is 3 file fsyncs (one of them `fdatasync`) and 4 directory fsyncs, 4 renames, 2 new
//! inodes and 1 freed (the replaced manifest). The user directory is opened once per create,
//! as the storage does.

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

fn write_temp(path: &Path, bytes: &[u8], n: usize) -> Result<PathBuf> {
    let dir = path.parent().context("no parent")?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("x");
    let tmp = dir.join(format!(".{name}.{n:032x}.tmp"));
    let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    Ok(tmp)
}

fn atomic_write(path: &Path, bytes: &[u8], n: usize) -> Result<()> {
    let dir = path.parent().context("no parent")?;
    fs::create_dir_all(dir)?;
    let tmp = write_temp(path, bytes, n)?;
    fs::rename(&tmp, path)?;
    fsync_dir(dir)
}

/// The journal write into the spare inode (`fsutil::write_recycled`).
fn write_recycled(dir: &File, path: &Path, spare: &Path, bytes: &[u8]) -> Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileExt;
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(spare)?;
        let _ = f.metadata()?;
        f.write_all_at(bytes, 0)?;
        f.set_len(bytes.len() as u64)?;
        f.sync_data()?;
    }
    #[cfg(not(unix))]
    fs::write(spare, bytes).and_then(|()| File::open(spare)?.sync_all())?;
    fs::rename(spare, path)?;
    Ok(dir.sync_all()?)
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
    spare: PathBuf,
    fact_bytes: Vec<u8>,
    manifest_bytes: Vec<u8>,
    journal_bytes: Vec<u8>,
    next: usize,
}

impl Floor {
    /// A floor user directory under `base` (created), with its manifest written.
    pub(crate) fn new(base: &Path) -> Result<Self> {
        // As the storage does for a new root's `users/`: the floor's user tree gets a block
        // group of its own, so its inode allocations do not scan past inodes freed by earlier
        // workloads in the temporary directory's group.
        let users = base.join("users");
        let fresh = !users.exists();
        fs::create_dir_all(&users)?;
        if fresh {
            mark_top_directory(&users);
        }
        let udir = users.join("bench");
        let facts = udir.join("agents").join("__default__").join("facts");
        fs::create_dir_all(&facts)?;
        let floor = Self {
            manifest: udir.join("memory.json"),
            journal: udir.join(".memory.journal.json"),
            spare: udir.join(".memory.journal.spare"),
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
        let dir = File::open(&self.udir)?;
        write_recycled(&dir, &self.journal, &self.spare, &self.journal_bytes)?;
        atomic_write(&fact_path, &self.fact_bytes, 3 * i + 2)?;
        let tmp = write_temp(&self.manifest, &self.manifest_bytes, 3 * i + 3)?;
        fs::rename(&tmp, &self.manifest)?;
        dir.sync_all()?;
        fs::rename(&self.journal, &self.spare)?;
        dir.sync_all()?;
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
