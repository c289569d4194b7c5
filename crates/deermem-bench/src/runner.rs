//! The harness: argument parsing, one child process per workload (`deermem-bench --workload
//! NAME`, so each workload's peak RSS is its own and no state leaks between workloads), the
//! table, the target checks and the JSON report.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use serde_json::{Map, Value, json};

use crate::corpus;
use crate::machine;
use crate::sizes::Sizes;
use crate::workloads::{self, Env, Store};

/// The marker of the result line a child prints on stdout.
pub const RESULT_MARKER: &str = "DEERMEM_BENCH_RESULT ";

/// The usage text.
pub const USAGE: &str = "usage: deermem-bench [--quick | --smoke] [--corpus FILE] [--queries FILE] [--json OUT]
                     [--only NAME,NAME...] [--tmpdir DIR] [--store file|postgres]
       deermem-bench --write-corpus FILE [--write-queries FILE] [--quick | --smoke]
       deermem-bench --list

Runs the named DeerMem workloads, each in its own child process on a fresh temporary root,
prints a table and, with --json, writes {\"workloads\": {...}, \"skipped\": {...}, \"machine\": {...}}.
Workloads that need the local embedding model (embed_local, search_hybrid) are skipped with a
note unless it has been fetched (`cargo xtask model fetch`).
--corpus: JSON lines {\"user\", \"agent\", \"content\", \"category\", \"confidence\"} (agent null = default
bucket); --queries: one query per line. Without them the data is generated with a fixed seed;
--write-corpus / --write-queries save the generated data for other implementations.
--store postgres runs the PostgreSQL workloads (write_fact, load_scope_cold, load_scope_warm,
load_scope_warm_revision_check, search, revision_check, get_context, get_context_revision_check,
gateway_get, gateway_post), each against its own throwaway durable cluster.";

/// Parsed command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    /// Sizes preset name.
    pub preset: String,
    /// `--corpus`.
    pub corpus: Option<PathBuf>,
    /// `--queries`.
    pub queries: Option<PathBuf>,
    /// `--json`.
    pub json: Option<PathBuf>,
    /// `--only`.
    pub only: Option<Vec<String>>,
    /// `--tmpdir`.
    pub tmpdir: Option<PathBuf>,
    /// `--workload` (child mode).
    pub workload: Option<String>,
    /// `--write-corpus`.
    pub write_corpus: Option<PathBuf>,
    /// `--write-queries`.
    pub write_queries: Option<PathBuf>,
    /// `--list`.
    pub list: bool,
    /// `--help`.
    pub help: bool,
    /// `--store`.
    pub store: Store,
}

impl Args {
    /// Parses the arguments after the program name.
    ///
    /// # Errors
    /// Unknown flags, missing values, unknown workloads.
    pub fn parse(args: &[String]) -> Result<Self> {
        let mut a = Args {
            preset: "full".into(),
            corpus: None,
            queries: None,
            json: None,
            only: None,
            tmpdir: None,
            workload: None,
            write_corpus: None,
            write_queries: None,
            list: false,
            help: false,
            store: Store::File,
        };
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            let mut value = || {
                it.next()
                    .cloned()
                    .with_context(|| format!("{flag} needs a value"))
            };
            match flag.as_str() {
                "--quick" => a.preset = "quick".into(),
                "--smoke" => a.preset = "smoke".into(),
                "--size" => a.preset = value()?,
                "--corpus" => a.corpus = Some(value()?.into()),
                "--queries" => a.queries = Some(value()?.into()),
                "--json" => a.json = Some(value()?.into()),
                "--tmpdir" => a.tmpdir = Some(value()?.into()),
                "--workload" => a.workload = Some(value()?),
                "--write-corpus" => a.write_corpus = Some(value()?.into()),
                "--write-queries" => a.write_queries = Some(value()?.into()),
                "--only" => {
                    a.only = Some(value()?.split(',').map(|s| s.trim().to_owned()).collect());
                }
                "--store" => {
                    let v = value()?;
                    a.store = Store::parse(&v)
                        .with_context(|| format!("unknown store {v:?} (file, postgres)"))?;
                }
                "--list" => a.list = true,
                "-h" | "--help" => a.help = true,
                other => bail!("unknown argument {other:?}\n\n{USAGE}"),
            }
        }
        if Sizes::by_name(&a.preset).is_none() {
            bail!("unknown size {:?} (full, quick, smoke)", a.preset);
        }
        for name in a.only.iter().flatten().chain(a.workload.iter()) {
            if !a.store.workloads().contains(&name.as_str()) {
                bail!(
                    "unknown {} workload {name:?} (known: {})",
                    a.store.name(),
                    a.store.workloads().join(", ")
                );
            }
        }
        Ok(a)
    }

    fn sizes(&self) -> Sizes {
        Sizes::by_name(&self.preset).unwrap_or_else(Sizes::full)
    }

    fn tmp_base(&self) -> PathBuf {
        self.tmpdir.clone().unwrap_or_else(std::env::temp_dir)
    }
}

