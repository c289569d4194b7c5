//! DeerMem facade: load configuration, then build the memory backend that `manager_class`
//! names (`deermem`, `noop`, `honcho`, `openviking`). Each adapter sits behind a Cargo feature;
//! the default features give the embedded engine and both remote backends.

#![deny(missing_docs)]

mod clock;
mod config_file;
mod noop;
pub mod tools;

pub use clock::SystemClock;
pub use config_file::{load_config_file, load_config_text, process_env, resolve_storage_root, ConfigFileError};
pub use deermem_core as core;
pub use noop::NoopManager;
