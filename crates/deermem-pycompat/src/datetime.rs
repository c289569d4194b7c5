//! Python's `datetime`: the proleptic Gregorian calendar it counts in, and the grammar of
//! `datetime.fromisoformat` (Python 3.12) as the reference reads every stored timestamp with it.
//! Only the grammar and the calendar live here; DeerMem's instant type is
//! `deermem_core::time::Timestamp`.

const MICROS_PER_SECOND: i64 = 1_000_000;
const MICROS_PER_DAY: i64 = 86_400 * MICROS_PER_SECOND;
/// Python's `datetime` range: years 1 to 9999.
pub const MIN_YEAR: i64 = 1;
/// The last year `datetime` represents.
pub const MAX_YEAR: i64 = 9999;

/// What `datetime.fromisoformat` read: the calendar fields as written, and the UTC offset in
/// microseconds when the text carried one (`Z` is `+00:00`). The fields are not yet checked
/// against the year range of an instant: [`MIN_YEAR`] to [`MAX_YEAR`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IsoDateTime {
    /// The year.
    pub year: i64,
    /// The month, 1–12.
    pub month: u32,
    /// The day of the month.
    pub day: u32,
    /// The hour, 0–23.
    pub hour: u32,
    /// The minute, 0–59.
    pub minute: u32,
    /// The second, 0–59.
    pub second: u32,
    /// The microsecond (extra fraction digits are truncated).
    pub micro: u32,
    /// The offset east of UTC in microseconds (`+02:00` is 7.2e9), `None` for a naive value.
    pub offset_micros: Option<i64>,
}

/// Whether `y` is a Gregorian leap year.
pub fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

/// Days in month `m` (1–12) of year `y`; 0 for another month number.
pub fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if is_leap(y) => 29,
        2 => 28,
        _ => 0,
    }
}

/// Days since 1970-01-01 for a proleptic Gregorian date (Howard Hinnant's algorithm).
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The proleptic Gregorian date `days` days after 1970-01-01 (the inverse of
/// [`days_from_civil`]).
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
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

/// Parses like Python 3.12's `datetime.fromisoformat(s.replace("Z", "+00:00"))`: `None` for
/// anything Python would reject.
pub fn fromisoformat(s: &str) -> Option<IsoDateTime> {
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
        return fromisoformat(&rebuilt);
    }
    let b = s.as_bytes();
    // Date length: find how long the date part is by trying the known shapes.
    let date_len = [10usize, 8, 10, 8, 7, 8]
        .into_iter()
        .filter(|&n| n <= b.len())
        .find(|&n| parse_date(&b[..n]).is_some() && (n == b.len() || !b[n].is_ascii_digit()))?;
    let (y, mo, d) = parse_date(&b[..date_len])?;
    let rest = &b[date_len..];
    let date = |time: (u32, u32, u32, u32), offset_micros| IsoDateTime {
        year: y,
        month: mo,
        day: d,
        hour: time.0,
        minute: time.1,
        second: time.2,
        micro: time.3,
        offset_micros,
    };
    if rest.is_empty() {
        return Some(date((0, 0, 0, 0), None));
    }
    // Any single separator character, then the time.
    let time_and_tz = &rest[1..];
    let tz_pos = time_and_tz.iter().position(|&c| c == b'+' || c == b'-');
    let (time, tz) = match tz_pos {
        Some(p) => (&time_and_tz[..p], Some(&time_and_tz[p..])),
        None => (time_and_tz, None),
    };
    let time = parse_time(time)?;
    match tz {
        None => Some(date(time, None)),
        Some(tz) => {
            let sign = if tz[0] == b'-' { -1 } else { 1 };
            let off = parse_offset(&tz[1..])?;
            if off >= MICROS_PER_DAY {
                return None;
            }
            Some(date(time, Some(sign * off)))
        }
    }
}
