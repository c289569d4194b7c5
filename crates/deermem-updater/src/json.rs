//! A small JSON reader that follows Python's `json` dialect, for model output: `NaN`,
//! `Infinity` and `-Infinity` are accepted, duplicate keys keep the last value (at the first
//! key's position, as a Python dict does), integers and floats stay distinct, and integers of
//! any size are read (saturating at the `i128` range, which is far beyond every use here).
//!
//! [`decode_prefix`] decodes one value at the start of a text and ignores what follows, like
//! Python's `JSONDecoder.raw_decode`. Nothing is ever repaired: a truncated or malformed value is
//! an error. Nesting depth is bounded and every decode consumes from a caller-supplied work
//! budget, so hostile input cannot recurse deeply or make scanning quadratic without bound.

use indexmap::IndexMap;

/// How deep arrays and objects may nest before a decode fails.
pub(crate) const MAX_DEPTH: usize = 256;

/// A decoded JSON value with Python's distinctions.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum PyJson {
    /// `null`.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// An integer literal (saturated to the `i128` range).
    Int(i128),
    /// A float literal, `NaN` or an infinity (`1e400` reads as infinity, as in Python).
    Float(f64),
    /// A string.
    Str(String),
    /// An array.
    Array(Vec<PyJson>),
    /// An object; duplicate keys keep the last value at the first key's position.
    Object(IndexMap<String, PyJson>),
}

impl PyJson {
    /// The object's entries, when this is an object.
    pub(crate) fn as_object(&self) -> Option<&IndexMap<String, PyJson>> {
        match self {
            Self::Object(m) => Some(m),
            _ => None,
        }
    }

    /// The array's items, when this is an array.
    pub(crate) fn as_array(&self) -> Option<&[PyJson]> {
        match self {
            Self::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The string, when this is a string.
    pub(crate) fn as_str(&self) -> Option<&str> {
        match self {
            Self::Str(s) => Some(s),
            _ => None,
        }
    }

    /// Python truthiness.
    pub(crate) fn truthy(&self) -> bool {
        match self {
            Self::Null => false,
            Self::Bool(b) => *b,
            Self::Int(i) => *i != 0,
            Self::Float(f) => *f != 0.0,
            Self::Str(s) => !s.is_empty(),
            Self::Array(a) => !a.is_empty(),
            Self::Object(o) => !o.is_empty(),
        }
    }

    #[cfg(test)]
    /// Converts to a `serde_json` value. Non-finite floats (which JSON cannot hold) become
    /// `null`; integers beyond the `i64`/`u64` range become floats.
    pub(crate) fn to_value(&self) -> serde_json::Value {
        use serde_json::Value;
        match self {
            Self::Null => Value::Null,
            Self::Bool(b) => Value::Bool(*b),
            Self::Int(i) => {
                if let Ok(v) = i64::try_from(*i) {
                    Value::from(v)
                } else if let Ok(v) = u64::try_from(*i) {
                    Value::from(v)
                } else {
                    serde_json::Number::from_f64(*i as f64).map_or(Value::Null, Value::Number)
                }
            }
            Self::Float(f) => serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
            Self::Str(s) => Value::String(s.clone()),
            Self::Array(a) => Value::Array(a.iter().map(Self::to_value).collect()),
            Self::Object(o) => {
                Value::Object(o.iter().map(|(k, v)| (k.clone(), v.to_value())).collect())
            }
        }
    }
}

/// Why a decode failed (never shown to end users; the caller moves on to the next candidate).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum DecodeError {
    /// The text is not valid JSON at this byte offset.
    Syntax {
        /// Byte offset of the problem.
        at: usize,
        /// What was expected.
        expected: &'static str,
    },
    /// Arrays and objects nest deeper than [`MAX_DEPTH`].
    TooDeep,
    /// The work budget ran out.
    BudgetExhausted,
}

/// A work budget shared by several decode attempts: each byte examined costs one unit.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Budget {
    remaining: u64,
}

impl Budget {
    /// A budget of `units` bytes examined.
    pub(crate) fn new(units: u64) -> Self {
        Self { remaining: units }
    }

    #[cfg(test)]
    /// Whether the budget is spent.
    pub(crate) fn exhausted(&self) -> bool {
        self.remaining == 0
    }
}

