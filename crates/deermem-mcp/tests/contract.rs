//! The testkit manager contract run against `MapManager`, the in-memory backend the MCP tests
//! serve: it proves the fake behaves like a real backend (CRUD, conflicts, isolation, search).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use deermem_testkit::manager::ManagerFixture;

async fn fixture() -> ManagerFixture {
    ManagerFixture {
        manager: Arc::new(common::MapManager::new()),
        guard: Box::new(()),
    }
}

deermem_testkit::manager_contract!(fixture(), [searcher, reader, admin, facts]);
