//! Durable file primitives: atomic replace through a same-directory temporary file with fsync of
//! the file and of its directory, durable copies for pre-images, and the recognition of our own
//! orphaned temporary files.

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::fault::{self, IoOp};

/// The temporary file used to replace `path`: `.{name}.{32 hex}.tmp` in the same directory.
fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let hex = uuid::Uuid::new_v4().simple().to_string();
    path.with_file_name(format!(".{name}.{hex}.tmp"))
}

/// Whether a file name is one of our (or the reference's) atomic-write temporaries.
pub(crate) fn is_atomic_temp(name: &str) -> bool {
    let Some(rest) = name.strip_prefix('.') else {
        return false;
    };
    let Some(rest) = rest.strip_suffix(".tmp") else {
        return false;
    };
    let Some((stem, hex)) = rest.rsplit_once('.') else {
        return false;
    };
    !stem.is_empty()
        && hex.len() == 32
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// fsyncs a directory so a rename or unlink inside it is durable.
pub(crate) fn fsync_dir(dir: &Path) -> Result<()> {
    sync_dir_file(&open_dir(dir)?, dir)
}

/// Marks a directory we just created as the top of separate directory trees (ext4's
/// `FS_TOPDIR_FL`, what `chattr +T` sets), so the filesystem spreads its subdirectories, one per
/// user, over its block groups instead of packing them next to it: each user's files then stay
/// together, and on ext4 without a journal one user's deleted files no longer lengthen the
/// free-inode scan of another user's writes (measured with 8 concurrent writers: about +30%
/// creates/s). A hint only: filesystems without the flag refuse it and nothing changes.
pub(crate) fn mark_top_directory(dir: &Path) {
    #[cfg(target_os = "linux")]
    {
        let set = File::open(dir).and_then(|f| {
            let flags = rustix::fs::ioctl_getflags(&f)?;
            if !flags.contains(rustix::fs::IFlags::TOPDIR) {
                rustix::fs::ioctl_setflags(&f, flags | rustix::fs::IFlags::TOPDIR)?;
            }
            Ok(())
        });
        if let Err(e) = set {
            tracing::debug!(dir = %dir.display(), error = %e, "directory not marked as a top directory");
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = dir;
}

/// Creates a directory and its parents.
pub(crate) fn create_dir_all(dir: &Path) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    fault::io(IoOp::Create, dir)
        .and_then(|()| fs::create_dir_all(dir))
        .map_err(|e| Error::io("Failed to create directory", dir, e))
}

/// Atomically replaces `path` with `bytes`: parents are created, the bytes go to a temporary
/// file in the same directory which is fsynced and renamed onto the target, then the directory
/// is fsynced. The temporary file is removed on failure.
pub(crate) fn atomic_write(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| Error::Corrupt(format!("{} has no parent directory", path.display())))?;
    create_dir_all(dir)?;
    atomic_write_in(&open_dir(dir)?, dir, path, bytes)
}

/// Most threads [`each_in_parallel`] runs at once.
const PARALLEL_SYNCS: usize = 16;

/// Runs `f` on every item, each on its own thread (at most [`PARALLEL_SYNCS`] at a time), and
/// returns the first error. For `fsync`s with no order among them: issued together, the block
/// layer serves them with shared cache flushes instead of one flush after another. A single
/// item runs on the calling thread.
pub(crate) fn each_in_parallel<T: Sync>(
    items: &[T],
    f: impl Fn(&T) -> Result<()> + Sync,
) -> Result<()> {
    if items.len() <= 1 {
        return items.iter().try_for_each(&f);
    }
    for wave in items.chunks(PARALLEL_SYNCS) {
        let results: Vec<Result<()>> = std::thread::scope(|scope| {
            let f = &f;
            let handles: Vec<_> = wave
                .iter()
                .map(|item| {
                    std::thread::Builder::new()
                        .name("deermem-sync".into())
                        .spawn_scoped(scope, move || f(item))
                })
                .collect();
            handles
                .into_iter()
                .zip(wave)
                .map(|(h, item)| match h {
                    Ok(h) => h
                        .join()
                        .unwrap_or_else(|payload| std::panic::resume_unwind(payload)),
                    // No thread to be had: do it here.
                    Err(_) => f(item),
                })
                .collect()
        });
        results.into_iter().collect::<Result<Vec<()>>>()?;
    }
    Ok(())
}

/// Writes each `(target, bytes)` to a new temporary file beside its target (parents created)
/// and makes all of them durable together ([`each_in_parallel`]); returns `(temporary,
/// target)` pairs for the caller to rename. Every temporary is removed on failure.
pub(crate) fn write_temps(items: &[(&Path, &[u8])]) -> Result<Vec<(PathBuf, PathBuf)>> {
    let mut made: Vec<(PathBuf, PathBuf, File)> = Vec::with_capacity(items.len());
    let result = (|| {
        for (path, bytes) in items {
            let dir = path.parent().ok_or_else(|| {
                Error::Corrupt(format!("{} has no parent directory", path.display()))
            })?;
            create_dir_all(dir)?;
            let tmp = temp_path(path);
            let f = create_temp(&tmp)?;
            // Recorded before the write, so a failed write removes it too.
            made.push((tmp, path.to_path_buf(), f));
            if let Some((tmp, _, f)) = made.last_mut() {
                fault::io(IoOp::Write, tmp)
                    .and_then(|()| f.write_all(bytes))
                    .map_err(|e| Error::io("Failed to write", tmp, e))?;
            }
        }
        each_in_parallel(&made, |(tmp, _, f)| {
            fault::io(IoOp::Fsync, tmp)
                .and_then(|()| f.sync_all())
                .map_err(|e| Error::io("Failed to fsync", tmp, e))
        })
    })();
    match result {
        Ok(()) => Ok(made
            .into_iter()
            .map(|(tmp, target, _)| (tmp, target))
            .collect()),
        Err(e) => {
            for (tmp, _, _) in &made {
                let _ = fs::remove_file(tmp);
            }
            Err(e)
        }
    }
}

/// Atomically replaces `path` (a file directly in `dir`, which exists and is open as `dir_file`)
/// like [`atomic_write`], without the `stat` of the directory and with the caller's handle for
/// the directory fsync.
pub(crate) fn atomic_write_in(
    dir_file: &File,
    dir: &Path,
    path: &Path,
    bytes: &[u8],
) -> Result<()> {
    let tmp = temp_path(path);
    let result = (|| {
        write_and_sync(&mut create_temp(&tmp)?, &tmp, bytes)?;
        fault::point("atomic-before-rename");
        fault::io(IoOp::Rename, path)
            .and_then(|()| fs::rename(&tmp, path))
            .map_err(|e| Error::io("Failed to replace", path, e))?;
        sync_dir_file(dir_file, dir)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Creates the temporary file `tmp`, which must not exist.
fn create_temp(tmp: &Path) -> Result<File> {
    fault::io(IoOp::Create, tmp)
        .and_then(|()| OpenOptions::new().write(true).create_new(true).open(tmp))
        .map_err(|e| Error::io("Failed to create temporary file", tmp, e))
}

/// Writes `bytes` to the open file `f` (at `path`) and fsyncs it.
fn write_and_sync(f: &mut File, path: &Path, bytes: &[u8]) -> Result<()> {
    fault::io(IoOp::Write, path)
        .and_then(|()| f.write_all(bytes))
        .map_err(|e| Error::io("Failed to write", path, e))?;
    fault::io(IoOp::Fsync, path)
        .and_then(|()| f.sync_all())
        .map_err(|e| Error::io("Failed to fsync", path, e))
}

/// fsyncs an open directory.
pub(crate) fn sync_dir_file(dir_file: &File, dir: &Path) -> Result<()> {
    fault::io(IoOp::Fsync, dir)
        .and_then(|()| dir_file.sync_all())
        .map_err(|e| Error::io("Failed to fsync directory", dir, e))
}

/// Opens a directory for [`sync_dir_file`] and [`atomic_write_in`].
pub(crate) fn open_dir(dir: &Path) -> Result<File> {
    File::open(dir).map_err(|e| Error::io("Failed to open directory", dir, e))
}

/// Writes a file that appears and disappears with every commit (the journal) by recycling one
/// inode instead of allocating and freeing one per commit: `bytes` are written over the spare
/// file `spare` (our own name beside `path`, created on first use), made durable with
/// `fdatasync`, and the spare is renamed to `path`, whose directory (`dir_file`) is fsynced.
/// [`retire_recycled`] renames it back at the end of the commit. Readers see exactly what
/// [`atomic_write_in`] gives them (`path` appears complete and durable by a rename); the spare
/// itself is never read, so a crash while it is being rewritten leaves only garbage in it.
///
/// Why: on ext4 without a journal every new inode is found by scanning past the inodes freed in
/// the last minute, and every freed block is a discard under `discard`; a journal per commit
/// was a third of the inodes a create allocated and half of those it freed. Falls back to
/// [`atomic_write_in`] where the spare is not a plain, singly linked file of ours (a symbolic
/// link, a directory, a hard link somebody made) or the platform has no positional writes.
pub(crate) fn write_recycled(
    dir_file: &File,
    dir: &Path,
    path: &Path,
    spare: &Path,
    bytes: &[u8],
) -> Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
        fault::io(IoOp::Create, spare).map_err(|e| Error::io("Failed to create", spare, e))?;
        let opened = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(spare);
        let f = match opened {
            Ok(f) => match f.metadata() {
                Ok(m) if m.is_file() && m.nlink() == 1 => Some(f),
                _ => None,
            },
            // A symbolic link (`ELOOP`) or a directory in the spare's place.
            Err(e)
                if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error())
                    || e.kind() == ErrorKind::IsADirectory =>
            {
                None
            }
            Err(e) => return Err(Error::io("Failed to create", spare, e)),
        };
        let Some(f) = f else {
            tracing::debug!(spare = %spare.display(), "spare file unusable; writing a new file");
            return atomic_write_in(dir_file, dir, path, bytes);
        };
        fault::io(IoOp::Write, spare)
            .and_then(|()| f.write_all_at(bytes, 0))
            .and_then(|()| f.set_len(bytes.len() as u64))
            .map_err(|e| Error::io("Failed to write", spare, e))?;
        fault::io(IoOp::Fsync, spare)
            .and_then(|()| f.sync_data())
            .map_err(|e| Error::io("Failed to fsync", spare, e))?;
        drop(f);
        fault::point("atomic-before-rename");
        fault::io(IoOp::Rename, path)
            .and_then(|()| fs::rename(spare, path))
            .map_err(|e| Error::io("Failed to replace", path, e))?;
        sync_dir_file(dir_file, dir)
    }
    #[cfg(not(unix))]
    {
        let _ = spare;
        atomic_write_in(dir_file, dir, path, bytes)
    }
}

/// Takes away a file written by [`write_recycled`] by renaming it back to `spare` (for the next
/// commit to reuse) where [`remove_file_if_exists`] would unlink it: either way `path` is gone,
/// durably once the caller fsyncs the directory. `false` when `path` did not exist.
pub(crate) fn retire_recycled(path: &Path, spare: &Path) -> Result<bool> {
    match fault::io(IoOp::Remove, path).and_then(|()| fs::rename(path, spare)) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
        // The spare's name is taken by a directory, which a rename cannot replace: unlink.
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::IsADirectory | ErrorKind::DirectoryNotEmpty
            ) =>
        {
            remove_file_if_exists(path)
        }
        Err(e) => Err(Error::io("Failed to remove", path, e)),
    }
}

