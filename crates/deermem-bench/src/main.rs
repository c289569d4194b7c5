//! `deermem-bench`: the benchmark harness binary behind `cargo xtask bench` (see the library
//! documentation and `docs/benchmarks.md`).

// A measurement harness: a workload whose setup fails aborts the run with the reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::ExitCode;

use deermem_bench::runner::{self, Args, RESULT_MARKER, USAGE};

fn main() -> ExitCode {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let args = match Args::parse(&raw) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("deermem-bench: {e:#}");
            return ExitCode::from(2);
        }
    };
    if args.help {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    if args.list {
        for name in args.store.workloads() {
            println!("{name}");
        }
        return ExitCode::SUCCESS;
    }
    let result = if let Some(name) = &args.workload {
        runner::run_child(&args, name).map(|v| println!("{RESULT_MARKER}{v}"))
    } else if args.write_corpus.is_some() || args.write_queries.is_some() {
        runner::export(&args)
    } else {
        runner::run_all(&args).map(|_| ())
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("deermem-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}
