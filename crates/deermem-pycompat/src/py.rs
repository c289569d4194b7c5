//! Python string and value semantics the reference's behaviour depends on: `str.strip()`,
//! `str.splitlines()`, `casefold()`, `float()` parsing, truthiness and `==` between JSON values,
//! float `repr`, `html.escape`.
//!
//! Rust's `trim()` and `lines()` differ from Python's in small ways that decide whether a write
//! counts as a change, so every port-visible place uses these helpers instead.

use serde_json::Value;

/// Python's `str.isspace()` for one character.
pub fn is_space(c: char) -> bool {
    matches!(
        c,
        '\t' | '\n' | '\x0b' | '\x0c' | '\r' | '\x1c'..='\x1f' | ' ' | '\u{85}' | '\u{a0}'
            | '\u{1680}' | '\u{2000}'..='\u{200a}' | '\u{2028}' | '\u{2029}' | '\u{202f}'
            | '\u{205f}' | '\u{3000}'
    )
}

/// Python's `str.strip()` with no arguments.
pub fn strip(s: &str) -> &str {
    s.trim_matches(is_space)
}

/// Python's `str.rstrip()` with no arguments.
pub fn rstrip(s: &str) -> &str {
    s.trim_end_matches(is_space)
}

/// Python's `str.lstrip()` with no arguments.
pub fn lstrip(s: &str) -> &str {
    s.trim_start_matches(is_space)
}

fn is_line_boundary(c: char) -> bool {
    matches!(
        c,
        '\n' | '\r'
            | '\x0b'
            | '\x0c'
            | '\x1c'
            | '\x1d'
            | '\x1e'
            | '\u{85}'
            | '\u{2028}'
            | '\u{2029}'
    )
}

/// Python's `str.splitlines()` (without `keepends`).
pub fn splitlines(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut chars = s.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if is_line_boundary(c) {
            out.push(&s[start..i]);
            let mut end = i + c.len_utf8();
            if c == '\r'
                && let Some(&(j, '\n')) = chars.peek()
            {
                end = j + 1;
                chars.next();
            }
            start = end;
        }
    }
    if start < s.len() {
        out.push(&s[start..]);
    }
    out
}

/// Python's universal-newline translation on read: `\r\n` and lone `\r` become `\n`.
pub fn universal_newlines(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.contains('\r') {
        return std::borrow::Cow::Borrowed(s);
    }
    std::borrow::Cow::Owned(s.replace("\r\n", "\n").replace('\r', "\n"))
}

/// Python's `str.casefold()` (full Unicode case folding: `ß` folds to `ss`).
pub fn casefold(s: &str) -> String {
    caseless::default_case_fold_str(s)
}

/// Python's `str.lower()`.
pub fn lower(s: &str) -> String {
    s.to_lowercase()
}

/// The first `n` code points of `s` (Python's `s[:n]`).
pub fn prefix_chars(s: &str, n: usize) -> &str {
    match s.char_indices().nth(n) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// Python's `len(s)`: the number of code points.
pub fn char_len(s: &str) -> usize {
    s.chars().count()
}

/// Python's `float(s)` for a string: surrounding whitespace, `nan`, `inf`, `infinity` (any
/// case, optionally signed) and `_` between digits are accepted.
pub fn parse_float(s: &str) -> Option<f64> {
    let t = strip(s);
    if t.is_empty() {
        return None;
    }
    let (sign, body) = match t.as_bytes()[0] {
        b'+' => (1.0, &t[1..]),
        b'-' => (-1.0, &t[1..]),
        _ => (1.0, t),
    };
    let lower = body.to_ascii_lowercase();
    match lower.as_str() {
        "nan" => return Some(f64::NAN),
        "inf" | "infinity" => return Some(sign * f64::INFINITY),
        _ => {}
    }
    // Underscores are allowed only between digits.
    let bytes = body.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        if b == b'_' {
            let prev = i.checked_sub(1).map(|j| bytes[j]);
            let next = bytes.get(i + 1).copied();
            if !(prev.is_some_and(|p| p.is_ascii_digit())
                && next.is_some_and(|n| n.is_ascii_digit()))
            {
                return None;
            }
        }
    }
    let cleaned: String = body.chars().filter(|&c| c != '_').collect();
    if cleaned.is_empty()
        || !cleaned
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-'))
        || !cleaned.chars().any(|c| c.is_ascii_digit())
    {
        return None;
    }
    cleaned.parse::<f64>().ok().map(|v| sign * v)
}

/// Python truthiness of a JSON value.
pub fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// A JSON number or bool as Python compares it numerically (`True == 1 == 1.0`).
fn numeric(v: &Value) -> Option<f64> {
    match v {
        Value::Bool(b) => Some(if *b { 1.0 } else { 0.0 }),
        Value::Number(n) => n.as_f64(),
        _ => None,
    }
}

/// Python `==` between two JSON-shaped values: numbers and bools compare by value, mappings
/// ignore key order, lists compare element-wise.
pub fn py_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Null, Value::Null) => true,
        (Value::String(x), Value::String(y)) => x == y,
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| py_eq(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| py_eq(v, w)))
        }
        _ => match (numeric(a), numeric(b)) {
            (Some(x), Some(y)) => {
                // Python compares ints exactly; fall back to i64/u64 equality for big ints.
                if let (Value::Number(p), Value::Number(q)) = (a, b) {
                    if let (Some(i), Some(j)) = (p.as_i64(), q.as_i64()) {
                        return i == j;
                    }
                    if let (Some(i), Some(j)) = (p.as_u64(), q.as_u64()) {
                        return i == j;
                    }
                }
                x == y
            }
            _ => false,
        },
    }
}

