//! Composition of the embedded engine's adapters: the file storage with its FTS5 index, from a
//! DeerMem `backend_config`.

#[cfg(feature = "retrieval-fts5")]
mod recovering;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use deermem_core::ports::{Clock, Retrieval};
use deermem_core::{ConfigError, DeerMemConfig, StorageError};
use deermem_storage_file::{FileMemoryStorage, FileStorageConfig};

#[cfg(feature = "retrieval-fts5")]
pub use recovering::RecoveringFts5;

/// Why the embedded storage could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EmbeddedError {
    /// Invalid configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The storage refused to start.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// Parses DeerMem's `backend_config`, logging its warnings.
///
/// # Errors
/// An invalid key, named.
pub fn deermem_config(
    backend_config: &serde_json::Map<String, serde_json::Value>,
) -> Result<DeerMemConfig, ConfigError> {
    let (cfg, warnings) = DeerMemConfig::from_backend_config(backend_config)?;
    for w in warnings {
        tracing::warn!("{w}");
    }
    Ok(cfg)
}

/// Opens the derived search index under `root`, or `None` when the configuration disables it
/// (`retrieval_adapter: ""`; storage then always uses its substring scan).
///
/// An index that cannot be opened now (an unusable `{root}/.retrieval/`, a file the adapter
/// could not recreate) does not disable search for the life of the process: the returned
/// [`RecoveringFts5`] reports the cause as `last_error` in the index status, lets search fall
/// back to the substring scan, and opens the index again on the next call (search, write,
/// rebuild, status).
///
/// # Errors
/// `retrieval_adapter: fts5` in a build without the `retrieval-fts5` feature.
pub fn open_retrieval(
    cfg: &DeerMemConfig,
    root: &Path,
    clock: Arc<dyn Clock>,
) -> Result<Option<Arc<dyn Retrieval>>, ConfigError> {
    if cfg.retrieval_adapter.is_empty() {
        return Ok(None);
    }
    #[cfg(feature = "retrieval-fts5")]
    {
        Ok(Some(
            Arc::new(RecoveringFts5::open(root, clock)) as Arc<dyn Retrieval>
        ))
    }
    #[cfg(not(feature = "retrieval-fts5"))]
    {
        let _ = (root, clock);
        Err(ConfigError::new(
            "memory.backend_config.retrieval_adapter",
            "'fts5' is not compiled into this build; rebuild with the Cargo feature `retrieval-fts5` of the `deermem` crate, or set retrieval_adapter: \"\"",
        ))
    }
}

/// Opens the file storage at `root` with the configured settings and (optionally) its index.
///
/// # Errors
/// Invalid settings or a storage that refuses to start.
pub fn open_storage(
    cfg: &DeerMemConfig,
    root: PathBuf,
    clock: Arc<dyn Clock>,
    with_retrieval: bool,
) -> Result<FileMemoryStorage, EmbeddedError> {
    let retrieval = if with_retrieval {
        open_retrieval(cfg, &root, Arc::clone(&clock))?
    } else {
        None
    };
    let config = FileStorageConfig {
        root,
        manifest_filename: cfg.manifest_filename.clone(),
        strict_user_scope: cfg.strict_user_scope,
        lock_timeout: std::time::Duration::from_secs(cfg.file_lock_timeout_seconds),
        audit_max_entries: cfg.eviction_audit_max_entries,
        access_half_life_days: cfg.eviction_access_half_life_days as f64,
    };
    Ok(FileMemoryStorage::new(config, clock, retrieval)?)
}
