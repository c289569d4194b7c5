//! End-to-end tests of the `deermem` binary: data commands on temp roots and on copies of the
//! Python reference's fixtures, exit codes, JSON output, migration, ingest, demo, serve and mcp.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_deermem"));
    c.env_remove("DEERMEM_CONFIG")
        .env_remove("DEERMEM_DATA_DIR")
        .env_remove("DEER_FLOW_HOME");
    c.env("DEERMEM_LOG", "error");
    c
}

fn run(root: &Path, args: &[&str]) -> Output {
    bin()
        .arg("--storage-path")
        .arg(root)
        .args(args)
        .output()
        .expect("run deermem")
}

fn ok_json(root: &Path, args: &[&str]) -> Value {
    let mut full = vec!["--json"];
    full.extend_from_slice(args);
    let out = run(root, &full);
    assert!(
        out.status.success(),
        "deermem {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "deermem {args:?} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

fn fixtures() -> PathBuf {
    deermem_testkit::fixtures::python_deermem()
}

fn copy_dir(src: &Path, dst: &Path) {
    deermem_testkit::fixtures::copy_tree(src, dst);
}

/// Paths and content hashes of every file under `dir` (compact when an assertion fails).
fn snapshot(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                use std::hash::{Hash, Hasher};
                let mut h = std::collections::hash_map::DefaultHasher::new();
                std::fs::read(e.path()).unwrap().hash(&mut h);
                out.push((
                    e.path().strip_prefix(dir).unwrap().to_path_buf(),
                    h.finish(),
                ));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn fact_crud_with_json_output_and_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let added = ok_json(
        root,
        &[
            "facts",
            "add",
            "--user",
            "bob@example.com",
            "--content",
            "Prefers dark mode",
            "--category",
            "preference",
            "--confidence",
            "0.9",
        ],
    );
    let id = added["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("fact_") && id.len() == 13, "{id}");
    assert_eq!(added["revision"], 1);
    assert_eq!(added["source"], "manual");
    assert_eq!(added["scope"]["userId"], "bob@example.com");
    // The raw id lands in its safe bucket.
    assert!(
        root.join("users/bob-example-com-5ff860bf1190596c/agents/__default__/facts")
            .is_dir()
    );

    // Global options also work after the subcommand.
    let out = bin()
        .args([
            "facts",
            "list",
            "--user",
            "bob@example.com",
            "--json",
            "--storage-path",
        ])
        .arg(root)
        .output()
        .unwrap();
    assert!(out.status.success());
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1);
    assert_eq!(listed[0]["content"], "Prefers dark mode");

    let got = ok_json(root, &["facts", "get", &id, "--user", "bob@example.com"]);
    assert_eq!(got["id"], id.as_str());
    let updated = ok_json(
        root,
        &[
            "facts",
            "update",
            &id,
            "--user",
            "bob@example.com",
            "--content",
            "Prefers light mode",
            "--expected-revision",
            "1",
        ],
    );
    assert_eq!(updated["revision"], 2);
    assert_eq!(updated["category"], "preference");

    // A stale expected revision is a conflict (3) and changes nothing.
    let stale = run(
        root,
        &[
            "facts",
            "update",
            &id,
            "--user",
            "bob@example.com",
            "--content",
            "X",
            "--expected-revision",
            "1",
        ],
    );
    assert_eq!(
        code(&stale),
        3,
        "{}",
        String::from_utf8_lossy(&stale.stderr)
    );
    let stale_delete = run(
        root,
        &[
            "facts",
            "delete",
            &id,
            "--user",
            "bob@example.com",
            "--expected-revision",
            "1",
        ],
    );
    assert_eq!(code(&stale_delete), 3);
    assert_eq!(
        ok_json(root, &["facts", "get", &id, "--user", "bob@example.com"])["content"],
        "Prefers light mode"
    );

    // Invalid input (5), missing fact (4).
    assert_eq!(
        code(&run(
            root,
            &[
                "facts",
                "add",
                "--user",
                "bob@example.com",
                "--content",
                "x",
                "--confidence",
                "1.5"
            ]
        )),
        5
    );
    assert_eq!(
        code(&run(
            root,
            &[
                "facts",
                "add",
                "--user",
                "bob@example.com",
                "--content",
                "   "
            ]
        )),
        5
    );
    assert_eq!(
        code(&run(
            root,
            &[
                "facts",
                "add",
                "--user",
                "bob@example.com",
                "--content",
                "PREFERS LIGHT MODE"
            ]
        )),
        5,
        "duplicate"
    );
    assert_eq!(
        code(&run(
            root,
            &["facts", "list", "--user", "bob", "--agent", "../etc"]
        )),
        5
    );
    assert_eq!(
        code(&run(
            root,
            &["facts", "get", "../../x", "--user", "bob@example.com"]
        )),
        4
    );
    assert_eq!(
        code(&run(
            root,
            &[
                "facts",
                "delete",
                "fact_missing",
                "--user",
                "bob@example.com"
            ]
        )),
        4
    );
    assert_eq!(
        code(&run(
            root,
            &[
                "facts",
                "update",
                "a/b",
                "--user",
                "bob@example.com",
                "--content",
                "x"
            ]
        )),
        5
    );

    // Agents are separate buckets, case-insensitive.
    ok_json(
        root,
        &[
            "facts",
            "add",
            "--user",
            "bob@example.com",
            "--agent",
            "Coder",
            "--content",
            "Uses tokio",
        ],
    );
    let coder = ok_json(
        root,
        &[
            "facts",
            "list",
            "--user",
            "bob@example.com",
            "--agent",
            "coder",
        ],
    );
    assert_eq!(coder.as_array().unwrap().len(), 1);
    assert_eq!(
        ok_json(root, &["facts", "list", "--user", "bob@example.com"])
            .as_array()
            .unwrap()
            .len(),
        1
    );

    let deleted = ok_json(
        root,
        &[
            "facts",
            "delete",
            &id,
            "--user",
            "bob@example.com",
            "--expected-revision",
            "2",
        ],
    );
    assert_eq!(deleted["status"], "deleted");
    assert!(
        ok_json(root, &["facts", "list", "--user", "bob@example.com"])
            .as_array()
            .unwrap()
            .is_empty()
    );

    // The human table shows the header.
    let table = run(
        root,
        &[
            "facts",
            "list",
            "--user",
            "bob@example.com",
            "--agent",
            "coder",
        ],
    );
    assert!(String::from_utf8_lossy(&table.stdout).contains("CATEGORY"));
}

#[test]
fn help_documents_exit_codes_and_bad_arguments_exit_2() {
    let out = bin().arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("Exit codes") && help.contains("3  conflict"),
        "{help}"
    );
    assert_eq!(code(&bin().args(["facts", "add"]).output().unwrap()), 2);
    assert_eq!(code(&bin().args(["bogus"]).output().unwrap()), 2);
}

/// Issue 4: an index that cannot be opened is reported as such (not as "not configured"),
/// search still answers, and a rebuild succeeds once the path is usable again.
#[test]
fn index_tools_report_an_unusable_index_truthfully() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::write(
        root.join(".retrieval"),
        "a file where the index folder belongs",
    )
    .unwrap();
    ok_json(
        root,
        &[
            "facts",
            "add",
            "--user",
            "gail",
            "--content",
            "Grows tomatoes on the balcony",
        ],
    );
    let status = ok_json(root, &["index", "status"]);
    assert_eq!(status["configured"], true, "{status}");
    assert!(status.get("total_docs").is_none(), "{status}");
    let cause = status["last_error"].as_str().unwrap_or_default().to_owned();
    assert!(cause.contains(".retrieval"), "{status}");
    let text = run(root, &["index", "status"]);
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    assert!(text.contains("state:      unavailable"), "{text}");
    assert!(text.contains("last error:"), "{text}");

    let hits = ok_json(root, &["search", "--user", "gail", "tomatoes"]);
    assert_eq!(hits.as_array().map(Vec::len), Some(1), "{hits}");
    assert_eq!(hits[0]["matchType"], "substring", "{hits}");

    let failed = run(root, &["index", "rebuild"]);
    assert_eq!(code(&failed), 1);
    let err = String::from_utf8_lossy(&failed.stderr).into_owned();
    assert!(err.contains("the index rebuild failed ("), "{err}");
    assert!(err.contains(".retrieval"), "{err}");
    assert!(!err.contains("retrieval_adapter is empty"), "{err}");

    std::fs::remove_file(root.join(".retrieval")).unwrap();
    let rebuilt = ok_json(root, &["index", "rebuild"]);
    assert_eq!(
        (rebuilt["indexed"].as_u64(), rebuilt["fatal"].as_bool()),
        (Some(1), Some(false))
    );
    let status = ok_json(root, &["index", "status"]);
    assert_eq!(status["total_docs"], 1, "{status}");
    assert!(status.get("last_error").is_none(), "{status}");
    let hits = ok_json(root, &["search", "--user", "gail", "balcony tomatoes"]);
    assert_eq!(hits[0]["matchType"], "fts5", "{hits}");
}

