//! Test-only crash points of the write protocol. With the `fault-injection` feature, reaching
//! the step named by the `DEERMEM_FAULT_STEP` environment variable aborts the process on the
//! spot (no unwinding, no cleanup), which is how the crash-recovery tests simulate a power cut.
//! Without the feature every point compiles to nothing.

/// The environment variable naming the step at which to abort.
#[cfg(feature = "fault-injection")]
pub const FAULT_STEP_ENV: &str = "DEERMEM_FAULT_STEP";

/// Aborts the process when `step` is the configured fault step.
#[cfg(feature = "fault-injection")]
pub(crate) fn point(step: &str) {
    if std::env::var(FAULT_STEP_ENV).is_ok_and(|s| s == step) {
        std::process::abort();
    }
}

/// No-op without the `fault-injection` feature.
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub(crate) fn point(_step: &str) {}
