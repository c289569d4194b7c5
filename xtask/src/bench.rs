//! `cargo xtask bench`: the named benchmark workloads (issue 11). The harness lives in the
//! `deermem-bench` binary once it exists; until then this task says so and fails.

use std::path::Path;
use std::process::ExitCode;

pub(crate) fn run(_root: &Path, _args: &[String]) -> ExitCode {
    eprintln!("cargo xtask bench: the benchmark harness is not built yet (tracked by the benchmarks issue)");
    ExitCode::FAILURE
}
