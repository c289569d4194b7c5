//! DeerMem facade: load configuration, then build the memory backend that `manager_class`
//! names (`deermem`, `noop`, `honcho`, `openviking`). Each adapter sits behind a Cargo feature;
//! the default features give the embedded engine and both remote backends.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]
#![deny(missing_docs)]

mod build;
mod clock;
mod config_file;
mod config_text;
#[cfg(feature = "storage-file")]
pub mod embedded;
mod import_scan;
mod noop;
mod shown;
pub mod tools;
#[cfg(feature = "transfer")]
pub mod transfer;

pub use build::{
    Backend, BuildError, BuildOptions, KNOWN_BACKENDS, build_backend, build_manager, storage_root,
};
pub use clock::SystemClock;
pub use config_file::{ConfigFileError, load_config_file, process_env, resolve_storage_root};
pub use config_text::{
    LoadedConfig, env_reference, load_config_text, memory_config_from_section, parse_config_text,
    resolve_env,
};
pub use deermem_core as core;
pub use import_scan::import_fact_count;
pub use noop::NoopManager;
pub use shown::{shown_backend_config, url_without_credentials};
