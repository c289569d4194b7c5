//! Cached Python virtual environments for tests that drive a real component published on PyPI
//! (an MCP client SDK, an OpenViking server, PyYAML): created once per machine, reused after.
//!
//! A test asks for an environment by name and requirement list; the first caller creates it
//! under a cross-process lock (several test binaries may ask at once), later callers find the
//! ready marker and return at once. When Python or the registry is missing, the error says what
//! is missing, and the calling test fails with it: it never passes silently.

use std::fmt::Write as _;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The directory holding every cached environment: `$DEERMEM_PYENV_DIR`, else
/// `$HOME/.cache/deermem/pyenv` (outside any clone, so a fresh clone reuses it), else the system
/// temporary directory.
#[must_use]
pub fn base_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("DEERMEM_PYENV_DIR") {
        return PathBuf::from(dir);
    }
    match std::env::var_os("HOME") {
        Some(home) => PathBuf::from(home).join(".cache/deermem/pyenv"),
        None => std::env::temp_dir().join("deermem-pyenv"),
    }
}

/// A ready virtual environment.
#[derive(Debug, Clone)]
pub struct PyEnv {
    /// The environment's root directory.
    pub dir: PathBuf,
}

impl PyEnv {
    /// The environment's `python`.
    #[must_use]
    pub fn python(&self) -> PathBuf {
        self.dir.join("bin/python")
    }

    /// An executable the environment's packages installed (`bin/<name>`).
    #[must_use]
    pub fn bin(&self, name: &str) -> PathBuf {
        self.dir.join("bin").join(name)
    }
}

/// The interpreter used to create environments: `$DEERMEM_PYTHON`, else `python3`.
fn host_python() -> String {
    std::env::var("DEERMEM_PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

fn run(cmd: &mut Command, what: &str) -> Result<String, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("{what}: could not start {:?}: {e}", cmd.get_program()))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{what} failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Checks the host interpreter is CPython 3.10 or newer.
fn check_host_python(python: &str) -> Result<(), String> {
    let version = run(
        Command::new(python).args([
            "-c",
            "import sys; print('%d.%d' % sys.version_info[:2])",
        ]),
        "checking the Python version",
    )
    .map_err(|e| {
        format!("{e}\nPython 3.10 or newer is required (install python3 with venv and pip, or set DEERMEM_PYTHON)")
    })?;
    let mut parts = version.trim().split('.');
    let major: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    if (major, minor) < (3, 10) {
        return Err(format!(
            "{python} is Python {}; 3.10 or newer is required (set DEERMEM_PYTHON)",
            version.trim()
        ));
    }
    Ok(())
}

/// Returns the environment `name` with `requirements` (pip requirement strings, e.g.
/// `"mcp==1.2.0"`) installed, creating it when missing or when its requirements changed.
///
/// # Errors
/// A message naming what is missing (Python, `venv`, the package index) with the failing
/// command's output.
pub fn ensure(name: &str, requirements: &[&str]) -> Result<PyEnv, String> {
    ensure_in(&base_dir(), name, requirements)
}

/// [`ensure`] with the environment under `base` instead of [`base_dir`].
///
/// # Errors
/// As [`ensure`].
pub fn ensure_in(base: &Path, name: &str, requirements: &[&str]) -> Result<PyEnv, String> {
    let base = base.to_path_buf();
    fs::create_dir_all(&base).map_err(|e| format!("cannot create {}: {e}", base.display()))?;
    let dir = base.join(name);
    let marker = dir.join(".deermem-ready");
    // The marker names the environment's own path too: a virtual environment is not
    // relocatable (its scripts' `#!` lines name it), so one copied or moved here is rebuilt.
    let mut wanted = format!("# {}\n", dir.display());
    for r in requirements {
        let _ = writeln!(wanted, "{r}");
    }
    if ready(&marker, &wanted) {
        return Ok(PyEnv { dir });
    }
    let lock_path = base.join(format!("{name}.lock"));
    let lock = File::create(&lock_path)
        .map_err(|e| format!("cannot create {}: {e}", lock_path.display()))?;
    lock.lock()
        .map_err(|e| format!("cannot lock {}: {e}", lock_path.display()))?;
    if ready(&marker, &wanted) {
        return Ok(PyEnv { dir });
    }
    let python = host_python();
    check_host_python(&python)?;
    if dir.exists() {
        fs::remove_dir_all(&dir).map_err(|e| format!("cannot remove {}: {e}", dir.display()))?;
    }
    eprintln!(
        "creating the Python environment {} ({}); this happens once per machine",
        dir.display(),
        requirements.join(" ")
    );
    run(
        Command::new(&python).arg("-m").arg("venv").arg(&dir),
        "creating a virtual environment (python3 -m venv)",
    )?;
    let env = PyEnv { dir };
    if !requirements.is_empty() {
        run(
            Command::new(env.python())
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                ])
                .args(requirements),
            &format!(
                "installing {} from the package index (pip install)",
                requirements.join(" ")
            ),
        )?;
    }
    fs::write(&marker, &wanted).map_err(|e| format!("cannot write {}: {e}", marker.display()))?;
    drop(lock);
    Ok(env)
}

fn ready(marker: &Path, wanted: &str) -> bool {
    fs::read_to_string(marker).is_ok_and(|have| have == wanted)
}

/// [`ensure`], panicking with its message: for tests, which must fail (not skip) when the real
/// component cannot be installed.
///
/// # Panics
/// When the environment cannot be created.
#[must_use]
pub fn require(name: &str, requirements: &[&str]) -> PyEnv {
    ensure(name, requirements).unwrap_or_else(|e| {
        panic!("this test needs the Python environment `{name}` and it could not be prepared: {e}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A virtual environment moved to another place is rebuilt there: its scripts' `#!` lines
    /// still name the old place, so the marker names the path it was built at.
    #[test]
    fn an_environment_moved_elsewhere_is_rebuilt() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        let built = ensure_in(&a, "env", &[]).expect("a venv");
        let marker =
            |base: &Path| fs::read_to_string(base.join("env/.deermem-ready")).expect("marker");
        assert!(marker(&a).contains(&built.dir.display().to_string()));
        fs::create_dir_all(&b).expect("mkdir");
        fs::rename(a.join("env"), b.join("env")).expect("move");
        let moved = ensure_in(&b, "env", &[]).expect("rebuilt");
        assert_eq!(moved.dir, b.join("env"));
        assert!(
            marker(&b).contains(&b.join("env").display().to_string()),
            "{}",
            marker(&b)
        );
        assert!(moved.python().exists());
    }
}
