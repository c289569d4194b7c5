//! Test-only crash points of the turn path. With the `fault-injection` feature, reaching the
//! step named by `DEERMEM_FAULT_STEP` for the n-th time (`DEERMEM_FAULT_AFTER`, 1 when unset)
//! aborts the process on the spot (no unwinding, no cleanup): the reliability tests kill a
//! server exactly between an extraction's commit and its turn's done-mark that way. Without the
//! feature every point compiles to nothing.

/// The environment variable naming the step at which to abort.
#[cfg(feature = "fault-injection")]
pub(crate) const FAULT_STEP_ENV: &str = "DEERMEM_FAULT_STEP";
/// The environment variable giving how many times the step is passed before the abort.
#[cfg(feature = "fault-injection")]
pub(crate) const FAULT_AFTER_ENV: &str = "DEERMEM_FAULT_AFTER";

/// Aborts the process when `step` is the configured fault step, reached for the n-th time.
#[cfg(feature = "fault-injection")]
pub(crate) fn point(step: &str) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static PASSED: AtomicU64 = AtomicU64::new(0);
    if std::env::var(FAULT_STEP_ENV).is_ok_and(|s| s == step) {
        let after = std::env::var(FAULT_AFTER_ENV)
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(1);
        if PASSED.fetch_add(1, Ordering::SeqCst) + 1 >= after {
            eprintln!("deermem: fault point {step} reached; aborting");
            std::process::abort();
        }
    }
}

/// No-op without the `fault-injection` feature.
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub(crate) fn point(_step: &str) {}
