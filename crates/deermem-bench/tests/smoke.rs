//! Smoke test of the harness (run by CI): every workload runs end to end at tiny sizes in its
//! own child process and the JSON report is well-formed. No timing is asserted.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

use serde_json::Value;

const WORKLOADS: [&str; 17] = [
    "fsync_floor",
    "write_fact",
    "write_fact_parallel",
    "write_fact_one_user",
    "load_scope_cold",
    "load_scope_warm",
    "search",
    "rebuild_index",
    "embed_local",
    "search_hybrid",
    "get_context",
    "count_long_fact",
    "apply_update",
    "migrate_v1",
    "gateway_get",
    "gateway_post",
    "turn_accept",
];

fn bench(args: &[&str], tmp: &Path) -> Value {
    let out_path = tmp.join("report.json");
    let out = Command::new(env!("CARGO_BIN_EXE_deermem-bench"))
        .args(args)
        .arg("--tmpdir")
        .arg(tmp)
        .arg("--json")
        .arg(&out_path)
        .output()
        .expect("the bench binary starts");
    assert!(
        out.status.success(),
        "bench failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&out_path).expect("the report is written");
    serde_json::from_str(&text).expect("the report is JSON")
}

#[test]
fn every_workload_runs_at_smoke_size_and_reports_sane_json() {
    let tmp = tempfile::tempdir().unwrap();
    let report = bench(&["--smoke"], tmp.path());
    let w = report["workloads"].as_object().expect("workloads object");
    // Without the local model (a fresh clone) exactly the two workloads that need it are
    // skipped, each with its reason; with it, every workload ran.
    let skipped = report["skipped"].as_object().expect("skipped object");
    let model = deermem_bench::workloads::embed::model_dir().is_ok();
    let expected_skips: Vec<&str> = if model {
        Vec::new()
    } else {
        vec!["embed_local", "search_hybrid"]
    };
    assert_eq!(
        skipped.keys().map(String::as_str).collect::<Vec<_>>(),
        expected_skips
    );
    assert!(
        skipped
            .values()
            .all(|r| r.as_str().is_some_and(|r| r.contains("xtask model fetch"))),
        "{skipped:?}"
    );
    let ran: Vec<&str> = WORKLOADS
        .iter()
        .copied()
        .filter(|n| !expected_skips.contains(n))
        .collect();
    assert_eq!(w.keys().map(String::as_str).collect::<Vec<_>>(), ran);
    for (name, r) in w {
        let n = r["n"].as_u64().unwrap_or(0);
        assert!(n > 0, "{name}: n = {n}");
        let ops = r["ops_per_sec"].as_f64().unwrap_or(-1.0);
        let (p50, p99) = (
            r["p50_us"].as_f64().unwrap_or(-1.0),
            r["p99_us"].as_f64().unwrap_or(-1.0),
        );
        assert!(ops > 0.0 && p50 > 0.0 && p99 >= p50, "{name}: {r}");
        assert!(r["peak_rss_kb"].as_u64().unwrap_or(0) > 1000, "{name}: {r}");
    }
    // Every acknowledged turn was in the durable journal before the server stopped.
    assert_eq!(w["turn_accept"]["journal_pending"], w["turn_accept"]["n"]);
    assert!(
        w["turn_accept"]["in_memory_p50_us"]
            .as_f64()
            .is_some_and(|p| p > 0.0),
        "{}",
        w["turn_accept"]
    );
    assert_eq!(w["fsync_floor"]["file_fsyncs_per_op"], 3);
    assert_eq!(w["fsync_floor"]["dir_fsyncs_per_op"], 4);
    assert!(
        w["write_fact"]["paired_floor_ops_per_sec"]
            .as_f64()
            .is_some_and(|f| f > 0.0),
        "{}",
        w["write_fact"]
    );
    assert!(w["write_fact"]["caches_dropped"].is_boolean());
    assert!(
        w["write_fact_parallel"]["parallel_floor_ops_per_sec"]
            .as_f64()
            .is_some_and(|f| f > 0.0),
        "{}",
        w["write_fact_parallel"]
    );
    for key in [
        "floor_scaling",
        "sequential_floor_ops_per_sec",
        "cpu_us_per_op",
    ] {
        assert!(
            w["write_fact_parallel"][key]
                .as_f64()
                .is_some_and(|f| f > 0.0),
            "{key}: {}",
            w["write_fact_parallel"]
        );
    }
    // Every create of the one-scope run is in some commit, and no commit is empty.
    let one = &w["write_fact_one_user"];
    let (n, commits) = (one["n"].as_u64().unwrap(), one["commits"].as_u64().unwrap());
    assert!(commits >= 1 && commits <= n, "{one}");
    assert_eq!(w["apply_update"]["created_per_cycle"], 5);
    assert_eq!(w["apply_update"]["removed_per_cycle"], 1);
    assert_eq!(w["rebuild_index"]["n"], 40, "the smoke corpus has 40 facts");
    if model {
        assert_eq!(w["embed_local"]["n"], 40, "every corpus fact is embedded");
        assert_eq!(
            w["search_hybrid"]["embedded"], 40,
            "every fact has its vector"
        );
        assert!(
            w["search_hybrid"]["model"]
                .as_str()
                .is_some_and(|m| m.starts_with("local:")),
            "{}",
            w["search_hybrid"]
        );
    }
    assert_eq!(w["migrate_v1"]["facts_migrated"], 15);
    assert_eq!(w["count_long_fact"]["fact_chars"], 20_000);
    let m = &report["machine"];
    for key in ["cpu", "kernel", "rustc", "tmp_filesystem"] {
        assert!(
            m[key].as_str().is_some_and(|s| !s.is_empty()),
            "machine.{key}: {m}"
        );
    }
    assert!(m["cores"].as_u64().unwrap_or(0) >= 1);
    assert_eq!(report["targets"].as_object().map(|t| t.len()), Some(11));
    // Every temporary root was removed by its child.
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("deermem-bench-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn corpus_and_query_files_drive_the_search() {
    let tmp = tempfile::tempdir().unwrap();
    let corpus = tmp.path().join("corpus.jsonl");
    let queries = tmp.path().join("queries.txt");
    let mut lines = String::new();
    for i in 0..12 {
        let agent = if i % 2 == 0 {
            "null".to_owned()
        } else {
            "\"coder\"".to_owned()
        };
        lines.push_str(&format!(
            "{{\"user\": \"u{}@x.example\", \"agent\": {agent}, \"content\": \"walrus number {i} likes herring\", \"category\": \"preference\", \"confidence\": 0.9}}\n",
            i % 3
        ));
    }
    std::fs::write(&corpus, lines).unwrap();
    std::fs::write(&queries, "walrus\nherring likes\n\nnothing-matches-this\n").unwrap();
    let c = corpus.to_str().unwrap();
    let q = queries.to_str().unwrap();
    let report = bench(
        &[
            "--smoke",
            "--only",
            "search,rebuild_index",
            "--corpus",
            c,
            "--queries",
            q,
        ],
        tmp.path(),
    );
    let w = &report["workloads"];
    assert_eq!(w["search"]["n"], 3, "one search per non-blank query line");
    assert_eq!(w["search"]["queries_with_hits"], 2);
    assert_eq!(w["rebuild_index"]["n"], 12);
    assert_eq!(w["rebuild_index"]["scopes"], 6);
    assert!(w.get("write_fact").is_none());
    assert_eq!(report["data"]["corpus"], c);
}

#[test]
fn generated_data_can_be_exported() {
    let tmp = tempfile::tempdir().unwrap();
    let corpus = tmp.path().join("c.jsonl");
    let queries = tmp.path().join("q.txt");
    let status = Command::new(env!("CARGO_BIN_EXE_deermem-bench"))
        .args(["--smoke", "--write-corpus"])
        .arg(&corpus)
        .arg("--write-queries")
        .arg(&queries)
        .status()
        .unwrap();
    assert!(status.success());
    let text = std::fs::read_to_string(&corpus).unwrap();
    assert_eq!(text.lines().count(), 40);
    let first: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    for key in ["user", "agent", "content", "category", "confidence"] {
        assert!(first.get(key).is_some(), "{key} missing in {first}");
    }
    assert_eq!(
        std::fs::read_to_string(&queries).unwrap().lines().count(),
        5
    );
}

#[test]
fn bad_arguments_fail_with_a_message() {
    let out = Command::new(env!("CARGO_BIN_EXE_deermem-bench"))
        .args(["--only", "no_such_workload"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no_such_workload"));
}

/// `--store postgres`: every PostgreSQL workload (the gateway's included) runs end to end at
/// smoke size against its own throwaway durable cluster, finds what it seeded, and is judged
/// against the targets.
#[test]
fn postgres_workloads_run_at_smoke_size() {
    let tmp = tempfile::tempdir().unwrap();
    let report = bench(&["--smoke", "--store", "postgres"], tmp.path());
    assert_eq!(report["store"], "postgres");
    let w = report["workloads"].as_object().expect("workloads object");
    assert_eq!(
        w.keys().map(String::as_str).collect::<Vec<_>>(),
        [
            "write_fact",
            "load_scope_cold",
            "load_scope_warm",
            "load_scope_warm_revision_check",
            "search",
            "revision_check",
            "get_context",
            "get_context_revision_check",
            "gateway_get",
            "gateway_post",
            "write_replicas",
            "write_replicas_revision_check"
        ]
    );
    for (name, r) in w {
        assert!(r["n"].as_u64().unwrap_or(0) > 0, "{name}: {r}");
        let (p50, p99) = (
            r["p50_us"].as_f64().unwrap_or(-1.0),
            r["p99_us"].as_f64().unwrap_or(-1.0),
        );
        assert!(p50 > 0.0 && p99 >= p50, "{name}: {r}");
    }
    assert_eq!(w["write_fact"]["revision"], w["write_fact"]["n"]);
    assert!(
        w["search"]["queries_with_hits"].as_u64().unwrap_or(0) > 0,
        "{}",
        w["search"]
    );
    let t = report["targets"].as_object().expect("targets");
    assert_eq!(
        t.keys().map(String::as_str).collect::<Vec<_>>(),
        [
            "write_fact",
            "load_scope_warm",
            "search",
            "get_context",
            "gateway_get"
        ]
    );
    // Every acknowledged create over the gateway was stored (the workload checks it).
    assert!(
        w["gateway_post"]["created"].as_u64().unwrap_or(0) > 0,
        "{}",
        w["gateway_post"]
    );
}

/// The scale run end to end at its smallest size on the file store: every phase gives its
/// entry for the size, with sane figures.
#[test]
fn the_scale_run_measures_every_phase_of_a_small_file_store() {
    let tmp = tempfile::tempdir().unwrap();
    let report = bench(
        &["scale", "--store", "file", "--sizes", "200", "--ops", "20"],
        tmp.path(),
    );
    assert_eq!(report["store"], "file");
    let entries = report["entries"].as_array().expect("entries");
    let of = |w: &str| entries.iter().find(|e| e["workload"] == w);
    for w in [
        "seed",
        "rebuild_index",
        "search",
        "search_warm",
        "get_context",
        "load_scope_cold",
        "write_fact",
        "serve",
    ] {
        let e = of(w).unwrap_or_else(|| panic!("no {w} entry: {report}"));
        assert_eq!(e["size"], 200, "{e}");
        assert_eq!(e["users"], 2, "{e}");
    }
    assert_eq!(of("rebuild_index").unwrap()["indexed"], 200);
    let search = of("search").unwrap();
    assert_eq!(search["n"], 20);
    assert!(search["p50_us"].as_f64().unwrap() > 0.0, "{search}");
    assert_eq!(of("serve").unwrap()["users_served"], 2);
    // Whether any search read from the disk depends on the machine (the page cache is dropped
    // only as root); when one did, the split is a subset of the pass that read something.
    if let Some(disk) = of("search_from_disk") {
        let n = disk["n"].as_u64().unwrap();
        assert!((1..=20).contains(&n), "{disk}");
        assert!(
            disk["disk_read_kib_per_op"].as_f64().unwrap() > 0.0,
            "{disk}"
        );
        let share = disk["share_of_searches"].as_f64().unwrap();
        assert!((share - n as f64 / 20.0).abs() < 1e-9, "{disk}");
    }
}