/// Child mode: runs one workload and prints its result line.
///
/// # Errors
/// The workload's failure.
pub fn run_child(args: &Args, name: &str) -> Result<Value> {
    let tmp = tempfile::Builder::new()
        .prefix(&format!("deermem-bench-{name}-"))
        .tempdir_in(args.tmp_base())
        .context("creating the temporary root")?;
    let root = tmp.path().join("root");
    std::fs::create_dir_all(&root)?;
    let env = Env::new(
        args.sizes(),
        args.corpus.as_deref(),
        args.queries.as_deref(),
        root,
    )?;
    // Nothing an earlier workload left dirty is written back during this one, and (as root) no
    // cached inode table remembers its deletions.
    let caches_dropped = workloads::fresh_disk_state();
    let result =
        workloads::run(name, &env, args.store).with_context(|| format!("workload {name}"))?;
    let mut out = result.summary().to_json();
    if let Value::Object(m) = &mut out {
        for (k, v) in result.extra {
            m.insert(k, v);
        }
        m.insert("peak_rss_kb".into(), json!(machine::peak_rss_kb()));
        m.insert("caches_dropped".into(), json!(caches_dropped));
    }
    drop(tmp);
    Ok(out)
}

fn run_in_child(args: &Args, name: &str) -> Result<Value> {
    let exe = std::env::current_exe().context("locating the bench binary")?;
    let mut cmd = Command::new(exe);
    cmd.args([
        "--workload",
        name,
        "--size",
        &args.preset,
        "--store",
        args.store.name(),
    ]);
    if let Some(c) = &args.corpus {
        cmd.arg("--corpus").arg(c);
    }
    if let Some(q) = &args.queries {
        cmd.arg("--queries").arg(q);
    }
    if let Some(t) = &args.tmpdir {
        cmd.arg("--tmpdir").arg(t);
    }
    let out = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("starting the {name} child"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("workload {name} failed ({}):\n{stdout}", out.status);
    }
    let line = stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(RESULT_MARKER))
        .with_context(|| format!("workload {name} printed no result"))?;
    serde_json::from_str(line).with_context(|| format!("workload {name}: bad result line"))
}

/// The PostgreSQL issue's targets, checked against a `--store postgres` report's workloads.
pub fn check_postgres_targets(w: &Map<String, Value>) -> Map<String, Value> {
    let get = |name: &str, key: &str| w.get(name).and_then(|r| r.get(key)).and_then(Value::as_f64);
    let mut out = Map::new();
    let mut put = |name: &str, target: &str, met: Option<bool>| {
        out.insert(name.into(), json!({"target": target, "met": met}));
    };
    put(
        "write_fact",
        "p50 < 3000 us",
        get("write_fact", "p50_us").map(|p| p < 3000.0),
    );
    put(
        "load_scope_warm",
        "p50 < 100 us (coherent: under a read lease)",
        get("load_scope_warm", "p50_us").map(|p| p < 100.0),
    );
    put(
        "search",
        "p50 < 1000 us",
        get("search", "p50_us").map(|p| p < 1000.0),
    );
    put(
        "get_context",
        "warm p50 < 100 us, the coherence check included",
        get("get_context", "p50_us").map(|p| p < 100.0),
    );
    put(
        "gateway_get",
        "> 5000 req/s",
        get("gateway_get", "ops_per_sec").map(|r| r > 5000.0),
    );
    out
}