/// Removes orphaned atomic-write temporaries of `path` (`.{name}.{32 hex}.tmp` beside it), left
/// by a process that died mid-write before any journal existed. Only safe under the lock that
/// guards `path`. Best effort: failures are logged.
pub(crate) fn remove_orphaned_temps_of(path: &Path) {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return;
    };
    let prefix = format!(".{}.", name.to_string_lossy());
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let file_name = e.file_name();
        let Some(n) = file_name.to_str() else {
            continue;
        };
        if n.starts_with(&prefix) && is_atomic_temp(n) && e.file_type().is_ok_and(|t| t.is_file()) {
            let p = e.path();
            match fs::remove_file(&p) {
                Ok(()) => tracing::info!(path = %p.display(), "removed orphaned temporary file"),
                Err(err) => {
                    tracing::warn!(path = %p.display(), error = %err, "could not remove orphaned temporary file")
                }
            }
        }
    }
}

/// Copies `src` to `dst` durably (the bytes are fsynced; the caller fsyncs the directory).
/// Used for recovery pre-images, which the reference copied without fsync.
pub(crate) fn durable_copy(src: &Path, dst: &Path) -> Result<()> {
    let bytes = fs::read(src).map_err(|e| Error::io("Failed to read", src, e))?;
    let mut f = fault::io(IoOp::Create, dst)
        .and_then(|()| {
            OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(dst)
        })
        .map_err(|e| Error::io("Failed to create", dst, e))?;
    write_and_sync(&mut f, dst, &bytes)
}

