//! The Python reference's storage roots committed under `testdata/python-deermem/`, and a helper
//! that copies one into a scratch directory so a test can write to it.
//!
//! The fixtures are part of the repository (a fresh clone has them); a missing directory means a
//! broken checkout, so the accessors panic with the path instead of letting a test skip.

use std::path::{Path, PathBuf};

use deermem_core::{AgentName, UserId};

/// `testdata/python-deermem/` at the workspace root: `v2-root`, `v1-root`, `v1-migrated` and
/// `expected.json`, all written by the Python reference (see its README).
///
/// # Panics
/// When the directory or its `expected.json` is missing (the checkout is incomplete).
#[must_use]
pub fn python_deermem() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/python-deermem");
    assert!(
        dir.join("expected.json").is_file(),
        "the reference fixtures are missing at {} (they are committed with the repository; is the checkout complete?)",
        dir.display()
    );
    dir
}

/// `python_deermem()/<name>`, checked to exist (`v2-root`, `v1-root`, `v1-migrated`,
/// `expected.json`).
///
/// # Panics
/// When that entry is missing.
#[must_use]
pub fn python_deermem_path(name: &str) -> PathBuf {
    let path = python_deermem().join(name);
    assert!(path.exists(), "fixture {} is missing", path.display());
    path
}

/// The reference's `expected.json`: its own view of the fixture roots.
///
/// # Panics
/// When the file cannot be read or is not JSON.
#[must_use]
pub fn python_expected() -> serde_json::Value {
    let path = python_deermem_path("expected.json");
    let raw = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("cannot read fixture {}: {e}", path.display()));
    serde_json::from_slice(&raw)
        .unwrap_or_else(|e| panic!("fixture {} is not JSON: {e}", path.display()))
}

/// Copies the directory tree `src` into `dst` (created when missing), files made writable, so a
/// test can let the engine migrate or modify a fixture root without touching the committed copy.
///
/// # Panics
/// On any I/O error.
pub fn copy_tree(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap_or_else(|e| panic!("cannot create {}: {e}", dst.display()));
    let entries =
        std::fs::read_dir(src).unwrap_or_else(|e| panic!("cannot list {}: {e}", src.display()));
    for entry in entries {
        let entry = entry.unwrap_or_else(|e| panic!("cannot list {}: {e}", src.display()));
        let from = entry.path();
        let to = dst.join(entry.file_name());
        let kind = entry
            .file_type()
            .unwrap_or_else(|e| panic!("cannot stat {}: {e}", from.display()));
        if kind.is_dir() {
            copy_tree(&from, &to);
        } else {
            let bytes = std::fs::read(&from)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", from.display()));
            std::fs::write(&to, bytes)
                .unwrap_or_else(|e| panic!("cannot write {}: {e}", to.display()));
        }
    }
}

/// A user id the suites know to be valid.
pub(crate) fn user(s: &str) -> UserId {
    UserId::new(s).unwrap_or_else(|e| panic!("test user id {s:?}: {e}"))
}

/// An agent name the suites know to be valid.
pub(crate) fn agent(s: &str) -> AgentName {
    AgentName::parse(s).unwrap_or_else(|e| panic!("test agent {s:?}: {e}"))
}
