//! `storage_class: postgres` through the `deermem` binary against a throwaway PostgreSQL
//! cluster: `db migrate` (and `--status`) with their versions and the exit code of a newer
//! schema, the data commands on the database, the index commands, the file-only commands'
//! typed refusal, and the URL never printed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output};

use deermem_testkit::pgcluster::PgCluster;
use serde_json::Value;

/// A password that must never be printed (trust authentication ignores it).
const SECRET: &str = "hunter2-never-printed";

fn url_with_password(cluster: &PgCluster) -> String {
    cluster.url().replacen(
        "postgres://deermem@",
        &format!("postgres://deermem:{SECRET}@"),
        1,
    )
}

/// A config file selecting PostgreSQL in `schema`, the URL read from `$DEERMEM_TEST_DB`.
fn write_config(dir: &Path, schema: &str) -> std::path::PathBuf {
    let path = dir.join("config.yaml");
    std::fs::write(
        &path,
        format!(
            "memory:\n  backend_config:\n    storage_class: postgres\n    postgres:\n      url: ${{DEERMEM_TEST_DB}}\n      schema: {schema}\n      pool_size: 2\n"
        ),
    )
    .unwrap();
    path
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

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn ok_json(config: &Path, url: &str, args: &[&str]) -> Value {
    let mut full = vec!["--json"];
    full.extend_from_slice(args);
    let out = run(config, url, &full);
    assert!(out.status.success(), "deermem {args:?}: {}", text(&out));
    assert!(!text(&out).contains(SECRET), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}: {}", text(&out)))
}

#[test]
fn db_migrate_and_the_data_commands_on_postgres() {
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let url = url_with_password(&cluster);
    let dir = tempfile::tempdir().unwrap();
    let schema = format!("cli_{}", std::process::id());
    let config = write_config(dir.path(), &schema);
    let known = deermem_storage_postgres::known_schema_version();

    // A fresh database: no version yet, migrations pending.
    let status = ok_json(&config, &url, &["db", "migrate", "--status"]);
    assert_eq!(status["version"], Value::Null, "{status}");
    assert_eq!(status["known"], known);
    assert_eq!(status["pending"], true);
    let human = run(&config, &url, &["db", "migrate", "--status"]);
    assert!(
        text(&human).contains("migrations pending"),
        "{}",
        text(&human)
    );

    // Migrate: from none to this build's version, every version applied; then nothing to do.
    let m = ok_json(&config, &url, &["db", "migrate"]);
    assert_eq!(m["from"], Value::Null, "{m}");
    assert_eq!(m["to"], known);
    assert_eq!(m["applied"], Value::from((1..=known).collect::<Vec<_>>()));
    let again = run(&config, &url, &["db", "migrate"]);
    assert!(again.status.success(), "{}", text(&again));
    assert!(
        String::from_utf8_lossy(&again.stdout)
            .contains(&format!("version {known} -> {known} (nothing to apply)")),
        "{}",
        text(&again)
    );
    assert_eq!(
        ok_json(&config, &url, &["db", "migrate", "--status"])["pending"],
        false
    );

    // The data commands work on the database.
    let added = ok_json(
        &config,
        &url,
        &[
            "facts",
            "add",
            "--user",
            "alice",
            "--content",
            "Alice drinks oolong tea",
            "--category",
            "preference",
            "--confidence",
            "0.9",
        ],
    );
    let id = added["id"].as_str().expect("the new fact's id").to_owned();
    let listed = ok_json(&config, &url, &["facts", "list", "--user", "alice"]);
    assert_eq!(listed[0]["id"], id.as_str(), "{listed}");
    let hits = ok_json(&config, &url, &["search", "--user", "alice", "oolong"]);
    assert_eq!(hits[0]["id"], id.as_str(), "{hits}");
    // The facts are in the database, not under any storage root.
    assert!(!dir.path().join("users").exists());

    // Index commands answer for the database's search (its status; a rebuild of the user's
    // scopes recomputes the search columns); the file-only migrate refuses (6).
    let status = ok_json(&config, &url, &["index", "status"]);
    assert!(status["mode"].is_string(), "{status}");
    assert!(status.get("verification").is_none(), "{status}");
    let rebuilt = run(&config, &url, &["index", "rebuild", "--user", "alice"]);
    assert_eq!(rebuilt.status.code(), Some(0), "{}", text(&rebuilt));
    assert!(!text(&rebuilt).contains("panicked"), "{}", text(&rebuilt));
    let refused = run(&config, &url, &["migrate", "--all-users"]);
    assert_eq!(refused.status.code(), Some(6), "{}", text(&refused));
    assert!(
        text(&refused).contains("not available on storage postgres"),
        "{}",
        text(&refused)
    );

    // A schema newer than this build: `db migrate` exits 9 and changes nothing; the data
    // commands refuse to start against it, saying why.
    let newer = known + 1;
    let sql = format!(
        "INSERT INTO {schema}.refinery_schema_history (version, name, applied_on, checksum) \
         VALUES ({newer}, 'from_the_future', '2030-01-01T00:00:00Z', '0')"
    );
    psql(&cluster, &sql);
    let refused = run(&config, &url, &["db", "migrate"]);
    assert_eq!(refused.status.code(), Some(9), "{}", text(&refused));
    assert!(
        text(&refused).contains(&format!("version {newer}, newer than this build's {known}")),
        "{}",
        text(&refused)
    );
    let status = ok_json(&config, &url, &["db", "migrate", "--status"]);
    assert_eq!(
        (status["version"].clone(), status["newer"].clone()),
        (Value::from(newer), Value::Bool(true))
    );
    let blocked = run(&config, &url, &["facts", "list", "--user", "alice"]);
    assert!(!blocked.status.success());
    assert!(
        text(&blocked).contains("newer than this build"),
        "{}",
        text(&blocked)
    );
    assert!(!text(&blocked).contains(SECRET), "{}", text(&blocked));
}

#[test]
fn an_unreachable_database_or_a_missing_variable_is_a_clear_error_without_the_url() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "unreachable");
    // Port 1 on loopback: nothing listens there.
    let url = format!("postgres://deermem:{SECRET}@127.0.0.1:1/postgres?connect_timeout=2");
    let out = run(&config, &url, &["db", "migrate"]);
    assert_eq!(out.status.code(), Some(8), "{}", text(&out));
    assert!(
        text(&out).contains("cannot connect to PostgreSQL"),
        "{}",
        text(&out)
    );
    assert!(!text(&out).contains(SECRET), "{}", text(&out));
    let out = run(&config, &url, &["facts", "list", "--user", "alice"]);
    assert!(!out.status.success());
    assert!(!text(&out).contains(SECRET), "{}", text(&out));

    let out = Command::new(env!("CARGO_BIN_EXE_deermem"))
        .env_remove("DEERMEM_TEST_DB")
        .env("DEERMEM_LOG", "error")
        .arg("--config")
        .arg(&config)
        .args(["db", "migrate"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(5), "{}", text(&out));
    assert!(
        text(&out).contains("postgres.url") && text(&out).contains("DEERMEM_TEST_DB"),
        "{}",
        text(&out)
    );
}

/// Runs one statement with the cluster's `psql`.
fn psql(cluster: &PgCluster, sql: &str) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (client, connection) = tokio_postgres::connect(cluster.url(), tokio_postgres::NoTls)
            .await
            .unwrap();
        let task = tokio::spawn(connection);
        client.batch_execute(sql).await.unwrap();
        drop(client);
        let _ = task.await;
    });
}