/// The targets of the benchmark issue, checked against a report's workloads.
pub fn check_targets(w: &Map<String, Value>) -> Map<String, Value> {
    let get = |name: &str, key: &str| w.get(name).and_then(|r| r.get(key)).and_then(Value::as_f64);
    let mut out = Map::new();
    let mut put = |name: &str, target: String, met: Option<bool>| {
        out.insert(name.into(), json!({"target": target, "met": met}));
    };
    // The floor measured in the same minutes as the writes when the run has it.
    let floor = get("write_fact", "paired_floor_ops_per_sec").or(get("fsync_floor", "ops_per_sec"));
    let write = get("write_fact", "ops_per_sec");
    put(
        "write_fact",
        "ops/s >= fsync_floor ops/s / 1.3 (floor paired in the same run)".into(),
        floor.zip(write).map(|(f, w)| w * 1.3 >= f),
    );
    // Sequential creates measured in the same minutes as the parallel ones when the run has
    // them.
    let sequential = get("write_fact_parallel", "paired_sequential_ops_per_sec").or(write);
    let ceiling = get("write_fact_parallel", "floor_scaling")
        .map(|c| format!("; the raw floor scaled {c:.2}x in the same run"))
        .unwrap_or_default();
    put(
        "write_fact_parallel",
        format!(
            "ops/s >= 3 x write_fact ops/s (sequential creates paired in the same run{ceiling})"
        ),
        sequential
            .zip(get("write_fact_parallel", "ops_per_sec"))
            .map(|(w, p)| p >= 3.0 * w),
    );
    put(
        "load_scope_cold",
        "p50 < 2000 us".into(),
        get("load_scope_cold", "p50_us").map(|p| p < 2000.0),
    );
    put(
        "load_scope_warm",
        "p50 < 20 us".into(),
        get("load_scope_warm", "p50_us").map(|p| p < 20.0),
    );
    put(
        "search",
        "p50 < 300 us, p99 < 2000 us".into(),
        get("search", "p50_us")
            .zip(get("search", "p99_us"))
            .map(|(a, b)| a < 300.0 && b < 2000.0),
    );
    put(
        "rebuild_index",
        "> 20000 facts/s".into(),
        get("rebuild_index", "ops_per_sec").map(|r| r > 20_000.0),
    );
    put(
        "get_context",
        "p50 < 200 us".into(),
        get("get_context", "p50_us").map(|p| p < 200.0),
    );
    put(
        "count_long_fact",
        "p50 < 20000 us (a 20,000-character CJK fact)".into(),
        get("count_long_fact", "p50_us").map(|p| p < 20_000.0),
    );
    put(
        "apply_update",
        "p50 < 2000 us plus the commit's fsyncs (p50_without_writes_us)".into(),
        get("apply_update", "p50_without_writes_us").map(|p| p < 2000.0),
    );
    put(
        "gateway_get",
        "> 10000 requests/s".into(),
        get("gateway_get", "ops_per_sec").map(|r| r > 10_000.0),
    );
    put(
        "turn_accept",
        "p50 < 2000 us (acknowledged after the durable journal's fdatasync)".into(),
        get("turn_accept", "p50_us").map(|p| p < 2000.0),
    );
    out
}

fn fmt_num(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(x) if x >= 100.0 => format!("{x:.0}"),
        Some(x) => format!("{x:.1}"),
    }
}

