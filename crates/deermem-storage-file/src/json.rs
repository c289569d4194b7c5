//! JSON in the Python reference's dialect: a writer producing exactly
//! `json.dumps(obj, ensure_ascii=False, indent=2)` and a lenient reader that accepts what
//! Python's `json.loads` accepts (`NaN`, `Infinity`, duplicate keys with the last one winning).

use std::fmt::Write as _;

use deermem_core::py;
use serde_json::{Map, Number, Value};

/// Deepest nesting the reader accepts (Python's own recursion limit is about 1000).
const MAX_DEPTH: usize = 512;

/// Renders a value the way `json.dumps(value, ensure_ascii=False, indent=2)` does: two-space
/// indent, `": "` between key and value, raw UTF-8, Python float `repr`, and no trailing
/// newline.
pub fn to_python_json(value: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, value, 0);
    out
}

fn write_indent(out: &mut String, level: usize) {
    out.push('\n');
    for _ in 0..level {
        out.push_str("  ");
    }
}

fn write_value(out: &mut String, value: &Value, level: usize) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => write_number(out, n),
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            if items.is_empty() {
                out.push_str("[]");
                return;
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_indent(out, level + 1);
                write_value(out, item, level + 1);
            }
            write_indent(out, level);
            out.push(']');
        }
        Value::Object(map) => {
            if map.is_empty() {
                out.push_str("{}");
                return;
            }
            out.push('{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_indent(out, level + 1);
                write_string(out, k);
                out.push_str(": ");
                write_value(out, v, level + 1);
            }
            write_indent(out, level);
            out.push('}');
        }
    }
}

fn write_number(out: &mut String, n: &Number) {
    if let Some(i) = n.as_i64() {
        let _ = write!(out, "{i}");
    } else if let Some(u) = n.as_u64() {
        let _ = write!(out, "{u}");
    } else if let Some(f) = n.as_f64() {
        // serde_json numbers are always finite; Python writes `NaN`/`Infinity` otherwise.
        out.push_str(&py::float_repr(f));
    }
}

fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A JSON syntax error with the character offset where it was found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}: line {line} column {column} (char {offset})")]
pub struct JsonError {
    /// What is wrong.
    pub message: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// 0-based character offset.
    pub offset: usize,
}

/// Parses JSON text the way Python's `json.loads` does.
///
/// `NaN`, `Infinity` and `-Infinity` are accepted; as `serde_json` cannot hold non-finite
/// numbers they read as `null`. Duplicate keys keep their first position and the last value.
/// A leading byte-order mark is an error, as in Python.
///
/// # Errors
/// A [`JsonError`] for malformed text, trailing data, or nesting deeper than 512 levels.
pub fn parse_lenient(text: &str) -> Result<Value, JsonError> {
    let mut p = Parser {
        text,
        bytes: text.as_bytes(),
        pos: 0,
    };
    p.skip_ws();
    let v = p.value(0)?;
    p.skip_ws();
    if p.pos != p.bytes.len() {
        return Err(p.error("Extra data"));
    }
    Ok(v)
}

