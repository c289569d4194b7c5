//! `SystemClock`: the real UTC clock for production use.

use std::time::{SystemTime, UNIX_EPOCH};

use deermem_core::Timestamp;
use deermem_core::ports::Clock;

/// The operating system's clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let micros = match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(d) => i64::try_from(d.as_micros()).unwrap_or(i64::MAX),
            Err(e) => -i64::try_from(e.duration().as_micros()).unwrap_or(i64::MAX),
        };
        Timestamp::from_unix_micros(micros)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clock_is_after_2025() {
        let now = SystemClock.now();
        assert!(now > Timestamp::parse_iso("2025-01-01T00:00:00Z").unwrap());
    }
}