/// `search --mode`: `bm25` ranks by words and says so in `matchType`; the vector modes need
/// an embedder (exit 5 with the reason, never a silent BM25 answer); an unknown mode is a
/// usage error (exit 2). Without an embedder `index status` shows no vector coverage.
#[test]
fn search_mode_flag_is_checked_and_vector_modes_need_an_embedder() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    ok_json(
        root,
        &[
            "facts",
            "add",
            "--user",
            "gail",
            "--content",
            "Prefers oolong tea",
        ],
    );
    for args in [
        &["search", "--user", "gail", "oolong"][..],
        &["search", "--user", "gail", "oolong", "--mode", "bm25"][..],
    ] {
        let hits = ok_json(root, args);
        assert_eq!(hits.as_array().map(Vec::len), Some(1), "{args:?}: {hits}");
        assert_eq!(hits[0]["content"], "Prefers oolong tea");
        assert_eq!(hits[0]["matchType"], "fts5", "{hits}");
    }
    for mode in ["vector", "hybrid"] {
        let out = run(
            root,
            &["search", "--user", "gail", "oolong", "--mode", mode],
        );
        assert_eq!(code(&out), 5, "{mode}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!(
                "search mode {mode} needs an embedder: set backend_config.embedding"
            )),
            "{err}"
        );
        assert!(out.stdout.is_empty(), "{mode}");
    }
    let out = run(
        root,
        &["search", "--user", "gail", "oolong", "--mode", "semantic"],
    );
    assert_eq!(code(&out), 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("semantic") && err.contains("bm25, vector, hybrid"),
        "{err}"
    );
    let status = ok_json(root, &["index", "status"]);
    assert!(status.get("vectors").is_none(), "{status}");
    let text = run(root, &["index", "status"]);
    assert!(!String::from_utf8_lossy(&text.stdout).contains("vectors:"));
}

