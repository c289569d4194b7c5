//! The native half of the `deermem_rs` Python package: one shared DeerMem engine per
//! configuration in a process, driven from Python threads with the GIL released.
//!
//! The pure-Python half (`python/deermem_rs`) holds the class DeerFlow sees
//! (`deermem_rs.DeerMemManager`) and keeps to argument shapes; this crate is a thin adapter
//! from those calls to the [`deermem_core::ports::MemoryManager`] port built by the facade
//! (`deermem::build_backend`), so `backend_config` keys are exactly the engine's.
//!
//! - `process`: the per-process state (a tokio runtime created on first use, the engines by
//!   configuration), recreated in a child after `fork`.
//! - `engine`: the `Engine` handle the Python class holds, one method per contract operation.
//! - `convert`: Python values, messages and scopes to the engine's types and back.
//! - `errors`: engine errors as the exceptions DeerFlow's router maps.
//! - `hooks`: the host hooks (hidden-message rule, extraction metrics, model-call callbacks,
//!   trace binding) and the host chat model behind the `LanguageModel` port.
//! - `logging`: engine log events forwarded to Python's `logging` (logger `deermem_rs`).

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod convert;
mod engine;
mod errors;
mod hooks;
mod logging;
mod process;

use pyo3::prelude::*;

/// The extension module `deermem_rs._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    logging::install();
    m.add_class::<engine::Engine>()?;
    m.add_function(wrap_pyfunction!(logging::refresh_log_level, m)?)?;
    m.add_function(wrap_pyfunction!(process::runtime_pid, m)?)?;
    m.add("ENGINE_VERSION", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
