//! Test-only fault points of the write protocol. With the `fault-injection` feature:
//!
//! - reaching the step named by the `DEERMEM_FAULT_STEP` environment variable aborts the
//!   process on the spot (no unwinding, no cleanup), which is how the crash-recovery tests
//!   simulate a power cut;
//! - [`inject`] makes filesystem operations under an armed root fail with a chosen I/O error
//!   (a full disk, `EIO` from `fsync`, a read-only folder), from the n-th matching operation on
//!   until the root is disarmed, which is how the reliability suite checks error paths.
//!
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

/// The kind of filesystem operation a fault point guards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoOp {
    /// Creating a file or directory.
    Create,
    /// Writing bytes into a file.
    Write,
    /// `fsync` of a file or a directory.
    Fsync,
    /// Renaming a file over another.
    Rename,
    /// Unlinking a file.
    Remove,
}

/// Checks an injected I/O fault for an operation on `path`.
#[cfg(feature = "fault-injection")]
pub(crate) fn io(op: IoOp, path: &std::path::Path) -> std::io::Result<()> {
    inject::check(op, path)
}

/// No-op without the `fault-injection` feature.
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub(crate) fn io(_op: IoOp, _path: &std::path::Path) -> std::io::Result<()> {
    Ok(())
}

/// Programmable I/O errors for filesystem operations below an armed root (feature
/// `fault-injection` only).
#[cfg(feature = "fault-injection")]
pub mod inject {
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;

    use super::IoOp;

    /// The fault to simulate; each applies to the operations that fail that way in reality.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum IoFault {
        /// `ENOSPC` from creating and writing files: a full disk.
        DiskFull,
        /// `EIO` from `fsync`: the device lost the write.
        FsyncEio,
        /// `EROFS` from creating, renaming and unlinking: a read-only folder.
        ReadOnly,
    }

    impl IoFault {
        fn applies_to(self, op: IoOp) -> bool {
            match self {
                Self::DiskFull => matches!(op, IoOp::Create | IoOp::Write),
                Self::FsyncEio => op == IoOp::Fsync,
                Self::ReadOnly => matches!(op, IoOp::Create | IoOp::Rename | IoOp::Remove),
            }
        }

        fn error(self) -> std::io::Error {
            let errno = match self {
                Self::DiskFull => libc_errno::ENOSPC,
                Self::FsyncEio => libc_errno::EIO,
                Self::ReadOnly => libc_errno::EROFS,
            };
            std::io::Error::from_raw_os_error(errno)
        }
    }

    /// Linux errno values (kept here to avoid a libc dependency in the storage crate).
    mod libc_errno {
        pub(super) const EIO: i32 = 5;
        pub(super) const ENOSPC: i32 = 28;
        pub(super) const EROFS: i32 = 30;
    }

    #[derive(Debug)]
    struct Armed {
        root: PathBuf,
        fault: IoFault,
        /// Matching operations to let through before failing.
        skip: u64,
        /// Matching operations seen so far.
        seen: u64,
        /// Operations failed so far.
        failed: u64,
    }

    static ARMED: Mutex<Vec<Armed>> = Mutex::new(Vec::new());

    fn armed() -> std::sync::MutexGuard<'static, Vec<Armed>> {
        ARMED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Arms `root`: the matching operations below it succeed `skip` times, then every one
    /// fails with `fault` until [`disarm`] (a full disk stays full).
    pub fn arm(root: &Path, fault: IoFault, skip: u64) {
        let mut a = armed();
        a.retain(|x| x.root != root);
        a.push(Armed {
            root: root.to_path_buf(),
            fault,
            skip,
            seen: 0,
            failed: 0,
        });
    }

    /// Disarms `root`; returns how many operations failed while it was armed.
    pub fn disarm(root: &Path) -> u64 {
        let mut a = armed();
        let failed = a.iter().filter(|x| x.root == root).map(|x| x.failed).sum();
        a.retain(|x| x.root != root);
        failed
    }

    pub(crate) fn check(op: IoOp, path: &Path) -> std::io::Result<()> {
        let mut a = armed();
        for x in a.iter_mut() {
            if path.starts_with(&x.root) && x.fault.applies_to(op) {
                x.seen += 1;
                if x.seen > x.skip {
                    x.failed += 1;
                    return Err(x.fault.error());
                }
            }
        }
        Ok(())
    }
}
