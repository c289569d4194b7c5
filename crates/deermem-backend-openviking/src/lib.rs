//! DeerMem remote memory backend over OpenViking's HTTP API (`manager_class: openviking`).
//!
//! One OpenViking USER API key is bound to one DeerFlow user (`owner_user_id`); requests for
//! anyone else are refused before any file or network access. Each DeerFlow thread maps to one
//! stable OpenViking session, and each agent to an actor peer. Captures run in the background:
//! only the transcript suffix not yet submitted is sent (tracked by a hash-only cursor under
//! `{storage}/openviking/sessions/`), in batches of at most 100, followed by a commit. Recall
//! asks a fixed injection query and formats bare `- [category] text` lines under a character
//! budget.
//!
//! - [`config`]: `backend_config` parsing and validation.
//! - [`scope`]: owner rule, actor peer, session id, target URIs.
//! - [`client`]: the typed HTTP client and its error model.
//! - [`convert`]: message filtering, conversion and hashing.
//! - [`cursor`]: the capture cursor files.
//! - [`recall`]: hit selection and formatting.
//! - [`manager`]: [`OpenVikingManager`], the `MemoryManager` implementation.
//! - `fake` (Cargo feature `fake-server`): a strict fake OpenViking server on 127.0.0.1 for
//!   tests (this crate's, the facade's and the CLI's).
//! - `testserver` (Cargo feature `real-server`): a real OpenViking 0.5.2 server from PyPI on
//!   127.0.0.1, with a stub model server, for the end-to-end tests.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]
#![deny(missing_docs)]

pub mod client;
pub mod config;
pub mod convert;
pub mod cursor;
/// A strict fake OpenViking server on 127.0.0.1 for tests (feature `fake-server`; it lives in
/// the testkit, `deermem_testkit::http::openviking`).
#[cfg(feature = "fake-server")]
pub mod fake {
    pub use deermem_testkit::http::openviking::*;
}
pub mod manager;
pub mod recall;
pub mod scope;
/// A real OpenViking 0.5.2 server from PyPI on 127.0.0.1, with a stub model server, for the
/// end-to-end tests (feature `real-server`; it lives in the testkit,
/// `deermem_testkit::http::openviking_server`).
#[cfg(feature = "real-server")]
pub mod testserver {
    pub use deermem_testkit::http::openviking_server::*;
}

pub use config::{
    ContentMode, FailurePolicies, FailurePolicy, OpenVikingConfig, RetrievalConfig, StartupPolicy,
};
pub use convert::HiddenMessageFilter;
pub use manager::{BACKEND_NAME, CaptureReport, CaptureStats, OpenVikingManager};