/// Keeps the current bytes of `src` at `dst` as a commit pre-image.
///
/// A hard link when the filesystem allows it: every writer of a memory file (this storage and
/// the reference) replaces it by renaming a new file over it, or unlinks it, so the linked inode
/// keeps the old bytes without a copy, a new inode or a file fsync (the bytes were made durable
/// when the file was written; the caller fsyncs `dst`'s directory). Where links are refused
/// (some network or FUSE filesystems), a durable copy as before.
pub(crate) fn preserve_preimage(src: &Path, dst: &Path) -> Result<()> {
    // A symbolic link would be linked itself (and a relative one would dangle from
    // `.recovery/<op>/`): keep a copy of what it points to, as before.
    if fs::symlink_metadata(src).is_ok_and(|m| m.file_type().is_symlink()) {
        return durable_copy(src, dst);
    }
    fault::io(IoOp::Create, dst).map_err(|e| Error::io("Failed to create", dst, e))?;
    match fs::hard_link(src, dst) {
        Ok(()) => Ok(()),
        // Errors a copy would meet too.
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::NotFound
                    | ErrorKind::AlreadyExists
                    | ErrorKind::StorageFull
                    | ErrorKind::ReadOnlyFilesystem
            ) =>
        {
            Err(Error::io("Failed to create", dst, e))
        }
        Err(e) => {
            tracing::debug!(src = %src.display(), error = %e,
                "hard link refused; copying the pre-image");
            durable_copy(src, dst)
        }
    }
}

