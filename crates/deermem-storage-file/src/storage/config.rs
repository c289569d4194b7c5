//! The settings of the file storage: the root, the manifest name, the user-scope rule, the lock
//! timeout and the sidecar limits. The composition root (the `deermem` facade) fills them from
//! the DeerMem backend's configuration.

use std::path::PathBuf;
use std::time::Duration;

/// Settings of a [`super::FileStorage`].
#[derive(Debug, Clone, PartialEq)]
pub struct FileStorageConfig {
    /// The storage root (`users/<bucket>/...` lives below it).
    pub root: PathBuf,
    /// The manifest file name (`memory.json`): a plain name ending in `.json`.
    pub manifest_filename: String,
    /// Reject operations without a user (the legacy root layout).
    pub strict_user_scope: bool,
    /// How long to wait for the per-user lock.
    pub lock_timeout: Duration,
    /// Events kept in the capacity-eviction audit (0 disables it).
    pub audit_max_entries: usize,
    /// Half-life of the access heat in the usage sidecar, in days.
    pub access_half_life_days: f64,
    /// Scope documents the load cache keeps (least recently used forgotten first): the bound
    /// that keeps a serving process's memory independent of how many users it has served.
    pub cache_max_scopes: usize,
    /// Facts a full index rebuild reads and hands to the index at a time (whole scopes, so a
    /// batch may exceed it by one scope): the bound on a rebuild's memory.
    pub rebuild_batch_facts: usize,
}

/// The default [`FileStorageConfig::rebuild_batch_facts`].
pub const DEFAULT_REBUILD_BATCH_FACTS: usize = 4096;

/// The default [`FileStorageConfig::cache_max_scopes`] (`backend_config.cache_max_scopes`):
/// about 100 MiB of 100-fact scopes.
pub const DEFAULT_CACHE_MAX_SCOPES: usize = 1024;

impl FileStorageConfig {
    /// The reference defaults for a root directory.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            manifest_filename: "memory.json".into(),
            strict_user_scope: false,
            lock_timeout: Duration::from_secs(10),
            audit_max_entries: 200,
            access_half_life_days: 30.0,
            cache_max_scopes: DEFAULT_CACHE_MAX_SCOPES,
            rebuild_batch_facts: DEFAULT_REBUILD_BATCH_FACTS,
        }
    }
}
