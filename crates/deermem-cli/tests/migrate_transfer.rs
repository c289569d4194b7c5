//! `deermem migrate --from … --to …` end to end against a throwaway PostgreSQL cluster: the
//! Python reference's v2 fixture root and a root written by this engine (with hostile ids and
//! content) go file → PostgreSQL → file and come back byte-identical; a second run changes
//! nothing; a run interrupted inside the database (one user made to fail) is resumed; a
//! differing destination is refused unless `--overwrite`; the URL is never printed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use deermem_testkit::pgcluster::PgCluster;
use serde_json::Value;

/// The variable the tests pass the URL in, as an operator would (`--to '$DATABASE_URL'`).
const URL_VAR: &str = "DEERMEM_TRANSFER_TEST_URL";

fn bin(url: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_deermem"));
    c.env_remove("DEERMEM_CONFIG")
        .env_remove("DEERMEM_DATA_DIR")
        .env_remove("DEER_FLOW_HOME")
        .env("DEERMEM_LOG", "error")
        .env(URL_VAR, url);
    c
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run(url: &str, args: &[&str]) -> Run {
    let out: Output = bin(url).args(args).output().expect("run deermem");
    let r = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    // The URL (its host:port) never appears, whatever happened.
    let host_port = url
        .split('@')
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap();
    assert!(
        !r.stdout.contains(host_port) && !r.stderr.contains(host_port),
        "the URL was printed: {}{}",
        r.stdout,
        r.stderr
    );
    r
}

/// `migrate --json --from … --to …` with extra flags; the parsed report.
fn transfer(url: &str, from: &str, to: &str, extra: &[&str]) -> (i32, Value, String) {
    let mut args = vec!["--json", "migrate", "--from", from, "--to", to];
    args.extend_from_slice(extra);
    let r = run(url, &args);
    let v: Value = serde_json::from_str(&r.stdout)
        .unwrap_or_else(|e| panic!("no JSON report ({e}): {}\nstderr: {}", r.stdout, r.stderr));
    (r.code, v, r.stderr)
}

fn statuses(report: &Value) -> BTreeMap<String, String> {
    report["scopes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["bucket"].as_str().unwrap().to_owned(),
                s["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Every file under `dir` with its bytes, less what is not memory: the derived search index
/// (`.retrieval/`) and the commit journal's spare inode, which the engine's own writes leave
/// (see docs/migration.md).
fn tree(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut all = every_file(dir);
    all.retain(|p, _| !p.starts_with(".retrieval") && !p.ends_with(".memory.journal.spare"));
    all
}

fn every_file(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                out.insert(
                    e.path().strip_prefix(dir).unwrap().to_path_buf(),
                    std::fs::read(e.path()).unwrap(),
                );
            }
        }
    }
    out
}

fn assert_same_tree(want: &BTreeMap<PathBuf, Vec<u8>>, got: &BTreeMap<PathBuf, Vec<u8>>) {
    let names = |t: &BTreeMap<PathBuf, Vec<u8>>| t.keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(want), names(got), "the same files");
    for (path, bytes) in want {
        assert!(
            got[path] == *bytes,
            "{} differs:\n--- want\n{}\n--- got\n{}",
            path.display(),
            String::from_utf8_lossy(bytes),
            String::from_utf8_lossy(&got[path])
        );
    }
}

fn file(p: &Path) -> String {
    format!("file:{}", p.display())
}

fn md_files(t: &BTreeMap<PathBuf, Vec<u8>>) -> usize {
    t.keys()
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .count()
}

/// The round trip of one root through schema `schema`: copied, a second run changes nothing,
/// back to files byte-identical, and that second direction idempotent too.
fn round_trip(url: &str, src: &Path, schema: &str, scratch: &Path) {
    let pg = format!("${URL_VAR}");
    let before = tree(src);
    let (code, first, stderr) = transfer(url, &file(src), &pg, &["--pg-schema", schema]);
    assert_eq!(code, 0, "{first}\n{stderr}");
    let s = statuses(&first);
    assert!(!s.is_empty());
    assert!(s.values().all(|v| v == "copied"), "{s:?}");
    assert_eq!(first["summary"]["facts"], md_files(&before), "{first}");
    assert_eq!(first["to"], format!("postgres (schema {schema})"));
    // Reading the source changed nothing there.
    assert_same_tree(&before, &tree(src));

    let (code, second, _) = transfer(url, &file(src), &pg, &["--pg-schema", schema]);
    assert_eq!(code, 0);
    assert!(
        statuses(&second).values().all(|v| v == "unchanged"),
        "{second}"
    );
    assert_eq!(second["summary"]["sha256"], first["summary"]["sha256"]);

    let back = scratch.join(format!("back-{schema}"));
    let (code, out, stderr) = transfer(url, &pg, &file(&back), &["--pg-schema", schema]);
    assert_eq!(code, 0, "{out}\n{stderr}");
    assert!(statuses(&out).values().all(|v| v == "copied"), "{out}");
    // The same memory by checksum in both directions, and the same bytes on disk.
    assert_eq!(out["summary"]["sha256"], first["summary"]["sha256"]);
    assert_same_tree(&before, &tree(&back));

    let (code, again, _) = transfer(url, &pg, &file(&back), &["--pg-schema", schema]);
    assert_eq!(code, 0);
    assert!(
        statuses(&again).values().all(|v| v == "unchanged"),
        "{again}"
    );
    assert_same_tree(&before, &tree(&back));
}