/// The local model's directory (`cargo xtask ci` fetches it and sets the variable).
fn test_model_dir() -> String {
    match std::env::var("DEERMEM_TEST_MODEL_DIR") {
        Ok(dir) if !dir.is_empty() => dir,
        _ => panic!(
            "DEERMEM_TEST_MODEL_DIR is not set: run `cargo xtask model fetch` and set it to the \
             directory it prints (target/models/all-MiniLM-L6-v2); `cargo xtask ci` does both"
        ),
    }
}

/// Issue 26's end-to-end case: with `embedding: {provider: local}` a paraphrase finds the fact
/// ("what does the user drink" → "Prefers oolong tea"), ranked by meaning; `--mode bm25` does not
/// find it; `index status` reports the vectors.
#[test]
fn search_by_meaning_with_the_local_model() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let cfg = dir.path().join("config.yaml");
    std::fs::write(
        &cfg,
        format!(
            "memory:\n  backend_config:\n    embedding:\n      provider: local\n      model_path: {}\n",
            test_model_dir()
        ),
    )
    .unwrap();
    let with_cfg = |args: &[&str]| {
        let mut full = vec!["--config", cfg.to_str().unwrap()];
        full.extend_from_slice(args);
        full.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    for content in [
        "Prefers oolong tea",
        "Backend engineer at a robotics startup",
        "Has a cat called Miso",
    ] {
        let args = with_cfg(&["facts", "add", "--user", "U", "--content", content]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        ok_json(&root, &args);
    }
    let search = |mode: Option<&str>| {
        let mut args = with_cfg(&["search", "--user", "U", "what does the user drink"]);
        if let Some(m) = mode {
            args.extend(["--mode".to_owned(), m.to_owned()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        ok_json(&root, &args)
    };
    for mode in [None, Some("hybrid"), Some("vector")] {
        let hits = search(mode);
        assert_eq!(hits[0]["content"], "Prefers oolong tea", "{mode:?}: {hits}");
        let want = if mode == Some("vector") {
            "vector"
        } else {
            "hybrid"
        };
        let got = hits[0]["matchType"].as_str().unwrap_or_default();
        assert!(
            got == want || (want == "hybrid" && got == "vector"),
            "{mode:?}: matchType {got}: {hits}"
        );
    }
    let lexical = search(Some("bm25"));
    assert!(
        lexical
            .as_array()
            .unwrap()
            .iter()
            .all(|h| h["content"] != "Prefers oolong tea"),
        "{lexical}"
    );

    let args = with_cfg(&["index", "status"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let status = ok_json(&root, &args);
    let v = &status["vectors"];
    assert_eq!(
        (v["embedded"].as_u64(), v["total"].as_u64()),
        (Some(3), Some(3)),
        "{status}"
    );
    assert_eq!(v["dimension"], 384, "{status}");
    assert!(
        v["model_id"]
            .as_str()
            .is_some_and(|m| m.contains("all-MiniLM-L6-v2")),
        "{status}"
    );
    let out = run(&root, &args);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("vectors:    3/3 embedded (model "), "{text}");
    assert!(text.contains("384 dimensions)"), "{text}");
    assert!(text.contains("embedding:  no scope pending"), "{text}");
}

#[test]
fn reads_the_reference_fixtures() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("v2");
    copy_dir(&fixtures().join("v2-root"), &root);
    let expected: Value =
        serde_json::from_slice(&std::fs::read(fixtures().join("expected.json")).unwrap()).unwrap();
    for (key, view) in expected["v2"].as_object().unwrap() {
        let (user, agent) = key.split_once('|').unwrap();
        let mut args = vec!["facts", "list", "--user", user];
        if agent != "__default__" {
            args.extend(["--agent", agent]);
        }
        let listed = ok_json(&root, &args);
        let ids: Vec<&str> = listed
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["id"].as_str().unwrap())
            .collect();
        let want: Vec<&str> = view["facts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, want, "{key}");
        // Sources are public strings.
        assert!(
            listed
                .as_array()
                .unwrap()
                .iter()
                .all(|f| f["source"].is_string())
        );
    }
    let summaries = ok_json(&root, &["summaries", "get", "--user", "用户"]);
    assert_eq!(
        summaries["user"]["workContext"]["summary"],
        "用户 works on memory systems."
    );
    assert_eq!(summaries["revision"], 10);

    // CJK search finds what the reference's unicode61 tokenizer misses.
    let hits = ok_json(&root, &["search", "--user", "alice", "乌龙茶"]);
    assert_eq!(hits[0]["id"], "fact_49f3429b9a4244bebef877d703383bd9");
    assert!(hits[0]["score"].is_number());
    assert!(hits[0]["matchType"].is_string());
    let berlin = ok_json(
        &root,
        &["search", "--user", "alice", "Berlin", "--top-k", "5"],
    );
    assert_eq!(berlin[0]["id"], "fact_d85aa3efa06b49c98f0d798f86840bc8");

    // The index tools.
    let rebuilt = ok_json(&root, &["index", "rebuild"]);
    assert!(rebuilt["indexed"].as_u64().unwrap() >= 65);
    assert_eq!(rebuilt["failed"], 0);
    let status = ok_json(&root, &["index", "status"]);
    assert_eq!(status["configured"], true);
    let scoped = ok_json(&root, &["index", "rebuild", "--user", "bob@example.com"]);
    assert_eq!(scoped["indexed"], 17, "bob has 2 + 8 + 7 facts");
}

#[test]
fn migrate_all_users_keeps_lossy_ids_readable() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("v1");
    copy_dir(&fixtures().join("v1-root"), &root);
    let before = snapshot(&root);

    let dry = run(&root, &["migrate", "--all-users", "--dry-run"]);
    assert_eq!(code(&dry), 0);
    let text = String::from_utf8_lossy(&dry.stdout);
    assert!(
        text.contains("would migrate")
            && text.contains("Summary: migrated=0 planned=2 current=0 failed=0"),
        "{text}"
    );
    assert_eq!(snapshot(&root), before, "a dry run writes nothing");

    let real = run(&root, &["migrate", "--all-users"]);
    assert_eq!(code(&real), 0, "{}", String::from_utf8_lossy(&real.stderr));
    assert!(
        String::from_utf8_lossy(&real.stdout)
            .contains("Summary: migrated=2 planned=0 current=0 failed=0")
    );
    let again = run(&root, &["migrate", "--all-users"]);
    assert!(String::from_utf8_lossy(&again.stdout).contains("already current"));
    assert!(
        String::from_utf8_lossy(&again.stdout)
            .contains("Summary: migrated=0 planned=0 current=2 failed=0")
    );

    // The reference's CLI would make these facts unreadable for the real id; ours keeps them.
    let dave = ok_json(&root, &["facts", "list", "--user", "dave@corp.example"]);
    let migrated = fixtures()
        .join("v1-migrated/users/dave-corp-example-24e6e8e886de6c22/agents/__default__/facts");
    let want = snapshot(&migrated).len();
    assert_eq!(dave.as_array().unwrap().len(), want);

    // No user selection is a usage error.
    assert_eq!(code(&run(&root, &["migrate"])), 2);
}

#[test]
fn migrate_continues_past_a_failing_user_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("v1");
    copy_dir(&fixtures().join("v1-root"), &root);
    // Carol's legacy global document is corrupt: her migration must fail, Dave's must not.
    let broken = root.join("users/carol/memory.json");
    std::fs::write(&broken, "{\"facts\": [ {\"id\": ").unwrap();

    let out = run(&root, &["migrate", "--all-users"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        code(&out),
        1,
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("failed=1"), "{stdout}");
    assert!(stdout.contains("migrated=1"), "{stdout}");
    assert_eq!(
        std::fs::read_to_string(&broken).unwrap(),
        "{\"facts\": [ {\"id\": ",
        "the failing user's data is left as it was"
    );

    // The other user was migrated completely and reads back.
    let dave = ok_json(&root, &["facts", "list", "--user", "dave@corp.example"]);
    assert!(!dave.as_array().unwrap().is_empty());
    assert!(
        root.join("users/dave-corp-example-24e6e8e886de6c22/memory.json.v1.bak")
            .exists(),
        "the migrated user's legacy document is kept as a backup"
    );
    assert!(!root.join("users/carol/memory.json.v1.bak").exists());

    // --json reports the failure per user as well.
    let json = run(&root, &["migrate", "--all-users", "--json"]);
    assert_eq!(code(&json), 1);
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let text = report.to_string();
    assert!(text.contains("carol"), "{text}");
}

#[test]
fn migrate_user_isolation_moves_the_shared_layout() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::write(root.join("memory.json"), r#"{"version": "1.0", "facts": [{"id": "fact_legacy", "content": "Legacy fact", "source": "manual"}]}"#).unwrap();
    std::fs::create_dir_all(root.join("agents/coder")).unwrap();
    std::fs::write(root.join("agents/coder/SOUL.md"), "be helpful").unwrap();
    std::fs::write(root.join("agents/coder/config.yaml"), "name: coder\n").unwrap();
    let before = snapshot(root);
    let dry = run(
        root,
        &[
            "migrate",
            "--user-isolation",
            "--dry-run",
            "--user-id",
            "alice",
        ],
    );
    assert_eq!(code(&dry), 0, "{}", String::from_utf8_lossy(&dry.stderr));
    assert_eq!(snapshot(root), before);
    let real = run(root, &["migrate", "--user-isolation", "--user-id", "alice"]);
    assert_eq!(code(&real), 0, "{}", String::from_utf8_lossy(&real.stderr));
    assert!(root.join("users/alice/agents/coder/SOUL.md").is_file());
    assert!(
        root.join("users/alice/memory.json").is_file()
            || root.join("users/alice/memory.json.v1.bak").is_file()
    );
    // The legacy fact is readable by the user after the move (lazy v1 → v2 migration).
    let facts = ok_json(root, &["facts", "list", "--user", "alice"]);
    assert_eq!(facts[0]["content"], "Legacy fact");
    let again = run(root, &["migrate", "--user-isolation", "--user-id", "alice"]);
    assert_eq!(code(&again), 0);
}

#[test]
fn export_import_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    ok_json(
        root,
        &[
            "facts",
            "add",
            "--user",
            "u1",
            "--content",
            "Lives in 東京",
            "--category",
            "context",
            "--confidence",
            "0.95",
        ],
    );
    ok_json(
        root,
        &[
            "facts",
            "add",
            "--user",
            "u1",
            "--content",
            "Likes jazz",
            "--category",
            "preference",
        ],
    );
    let exported = run(root, &["export", "--user", "u1"]);
    assert!(exported.status.success());
    let file = root.join("export.json");
    std::fs::write(&file, &exported.stdout).unwrap();
    let doc: Value = serde_json::from_slice(&exported.stdout).unwrap();
    assert_eq!(doc["facts"].as_array().unwrap().len(), 2);
    // Import into another user gives the same facts.
    let imported = ok_json(root, &["import", "--user", "u2", file.to_str().unwrap()]);
    let contents = |v: &Value| {
        let mut c: Vec<String> = v["facts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["content"].as_str().unwrap().to_owned())
            .collect();
        c.sort();
        c
    };
    assert_eq!(contents(&imported), contents(&doc));
    assert_eq!(
        code(&run(
            root,
            &["import", "--user", "u2", "/nonexistent/file.json"]
        )),
        1
    );
    std::fs::write(&file, "not json").unwrap();
    assert_eq!(
        code(&run(
            root,
            &["import", "--user", "u2", file.to_str().unwrap()]
        )),
        5
    );
    // More facts than an import document may hold: refused from a count of the text.
    let many: Vec<String> = (0..2001)
        .map(|i| format!(r#"{{"id":"f{i}","content":"x"}}"#))
        .collect();
    std::fs::write(&file, format!(r#"{{"facts":[{}]}}"#, many.join(","))).unwrap();
    let refused = run(root, &["import", "--user", "u2", file.to_str().unwrap()]);
    assert_eq!(code(&refused), 5);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("holds 2001 facts; an import document may hold at most 2000"),
        "{stderr}"
    );
    assert_eq!(
        contents(&ok_json(root, &["export", "--user", "u2"])),
        contents(&doc)
    );
}

/// As the reference: an import fact whose `id` is `""` or absent is stored under a generated
/// `fact_…` id.
#[test]
fn import_generates_blank_and_missing_fact_ids() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let file = root.join("blank-ids.json");
    std::fs::write(
        &file,
        r#"{"facts": [{"id": "", "content": "Blank id"}, {"content": "No id"},
                      {"id": "fact_named", "content": "Named"}]}"#,
    )
    .unwrap();
    let imported = ok_json(root, &["import", "--user", "u3", file.to_str().unwrap()]);
    let mut ids: Vec<String> = imported["facts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    assert_eq!(ids.len(), 3, "{ids:?}");
    assert!(ids.contains(&"fact_named".to_owned()), "{ids:?}");
    for id in ids.iter().filter(|id| *id != "fact_named") {
        assert!(id.starts_with("fact_") && id.len() == 13, "{id}");
    }
    let exported = ok_json(root, &["export", "--user", "u3"]);
    let mut again: Vec<String> = exported["facts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_str().unwrap().to_owned())
        .collect();
    again.sort();
    assert_eq!(again, ids, "the generated ids are the stored ones");
}

#[test]
fn ingest_reports_changes_and_context_prints_the_block() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let conv = root.join("conv.json");
    std::fs::write(
        &conv,
        r#"[{"role": "user", "content": "I'm a data scientist. I prefer Python for notebooks."},
            {"role": "assistant", "content": "Great, Python it is."}]"#,
    )
    .unwrap();
    let report = ok_json(
        root,
        &[
            "ingest",
            "--user",
            "carol",
            "--thread",
            "t-1",
            conv.to_str().unwrap(),
        ],
    );
    assert_eq!(report["status"], "committed", "{report}");
    assert_eq!(report["origin"], "offline");
    let added: Vec<&str> = report["added"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["content"].as_str().unwrap())
        .collect();
    assert!(
        added.iter().any(|c| c.contains("data scientist")),
        "{added:?}"
    );
    // A LangChain dump with a `messages` key and a trivial-only turn is not admitted.
    std::fs::write(
        &conv,
        r#"{"messages": [{"type": "human", "content": "ok"}, {"type": "ai", "content": "Sure."}]}"#,
    )
    .unwrap();
    let report = ok_json(root, &["ingest", "--user", "carol", conv.to_str().unwrap()]);
    assert_eq!(report["status"], "not_admitted");

    let ctx = run(root, &["context", "--user", "carol"]);
    let text = String::from_utf8_lossy(&ctx.stdout);
    assert!(
        text.starts_with("<memory>\n") && text.contains("data scientist"),
        "{text}"
    );
    let json = ok_json(root, &["context", "--user", "carol"]);
    assert_eq!(
        json["context"].as_str().unwrap(),
        text.trim_end_matches('\n').to_owned() + "\n"
    );
    assert_eq!(json["content_sha256"].as_str().unwrap().len(), 64);
    // An empty user has no block.
    assert!(
        String::from_utf8_lossy(&run(root, &["context", "--user", "nobody"]).stdout)
            .contains("no memory")
    );
}

/// A fact too long for the injection budget is skipped and the shorter, less confident ones
/// still reach the block (default budget: 2,000 tokens).
#[test]
fn context_skips_a_fact_that_does_not_fit_and_keeps_filling() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let huge = "用户喜欢喝茶".repeat(2_084);
    for (content, confidence) in [(huge.as_str(), "0.9"), ("Likes green tea", "0.8")] {
        let out = run(
            root,
            &[
                "facts",
                "add",
                "--user",
                "dora",
                "--content",
                content,
                "--category",
                "preference",
                "--confidence",
                confidence,
            ],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let ctx = run(root, &["context", "--user", "dora"]);
    let text = String::from_utf8_lossy(&ctx.stdout);
    assert!(
        text.contains("- [preference | 0.80] Likes green tea"),
        "{text}"
    );
    assert!(
        !text.contains("用户喜欢喝茶"),
        "the oversized fact is left out"
    );
}

#[test]
fn demo_runs_offline_and_prints_the_block() {
    let out = bin().arg("demo").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("<memory>") && text.contains("</memory>"),
        "{text}"
    );
    assert!(text.contains("乌龙茶"));
    assert!(text.contains("Stored facts"));
    // The user's correction replaced the goal it contradicts, in storage and in the block.
    let stored = &text[text.find("Stored facts").unwrap()..];
    assert!(stored.contains("before April"), "{text}");
    assert!(!stored.contains("before March"), "{text}");
    assert!(text.contains("Stored facts (6)"), "{text}");
}

#[test]
fn unsupported_operations_have_their_own_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.yaml");
    std::fs::write(&cfg, "memory:\n  manager_class: noop\n").unwrap();
    let out = bin()
        .args(["--config"])
        .arg(&cfg)
        .args(["facts", "add", "--user", "u", "--content", "x"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 6, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not supported"));
    std::fs::write(&cfg, "memory:\n  manager_class: bogus\n").unwrap();
    let out = bin()
        .args(["--config"])
        .arg(&cfg)
        .args(["facts", "list", "--user", "u"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bogus") && err.contains("deermem, honcho, noop, openviking"),
        "{err}"
    );
    std::fs::write(&cfg, "memory:\n  backend_config:\n    max_facts: 5\n").unwrap();
    let out = bin()
        .args(["--config"])
        .arg(&cfg)
        .args(["facts", "list", "--user", "u"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 5);
    assert!(String::from_utf8_lossy(&out.stderr).contains("memory.backend_config.max_facts"));
}

fn http_get(addr: &str, path: &str) -> String {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut s = String::new();
    stream.read_to_string(&mut s).unwrap();
    s
}

#[test]
fn serve_answers_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = bin()
        .arg("--storage-path")
        .arg(dir.path())
        .args(["serve", "--bind", "127.0.0.1:0"])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let started = Instant::now();
    let addr = loop {
        let line = lines.next().expect("serve printed its address").unwrap();
        if let Some(rest) = line.split("http://").nth(1) {
            break rest.split('/').next().unwrap().to_owned();
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "serve did not start"
        );
    };
    let health = http_get(&addr, "/healthz");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let metrics = http_get(&addr, "/metrics");
    assert!(
        metrics.starts_with("HTTP/1.1 200") && metrics.contains("queue_depth"),
        "{metrics}"
    );
    let memory = http_get(&addr, "/api/memory");
    assert!(
        memory.starts_with("HTTP/1.1 200") && memory.contains("\"facts\""),
        "{memory}"
    );
    let pid = child.id();
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = child.wait().unwrap();
    assert!(exit.success(), "graceful shutdown exits 0: {exit:?}");
}

#[test]
fn mcp_over_stdio_lists_tools() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = bin()
        .arg("--storage-path")
        .arg(dir.path())
        .args(["mcp", "--user", "alice"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // Each request waits for its answer, as an MCP host does.
    let mut call = |line: &str, id: u64| -> Value {
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
        loop {
            let text = lines.next().expect("the server answered").unwrap();
            let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            if v["id"] == id {
                return v;
            }
        }
    };
    call(
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
        1,
    );
    let tools = call(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#, 2);
    let names: Vec<String> = tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect();
    for name in [
        "memory_search",
        "memory_add",
        "memory_update",
        "memory_delete",
        "memory_context",
    ] {
        assert!(names.contains(&name.to_owned()), "{names:?}");
    }
    let added = call(
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"memory_add","arguments":{"content":"Likes green tea"}}}"#,
        3,
    );
    let added = added["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(added.contains("\"added\""), "{added}");
    let found = call(
        r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"memory_search","arguments":{"query":"tea"}}}"#,
        4,
    );
    let found = found["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(found.contains("Likes green tea"), "{found}");
    let bad = call(
        r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"memory_delete","arguments":{"fact_id":"../x"}}}"#,
        5,
    );
    assert_eq!(bad["result"]["isError"], true, "{bad}");
    drop(stdin);
    let _ = child.wait();
}

#[test]
fn free_text_arguments_may_start_with_a_dash() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let added = ok_json(
        root,
        &[
            "facts",
            "add",
            "--user",
            "-dash-user",
            "--content",
            "- item one",
            "--category",
            "-cat",
            "--confidence",
            "0.9",
        ],
    );
    assert_eq!(added["content"], "- item one");
    // Not a core category: stored as `other` with the given text as its extension.
    assert_eq!(added["category"], "other");
    assert_eq!(added["categoryExtension"], "-cat");
    assert_eq!(added["scope"]["userId"], "-dash-user");
    let id = added["id"].as_str().unwrap().to_owned();

    let updated = ok_json(
        root,
        &[
            "facts",
            "update",
            &id,
            "--user",
            "-dash-user",
            "--content",
            "-5 degrees is too cold",
        ],
    );
    assert_eq!(updated["content"], "-5 degrees is too cold");

    let listed = ok_json(root, &["facts", "list", "--user", "-dash-user"]);
    assert_eq!(listed[0]["content"], "-5 degrees is too cold");

    // A query that starts with a dash is a value, not an option.
    let out = run(
        root,
        &[
            "search",
            "--user",
            "-dash-user",
            "-5 degrees",
            "--category",
            "other",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("-5 degrees is too cold"));
    // So is a category filter (it matches nothing here, but it is accepted).
    let out = run(
        root,
        &[
            "search",
            "--user",
            "-dash-user",
            "cold",
            "--category",
            "-cat",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A negative confidence reaches validation (exit 5, invalid input), not the argument parser.
    let out = run(
        root,
        &[
            "facts",
            "add",
            "--user",
            "u",
            "--content",
            "x",
            "--confidence",
            "-1",
        ],
    );
    assert_eq!(code(&out), 5, "{}", String::from_utf8_lossy(&out.stderr));
}

/// Writers without an expected revision in separate processes on one root (one user, two
/// agents sharing the user's revision) retry their own optimistic commits: none exits 3.
#[test]
fn concurrent_processes_writing_one_user_all_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let doc = dir.path().join("import.json");
    std::fs::write(
        &doc,
        r#"{"version": "2.0", "facts": [{"id": "fact_imported1", "content": "Imported fact", "category": "context", "confidence": 0.9, "createdAt": "2026-01-01T00:00:00Z", "source": "manual"}]}"#,
    )
    .unwrap();
    let mut children = Vec::new();
    for i in 0..8 {
        let mut cmd = bin();
        cmd.arg("--storage-path").arg(&root);
        if i < 6 {
            cmd.args(["facts", "add", "--user", "alice", "--content"])
                .arg(format!("Parallel fact number {i}"));
        } else {
            cmd.args(["import", "--user", "alice", "--agent"])
                .arg(format!("agent{i}"))
                .arg(&doc);
        }
        children.push(
            cmd.stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        );
    }
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "exit {:?}: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let listed = ok_json(&root, &["facts", "list", "--user", "alice"]);
    assert_eq!(listed.as_array().unwrap().len(), 6);
    for agent in ["agent6", "agent7"] {
        let listed = ok_json(
            &root,
            &["facts", "list", "--user", "alice", "--agent", agent],
        );
        assert_eq!(listed[0]["content"], "Imported fact", "{agent}");
    }
}

/// `index status` compares the index with the fact files: facts committed by a process that
/// died before its index write (here: an index that lost them) are reported, not "clean".
#[test]
fn index_status_reports_facts_the_index_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for content in ["Likes hiking", "Owns a cat", "Speaks Dutch"] {
        ok_json(
            root,
            &["facts", "add", "--user", "alice", "--content", content],
        );
    }
    let status = ok_json(root, &["index", "status"]);
    assert_eq!(status["verification"]["canonical_facts"], 3, "{status}");
    assert_eq!(
        status["verification"]["stale_scopes"],
        serde_json::json!([])
    );
    let text = String::from_utf8_lossy(&run(root, &["index", "status"]).stdout).into_owned();
    assert!(text.contains("files:      in sync (3 fact(s)"), "{text}");

    // The index loses every document (as if the writes never reached it).
    std::fs::remove_dir_all(root.join(".retrieval")).unwrap();
    let status = ok_json(root, &["index", "status"]);
    let v = &status["verification"];
    assert_eq!(
        (v["canonical_facts"].as_u64(), v["indexed_docs"].as_u64()),
        (Some(3), Some(0)),
        "{status}"
    );
    assert_eq!(v["stale_scopes"][0]["scope"], "alice|__default__");
    assert_eq!(v["stale_scopes"][0]["missing"], 3);
    let text = String::from_utf8_lossy(&run(root, &["index", "status"]).stdout).into_owned();
    assert!(
        text.contains("OUT OF SYNC")
            && text.contains("alice|__default__ (3 missing, 0 extra, 0 outdated)"),
        "{text}"
    );

    ok_json(root, &["index", "rebuild"]);
    // A fact file removed behind the index's back is an extra document.
    let facts = root.join("users/alice/agents/__default__/facts");
    let one = std::fs::read_dir(&facts)
        .unwrap()
        .flatten()
        .flat_map(|shard| std::fs::read_dir(shard.path()).unwrap().flatten())
        .next()
        .unwrap()
        .path();
    std::fs::remove_file(one).unwrap();
    let status = ok_json(root, &["index", "status"]);
    assert_eq!(
        status["verification"]["stale_scopes"][0]["extra"], 1,
        "{status}"
    );
    ok_json(root, &["index", "rebuild"]);
    let status = ok_json(root, &["index", "status"]);
    assert_eq!(
        status["verification"]["stale_scopes"],
        serde_json::json!([]),
        "{status}"
    );
}
