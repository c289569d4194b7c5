//! Reads the fact files of one `facts/` directory through directory descriptors. Each shard is
//! opened relative to `facts/` and each file relative to its shard, so the kernel resolves one
//! path component per open, not the whole path from the root. A cold load opens about a hundred
//! files in as many shards, and the path walks were a large share of its system time.
//!
//! The walk is the one [`crate::fsutil::markdown_files`] defines. Any `*.md` file at any depth
//! counts, symlinked directories are not followed, and files come in `Path` order. A shard is
//! read by descriptor only when it holds nothing but regular files. Any other entry (a nested
//! directory, a symlink, an unknown type, a file at the top) goes through the path-based walk,
//! so the odd layouts keep exactly the old behaviour.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::fsutil::{self, Kind};

/// One entry of the listed `facts/` directory.
#[derive(Debug)]
pub(crate) struct TopEntry {
    name: std::ffi::OsString,
    kind: Kind,
}

/// A listed `facts/` directory: its entries sorted by name (and, on Unix, its descriptor).
#[derive(Debug)]
pub(crate) struct FactsDir {
    path: PathBuf,
    #[cfg(unix)]
    fd: rustix::fd::OwnedFd,
    entries: Vec<TopEntry>,
}

/// The kind of an entry as `readdir` reports it; an unknown type is asked of the file system
/// (as `std::fs::DirEntry::file_type` does).
#[cfg(unix)]
fn kind_of(t: rustix::fs::FileType, path: impl FnOnce() -> PathBuf) -> Result<Kind> {
    use rustix::fs::FileType;
    Ok(match t {
        FileType::Directory => Kind::Dir,
        FileType::RegularFile => Kind::File,
        FileType::Unknown => {
            let path = path();
            Kind::of(
                std::fs::symlink_metadata(&path)
                    .map_err(|e| Error::io("Failed to stat", &path, e))?
                    .file_type(),
            )
        }
        _ => Kind::Other,
    })
}

