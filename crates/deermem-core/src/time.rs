//! `Timestamp`: UTC instants in microseconds, written in the reference's ISO-Z form and read
//! with Python's `datetime.fromisoformat` grammar.
//!
//! The reference writes `datetime.now(UTC).isoformat()` with `+00:00` replaced by `Z`:
//! `2026-08-22T09:15:30.123456Z`, and with no fraction at all when the microsecond is 0.

use std::fmt;

use serde::{Deserialize, Serialize};

const MICROS_PER_SECOND: i64 = 1_000_000;
const MICROS_PER_DAY: i64 = 86_400 * MICROS_PER_SECOND;
/// Python's `datetime` range: years 1 to 9999.
const MIN_YEAR: i64 = 1;
const MAX_YEAR: i64 = 9999;

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

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if is_leap(y) => 29,
        2 => 28,
        _ => 0,
    }
}

/// Days since 1970-01-01 for a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn digits(s: &[u8]) -> Option<i64> {
    if s.is_empty() || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut v: i64 = 0;
    for b in s {
        v = v.checked_mul(10)?.checked_add(i64::from(b - b'0'))?;
    }
    Some(v)
}

/// Parses the date part: `YYYY-MM-DD`, `YYYYMMDD`, `YYYY-Www-D`, `YYYYWwwD`, `YYYY-Www`, `YYYYWww`.
fn parse_date(s: &[u8]) -> Option<(i64, u32, u32)> {
    if s.len() < 7 {
        return None;
    }
    let year = digits(&s[..4])?;
    if year < MIN_YEAR {
        return None;
    }
    let rest = &s[4..];
    let extended = rest.first() == Some(&b'-');
    let rest = if extended { &rest[1..] } else { rest };
    if rest.first() == Some(&b'W') {
        // ISO week date.
        let rest = &rest[1..];
        if rest.len() < 2 {
            return None;
        }
        let week = digits(&rest[..2])?;
        let rest = &rest[2..];
        let weekday = if rest.is_empty() {
            1
        } else {
            let rest = if extended {
                if rest.first() != Some(&b'-') {
                    return None;
                }
                &rest[1..]
            } else {
                rest
            };
            if rest.len() != 1 {
                return None;
            }
            digits(rest)?
        };
        if !(1..=53).contains(&week) || !(1..=7).contains(&weekday) {
            return None;
        }
        // Monday of ISO week 1 is the Monday of the week holding January 4th.
        let jan4 = days_from_civil(year, 1, 4);
        let jan4_weekday = (jan4 + 3).rem_euclid(7); // 0 = Monday
        let week1_monday = jan4 - jan4_weekday;
        if week == 53 {
            // Only valid when the year has 53 ISO weeks.
            let next_jan4 = days_from_civil(year + 1, 1, 4);
            let next_week1 = next_jan4 - (next_jan4 + 3).rem_euclid(7);
            if (next_week1 - week1_monday) / 7 < 53 {
                return None;
            }
        }
        let day = week1_monday + (week - 1) * 7 + (weekday - 1);
        let (y, m, d) = civil_from_days(day);
        return Some((y, m, d));
    }
    let (month, day) = if extended {
        if rest.len() != 5 || rest[2] != b'-' {
            return None;
        }
        (digits(&rest[..2])?, digits(&rest[3..5])?)
    } else {
        if rest.len() != 4 {
            return None;
        }
        (digits(&rest[..2])?, digits(&rest[2..4])?)
    };
    let (month, day) = (u32::try_from(month).ok()?, u32::try_from(day).ok()?);
    if !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) {
        return None;
    }
    Some((year, month, day))
}

