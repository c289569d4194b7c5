//! The error a server run ends with.

use std::io;

/// Why a server (stdio, pipe or HTTP) stopped abnormally.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum McpServeError {
    /// The MCP handshake failed (the peer closed before initializing, or sent a bad
    /// `initialize`).
    #[error("MCP initialization failed: {0}")]
    Initialize(String),
    /// The server task ended abnormally.
    #[error("MCP server task failed: {0}")]
    Task(String),
    /// The identity names a storage bucket derived from another user id (see
    /// [`deermem_core::ids::refuse_derived_bucket`]).
    #[error("refused MCP identity: {0}")]
    Identity(#[from] deermem_core::ids::DerivedBucketId),
    /// The HTTP listener failed.
    #[error("MCP HTTP server failed: {0}")]
    Io(#[from] io::Error),
}
