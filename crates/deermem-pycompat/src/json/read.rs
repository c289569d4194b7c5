//! The one lenient JSON reader: CPython's `json` scanner grammar (`NaN`, `Infinity`,
//! `-Infinity`, duplicate keys with the last value at the first key's position), its error
//! messages and positions, over one generic parser that builds `serde_json` values (files) or
//! [`PyJson`] values (model output, where ints and floats stay distinct, and error reports).
//! Nesting depth is bounded and every byte examined is charged to a work budget.

use indexmap::IndexMap;
use serde_json::{Map, Number, Value};

/// Deepest nesting of arrays and objects [`parse_lenient`] and [`python_decode_error`] accept
/// (Python's own recursion limit is about 1000).
pub const MAX_DEPTH: usize = 512;

/// Deepest nesting [`decode_str`] and [`decode_prefix`] (model output) accept.
pub const MAX_DECODE_DEPTH: usize = 256;

/// A decoded JSON value with Python's distinctions.
#[derive(Clone, Debug, PartialEq)]
pub enum PyJson {
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
    pub fn as_object(&self) -> Option<&IndexMap<String, PyJson>> {
        match self {
            Self::Object(m) => Some(m),
            _ => None,
        }
    }

    /// The array's items, when this is an array.
    pub fn as_array(&self) -> Option<&[PyJson]> {
        match self {
            Self::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The string, when this is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::Str(s) => Some(s),
            _ => None,
        }
    }

    /// Python truthiness.
    pub fn truthy(&self) -> bool {
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

    /// Converts to a `serde_json` value. Non-finite floats (which JSON cannot hold) become
    /// `null`; integers beyond the `i64`/`u64` range become floats.
    pub fn to_value(&self) -> Value {
        match self {
            Self::Null => Value::Null,
            Self::Bool(b) => Value::Bool(*b),
            Self::Int(i) => {
                if let Ok(v) = i64::try_from(*i) {
                    Value::from(v)
                } else if let Ok(v) = u64::try_from(*i) {
                    Value::from(v)
                } else {
                    Number::from_f64(*i as f64).map_or(Value::Null, Value::Number)
                }
            }
            Self::Float(f) => Number::from_f64(*f).map_or(Value::Null, Value::Number),
            Self::Str(s) => Value::String(s.clone()),
            Self::Array(a) => Value::Array(a.iter().map(Self::to_value).collect()),
            Self::Object(o) => {
                Value::Object(o.iter().map(|(k, v)| (k.clone(), v.to_value())).collect())
            }
        }
    }
}

/// What kind of failure a [`DecodeError`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The text is not JSON (what `json.loads` raises `JSONDecodeError` for).
    Syntax,
    /// Arrays and objects nest deeper than the reader's limit.
    TooDeep,
    /// The work budget ran out.
    BudgetExhausted,
}

/// Why a decode failed, found cheaply: the position is a byte offset; [`DecodeError::locate`]
/// turns it into Python's line, column and character offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeError {
    /// What kind of failure.
    pub kind: ErrorKind,
    /// Python's message (`"Expecting value"`, `"Extra data"`, ...).
    pub msg: &'static str,
    /// Byte offset in the text where Python reports the error.
    pub at: usize,
}

impl DecodeError {
    fn syntax(at: usize, msg: &'static str) -> Self {
        Self {
            kind: ErrorKind::Syntax,
            msg,
            at,
        }
    }

    /// The error with Python's position (line, column, code-point offset) in `text`.
    pub fn locate(&self, text: &str) -> JsonError {
        let mut end = self.at.min(text.len());
        // Positions are at character starts; stay safe should one ever not be.
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let before = &text[..end];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        JsonError {
            message: self.msg,
            line,
            column,
            offset: before.chars().count(),
        }
    }
}

/// A JSON syntax error where Python's `JSONDecodeError` puts it, displayed as Python shows it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}: line {line} column {column} (char {offset})")]
pub struct JsonError {
    /// Python's message.
    pub message: &'static str,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// 0-based offset in code points (Python's `pos`).
    pub offset: usize,
}

/// A work budget shared by several decode attempts: each byte examined costs one unit.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    remaining: u64,
}

impl Budget {
    /// A budget of `units` bytes examined.
    pub fn new(units: u64) -> Self {
        Self { remaining: units }
    }