/// Decodes one JSON value starting exactly at byte `start` of `text` (no leading whitespace is
/// skipped, as with `raw_decode` at an index) and returns it with the byte offset just past it.
///
/// # Errors
/// A [`DecodeError`] when no complete value starts there.
pub(crate) fn decode_prefix(
    text: &str,
    start: usize,
    budget: &mut Budget,
) -> Result<(PyJson, usize), DecodeError> {
    let mut p = Parser {
        s: text.as_bytes(),
        text,
        pos: start,
        budget,
    };
    let v = p.value(0)?;
    Ok((v, p.pos))
}

#[cfg(test)]
/// Decodes a complete JSON document (surrounding JSON whitespace allowed), like `json.loads`.
///
/// # Errors
/// A [`DecodeError`] for invalid JSON or trailing data.
pub(crate) fn decode_str(text: &str) -> Result<PyJson, DecodeError> {
    let mut budget = Budget::new(
        u64::try_from(text.len())
            .unwrap_or(u64::MAX)
            .saturating_add(16),
    );
    let mut p = Parser {
        s: text.as_bytes(),
        text,
        pos: 0,
        budget: &mut budget,
    };
    p.ws();
    let v = p.value(0)?;
    p.ws();
    if p.pos != p.s.len() {
        return Err(DecodeError::Syntax {
            at: p.pos,
            expected: "end of data",
        });
    }
    Ok(v)
}

struct Parser<'a, 'b> {
    s: &'a [u8],
    text: &'a str,
    pos: usize,
    budget: &'b mut Budget,
}

impl Parser<'_, '_> {
    fn err(&self, expected: &'static str) -> DecodeError {
        DecodeError::Syntax {
            at: self.pos,
            expected,
        }
    }

    fn charge(&mut self, n: usize) -> Result<(), DecodeError> {
        let n = u64::try_from(n).unwrap_or(u64::MAX);
        if self.budget.remaining < n {
            self.budget.remaining = 0;
            return Err(DecodeError::BudgetExhausted);
        }
        self.budget.remaining -= n;
        Ok(())
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    fn literal(&mut self, word: &'static str) -> bool {
        if self.s[self.pos..].starts_with(word.as_bytes()) {
            self.pos += word.len();
            true
        } else {
            false
        }
    }

    fn value(&mut self, depth: usize) -> Result<PyJson, DecodeError> {
        self.charge(1)?;
        match self.peek() {
            Some(b'{') => self.object(depth + 1),
            Some(b'[') => self.array(depth + 1),
            Some(b'"') => self.string().map(PyJson::Str),
            Some(b'n') if self.literal("null") => Ok(PyJson::Null),
            Some(b't') if self.literal("true") => Ok(PyJson::Bool(true)),
            Some(b'f') if self.literal("false") => Ok(PyJson::Bool(false)),
            Some(b'N') if self.literal("NaN") => Ok(PyJson::Float(f64::NAN)),
            Some(b'I') if self.literal("Infinity") => Ok(PyJson::Float(f64::INFINITY)),
            Some(b'-') if self.s[self.pos..].starts_with(b"-Infinity") => {
                self.pos += "-Infinity".len();
                Ok(PyJson::Float(f64::NEG_INFINITY))
            }
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => Err(self.err("a value")),
        }
    }

    fn object(&mut self, depth: usize) -> Result<PyJson, DecodeError> {
        if depth > MAX_DEPTH {
            return Err(DecodeError::TooDeep);
        }
        self.pos += 1; // '{'
        let mut map = IndexMap::new();
        self.ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(PyJson::Object(map));
        }
        loop {
            self.charge(1)?;
            if self.peek() != Some(b'"') {
                return Err(self.err("a property name in double quotes"));
            }
            let key = self.string()?;
            self.ws();
            if self.peek() != Some(b':') {
                return Err(self.err("':'"));
            }
            self.pos += 1;
            self.ws();
            let v = self.value(depth)?;
            map.insert(key, v);
            self.ws();
            match self.peek() {
                Some(b',') => {
                    self.pos += 1;
                    self.ws();
                }
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(PyJson::Object(map));
                }
                _ => return Err(self.err("',' or '}'")),
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<PyJson, DecodeError> {
        if depth > MAX_DEPTH {
            return Err(DecodeError::TooDeep);
        }
        self.pos += 1; // '['
        let mut items = Vec::new();
        self.ws();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(PyJson::Array(items));
        }
        loop {
            items.push(self.value(depth)?);
            self.ws();
            match self.peek() {
                Some(b',') => {
                    self.pos += 1;
                    self.ws();
                }
                Some(b']') => {
                    self.pos += 1;
                    return Ok(PyJson::Array(items));
                }
                _ => return Err(self.err("',' or ']'")),
            }
        }
    }

    fn number(&mut self) -> Result<PyJson, DecodeError> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => {
                while let Some(b'0'..=b'9') = self.peek() {
                    self.pos += 1;
                }
            }
            _ => return Err(self.err("a digit")),
        }
        let int_end = self.pos;
        let mut is_float = false;
        // A fraction needs at least one digit; otherwise the '.' is not part of the number.
        if self.peek() == Some(b'.') && matches!(self.s.get(self.pos + 1), Some(b'0'..=b'9')) {
            is_float = true;
            self.pos += 1;
            while let Some(b'0'..=b'9') = self.peek() {
                self.pos += 1;
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            let save = self.pos;
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            if matches!(self.peek(), Some(b'0'..=b'9')) {
                is_float = true;
                while let Some(b'0'..=b'9') = self.peek() {
                    self.pos += 1;
                }
            } else {
                self.pos = save;
            }
        }
        self.charge(self.pos - start)?;
        let lit = &self.text[start..self.pos];
        if is_float {
            // Rust's parser reads overflow as infinity and underflow as zero, like Python.
            let f = lit.parse::<f64>().map_err(|_| DecodeError::Syntax {
                at: start,
                expected: "a number",
            })?;
            return Ok(PyJson::Float(f));
        }
        let digits = &self.text[start..int_end];
        Ok(PyJson::Int(parse_int_saturating(digits)))
    }

