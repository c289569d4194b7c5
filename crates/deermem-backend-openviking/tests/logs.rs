//! The API key never reaches the logs: every log line of a failing capture, a failing recall,
//! an unhealthy warm-up and configuration warnings is captured and searched for the key.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use deermem_core::ports::{AddRequest, ContextRequest, MemoryManager, MemoryScope};
use deermem_core::{Message, UserId};
use serde_json::json;
use support::{FakeOv, manager};

#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn logs_never_contain_the_api_key() {
    // Log capture races with other test threads over tracing's call-site cache.
    if !deermem_testkit::isolation::run_alone("logs_never_contain_the_api_key") {
        return;
    }
    let buf = Buffer::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let fake = FakeOv::start().await;
            let dir = tempfile::tempdir().unwrap();
            let m = manager(
                &fake,
                dir.path(),
                json!({"base_url": fake.url().replace("127.0.0.1", "localhost")}),
            );
            let alice = MemoryScope::user(UserId::new("alice").unwrap());
            fake.state.commit_html_500.store(1, Ordering::SeqCst);
            m.add(AddRequest {
                thread_id: "t".into(),
                messages: vec![Message::human("hello")],
                scope: alice.clone(),
                trace_id: Some("trace-9".into()),
            })
            .await
            .unwrap();
            assert!(m.wait_idle(std::time::Duration::from_secs(30)).await);
            fake.state.failing_retrievals.store(1, Ordering::SeqCst);
            assert_eq!(
                m.get_context(ContextRequest {
                    scope: alice,
                    thread_id: None
                })
                .await
                .unwrap(),
                ""
            );
            fake.state.unhealthy.store(true, Ordering::SeqCst);
            assert_eq!(m.warm().await, Some(false));
            assert!(m.shutdown_flush(std::time::Duration::from_secs(30)).await);
        });
    });
    let logs = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    assert!(logs.contains("OpenViking capture failed"), "{logs}");
    assert!(logs.contains("returning no memory"), "{logs}");
    assert!(logs.contains("unhealthy"), "{logs}");
    assert!(
        !logs.contains(support::API_KEY),
        "the key leaked into the logs"
    );
}
