//! Runs the `MemoryManager` contract suite from deermem-testkit against the OpenViking backend
//! and the fake server on 127.0.0.1.
//!
//! The suite's behaviours use a different user each; because one OpenViking USER key serves
//! exactly one owner, each behaviour gets a fixture whose `owner_user_id` is that user (the
//! `manager_contract!` macro would give every behaviour the same owner). Only the behaviours
//! this backend's abilities allow are registered (it searches; it has no reader, admin,
//! reloader or fact CRUD), as `manager_contract!` would register them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;

use deermem_backend_openviking::OpenVikingManager;
use deermem_core::MemoryMode;
use deermem_testkit::manager::{self, ManagerFixture};
use serde_json::json;
use support::FakeOv;

async fn fixture(owner: &str) -> ManagerFixture {
    let fake = FakeOv::start().await;
    fake.add_memory("preferences", "tea", "Prefers tea over coffee.", 0.7);
    let root = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
    let cfg = json!({"base_url": fake.url(), "owner_user_id": owner});
    let m = OpenVikingManager::from_backend_config(
        cfg.as_object().unwrap_or_else(|| panic!("object literal")),
        MemoryMode::Middleware,
        root.path().to_path_buf(),
        support::clock(),
        &support::env,
    )
    .unwrap_or_else(|e| panic!("openviking backend: {e}"));
    ManagerFixture {
        manager: Arc::new(m),
        guard: Box::new((fake, root)),
    }
}

macro_rules! behaviour {
    ($name:ident, $owner:expr) => {
        #[test]
        fn $name() {
            deermem_testkit::block_on(async {
                manager::$name(fixture($owner).await).await;
            });
        }
    };
}

behaviour!(capabilities_match_behaviour, "cap-user");
behaviour!(add_is_accepted_and_flush_succeeds, "add-user");
behaviour!(context_for_unknown_user_is_ok, "nobody-here");
behaviour!(blank_search_is_empty, "blank-user");
behaviour!(warm_reports, "default");

#[test]
fn declared_abilities_are_the_backends() {
    deermem_testkit::block_on(async {
        manager::declared_abilities_are_the_backends(fixture("cap-user").await, &["searcher"])
            .await;
    });
}
