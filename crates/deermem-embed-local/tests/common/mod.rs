//! Finding the real model for the tests: `$DEERMEM_TEST_MODEL_DIR` (set by `cargo xtask ci`),
//! else the cache `cargo xtask model fetch` fills. A test that cannot find it fails, saying
//! the command to run; it never passes without the model.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use deermem_embed_local::{LocalEmbedder, REQUIRED_FILES};

/// The model directory, or a failure naming the command that fetches it.
pub(crate) fn model_dir() -> PathBuf {
    let dir = match std::env::var_os("DEERMEM_TEST_MODEL_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => {
            let cache = match std::env::var_os("DEERMEM_MODEL_CACHE") {
                Some(c) if !c.is_empty() => PathBuf::from(c),
                _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/models"),
            };
            cache.join("all-MiniLM-L6-v2")
        }
    };
    let missing: Vec<_> = REQUIRED_FILES
        .iter()
        .filter(|f| !dir.join(f).is_file())
        .collect();
    assert!(
        missing.is_empty(),
        "the local embedding model is not in {} (missing {missing:?}): run `cargo xtask model \
         fetch` in the workspace (or set DEERMEM_TEST_MODEL_DIR to a directory holding it)",
        dir.display()
    );
    dir
}

/// The model, loaded once per test binary (batches of 32).
pub(crate) fn embedder() -> LocalEmbedder {
    static MODEL: OnceLock<LocalEmbedder> = OnceLock::new();
    MODEL
        .get_or_init(|| LocalEmbedder::load(model_dir(), 32).expect("load the model"))
        .clone()
}

/// Cosine similarity of two vectors.
pub(crate) fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let na: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}