/// Reads a file, or `None` when it does not exist.
pub(crate) fn read_optional(path: &Path) -> std::io::Result<Option<Vec<u8>>> {
    match fs::read(path) {
        Ok(b) => Ok(Some(b)),
        // A parent that is a file: the path cannot exist (Python's `exists()` says False too);
        // writing there fails later with the I/O error that says so.
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Unlinks a file; a missing file is fine.
pub(crate) fn remove_file_if_exists(path: &Path) -> Result<bool> {
    match fault::io(IoOp::Remove, path).and_then(|()| fs::remove_file(path)) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Error::io("Failed to remove", path, e)),
    }
}

/// The entries of a directory (empty when it does not exist), sorted by name.
pub(crate) fn sorted_entries(dir: &Path) -> Result<Vec<fs::DirEntry>> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io("Failed to list", dir, e)),
    };
    let mut out = Vec::new();
    for entry in rd {
        out.push(entry.map_err(|e| Error::io("Failed to list", dir, e))?);
    }
    out.sort_by_key(fs::DirEntry::file_name);
    Ok(out)
}

/// Every `*.md` file at any depth below `dir` (the reference loads any Markdown under
/// `facts/`), sorted by path. Symlinked directories are not followed.
///
/// The walk is depth-first over name-sorted entries, which yields the paths already in `Path`
/// order (component by component), so no final sort of the whole list is needed.
pub(crate) fn markdown_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in sorted_entries(dir)? {
        markdown_files_of(&entry, &mut out)?;
    }
    Ok(out)
}

