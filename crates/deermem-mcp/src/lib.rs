//! DeerMem's memory tools as a Model Context Protocol server, built on the official Rust SDK
//! (`rmcp`). Any [`MemoryManager`](deermem_core::ports::MemoryManager) backend is served
//! through the same dispatcher tool mode uses ([`deermem::tools::dispatch`]):
//!
//! - tools `memory_search`, `memory_add`, `memory_update`, `memory_delete` (as the backend's
//!   capabilities allow) and `memory_context` (the `<memory>` injection block);
//! - the read-only resource `memory://facts` (the caller's facts as JSON).
//!
//! Two transports: [`serve_stdio`] (one user per process, line-delimited JSON-RPC) and
//! [`http_router`] (streamable HTTP; the user comes from the `Authorization: Bearer` token).

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]
#![deny(missing_docs)]

mod error;
mod handler;
mod http;
mod jsonrpc;
mod stdio;

pub use error::McpServeError;
pub use handler::{
    AuthenticatedUser, EMPTY_CONTEXT_BLOCK, FACTS_RESOURCE_URI, MEMORY_CONTEXT, McpIdentity,
    MemoryMcpServer,
};
pub use http::{
    DEFAULT_MAX_BODY_BYTES, DEFAULT_PATH, HttpOptions, InvalidOrigin, TokenAuth, check_cors_origin,
    http_router, http_router_with, serve_http, serve_http_with,
};
pub use stdio::{MAX_LINE_BYTES, serve_io, serve_stdio};
