//! `cargo xtask bench [--quick] [--corpus FILE] [--queries FILE] [--json OUT] [...]`: builds the
//! `deermem-bench` harness in release mode and runs it with the arguments passed through. Each
//! workload runs in its own child process on a fresh temporary root; see `docs/benchmarks.md`.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// The release binary `name` under the target directory (`$CARGO_TARGET_DIR` or
/// `<root>/target`).
pub(crate) fn release_binary(root: &Path, name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|t| if t.is_absolute() { t } else { root.join(t) })
        .unwrap_or_else(|| root.join("target"));
    target
        .join("release")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX))
}

pub(crate) fn run(root: &Path, args: &[String]) -> ExitCode {
    run_release(root, "bench", "deermem-bench", args)
}

/// Builds the binary of `package` (named like it) in release mode and runs it with `args`.
pub(crate) fn run_release(root: &Path, task: &str, package: &str, args: &[String]) -> ExitCode {
    if !crate::run(
        &format!("{task}-build"),
        &crate::cargo(),
        &["build", "--release", "--locked", "-p", package],
        &[],
    ) {
        return ExitCode::FAILURE;
    }
    let exe = release_binary(root, package);
    eprintln!("\n==> [{task}] {} {}", exe.display(), args.join(" "));
    match Command::new(&exe).args(args).current_dir(root).status() {
        Ok(s) if s.success() => ExitCode::SUCCESS,
        Ok(s) => {
            eprintln!("cargo xtask {task}: {package} failed ({s})");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("cargo xtask {task}: could not start {}: {e}", exe.display());
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_binary_lives_in_the_release_target_dir() {
        let p = release_binary(Path::new("/repo"), "deermem-bench");
        assert!(p.ends_with(format!(
            "release/deermem-bench{}",
            std::env::consts::EXE_SUFFIX
        )));
    }
}