    /// Whether the budget is spent.
    pub fn exhausted(&self) -> bool {
        self.remaining == 0
    }
}

/// Parses JSON text the way Python's `json.loads` does, into a `serde_json` value (the files'
/// reader).
///
/// `NaN`, `Infinity` and `-Infinity` are accepted; as `serde_json` cannot hold non-finite
/// numbers they read as `null`, as do floats that overflow. Integers beyond 64 bits read as the
/// nearest float. Duplicate keys keep their first position and the last value. A leading
/// byte-order mark is an error, as in Python. A lone surrogate escape (`"\ud800"`), which
/// Python keeps but a Rust string cannot hold, is an error rather than a silent replacement,
/// so a file holding one is reported instead of rewritten with different text.
///
/// # Errors
/// A [`JsonError`] with Python's message and position for malformed text, trailing data, or
/// nesting deeper than [`MAX_DEPTH`].
pub fn parse_lenient(text: &str) -> Result<Value, JsonError> {
    let mut budget = Budget::new(u64::MAX);
    let mut p = Parser::<ValueBuilder>::new(text, 0, &mut budget, MAX_DEPTH, Surrogates::Reject);
    p.document().map_err(|e| e.locate(text))
}

/// Decodes a complete JSON document (surrounding JSON whitespace allowed), like `json.loads`,
/// keeping Python's distinctions ([`PyJson`]). A lone surrogate escape reads as U+FFFD.
///
/// # Errors
/// A [`DecodeError`] for invalid JSON, trailing data or nesting deeper than
/// [`MAX_DECODE_DEPTH`].
pub fn decode_str(text: &str) -> Result<PyJson, DecodeError> {
    let mut budget = Budget::new(
        u64::try_from(text.len())
            .unwrap_or(u64::MAX)
            .saturating_add(16),
    );
    let mut p =
        Parser::<PyJsonBuilder>::new(text, 0, &mut budget, MAX_DECODE_DEPTH, Surrogates::Replace);
    p.document()
}

/// Decodes one JSON value starting exactly at byte `start` of `text` (no leading whitespace is
/// skipped, as with `JSONDecoder.raw_decode` at an index) and returns it with the byte offset
/// just past it; what follows is ignored. Nothing is ever repaired: a truncated or malformed
/// value is an error. Every byte examined is charged to `budget`, so repeated attempts over
/// hostile text stay bounded.
///
/// # Errors
/// A [`DecodeError`] when no complete value starts there, it nests deeper than
/// [`MAX_DECODE_DEPTH`] or the budget runs out.
pub fn decode_prefix(
    text: &str,
    start: usize,
    budget: &mut Budget,
) -> Result<(PyJson, usize), DecodeError> {
    let mut p =
        Parser::<PyJsonBuilder>::new(text, start, budget, MAX_DECODE_DEPTH, Surrogates::Replace);
    let v = p.value(0)?;
    Ok((v, p.pos))
}

/// The error `json.loads(text)` raises (its message, and its position in code points as
/// [`JsonError::offset`]), or `None` when Python would accept the text (its `NaN`/`Infinity`
/// literals and lone surrogate escapes included) or it nests deeper than [`MAX_DEPTH`].
pub fn python_decode_error(text: &str) -> Option<JsonError> {
    let mut budget = Budget::new(u64::MAX);
    // The value is built and dropped: an error report is no hot path.
    let mut p = Parser::<PyJsonBuilder>::new(text, 0, &mut budget, MAX_DEPTH, Surrogates::Replace);
    match p.document() {
        Ok(_) => None,
        Err(e) if e.kind == ErrorKind::Syntax => Some(e.locate(text)),
        Err(_) => None,
    }
}

/// What a `\uXXXX` escape of a lone surrogate becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Surrogates {
    /// An error (Python keeps it; a Rust string cannot).
    Reject,
    /// U+FFFD.
    Replace,
}

