//! The storage contract suite run against `FileMemoryStorage` in a temporary root.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use deermem_storage_file::{FileMemoryStorage, FileStorageConfig};
use deermem_testkit::clock::ManualClock;
use deermem_testkit::storage::{START, StorageFixture};

async fn fixture() -> StorageFixture {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = Arc::new(ManualClock::at(START));
    let storage = FileMemoryStorage::new(FileStorageConfig::new(dir.path()), clock.clone(), None)
        .expect("storage");
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

    fn fixture() -> RunJournalFixture {
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
