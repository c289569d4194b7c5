//! The manager contract suite run against the noop backend (tier defaults).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use deermem::NoopManager;
use deermem_core::MemoryMode;
use deermem_testkit::manager::ManagerFixture;

async fn fixture() -> ManagerFixture {
    ManagerFixture {
        manager: Arc::new(NoopManager::new(MemoryMode::Middleware)),
        guard: Box::new(()),
    }
}

deermem_testkit::manager_contract!(fixture(), [searcher, reader, admin]);