/// How the parser builds values.
trait Build {
    type Value;
    type Map;
    fn null() -> Self::Value;
    fn bool(b: bool) -> Self::Value;
    /// A grammar-valid integer literal.
    fn int(lit: &str) -> Self::Value;
    /// A grammar-valid float literal (with a fraction or an exponent).
    fn float(lit: &str) -> Self::Value;
    /// `NaN`, `Infinity` or `-Infinity`.
    fn non_finite(f: f64) -> Self::Value;
    fn string(s: String) -> Self::Value;
    fn array(items: Vec<Self::Value>) -> Self::Value;
    fn new_map() -> Self::Map;
    /// Inserts like a Python dict: a repeated key keeps its position and takes the value.
    fn insert(map: &mut Self::Map, key: String, value: Self::Value);
    fn map(map: Self::Map) -> Self::Value;
}

/// `serde_json` values.
struct ValueBuilder;

impl Build for ValueBuilder {
    type Value = Value;
    type Map = Map<String, Value>;
    fn null() -> Value {
        Value::Null
    }
    fn bool(b: bool) -> Value {
        Value::Bool(b)
    }
    fn int(lit: &str) -> Value {
        if let Ok(i) = lit.parse::<i64>() {
            return Value::Number(i.into());
        }
        if let Ok(u) = lit.parse::<u64>() {
            return Value::Number(u.into());
        }
        // Beyond 64 bits Python keeps the integer exact; the nearest float is kept here.
        Self::float(lit)
    }
    fn float(lit: &str) -> Value {
        lit.parse::<f64>()
            .ok()
            .and_then(Number::from_f64)
            .map_or(Value::Null, Value::Number)
    }
    fn non_finite(_: f64) -> Value {
        Value::Null
    }
    fn string(s: String) -> Value {
        Value::String(s)
    }
    fn array(items: Vec<Value>) -> Value {
        Value::Array(items)
    }
    fn new_map() -> Map<String, Value> {
        Map::new()
    }
    fn insert(map: &mut Map<String, Value>, key: String, value: Value) {
        map.insert(key, value);
    }
    fn map(map: Map<String, Value>) -> Value {
        Value::Object(map)
    }
}

/// [`PyJson`] values.
struct PyJsonBuilder;

impl Build for PyJsonBuilder {
    type Value = PyJson;
    type Map = IndexMap<String, PyJson>;
    fn null() -> PyJson {
        PyJson::Null
    }
    fn bool(b: bool) -> PyJson {
        PyJson::Bool(b)
    }
    fn int(lit: &str) -> PyJson {
        PyJson::Int(parse_int_saturating(lit))
    }
    fn float(lit: &str) -> PyJson {
        // Rust's parser reads overflow as infinity and underflow as zero, like Python.
        PyJson::Float(lit.parse::<f64>().unwrap_or(f64::NAN))
    }
    fn non_finite(f: f64) -> PyJson {
        PyJson::Float(f)
    }
    fn string(s: String) -> PyJson {
        PyJson::Str(s)
    }
    fn array(items: Vec<PyJson>) -> PyJson {
        PyJson::Array(items)
    }
    fn new_map() -> IndexMap<String, PyJson> {
        IndexMap::new()
    }
    fn insert(map: &mut IndexMap<String, PyJson>, key: String, value: PyJson) {
        map.insert(key, value);
    }
    fn map(map: IndexMap<String, PyJson>) -> PyJson {
        PyJson::Object(map)
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
        let d = i128::from(b.wrapping_sub(b'0'));
        v = match v.checked_mul(10).and_then(|x| x.checked_add(d)) {
            Some(x) => x,
            None => return if neg { i128::MIN } else { i128::MAX },
        };
    }
    if neg { -v } else { v }
}

struct Parser<'a, 'b, B> {
    text: &'a str,
    s: &'a [u8],
    pos: usize,
    budget: &'b mut Budget,
    max_depth: usize,
    surrogates: Surrogates,
    _build: std::marker::PhantomData<B>,
}

impl<'a, 'b, B: Build> Parser<'a, 'b, B> {
    fn new(
        text: &'a str,
        pos: usize,
        budget: &'b mut Budget,
        max_depth: usize,
        surrogates: Surrogates,
    ) -> Self {
        Self {
            text,
            s: text.as_bytes(),
            pos,
            budget,
            max_depth,
            surrogates,
            _build: std::marker::PhantomData,
        }
    }

