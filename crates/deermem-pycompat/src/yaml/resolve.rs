//! PyYAML's YAML 1.1 implicit resolver and scalar constructors (bool, null, int, float, timestamp).
//!
//! The reader uses these to type PLAIN scalars exactly as `yaml.safe_load` does; the writer uses
//! the same resolver to decide which strings must be quoted.

use std::sync::LazyLock;

use regex::Regex;

/// The type PyYAML's implicit resolver gives a plain scalar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Implicit {
    /// `tag:yaml.org,2002:str`.
    Str,
    /// `tag:yaml.org,2002:bool`.
    Bool,
    /// `tag:yaml.org,2002:null`.
    Null,
    /// `tag:yaml.org,2002:int`.
    Int,
    /// `tag:yaml.org,2002:float`.
    Float,
    /// `tag:yaml.org,2002:timestamp`.
    Timestamp,
    /// `tag:yaml.org,2002:merge` (`<<`).
    Merge,
    /// `tag:yaml.org,2002:value` (`=`).
    Value,
    /// `tag:yaml.org,2002:yaml` (`!`, `&`, `*`).
    Yaml,
}

fn compile(pattern: &str) -> Regex {
    // The patterns are constants; a failure is a programming error caught by every test.
    #[allow(clippy::expect_used)]
    Regex::new(pattern).expect("constant YAML resolver pattern")
}

static FLOAT: LazyLock<Regex> = LazyLock::new(|| {
    compile(
        r"^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?|[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
    )
});

static INT: LazyLock<Regex> = LazyLock::new(|| {
    compile(
        r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+|[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+)$",
    )
});

static TIMESTAMP: LazyLock<Regex> = LazyLock::new(|| {
    compile(
        r"^(?P<year>[0-9]{4})-(?P<month>[0-9][0-9]?)-(?P<day>[0-9][0-9]?)(?:(?:[Tt]|[ \t]+)(?P<hour>[0-9][0-9]?):(?P<minute>[0-9]{2}):(?P<second>[0-9]{2})(?:\.(?P<fraction>[0-9]*))?(?:[ \t]*(?P<tz>Z|(?P<tz_sign>[-+])(?P<tz_hour>[0-9][0-9]?)(?::(?P<tz_minute>[0-9]{2}))?))?)?$",
    )
});

/// PyYAML's implicit timestamp pattern: a date alone needs two-digit month and day.
fn is_timestamp(value: &str) -> bool {
    let Some(caps) = TIMESTAMP.captures(value) else {
        return false;
    };
    if caps.name("hour").is_some() {
        return true;
    }
    let two = |name: &str| caps.name(name).is_some_and(|m| m.as_str().len() == 2);
    two("month") && two("day")
}

/// Resolves a plain scalar the way PyYAML's `Resolver.resolve(ScalarNode, value, (True, False))` does.
pub(crate) fn resolve_plain(value: &str) -> Implicit {
    let Some(first) = value.chars().next() else {
        return Implicit::Null;
    };
    match first {
        'y' | 'Y' | 'n' | 'N' | 't' | 'T' | 'f' | 'F' | 'o' | 'O' => {
            if pyyaml_spelling(value, &["yes", "no", "true", "false", "on", "off"]) {
                Implicit::Bool
            } else if pyyaml_spelling(value, &["null"]) {
                Implicit::Null
            } else {
                Implicit::Str
            }
        }
        '~' if value == "~" => Implicit::Null,
        '-' | '+' | '.' | '0'..='9' => {
            if FLOAT.is_match(value) {
                Implicit::Float
            } else if first != '.' && INT.is_match(value) {
                Implicit::Int
            } else if first.is_ascii_digit() && is_timestamp(value) {
                Implicit::Timestamp
            } else {
                Implicit::Str
            }
        }
        '<' if value == "<<" => Implicit::Merge,
        '=' if value == "=" => Implicit::Value,
        '!' | '&' | '*' if value.len() == 1 => Implicit::Yaml,
        _ => Implicit::Str,
    }
}

