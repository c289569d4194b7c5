//! The one Python-style JSON writer: a `serde_json` [`Formatter`] producing exactly
//! `json.dumps(value, ensure_ascii=False, indent=2)` (two-space indent, `": "` between key and
//! value, `[]`/`{}` for empty collections, floats in Python `repr` form, raw UTF-8), optionally
//! with every string value (never a key) HTML-escaped first, as `html.escape(s, quote=True)`
//! does. Anything `Serialize` can be written, so callers serialise borrowed views instead of
//! building `Value` trees.

use std::io;

use serde::Serialize;
use serde_json::ser::{CharEscape, Formatter, PrettyFormatter};

use crate::py;

/// `json.dumps(ensure_ascii=False, indent=2)` as a `serde_json` formatter. `serde_json`'s own
/// string escaping is already Python's (`\"`, `\\`, `\n`, `\r`, `\t`, `\b`, `\f`, other control
/// characters as lowercase `\u00xx`, everything else verbatim); this formatter adds Python's
/// float `repr` and, when asked, the HTML escaping of string values.
#[derive(Debug)]
pub struct PyFormatter {
    pretty: PrettyFormatter<'static>,
    html: bool,
    in_key: bool,
}

impl PyFormatter {
    /// The plain `json.dumps(indent=2, ensure_ascii=False)` layout.
    pub fn new() -> Self {
        Self {
            pretty: PrettyFormatter::with_indent(b"  "),
            html: false,
            in_key: false,
        }
    }

    /// The same layout with every string value (never a key) passed through
    /// `html.escape(s, quote=True)` first: `&`, `<`, `>`, `"` and `'` become entities.
    pub fn html_escaped() -> Self {
        Self {
            html: true,
            ..Self::new()
        }
    }

    fn escaping(&self) -> bool {
        self.html && !self.in_key
    }
}

impl Default for PyFormatter {
    fn default() -> Self {
        Self::new()
    }
}

impl Formatter for PyFormatter {
    fn write_f64<W: ?Sized + io::Write>(&mut self, writer: &mut W, value: f64) -> io::Result<()> {
        // `serde_json` writes `null` for non-finite floats before reaching here.
        writer.write_all(py::float_repr(value).as_bytes())
    }

    fn write_f32<W: ?Sized + io::Write>(&mut self, writer: &mut W, value: f32) -> io::Result<()> {
        self.write_f64(writer, f64::from(value))
    }

    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        if !self.escaping() {
            return writer.write_all(fragment.as_bytes());
        }
        let bytes = fragment.as_bytes();
        let mut start = 0;
        for (i, &b) in bytes.iter().enumerate() {
            // Every escaped character is ASCII, so `i` is always a char boundary here.
            if let Some(entity) = py::html_entity(b, true) {
                writer.write_all(&bytes[start..i])?;
                writer.write_all(entity.as_bytes())?;
                start = i + 1;
            }
        }
        writer.write_all(&bytes[start..])
    }

    fn write_char_escape<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        char_escape: CharEscape,
    ) -> io::Result<()> {
        // `html.escape` turns `"` into `&quot;` before JSON sees it; the other JSON escapes
        // (backslash, control characters) are untouched by it.
        if self.escaping() && matches!(char_escape, CharEscape::Quote) {
            return writer.write_all(b"&quot;");
        }
        serde_json::ser::CompactFormatter.write_char_escape(writer, char_escape)
    }

    fn begin_array<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.pretty.begin_array(writer)
    }

    fn end_array<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.pretty.end_array(writer)
    }

    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.pretty.begin_array_value(writer, first)
    }

    fn end_array_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.pretty.end_array_value(writer)
    }

    fn begin_object<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.pretty.begin_object(writer)
    }

    fn end_object<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.pretty.end_object(writer)
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.in_key = true;
        self.pretty.begin_object_key(writer, first)
    }

    fn end_object_key<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.in_key = false;
        self.pretty.end_object_key(writer)
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.pretty.begin_object_value(writer)
    }

    fn end_object_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.pretty.end_object_value(writer)
    }
}

/// Why a value could not be written: its `Serialize` implementation failed (a map with
/// non-string keys, a custom error). `Value`s and plain derived structs never fail.
pub type WriteError = serde_json::Error;

fn write_with<T: ?Sized + Serialize>(value: &T, f: PyFormatter) -> Result<String, WriteError> {
    let mut out = Vec::with_capacity(256);
    let mut ser = serde_json::Serializer::with_formatter(&mut out, f);
    value.serialize(&mut ser)?;
    // The formatter only writes UTF-8 (the input strings and ASCII punctuation).
    String::from_utf8(out).map_err(|e| serde::ser::Error::custom(e.to_string()))
}

