//! The storage contract suite run against `FileStorage` in a temporary root.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use deermem_storage_file::{FileStorage, FileStorageConfig};
use deermem_testkit::clock::ManualClock;
use deermem_testkit::storage::{START, StorageFixture};

async fn fixture() -> StorageFixture {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = Arc::new(ManualClock::at(START));
    let storage =
        FileStorage::new(FileStorageConfig::new(dir.path()), clock.clone(), None).expect("storage");
    StorageFixture {
        storage: Arc::new(storage),
        clock,
        guard: Box::new(dir),
    }
}

deermem_testkit::storage_contract!(fixture());

/// The run journal port's contract against the file journal in a temporary directory.
mod run_journal {
    use std::sync::Arc;

    use deermem_storage_file::{RunJournal, RunJournalOptions};
    use deermem_testkit::run_journal::RunJournalFixture;

    async fn fixture() -> RunJournalFixture {
        let dir = tempfile::tempdir().expect("temp dir");
        let journal = RunJournal::open(
            RunJournal::dir_for_storage_root(dir.path()),
            RunJournalOptions::default(),
        )
        .expect("journal");
        RunJournalFixture {
            store: Arc::new(journal),
            guard: Box::new(dir),
        }
    }

    deermem_testkit::run_journal_contract!(fixture());
}

/// The turn journal port's contract against the file journal in a temporary directory.
mod turn_journal {
    use std::path::PathBuf;
    use std::sync::Arc;

    use deermem_core::ports::TurnJournal;
    use deermem_storage_file::{FileTurnJournal, FileTurnJournalOptions};
    use deermem_testkit::turn_journal::TurnJournalFixture;

    fn open(dir: PathBuf) -> Arc<dyn TurnJournal> {
        Arc::new(FileTurnJournal::open(dir, FileTurnJournalOptions::default()).expect("journal"))
    }

    async fn fixture() -> TurnJournalFixture {
        let root = tempfile::tempdir().expect("temp dir");
        let dir = FileTurnJournal::dir_for_storage_root(root.path());
        let journal = open(dir.clone());
        TurnJournalFixture {
            journal,
            reopen: Box::new(move || {
                let dir = dir.clone();
                Box::pin(async move { open(dir) })
            }),
            guard: Box::new(root),
        }
    }

    deermem_testkit::turn_journal_contract!(fixture());
}

/// The same contract against the journals of a storage root as one process sees them
/// (`DeferredFileTurnJournal`: its own slot plus the slots of processes that stopped).
mod deferred_turn_journal {
    use std::sync::Arc;

    use deermem_core::ports::TurnJournal;
    use deermem_storage_file::{DeferredFileTurnJournal, FileTurnJournalOptions};
    use deermem_testkit::turn_journal::TurnJournalFixture;

    fn open(root: &std::path::Path) -> Arc<dyn TurnJournal> {
        Arc::new(DeferredFileTurnJournal::in_root(
            root,
            FileTurnJournalOptions::default(),
        ))
    }

    async fn fixture() -> TurnJournalFixture {
        let root = tempfile::tempdir().expect("temp dir");
        let path = root.path().to_path_buf();
        TurnJournalFixture {
            journal: open(&path),
            reopen: Box::new(move || {
                let path = path.clone();
                Box::pin(async move { open(&path) })
            }),
            guard: Box::new(root),
        }
    }

    deermem_testkit::turn_journal_contract!(fixture());
}

/// Several processes accepting turns on one root: each writes a journal slot of its own, and
/// the turns of one that stopped are taken over by the next claim of another.
mod journal_slots {
    use std::path::Path;

    use deermem_core::Timestamp;
    use deermem_core::ports::TurnJournal;
    use deermem_core::ports::turn_journal::{ClaimRequest, TurnId};
    use deermem_storage_file::{DeferredFileTurnJournal, FileTurnJournal, FileTurnJournalOptions};
    use deermem_testkit::turn_journal::turn;

    fn journal(root: &Path) -> DeferredFileTurnJournal {
        DeferredFileTurnJournal::in_root(root, FileTurnJournalOptions::default())
    }