    fn string(&mut self) -> Result<String, DecodeError> {
        self.pos += 1; // opening quote
        let mut out = String::new();
        loop {
            // Copy the run of ordinary characters in one go.
            let run_start = self.pos;
            while let Some(b) = self.peek() {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.pos += 1;
            }
            self.charge(self.pos - run_start + 1)?;
            out.push_str(&self.text[run_start..self.pos]);
            match self.peek() {
                None => return Err(self.err("closing quote")),
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.pos += 1;
                    let esc = self.peek().ok_or_else(|| self.err("an escape"))?;
                    self.pos += 1;
                    match esc {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let hi = self.hex4()?;
                            let c = if (0xD800..0xDC00).contains(&hi)
                                && self.s[self.pos..].starts_with(b"\\u")
                            {
                                let save = self.pos;
                                self.pos += 2;
                                let lo = self.hex4()?;
                                if (0xDC00..0xE000).contains(&lo) {
                                    let cp = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
                                    char::from_u32(cp).unwrap_or('\u{FFFD}')
                                } else {
                                    // A lone high surrogate followed by another escape.
                                    self.pos = save;
                                    '\u{FFFD}'
                                }
                            } else {
                                // Lone surrogates cannot live in a Rust string.
                                char::from_u32(hi).unwrap_or('\u{FFFD}')
                            };
                            out.push(c);
                        }
                        _ => {
                            self.pos -= 1;
                            return Err(self.err("a valid escape"));
                        }
                    }
                }
                Some(_) => return Err(self.err("no control character in a string")),
            }
        }
    }

    fn hex4(&mut self) -> Result<u32, DecodeError> {
        let h = self
            .s
            .get(self.pos..self.pos + 4)
            .ok_or_else(|| self.err("4 hex digits"))?;
        let mut v = 0u32;
        for &b in h {
            let d = (b as char)
                .to_digit(16)
                .ok_or_else(|| self.err("4 hex digits"))?;
            v = v * 16 + d;
        }
        self.pos += 4;
        Ok(v)
    }
}

