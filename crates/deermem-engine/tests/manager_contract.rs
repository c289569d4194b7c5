//! The `MemoryManager` contract suite against DeerMem: over the file storage with the FTS5
//! index and a scripted model, and over the in-memory storage without an index (substring
//! search only).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod manager_support;

use std::sync::Arc;

use deermem_testkit::llm::ScriptedLlm;
use deermem_testkit::manager::ManagerFixture;
use manager_support::{answer, config, file_env, labelled, memory_manager};

fn scripted() -> Arc<ScriptedLlm> {
    Arc::new(ScriptedLlm::always(answer(&[labelled(
        "User prefers tea over coffee",
        "preference",
        0.9,
    )])))
}

async fn file_fixture() -> ManagerFixture {
    let env = file_env(config(), Some(scripted()));
    ManagerFixture {
        manager: env.manager.clone(),
        guard: Box::new(env),
    }
}

async fn memory_fixture() -> ManagerFixture {
    let (manager, storage, clock) = memory_manager(config(), Some(scripted()));
    ManagerFixture {
        manager,
        guard: Box::new((storage, clock)),
    }
}

mod file_fts5 {
    use super::file_fixture;
    deermem_testkit::manager_contract!(file_fixture(), [searcher, reader, admin, reloader, facts]);
}

mod in_memory_substring {
    use super::memory_fixture;
    deermem_testkit::manager_contract!(
        memory_fixture(),
        [searcher, reader, admin, reloader, facts]
    );
}