/// A root written by this engine through the CLI: several users and agents, hostile ids and
/// content (SQL and YAML metacharacters, quotes, newlines, CJK, emoji), usage from searches.
fn engine_root(url: &str, root: &Path) {
    let hostile_user = "o'brien\"; DROP TABLE users; --@example.com";
    let contents = [
        "Robert'); DROP TABLE facts;-- $$ \\ %_ :* &|!() ;",
        "line one\n---\n# not a title\nkey: value # comment",
        "喜欢徒步 と 日本語 🦌 \"quoted\" 'single'",
        "plain fact about Rust",
    ];
    for (user, agent) in [
        ("alice", None),
        ("alice", Some("coder")),
        (hostile_user, None),
        (hostile_user, Some("x-1")),
    ] {
        for (i, content) in contents.iter().enumerate() {
            let category = if i % 2 == 0 { "x'; --" } else { "preference" };
            let mut args = vec![
                "--storage-path",
                root.to_str().unwrap(),
                "facts",
                "add",
                "--user",
                user,
                "--content",
                content,
                "--category",
                category,
            ];
            if let Some(a) = agent {
                args.extend(["--agent", a]);
            }
            let r = run(url, &args);
            assert_eq!(r.code, 0, "{}", r.stderr);
        }
        let mut args = vec![
            "--storage-path",
            root.to_str().unwrap(),
            "search",
            "--user",
            user,
            "Rust",
        ];
        if let Some(a) = agent {
            args.extend(["--agent", a]);
        }
        assert_eq!(run(url, &args).code, 0);
    }
}