/// The table printed after a run.
pub fn table(report: &Value) -> String {
    let empty = Map::new();
    let w = report["workloads"].as_object().unwrap_or(&empty);
    let t = report["targets"].as_object().unwrap_or(&empty);
    let mut s = format!(
        "{:<20} {:>7} {:>11} {:>10} {:>10} {:>9}  {}\n",
        "workload", "n", "ops/s", "p50 us", "p99 us", "RSS MiB", "target"
    );
    for (name, r) in w {
        let rss = r["peak_rss_kb"].as_f64().map(|kb| kb / 1024.0);
        let target = match t.get(name) {
            Some(tg) => format!(
                "{} {}",
                match tg["met"].as_bool() {
                    Some(true) => "ok  ",
                    Some(false) => "MISS",
                    None => "?   ",
                },
                tg["target"].as_str().unwrap_or("")
            ),
            None => String::new(),
        };
        s.push_str(&format!(
            "{:<20} {:>7} {:>11} {:>10} {:>10} {:>9}  {}\n",
            name,
            r["n"].as_u64().map_or("-".into(), |n| n.to_string()),
            fmt_num(r["ops_per_sec"].as_f64()),
            fmt_num(r["p50_us"].as_f64()),
            fmt_num(r["p99_us"].as_f64()),
            fmt_num(rss),
            target
        ));
    }
    s
}

/// Parent mode: every selected workload in its own child, then the table and the report.
///
/// # Errors
/// A failed workload, or an unwritable report.
pub fn run_all(args: &Args) -> Result<Value> {
    let names: Vec<&str> = args
        .store
        .workloads()
        .iter()
        .copied()
        .filter(|n| args.only.as_ref().is_none_or(|o| o.iter().any(|x| x == n)))
        .collect();
    let mut results = Map::new();
    let mut skipped = Map::new();
    for name in names {
        if workloads::embed::NEED_MODEL.contains(&name)
            && let Err(e) = workloads::embed::model_dir()
        {
            eprintln!("deermem-bench: skipping {name}: {e}");
            skipped.insert(name.to_owned(), json!(e.to_string()));
            continue;
        }
        eprintln!(
            "deermem-bench: running {name} ({}, {})",
            args.preset,
            args.store.name()
        );
        let r = run_in_child(args, name)?;
        results.insert(name.to_owned(), r);
    }
    let targets = match args.store {
        Store::File => check_targets(&results),
        Store::Postgres => check_postgres_targets(&results),
    };
    let report = json!({
        "store": args.store.name(),
        "workloads": results,
        "skipped": skipped,
        "targets": targets,
        "machine": machine::describe(&args.tmp_base()),
        "sizes": args.sizes().to_json(),
        "data": {
            "corpus": args.corpus.as_ref().map(|p| p.display().to_string()),
            "queries": args.queries.as_ref().map(|p| p.display().to_string()),
            "seed": corpus::SEED,
        },
    });
    print!("{}", table(&report));
    if let Some(out) = &args.json {
        write_report(out, &report)?;
        eprintln!("deermem-bench: wrote {}", out.display());
    }
    Ok(report)
}

fn write_report(path: &Path, report: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(report)?;
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
}

