//! DeerMem remote memory backend over Honcho's v3 HTTP API (`manager_class: honcho`).
//!
//! - [`HonchoConfig`] parses the `backend_config` keys with the reference's defaults and
//!   validation; the API key never appears in `Debug` output or logs.
//! - Identity, derived as the reference derives it: one workspace per user, the user's peer, the
//!   assistant's peer, one session per thread ([`identity`]). A missing user means no memory
//!   and no request.
//! - [`HonchoManager`]'s `add` never blocks on HTTP: captures go to a bounded queue served by one
//!   background task, which sends only the messages a durable per-thread cursor has not seen,
//!   in batches of at most 100, each within Honcho's message size limit.
//! - Reads (`get_context`, `get_memory`, `search`) follow `failure_policy.read`.
//!
//! - With the Cargo feature `fake-server`, `fake` is a strict fake Honcho v3 server on
//!   127.0.0.1 for tests (this crate's, the facade's and the CLI's).
//!
//! Deliberate differences from the Python reference are listed in `docs/compat.md` (section
//! "Honcho backend").

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]
#![deny(missing_docs)]

mod capture;
mod client;
pub mod config;
mod cursor;
/// A strict fake Honcho v3 server on 127.0.0.1 for tests (feature `fake-server`; it lives in
/// the testkit, `deermem_testkit::http::honcho`).
#[cfg(feature = "fake-server")]
pub mod fake {
    pub use deermem_testkit::http::honcho::*;
}
pub mod identity;
mod manager;

pub use config::{FailurePolicy, HONCHO_MAX_MESSAGE_CHARS, HonchoConfig};
pub use manager::{
    BACKEND_NAME, HonchoManager, from_backend_config, from_backend_config_with_cursors,
};
