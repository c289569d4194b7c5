//! Run journal costs: recording a new run's `context:memory` event (one durable append:
//! write + fdatasync), a repeated call for an already recorded run (no I/O), reading a run's
//! events from a full 10 000-event index, and rebuilding that index from its file (restart).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use deermem_core::UserId;
use deermem_core::ports::run_journal::EventQuery;
use deermem_storage_file::{RunJournal, RunJournalOptions};

fn bench(c: &mut Criterion) {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join(".runs");
    let user = UserId::default_user();
    let sha = "ab".repeat(32);
    let options = RunJournalOptions::default();
    let journal = RunJournal::open(&dir, options).expect("open");
    for i in 0..options.max_events_per_user {
        journal
            .record_context_blocking(&user, None, "thread-fill", &format!("run-{i}"), &sha)
            .expect("fill");
    }
    let mut n = 0u64;
    c.bench_function("journal_record_new_run_fsync", |b| {
        b.iter(|| {
            n += 1;
            journal
                .record_context_blocking(&user, None, "thread-bench", &format!("new-{n}"), &sha)
                .expect("record")
        });
    });
    // A retained run in the middle of a full index.
    journal
        .record_context_blocking(&user, None, "thread-probe", "probe", &sha)
        .expect("probe");
    for i in 0..options.max_events_per_user / 2 {
        journal
            .record_context_blocking(&user, None, "thread-fill", &format!("after-{i}"), &sha)
            .expect("fill");
    }
    c.bench_function("journal_record_repeat_no_io", |b| {
        b.iter(|| {
            journal
                .record_context_blocking(&user, None, "thread-probe", "probe", black_box(&sha))
                .expect("repeat")
        });
    });
    let query = EventQuery::default();
    c.bench_function("journal_events_of_one_run_10k_index", |b| {
        b.iter(|| {
            let found = journal
                .events_blocking(&user, "thread-probe", black_box("probe"), &query)
                .expect("events");
            assert!(matches!(found, deermem_core::ports::run_journal::EventsLookup::Events(ref e) if e.len() == 1));
            found
        });
    });
    drop(journal);
    c.bench_function("journal_reopen_and_load_10k_events", |b| {
        b.iter(|| {
            let j = RunJournal::open(&dir, options).expect("open");
            j.retained_events(&user).expect("load")
        });
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = bench
}
criterion_main!(benches);