/// An integer as PyYAML constructs it, before the range check.
/// Whether `value` is one of `words` spelled as PyYAML's resolver accepts it: lowercase,
/// Capitalised or UPPERCASE.
fn pyyaml_spelling(value: &str, words: &[&str]) -> bool {
    let lower = |s: &str| s.bytes().all(|b| b.is_ascii_lowercase());
    let upper = |s: &str| s.bytes().all(|b| b.is_ascii_uppercase());
    let (head, tail) = value.split_at(value.len().min(1));
    words.iter().any(|w| value.eq_ignore_ascii_case(w))
        && (lower(value) || upper(value) || (upper(head) && lower(tail)))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IntValue {
    /// Fits in `i64`.
    Signed(i64),
    /// Positive and fits in `u64` but not in `i64`.
    Unsigned(u64),
}

/// Why an integer could not be constructed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IntError {
    /// PyYAML itself fails (e.g. `0b_` or `!!int abc`).
    Invalid,
    /// PyYAML gives a Python int that JSON numbers here cannot hold.
    OutOfRange,
}

fn digits_value(digits: &str, radix: u32) -> Result<u128, IntError> {
    if digits.is_empty() {
        return Err(IntError::Invalid);
    }
    let mut acc: u128 = 0;
    for c in digits.chars() {
        let d = c.to_digit(radix).ok_or(IntError::Invalid)?;
        acc = acc
            .checked_mul(u128::from(radix))
            .and_then(|a| a.checked_add(u128::from(d)))
            .ok_or(IntError::OutOfRange)?;
    }
    Ok(acc)
}

/// PyYAML's `construct_yaml_int` (used for implicit ints and explicit `!!int`).
pub(crate) fn construct_int(value: &str) -> Result<IntValue, IntError> {
    // A plain decimal such as `1` or `42` (every revision and schema version): no sign,
    // underscores, base prefix or sexagesimal part, and no leading zero (octal).
    let bytes = value.as_bytes();
    if (1..=18).contains(&bytes.len())
        && bytes.iter().all(u8::is_ascii_digit)
        && (bytes[0] != b'0' || bytes.len() == 1)
        && let Ok(n) = value.parse::<i64>()
    {
        return Ok(IntValue::Signed(n));
    }
    let cleaned: String = value.chars().filter(|&c| c != '_').collect();
    let (negative, body) = match cleaned.as_bytes().first() {
        Some(b'-') => (true, &cleaned[1..]),
        Some(b'+') => (false, &cleaned[1..]),
        Some(_) => (false, cleaned.as_str()),
        None => return Err(IntError::Invalid),
    };
    let magnitude: u128 = if body == "0" {
        0
    } else if let Some(rest) = body.strip_prefix("0b") {
        digits_value(rest, 2)?
    } else if let Some(rest) = body.strip_prefix("0x") {
        digits_value(rest, 16)?
    } else if body.starts_with('0') {
        digits_value(body, 8)?
    } else if body.contains(':') {
        let mut acc: u128 = 0;
        for part in body.split(':') {
            let d = digits_value(part, 10)?;
            acc = acc
                .checked_mul(60)
                .and_then(|a| a.checked_add(d))
                .ok_or(IntError::OutOfRange)?;
        }
        acc
    } else {
        digits_value(body, 10)?
    };
    if negative {
        if magnitude <= i64::MAX as u128 + 1 {
            // Two's complement negation of a magnitude up to 2^63.
            let m = magnitude as i128;
            i64::try_from(-m)
                .map(IntValue::Signed)
                .map_err(|_| IntError::OutOfRange)
        } else {
            Err(IntError::OutOfRange)
        }
    } else if let Ok(v) = i64::try_from(magnitude) {
        Ok(IntValue::Signed(v))
    } else if let Ok(v) = u64::try_from(magnitude) {
        Ok(IntValue::Unsigned(v))
    } else {
        Err(IntError::OutOfRange)
    }
}

/// PyYAML's `construct_yaml_float`; `None` when Python's `float()` would raise.
pub(crate) fn construct_float(value: &str) -> Option<f64> {
    // Plain decimals such as `0.8` (every confidence) need none of the clean-up below, and
    // Rust's parser rounds them exactly as Python's `float` does.
    let bytes = value.as_bytes();
    if bytes.iter().all(|b| b.is_ascii_digit() || *b == b'.')
        && bytes.iter().filter(|b| **b == b'.').count() == 1
        && bytes.iter().any(u8::is_ascii_digit)
    {
        return value.parse::<f64>().ok();
    }
    let cleaned: String = value
        .chars()
        .filter(|&c| c != '_')
        .collect::<String>()
        .to_ascii_lowercase();
    let (sign, body) = match cleaned.as_bytes().first() {
        Some(b'-') => (-1.0, &cleaned[1..]),
        Some(b'+') => (1.0, &cleaned[1..]),
        Some(_) => (1.0, cleaned.as_str()),
        None => return None,
    };
    if body == ".inf" {
        return Some(sign * f64::INFINITY);
    }
    if body == ".nan" {
        return Some(f64::NAN);
    }
    if body.contains(':') {
        let mut acc = 0.0_f64;
        for part in body.split(':') {
            acc = acc * 60.0 + python_float(part)?;
        }
        return Some(sign * acc);
    }
    python_float(body).map(|v| sign * v)
}

