//! pydantic v2's lax-mode coercions of Python values (JSON-shaped here), as FastAPI request
//! bodies and DeerFlow's config models apply them: each function returns the value pydantic
//! would produce, or its error type and message. `tests/pydantic/lax_table.json` holds
//! pydantic's own answers for a table of inputs and field types; a test holds these functions
//! to every row.
//!
//! - bool: `true`/`false`; the integers 0 and 1 (also `0.0`, `-0.0`, `1.0`); the strings
//!   `0 off f false n no` and `1 on t true y yes` in any letter case, nothing around them;
//! - int: integers, `true`/`false` (1/0), floats with no fractional part, and strings of an
//!   optionally signed decimal integer (surrounding whitespace, `_` between digits and a
//!   fraction of zeros such as `20.0` allowed);
//! - float: numbers, `true`/`false`, and what Python's `float()` reads from a string
//!   ([`crate::py::parse_float`]: `1_000`, `.5`, `nan`, `-inf`);
//! - str: strings only; list: lists only.
//!
//! Integers are `i64`: pydantic accepts larger ones, these functions refuse them.
//!
//! [`model`] reads a whole model (a FastAPI request body or query) with these rules, collecting
//! every error as pydantic's error item.

use std::fmt::Display;

use serde::Serialize;
use serde_json::{Value, json};

pub mod de;
pub mod model;

/// A value pydantic refuses: its error type (`int_parsing`), message and, for a failed
/// constraint, the constraint (`{"le": 1.0}`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct LaxError {
    /// pydantic's error type, e.g. `float_type`.
    pub kind: &'static str,
    /// pydantic's message.
    pub message: String,
    /// pydantic's `ctx`: the failed constraint (`le`, `ge`, `min_length`, `max_length`).
    pub ctx: Option<Value>,
}

fn error(kind: &'static str, message: impl Into<String>) -> LaxError {
    LaxError {
        kind,
        message: message.into(),
        ctx: None,
    }
}

/// A failed constraint: its error, with the constraint as `ctx`.
fn failed(kind: &'static str, message: String, name: &str, bound: impl Serialize) -> LaxError {
    LaxError {
        ctx: Some(json!({ name: bound })),
        ..error(kind, message)
    }
}

/// A lax bool.
///
/// # Errors
/// `bool_parsing` for a number or string outside the table, `bool_type` for anything else (a
/// float with a fractional part included).
pub fn bool(v: &Value) -> Result<bool, LaxError> {
    let parsing = || {
        error(
            "bool_parsing",
            "Input should be a valid boolean, unable to interpret input",
        )
    };
    match v {
        Value::Bool(b) => Ok(*b),
        Value::Number(n) => match n.as_f64() {
            Some(0.0) => Ok(false),
            Some(1.0) => Ok(true),
            Some(f) if n.is_f64() && f.fract() != 0.0 => {
                Err(error("bool_type", "Input should be a valid boolean"))
            }
            _ => Err(parsing()),
        },
        Value::String(s) => match s.to_ascii_lowercase().as_str() {
            "0" | "off" | "f" | "false" | "n" | "no" => Ok(false),
            "1" | "on" | "t" | "true" | "y" | "yes" => Ok(true),
            _ => Err(parsing()),
        },
        _ => Err(error("bool_type", "Input should be a valid boolean")),
    }
}

/// A lax integer.
///
/// # Errors
/// `int_from_float` for a float with a fractional part, `int_parsing` for a string that is not
/// an integer, `int_type` for anything else (and for an integer outside `i64`).
pub fn int(v: &Value) -> Result<i64, LaxError> {
    let type_error = || error("int_type", "Input should be a valid integer");
    match v {
        Value::Bool(b) => Ok(i64::from(*b)),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                return Ok(i);
            }
            let f = n.as_f64().ok_or_else(type_error)?;
            if f.fract() != 0.0 {
                return Err(error(
                    "int_from_float",
                    "Input should be a valid integer, got a number with a fractional part",
                ));
            }
            // Integral and inside i64: [-2^63, 2^63), both bounds exact as f64.
            let bound = -(i64::MIN as f64);
            if (-bound..bound).contains(&f) {
                Ok(f as i64)
            } else {
                Err(type_error())
            }
        }
        Value::String(s) => int_from_str(crate::py::strip(s)).ok_or_else(|| {
            error(
                "int_parsing",
                "Input should be a valid integer, unable to parse string as an integer",
            )
        }),
        _ => Err(type_error()),
    }
}

