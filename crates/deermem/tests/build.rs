//! Backend selection by `manager_class`: known names build, unknown ones fail naming the known
//! ones, configuration errors name the key, and a backend left out of the build names its
//! Cargo feature (those tests run under `cargo test -p deermem --no-default-features`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use deermem::{BuildError, BuildOptions, build_backend};
use deermem_core::MemoryConfig;

fn config(yaml: &str) -> MemoryConfig {
    deermem::load_config_text(yaml, &|_| None)
        .expect("config parses")
        .memory
}

fn build(cfg: &MemoryConfig, root: &std::path::Path) -> Result<deermem::Backend, BuildError> {
    let env = |_: &str| None;
    let mut opts = BuildOptions::new(&env);
    opts.storage_path = Some(root.to_path_buf());
    build_backend(cfg, opts)
}

#[tokio::test]
async fn unknown_backends_fail_naming_the_known_ones() {
    let dir = tempfile::tempdir().unwrap();
    let err = build(
        &config("memory:\n  manager_class: bogus-backend\n"),
        dir.path(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("bogus-backend")
            && err.contains("deermem, honcho, noop, openviking")
            && err.contains("no fallback"),
        "{err}"
    );
}

#[tokio::test]
async fn noop_builds_in_both_modes() {
    let dir = tempfile::tempdir().unwrap();
    let b = build(
        &config("memory:\n  manager_class: noop\n  mode: tool\n"),
        dir.path(),
    )
    .unwrap();
    assert_eq!(b.class(), "noop");
    assert!(b.manager().searcher().is_some());
}

#[tokio::test]
async fn a_storage_path_naming_a_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("memory.json");
    std::fs::write(&file, "{}").unwrap();
    let err = build(&MemoryConfig::default(), &file)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("existing file") && err.contains("storage_path"),
        "{err}"
    );
}

#[cfg(feature = "embedded")]
#[tokio::test]
async fn deermem_builds_and_reports_config_errors_by_key() {
    let dir = tempfile::tempdir().unwrap();
    let b = build(&MemoryConfig::default(), dir.path()).unwrap();
    assert_eq!(b.class(), "deermem");
    assert!(b.deermem().is_some());
    let err = build(
        &config("memory:\n  backend_config:\n    max_facts: 5\n"),
        dir.path(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("memory.backend_config.max_facts") && err.contains("10 and 500"),
        "{err}"
    );
    let err = build(
        &config("memory:\n  backend_config:\n    model: {model: m, base_url: 'ftp://x'}\n"),
        dir.path(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("base_url"), "{err}");
}

#[cfg(not(feature = "honcho"))]
#[tokio::test]
async fn honcho_left_out_names_its_feature() {
    let dir = tempfile::tempdir().unwrap();
    let err = build(&config("memory:\n  manager_class: honcho\n"), dir.path())
        .unwrap_err()
        .to_string();
    assert!(err.contains("feature `honcho`"), "{err}");
}

#[cfg(not(feature = "openviking"))]
#[tokio::test]
async fn openviking_left_out_names_its_feature() {
    let dir = tempfile::tempdir().unwrap();
    let err = build(
        &config("memory:\n  manager_class: openviking\n"),
        dir.path(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("feature `openviking`"), "{err}");
}

#[cfg(not(feature = "engine"))]
#[tokio::test]
async fn deermem_left_out_names_its_feature() {
    let dir = tempfile::tempdir().unwrap();
    let err = build(&MemoryConfig::default(), dir.path())
        .unwrap_err()
        .to_string();
    assert!(err.contains("feature `engine`"), "{err}");
}