/// The `*.md` files of one entry of a listed directory: the entry itself if it is a Markdown
/// file, or every one at any depth below it if it is a directory, in `Path` order.
/// [`markdown_files`] of a directory is the concatenation of this over its sorted entries.
pub(crate) fn markdown_files_of(entry: &fs::DirEntry, out: &mut Vec<PathBuf>) -> Result<()> {
    let path = entry.path();
    let ft = entry
        .file_type()
        .map_err(|e| Error::io("Failed to stat", &path, e))?;
    markdown_files_below(path, Kind::of(ft), out)
}

/// What a directory entry is, as far as the fact walk cares (symlinks are not followed as
/// directories, but a symlink to a file counts as a file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Dir,
    File,
    /// A symlink or another special file: a Markdown file only if it resolves to one.
    Other,
}

impl Kind {
    /// The kind of a file type read without following a symlink.
    pub(crate) fn of(ft: fs::FileType) -> Kind {
        if ft.is_dir() {
            Kind::Dir
        } else if ft.is_file() {
            Kind::File
        } else {
            Kind::Other
        }
    }
}

/// [`markdown_files_of`] for an entry given by its path and kind.
pub(crate) fn markdown_files_below(
    path: PathBuf,
    kind: Kind,
    out: &mut Vec<PathBuf>,
) -> Result<()> {
    // An explicit stack of the directories being listed (no recursion on deep trees).
    let mut stack: Vec<std::vec::IntoIter<fs::DirEntry>> = Vec::new();
    let mut visit = |path: PathBuf,
                     kind: Kind,
                     stack: &mut Vec<std::vec::IntoIter<fs::DirEntry>>|
     -> Result<()> {
        if kind == Kind::Dir {
            stack.push(sorted_entries(&path)?.into_iter());
        } else if path.extension().is_some_and(|e| e == "md")
            && (kind == Kind::File || path.is_file())
        {
            out.push(path);
        }
        Ok(())
    };
    visit(path, kind, &mut stack)?;
    while let Some(entries) = stack.last_mut() {
        match entries.next() {
            Some(entry) => {
                let path = entry.path();
                let ft = entry
                    .file_type()
                    .map_err(|e| Error::io("Failed to stat", &path, e))?;
                visit(path, Kind::of(ft), &mut stack)?;
            }
            None => {
                stack.pop();
            }
        }
    }
    Ok(())
}

/// Reads a whole file into `buf` (cleared first), reusing its allocation. Unlike
/// `std::fs::read` it does not `stat` the file for a size hint: fact files are small, and the
/// `stat` is a system call per file on every cold load and index rebuild.
pub(crate) fn read_into(path: &Path, buf: &mut Vec<u8>) -> std::io::Result<()> {
    read_file_into(File::open(path)?, buf)
}

