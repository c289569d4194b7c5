//! Contract suites for every DeerMem port, plus fakes: a manual clock, a scripted language
//! model, and (with the storage suite) an in-memory storage.
//!
//! Each suite is a set of public async functions, one per behaviour, and a macro that expands
//! one named `#[tokio::test]` per behaviour, so an adapter's `tests/contract.rs` is one line and
//! no behaviour can be skipped silently.

pub mod clock;
pub mod llm;
pub mod manager;
pub mod retrieval;
pub mod storage;
