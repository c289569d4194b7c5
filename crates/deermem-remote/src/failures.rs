//! [`FailureLog`]: the last failure a remote backend met reaching its server, with a running
//! count, as the manager port reports it (`last_backend_failure`, shown by `/status`).

use deermem_core::Timestamp;
use deermem_core::ports::BackendFailure;

/// The last backend failure and how many there were since the backend was built.
#[derive(Debug, Default)]
pub struct FailureLog(parking_lot::Mutex<Option<BackendFailure>>);

impl FailureLog {
    /// Records a failure of `operation` (`recall`, `search`, `capture`) at `at`.
    pub fn note(&self, operation: &str, message: String, at: Timestamp) {
        let mut last = self.0.lock();
        let count = last.as_ref().map_or(0, |f| f.count) + 1;
        *last = Some(BackendFailure {
            operation: operation.to_owned(),
            message,
            at,
            count,
        });
    }

    /// The last failure, if any.
    pub fn last(&self) -> Option<BackendFailure> {
        self.0.lock().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_failure_and_counts_them_all() {
        let log = FailureLog::default();
        assert_eq!(log.last(), None);
        let t = Timestamp::from_unix_seconds(1_000);
        log.note("recall", "503".into(), t);
        log.note("capture", "timed out".into(), t);
        let last = log.last().unwrap();
        assert_eq!(
            (last.operation.as_str(), last.message.as_str(), last.count),
            ("capture", "timed out", 2)
        );
    }
}
