//! The storage contract suite and the in-memory storage fake.
