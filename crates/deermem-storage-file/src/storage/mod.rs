//! `FileStorage`: the storage ports over the reference's on-disk layout. Every public
//! operation is async; the filesystem work (including lock waits) runs on tokio's blocking
//! pool, and retrieval notifications are dispatched after both locks are released. This module
//! holds the adapter's shared state; its parts live in `locked` (locks, recovery and read
//! migrations), `cache` (the load path), `write` (change sets, rebase, group commit, clearing),
//! `index` (notifications and dirty scopes), and the ports `repository`, `metadata` and
//! `search`, with the administrative operations in `admin`.

mod admin;
mod cache;
mod config;
mod index;
mod locked;
mod metadata;
mod repository;
mod search;
mod snapshot;
mod write;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use deermem_core::ports::{Clock, Retrieval};
use deermem_core::{AgentName, StorageError, UserId};
use parking_lot::Mutex;

use crate::commit::Notification;
use crate::error::Result;
use crate::group::Groups;
use crate::lock::LockRegistry;
use crate::paths::{self, Layout};

pub use admin::{IndexVerification, StaleScope};
pub use cache::CacheUsage;
pub use config::{DEFAULT_CACHE_MAX_SCOPES, DEFAULT_REBUILD_BATCH_FACTS, FileStorageConfig};
pub use repository::SCOPE_CACHE_NAME;
pub use snapshot::INCOMPLETE_MARKER;

/// A scope whose index may disagree with its files.
type DirtyKey = (Option<UserId>, AgentName);

/// The file storage adapter. Cheap to clone; clones share caches and locks.
#[derive(Debug, Clone)]
pub struct FileStorage {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    layout: Layout,
    config: FileStorageConfig,
    clock: Arc<dyn Clock>,
    retrieval: Option<Arc<dyn Retrieval>>,
    locks: LockRegistry,
    cache: Mutex<cache::Documents>,
    dirty: Mutex<BTreeSet<DirtyKey>>,
    /// Point writes of one user waiting for a leader to take them into its commit.
    groups: Groups<Option<UserId>, write::GroupedWrite, write::Applied>,
    /// `users/` was seen or created (and marked) by this instance: later locks skip the check.
    users_dir_ready: AtomicBool,
    closed: AtomicBool,
}

impl FileStorage {
    /// A storage over `config.root`.
    ///
    /// # Errors
    /// `InvalidInput` for a manifest name that is not a plain `.json` file name.
    pub fn new(
        config: FileStorageConfig,
        clock: Arc<dyn Clock>,
        retrieval: Option<Arc<dyn Retrieval>>,
    ) -> std::result::Result<Self, StorageError> {
        paths::validate_manifest_name(&config.manifest_filename)?;
        let layout = Layout {
            root: config.root.clone(),
            manifest_name: config.manifest_filename.clone(),
            strict_user_scope: config.strict_user_scope,
        };
        let documents = cache::Documents::new(config.cache_max_scopes);
        Ok(Self {
            inner: Arc::new(Inner {
                layout,
                config,
                clock,
                retrieval,
                locks: LockRegistry::default(),
                cache: Mutex::new(documents),
                dirty: Mutex::default(),
                groups: Groups::default(),
                users_dir_ready: AtomicBool::new(false),
                closed: AtomicBool::new(false),
            }),
        })
    }

    /// The storage root.
    pub fn root(&self) -> &Path {
        &self.inner.layout.root
    }

    /// The settings in use.
    pub fn config(&self) -> &FileStorageConfig {
        &self.inner.config
    }

    /// The load cache: scopes it holds and its bound.
    pub fn cache_usage(&self) -> CacheUsage {
        self.inner.cache.lock().usage()
    }

    /// In-process lock entries currently held or awaited (the registry keeps no unused ones).
    pub fn live_lock_entries(&self) -> usize {
        self.inner.locks.live_entries()
    }

    /// Runs blocking filesystem work off the async runtime's worker threads.
    async fn run<T, F>(&self, f: F) -> std::result::Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce(&Inner) -> Result<T> + Send + 'static,
    {
        let inner = self.inner.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => match handle.spawn_blocking(move || f(&inner)).await {
                Ok(r) => r.map_err(StorageError::from),
                Err(e) => Err(StorageError::Io {
                    context: "memory storage worker failed".into(),
                    source: std::io::Error::other(e.to_string()),
                }),
            },
            Err(_) => f(&inner).map_err(StorageError::from),
        }
    }

    /// [`Self::run`] for a write to one scope whose index notifications are dispatched once it
    /// is done. When it fails with an I/O error, part of it may be on disk without the index
    /// having been told (a commit that failed after its commit point, a read migration
    /// committed before a later step failed), so the scope is marked dirty and the next search
    /// there rebuilds it from the files.
    async fn run_write<T, F>(
        &self,
        user: Option<&UserId>,
        agent: Option<&AgentName>,
        f: F,
    ) -> std::result::Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce(&Inner) -> Result<(T, Vec<Notification>)> + Send + 'static,
    {
        match self.run(f).await {
            Ok((out, notes)) => {
                self.dispatch(notes).await;
                Ok(out)
            }
            Err(e) => {
                if let (StorageError::Io { .. }, Some(agent)) = (&e, agent) {
                    self.inner.mark_dirty(user, agent);
                }
                Err(e)
            }
        }
    }
}
