//! The `Clock` port: every timestamp a policy or adapter writes comes from here, so tests set
//! time with a manual clock instead of sleeping.

use std::fmt::Debug;

use crate::time::Timestamp;

/// A source of the current time.
///
/// # Contract
/// `now()` never fails. Successive calls on a real clock are non-decreasing; a manual clock
/// returns exactly what the test set.
pub trait Clock: Send + Sync + Debug {
    /// The current UTC time.
    fn now(&self) -> Timestamp;
}

impl<T: Clock + ?Sized> Clock for std::sync::Arc<T> {
    fn now(&self) -> Timestamp {
        (**self).now()
    }
}