/// Python's `float()` on the digit strings the YAML float pattern lets through.
fn python_float(s: &str) -> Option<f64> {
    crate::py::parse_float(s)
}

/// PyYAML's `construct_yaml_bool` (explicit `!!bool` accepts any case of the six words).
pub(crate) fn construct_bool(value: &str) -> Option<bool> {
    match value.to_lowercase().as_str() {
        "yes" | "true" | "on" => Some(true),
        "no" | "false" | "off" => Some(false),
        _ => None,
    }
}

fn days_in_month(year: u32, month: u32) -> u32 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ => {
            let leap =
                (year.is_multiple_of(4) && !year.is_multiple_of(100)) || year.is_multiple_of(400);
            if leap { 29 } else { 28 }
        }
    }
}

/// Why a scalar resolved as a timestamp is not a valid one; the messages are Python `datetime`'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TimestampError {
    #[error("{0:?} is not a timestamp")]
    Shape(String),
    #[error("year {0} is out of range")]
    Year(u32),
    #[error("month must be in 1..12")]
    Month,
    #[error("day is out of range for month")]
    Day,
    #[error("hour must be in 0..23")]
    Hour,
    #[error("minute must be in 0..59")]
    Minute,
    #[error("second must be in 0..59")]
    Second,
    #[error(
        "offset must be a timedelta strictly between -timedelta(hours=24) and timedelta(hours=24)"
    )]
    Offset,
}

