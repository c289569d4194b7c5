//! Runs one test alone in a child process of its own test binary, for tests whose subject is
//! process-global (log capture through a thread-scoped `tracing` subscriber).
//!
//! `tracing` caches each call site's interest process-wide. When another test thread registers
//! a call site at the moment a test installs its scoped subscriber, the site can be cached as
//! "never enabled" and the capturing test misses its events. Re-running the test in a child
//! where it is the only test removes every concurrent registration.

use std::process::Command;

/// Environment variable naming the test a child process runs.
const CHILD_VAR: &str = "DEERMEM_TESTKIT_ISOLATED_TEST";

/// Returns `true` inside the child, where the caller runs its body; in the parent it runs the
/// test named `test_name` (its full libtest path, such as `secrets_never_reach_the_logs`)
/// alone in a child process, asserts that exactly that test ran and passed, and returns
/// `false` so the caller returns at once.
///
/// # Panics
/// In the parent, when the child cannot be started, fails, or did not run exactly one test.
#[must_use]
pub fn run_alone(test_name: &str) -> bool {
    if std::env::var(CHILD_VAR).as_deref() == Ok(test_name) {
        return true;
    }
    let exe = std::env::current_exe().expect("path of the running test binary");
    let out = Command::new(exe)
        .args([test_name, "--exact", "--test-threads=1", "--nocapture"])
        .env(CHILD_VAR, test_name)
        .output()
        .expect("start the isolated test process");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "isolated test {test_name} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(
        stdout.contains("test result: ok. 1 passed"),
        "isolated run did not run exactly the test {test_name}:\n{stdout}\n{stderr}"
    );
    false
}
