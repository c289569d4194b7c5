//! Helpers shared by the suite's modules: storage and manager construction on temp roots.

use std::path::Path;
use std::sync::Arc;

use deermem::SystemClock;
use deermem_core::MemoryConfig;
use deermem_core::ports::{Clock, MemoryManager};
use deermem_storage_file::FileStorage;
use deermem_updater::DeerMemConfig;

/// The file storage with its FTS5 index, as the facade composes it.
pub(crate) fn storage(root: &Path) -> FileStorage {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    deermem::embedded::open_storage(&DeerMemConfig::default(), root.to_path_buf(), clock, true)
        .expect("storage opens")
}

/// The DeerMem manager (file storage, FTS5, offline proposer) on `root`.
pub(crate) fn manager(root: &Path) -> Arc<dyn MemoryManager> {
    manager_with(root, MemoryConfig::default())
}

/// The DeerMem manager built from a `memory:` configuration, on `root`.
pub(crate) fn manager_with(root: &Path, cfg: MemoryConfig) -> Arc<dyn MemoryManager> {
    let env = |_: &str| None;
    let mut opts = deermem::BuildOptions::new(&env);
    opts.storage_path = Some(root.to_path_buf());
    deermem::build_manager(&cfg, opts).expect("DeerMem builds")
}

/// The writer child binary.
pub(crate) fn writer() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_deermem-reliability-writer"))
}