/// `json.dumps(value, ensure_ascii=False, indent=2)` of any serialisable value (no trailing
/// newline).
///
/// # Errors
/// Only when `value`'s `Serialize` implementation fails.
pub fn dumps<T: ?Sized + Serialize>(value: &T) -> Result<String, WriteError> {
    write_with(value, PyFormatter::new())
}

/// [`dumps`] of `value` with every string value (never a key) HTML-escaped first
/// (`html.escape(s, quote=True)`), without copying the value.
///
/// # Errors
/// Only when `value`'s `Serialize` implementation fails.
pub fn dumps_html_escaped<T: ?Sized + Serialize>(value: &T) -> Result<String, WriteError> {
    write_with(value, PyFormatter::html_escaped())
}

/// Renders a JSON value the way `json.dumps(value, ensure_ascii=False, indent=2)` does. A
/// `serde_json::Value` always serialises, so this cannot fail.
pub fn to_python_json(value: &serde_json::Value) -> String {
    // A `Value` has string keys and finite numbers only; serialising it cannot fail.
    dumps(value).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::json::parse_lenient;

    #[test]
    fn writer_matches_python_layout() {
        let v = json!({"version": "2.0", "revision": 2, "user": {"a": {"summary": "", "updatedAt": ""}},
                       "empty": {}, "list": [], "ids": ["x", "y"], "f": 1.0, "g": 1e-5, "h": 1e16, "c": 0.95});
        let s = to_python_json(&v);
        assert_eq!(
            s,
            "{\n  \"version\": \"2.0\",\n  \"revision\": 2,\n  \"user\": {\n    \"a\": {\n      \"summary\": \"\",\n      \"updatedAt\": \"\"\n    }\n  },\n  \"empty\": {},\n  \"list\": [],\n  \"ids\": [\n    \"x\",\n    \"y\"\n  ],\n  \"f\": 1.0,\n  \"g\": 1e-05,\n  \"h\": 1e+16,\n  \"c\": 0.95\n}"
        );
        let v = json!({"a": [1, 0.9, 1e-5, null, true], "b": {}, "c": [], "d": "用户\n\"x\"\u{1}", "e": 1.0});
        assert_eq!(
            to_python_json(&v),
            "{\n  \"a\": [\n    1,\n    0.9,\n    1e-05,\n    null,\n    true\n  ],\n  \"b\": {},\n  \"c\": [],\n  \"d\": \"用户\\n\\\"x\\\"\\u0001\",\n  \"e\": 1.0\n}"
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
    fn round_trip_is_stable() {
        let v =
            json!({"k": ["é", {"n": null, "t": true, "x": -0.5}], "big": 18446744073709551615u64});
        let s = to_python_json(&v);
        assert_eq!(parse_lenient(&s).unwrap(), v);
    }

    #[test]
    fn html_escaping_touches_string_values_only() {
        let v = json!({"<k>": ["</current_memory>", 1, "a\"b'c&\\"], "\"q\"": {"x": "<y>"}});
        assert_eq!(
            dumps_html_escaped(&v).unwrap(),
            "{\n  \"<k>\": [\n    \"&lt;/current_memory&gt;\",\n    1,\n    \"a&quot;b&#x27;c&amp;\\\\\"\n  ],\n  \"\\\"q\\\"\": {\n    \"x\": \"&lt;y&gt;\"\n  }\n}"
        );
    }

    /// Escaped strings are the plain writer's output of `html.escape(s, quote=True)`.
    fn escaped_by_hand(v: &Value) -> Value {
        match v {
            Value::String(s) => Value::String(py::html_escape(s, true)),
            Value::Array(items) => Value::Array(items.iter().map(escaped_by_hand).collect()),
            Value::Object(m) => Value::Object(
                m.iter()
                    .map(|(k, x)| (k.clone(), escaped_by_hand(x)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }

    proptest::proptest! {
        #[test]
        fn one_pass_escaping_equals_html_escape_then_json(
            s in "\\PC{0,40}|[&<>\"'\\\\\\x00-\\x1f a-z]{0,40}",
            k in "[a-z<&\"]{1,6}",
        ) {
            let v = json!({k: [s.clone(), {"in": s}]});
            proptest::prop_assert_eq!(dumps_html_escaped(&v).unwrap(), to_python_json(&escaped_by_hand(&v)));
        }

        #[test]
        fn python_floats_round_trip(f in proptest::num::f64::NORMAL | proptest::num::f64::SUBNORMAL | proptest::num::f64::ZERO) {
            let s = to_python_json(&json!([f]));
            let back = parse_lenient(&s).unwrap();
            proptest::prop_assert_eq!(back[0].as_f64(), Some(f));
            proptest::prop_assert!(s.contains(&py::float_repr(f)));
        }
    }
}
