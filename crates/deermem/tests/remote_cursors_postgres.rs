//! With `storage_class: postgres`, the facade hands the Honcho and OpenViking backends the
//! cursor store in the database: two backend instances with different storage roots (two
//! replicas on two hosts) on one database see each other's cursors, so a thread captured by
//! one is not sent again by the other, and no cursor file is written.

#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg(all(
    feature = "honcho",
    feature = "openviking",
    feature = "storage-postgres"
))]

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use deermem::{BuildOptions, build_manager};
use deermem_backend_honcho::fake::FakeHoncho;
use deermem_backend_openviking::fake::{API_KEY, FakeOv};
use deermem_core::ports::{AddRequest, MemoryScope};
use deermem_core::{MemoryConfig, Message, UserId};
use deermem_testkit::pgcluster::PgCluster;

const FLUSH: Duration = Duration::from_secs(30);
const OV_KEY_ENV: &str = "DEERMEM_TEST_OV_KEY";

fn env(name: &str) -> Option<String> {
    (name == OV_KEY_ENV).then(|| API_KEY.to_owned())
}

fn schema() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "cursors_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

fn load(yaml: &str) -> MemoryConfig {
    deermem::load_config_text(yaml, &env)
        .unwrap_or_else(|e| panic!("config does not load: {e}\n{yaml}"))
        .memory
}

fn postgres_keys(url: &str, schema: &str) -> String {
    format!(
        "    storage_class: postgres\n    postgres:\n      url: {url}\n      schema: {schema}\n"
    )
}

fn options(root: &Path) -> BuildOptions<'static> {
    let mut opts = BuildOptions::new(&env);
    opts.storage_path = Some(root.to_path_buf());
    opts
}

fn add(thread: &str, turns: usize) -> AddRequest {
    let mut messages = Vec::new();
    for i in 0..turns {
        messages.push(Message::human(format!("question {i}")));
        messages.push(Message::ai(format!("answer {i}")));
    }
    AddRequest {
        thread_id: thread.into(),
        messages,
        scope: MemoryScope::user(UserId::new("alice").unwrap()),
        trace_id: None,
    }
}

fn files_under(root: &Path) -> usize {
    walk(root)
}

fn walk(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .flatten()
            .map(|e| {
                let p = e.path();
                if p.is_dir() { walk(&p) } else { 1 }
            })
            .sum()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_honcho_replicas_share_their_cursors_in_the_database() {
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let fake = FakeHoncho::start().await;
    let yaml = format!(
        "memory:\n  manager_class: honcho\n  backend_config:\n    base_url: {}\n{}",
        fake.url,
        postgres_keys(cluster.url(), &schema())
    );
    let config = load(&yaml);
    let (root_a, root_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = build_manager(&config, options(root_a.path())).unwrap();
    let b = build_manager(&config, options(root_b.path())).unwrap();

    a.add(add("t1", 2)).await.unwrap();
    assert!(a.shutdown_flush(FLUSH).await);
    assert_eq!(fake.messages().len(), 4);
    fake.clear_requests();

    // Replica B reads A's cursor: the same transcript sends nothing, one more turn sends
    // exactly that turn.
    b.add(add("t1", 2)).await.unwrap();
    b.add(add("t1", 3)).await.unwrap();
    assert!(b.shutdown_flush(FLUSH).await);
    let sent: Vec<_> = fake
        .calls()
        .into_iter()
        .filter(|(path, _)| path.ends_with("/messages"))
        .collect();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(fake.messages().len(), 6);
    assert_eq!(
        files_under(root_a.path()) + files_under(root_b.path()),
        0,
        "no cursor file"
    );
    drop((a, b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_openviking_replicas_share_their_cursors_in_the_database() {
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let fake = FakeOv::start().await;
    let yaml = format!(
        "memory:\n  manager_class: openviking\n  backend_config:\n    base_url: {}\n    owner_user_id: alice\n    api_key_env: {OV_KEY_ENV}\n{}",
        fake.url(),
        postgres_keys(cluster.url(), &schema())
    );
    let config = load(&yaml);
    let (root_a, root_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = build_manager(&config, options(root_a.path())).unwrap();
    let b = build_manager(&config, options(root_b.path())).unwrap();
    let sid = deermem_backend_openviking::scope::session_id("alice", "deerflow", "t1");

    a.add(add("t1", 2)).await.unwrap();
    assert!(a.shutdown_flush(FLUSH).await);
    assert_eq!(fake.session_messages(&sid).len(), 4);

    // Replica B reads A's cursor: the same transcript sends nothing, one more turn sends
    // exactly that turn.
    b.add(add("t1", 2)).await.unwrap();
    b.add(add("t1", 3)).await.unwrap();
    assert!(b.shutdown_flush(FLUSH).await);
    let texts: Vec<String> = fake
        .session_messages(&sid)
        .iter()
        .map(|m| format!("{m:?}"))
        .collect();
    assert_eq!(texts.len(), 6, "{texts:#?}");
    assert_eq!(
        files_under(root_a.path()) + files_under(root_b.path()),
        0,
        "no cursor file"
    );
    fake.assert_clean();
}

/// The cursors' database is read from `storage_class` and `postgres` alone: the rest of a
/// remote backend's `backend_config` is the backend's, so a key DeerMem also knows, holding a
/// value of another type (a leftover of an earlier DeerMem configuration, ignored by the
/// backend with a warning), does not refuse the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_key_that_deermem_types_otherwise_does_not_refuse_the_cursors() {
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let fake = FakeHoncho::start().await;
    let yaml = format!(
        "memory:\n  manager_class: honcho\n  backend_config:\n    base_url: {}\n    debounce_seconds: soon\n    search: fast\n    embedding: none\n{}",
        fake.url,
        postgres_keys(cluster.url(), &schema())
    );
    let config = load(&yaml);
    let root = tempfile::tempdir().unwrap();
    let m = build_manager(&config, options(root.path()))
        .unwrap_or_else(|e| panic!("the Honcho backend with PostgreSQL cursors starts: {e}"));
    m.add(add("t1", 1)).await.unwrap();
    assert!(m.shutdown_flush(FLUSH).await);
    assert_eq!(fake.messages().len(), 2);
    assert_eq!(files_under(root.path()), 0, "the cursor is in the database");
    drop(m);
}
