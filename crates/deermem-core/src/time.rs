//! `Timestamp`: UTC instants in microseconds, written in the reference's ISO-Z form and read
//! with Python's `datetime.fromisoformat` grammar.
//!
//! The reference writes `datetime.now(UTC).isoformat()` with `+00:00` replaced by `Z`:
//! `2026-08-22T09:15:30.123456Z`, and with no fraction at all when the microsecond is 0.

use std::fmt;

use deermem_pycompat::datetime::{
    self, MAX_YEAR, MIN_YEAR, civil_from_days, days_from_civil, days_in_month,
};
use serde::{Deserialize, Serialize};

const MICROS_PER_SECOND: i64 = 1_000_000;
const MICROS_PER_DAY: i64 = 86_400 * MICROS_PER_SECOND;

/// A UTC instant with microsecond precision (Python `datetime` precision).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp {
    micros: i64,
}

impl Timestamp {
    /// The instant `micros` microseconds after the Unix epoch.
    pub const fn from_unix_micros(micros: i64) -> Self {
        Self { micros }
    }

    /// The instant `secs` seconds after the Unix epoch.
    pub const fn from_unix_seconds(secs: i64) -> Self {
        Self {
            micros: secs * MICROS_PER_SECOND,
        }
    }

    /// Microseconds since the Unix epoch.
    pub const fn unix_micros(self) -> i64 {
        self.micros
    }

    /// Builds a UTC instant from calendar fields; `None` outside Python's range.
    pub fn from_ymd_hms_micro(
        year: i64,
        month: u32,
        day: u32,
        hour: u32,
        minute: u32,
        second: u32,
        micro: u32,
    ) -> Option<Self> {
        if !(MIN_YEAR..=MAX_YEAR).contains(&year)
            || !(1..=12).contains(&month)
            || day == 0
            || day > days_in_month(year, month)
            || hour > 23
            || minute > 59
            || second > 59
            || micro > 999_999
        {
            return None;
        }
        let days = days_from_civil(year, month, day);
        let secs = i64::from(hour) * 3600 + i64::from(minute) * 60 + i64::from(second);
        Some(Self {
            micros: days * MICROS_PER_DAY + secs * MICROS_PER_SECOND + i64::from(micro),
        })
    }

    /// Calendar fields `(year, month, day, hour, minute, second, microsecond)` in UTC.
    pub fn to_civil(self) -> (i64, u32, u32, u32, u32, u32, u32) {
        let days = self.micros.div_euclid(MICROS_PER_DAY);
        let rem = self.micros.rem_euclid(MICROS_PER_DAY);
        let (y, m, d) = civil_from_days(days);
        let secs = rem / MICROS_PER_SECOND;
        let micro = (rem % MICROS_PER_SECOND) as u32;
        (
            y,
            m,
            d,
            (secs / 3600) as u32,
            ((secs / 60) % 60) as u32,
            (secs % 60) as u32,
            micro,
        )
    }

    /// The reference's ISO-Z form: `YYYY-MM-DDTHH:MM:SS[.ffffff]Z`.
    pub fn to_iso_z(self) -> String {
        let (y, mo, d, h, mi, s, us) = self.to_civil();
        if us == 0 {
            format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
        } else {
            format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{us:06}Z")
        }
    }

    /// Parses like Python 3.12's `datetime.fromisoformat(s.strip().replace("Z", "+00:00"))`,
    /// with naive values taken as UTC (how the reference's eviction and staleness code read
    /// timestamps). Returns `None` for anything Python would reject.
    pub fn parse_iso(s: &str) -> Option<Self> {
        parse_iso_with_offset(s.trim()).map(|(ts, _)| ts)
    }

    /// Like [`Timestamp::parse_iso`] but also reports whether the text carried an offset
    /// (the reference's search decay skips naive values).
    pub fn parse_iso_aware(s: &str) -> Option<(Self, bool)> {
        parse_iso_with_offset(s.trim())
    }

    /// Adds whole days, or `None` past Python's `datetime` range.
    pub fn checked_add_days(self, days: i64) -> Option<Self> {
        let micros = days.checked_mul(MICROS_PER_DAY)?.checked_add(self.micros)?;
        let ts = Self { micros };
        let (y, ..) = ts.to_civil();
        (MIN_YEAR..=MAX_YEAR).contains(&y).then_some(ts)
    }

    /// Adds a signed number of microseconds, saturating.
    pub fn saturating_add_micros(self, micros: i64) -> Self {
        Self {
            micros: self.micros.saturating_add(micros),
        }
    }

    /// `(self - earlier)` in fractional days (`total_seconds() / 86400`).
    pub fn days_since(self, earlier: Self) -> f64 {
        (self.micros - earlier.micros) as f64 / MICROS_PER_DAY as f64
    }

