//! Helpers shared by the OpenViking integration tests: the fake server (moved into the crate
//! behind the `fake-server` feature, re-exported here), a fixed clock, the environment the
//! config parser reads the key from, and a manager for `owner_user_id: alice`.

#![allow(dead_code, unreachable_pub, unused_imports)]

use std::path::Path;
use std::sync::Arc;

use deermem_backend_openviking::OpenVikingManager;
pub use deermem_backend_openviking::fake::{API_KEY, FakeOv, USER_ID};
use deermem_core::ports::Clock;
use deermem_core::{MemoryMode, Timestamp};
use serde_json::{Map, Value};

/// A clock fixed at one instant.
#[derive(Debug)]
pub struct FixedClock(pub Timestamp);

impl Clock for FixedClock {
    fn now(&self) -> Timestamp {
        self.0
    }
}

pub fn clock() -> Arc<dyn Clock> {
    Arc::new(FixedClock(Timestamp::from_unix_seconds(1_780_000_000)))
}

/// The environment the tests give the config parser.
pub fn env(name: &str) -> Option<String> {
    (name == "OPENVIKING_API_KEY").then(|| API_KEY.to_owned())
}

/// A manager for `owner_user_id: alice` against the fake, with extra config keys merged in.
pub fn manager(fake: &FakeOv, dir: &Path, extra: Value) -> OpenVikingManager {
    let mut cfg = Map::new();
    cfg.insert("base_url".into(), Value::String(fake.url()));
    cfg.insert("owner_user_id".into(), Value::String("alice".into()));
    if let Value::Object(extra) = extra {
        for (k, v) in extra {
            cfg.insert(k, v);
        }
    }
    OpenVikingManager::from_backend_config(
        &cfg,
        MemoryMode::Middleware,
        dir.to_path_buf(),
        clock(),
        &env,
    )
    .unwrap()
}