/// Parses an optionally signed run of ASCII digits, saturating at the `i128` range.
fn parse_int_saturating(digits: &str) -> i128 {
    let (neg, body) = match digits.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, digits),
    };
    let mut v: i128 = 0;
    for b in body.bytes() {
        let d = i128::from(b - b'0');
        v = match v.checked_mul(10).and_then(|x| x.checked_add(d)) {
            Some(x) => x,
            None => return if neg { i128::MIN } else { i128::MAX },
        };
    }
    if neg { -v } else { v }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dec(s: &str) -> PyJson {
        decode_str(s).unwrap()
    }

    #[test]
    fn reads_python_dialect() {
        assert!(matches!(dec("NaN"), PyJson::Float(f) if f.is_nan()));
        assert_eq!(dec("Infinity"), PyJson::Float(f64::INFINITY));
        assert_eq!(dec("-Infinity"), PyJson::Float(f64::NEG_INFINITY));
        assert_eq!(dec("1e400"), PyJson::Float(f64::INFINITY));
        assert_eq!(dec("0"), PyJson::Int(0));
        assert_eq!(dec("-7"), PyJson::Int(-7));
        assert_eq!(dec("0.0"), PyJson::Float(0.0));
        assert_eq!(dec("90.0"), PyJson::Float(90.0));
        assert_eq!(dec("1E2"), PyJson::Float(100.0));
        assert_eq!(
            dec(&format!("1{}", "0".repeat(400))),
            PyJson::Int(i128::MAX)
        );
        assert_eq!(
            dec(&format!("-1{}", "0".repeat(400))),
            PyJson::Int(i128::MIN)
        );
        assert_eq!(
            dec(" [1, 2.5, true, null] "),
            PyJson::Array(vec![
                PyJson::Int(1),
                PyJson::Float(2.5),
                PyJson::Bool(true),
                PyJson::Null
            ])
        );
    }

    #[test]
    fn duplicate_keys_keep_last_value_at_first_position() {
        let v = dec(r#"{"a": 1, "b": 2, "a": 3}"#);
        let m = v.as_object().unwrap();
        assert_eq!(m.keys().collect::<Vec<_>>(), vec!["a", "b"]);
        assert_eq!(m["a"], PyJson::Int(3));
    }

    #[test]
    fn strings_follow_json_escapes() {
        assert_eq!(
            dec(r#""a\"b\\c\/d\n\u00e9\ud83d\ude00""#),
            PyJson::Str("a\"b\\c/d\né😀".into())
        );
        assert_eq!(dec(r#""\ud800x""#), PyJson::Str("\u{FFFD}x".into()));
        assert!(
            decode_str("\"a\nb\"").is_err(),
            "raw control characters are rejected"
        );
        assert!(decode_str(r#""\x""#).is_err());
        assert_eq!(dec("\"用户\""), PyJson::Str("用户".into()));
    }

    #[test]
    fn malformed_input_is_rejected_not_repaired() {
        for bad in [
            "{",
            "{\"a\":",
            "{\"a\": 1,}",
            "[1,]",
            "{'a': 1}",
            "01",
            "-",
            "1.",
            "tru",
            "{a: 1}",
            "\"abc",
            "[1 2]",
            "nan",
            "+1",
        ] {
            assert!(decode_str(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn raw_decode_ignores_trailing_text() {
        let text = "xx{\"a\": [1]} trailing {";
        let mut b = Budget::new(1000);
        let (v, end) = decode_prefix(text, 2, &mut b).unwrap();
        assert_eq!(&text[end..], " trailing {");
        assert_eq!(
            v.as_object().unwrap()["a"],
            PyJson::Array(vec![PyJson::Int(1)])
        );
    }

    #[test]
    fn depth_and_budget_are_bounded() {
        let deep = "[".repeat(MAX_DEPTH + 5);
        assert_eq!(decode_str(&deep), Err(DecodeError::TooDeep));
        let mut b = Budget::new(10);
        let long = format!("\"{}\"", "x".repeat(100));
        assert_eq!(
            decode_prefix(&long, 0, &mut b),
            Err(DecodeError::BudgetExhausted)
        );
        assert!(b.exhausted());
    }

    #[test]
    fn converts_to_serde_values() {
        let v = dec(r#"{"n": NaN, "i": 5, "f": 0.5, "big": 100000000000000000000}"#).to_value();
        assert_eq!(v["n"], serde_json::Value::Null);
        assert_eq!(v["i"], 5);
        assert_eq!(v["f"], 0.5);
        assert_eq!(v["big"], 1e20);
    }
}
