//! Cursor files, the file implementation of the [`CursorStorage`] port: small JSON files in one
//! directory per space, read with a size bound and written atomically and durably (a temporary
//! file in the same directory, fsync, rename, directory fsync; the temporary never survives a
//! failure); and the sequence digest the capture cursors keep of the messages they already
//! sent.

use std::fs;
use std::io::{self, Read, Write};
use std::path::PathBuf;

use async_trait::async_trait;
use sha2::{Digest, Sha256};

use deermem_core::ports::CursorStorage;

/// SHA-256 over each item's 8-byte big-endian length followed by its bytes, as hex.
pub fn seq_digest<S: AsRef<str>>(items: &[S]) -> String {
    let mut h = Sha256::new();
    for s in items {
        let b = s.as_ref().as_bytes();
        h.update((b.len() as u64).to_be_bytes());
        h.update(b);
    }
    hex::encode(h.finalize())
}

pub use deermem_core::ports::cursors::ReadError;

/// The cursor files under one root: cursor `name` of space `space` is the file
/// `{root}/{space}/{name}`. Spaces are the backends' fixed relative folders (`honcho/cursors`);
/// names are the caller's and must each be one safe path component (a hash, or an id of a
/// known safe alphabet), never raw input.
#[derive(Clone, Debug)]
pub struct CursorFiles {
    root: PathBuf,
}

impl CursorFiles {
    /// Files under `root`.
    pub fn new(root: PathBuf) -> Self {
        Self { root }
    }

    /// The directory of a space.
    pub fn dir(&self, space: &str) -> PathBuf {
        space
            .split('/')
            .fold(self.root.clone(), |dir, part| dir.join(part))
    }

    /// The path of a file.
    pub fn path(&self, space: &str, name: &str) -> PathBuf {
        self.dir(space).join(name)
    }

    /// The bytes of a file; `None` when there is none.
    ///
    /// # Errors
    /// The path holds something other than a regular file, a file over `max_bytes`, or the
    /// OS refused.
    pub fn read_file(
        &self,
        space: &str,
        name: &str,
        max_bytes: u64,
    ) -> Result<Option<Vec<u8>>, ReadError> {
        let path = self.path(space, name);
        let meta = match fs::metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(ReadError::Io(e)),
        };
        if !meta.is_file() {
            return Err(ReadError::NotAFile);
        }
        let mut bytes = Vec::new();
        fs::File::open(&path)
            .and_then(|f| f.take(max_bytes + 1).read_to_end(&mut bytes))
            .map_err(ReadError::Io)?;
        if bytes.len() as u64 > max_bytes {
            return Err(ReadError::TooLarge(max_bytes));
        }
        Ok(Some(bytes))
    }

    /// Replaces a file atomically and durably.
    ///
    /// # Errors
    /// The OS refused; the old file is then unchanged.
    pub fn write_file(&self, space: &str, name: &str, bytes: &[u8]) -> io::Result<()> {
        let dir = self.dir(space);
        fs::create_dir_all(&dir)?;
        let tmp = dir.join(format!(
            ".{name}.{}.{:016x}.tmp",
            std::process::id(),
            rand::random::<u64>()
        ));
        let result = (|| {
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)?;
            f.write_all(bytes)?;
            f.sync_all()?;
            drop(f);
            fs::rename(&tmp, dir.join(name))?;
            #[cfg(unix)]
            fs::File::open(&dir)?.sync_all()?;
            Ok(())
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result
    }
}

/// The port on files: each call runs on the blocking pool.
#[async_trait]
impl CursorStorage for CursorFiles {
    async fn read(
        &self,
        space: &str,
        name: &str,
        max_bytes: u64,
    ) -> Result<Option<Vec<u8>>, ReadError> {
        let (files, space, name) = (self.clone(), space.to_owned(), name.to_owned());
        tokio::task::spawn_blocking(move || files.read_file(&space, &name, max_bytes))
            .await
            .map_err(|e| ReadError::Io(io::Error::other(format!("cursor read task failed: {e}"))))?
    }

    async fn write(&self, space: &str, name: &str, bytes: Vec<u8>) -> io::Result<()> {
        let (files, space, name) = (self.clone(), space.to_owned(), name.to_owned());
        tokio::task::spawn_blocking(move || files.write_file(&space, &name, &bytes))
            .await
            .map_err(|e| io::Error::other(format!("cursor write task failed: {e}")))?
    }

    fn location(&self, space: &str, name: &str) -> String {
        self.path(space, name).display().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_vectors() {
        assert_eq!(
            seq_digest::<&str>(&[]),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_ne!(seq_digest(&["ab", "c"]), seq_digest(&["a", "bc"]));
        assert_eq!(seq_digest(&["a".to_owned()]), seq_digest(&["a"]));
    }

    #[test]
    fn read_write_bounds_and_no_leftovers() {
        let root = tempfile::tempdir().unwrap();
        let files = CursorFiles::new(root.path().to_path_buf());
        let dir = files.dir("a/c");
        assert_eq!(dir, root.path().join("a").join("c"));
        assert!(files.read_file("a/c", "x.json", 8).unwrap().is_none());
        files.write_file("a/c", "x.json", b"1234").unwrap();
        files.write_file("a/c", "x.json", b"12345678").unwrap();
        assert_eq!(
            files.read_file("a/c", "x.json", 8).unwrap().unwrap(),
            b"12345678"
        );
        let names: Vec<_> = fs::read_dir(&dir).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary left behind");
        fs::write(files.path("a/c", "big.json"), b"123456789").unwrap();
        assert!(matches!(
            files.read_file("a/c", "big.json", 8),
            Err(ReadError::TooLarge(8))
        ));
        fs::create_dir(files.path("a/c", "dir.json")).unwrap();
        assert!(matches!(
            files.read_file("a/c", "dir.json", 8),
            Err(ReadError::NotAFile)
        ));
        // Writing over a directory fails and leaves no temporary.
        assert!(files.write_file("a/c", "dir.json", b"1").is_err());
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 3);
    }

    #[tokio::test]
    async fn the_port_contract_holds_on_files() {
        let root = tempfile::tempdir().unwrap();
        let a = CursorFiles::new(root.path().to_path_buf());
        let b = CursorFiles::new(root.path().to_path_buf());
        deermem_testkit::cursors::check(&a, &b).await;
        assert!(
            a.location("honcho/cursors", "n.json").ends_with("n.json"),
            "a file's location is its path"
        );
    }
}
