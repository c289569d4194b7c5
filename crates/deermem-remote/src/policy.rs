//! [`FailurePolicy`]: what an operation does when its remote call fails. Each backend keeps
//! its configuration spelling (`fail_open` / `fail_closed`, `raise`, `log_and_drop`).

/// What an operation does when the remote call fails.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FailurePolicy {
    /// Log a warning and carry on with the empty value (reads) or without the write.
    #[default]
    FailOpen,
    /// Return the error to the caller.
    FailClosed,
}

impl FailurePolicy {
    /// `fallback` under [`FailurePolicy::FailOpen`] (after `log`), `error()` under
    /// [`FailurePolicy::FailClosed`].
    ///
    /// # Errors
    /// `error()` under [`FailurePolicy::FailClosed`].
    pub fn apply<T, E>(
        self,
        fallback: T,
        log: impl FnOnce(),
        error: impl FnOnce() -> E,
    ) -> Result<T, E> {
        match self {
            Self::FailOpen => {
                log();
                Ok(fallback)
            }
            Self::FailClosed => Err(error()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_logs_and_falls_back_closed_reports() {
        let mut logged = false;
        let r: Result<u8, &str> = FailurePolicy::FailOpen.apply(7, || logged = true, || "e");
        assert_eq!((r, logged), (Ok(7), true));
        let r: Result<u8, &str> =
            FailurePolicy::FailClosed.apply(7, || unreachable!("no log"), || "e");
        assert_eq!(r, Err("e"));
        assert_eq!(FailurePolicy::default(), FailurePolicy::FailOpen);
    }
}
