//! `ManualClock`: a clock tests set and advance explicitly.

use std::sync::Mutex;

use deermem_core::Timestamp;
use deermem_core::ports::Clock;

/// A clock that returns exactly what the test set.
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<Timestamp>,
}

impl ManualClock {
    /// A clock at `start`.
    pub fn new(start: Timestamp) -> Self {
        Self {
            now: Mutex::new(start),
        }
    }

    /// A clock at an ISO timestamp.
    ///
    /// # Panics
    /// When `iso` does not parse (tests pass literals).
    pub fn at(iso: &str) -> Self {
        Self::new(Timestamp::parse_iso(iso).unwrap_or_else(|| panic!("invalid timestamp {iso:?}")))
    }

    /// Sets the time.
    pub fn set(&self, t: Timestamp) {
        *self.now.lock().unwrap_or_else(|e| e.into_inner()) = t;
    }

    /// Moves the time forward by whole days.
    pub fn advance_days(&self, days: i64) {
        self.advance_micros(days * 86_400 * 1_000_000);
    }

    /// Moves the time forward by seconds.
    pub fn advance_secs(&self, secs: i64) {
        self.advance_micros(secs * 1_000_000);
    }

    /// Moves the time forward by microseconds.
    pub fn advance_micros(&self, micros: i64) {
        let mut now = self.now.lock().unwrap_or_else(|e| e.into_inner());
        *now = now.saturating_add_micros(micros);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.now.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let c = ManualClock::at("2026-01-01T00:00:00Z");
        assert_eq!(c.now().to_iso_z(), "2026-01-01T00:00:00Z");
        c.advance_days(2);
        c.advance_secs(1);
        assert_eq!(c.now().to_iso_z(), "2026-01-03T00:00:01Z");
    }
}
