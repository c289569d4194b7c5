//! The cursor-store port: where the remote backends keep their capture cursors (which messages
//! a remote memory service already accepted). A cursor is a small byte string named by a
//! space (the backend's fixed folder, `honcho/cursors`, `openviking/sessions`) and a name (a
//! hash or a safe id, `{hex}.json`). Files under the storage root are one implementation
//! (`deermem_remote::files::CursorFiles`); PostgreSQL storage keeps them in its database, so
//! replicas on several hosts share them. Its behaviour is asserted by
//! `deermem_testkit::cursors::check`.

use std::fmt;
use std::io;

use async_trait::async_trait;

/// A cursor that cannot be read.
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

/// Durable storage of cursors. A write replaces the whole cursor atomically: a reader sees the
/// old bytes or the new ones, never a mix, and an acknowledged write survives a crash.
#[async_trait]
pub trait CursorStorage: Send + Sync + fmt::Debug {
    /// The bytes of a cursor; `None` when there is none.
    ///
    /// # Errors
    /// [`ReadError::TooLarge`] for a cursor over `max_bytes`, [`ReadError::NotAFile`] when
    /// something else is stored under the name, [`ReadError::Io`] when the storage refused or
    /// cannot be reached.
    async fn read(
        &self,
        space: &str,
        name: &str,
        max_bytes: u64,
    ) -> Result<Option<Vec<u8>>, ReadError>;

    /// Replaces a cursor atomically and durably.
    ///
    /// # Errors
    /// The storage refused or cannot be reached; the old cursor is then unchanged.
    async fn write(&self, space: &str, name: &str, bytes: Vec<u8>) -> io::Result<()>;

    /// Where a cursor lives, for error messages (a path, or a table and key).
    fn location(&self, space: &str, name: &str) -> String;
}
