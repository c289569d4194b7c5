//! DeerMem reliability and security suite: shared pieces of the `reliability` tests and the
//! fuzz targets.
//!
//! - [`workload`]: the crash writer's stream of mixed operations, its acknowledgement log, and
//!   the model the parent checks a recovered root against.
//! - [`verify`]: whole-root checks (every fact file parses, no leftovers, nothing outside the
//!   root) and small measurement helpers.
//! - [`fuzz`]: the bodies of the fuzz targets (`fuzz/fuzz_targets/*.rs` call them; the
//!   `reliability` tests feed them the seed corpora and generated inputs).
//! - [`long_run`]: whether the long runs are enabled (`DEERMEM_LONG=1`).

// The crash and fuzz harness: a broken invariant is reported by panicking the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![deny(missing_docs)]

pub mod fuzz;
pub mod verify;
pub mod workload;

/// The environment variable that enables the long runs.
pub const LONG_ENV: &str = "DEERMEM_LONG";

/// Whether the long runs are enabled (`DEERMEM_LONG=1`).
pub fn long_run() -> bool {
    std::env::var(LONG_ENV).is_ok_and(|v| v == "1")
}

/// `ci` in the CI subset, `long` with `DEERMEM_LONG=1`.
pub fn pick<T>(ci: T, long: T) -> T {
    if long_run() { long } else { ci }
}

/// Prints one measured figure as `FIGURE <test> <name>=<value>` (collected into
/// `docs/reliability.md` from a `--nocapture` run).
pub fn figure(test: &str, name: &str, value: impl std::fmt::Display) {
    println!("FIGURE {test} {name}={value}");
}
