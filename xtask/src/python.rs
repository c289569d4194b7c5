//! The `python` step of `cargo xtask ci`: builds the `deermem_rs` wheel from the current
//! source the way an operator installs from source (pip through the package's PEP 517 build
//! backend, maturin; one release build), installs that wheel into a fresh virtual environment
//! under `target/deermem-py/`, declares it in a small uv-managed project and checks that
//! `uv sync` keeps it, then runs the package's pytest suite against the workspace's `deermem`
//! CLI.
//!
//! The tools come from PyPI once per machine: maturin in a cached environment, pytest,
//! pydantic and uv as wheels in a cached wheelhouse beside it (`$DEERMEM_PYENV_DIR`, else
//! `~/.cache/deermem/pyenv/deermem-py-tools`), so each run installs offline from there.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// Pinned tools: the wheel builder, and the test suite's own requirements.
const MATURIN: &str = "maturin==1.16.0";
const TEST_REQUIREMENTS: [&str; 2] = ["pytest==9.2.0", "pydantic==2.14.4"];
/// The project manager DeerFlow uses, for the installation check.
const UV: &str = "uv==0.13.8";
const TOOLS_ENV: &str = "deermem-py-tools";

/// Runs a command, echoing it; `Err` carries what failed.
fn run(what: &str, cmd: &mut Command) -> Result<(), String> {
    eprintln!("    $ {cmd:?}");
    match cmd.status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("{what} failed ({s})")),
        Err(e) => Err(format!(
            "{what}: could not start {:?}: {e}",
            cmd.get_program()
        )),
    }
}

/// Runs one timed sub-step.
fn timed<T>(name: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    let started = Instant::now();
    let out = f();
    eprintln!(
        "    [python/{name}] {} in {:.1}s",
        if out.is_ok() { "ok" } else { "FAILED" },
        started.elapsed().as_secs_f64()
    );
    out
}

/// The interpreter: `$DEERMEM_PYTHON`, else `python3` (CPython 3.10 or newer).
fn host_python() -> Result<String, String> {
    let python = std::env::var("DEERMEM_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let out = Command::new(&python)
        .args(["-c", "import sys; print(sys.version_info >= (3, 10))"])
        .output()
        .map_err(|e| format!("{python} could not start ({e}); Python 3.10 or newer is required (set DEERMEM_PYTHON)"))?;
    if String::from_utf8_lossy(&out.stdout).trim() != "True" {
        return Err(format!(
            "{python} is not Python 3.10 or newer (set DEERMEM_PYTHON)"
        ));
    }
    Ok(python)
}

fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("DEERMEM_PYENV_DIR") {
        return PathBuf::from(dir);
    }
    match std::env::var_os("HOME") {
        Some(home) => PathBuf::from(home).join(".cache/deermem/pyenv"),
        None => std::env::temp_dir().join("deermem-pyenv"),
    }
}

/// The cached tools (maturin, and a wheelhouse with the test requirements), created once per
/// machine under a lock; returns the environment's directory.
fn tools(python: &str) -> Result<PathBuf, String> {
    let base = cache_dir();
    fs::create_dir_all(&base).map_err(|e| format!("cannot create {}: {e}", base.display()))?;
    let dir = base.join(TOOLS_ENV);
    let marker = dir.join(".deermem-ready");
    let wanted = format!("{MATURIN}\n{}\n{UV}\n", TEST_REQUIREMENTS.join("\n"));
    let ready = || fs::read_to_string(&marker).is_ok_and(|m| m == wanted);
    if ready() {
        return Ok(dir);
    }
    let lock_path = base.join(format!("{TOOLS_ENV}.lock"));
    let lock = File::create(&lock_path)
        .map_err(|e| format!("cannot create {}: {e}", lock_path.display()))?;
    lock.lock()
        .map_err(|e| format!("cannot lock {}: {e}", lock_path.display()))?;
    if ready() {
        return Ok(dir);
    }
    if dir.exists() {
        fs::remove_dir_all(&dir).map_err(|e| format!("cannot remove {}: {e}", dir.display()))?;
    }
    eprintln!("    creating {} (once per machine)", dir.display());
    run(
        "creating the tools environment",
        Command::new(python).arg("-m").arg("venv").arg(&dir),
    )?;
    let pip = dir.join("bin/python");
    run(
        "installing maturin from PyPI",
        Command::new(&pip)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .arg(MATURIN),
    )?;
    run(
        "downloading the test requirements from PyPI",
        Command::new(&pip)
            .args([
                "-m",
                "pip",
                "wheel",
                "--quiet",
                "--disable-pip-version-check",
                "-w",
            ])
            .arg(dir.join("wheelhouse"))
            .args(TEST_REQUIREMENTS)
            .arg(UV),
    )?;
    fs::write(&marker, wanted).map_err(|e| format!("cannot write {}: {e}", marker.display()))?;
    Ok(dir)
}

fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from)
}

/// Builds the wheel from the current source as `pip install ./crates/deermem-py` does (pip
/// calling the package's PEP 517 backend, maturin, which makes a release build); returns its
/// path.
fn build_wheel(root: &Path, tools: &Path) -> Result<PathBuf, String> {
    let out = target_dir(root).join("deermem-py/wheels");
    if out.exists() {
        fs::remove_dir_all(&out).map_err(|e| format!("cannot clear {}: {e}", out.display()))?;
    }
    run(
        "pip wheel ./crates/deermem-py (maturin as the build backend)",
        Command::new(tools.join("bin/python"))
            .args([
                "-m",
                "pip",
                "wheel",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "--no-build-isolation",
                "-w",
            ])
            .arg(&out)
            .arg(root.join("crates/deermem-py"))
            .current_dir(root)
            // The backend runs `maturin` by name: the tools' environment comes first on PATH,
            // as it would for an activated environment.
            .env("PATH", path_with(&tools.join("bin")))
            .env("MATURIN_PEP517_ARGS", "--locked")
            .env("PYO3_BUILD_EXTENSION_MODULE", "1"),
    )?;
    let wheels: Vec<PathBuf> = fs::read_dir(&out)
        .map_err(|e| format!("cannot read {}: {e}", out.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect();
    match wheels.as_slice() {
        [one] => Ok(one.clone()),
        other => Err(format!(
            "expected one wheel in {}, found {other:?}",
            out.display()
        )),
    }
}

/// `PATH` with `dir` in front.
fn path_with(dir: &Path) -> std::ffi::OsString {
    let mut parts = vec![dir.to_path_buf()];
    if let Some(old) = std::env::var_os("PATH") {
        parts.extend(std::env::split_paths(&old));
    }
    std::env::join_paths(parts).unwrap_or_else(|_| dir.as_os_str().to_owned())
}

/// The smallest program that proves the package works where it was installed.
const IMPORT_CHECK: &str = r#"
import tempfile, deermem_rs
with tempfile.TemporaryDirectory() as d:
    m = deermem_rs.DeerMemManager(backend_config={"storage_path": d})
    m.create_fact("User installs with uv", user_id="u")
    assert m.get_memory(user_id="u")["facts"][0]["content"] == "User installs with uv"
    m.close()
print("deermem_rs", deermem_rs.__version__, "imports and stores")
"#;

/// A uv-managed project (as DeerFlow is) that declares the wheel in its `pyproject.toml`
/// under `[tool.uv.sources]`: `uv sync` installs it, a package installed beside it without
/// being declared is removed by the next `uv sync`, and the declared one stays importable.
/// uv itself comes from the wheelhouse into an environment of its own; everything is offline.
fn uv_project(root: &Path, tools: &Path, python: &str, wheel: &Path) -> Result<(), String> {
    let base = target_dir(root).join("deermem-py");
    let uv_env = base.join("uv-env");
    run(
        "creating the uv environment",
        Command::new(python)
            .args(["-m", "venv", "--clear"])
            .arg(&uv_env),
    )?;
    run(
        "installing uv",
        Command::new(uv_env.join("bin/python"))
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-index",
                "--find-links",
            ])
            .arg(tools.join("wheelhouse"))
            .arg(UV),
    )?;
    let project = base.join("uv-project");
    if project.exists() {
        fs::remove_dir_all(&project)
            .map_err(|e| format!("cannot clear {}: {e}", project.display()))?;
    }
    fs::create_dir_all(&project)
        .map_err(|e| format!("cannot create {}: {e}", project.display()))?;
    let wheel = wheel
        .to_str()
        .ok_or_else(|| format!("{} is not valid UTF-8", wheel.display()))?;
    let manifest = format!(
        "[project]\nname = \"host-app\"\nversion = \"0.1.0\"\nrequires-python = \">=3.10\"\n\
         dependencies = [\"deermem-rs\"]\n\n[tool.uv.sources]\ndeermem-rs = {{ path = {} }}\n",
        toml_string(wheel)
    );
    fs::write(project.join("pyproject.toml"), manifest)
        .map_err(|e| format!("cannot write the uv project: {e}"))?;
    let uv = || {
        let mut c = Command::new(uv_env.join("bin/uv"));
        c.current_dir(&project)
            .env("UV_CACHE_DIR", base.join("uv-cache"))
            .env("UV_PYTHON_DOWNLOADS", "never")
            .env("UV_OFFLINE", "1");
        c
    };
    let venv_python = project.join(".venv/bin/python");
    run("uv sync", uv().args(["sync", "--python", python]))?;
    run(
        "importing deermem_rs after uv sync",
        Command::new(&venv_python).args(["-c", IMPORT_CHECK]),
    )?;
    run(
        "installing an undeclared package beside it",
        uv().args(["pip", "install", "--no-index", "--find-links"])
            .arg(tools.join("wheelhouse"))
            .arg("iniconfig"),
    )?;
    run("uv sync again", uv().args(["sync", "--python", python]))?;
    run(
        "importing deermem_rs after the second uv sync",
        Command::new(&venv_python).args(["-c", IMPORT_CHECK]),
    )?;
    let removed = Command::new(&venv_python)
        .args(["-c", "import iniconfig"])
        .output()
        .map_err(|e| format!("could not start {}: {e}", venv_python.display()))?;
    if removed.status.success() {
        return Err(
            "uv sync kept a package the project does not declare; the check proves nothing".into(),
        );
    }
    Ok(())
}

