//! Cursor files: small JSON files in one directory, read with a size bound and written
//! atomically and durably (a temporary file in the same directory, fsync, rename, directory
//! fsync; the temporary never survives a failure); and the sequence digest the capture cursors
//! keep of the messages they already sent.

use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

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

/// A cursor file that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Something other than a regular file is at the path.
    #[error("not a regular file")]
    NotAFile,
    /// The file is larger than the store's limit.
    #[error("file is larger than {0} bytes")]
    TooLarge(u64),
    /// The OS refused.
    #[error("{0}")]
    Io(io::Error),
}

/// The cursor files of one directory. Names are the caller's: each must be one safe path
/// component (a hash, or an id of a known safe alphabet), never raw input.
#[derive(Clone, Debug)]
pub struct CursorFiles {
    dir: PathBuf,
    max_bytes: u64,
}

impl CursorFiles {
    /// Files under `dir`, none read beyond `max_bytes`.
    pub fn new(dir: PathBuf, max_bytes: u64) -> Self {
        Self { dir, max_bytes }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path of a file.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The bytes of a file; `None` when there is none.
    ///
    /// # Errors
    /// The path holds something other than a regular file, a file over the limit, or the OS
    /// refused.
    pub fn read(&self, name: &str) -> Result<Option<Vec<u8>>, ReadError> {
        let path = self.path(name);
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
            .and_then(|f| f.take(self.max_bytes + 1).read_to_end(&mut bytes))
            .map_err(ReadError::Io)?;
        if bytes.len() as u64 > self.max_bytes {
            return Err(ReadError::TooLarge(self.max_bytes));
        }
        Ok(Some(bytes))
    }

    /// Replaces a file atomically and durably.
    ///
    /// # Errors
    /// The OS refused; the old file is then unchanged.
    pub fn write(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        fs::create_dir_all(&self.dir)?;
        let tmp = self.dir.join(format!(
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
            fs::rename(&tmp, self.path(name))?;
            #[cfg(unix)]
            fs::File::open(&self.dir)?.sync_all()?;
            Ok(())
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result
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
        let files = CursorFiles::new(root.path().join("c"), 8);
        assert!(files.read("x.json").unwrap().is_none());
        files.write("x.json", b"1234").unwrap();
        files.write("x.json", b"12345678").unwrap();
        assert_eq!(files.read("x.json").unwrap().unwrap(), b"12345678");
        let names: Vec<_> = fs::read_dir(files.dir()).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary left behind");
        fs::write(files.path("big.json"), b"123456789").unwrap();
        assert!(matches!(
            files.read("big.json"),
            Err(ReadError::TooLarge(8))
        ));
        fs::create_dir(files.path("dir.json")).unwrap();
        assert!(matches!(files.read("dir.json"), Err(ReadError::NotAFile)));
        // Writing over a directory fails and leaves no temporary.
        assert!(files.write("dir.json", b"1").is_err());
        assert_eq!(fs::read_dir(files.dir()).unwrap().count(), 3);
    }
}
