//! The settings of the file storage: the root, the manifest name, the user-scope rule, the lock
//! timeout and the sidecar limits, and how a DeerMem configuration selects them.

use std::path::PathBuf;
use std::time::Duration;

use deermem_core::{DeerMemConfig, StorageError};

use crate::paths;

/// Settings of a [`super::FileMemoryStorage`].
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
pub const DEFAULT_CACHE_MAX_SCOPES: usize = deermem_core::config::DEFAULT_CACHE_MAX_SCOPES;

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

    /// The settings a DeerMem configuration selects. The root is `storage_path`, else
    /// `$DEERMEM_DATA_DIR`, else `~/.deermem`, with the environment and home lookups injected.
    ///
    /// # Errors
    /// `InvalidInput` when no root can be determined.
    pub fn from_deermem(
        cfg: &DeerMemConfig,
        env: &dyn Fn(&str) -> Option<String>,
        home: &dyn Fn() -> Option<PathBuf>,
    ) -> std::result::Result<Self, StorageError> {
        let root = paths::resolve_root(&cfg.storage_path, env, home).ok_or_else(|| {
            StorageError::invalid(
                "storage_path",
                "no storage root: storage_path is empty, DEERMEM_DATA_DIR is unset and there is no home directory",
            )
        })?;
        Ok(Self {
            root,
            manifest_filename: cfg.manifest_filename.clone(),
            strict_user_scope: cfg.strict_user_scope,
            lock_timeout: Duration::from_secs(cfg.file_lock_timeout_seconds),
            audit_max_entries: cfg.eviction_audit_max_entries,
            access_half_life_days: cfg.eviction_access_half_life_days as f64,
            cache_max_scopes: cfg.cache_max_scopes,
            rebuild_batch_facts: DEFAULT_REBUILD_BATCH_FACTS,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_from_deermem_resolves_the_root_with_injected_lookups() {
        let mut cfg = DeerMemConfig {
            file_lock_timeout_seconds: 3,
            eviction_audit_max_entries: 7,
            eviction_access_half_life_days: 12,
            strict_user_scope: true,
            manifest_filename: "index.json".into(),
            cache_max_scopes: 5,
            ..DeerMemConfig::default()
        };
        let env = |k: &str| (k == "DEERMEM_DATA_DIR").then(|| "/data/dm".to_owned());
        let no_env = |_: &str| None;
        let home = || Some(PathBuf::from("/home/u"));
        let no_home = || None;
        let c = FileStorageConfig::from_deermem(&cfg, &env, &home).unwrap();
        assert_eq!(c.root, PathBuf::from("/data/dm"));
        assert_eq!(c.lock_timeout, Duration::from_secs(3));
        assert_eq!(c.audit_max_entries, 7);
        assert_eq!(c.access_half_life_days, 12.0);
        assert!(c.strict_user_scope);
        assert_eq!(c.manifest_filename, "index.json");
        assert_eq!(c.cache_max_scopes, 5);
        let c = FileStorageConfig::from_deermem(&cfg, &no_env, &home).unwrap();
        assert_eq!(c.root, PathBuf::from("/home/u/.deermem"));
        assert!(FileStorageConfig::from_deermem(&cfg, &no_env, &no_home).is_err());
        cfg.storage_path = "/srv/mem".into();
        let c = FileStorageConfig::from_deermem(&cfg, &env, &home).unwrap();
        assert_eq!(c.root, PathBuf::from("/srv/mem"));
    }
}
