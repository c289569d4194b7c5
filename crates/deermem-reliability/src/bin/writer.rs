//! Child process of the reliability tests.
//!
//! - `crash <root> <scratch> <run> <seed> <log>`: opens the root (file storage with its FTS5
//!   index), prints `ready`, then runs the seeded mixed workload of
//!   [`deermem_reliability::workload`] until killed, appending `begin` before and `ack` after
//!   each operation to `<log>`.
//! - `concurrent <root> <worker> <tasks> <iterations> <out>`: `tasks` tokio tasks sharing one
//!   storage instance do read-modify-write increments of shared counter facts of two users with
//!   both revision preconditions, plus create-only writes of their own facts, and write every
//!   outcome (applied with its revision, or conflict) to `<out>` as JSON.

// A crash-test child process: it is killed on purpose, and any failure is the test's finding.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use deermem::SystemClock;
use deermem_core::ports::Clock;
use deermem_core::prelude::*;
use deermem_core::{AgentName, FactDraft, FactId, StorageError, UserId};
use deermem_reliability::workload::{self, LogLine, State};
use deermem_storage_file::FileStorage;
use deermem_updater::DeerMemConfig;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::{Value, json};

fn open(root: &Path) -> Result<FileStorage, String> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    deermem::embedded::open_storage(&DeerMemConfig::default(), root.to_path_buf(), clock, true)
        .map_err(|e| format!("open {}: {e}", root.display()))
}

fn log_line(log: &mut std::fs::File, line: &LogLine) -> Result<(), String> {
    let mut text = serde_json::to_string(line).map_err(|e| e.to_string())?;
    text.push('\n');
    // One write per line: a kill leaves at most the last line torn.
    log.write_all(text.as_bytes()).map_err(|e| e.to_string())
}

async fn crash(args: &[String]) -> Result<(), String> {
    let [root, scratch, run, seed, log] = args else {
        return Err("usage: crash <root> <scratch> <run> <seed> <log>".into());
    };
    let run: u64 = run.parse().map_err(|e| format!("run: {e}"))?;
    let seed: u64 = seed.parse().map_err(|e| format!("seed: {e}"))?;
    let storage = open(Path::new(root))?;
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| format!("log: {e}"))?;
    let mut state: State = workload::read_state(&storage, &[])
        .await
        .map_err(|e| format!("initial load: {e}"))?;
    log_line(
        &mut log,
        &LogLine::Ready {
            revision: state.revision,
        },
    )?;
    println!("ready");
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    let mut rng = StdRng::seed_from_u64(seed);
    for seq in 0..100_000u64 {
        let op = workload::next_op(&mut rng, &state, run, seq);
        log_line(
            &mut log,
            &LogLine::Begin {
                seq,
                op: op.clone(),
            },
        )?;
        let revision = workload::execute(&storage, Path::new(scratch), &op)
            .await
            .map_err(|e| format!("operation {seq} {op:?} failed: {e}"))?;
        let mut next = state.applied(&op);
        if revision != next.revision {
            return Err(format!(
                "operation {seq} reported revision {revision}, expected {}",
                next.revision
            ));
        }
        next.revision = revision;
        state = next;
        log_line(&mut log, &LogLine::Ack { seq, revision })?;
    }
    Ok(())
}

/// The users the concurrent writers share.
const CONCURRENT_USERS: [&str; 2] = ["carol", "dave"];
/// Shared counters per user.
const COUNTERS: u64 = 3;

async fn concurrent_task(
    storage: FileStorage,
    worker: u64,
    task: u64,
    iterations: u64,
) -> Vec<Value> {
    let agent = AgentName::parse("shared").unwrap_or_else(|_| unreachable!("valid agent name"));
    let mut out = Vec::new();
    let mut rng = StdRng::seed_from_u64(worker * 1000 + task);
    for i in 0..iterations {
        let uname = CONCURRENT_USERS[rand::Rng::random_range(&mut rng, 0..2usize)];
        let user = UserId::new(uname).unwrap_or_else(|_| unreachable!("valid user id"));
        let counter = format!("counter_{}", rand::Rng::random_range(&mut rng, 0..COUNTERS));
        let outcome = async {
            let doc = storage.load(Some(&user), Some(&agent)).await?;
            let (count, expected) = match doc.fact(&counter) {
                Some(f) => {
                    let n: u64 = f
                        .content
                        .trim_start_matches("count ")
                        .parse()
                        .map_err(|_| StorageError::corrupt(format!("torn counter {f:?}")))?;
                    (n + 1, Some(f.revision))
                }
                None => (1, None),
            };
            let mut d = FactDraft::identified(FactId::new(&counter)?, &format!("count {count}"))?;
            if let Some(r) = expected {
                d = d.with_revision(r)?;
            }
            let r = storage
                .upsert_fact(Some(&user), &agent, d, Some(doc.revision), expected)
                .await?;
            Ok::<_, StorageError>((count, r.revision))
        }
        .await;
        out.push(match outcome {
            Ok((count, revision)) => json!({"user": uname, "id": counter, "kind": "increment",
                                           "count": count, "revision": revision}),
            Err(e) if e.is_conflict() => json!({"user": uname, "id": counter, "kind": "conflict"}),
            Err(e) => {
                json!({"user": uname, "id": counter, "kind": "error", "error": e.to_string()})
            }
        });
        // A create-only fact of this task: rebases over everyone else's commits.
        let own = format!("w{worker}_t{task}_i{i}");
        let d = FactId::new(&own)
            .map_err(StorageError::from)
            .and_then(|id| Ok(FactDraft::identified(id, &format!("own fact {own}"))?));
        out.push(
            match async {
                storage
                    .upsert_fact(Some(&user), &agent, d?, None, None)
                    .await
            }
            .await
            {
                Ok(r) => json!({"user": uname, "id": own, "kind": "own", "revision": r.revision}),
                Err(e) if e.is_conflict() => json!({"user": uname, "id": own, "kind": "conflict"}),
                Err(e) => {
                    json!({"user": uname, "id": own, "kind": "error", "error": e.to_string()})
                }
            },
        );
    }
    out
}

async fn concurrent(args: &[String]) -> Result<(), String> {
    let [root, worker, tasks, iterations, out] = args else {
        return Err("usage: concurrent <root> <worker> <tasks> <iterations> <out>".into());
    };
    let worker: u64 = worker.parse().map_err(|e| format!("worker: {e}"))?;
    let tasks: u64 = tasks.parse().map_err(|e| format!("tasks: {e}"))?;
    let iterations: u64 = iterations.parse().map_err(|e| format!("iterations: {e}"))?;
    let storage = open(Path::new(root))?;
    let handles: Vec<_> = (0..tasks)
        .map(|t| tokio::spawn(concurrent_task(storage.clone(), worker, t, iterations)))
        .collect();
    let mut all = Vec::new();
    for (t, h) in handles.into_iter().enumerate() {
        let records = h.await.map_err(|e| format!("task {t}: {e}"))?;
        all.push(json!({"task": t, "records": records}));
    }
    let text = serde_json::to_string(&json!({"worker": worker, "tasks": all}))
        .map_err(|e| e.to_string())?;
    std::fs::write(PathBuf::from(out), text).map_err(|e| format!("write {out}: {e}"))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = match args.first().map(String::as_str) {
        Some("crash") => rt.block_on(crash(&args[1..])),
        Some("concurrent") => rt.block_on(concurrent(&args[1..])),
        _ => Err("usage: deermem-reliability-writer crash|concurrent ...".into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(3)
        }
    }
}
