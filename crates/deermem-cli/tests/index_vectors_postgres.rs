//! Search by meaning through the `deermem` binary with `storage_class: postgres` and the local
//! model: the done-when sentence ("what does the user drink" finds "Prefers oolong tea"),
//! `index status` with the vectors' coverage and `index rebuild` on the database. The model
//! directory is `DEERMEM_TEST_MODEL_DIR` (set by `cargo xtask ci` after `cargo xtask model
//! fetch`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output};

use deermem_testkit::pgcluster::PgCluster;
use serde_json::Value;

fn model_dir() -> String {
    std::env::var("DEERMEM_TEST_MODEL_DIR").unwrap_or_else(|_| {
        panic!(
            "DEERMEM_TEST_MODEL_DIR is not set: run `cargo xtask model fetch` and set it to \
             target/models/all-MiniLM-L6-v2 (cargo xtask ci does both)"
        )
    })
}

fn run(config: &Path, url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_deermem"))
        .env_remove("DEERMEM_CONFIG")
        .env_remove("DEERMEM_DATA_DIR")
        .env_remove("DEER_FLOW_HOME")
        .env("DEERMEM_LOG", "error")
        .env("DEERMEM_TEST_DB", url)
        .arg("--config")
        .arg(config)
        .args(args)
        .output()
        .expect("run deermem")
}

fn ok_json(config: &Path, url: &str, args: &[&str]) -> Value {
    let mut full = vec!["--json"];
    full.extend_from_slice(args);
    let out = run(config, url, &full);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "deermem {args:?}: {text}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}: {text}"))
}

#[test]
fn what_does_the_user_drink_finds_the_tea_on_postgres_and_the_index_commands_show_the_vectors() {
    let model = model_dir();
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "memory:\n  backend_config:\n    storage_class: postgres\n    postgres:\n      url: ${{DEERMEM_TEST_DB}}\n      schema: cli_vectors_{}\n      pool_size: 2\n    embedding:\n      provider: local\n      model_path: {model}\n",
            std::process::id()
        ),
    )
    .unwrap();
    let url = cluster.url();
    let mut tea = String::new();
    for (content, category) in [
        ("Prefers oolong tea", "preference"),
        ("Backend engineer at a robotics startup", "context"),
        ("Has a cat called Miso", "context"),
    ] {
        let added = ok_json(
            &config,
            url,
            &[
                "facts",
                "add",
                "--user",
                "u1",
                "--content",
                content,
                "--category",
                category,
            ],
        );
        if content.contains("tea") {
            tea = added["id"].as_str().expect("the new fact's id").to_owned();
        }
    }
    let hits = ok_json(
        &config,
        url,
        &["search", "--user", "u1", "what does the user drink"],
    );
    assert_eq!(hits[0]["id"], tea.as_str(), "{hits}");

    // The search embedded the facts it ranked; the status counts them in the database.
    let status = ok_json(&config, url, &["index", "status"]);
    assert_eq!(status["vectors"]["embedded"], 3, "{status}");
    assert_eq!(status["vectors"]["total"], 3, "{status}");
    assert_eq!(status["vectors"]["dimension"], 384, "{status}");
    let rebuilt = run(&config, url, &["index", "rebuild", "--user", "u1"]);
    assert_eq!(
        rebuilt.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&rebuilt.stderr)
    );
    let status = ok_json(&config, url, &["index", "status"]);
    assert_eq!(status["vectors"]["embedded"], 3, "{status}");
    drop(cluster);
}
