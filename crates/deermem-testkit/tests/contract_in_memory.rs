//! The storage contract suite run against the in-memory fake.

#![allow(clippy::unwrap_used, clippy::expect_used)]

deermem_testkit::storage_contract!(deermem_testkit::storage::in_memory_fixture());