    fn claim(owner: &str) -> ClaimRequest {
        ClaimRequest {
            owner: owner.into(),
            now: Timestamp::from_unix_seconds(1_000),
            lease: std::time::Duration::from_secs(60),
            limit: 0,
        }
    }

    fn ids(items: &[deermem_core::ports::turn_journal::TurnItem]) -> Vec<String> {
        let mut v: Vec<String> = items.iter().map(|i| i.id().to_string()).collect();
        v.sort();
        v
    }

    #[tokio::test]
    async fn two_processes_write_two_slots_and_a_survivor_takes_over_the_stopped_ones_turns() {
        let root = tempfile::tempdir().unwrap();
        let a = journal(root.path());
        let b = journal(root.path());
        a.append(turn("t-a1", Some("ann"), 1)).await.unwrap();
        // `a` holds the first slot: `b` writes the next one instead of being refused.
        b.append(turn("t-b1", Some("ben"), 2)).await.unwrap();
        assert!(root.path().join(".turns/journal.jsonl").is_file());
        assert!(root.path().join(".turns/1/journal.jsonl").is_file());
        // An operator's listing reads every slot.
        assert_eq!(
            ids(&FileTurnJournal::read_items(root.path()).unwrap()),
            ["t-a1", "t-b1"]
        );
        // While `a` lives its turns are its own.
        assert_eq!(ids(&b.claim(&claim("b")).await.unwrap()), ["t-b1"]);
        // `a` stops (its lock is released as a killed process's would be).
        drop(a);
        let taken = b.claim(&claim("b")).await.unwrap();
        assert_eq!(ids(&taken), ["t-a1", "t-b1"]);
        assert_eq!(b.counts().await.unwrap().pending, 2);
        assert!(b.complete(&TurnId::parse("t-a1").unwrap()).await.unwrap());
        assert!(b.complete(&TurnId::parse("t-b1").unwrap()).await.unwrap());
        assert!(FileTurnJournal::read_items(root.path()).unwrap().is_empty());
        // The emptied slot is let go at the next claim round: a third process can take it.
        assert!(b.claim(&claim("b")).await.unwrap().is_empty());
        let c = journal(root.path());
        c.append(turn("t-c1", Some("cy"), 3)).await.unwrap();
        assert_eq!(
            ids(&FileTurnJournal::read_items(root.path()).unwrap()),
            ["t-c1"]
        );
        assert!(
            std::fs::read_to_string(root.path().join(".turns/journal.jsonl"))
                .unwrap()
                .contains("t-c1")
        );
    }

    #[tokio::test]
    async fn a_restarted_process_keeps_writing_the_slot_it_replayed() {
        let root = tempfile::tempdir().unwrap();
        let first = journal(root.path());
        first.append(turn("t-1", Some("ann"), 1)).await.unwrap();
        drop(first);
        let second = journal(root.path());
        assert_eq!(ids(&second.claim(&claim("s")).await.unwrap()), ["t-1"]);
        second.append(turn("t-2", Some("ann"), 2)).await.unwrap();
        assert!(!root.path().join(".turns/1").exists());
        assert_eq!(second.list(&Default::default()).await.unwrap().len(), 2);
        // A dead process's turn can be retried or dropped by id (an operator's command).
        let third_root = tempfile::tempdir().unwrap();
        let gone = journal(third_root.path());
        gone.append(turn("t-9", Some("ann"), 1)).await.unwrap();
        let id = TurnId::parse("t-9").unwrap();
        assert!(gone.dead_letter(&id, "model down").await.unwrap());
        drop(gone);
        let operator = journal(third_root.path());
        assert!(operator.retry(&id).await.unwrap().is_some());
        assert!(operator.drop_turn(&id).await.unwrap());
        assert!(
            FileTurnJournal::read_items(third_root.path())
                .unwrap()
                .is_empty()
        );
    }

    #[tokio::test]
    async fn reading_a_root_that_never_took_a_turn_creates_nothing() {
        let root = tempfile::tempdir().unwrap();
        let j = journal(root.path());
        assert!(j.claim(&claim("x")).await.unwrap().is_empty());
        assert_eq!(j.counts().await.unwrap().pending, 0);
        assert!(j.list(&Default::default()).await.unwrap().is_empty());
        assert!(!root.path().join(".turns").exists());
    }
}
