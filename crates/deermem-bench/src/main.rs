//! `deermem-bench`: the benchmark harness binary behind `cargo xtask bench` (see the library
//! documentation and `docs/benchmarks.md`).

// A measurement harness: a workload whose setup fails aborts the run with the reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::ExitCode;

use deermem_bench::runner::{self, Args, RESULT_MARKER, USAGE};

fn main() -> ExitCode {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    match raw.first().map(String::as_str) {
        Some("scale") => return scale(&raw[1..]),
        Some("scale-chart") => {
            let (Some(input), Some(output)) = (raw.get(1), raw.get(2)) else {
                eprintln!("usage: deermem-bench scale-chart REPORT.json OUT.svg");
                return ExitCode::from(2);
            };
            return finish((|| {
                let text = std::fs::read_to_string(input)?;
                let report: serde_json::Value = serde_json::from_str(&text)?;
                deermem_bench::scale::write_chart(&report, std::path::Path::new(output))
            })());
        }
        Some("scale-child") => {
            let phase = raw.get(1).map_or("", String::as_str);
            return finish(
                deermem_bench::scale::run_child(phase, raw.get(2..).unwrap_or_default())
                    .map(|v| println!("{RESULT_MARKER}{v}")),
            );
        }
        _ => {}
    }
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

/// `deermem-bench scale ...`.
fn scale(args: &[String]) -> ExitCode {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{}", deermem_bench::scale::USAGE);
        return ExitCode::SUCCESS;
    }
    match deermem_bench::scale::ScaleArgs::parse(args) {
        Ok(a) => finish(deermem_bench::scale::run(&a).map(|_| ())),
        Err(e) => {
            eprintln!("deermem-bench scale: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn finish(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("deermem-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}