/// Parses `HH[:MM[:SS[.f+]]]` or `HH[MM[SS[.f+]]]`; returns (h, m, s, micro).
fn parse_time(s: &[u8]) -> Option<(u32, u32, u32, u32)> {
    let (main, frac) = match s.iter().position(|&b| b == b'.' || b == b',') {
        Some(p) => (&s[..p], Some(&s[p + 1..])),
        None => (s, None),
    };
    let parts: Vec<&[u8]> = if main.contains(&b':') {
        main.split(|&b| b == b':').collect()
    } else {
        main.chunks(2).collect()
    };
    if parts.is_empty() || parts.len() > 3 || parts.iter().any(|p| p.len() != 2) {
        return None;
    }
    let h = u32::try_from(digits(parts[0])?).ok()?;
    let m = match parts.get(1) {
        Some(p) => u32::try_from(digits(p)?).ok()?,
        None => 0,
    };
    let sec = match parts.get(2) {
        Some(p) => u32::try_from(digits(p)?).ok()?,
        None => 0,
    };
    let micro = match frac {
        None => 0,
        Some(f) => {
            // A fraction needs seconds, and at least one digit; extra digits are truncated.
            if parts.len() != 3 || f.is_empty() || !f.iter().all(u8::is_ascii_digit) {
                return None;
            }
            let mut v: u32 = 0;
            for i in 0..6 {
                v = v * 10 + f.get(i).map_or(0, |b| u32::from(b - b'0'));
            }
            v
        }
    };
    if h > 23 || m > 59 || sec > 59 {
        return None;
    }
    Some((h, m, sec, micro))
}

/// Parses an offset body after the sign: `HH`, `HH:MM`, `HHMM`, `HH:MM:SS[.f]`, `HHMMSS[.f]`.
fn parse_offset(s: &[u8]) -> Option<i64> {
    let (h, m, sec, micro) = parse_time(s)?;
    Some(
        (i64::from(h) * 3600 + i64::from(m) * 60 + i64::from(sec)) * MICROS_PER_SECOND
            + i64::from(micro),
    )
}

fn parse_iso_with_offset(s: &str) -> Option<(Timestamp, bool)> {
    // The reference replaces every `Z` with `+00:00` before parsing.
    let replaced;
    let s = if s.contains('Z') {
        replaced = s.replace('Z', "+00:00");
        replaced.as_str()
    } else {
        s
    };
    if !s.is_ascii() {
        // Python accepts any single separator character; only ASCII text can be a timestamp
        // otherwise, so handle a non-ASCII separator explicitly.
        let chars: Vec<char> = s.chars().collect();
        let non_ascii: Vec<usize> = chars
            .iter()
            .enumerate()
            .filter(|(_, c)| !c.is_ascii())
            .map(|(i, _)| i)
            .collect();
        if non_ascii.len() != 1 {
            return None;
        }
        let mut rebuilt: String = chars.iter().collect();
        let byte_idx = rebuilt.char_indices().nth(non_ascii[0])?.0;
        let ch_len = chars[non_ascii[0]].len_utf8();
        rebuilt.replace_range(byte_idx..byte_idx + ch_len, "T");
        return parse_iso_with_offset(&rebuilt);
    }
    let b = s.as_bytes();
    // Date length: find how long the date part is by trying the known shapes.
    let date_len = [10usize, 8, 10, 8, 7, 8]
        .into_iter()
        .filter(|&n| n <= b.len())
        .find(|&n| parse_date(&b[..n]).is_some() && (n == b.len() || !b[n].is_ascii_digit()))?;
    let (y, mo, d) = parse_date(&b[..date_len])?;
    let rest = &b[date_len..];
    if rest.is_empty() {
        let ts = Timestamp::from_ymd_hms_micro(y, mo, d, 0, 0, 0, 0)?;
        return Some((ts, false));
    }
    // Any single separator character, then the time.
    let time_and_tz = &rest[1..];
    let tz_pos = time_and_tz.iter().position(|&c| c == b'+' || c == b'-');
    let (time, tz) = match tz_pos {
        Some(p) => (&time_and_tz[..p], Some(&time_and_tz[p..])),
        None => (time_and_tz, None),
    };
    let (h, mi, sec, micro) = parse_time(time)?;
    let base = Timestamp::from_ymd_hms_micro(y, mo, d, h, mi, sec, micro)?;
    match tz {
        None => Some((base, false)),
        Some(tz) => {
            let sign = if tz[0] == b'-' { -1 } else { 1 };
            let off = parse_offset(&tz[1..])?;
            if off >= MICROS_PER_DAY {
                return None;
            }
            Some((
                Timestamp {
                    micros: base.micros - sign * off,
                },
                true,
            ))
        }
    }
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
