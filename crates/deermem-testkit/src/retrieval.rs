//! The retrieval contract suite and the in-memory substring index fake.
