//! Injected I/O faults at each step of the commit protocol: a full disk (`ENOSPC` on create and
//! write), `EIO` from `fsync`, and a read-only folder (`EROFS` on create, rename and unlink),
//! each starting at the n-th filesystem operation of a multi-change commit for every n and
//! staying until cleared. The error is reported as a typed I/O error, reads during the fault
//! fail typed or succeed, nothing acknowledged is lost, the commit is applied entirely or not
//! at all, and the next operation succeeds once the fault clears.

use deermem_core::StorageError;
use deermem_core::{AgentName, UserId};
use deermem_reliability::figure;
use deermem_reliability::verify;
use deermem_reliability::workload::{self, AGENT, Op, State, USER};
use deermem_storage_file::fault::inject::{IoFault, arm, disarm};

use crate::support;
use deermem_core::prelude::*;

fn main_view(
    s: &State,
) -> (
    u64,
    &std::collections::BTreeMap<String, (String, u64)>,
    &str,
) {
    (s.revision, &s.facts, s.summary.as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn io_errors_at_each_protocol_step_are_reported_and_lose_nothing() {
    for fault in [IoFault::DiskFull, IoFault::FsyncEio, IoFault::ReadOnly] {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        let scratch = tmp.path().join("scratch");
        std::fs::create_dir_all(&scratch).unwrap();
        let storage = support::storage(&root);
        let (u, a) = (UserId::new(USER).unwrap(), AgentName::parse(AGENT).unwrap());
        for (i, op) in [
            Op::Create {
                id: "f1".into(),
                content: "first".into(),
            },
            Op::Create {
                id: "f2".into(),
                content: "second".into(),
            },
            Op::Summary {
                text: "acknowledged summary".into(),
            },
        ]
        .iter()
        .enumerate()
        {
            workload::execute(&storage, &scratch, op)
                .await
                .unwrap_or_else(|e| panic!("seed {i}: {e}"));
        }
        let mut steps = 0u64;
        let mut reported = 0u64;
        loop {
            let before = workload::read_state(&storage, &[]).await.unwrap();
            // A victim to delete in the faulted commit.
            let victim = format!("victim{steps}");
            let before = {
                let op = Op::Create {
                    id: victim.clone(),
                    content: format!("to delete {steps}"),
                };
                workload::execute(&storage, &scratch, &op).await.unwrap();
                before.applied(&op)
            };
            let f1 = before.facts["f1"].1;
            let op = Op::Batch {
                creates: vec![(format!("new{steps}"), format!("created at step {steps}"))],
                updates: vec![("f1".into(), format!("f1 at step {steps}"), f1)],
                deletes: vec![(victim.clone(), 1)],
                summary: Some(format!("summary at step {steps}")),
                expected: before.revision,
            };
            let after = before.applied(&op);
            arm(&root, fault, steps);
            let result = workload::execute(&storage, &scratch, &op).await;
            // While the fault lasts, reads (which try to recover) fail typed or succeed.
            match storage.load(Some(&u), Some(&a)).await {
                Ok(_) | Err(StorageError::Io { .. }) => {}
                Err(e) => {
                    panic!("{fault:?} step {steps}: a read during the fault failed untyped: {e:?}")
                }
            }
            let failed = disarm(&root);
            match &result {
                Ok(_) => {}
                Err(StorageError::Io { source, .. }) => {
                    reported += 1;
                    assert!(
                        source.raw_os_error().is_some(),
                        "{fault:?} step {steps}: {source}"
                    );
                }
                Err(e) => panic!("{fault:?} step {steps}: not an I/O error: {e:?}"),
            }
            // Once the fault clears, the same instance recovers; the commit is all or nothing.
            let seen = workload::read_state(&storage, &[])
                .await
                .unwrap_or_else(|e| {
                    panic!("{fault:?} step {steps}: no recovery after the fault: {e}")
                });
            let applied = main_view(&seen) == main_view(&after);
            assert!(
                applied || main_view(&seen) == main_view(&before),
                "{fault:?} step {steps}: partial commit\nseen {seen:?}\nbefore {before:?}"
            );
            if result.is_ok() {
                assert!(
                    applied,
                    "{fault:?} step {steps}: acknowledged but not applied"
                );
            }
            // A fresh instance sees the same thing, and nothing is left behind.
            let fresh = support::storage(&root);
            let again = workload::read_state(&fresh, &[]).await.unwrap();
            assert_eq!(
                main_view(&again),
                main_view(&seen),
                "{fault:?} step {steps}"
            );
            fresh.close().await;
            let left = verify::leftovers(&root.join("users").join(USER));
            assert!(
                left.is_empty(),
                "{fault:?} step {steps}: leftovers {left:?}"
            );
            // The next operation succeeds.
            let next = Op::Update {
                id: "f2".into(),
                content: format!("f2 after step {steps}"),
                revision: seen.facts["f2"].1,
            };
            workload::execute(&storage, &scratch, &next)
                .await
                .unwrap_or_else(|e| {
                    panic!("{fault:?} step {steps}: the next operation failed: {e}")
                });
            if failed == 0 {
                assert!(
                    result.is_ok(),
                    "{fault:?}: an error without an injected fault"
                );
                break;
            }
            steps += 1;
            assert!(steps < 500, "{fault:?}: the commit never completes");
        }
        storage.close().await;
        figure("faults", &format!("{fault:?}_steps"), steps);
        figure("faults", &format!("{fault:?}_errors_reported"), reported);
        assert!(reported > 0, "{fault:?}: no step failed");
    }
}