/// Python `repr()` of a float, for the shapes JSON and YAML writers need.
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".to_owned();
    }
    if f.is_infinite() {
        return if f > 0.0 {
            "inf".to_owned()
        } else {
            "-inf".to_owned()
        };
    }
    if f == 0.0 {
        return if f.is_sign_negative() {
            "-0.0".to_owned()
        } else {
            "0.0".to_owned()
        };
    }
    let abs = f.abs();
    if (1e-4..1e16).contains(&abs) {
        // Shortest round-trip digits in positional notation, with at least one decimal.
        let s = format!("{f}");
        if s.contains('.') { s } else { format!("{s}.0") }
    } else {
        // Python switches to exponent notation: `1e-05`, `1e+16`, `1.5e+20`.
        let s = format!("{f:e}");
        let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let exp: i32 = exp.parse().unwrap_or(0);
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    }
}

/// `html.escape(s, quote)`: `&`, `<`, `>` always; `"` and `'` too when `quote` is true.
pub fn html_escape(s: &str, quote: bool) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    let mut start = 0;
    for (i, b) in s.bytes().enumerate() {
        // Every escaped character is ASCII, so `i` is always a char boundary here.
        if let Some(entity) = html_entity(b, quote) {
            out.push_str(&s[start..i]);
            out.push_str(entity);
            start = i + 1;
        }
    }
    out.push_str(&s[start..]);
    out
}

/// The entity `html.escape(.., quote)` puts for one byte, if any.
pub fn html_entity(b: u8, quote: bool) -> Option<&'static str> {
    match b {
        b'&' => Some("&amp;"),
        b'<' => Some("&lt;"),
        b'>' => Some("&gt;"),
        b'"' if quote => Some("&quot;"),
        b'\'' if quote => Some("&#x27;"),
        _ => None,
    }
}

/// Python `str()` of a JSON scalar (used where the reference stringifies ids).
pub fn py_str(v: &Value) -> Option<String> {
    match v {
        Value::Null => Some("None".to_owned()),
        Value::Bool(true) => Some("True".to_owned()),
        Value::Bool(false) => Some("False".to_owned()),
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Some(i.to_string())
            } else if let Some(u) = n.as_u64() {
                Some(u.to_string())
            } else {
                n.as_f64().map(float_repr)
            }
        }
        Value::Array(_) | Value::Object(_) => None,
    }
}

/// Python's `str.isalnum()` on a character (Unicode letters and numbers).
pub fn is_alnum(c: char) -> bool {
    c.is_alphanumeric()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn html_escape_matches_python() {
        assert_eq!(
            html_escape("a&b<c>\"d'", true),
            "a&amp;b&lt;c&gt;&quot;d&#x27;"
        );
        assert_eq!(html_escape("a&b<c>\"d'", false), "a&amp;b&lt;c&gt;\"d'");
        assert_eq!(html_escape("&amp;", false), "&amp;amp;");
    }

    #[test]
    fn strip_uses_python_whitespace() {
        assert_eq!(strip("\x1c\u{3000} hi \u{85}\u{a0}"), "hi");
        assert_eq!(
            strip("\u{200b}x"),
            "\u{200b}x",
            "zero-width space is not whitespace"
        );
        assert_eq!(rstrip("a \n"), "a");
        assert_eq!(lstrip("\t a"), "a");
    }

    #[test]
    fn splitlines_matches_python() {
        assert_eq!(splitlines("a\r\nb\rc\nd"), vec!["a", "b", "c", "d"]);
        assert_eq!(
            splitlines("a\x0bb\x0cc\x1cd\u{2028}e\u{85}f"),
            vec!["a", "b", "c", "d", "e", "f"]
        );
        assert_eq!(splitlines("a\n"), vec!["a"]);
        assert_eq!(splitlines("a\n\nb"), vec!["a", "", "b"]);
        assert!(splitlines("").is_empty());
        assert_eq!(splitlines("\n"), vec![""]);
    }

    #[test]
    fn casefold_is_full_folding() {
        assert_eq!(casefold("Straße"), "strasse");
        assert_eq!(casefold("ΣΑΣ"), casefold("σας"));
    }

    #[test]
    fn parse_float_accepts_python_forms() {
        assert_eq!(parse_float(" 0.8 "), Some(0.8));
        assert_eq!(parse_float("1e-1"), Some(0.1));
        assert_eq!(parse_float("1_0"), Some(10.0));
        assert!(parse_float("nan").unwrap().is_nan());
        assert_eq!(parse_float("-Infinity"), Some(f64::NEG_INFINITY));
        for bad in ["", " ", "1__0", "_1", "1_", "abc", "0x10", "1.0.0"] {
            assert!(parse_float(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn py_eq_treats_numbers_like_python() {
        assert!(py_eq(&json!(1), &json!(1.0)));
        assert!(py_eq(&json!(true), &json!(1)));
        assert!(!py_eq(&json!("1"), &json!(1)));
        assert!(py_eq(
            &json!({"a": 1, "b": [1, 2]}),
            &json!({"b": [1.0, 2], "a": true})
        ));
        assert!(!py_eq(&json!({"a": null}), &json!({})));
    }

    #[test]
    fn float_repr_matches_python() {
        assert_eq!(float_repr(0.95), "0.95");
        assert_eq!(float_repr(1.0), "1.0");
        assert_eq!(float_repr(1e-5), "1e-05");
        assert_eq!(float_repr(1e16), "1e+16");
        assert_eq!(float_repr(0.0001), "0.0001");
        assert_eq!(float_repr(123456.5), "123456.5");
        assert_eq!(float_repr(1.5e20), "1.5e+20");
    }

    #[test]
    fn prefix_counts_code_points() {
        assert_eq!(prefix_chars("用户喜欢", 2), "用户");
        assert_eq!(prefix_chars("ab", 5), "ab");
    }
}