    /// `(self - earlier).days` as Python computes it: floored whole days.
    pub fn whole_days_since(self, earlier: Self) -> i64 {
        (self.micros - earlier.micros).div_euclid(MICROS_PER_DAY)
    }
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Timestamp({})", self.to_iso_z())
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_iso_z())
    }
}

impl Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_iso_z())
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse_iso(&s)
            .ok_or_else(|| serde::de::Error::custom(format!("invalid timestamp {s:?}")))
    }
}

fn parse_iso_with_offset(s: &str) -> Option<(Timestamp, bool)> {
    let t = datetime::fromisoformat(s)?;
    let base =
        Timestamp::from_ymd_hms_micro(t.year, t.month, t.day, t.hour, t.minute, t.second, t.micro)?;
    Some(match t.offset_micros {
        None => (base, false),
        Some(off) => (
            Timestamp {
                micros: base.micros - off,
            },
            true,
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        Timestamp::parse_iso(s).unwrap_or_else(|| panic!("{s} should parse"))
    }

    #[test]
    fn iso_z_omits_zero_fraction() {
        let t = Timestamp::from_ymd_hms_micro(2026, 8, 13, 0, 0, 0, 0).unwrap();
        assert_eq!(t.to_iso_z(), "2026-08-13T00:00:00Z");
        let t = Timestamp::from_ymd_hms_micro(2026, 8, 22, 9, 15, 30, 123_456).unwrap();
        assert_eq!(t.to_iso_z(), "2026-08-22T09:15:30.123456Z");
        let t = Timestamp::from_ymd_hms_micro(2026, 8, 22, 9, 15, 30, 5).unwrap();
        assert_eq!(t.to_iso_z(), "2026-08-22T09:15:30.000005Z");
    }

    #[test]
    fn round_trips_through_iso_z() {
        for s in [
            "2026-12-02T09:02:11.225689Z",
            "1970-01-01T00:00:00Z",
            "0001-01-01T00:00:00Z",
            "9999-12-31T23:59:59.999999Z",
            "2024-02-29T12:00:00Z",
        ] {
            assert_eq!(ts(s).to_iso_z(), s);
        }
    }

    #[test]
    fn parses_python_fromisoformat_forms() {
        let base = ts("2026-08-13T00:00:00Z");
        assert_eq!(ts("2026-08-13"), base);
        assert_eq!(ts("2026-08-13T00:00"), base);
        assert_eq!(ts("2026-08-13 00:00:00"), base);
        assert_eq!(ts("20260813T000000"), base);
        assert_eq!(ts("2026-08-13T05:30:00+0530"), base);
        assert_eq!(ts("2026-08-13T05:30:00+05:30"), base);
        assert_eq!(ts("2026-08-12T19:00:00-05:00"), base);
        assert_eq!(ts("2026-08-13T00:00:00.000000+00:00"), base);
        assert_eq!(
            ts("2026-08-13T00:00:00,5Z").unix_micros() - base.unix_micros(),
            500_000
        );
        assert_eq!(
            ts("2026-08-13T00:00:00.1234567Z").unix_micros() - base.unix_micros(),
            123_456
        );
        assert_eq!(ts("  2026-08-13T00:00:00Z  "), base);
        // ISO week date: 2026-W33-4 is Thursday 2026-08-13.
        assert_eq!(ts("2026-W33-4"), base);
        assert_eq!(ts("2026W334"), base);
        assert_eq!(
            ts("2026-08-13T05:30:15+05:30:15"),
            ts("2026-08-13T00:00:00Z")
        );
    }

    #[test]
    fn rejects_what_python_rejects() {
        for bad in [
            "",
            "now",
            "2026-13-01",
            "2026-02-30",
            "2026-08-13T24:00:00",
            "2026-225",
            "2026-08-13T1",
            "abc",
            "2026-08-13T00:00:00.Z",
            "0000-01-01",
        ] {
            assert!(
                Timestamp::parse_iso(bad).is_none(),
                "{bad:?} must not parse"
            );
        }
    }

    #[test]
    fn naive_vs_aware_is_reported() {
        assert_eq!(
            Timestamp::parse_iso_aware("2026-08-13T00:00:00").map(|x| x.1),
            Some(false)
        );
        assert_eq!(
            Timestamp::parse_iso_aware("2026-08-13T00:00:00Z").map(|x| x.1),
            Some(true)
        );
    }

    #[test]
    fn day_arithmetic_matches_python() {
        let a = ts("2026-08-13T00:00:00Z");
        let b = ts("2026-08-14T12:00:00Z");
        assert_eq!(b.days_since(a), 1.5);
        assert_eq!(b.whole_days_since(a), 1);
        assert_eq!(a.whole_days_since(b), -2);
        assert_eq!(a.checked_add_days(1).unwrap(), ts("2026-08-14T00:00:00Z"));
        assert!(a.checked_add_days(10_000_000).is_none());
        assert!(a.checked_add_days(i64::MAX).is_none());
    }
}
