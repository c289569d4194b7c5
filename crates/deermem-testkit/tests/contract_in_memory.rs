//! The storage contract suite run against the in-memory fake.

deermem_testkit::storage_contract!(deermem_testkit::storage::in_memory_fixture());