/// PyYAML's `construct_yaml_timestamp` validity.
///
/// The value itself is not built: the caller keeps the original text.
pub(crate) fn check_timestamp(value: &str) -> Result<(), TimestampError> {
    let caps = TIMESTAMP
        .captures(value)
        .ok_or_else(|| TimestampError::Shape(value.to_owned()))?;
    let num = |name: &str| -> u32 {
        caps.name(name)
            .and_then(|m| m.as_str().parse::<u32>().ok())
            .unwrap_or(0)
    };
    let (year, month, day) = (num("year"), num("month"), num("day"));
    if !(1..=9999).contains(&year) {
        return Err(TimestampError::Year(year));
    }
    if !(1..=12).contains(&month) {
        return Err(TimestampError::Month);
    }
    if day < 1 || day > days_in_month(year, month) {
        return Err(TimestampError::Day);
    }
    if caps.name("hour").is_none() {
        return Ok(());
    }
    if num("hour") > 23 {
        return Err(TimestampError::Hour);
    }
    if num("minute") > 59 {
        return Err(TimestampError::Minute);
    }
    if num("second") > 59 {
        return Err(TimestampError::Second);
    }
    if caps.name("tz_sign").is_some() {
        let offset = num("tz_hour") * 60 + num("tz_minute");
        if offset >= 24 * 60 {
            return Err(TimestampError::Offset);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_yaml_1_1_forms_like_pyyaml() {
        for (s, want) in [
            ("yes", Implicit::Bool),
            ("OFF", Implicit::Bool),
            ("y", Implicit::Str),
            ("n", Implicit::Str),
            ("yEs", Implicit::Str),
            ("~", Implicit::Null),
            ("", Implicit::Null),
            ("Null", Implicit::Null),
            ("nULL", Implicit::Str),
            ("010", Implicit::Int),
            ("0o10", Implicit::Str),
            ("08", Implicit::Str),
            ("0x1F", Implicit::Int),
            ("0b101", Implicit::Int),
            ("1_000", Implicit::Int),
            ("1:30", Implicit::Int),
            ("-1:30", Implicit::Int),
            ("0:30", Implicit::Str),
            ("1.0", Implicit::Float),
            ("1.", Implicit::Float),
            (".5", Implicit::Float),
            ("+.5", Implicit::Str),
            ("1.0e5", Implicit::Str),
            ("1.0e+5", Implicit::Float),
            ("1e-5", Implicit::Str),
            ("1:30.5", Implicit::Float),
            (".inf", Implicit::Float),
            ("-.Inf", Implicit::Float),
            (".NaN", Implicit::Float),
            ("-.nan", Implicit::Str),
            (".nAn", Implicit::Str),
            ("2026-01-01", Implicit::Timestamp),
            ("2026-1-1", Implicit::Str),
            ("2026-1-1 1:00:00", Implicit::Timestamp),
            ("2026-01-01T00:00:00Z", Implicit::Timestamp),
            ("2026-01-01 00:00:00.5 +05:00", Implicit::Timestamp),
            ("<<", Implicit::Merge),
            ("=", Implicit::Value),
            ("- dash", Implicit::Str),
        ] {
            assert_eq!(resolve_plain(s), want, "{s:?}");
        }
    }

    #[test]
    fn constructs_ints_like_pyyaml() {
        assert_eq!(construct_int("010"), Ok(IntValue::Signed(8)));
        assert_eq!(construct_int("-0x1F"), Ok(IntValue::Signed(-31)));
        assert_eq!(construct_int("0b1_01"), Ok(IntValue::Signed(5)));
        assert_eq!(construct_int("190:20:30"), Ok(IntValue::Signed(685_230)));
        assert_eq!(construct_int("0b_"), Err(IntError::Invalid));
        assert_eq!(
            construct_int("-9223372036854775808"),
            Ok(IntValue::Signed(i64::MIN))
        );
        assert_eq!(
            construct_int("18446744073709551615"),
            Ok(IntValue::Unsigned(u64::MAX))
        );
        assert_eq!(
            construct_int("18446744073709551616"),
            Err(IntError::OutOfRange)
        );
        assert_eq!(
            construct_int("-9223372036854775809"),
            Err(IntError::OutOfRange)
        );
    }

    #[test]
    fn plain_decimals_take_the_short_path_with_the_same_values() {
        for (text, want) in [
            ("0", 0_i64),
            ("1", 1),
            ("2", 2),
            ("42", 42),
            ("123456789012345678", 123_456_789_012_345_678),
            ("999999999999999999", 999_999_999_999_999_999),
        ] {
            assert_eq!(construct_int(text), Ok(IntValue::Signed(want)), "{text}");
        }
        // Leading zeros stay octal, 19+ digits take the general path.
        assert_eq!(construct_int("07"), Ok(IntValue::Signed(7)));
        assert_eq!(construct_int("08"), Err(IntError::Invalid));
        assert_eq!(
            construct_int("9223372036854775807"),
            Ok(IntValue::Signed(i64::MAX))
        );
        assert_eq!(
            construct_int("9223372036854775808"),
            Ok(IntValue::Unsigned(9_223_372_036_854_775_808))
        );
        for (text, want) in [
            ("0.8", 0.8),
            ("1.0", 1.0),
            ("0.", 0.0),
            (".25", 0.25),
            ("10.125", 10.125),
        ] {
            assert_eq!(construct_float(text), Some(want), "{text}");
        }
        assert_eq!(construct_float("1.2.3"), None);
    }

    #[test]
    fn constructs_floats_like_pyyaml() {
        assert_eq!(construct_float("1."), Some(1.0));
        assert_eq!(construct_float(".5"), Some(0.5));
        assert_eq!(construct_float("1_000.5"), Some(1000.5));
        assert_eq!(construct_float("1:30.5"), Some(90.5));
        assert_eq!(construct_float("1.e+5"), Some(100_000.0));
        assert_eq!(construct_float("-.INF"), Some(f64::NEG_INFINITY));
        assert!(construct_float(".NaN").is_some_and(f64::is_nan));
        assert_eq!(construct_float("1.0e+999"), Some(f64::INFINITY));
    }

    #[test]
    fn checks_timestamps_like_datetime() {
        assert!(check_timestamp("2024-02-29").is_ok());
        assert!(check_timestamp("2023-02-29").is_err());
        assert!(check_timestamp("0000-01-01").is_err());
        assert!(check_timestamp("2026-13-01").is_err());
        assert!(check_timestamp("2026-01-01 24:00:00").is_err());
        assert!(check_timestamp("2026-01-01 23:59:60").is_err());
        assert!(check_timestamp("2026-01-01 00:00:00 +23:59").is_ok());
        assert!(check_timestamp("2026-01-01 00:00:00 +24:00").is_err());
        assert!(check_timestamp("2026-01-01 00:00:00 -23:99").is_err());
    }
}