/// An optionally signed decimal integer with `_` between digits and an optional fraction of
/// zeros (`+1_000`, `20.00`).
fn int_from_str(s: &str) -> Option<i64> {
    let int_part = match s.split_once('.') {
        Some((i, f)) if !f.is_empty() && f.bytes().all(|b| b == b'0') => i,
        Some(_) => return None,
        None => s,
    };
    let (neg, digits) = match int_part.as_bytes().first() {
        Some(b'-') => (true, &int_part[1..]),
        Some(b'+') => (false, &int_part[1..]),
        _ => (false, int_part),
    };
    let groups_ok = !digits.is_empty()
        && digits
            .split('_')
            .all(|g| !g.is_empty() && g.bytes().all(|b| b.is_ascii_digit()));
    if !groups_ok {
        return None;
    }
    let plain: String = digits.chars().filter(|c| *c != '_').collect();
    let magnitude: i128 = plain.parse().ok()?;
    i64::try_from(if neg { -magnitude } else { magnitude }).ok()
}

/// A lax float, `nan` and the infinities included (bounds refuse them where a field has some).
///
/// # Errors
/// `float_parsing` for a string that is not a number, `float_type` for anything else.
pub fn float(v: &Value) -> Result<f64, LaxError> {
    match v {
        Value::Bool(b) => Ok(f64::from(u8::from(*b))),
        Value::Number(n) => n
            .as_f64()
            .ok_or_else(|| error("float_type", "Input should be a valid number")),
        Value::String(s) => crate::py::parse_float(s).ok_or_else(|| {
            error(
                "float_parsing",
                "Input should be a valid number, unable to parse string as a number",
            )
        }),
        _ => Err(error("float_type", "Input should be a valid number")),
    }
}

/// A string (pydantic's `str` takes no number or boolean).
///
/// # Errors
/// `string_type` for anything but a string.
pub fn string(v: &Value) -> Result<&str, LaxError> {
    v.as_str()
        .ok_or_else(|| error("string_type", "Input should be a valid string"))
}

/// A list.
///
/// # Errors
/// `list_type` for anything but a list.
pub fn list(v: &Value) -> Result<&[Value], LaxError> {
    v.as_array()
        .map(Vec::as_slice)
        .ok_or_else(|| error("list_type", "Input should be a valid list"))
}

/// pydantic's `le` and `ge` constraints, the upper bound checked first and as "not `<= le`",
/// so that `nan` fails it.
///
/// # Errors
/// `less_than_equal` or `greater_than_equal`, with pydantic's message and `ctx`.
#[allow(clippy::neg_cmp_op_on_partial_ord, reason = "nan must fail `le`")]
pub fn bounded<T: PartialOrd + Display + Copy + Serialize>(
    x: T,
    ge: Option<T>,
    le: Option<T>,
) -> Result<T, LaxError> {
    if let Some(le) = le
        && !(x <= le)
    {
        let message = format!("Input should be less than or equal to {le}");
        return Err(failed("less_than_equal", message, "le", le));
    }
    if let Some(ge) = ge
        && !(x >= ge)
    {
        let message = format!("Input should be greater than or equal to {ge}");
        return Err(failed("greater_than_equal", message, "ge", ge));
    }
    Ok(x)
}

/// pydantic's `min_length` on a string (counted in characters).
///
/// # Errors
/// `string_too_short`, with pydantic's message and `ctx`.
pub fn min_chars(s: &str, min: usize) -> Result<&str, LaxError> {
    if s.chars().count() >= min {
        return Ok(s);
    }
    let plural = if min == 1 { "" } else { "s" };
    let message = format!("String should have at least {min} character{plural}");
    Err(failed("string_too_short", message, "min_length", min))
}

/// pydantic's `max_length` on a string (counted in characters).
///
/// # Errors
/// `string_too_long`, with pydantic's message and `ctx`.
pub fn max_chars(s: &str, max: usize) -> Result<&str, LaxError> {
    if s.chars().count() <= max {
        return Ok(s);
    }
    let message = format!("String should have at most {max} characters");
    Err(failed("string_too_long", message, "max_length", max))
}
