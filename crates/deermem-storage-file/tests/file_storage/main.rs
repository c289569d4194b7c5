//! Integration tests of the file storage beyond the contract suite: the reference's fixtures,
//! layout and format details, migration, crash recovery, concurrency, hostile input, Python
//! interoperability and the retrieval integration.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cache;
mod concurrency;
mod crash;
mod fixtures;
mod hostile;
mod interop;
mod layout;
mod migration;
mod retrieval;
#[allow(dead_code)]
mod support;