/// The entries of an open directory (without `.` and `..`), sorted by name.
#[cfg(unix)]
fn list_fd(
    fd: rustix::fd::OwnedFd,
    dir: &Path,
) -> Result<(
    rustix::fd::OwnedFd,
    Vec<(std::ffi::OsString, rustix::fs::FileType)>,
)> {
    use std::os::unix::ffi::OsStrExt;
    let listing_error = |e: rustix::io::Errno| Error::io("Failed to list", dir, e.into());
    let mut d = rustix::fs::Dir::new(fd).map_err(listing_error)?;
    let mut out = Vec::new();
    while let Some(entry) = d.read() {
        let entry = entry.map_err(listing_error)?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        out.push((
            std::ffi::OsStr::from_bytes(name).to_owned(),
            entry.file_type(),
        ));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    // A descriptor of the directory for the `openat` calls that follow (the stream's own is
    // closed with it).
    let fd = d
        .fd()
        .and_then(|b| rustix::io::fcntl_dupfd_cloexec(b, 0))
        .map_err(listing_error)?;
    Ok((fd, out))
}

#[cfg(unix)]
fn open_dir_at(
    at: rustix::fd::BorrowedFd<'_>,
    name: &std::ffi::OsStr,
) -> rustix::io::Result<rustix::fd::OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    rustix::fs::openat(
        at,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

impl FactsDir {
    /// Lists `dir`; `None` when it does not exist.
    ///
    /// # Errors
    /// `Io` when it cannot be listed.
    #[cfg(unix)]
    pub(crate) fn open(dir: &Path) -> Result<Option<FactsDir>> {
        use rustix::fs::{Mode, OFlags};
        let fd = match rustix::fs::open(
            dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            Err(e) => return Err(Error::io("Failed to list", dir, e.into())),
        };
        let (fd, listed) = list_fd(fd, dir)?;
        let mut entries = Vec::with_capacity(listed.len());
        for (name, t) in listed {
            let kind = kind_of(t, || dir.join(&name))?;
            entries.push(TopEntry { name, kind });
        }
        Ok(Some(FactsDir {
            path: dir.to_path_buf(),
            fd,
            entries,
        }))
    }

    /// Lists `dir`; `None` when it does not exist.
    ///
    /// # Errors
    /// `Io` when it cannot be listed.
    #[cfg(not(unix))]
    pub(crate) fn open(dir: &Path) -> Result<Option<FactsDir>> {
        if !dir.exists() {
            return Ok(None);
        }
        let mut entries = Vec::new();
        for e in fsutil::sorted_entries(dir)? {
            let ft = e
                .file_type()
                .map_err(|err| Error::io("Failed to stat", &e.path(), err))?;
            entries.push(TopEntry {
                name: e.file_name(),
                kind: Kind::of(ft),
            });
        }
        Ok(Some(FactsDir {
            path: dir.to_path_buf(),
            entries,
        }))
    }

    /// The entries, in name order.
    pub(crate) fn entries(&self) -> &[TopEntry] {
        &self.entries
    }

    /// Reads every `*.md` file of `entry`: lists them all first (a listing error fails the
    /// entry before any file is read), then calls `each(path, read)` in `Path` order, with the
    /// file's bytes in `buf` when `read` is `Ok`.
    ///
    /// # Errors
    /// `Io` when a directory cannot be listed.
    pub(crate) fn read_entry<R>(
        &self,
        entry: &TopEntry,
        buf: &mut Vec<u8>,
        mut each: impl FnMut(PathBuf, std::io::Result<()>, &[u8]) -> R,
    ) -> Result<Vec<R>> {
        let path = self.path.join(&entry.name);
        #[cfg(unix)]
        if entry.kind == Kind::Dir
            && let Some(files) = self.plain_shard(entry, &path)?
        {
            use rustix::fd::AsFd;
            let (fd, names) = files;
            let mut out = Vec::with_capacity(names.len());
            for name in names {
                let read = read_at(fd.as_fd(), &name, buf);
                let file = path.join(&name);
                out.push(each(file, read, buf));
            }
            return Ok(out);
        }
        let mut files = Vec::new();
        fsutil::markdown_files_below(path, entry.kind, &mut files)?;
        Ok(files
            .into_iter()
            .map(|file| {
                let read = fsutil::read_into(&file, buf);
                each(file, read, buf)
            })
            .collect())
    }

    /// The shard's descriptor and its `*.md` names when it holds only regular files; `None`
    /// when the path-based walk must decide (anything else inside, or the shard changed kind
    /// since the listing).
    #[cfg(unix)]
    fn plain_shard(
        &self,
        entry: &TopEntry,
        path: &Path,
    ) -> Result<Option<(rustix::fd::OwnedFd, Vec<std::ffi::OsString>)>> {
        use rustix::fd::AsFd;
        let fd = match open_dir_at(self.fd.as_fd(), &entry.name) {
            Ok(fd) => fd,
            // Gone, replaced by a symlink or a file...: let the path-based walk report it.
            Err(_) => return Ok(None),
        };
        let (fd, listed) = list_fd(fd, path)?;
        let mut names = Vec::with_capacity(listed.len());
        for (name, t) in listed {
            if t != rustix::fs::FileType::RegularFile {
                return Ok(None);
            }
            if Path::new(&name).extension().is_some_and(|e| e == "md") {
                names.push(name);
            }
        }
        Ok(Some((fd, names)))
    }
}

/// Reads the regular file `name` of the directory `dir` into `buf`.
#[cfg(unix)]
fn read_at(
    dir: rustix::fd::BorrowedFd<'_>,
    name: &std::ffi::OsStr,
    buf: &mut Vec<u8>,
) -> std::io::Result<()> {
    use rustix::fs::{Mode, OFlags};
    buf.clear();
    let fd = rustix::fs::openat(dir, name, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())?;
    fsutil::read_file_into(std::fs::File::from(fd), buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn walk(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
        let Some(facts) = FactsDir::open(dir).unwrap() else {
            return Vec::new();
        };
        let mut buf = Vec::new();
        let mut out = Vec::new();
        for e in facts.entries() {
            out.extend(
                facts
                    .read_entry(e, &mut buf, |p, r, bytes| {
                        r.unwrap();
                        (p, bytes.to_vec())
                    })
                    .unwrap(),
            );
        }
        out
    }

    #[test]
    fn reads_the_files_the_path_walk_lists_in_the_same_order() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("facts");
        for (rel, body) in [
            ("ab/fact_ab1.md", "one"),
            ("ab/fact_ab0.md", "zero"),
            ("ab/notes.txt", "not markdown"),
            ("cd/fact_cd.md", "cd"),
            ("stray.md", "stray"),
            ("nested/deeper/fact_x.md", "deep"),
            ("nested/fact_y.md", "y"),
            ("mixed/fact_m.md", "m"),
            ("mixed/sub/fact_n.md", "n"),
        ] {
            let p = f.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, body).unwrap();
        }
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(f.join("cd/fact_cd.md"), f.join("ab/fact_link.md")).unwrap();
            std::os::unix::fs::symlink(f.join("nested"), f.join("zz_linked_dir")).unwrap();
        }
        let got = walk(&f);
        let want: Vec<(PathBuf, Vec<u8>)> = fsutil::markdown_files(&f)
            .unwrap()
            .into_iter()
            .map(|p| {
                let b = std::fs::read(&p).unwrap();
                (p, b)
            })
            .collect();
        assert_eq!(got, want);
        assert!(got.iter().any(|(p, _)| p.ends_with("ab/fact_ab0.md")));
        assert!(got.iter().any(|(p, _)| p.ends_with("mixed/sub/fact_n.md")));
        #[cfg(unix)]
        assert!(got.iter().any(|(p, _)| p.ends_with("ab/fact_link.md")));
    }

    #[test]
    fn a_missing_directory_has_no_entries() {
        let dir = tempfile::tempdir().unwrap();
        assert!(FactsDir::open(&dir.path().join("none")).unwrap().is_none());
        assert!(walk(&dir.path().join("none")).is_empty());
    }

    #[cfg(unix)]
    #[test]
    fn an_unreadable_file_is_reported_for_that_file_only() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("facts");
        std::fs::create_dir_all(f.join("ab")).unwrap();
        std::fs::write(f.join("ab/fact_a.md"), "a").unwrap();
        // A directory named like a fact makes the shard "not plain": the path walk decides,
        // and the reads still happen in order.
        std::fs::create_dir_all(f.join("ab/fact_b.md")).unwrap();
        let facts = FactsDir::open(&f).unwrap().unwrap();
        let mut buf = Vec::new();
        let got = facts
            .read_entry(&facts.entries()[0], &mut buf, |p, r, _| (p, r.is_ok()))
            .unwrap();
        assert_eq!(got, vec![(f.join("ab/fact_a.md"), true)]);
    }
}