    /// A whole document: whitespace, one value, whitespace, the end.
    fn document(&mut self) -> Result<B::Value, DecodeError> {
        self.ws();
        let v = self.value(0)?;
        self.ws();
        if self.pos != self.s.len() {
            return Err(DecodeError::syntax(self.pos, "Extra data"));
        }
        Ok(v)
    }

    fn charge(&mut self, n: usize) -> Result<(), DecodeError> {
        let n = u64::try_from(n).unwrap_or(u64::MAX);
        if self.budget.remaining < n {
            self.budget.remaining = 0;
            return Err(DecodeError {
                kind: ErrorKind::BudgetExhausted,
                msg: "Work budget exhausted",
                at: self.pos,
            });
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

    /// One value at `pos` (no whitespace skipped); `depth` containers enclose it.
    fn value(&mut self, depth: usize) -> Result<B::Value, DecodeError> {
        self.charge(1)?;
        match self.peek() {
            Some(b'{') => self.object(depth + 1),
            Some(b'[') => self.array(depth + 1),
            Some(b'"') => self.string().map(B::string),
            Some(b'n') if self.literal("null") => Ok(B::null()),
            Some(b't') if self.literal("true") => Ok(B::bool(true)),
            Some(b'f') if self.literal("false") => Ok(B::bool(false)),
            Some(b'N') if self.literal("NaN") => Ok(B::non_finite(f64::NAN)),
            Some(b'I') if self.literal("Infinity") => Ok(B::non_finite(f64::INFINITY)),
            Some(b'-') if self.literal("-Infinity") => Ok(B::non_finite(f64::NEG_INFINITY)),
            _ => self.number(),
        }
    }

    fn too_deep(&self, depth: usize) -> Result<(), DecodeError> {
        if depth > self.max_depth {
            Err(DecodeError {
                kind: ErrorKind::TooDeep,
                msg: "Nesting too deep",
                at: self.pos,
            })
        } else {
            Ok(())
        }
    }

    /// An object whose `{` is at `pos`.
    fn object(&mut self, depth: usize) -> Result<B::Value, DecodeError> {
        self.too_deep(depth)?;
        self.pos += 1;
        let mut map = B::new_map();
        self.ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(B::map(map));
        }
        loop {
            self.charge(1)?;
            if self.peek() != Some(b'"') {
                return Err(DecodeError::syntax(
                    self.pos,
                    "Expecting property name enclosed in double quotes",
                ));
            }
            let key = self.string()?;
            self.ws();
            if self.peek() != Some(b':') {
                return Err(DecodeError::syntax(self.pos, "Expecting ':' delimiter"));
            }
            self.pos += 1;
            self.ws();
            let v = self.value(depth)?;
            B::insert(&mut map, key, v);
            self.ws();
            match self.peek() {
                Some(b',') => {
                    self.pos += 1;
                    self.ws();
                }
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(B::map(map));
                }
                _ => return Err(DecodeError::syntax(self.pos, "Expecting ',' delimiter")),
            }
        }
    }

