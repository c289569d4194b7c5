//! The two lock layers of a user directory, as in the reference: an in-process mutex per user
//! directory (held weakly in a registry so unused entries disappear), then the cross-process
//! `flock(2)` on `<U>/.memory.lock`. A contended flock is waited for in the kernel (a blocking
//! `flock` on a helper thread, so the wait can time out) rather than polled: under contention
//! from several processes a poller sleeping between tries kept losing the lock to the others
//! and timed out (found by the reliability suite). The flock excludes Python processes running
//! the reference, which lock the same file the same way.

use std::collections::HashMap;
use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::lock_api::ArcMutexGuard;
use parking_lot::{Mutex, RawMutex};

use crate::error::{Error, Result};

/// How often the flock is retried.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// The in-process lock registry, keyed by lock-file path.
#[derive(Debug, Default)]
pub(crate) struct LockRegistry {
    locks: Mutex<HashMap<PathBuf, Weak<Mutex<()>>>>,
}

/// Both locks of one user directory; dropping it releases the flock, then the mutex.
pub(crate) struct UserLock {
    file: File,
    _guard: ArcMutexGuard<RawMutex, ()>,
}

impl std::fmt::Debug for UserLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserLock").finish_non_exhaustive()
    }
}

impl Drop for UserLock {
    fn drop(&mut self) {
        if let Err(e) = self.file.unlock() {
            tracing::warn!(error = %e, "failed to release memory scope lock");
        }
    }
}

impl LockRegistry {
    fn mutex_for(&self, path: &Path) -> Arc<Mutex<()>> {
        let mut map = self.locks.lock();
        if let Some(existing) = map.get(path).and_then(Weak::upgrade) {
            return existing;
        }
        map.retain(|_, w| w.strong_count() > 0);
        let fresh = Arc::new(Mutex::new(()));
        map.insert(path.to_path_buf(), Arc::downgrade(&fresh));
        fresh
    }

    /// Entries still referenced by a holder or waiter (after pruning dead ones).
    pub(crate) fn live_entries(&self) -> usize {
        let mut map = self.locks.lock();
        map.retain(|_, w| w.strong_count() > 0);
        map.len()
    }

    /// Takes the in-process lock, then the flock, within `timeout` overall.
    ///
    /// # Errors
    /// `LockTimeout` when either lock is not acquired in time; `Io` when the lock file cannot
    /// be created.
    pub(crate) fn acquire(&self, lock_path: &Path, timeout: Duration) -> Result<UserLock> {
        let start = Instant::now();
        let timed_out = || Error::LockTimeout {
            lock: lock_path.to_path_buf(),
        };
        let mutex = self.mutex_for(lock_path);
        let guard = mutex.try_lock_arc_for(timeout).ok_or_else(timed_out)?;
        drop(mutex);
        if let Some(dir) = lock_path.parent() {
            crate::fsutil::create_dir_all(dir)?;
        }
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(lock_path)
            .map_err(|e| Error::io("Failed to open lock file", lock_path, e))?;
        let mut queued = false;
        loop {
            match file.try_lock() {
                Ok(()) => break,
                Err(TryLockError::WouldBlock) if !queued => {
                    queued = true;
                    match wait_in_kernel(&file, timeout.saturating_sub(start.elapsed())) {
                        Wait::Locked => break,
                        Wait::TimedOut => return Err(timed_out()),
                        // No helper thread or a failed blocking call: poll instead.
                        Wait::Unavailable => {}
                    }
                }
                Err(TryLockError::WouldBlock) => {}
                Err(TryLockError::Error(e)) => {
                    tracing::debug!(error = %e, lock = %lock_path.display(), "flock failed; retrying");
                }
            }
            let elapsed = start.elapsed();
            if elapsed >= timeout {
                return Err(timed_out());
            }
            std::thread::sleep(POLL_INTERVAL.min(timeout - elapsed));
        }
        Ok(UserLock {
            file,
            _guard: guard,
        })
    }
}

/// The outcome of [`wait_in_kernel`].
enum Wait {
    Locked,
    TimedOut,
    Unavailable,
}