/// [`read_into`] of an opened file.
pub(crate) fn read_file_into(mut f: File, buf: &mut Vec<u8>) -> std::io::Result<()> {
    use std::io::Read;
    buf.clear();
    loop {
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(8192);
        }
        let start = buf.len();
        // Zero-fill at most 16 KiB of spare room per read (the buffer may have grown large).
        let window = (buf.capacity() - start).min(16 * 1024);
        buf.resize(start + window, 0);
        match f.read(&mut buf[start..]) {
            Ok(0) => {
                buf.truncate(start);
                return Ok(());
            }
            Ok(n) => buf.truncate(start + n),
            Err(e) if e.kind() == ErrorKind::Interrupted => buf.truncate(start),
            Err(e) => {
                buf.truncate(start);
                return Err(e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_files_are_listed_in_path_order_at_any_depth() {
        let dir = tempfile::tempdir().unwrap();
        for rel in [
            "b/x.md",
            "a-b/y.md",
            "a/z.md",
            "a/sub/w.md",
            "top.md",
            "a/skip.txt",
        ] {
            let p = dir.path().join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(&p, "x").unwrap();
        }
        let got = markdown_files(dir.path()).unwrap();
        let mut want: Vec<PathBuf> = ["b/x.md", "a-b/y.md", "a/z.md", "a/sub/w.md", "top.md"]
            .iter()
            .map(|r| dir.path().join(r))
            .collect();
        want.sort();
        assert_eq!(got, want);
        assert!(
            markdown_files(&dir.path().join("missing"))
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn each_in_parallel_runs_every_item_and_reports_an_error() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let items: Vec<usize> = (0..40).collect();
        let ran = AtomicUsize::new(0);
        each_in_parallel(&items, |_| {
            ran.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })
        .unwrap();
        assert_eq!(ran.load(Ordering::Relaxed), 40);
        let err = each_in_parallel(&items, |i| {
            if *i == 17 {
                Err(Error::Corrupt("item 17".into()))
            } else {
                Ok(())
            }
        })
        .unwrap_err();
        assert!(err.to_string().contains("item 17"));
    }

    #[test]
    fn write_temps_writes_every_file_or_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("x/a.md");
        let b = dir.path().join("y/b.md");
        let temps = write_temps(&[(a.as_path(), b"alpha"), (b.as_path(), b"beta")]).unwrap();
        assert_eq!(temps.len(), 2);
        for (tmp, target) in &temps {
            assert!(is_atomic_temp(tmp.file_name().unwrap().to_str().unwrap()));
            fs::rename(tmp, target).unwrap();
        }
        assert_eq!(fs::read(&a).unwrap(), b"alpha");
        assert_eq!(fs::read(&b).unwrap(), b"beta");
        // The second target's parent is a file: nothing of the first is left behind.
        fs::write(dir.path().join("blocked"), "file").unwrap();
        let c = dir.path().join("z/c.md");
        let d = dir.path().join("blocked/d.md");
        assert!(write_temps(&[(c.as_path(), b"gamma"), (d.as_path(), b"delta")]).is_err());
        let left: Vec<_> = fs::read_dir(dir.path().join("z")).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn read_into_reads_whole_files_of_any_size_and_reuses_the_buffer() {
        let dir = tempfile::tempdir().unwrap();
        let mut buf = b"stale".to_vec();
        for len in [0_usize, 1, 4095, 4096, 8192, 100_000] {
            let p = dir.path().join(format!("f{len}"));
            let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            fs::write(&p, &bytes).unwrap();
            read_into(&p, &mut buf).unwrap();
            assert_eq!(buf, bytes, "{len}");
        }
        let missing = read_into(&dir.path().join("missing"), &mut buf).unwrap_err();
        assert_eq!(missing.kind(), ErrorKind::NotFound);
    }

    #[test]
    fn preimages_keep_the_old_bytes_when_the_file_is_replaced_or_unlinked() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("memory.json");
        let fact = tmp.path().join("f1.md");
        atomic_write(&src, b"old manifest").unwrap();
        atomic_write(&fact, b"old fact").unwrap();
        let op = tmp.path().join(".recovery/op");
        create_dir_all(&op).unwrap();
        preserve_preimage(&src, &op.join("memory.json")).unwrap();
        preserve_preimage(&fact, &op.join("f1.md")).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            let (a, b) = (
                fs::metadata(&src).unwrap(),
                fs::metadata(op.join("memory.json")).unwrap(),
            );
            assert_eq!((a.dev(), a.ino()), (b.dev(), b.ino()), "a link, not a copy");
        }
        atomic_write(&src, b"new manifest").unwrap();
        fs::remove_file(&fact).unwrap();
        assert_eq!(fs::read(&src).unwrap(), b"new manifest");
        assert_eq!(fs::read(op.join("memory.json")).unwrap(), b"old manifest");
        assert_eq!(fs::read(op.join("f1.md")).unwrap(), b"old fact");
        // A symbolic link (here relative) is copied through, not linked.
        #[cfg(unix)]
        {
            fs::write(tmp.path().join("real.md"), b"through the link").unwrap();
            let link = tmp.path().join("f2.md");
            std::os::unix::fs::symlink("real.md", &link).unwrap();
            preserve_preimage(&link, &op.join("f2.md")).unwrap();
            let m = fs::symlink_metadata(op.join("f2.md")).unwrap();
            assert!(m.file_type().is_file());
            assert_eq!(fs::read(op.join("f2.md")).unwrap(), b"through the link");
        }
        // A missing source and an existing target are errors, as for a copy.
        let err = preserve_preimage(&fact, &op.join("gone.md")).unwrap_err();
        assert!(err.to_string().contains("gone.md"), "{err}");
        let err = preserve_preimage(&src, &op.join("memory.json")).unwrap_err();
        assert!(err.to_string().contains("Failed to create"), "{err}");
    }

    #[test]
    fn temp_names_are_recognised() {
        let t = temp_path(Path::new("/x/memory.json"));
        let name = t.file_name().unwrap().to_str().unwrap();
        assert!(name.starts_with(".memory.json."));
        assert!(is_atomic_temp(name));
        for other in [
            "memory.json",
            ".memory.json.tmp",
            ".memory.json.0123456789abcdef0123456789ABCDEF.tmp",
            "..0123456789abcdef0123456789abcdef.tmp",
            ".a.0123456789abcdef0123456789abcde.tmp",
        ] {
            assert!(!is_atomic_temp(other), "{other}");
        }
    }

    #[test]
    fn atomic_write_creates_parents_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("a/b/memory.json");
        atomic_write(&target, b"one").unwrap();
        atomic_write(&target, b"two").unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"two");
        let names: Vec<_> = fs::read_dir(target.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("memory.json")]);
    }

    #[cfg(feature = "fault-injection")]
    #[test]
    fn injected_faults_fail_typed_until_disarmed() {
        use crate::fault::inject::{IoFault, arm, disarm};
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("memory.json");
        atomic_write(&target, b"one").unwrap();
        for fault in [IoFault::DiskFull, IoFault::FsyncEio, IoFault::ReadOnly] {
            arm(dir.path(), fault, 0);
            let err = atomic_write(&target, b"two").unwrap_err();
            assert!(matches!(err, Error::Io { .. }), "{fault:?}: {err}");
            // Sticky: the next try fails too.
            assert!(atomic_write(&target, b"two").is_err(), "{fault:?}");
            assert!(disarm(dir.path()) >= 2, "{fault:?}");
            assert_eq!(fs::read(&target).unwrap(), b"one", "{fault:?}");
            let names: Vec<_> = fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(names, vec![std::ffi::OsString::from("memory.json")]);
        }
        // Another root is never affected, and a disarmed root works again.
        let other = tempfile::tempdir().unwrap();
        arm(other.path(), IoFault::ReadOnly, 0);
        atomic_write(&target, b"three").unwrap();
        disarm(other.path());
        assert_eq!(fs::read(&target).unwrap(), b"three");
    }

    #[test]
    fn failed_atomic_write_removes_its_temp() {
        let dir = tempfile::tempdir().unwrap();
        // The target is a non-empty directory: the rename fails.
        let target = dir.path().join("t");
        fs::create_dir_all(target.join("inner")).unwrap();
        assert!(atomic_write(&target, b"x").is_err());
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec!["t".to_owned()]);
    }
}
