//! Loopback HTTP test doubles of the remote services (Cargo feature `http`): strict fakes of
//! Honcho ([`honcho`]), OpenViking ([`openviking`]) and an OpenAI-compatible chat-completions
//! server ([`openai`]), the real OpenViking server from PyPI with a stub model server
//! ([`openviking_server`]), and the scaffolding they share: [`Server`] (an axum router on an
//! ephemeral 127.0.0.1 port), [`started`] and a poison-tolerant [`lock`].
//!
//! The adapters re-export their double behind their `fake-server` / `real-server` features, so
//! the hosts' tests (facade, CLI) reach them where they always did. Production builds never
//! enable the feature.

pub mod honcho;
pub mod openai;
pub mod openviking;
pub mod openviking_server;

use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard, PoisonError};

pub use axum;
use axum::Router;

/// A router served on an ephemeral loopback port by a task on the current tokio runtime. The
/// server runs until the runtime stops, or until [`Server::abort`].
#[derive(Debug)]
pub struct Server {
    /// The address it listens on.
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    /// Binds `127.0.0.1:0` and serves `router`; `name` names the server in its error log.
    ///
    /// # Errors
    /// No loopback port could be bound.
    pub async fn start(router: Router, name: &'static str) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, router).await {
                tracing::error!(error = %e, "{name} stopped");
            }
        });
        Ok(Self { addr, task })
    }

    /// `http://127.0.0.1:PORT` followed by `path`.
    #[must_use]
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Stops the server.
    pub fn abort(&self) {
        self.task.abort();
    }
}

/// The value of a `try_start`, or a panic naming the server (for tests).
///
/// # Panics
/// When `started` is an error.
pub fn started<T>(started: std::io::Result<T>, name: &str) -> T {
    match started {
        Ok(v) => v,
        Err(e) => panic!("cannot start the {name} on 127.0.0.1: {e}"),
    }
}

/// Locks a mutex, taking over a poisoned one (a panicking test must not hide the fake's
/// state from the next assertion).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
