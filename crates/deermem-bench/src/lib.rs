//! DeerMem benchmark harness: the named workloads of `cargo xtask bench`, run in-process
//! through the real storage, retrieval, updater, manager and gateway crates.
//!
//! - [`corpus`]: the fact corpus and query list (JSON lines / one query per line, or generated
//!   with a fixed seed), so other implementations can be measured on identical data.
//! - [`workloads`]: one function per named workload, each on a fresh temporary root.
//! - [`runner`]: the parent process, which runs every workload in its own child process (so its
//!   peak RSS is its own), prints the table and writes the JSON report.
//! - [`stats`], [`machine`]: latency summaries, peak RSS and the machine description.
//! - [`http`]: a minimal HTTP/1.1 keep-alive client for the gateway workload.
//! - [`scale`]: `deermem-bench scale`, the cost of the main operations as the store grows.

// A measurement harness: a workload whose setup fails aborts the run with the reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![deny(missing_docs)]

pub mod chart;
pub mod corpus;
pub mod http;
pub mod machine;
pub mod runner;
pub mod scale;
pub mod sizes;
pub mod stats;
pub mod workloads;

pub use sizes::Sizes;
pub use stats::{Summary, WorkloadResult};