/// `--write-corpus` / `--write-queries`: saves the generated data.
///
/// # Errors
/// I/O failures.
pub fn export(args: &Args) -> Result<()> {
    let sizes = args.sizes();
    let facts = corpus::generate_corpus(sizes.corpus_facts, sizes.corpus_scopes, corpus::SEED);
    if let Some(p) = &args.write_corpus {
        corpus::write_corpus(p, &facts)?;
        eprintln!(
            "deermem-bench: wrote {} facts to {}",
            facts.len(),
            p.display()
        );
    }
    if let Some(p) = &args.write_queries {
        let q = corpus::generate_queries(&facts, sizes.queries, corpus::SEED);
        corpus::write_queries(p, &q)?;
        eprintln!(
            "deermem-bench: wrote {} queries to {}",
            q.len(),
            p.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn arguments_parse_and_reject_unknowns() {
        let a = Args::parse(&strings(&[
            "--quick",
            "--json",
            "o.json",
            "--only",
            "search,write_fact",
        ]))
        .unwrap();
        assert_eq!(a.preset, "quick");
        assert_eq!(a.json, Some(PathBuf::from("o.json")));
        assert_eq!(a.only, Some(strings(&["search", "write_fact"])));
        assert!(Args::parse(&strings(&["--bogus"])).is_err());
        assert!(Args::parse(&strings(&["--json"])).is_err());
        assert!(Args::parse(&strings(&["--only", "nope"])).is_err());
        assert!(Args::parse(&strings(&["--size", "huge"])).is_err());
        let p = Args::parse(&strings(&["--store", "postgres", "--only", "search"])).unwrap();
        assert_eq!(p.store, Store::Postgres);
        assert_eq!(Args::parse(&[]).unwrap().store, Store::File);
        assert!(Args::parse(&strings(&["--store", "redis"])).is_err());
        // A workload the store does not run is refused.
        assert!(Args::parse(&strings(&["--store", "postgres", "--only", "fsync_floor"])).is_err());
        assert!(Args::parse(&strings(&["--store", "postgres", "--only", "gateway_get"])).is_ok());
        assert!(Args::parse(&strings(&["--only", "revision_check"])).is_err());
    }

    #[test]
    fn postgres_targets_are_the_issue_s() {
        let w: Map<String, Value> = serde_json::from_value(json!({
            "write_fact": {"p50_us": 2500.0},
            "load_scope_warm": {"p50_us": 450.0},
            "search": {"p50_us": 700.0},
            "get_context": {"p50_us": 150.0},
            "gateway_get": {"ops_per_sec": 5200.0},
        }))
        .unwrap();
        let t = check_postgres_targets(&w);
        assert_eq!(t["write_fact"]["met"], json!(true));
        assert_eq!(t["load_scope_warm"]["met"], json!(false));
        assert_eq!(t["search"]["met"], json!(true));
        assert_eq!(t["get_context"]["met"], json!(false));
        assert_eq!(t["gateway_get"]["met"], json!(true));
    }

    #[test]
    fn targets_are_judged_from_the_figures() {
        let w: Map<String, Value> = serde_json::from_value(json!({
            "fsync_floor": {"ops_per_sec": 100.0},
            "write_fact": {"ops_per_sec": 80.0},
            "write_fact_parallel": {"ops_per_sec": 200.0},
            "load_scope_warm": {"p50_us": 12.0},
            "search": {"p50_us": 100.0, "p99_us": 2500.0},
        }))
        .unwrap();
        let t = check_targets(&w);
        assert_eq!(t["write_fact"]["met"], json!(true));
        assert_eq!(t["write_fact_parallel"]["met"], json!(false));
        assert_eq!(t["load_scope_warm"]["met"], json!(true));
        assert_eq!(t["search"]["met"], json!(false));
        assert_eq!(t["gateway_get"]["met"], Value::Null);
        let report = json!({"workloads": w, "targets": t});
        let text = table(&report);
        assert!(text.contains("MISS"), "{text}");
        assert!(text.lines().count() == 6, "{text}");
    }

    #[test]
    fn the_paired_floor_judges_write_fact_when_present() {
        let w: Map<String, Value> = serde_json::from_value(json!({
            "fsync_floor": {"ops_per_sec": 100.0},
            "write_fact": {"ops_per_sec": 80.0, "paired_floor_ops_per_sec": 120.0},
        }))
        .unwrap();
        assert_eq!(check_targets(&w)["write_fact"]["met"], json!(false));
        let w: Map<String, Value> = serde_json::from_value(json!({
            "write_fact": {"ops_per_sec": 80.0, "paired_floor_ops_per_sec": 90.0},
        }))
        .unwrap();
        assert_eq!(check_targets(&w)["write_fact"]["met"], json!(true));
    }

    #[test]
    fn paired_sequential_creates_judge_the_parallel_writes_when_present() {
        let w: Map<String, Value> = serde_json::from_value(json!({
            "write_fact": {"ops_per_sec": 100.0},
            "write_fact_parallel": {"ops_per_sec": 330.0, "paired_sequential_ops_per_sec": 120.0},
        }))
        .unwrap();
        assert_eq!(
            check_targets(&w)["write_fact_parallel"]["met"],
            json!(false)
        );
        let w: Map<String, Value> = serde_json::from_value(json!({
            "write_fact": {"ops_per_sec": 120.0},
            "write_fact_parallel": {"ops_per_sec": 330.0, "paired_sequential_ops_per_sec": 100.0},
        }))
        .unwrap();
        assert_eq!(check_targets(&w)["write_fact_parallel"]["met"], json!(true));
    }
}
