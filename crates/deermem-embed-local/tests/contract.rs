//! The embedder contract suite against the real all-MiniLM-L6-v2 model (see `common` for where
//! it comes from). The model has no failure to inject; `load_errors.rs` covers its failures.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use deermem_testkit::embedder::EmbedderFixture;

async fn fixture() -> EmbedderFixture {
    EmbedderFixture {
        embedder: Arc::new(common::embedder()),
        break_next: None,
        guard: Box::new(()),
    }
}

deermem_testkit::embedder_contract!(fixture());