    /// An array whose `[` is at `pos`.
    fn array(&mut self, depth: usize) -> Result<B::Value, DecodeError> {
        self.too_deep(depth)?;
        self.pos += 1;
        let mut items = Vec::new();
        self.ws();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(B::array(items));
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
                    return Ok(B::array(items));
                }
                _ => return Err(DecodeError::syntax(self.pos, "Expecting ',' delimiter")),
            }
        }
    }

    fn is_digit(&self, at: usize) -> bool {
        self.s.get(at).is_some_and(u8::is_ascii_digit)
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?`, the longest match; no value starts
    /// here when there is not even an integer part.
    fn number(&mut self) -> Result<B::Value, DecodeError> {
        let start = self.pos;
        let mut i = start;
        if self.s.get(i) == Some(&b'-') {
            i += 1;
        }
        match self.s.get(i) {
            Some(b'0') => i += 1,
            Some(b'1'..=b'9') => {
                while self.is_digit(i) {
                    i += 1;
                }
            }
            _ => return Err(DecodeError::syntax(start, "Expecting value")),
        }
        let mut is_float = false;
        // A fraction needs at least one digit; otherwise the '.' is not part of the number.
        if self.s.get(i) == Some(&b'.') && self.is_digit(i + 1) {
            is_float = true;
            i += 1;
            while self.is_digit(i) {
                i += 1;
            }
        }
        if matches!(self.s.get(i), Some(b'e' | b'E')) {
            let mut j = i + 1;
            if matches!(self.s.get(j), Some(b'+' | b'-')) {
                j += 1;
            }
            if self.is_digit(j) {
                is_float = true;
                while self.is_digit(j) {
                    j += 1;
                }
                i = j;
            }
        }
        self.pos = i;
        self.charge(i - start)?;
        let lit = &self.text[start..i];
        Ok(if is_float { B::float(lit) } else { B::int(lit) })
    }

    fn hex4(&self, at: usize) -> Option<u32> {
        let digits = self.s.get(at..at + 4)?;
        let mut v = 0;
        for &b in digits {
            v = v * 16 + char::from(b).to_digit(16)?;
        }
        Some(v)
    }

    /// A string whose opening quote is at `pos`, with the positions CPython's scanner reports.
    fn string(&mut self) -> Result<String, DecodeError> {
        let begin = self.pos;
        self.pos += 1;
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
            let backslash = self.pos;
            match self.peek() {
                None => {
                    return Err(DecodeError::syntax(
                        begin,
                        "Unterminated string starting at",
                    ));
                }
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => {}
                Some(_) => {
                    return Err(DecodeError::syntax(
                        self.pos,
                        "Invalid control character at",
                    ));
                }
            }
            let esc = backslash + 1;
            let Some(&c) = self.s.get(esc) else {
                return Err(DecodeError::syntax(
                    begin,
                    "Unterminated string starting at",
                ));
            };
            self.pos = esc + 1;
            let simple = match c {
                b'"' => '"',
                b'\\' => '\\',
                b'/' => '/',
                b'b' => '\u{8}',
                b'f' => '\u{c}',
                b'n' => '\n',
                b'r' => '\r',
                b't' => '\t',
                b'u' => {
                    let ch = self.unicode_escape(esc)?;
                    out.push(ch);
                    continue;
                }
                _ => return Err(DecodeError::syntax(backslash, "Invalid \\escape")),
            };
            out.push(simple);
        }
    }

    /// The `\uXXXX` escape whose `u` is at `esc` (and a low surrogate escape right after a high
    /// one), leaving `pos` after it.
    fn unicode_escape(&mut self, esc: usize) -> Result<char, DecodeError> {
        let len = self.s.len();
        let hex = esc + 1;
        let mut end = hex + 4;
        // CPython wants at least one character after the four digits (the closing quote).
        let unit = if end >= len { None } else { self.hex4(hex) };
        let unit = unit.ok_or_else(|| DecodeError::syntax(esc, "Invalid \\uXXXX escape"))?;
        let mut ch = char::from_u32(unit);
        if (0xD800..0xDC00).contains(&unit)
            && end + 6 < len
            && self.s[end] == b'\\'
            && self.s[end + 1] == b'u'
        {
            let low = self
                .hex4(end + 2)
                .ok_or_else(|| DecodeError::syntax(end + 1, "Invalid \\uXXXX escape"))?;
            if (0xDC00..0xE000).contains(&low) {
                ch = char::from_u32(0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00));
                end += 6;
            }
            // Otherwise the high surrogate stands alone and the next escape is read on its own.
        }
        self.pos = end;
        match (ch, self.surrogates) {
            (Some(c), _) => Ok(c),
            (None, Surrogates::Replace) => Ok('\u{FFFD}'),
            (None, Surrogates::Reject) => {
                Err(DecodeError::syntax(esc, "Lone surrogate in \\u escape"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn dec(s: &str) -> PyJson {
        decode_str(s).unwrap()
    }

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
    fn file_errors_read_like_pythons() {
        assert_eq!(
            parse_lenient("{\n  \"a\": 1,\n  \"é\": x\n}")
                .unwrap_err()
                .to_string(),
            "Expecting value: line 3 column 8 (char 19)"
        );
        assert_eq!(
            parse_lenient("{\"a\": \"\\ud800\"}").unwrap_err().message,
            "Lone surrogate in \\u escape"
        );
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
        let deep = "[".repeat(MAX_DECODE_DEPTH + 5);
        assert_eq!(decode_str(&deep).unwrap_err().kind, ErrorKind::TooDeep);
        let mut b = Budget::new(10);
        let long = format!("\"{}\"", "x".repeat(100));
        assert_eq!(
            decode_prefix(&long, 0, &mut b).unwrap_err().kind,
            ErrorKind::BudgetExhausted
        );
        assert!(b.exhausted());
    }

    #[test]
    fn converts_to_serde_values() {
        let v = dec(r#"{"n": NaN, "i": 5, "f": 0.5, "big": 100000000000000000000}"#).to_value();
        assert_eq!(v["n"], Value::Null);
        assert_eq!(v["i"], 5);
        assert_eq!(v["f"], 0.5);
        assert_eq!(v["big"], 1e20);
    }

    /// Vectors computed with CPython 3.11 (whose scanner is 3.12's): `json.loads(s)` raises
    /// `JSONDecodeError` with these `pos` and `msg`.
    #[test]
    fn positions_and_messages_are_pythons() {
        let cases: &[(&str, Option<(usize, &str)>)] = &[
            ("", Some((0, "Expecting value"))),
            ("   ", Some((3, "Expecting value"))),
            ("x", Some((0, "Expecting value"))),
            (
                "{x",
                Some((1, "Expecting property name enclosed in double quotes")),
            ),
            (
                "{",
                Some((1, "Expecting property name enclosed in double quotes")),
            ),
            ("{\"a\" 1}", Some((5, "Expecting ':' delimiter"))),
            ("{\"a\":}", Some((5, "Expecting value"))),
            (
                "{\"a\":1,}",
                Some((7, "Expecting property name enclosed in double quotes")),
            ),
            ("{\"a\":1 \"b\":2}", Some((7, "Expecting ',' delimiter"))),
            ("[1,]", Some((3, "Expecting value"))),
            ("[1 2]", Some((3, "Expecting ',' delimiter"))),
            ("[", Some((1, "Expecting value"))),
            ("{\"a\": tru}", Some((6, "Expecting value"))),
            ("{\"content\": \"x\"} y", Some((17, "Extra data"))),
            ("01", Some((1, "Extra data"))),
            ("-", Some((0, "Expecting value"))),
            ("1.", Some((1, "Extra data"))),
            ("1e", Some((1, "Extra data"))),
            ("\"abc", Some((0, "Unterminated string starting at"))),
            (
                "{\"a\": \"x\ny\"}",
                Some((8, "Invalid control character at")),
            ),
            ("\"\\x\"", Some((1, "Invalid \\escape"))),
            ("\"\\u12\"", Some((2, "Invalid \\uXXXX escape"))),
            ("\"\\u12G4\"", Some((2, "Invalid \\uXXXX escape"))),
            ("\"\\ud800\\u12G4\"", Some((8, "Invalid \\uXXXX escape"))),
            ("\"\\", Some((0, "Unterminated string starting at"))),
            ("{\"é\": x}", Some((6, "Expecting value"))),
            (
                "{'a': 1}",
                Some((1, "Expecting property name enclosed in double quotes")),
            ),
            ("\u{feff}{}", Some((0, "Expecting value"))),
            ("\"\\u0041", Some((2, "Invalid \\uXXXX escape"))),
            ("[1,2,", Some((5, "Expecting value"))),
            ("{\"a\":\"\\ud800\\x\"}", Some((12, "Invalid \\escape"))),
            ("{\"a\"", Some((4, "Expecting ':' delimiter"))),
            ("[-", Some((1, "Expecting value"))),
            ("[1e+]", Some((2, "Expecting ',' delimiter"))),
            ("nul", Some((0, "Expecting value"))),
            ("\"a\\u00\"", Some((3, "Invalid \\uXXXX escape"))),
            ("[NaN, Infinity, -Infinity]", None),
            ("\"\\ud800\"", None),
            (
                "{\"a\": [1, 2.5e-3, true, false, null, \"\\u00e9\\n\"]}",
                None,
            ),
        ];
        for (text, want) in cases {
            let got = python_decode_error(text).map(|e| (e.offset, e.message));
            assert_eq!(got, want.map(|(p, m)| (p, m)), "{text:?}");
        }
    }

    #[test]
    fn deep_nesting_is_not_scanned() {
        assert_eq!(python_decode_error(&"[".repeat(5000)), None);
    }
}