/// Waits for the flock of `file` in the kernel's queue for at most `timeout`: a helper thread
/// makes the blocking call on a duplicate descriptor (same open file description, so the lock
/// it takes is `file`'s). When the wait times out, the helper releases the lock as soon as it
/// gets it, since nobody is left to use it.
fn wait_in_kernel(file: &File, timeout: Duration) -> Wait {
    let Ok(dup) = file.try_clone() else {
        return Wait::Unavailable;
    };
    let (tx, rx) = std::sync::mpsc::sync_channel::<bool>(1);
    let spawned = std::thread::Builder::new()
        .name("deermem-flock".into())
        .spawn(move || {
            let locked = dup.lock().is_ok();
            if tx.send(locked).is_err() && locked {
                // The waiter gave up: do not keep the user locked.
                let _ = dup.unlock();
            }
        });
    if spawned.is_err() {
        return Wait::Unavailable;
    }
    match rx.recv_timeout(timeout) {
        Ok(true) => Wait::Locked,
        Ok(false) => Wait::Unavailable,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            // The helper may have locked in the meantime: if so the lock is ours after all.
            match rx.try_recv() {
                Ok(true) => Wait::Locked,
                _ => Wait::TimedOut,
            }
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Wait::Unavailable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_entries_are_released_when_unused() {
        let dir = tempfile::tempdir().unwrap();
        let reg = LockRegistry::default();
        let path = dir.path().join("u/.memory.lock");
        {
            let _l = reg.acquire(&path, Duration::from_secs(1)).unwrap();
            assert_eq!(reg.live_entries(), 1);
        }
        assert_eq!(reg.live_entries(), 0);
        assert!(path.exists(), "the lock file stays");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
    }

    #[test]
    fn second_descriptor_times_out_while_held() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".memory.lock");
        let a = LockRegistry::default();
        let b = LockRegistry::default();
        let held = a.acquire(&path, Duration::from_secs(1)).unwrap();
        let err = b.acquire(&path, Duration::from_millis(120)).unwrap_err();
        assert!(matches!(err, Error::LockTimeout { .. }));
        drop(held);
        assert!(b.acquire(&path, Duration::from_millis(120)).is_ok());
    }

    /// A waiter that gave up must not leave the user locked: its kernel-side wait may still
    /// obtain the lock later, and then releases it at once.
    #[test]
    fn a_timed_out_waiter_never_keeps_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".memory.lock");
        let (a, b, c) = (
            LockRegistry::default(),
            LockRegistry::default(),
            LockRegistry::default(),
        );
        for _ in 0..5 {
            let held = a.acquire(&path, Duration::from_secs(1)).unwrap();
            assert!(b.acquire(&path, Duration::from_millis(30)).is_err());
            drop(held);
            // b's abandoned wait may win the flock now; it must hand it back.
            let got = c.acquire(&path, Duration::from_secs(30)).unwrap();
            drop(got);
        }
    }

    /// A waiter queued in the kernel gets the lock when the holder in another "process" (its
    /// own descriptor) releases it.
    #[test]
    fn a_queued_waiter_gets_the_lock_on_release() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".memory.lock");
        let a = LockRegistry::default();
        let held = a.acquire(&path, Duration::from_secs(1)).unwrap();
        let p2 = path.clone();
        let waiter = std::thread::spawn(move || {
            LockRegistry::default()
                .acquire(&p2, Duration::from_secs(60))
                .map(|_| ())
        });
        std::thread::sleep(Duration::from_millis(20));
        drop(held);
        assert!(waiter.join().unwrap().is_ok());
    }

    #[test]
    fn threads_of_one_registry_serialise() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".memory.lock");
        let reg = Arc::new(LockRegistry::default());
        let counter = Arc::new(Mutex::new((0u32, 0u32)));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let reg = reg.clone();
                let path = path.clone();
                let counter = counter.clone();
                std::thread::spawn(move || {
                    for _ in 0..20 {
                        let _l = reg.acquire(&path, Duration::from_secs(30)).unwrap();
                        let mut c = counter.lock();
                        c.0 += 1;
                        c.1 = c.1.max(c.0);
                        drop(c);
                        std::thread::yield_now();
                        counter.lock().0 -= 1;
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(counter.lock().1, 1, "never two holders at once");
    }
}
