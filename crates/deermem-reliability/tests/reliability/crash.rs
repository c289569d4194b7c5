//! Crash consistency: a writer child doing a stream of mixed `apply_changes` (creates,
//! updates, deletes, summary updates, multi-change batches, lazy v1 migrations) is SIGKILLed at
//! random moments; the root is reopened each time and checked: the journal recovers and leaves
//! nothing behind, every fact file parses, the manifest revision equals the number of committed
//! operations, every acknowledged write is present, and the operation in flight is applied
//! entirely or not at all. 200 cycles in CI, 5,000 with `DEERMEM_LONG=1`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use deermem_core::ports::{MemoryScope, SearchRequest};
use deermem_core::{AgentName, UserId};
use deermem_reliability::workload::{self, AGENT, Op, State, USER};
use deermem_reliability::{figure, pick, verify};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::support;
use deermem_core::prelude::*;

/// The part of the state a load of the main agent shows.
fn main_view(
    s: &State,
) -> (
    u64,
    &std::collections::BTreeMap<String, (String, u64)>,
    &str,
) {
    (s.revision, &s.facts, s.summary.as_str())
}

struct Outcome {
    acked: usize,
    in_flight_applied: bool,
    in_flight: bool,
}

/// One kill cycle: returns what happened; panics with a precise message on any violation.
async fn cycle(
    root: &Path,
    scratch: &Path,
    log: &Path,
    run: u64,
    delay: Duration,
    model: &mut State,
) -> Outcome {
    let _ = std::fs::remove_file(log);
    let mut child = support::writer()
        .arg("crash")
        .arg(root)
        .arg(scratch)
        .arg(run.to_string())
        .arg((run * 7919 + 13).to_string())
        .arg(log)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn writer");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read ready");
    if line.trim() != "ready" {
        let out = child.wait_with_output().expect("wait");
        panic!(
            "cycle {run}: the writer did not start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    tokio::time::sleep(delay).await;
    // SIGKILL: no unwinding, no destructors, no flushing.
    child.kill().expect("kill");
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !stderr.contains("error:"),
        "cycle {run}: the writer failed before it was killed: {stderr}"
    );
    let text = std::fs::read_to_string(log).expect("log");
    let summary = workload::parse_log(&text).unwrap_or_else(|e| panic!("cycle {run}: {e}"));
    assert!(summary.ready, "cycle {run}: no ready line");

    // Every acknowledged operation committed exactly one revision, in order.
    let mut expected = model.clone();
    for (op, rev) in &summary.acked {
        expected = expected.applied(op);
        assert_eq!(*rev, expected.revision, "cycle {run}: ack of {op:?}");
    }

    // Reopen with a fresh instance: the first load recovers the journal.
    let storage = support::storage(root);
    let (u, a) = (UserId::new(USER).unwrap(), AgentName::parse(AGENT).unwrap());
    let doc = storage
        .load(Some(&u), Some(&a))
        .await
        .unwrap_or_else(|e| panic!("cycle {run}: reopening failed: {e}"));
    let udir = root.join("users").join(USER);
    // Recovery removed the journal and the pre-images (temporaries of a pending legacy
    // migration are cleaned when that agent is loaded, checked below).
    assert!(
        !udir.join(".memory.journal.json").exists(),
        "cycle {run}: journal left"
    );
    let pre_images = verify::paths(&udir.join(".recovery"));
    assert!(
        pre_images.is_empty(),
        "cycle {run}: pre-images left: {pre_images:?}"
    );
    let seen = State {
        revision: doc.revision,
        facts: doc
            .facts
            .iter()
            .map(|f| (f.id.to_string(), (f.content.clone(), f.revision)))
            .collect(),
        summary: doc.user.entry("workContext").summary,
        legacy: Default::default(),
    };
    let after = summary.in_flight.as_ref().map(|op| expected.applied(op));
    let applied = if main_view(&seen) == main_view(&expected) {
        false
    } else if after
        .as_ref()
        .is_some_and(|s| main_view(&seen) == main_view(s))
    {
        true
    } else {
        panic!(
            "cycle {run}: the recovered root matches neither the acknowledged state nor it plus \
             the operation in flight ({:?})\nrecovered: {seen:?}\nacknowledged: {expected:?}",
            summary.in_flight
        );
    };
    // Every fact file below the user directory parses (the load above read the main agent's;
    // this reads every agent's, legacy ones included, which completes pending migrations).
    let mut legacy_names: Vec<String> = summary
        .acked
        .iter()
        .map(|(op, _)| op)
        .chain(summary.in_flight.iter())
        .filter_map(|op| match op {
            Op::Migrate { agent, .. } => Some(agent.clone()),
            _ => None,
        })
        .collect();
    legacy_names.sort();
    let state = workload::read_state(&storage, &legacy_names)
        .await
        .unwrap_or_else(|e| panic!("cycle {run}: reading back failed: {e}"));
    assert_eq!(main_view(&state).1, main_view(&seen).1, "cycle {run}");
    for (op, _) in &summary.acked {
        if let Op::Migrate { agent, facts } = op {
            let want: std::collections::BTreeMap<_, _> = facts.iter().cloned().collect();
            assert_eq!(
                state.legacy.get(agent),
                Some(&want),
                "cycle {run}: migration {agent}"
            );
            assert!(
                !udir.join("agents").join(agent).join("memory.json").exists(),
                "cycle {run}: an acknowledged migration left its legacy file"
            );
        }
    }
    if let Some(Op::Migrate { agent, facts }) = &summary.in_flight {
        let want: std::collections::BTreeMap<_, _> = facts.iter().cloned().collect();
        let got = state.legacy.get(agent);
        assert!(
            got.is_none() || got == Some(&want),
            "cycle {run}: half a migration: {got:?}"
        );
    }
    for f in verify::fact_files(&udir) {
        let id = Path::new(&f)
            .file_stem()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let agent_dir = f.split('/').nth(1).unwrap_or_default().to_owned();
        let agent = AgentName::parse(&agent_dir).unwrap();
        let bytes = std::fs::read(udir.join(&f)).unwrap();
        deermem_storage_file::probe::parse_fact_file(
            &bytes,
            &id,
            Some(&u),
            &agent,
            deermem_core::Timestamp::from_unix_seconds(1_800_000_000),
        )
        .unwrap_or_else(|e| panic!("cycle {run}: {f} does not parse: {e}"));
    }
    let left = verify::leftovers(&udir);
    assert!(
        left.is_empty(),
        "cycle {run}: leftovers after reading every agent: {left:?}"
    );
    storage.close().await;
    let mut next = state;
    let mut legacy = std::mem::take(&mut model.legacy);
    legacy.extend(next.legacy);
    next.legacy = legacy;
    *model = next;
    Outcome {
        acked: summary.acked.len(),
        in_flight_applied: applied,
        in_flight: summary.in_flight.is_some(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_random_moments_loses_no_acknowledged_write() {
    let cycles: u64 = pick(200, 5_000);
    let started = Instant::now();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let scratch = tmp.path().join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    let log = tmp.path().join("writer.log");
    let mut rng = StdRng::seed_from_u64(0x5eed);
    let mut model = State::default();
    let (mut acked, mut rolled_forward, mut rolled_back) = (0usize, 0usize, 0usize);
    for run in 0..cycles {
        // Mostly short delays (inside the first few commits), sometimes long runs of commits.
        let delay = if rng.random_range(0..5) == 0 {
            Duration::from_millis(rng.random_range(60..400))
        } else {
            Duration::from_micros(rng.random_range(0..60_000))
        };
        let o = cycle(&root, &scratch, &log, run, delay, &mut model).await;
        acked += o.acked;
        if o.in_flight {
            if o.in_flight_applied {
                rolled_forward += 1;
            } else {
                rolled_back += 1;
            }
        }
    }
    // After all the kills the data is still usable through the manager: the last facts are
    // found by search (the index is rebuilt lazily per scope after a restart).
    let manager = support::manager(&root);
    let scope = MemoryScope::new(
        Some(UserId::new(USER).unwrap()),
        Some(AgentName::parse(AGENT).unwrap()),
    );
    for (id, (content, _)) in model.facts.iter().rev().take(5) {
        let hits = manager
            .search(SearchRequest {
                query: content.clone(),
                top_k: 50,
                scope: scope.clone(),
                category: None,
                mode: None,
            })
            .await
            .unwrap();
        assert!(
            hits.iter().any(|h| &h.id == id),
            "{id} ({content}) is not found after the crash cycles"
        );
    }
    let mem = manager.get_memory(scope).await.unwrap();
    assert_eq!(mem.facts.len(), model.facts.len());
    assert_eq!(mem.revision, Some(model.revision));
    manager.close().await;
    let test = "crash";
    figure(test, "kill_cycles_survived", cycles);
    figure(test, "acknowledged_operations", acked);
    figure(test, "in_flight_rolled_forward", rolled_forward);
    figure(test, "in_flight_rolled_back", rolled_back);
    figure(test, "final_revision", model.revision);
    figure(test, "seconds", started.elapsed().as_secs());
    assert!(acked > 0, "no operation was ever acknowledged");
}