struct Parser<'a> {
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn error(&self, message: &str) -> JsonError {
        // The position can sit inside a multi-byte character (after a bad escape such as
        // `\Ս`): report at the start of that character instead of slicing through it.
        let mut end = self.pos.min(self.text.len());
        while !self.text.is_char_boundary(end) {
            end -= 1;
        }
        let before = &self.text[..end];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        JsonError {
            message: message.to_owned(),
            line,
            column,
            offset: before.chars().count(),
        }
    }

    fn skip_ws(&mut self) {
        while let Some(b) = self.bytes.get(self.pos) {
            if matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
                self.pos += 1;
            } else {
                break;
            }
        }
    }

    fn eat(&mut self, lit: &str) -> bool {
        if self.bytes[self.pos..].starts_with(lit.as_bytes()) {
            self.pos += lit.len();
            true
        } else {
            false
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value, JsonError> {
        if depth > MAX_DEPTH {
            return Err(self.error("Nesting too deep"));
        }
        match self.bytes.get(self.pos) {
            None => Err(self.error("Expecting value")),
            Some(b'{') => self.object(depth),
            Some(b'[') => self.array(depth),
            Some(b'"') => self.string().map(Value::String),
            Some(b'n') if self.eat("null") => Ok(Value::Null),
            Some(b't') if self.eat("true") => Ok(Value::Bool(true)),
            Some(b'f') if self.eat("false") => Ok(Value::Bool(false)),
            Some(b'N') if self.eat("NaN") => Ok(Value::Null),
            Some(b'I') if self.eat("Infinity") => Ok(Value::Null),
            Some(b'-') if self.bytes[self.pos..].starts_with(b"-Infinity") => {
                self.pos += "-Infinity".len();
                Ok(Value::Null)
            }
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(_) => Err(self.error("Expecting value")),
        }
    }

    fn object(&mut self, depth: usize) -> Result<Value, JsonError> {
        self.pos += 1;
        let mut map = Map::new();
        self.skip_ws();
        if self.bytes.get(self.pos) == Some(&b'}') {
            self.pos += 1;
            return Ok(Value::Object(map));
        }
        loop {
            self.skip_ws();
            if self.bytes.get(self.pos) != Some(&b'"') {
                return Err(self.error("Expecting property name enclosed in double quotes"));
            }
            let key = self.string()?;
            self.skip_ws();
            if self.bytes.get(self.pos) != Some(&b':') {
                return Err(self.error("Expecting ':' delimiter"));
            }
            self.pos += 1;
            self.skip_ws();
            let v = self.value(depth + 1)?;
            // `insert` keeps the first position of a repeated key and stores the last value,
            // exactly like a Python dict built from pairs.
            map.insert(key, v);
            self.skip_ws();
            match self.bytes.get(self.pos) {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(Value::Object(map));
                }
                _ => return Err(self.error("Expecting ',' delimiter")),
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<Value, JsonError> {
        self.pos += 1;
        let mut items = Vec::new();
        self.skip_ws();
        if self.bytes.get(self.pos) == Some(&b']') {
            self.pos += 1;
            return Ok(Value::Array(items));
        }
        loop {
            self.skip_ws();
            items.push(self.value(depth + 1)?);
            self.skip_ws();
            match self.bytes.get(self.pos) {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Value::Array(items));
                }
                _ => return Err(self.error("Expecting ',' delimiter")),
            }
        }
    }

    fn hex4(&mut self) -> Result<u32, JsonError> {
        let end = self.pos + 4;
        let digits = self
            .text
            .get(self.pos..end)
            .filter(|d| d.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| self.error("Invalid \\uXXXX escape"))?;
        let v =
            u32::from_str_radix(digits, 16).map_err(|_| self.error("Invalid \\uXXXX escape"))?;
        self.pos = end;
        Ok(v)
    }

    fn string(&mut self) -> Result<String, JsonError> {
        self.pos += 1;
        let mut out = String::new();
        loop {
            let start = self.pos;
            while let Some(&b) = self.bytes.get(self.pos) {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.pos += 1;
            }
            out.push_str(&self.text[start..self.pos]);
            match self.bytes.get(self.pos) {
                None => return Err(self.error("Unterminated string starting at")),
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.pos += 1;
                    let Some(&esc) = self.bytes.get(self.pos) else {
                        return Err(self.error("Unterminated string starting at"));
                    };
                    self.pos += 1;
                    match esc {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{08}'),
                        b'f' => out.push('\u{0c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let hi = self.hex4()?;
                            let c = if (0xD800..0xDC00).contains(&hi)
                                && self.bytes[self.pos..].starts_with(b"\\u")
                            {
                                let save = self.pos;
                                self.pos += 2;
                                let lo = self.hex4()?;
                                if (0xDC00..0xE000).contains(&lo) {
                                    char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))
                                } else {
                                    self.pos = save;
                                    None
                                }
                            } else {
                                char::from_u32(hi)
                            };
                            // Python keeps lone surrogates; a Rust string cannot hold them.
                            out.push(c.ok_or_else(|| self.error("Lone surrogate in \\u escape"))?);
                        }
                        _ => return Err(self.error("Invalid \\escape")),
                    }
                }
                Some(_) => return Err(self.error("Invalid control character at")),
            }
        }
    }

    fn number(&mut self) -> Result<Value, JsonError> {
        let start = self.pos;
        if self.bytes.get(self.pos) == Some(&b'-') {
            self.pos += 1;
        }
        match self.bytes.get(self.pos) {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => {
                while self.bytes.get(self.pos).is_some_and(u8::is_ascii_digit) {
                    self.pos += 1;
                }
            }
            _ => return Err(self.error("Expecting value")),
        }
        let mut is_float = false;
        if self.bytes.get(self.pos) == Some(&b'.')
            && self.bytes.get(self.pos + 1).is_some_and(u8::is_ascii_digit)
        {
            is_float = true;
            self.pos += 1;
            while self.bytes.get(self.pos).is_some_and(u8::is_ascii_digit) {
                self.pos += 1;
            }
        }
        if matches!(self.bytes.get(self.pos), Some(b'e' | b'E')) {
            let save = self.pos;
            self.pos += 1;
            if matches!(self.bytes.get(self.pos), Some(b'+' | b'-')) {
                self.pos += 1;
            }
            if self.bytes.get(self.pos).is_some_and(u8::is_ascii_digit) {
                is_float = true;
                while self.bytes.get(self.pos).is_some_and(u8::is_ascii_digit) {
                    self.pos += 1;
                }
            } else {
                self.pos = save;
            }
        }
        let text = &self.text[start..self.pos];
        if !is_float {
            if let Ok(i) = text.parse::<i64>() {
                return Ok(Value::Number(i.into()));
            }
            if let Ok(u) = text.parse::<u64>() {
                return Ok(Value::Number(u.into()));
            }
        }
        // Floats, and integers beyond 64 bits (Python keeps them exact; we keep the nearest
        // float rather than failing).
        let f: f64 = text.parse().map_err(|_| self.error("Invalid number"))?;
        Ok(Number::from_f64(f).map_or(Value::Null, Value::Number))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Regression (fuzz target `manifest_json`): an invalid escape followed by a multi-byte
    /// character made the error report slice through that character and panic.
    #[test]
    fn errors_inside_multibyte_characters_are_reported_not_panicked() {
        for text in [
            "{\"r+fv\\v\\\\\u{54d}\\\"revsion\": \"v\"\t\\\u{0}",
            "\"\\\u{54d}\"",
            "[\"\\\u{1F98C}\"]",
            "{\"a\": \"\\u12\u{e9}\"}",
        ] {
            let err = parse_lenient(text).unwrap_err();
            assert!(err.line >= 1 && err.column >= 1, "{text:?}: {err}");
        }
    }

    #[test]
    fn writer_matches_python_layout() {
        let v = json!({"version": "2.0", "revision": 2, "user": {"a": {"summary": "", "updatedAt": ""}},
                       "empty": {}, "list": [], "ids": ["x", "y"], "f": 1.0, "g": 1e-5, "h": 1e16, "c": 0.95});
        let s = to_python_json(&v);
        assert_eq!(
            s,
            "{\n  \"version\": \"2.0\",\n  \"revision\": 2,\n  \"user\": {\n    \"a\": {\n      \"summary\": \"\",\n      \"updatedAt\": \"\"\n    }\n  },\n  \"empty\": {},\n  \"list\": [],\n  \"ids\": [\n    \"x\",\n    \"y\"\n  ],\n  \"f\": 1.0,\n  \"g\": 1e-05,\n  \"h\": 1e+16,\n  \"c\": 0.95\n}"
        );
    }

    #[test]
    fn writer_escapes_like_python() {
        let v = json!("a\"b\\c\nd\re\tf\u{8}\u{c}\u{1}\u{1f}\u{7f}é😀\u{2028}");
        assert_eq!(
            to_python_json(&v),
            "\"a\\\"b\\\\c\\nd\\re\\tf\\b\\f\\u0001\\u001f\u{7f}é😀\u{2028}\""
        );
    }

    #[test]
    fn reader_is_lenient_like_python() {
        let v = parse_lenient("{\"a\": 1, \"b\": NaN, \"a\": 2, \"c\": -Infinity, \"d\": 1e-05}")
            .unwrap();
        assert_eq!(v, json!({"a": 2, "b": null, "c": null, "d": 1e-05}));
        assert_eq!(
            v.as_object().unwrap().keys().collect::<Vec<_>>(),
            vec!["a", "b", "c", "d"]
        );
        assert_eq!(
            parse_lenient("\"\\ud83d\\ude00\\u00e9\"").unwrap(),
            json!("😀é")
        );
        assert_eq!(
            parse_lenient(" [1, 2.5, -3] ").unwrap(),
            json!([1, 2.5, -3])
        );
        assert_eq!(
            parse_lenient("123456789012345678901234567890").unwrap(),
            json!(1.2345678901234568e29)
        );
    }

    #[test]
    fn reader_rejects_what_python_rejects() {
        for bad in [
            "",
            "\u{feff}{}",
            "{broken",
            "{\"a\": 1,}",
            "[1,]",
            "{\"a\" 1}",
            "01",
            "\"\u{1}\"",
            "{} x",
            "\"\\ud800\"",
            "'a'",
        ] {
            assert!(parse_lenient(bad).is_err(), "{bad:?} must fail");
        }
        let deep = "[".repeat(100_000);
        assert!(parse_lenient(&deep).is_err());
    }

    #[test]
    fn round_trip_is_stable() {
        let v =
            json!({"k": ["é", {"n": null, "t": true, "x": -0.5}], "big": 18446744073709551615u64});
        let s = to_python_json(&v);
        assert_eq!(parse_lenient(&s).unwrap(), v);
    }
}