/// A TOML basic string.
fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A fresh environment with the wheel and the test requirements (offline, from the
/// wheelhouse); returns its `python`.
fn install(root: &Path, tools: &Path, python: &str, wheel: &Path) -> Result<PathBuf, String> {
    let venv = target_dir(root).join("deermem-py/venv");
    run(
        "creating a fresh virtual environment",
        Command::new(python)
            .args(["-m", "venv", "--clear"])
            .arg(&venv),
    )?;
    let py = venv.join("bin/python");
    run(
        "installing the wheel",
        Command::new(&py)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-index",
                "--find-links",
            ])
            .arg(tools.join("wheelhouse"))
            .args(TEST_REQUIREMENTS)
            .arg(wheel),
    )?;
    Ok(py)
}

/// The step: returns whether it passed.
pub(crate) fn run_step(root: &Path, cargo: &str) -> bool {
    let started = Instant::now();
    let result = (|| -> Result<(), String> {
        let python = host_python()?;
        let tools = timed("tools", || tools(&python))?;
        let wheel = timed("wheel", || build_wheel(root, &tools))?;
        let venv_python = timed("install", || install(root, &tools, &python, &wheel))?;
        timed("uv", || uv_project(root, &tools, &python, &wheel))?;
        // The CLI binary exactly as the `test` step builds it (that step's build makes this a
        // no-op in `ci`; a plain `cargo build` would enable other features and rebuild).
        timed("cli", || {
            run(
                "building the deermem CLI",
                Command::new(cargo)
                    .args([
                        "test",
                        "--workspace",
                        "--all-features",
                        "--locked",
                        "--no-run",
                    ])
                    .current_dir(root),
            )
        })?;
        let cli = target_dir(root).join("debug/deermem");
        // Run from target/ so the source tree's `deermem_rs` never shadows the installed one.
        timed("pytest", || {
            run(
                "pytest",
                Command::new(&venv_python)
                    .args(["-m", "pytest", "-p", "no:cacheprovider", "-q"])
                    .arg(root.join("crates/deermem-py/python/tests"))
                    .current_dir(target_dir(root).join("deermem-py"))
                    .env("DEERMEM_CLI", &cli),
            )
        })
    })();
    match result {
        Ok(()) => {
            eprintln!("<== [python] ok in {:.1}s", started.elapsed().as_secs_f64());
            true
        }
        Err(e) => {
            eprintln!(
                "<== [python] FAILED after {:.1}s: {e}",
                started.elapsed().as_secs_f64()
            );
            false
        }
    }
}