#[test]
fn file_to_postgres_to_file_is_byte_identical_and_idempotent() {
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let url = cluster.url().to_owned();
    let scratch = tempfile::tempdir().unwrap();

    let fixture = scratch.path().join("python-v2");
    deermem_testkit::fixtures::copy_tree(
        &deermem_testkit::fixtures::python_deermem_path("v2-root"),
        &fixture,
    );
    round_trip(&url, &fixture, "from_python", scratch.path());

    let engine = scratch.path().join("engine");
    engine_root(&url, &engine);
    // Sidecars as the reference writes them (Python JSON, insertion order): keys out of
    // sorted order and floats that jsonb would rewrite must come back as they were.
    let alice = engine.join("users/alice/agents/__default__");
    let ids: Vec<String> = tree(&alice.join("facts"))
        .keys()
        .map(|p| p.file_stem().unwrap().to_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 4);
    std::fs::create_dir_all(alice.join(".metadata")).unwrap();
    std::fs::write(
        alice.join(".metadata/fact-usage.json"),
        format!(
            "{{\n  \"{}\": {{\n    \"lastAccessedAt\": \"2026-12-02T09:40:05.550132Z\",\n    \"accessHeat\": 1e-05,\n    \"accessCount\": 3\n  }},\n  \"{}\": {{\n    \"accessHeat\": 0.30000000000000004,\n    \"accessCount\": 1,\n    \"lastAccessedAt\": \"2026-12-01T00:00:00Z\"\n  }}\n}}",
            ids[3], ids[0]
        ),
    )
    .unwrap();
    std::fs::write(
        alice.join(".metadata/eviction-audit.json"),
        "[\n  {\n    \"timestamp\": \"2026-12-02T09:40:05Z\",\n    \"maxFacts\": 3,\n    \"evicted\": [\n      {\n        \"id\": \"fact_gone\",\n        \"score\": 0.125,\n        \"category\": \"x'; --\"\n      }\n    ]\n  }\n]",
    )
    .unwrap();
    round_trip(&url, &engine, "from_engine", scratch.path());

    // Same place twice, a file source that is not there: refused before anything moves.
    let r = run(
        &url,
        &["migrate", "--from", &file(&engine), "--to", &file(&engine)],
    );
    assert_eq!(r.code, 5, "{}", r.stderr);
    assert!(r.stderr.contains("same storage"), "{}", r.stderr);
    let missing = scratch.path().join("missing");
    let r = run(
        &url,
        &[
            "migrate",
            "--from",
            &file(&missing),
            "--to",
            "$DEERMEM_NOT_SET_ANYWHERE",
        ],
    );
    assert_eq!(r.code, 5, "{}", r.stderr);
    assert!(
        r.stderr.contains("DEERMEM_NOT_SET_ANYWHERE is not set"),
        "{}",
        r.stderr
    );
    // A source schema that was never written is named, not created.
    let r = run(
        &url,
        &[
            "migrate",
            "--from",
            &format!("${URL_VAR}"),
            "--to",
            &file(&missing),
            "--pg-schema",
            "nothing_here",
        ],
    );
    assert_eq!(r.code, 5, "{}", r.stderr);
    assert!(r.stderr.contains("nothing_here"), "{}", r.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupted_runs_resume_and_differing_destinations_are_refused() {
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let url = cluster.url().to_owned();
    let pg = format!("${URL_VAR}");
    let scratch = tempfile::tempdir().unwrap();
    let src = scratch.path().join("src");
    deermem_testkit::fixtures::copy_tree(
        &deermem_testkit::fixtures::python_deermem_path("v2-root"),
        &src,
    );
    let before = tree(&src);
    let schema = "resume";
    let empty = scratch.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    // An empty source: nothing to move, but the destination schema is created.
    let (code, report, _) = transfer(&url, &file(&empty), &pg, &["--pg-schema", schema]);
    assert_eq!((code, report["summary"]["scopes"].as_u64()), (0, Some(0)));

    // One user's copy fails inside the database, halfway through its transaction.
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(
            "CREATE FUNCTION resume.fail_alice() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN IF NEW.bucket = 'alice' THEN RAISE EXCEPTION 'injected failure'; END IF; \
             RETURN NEW; END $$; \
             CREATE TRIGGER fail_alice BEFORE INSERT ON resume.facts FOR EACH ROW \
             EXECUTE FUNCTION resume.fail_alice();",
        )
        .await
        .unwrap();
    let (code, report, _) = transfer(&url, &file(&src), &pg, &["--pg-schema", schema]);
    assert_eq!(code, 1, "{report}");
    let s = statuses(&report);
    assert_eq!(s["alice"], "failed");
    assert!(
        report["scopes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["error"]
                .as_str()
                .is_some_and(|e| e.contains("injected failure"))),
        "{report}"
    );
    assert!(
        s.iter()
            .filter(|(b, _)| *b != "alice")
            .all(|(_, v)| v == "copied"),
        "{s:?}"
    );
    // Nothing of alice is in the database: her transaction was rolled back whole.
    let alice: i64 = client
        .query_one(
            "SELECT (SELECT count(*) FROM resume.facts WHERE bucket = 'alice') + \
             (SELECT count(*) FROM resume.users WHERE bucket = 'alice' AND revision > 0)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(alice, 0);

    // The failure goes away; the next run copies alice and leaves the verified users alone.
    client
        .batch_execute("DROP TRIGGER fail_alice ON resume.facts")
        .await
        .unwrap();
    let (code, report, _) = transfer(&url, &file(&src), &pg, &["--pg-schema", schema]);
    assert_eq!(code, 0, "{report}");
    let s = statuses(&report);
    assert_eq!(s["alice"], "copied");
    assert!(
        s.iter()
            .filter(|(b, _)| *b != "alice")
            .all(|(_, v)| v == "unchanged"),
        "{s:?}"
    );

    // Back to files, then a file-side write interrupted before its manifest: resumed too.
    let back = scratch.path().join("back");
    let (code, _, _) = transfer(&url, &pg, &file(&back), &["--pg-schema", schema]);
    assert_eq!(code, 0);
    assert_same_tree(&before, &tree(&back));
    let alice_dir = back.join("users/alice");
    std::fs::write(alice_dir.join(".transfer-incomplete"), b"").unwrap();
    std::fs::remove_file(alice_dir.join("memory.json")).unwrap();
    // As a source, the half-written user is refused by name rather than skipped.
    let r = run(
        &url,
        &[
            "migrate",
            "--from",
            &file(&back),
            "--to",
            &pg,
            "--pg-schema",
            "other",
        ],
    );
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("alice: FAILED") && r.stdout.contains("left incomplete"),
        "{}",
        r.stdout
    );
    let (code, report, _) = transfer(&url, &pg, &file(&back), &["--pg-schema", schema]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(statuses(&report)["alice"], "copied");
    assert_same_tree(&before, &tree(&back));

    // A destination user changed since: refused, named, and left as it is.
    let r = run(
        &url,
        &[
            "--storage-path",
            back.to_str().unwrap(),
            "facts",
            "add",
            "--user",
            "alice",
            "--content",
            "written after the copy",
        ],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let changed = tree(&back);
    let r = run(
        &url,
        &[
            "migrate",
            "--from",
            &pg,
            "--to",
            &file(&back),
            "--pg-schema",
            schema,
        ],
    );
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("alice: FAILED")
            && r.stdout
                .contains("\"alice\" already exists in the destination")
            && r.stdout.contains("--overwrite"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout
            .contains("Total: 5 users (copied=0 unchanged=4 failed=1)"),
        "{}",
        r.stdout
    );
    assert_same_tree(&changed, &tree(&back));
    // With --overwrite the destination is the source again.
    let (code, report, _) = transfer(
        &url,
        &pg,
        &file(&back),
        &["--pg-schema", schema, "--overwrite"],
    );
    assert_eq!(code, 0, "{report}");
    assert_eq!(statuses(&report)["alice"], "copied");
    assert_same_tree(&before, &tree(&back));
}
