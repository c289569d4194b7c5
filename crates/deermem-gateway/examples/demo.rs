//! Serves the gateway over the in-memory recording manager the tests use, to try the HTTP API
//! with curl: `cargo run -p deermem-gateway --example demo -- [config.yaml]`. The config file
//! is a DeerFlow `config.yaml` (its `memory:` and `gateway:` sections); without one the
//! defaults apply (no auth, 127.0.0.1:8765). Run events are journaled in a temporary
//! directory (`GET /api/threads/{thread_id}/runs/{run_id}/events`). Stop it with Ctrl-C.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::error::Error;
use std::path::Path;
use std::sync::Arc;

use deermem_gateway::{GatewayConfig, GatewayState, serve};
use deermem_storage_file::{RunJournal, RunJournalOptions};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let path = std::env::args().nth(1);
    let text = match &path {
        Some(p) => std::fs::read_to_string(p)?,
        None => String::new(),
    };
    let loaded = deermem::load_config_text(&text, &|k| std::env::var(k).ok())?;
    let base = path.as_deref().and_then(|p| Path::new(p).parent());
    let gateway = GatewayConfig::from_root_in(&loaded.root, base)?;
    let listener = tokio::net::TcpListener::bind(gateway.bind).await?;
    let runs = tempfile::tempdir()?;
    let journal = RunJournal::open(runs.path(), RunJournalOptions::default())?;
    let state = GatewayState::new(common::FakeManager::new(), loaded.memory, gateway)
        .with_run_journal(Arc::new(journal));
    serve(listener, state, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}
