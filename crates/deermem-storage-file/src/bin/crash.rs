//! Crash-test helper (built only with the `fault-injection` feature): applies one fixed
//! multi-fact commit to `<root>` for user `alice`, agent `agent-a` (`<root> create`: a commit
//! that only creates two facts, the kind that writes no pre-image). The integration tests run
//! it with `DEERMEM_FAULT_STEP` naming the protocol step at which the process aborts.

// A crash-test child process: it is killed on purpose, and any failure is the test's finding.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::ExitCode;
use std::sync::Arc;

use deermem_core::ports::Clock;
use deermem_core::prelude::*;
use deermem_core::{
    AgentName, ApplyOptions, ChangeSet, FactDraft, FactId, SummaryPatch, Timestamp, UserId,
};
use deermem_storage_file::{FileStorage, FileStorageConfig};
use serde_json::json;

#[derive(Debug)]
struct FixedClock;

impl Clock for FixedClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_unix_seconds(1_800_000_000)
    }
}

async fn run(root: &str, create_only: bool) -> Result<u64, String> {
    let storage = FileStorage::new(FileStorageConfig::new(root), Arc::new(FixedClock), None)
        .map_err(|e| e.to_string())?;
    let user = UserId::new("alice").map_err(|e| e.to_string())?;
    let agent = AgentName::parse("agent-a").map_err(|e| e.to_string())?;
    if create_only {
        let draft = |id: &str, text: &str| {
            let id = FactId::new(id).map_err(|e| e.to_string())?;
            FactDraft::identified(id, text).map_err(|e| e.to_string())
        };
        let changes = ChangeSet {
            upserts: vec![
                draft("f4", "created by the crashing commit")?,
                draft("f5", "also created by the crashing commit")?,
            ],
            ..ChangeSet::default()
        };
        let r = storage
            .apply_changes(Some(&user), Some(&agent), changes, ApplyOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        return Ok(r.revision);
    }
    let f1 = storage
        .get_fact(
            Some(&user),
            &agent,
            &FactId::new("f1").map_err(|e| e.to_string())?,
        )
        .await
        .map_err(|e| e.to_string())?
        .ok_or("f1 missing")?;
    let mut d1 = f1.to_draft();
    d1.remove("title");
    let d1 = d1
        .with_content("f1 rewritten by the crashing commit")
        .map_err(|e| e.to_string())?;
    let d4 = FactDraft::identified(
        FactId::new("f4").map_err(|e| e.to_string())?,
        "created by the crashing commit",
    )
    .map_err(|e| e.to_string())?;
    let mut user_patch = serde_json::Map::new();
    user_patch.insert(
        "workContext".into(),
        json!({"summary": "crashing commit", "updatedAt": "now"}),
    );
    let changes = ChangeSet {
        upserts: vec![d1, d4],
        deletes: vec![FactId::new("f2").map_err(|e| e.to_string())?],
        summaries: Some(SummaryPatch {
            user: Some(user_patch),
            history: None,
        }),
        ..ChangeSet::default()
    };
    let r = storage
        .apply_changes(Some(&user), Some(&agent), changes, ApplyOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    Ok(r.revision)
}

fn main() -> ExitCode {
    let Some(root) = std::env::args().nth(1) else {
        eprintln!("usage: deermem-storage-crash <root> [create]");
        return ExitCode::from(2);
    };
    let create_only = std::env::args().nth(2).as_deref() == Some("create");
    let rt = match tokio::runtime::Builder::new_current_thread().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(run(&root, create_only)) {
        Ok(rev) => {
            println!("committed revision {rev}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}
