//! Text helpers with the reference's exact semantics: HTML escaping (`html.escape`), Python's
//! `json.dumps(indent=2, ensure_ascii=False)` layout for the prompt, `str.format`-style template
//! rendering, dedup keys (strip + casefold) and gate-label normalisation.

use deermem_core::py;
use serde_json::Value;

/// `html.escape(s, quote)`: `&`, `<`, `>` always; `"` and `'` too when `quote` is true.
pub(crate) fn html_escape(s: &str, quote: bool) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    push_html_escaped(s, quote, &mut out);
    out
}

fn html_entity(b: u8, quote: bool) -> Option<&'static str> {
    match b {
        b'&' => Some("&amp;"),
        b'<' => Some("&lt;"),
        b'>' => Some("&gt;"),
        b'"' if quote => Some("&quot;"),
        b'\'' if quote => Some("&#x27;"),
        _ => None,
    }
}

/// Appends `s` HTML-escaped, copying runs of ordinary text in one go.
fn push_html_escaped(s: &str, quote: bool, out: &mut String) {
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
}

/// The dedup key of a fact's content: stripped and casefolded; `None` when blank.
///
/// Inner whitespace is not normalised (`"a  b"` and `"a b"` are different keys), as in the
/// reference.
pub fn content_key(content: &str) -> Option<String> {
    let s = py::strip(content);
    if s.is_empty() {
        None
    } else if s.is_ascii() {
        // Python's `casefold` maps only `A`-`Z` within ASCII (to `a`-`z`), so the per-character
        // Unicode fold table is not needed for the common all-ASCII text.
        Some(s.to_ascii_lowercase())
    } else {
        Some(py::casefold(s))
    }
}

/// A gate label as the gates read it: the stripped, lower-cased string when non-empty.
pub(crate) fn normalize_label(s: &str) -> Option<String> {
    let t = py::lower(py::strip(s));
    if t.is_empty() { None } else { Some(t) }
}

/// Python's `{:.2f}` of a float (Rust's formatting rounds the same way).
pub(crate) fn fmt2(x: f64) -> String {
    format!("{x:.2}")
}

#[cfg(test)]
/// `json.dumps(value, indent=2, ensure_ascii=False)`: two-space indentation, `", "`-free line
/// layout, floats in Python `repr` form, non-ASCII text kept as is.
pub(crate) fn json_dumps_pretty(value: &Value) -> String {
    let mut out = String::new();
    write_json(value, 0, false, &mut out);
    out
}

#[cfg(test)]
/// [`json_dumps_pretty`] of the value with every string value (never a key) HTML-escaped with
/// `quote=True` first, without copying the value.
pub(crate) fn json_dumps_pretty_escaped(value: &Value) -> String {
    let mut out = String::new();
    write_json(value, 0, true, &mut out);
    out
}

fn write_json(v: &Value, level: usize, escape_values: bool, out: &mut String) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => {
            use std::fmt::Write as _;
            if let Some(i) = n.as_i64() {
                let _ = write!(out, "{i}");
            } else if let Some(u) = n.as_u64() {
                let _ = write!(out, "{u}");
            } else {
                let f = n.as_f64().unwrap_or(f64::NAN);
                out.push_str(&json_float(f));
            }
        }
        Value::String(s) => {
            if escape_values {
                write_escaped_json_string(s, out);
            } else {
                write_json_string(s, out);
            }
        }
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
                newline_indent(level + 1, out);
                write_json(item, level + 1, escape_values, out);
            }
            newline_indent(level, out);
            out.push(']');
        }
        Value::Object(map) => write_json_object(map, level, escape_values, out),
    }
}

/// One object of [`json_dumps_pretty_escaped`]'s layout, written from a borrowed map.
fn write_json_object(
    map: &serde_json::Map<String, Value>,
    level: usize,
    escape_values: bool,
    out: &mut String,
) {
    if map.is_empty() {
        out.push_str("{}");
        return;
    }
    out.push('{');
    for (i, (k, item)) in map.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        newline_indent(level + 1, out);
        write_json_string(k, out);
        out.push_str(": ");
        write_json(item, level + 1, escape_values, out);
    }
    newline_indent(level, out);
    out.push('}');
}

/// Writes a top-level object of [`json_dumps_pretty_escaped`]'s layout whose members are
/// given one by one (borrowed, so the caller need not build and clone a map first). `members`
/// must not be empty.
pub(crate) fn write_pretty_escaped_members(members: &[(&str, Member<'_>)], out: &mut String) {
    out.push('{');
    for (i, (k, m)) in members.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        newline_indent(1, out);
        write_json_string(k, out);
        out.push_str(": ");
        match m {
            Member::Value(v) => write_json(v, 1, true, out),
            Member::Map(map) => write_json_object(map, 1, true, out),
            Member::Maps(items) => {
                if items.is_empty() {
                    out.push_str("[]");
                } else {
                    out.push('[');
                    for (j, item) in items.iter().enumerate() {
                        if j > 0 {
                            out.push(',');
                        }
                        newline_indent(2, out);
                        write_json_object(item, 2, true, out);
                    }
                    newline_indent(1, out);
                    out.push(']');
                }
            }
        }
    }
    newline_indent(0, out);
    out.push('}');
}

/// A member of [`write_pretty_escaped_members`].
pub(crate) enum Member<'a> {
    /// Any value.
    Value(&'a Value),
    /// An object.
    Map(&'a serde_json::Map<String, Value>),
    /// An array of objects.
    Maps(&'a [serde_json::Map<String, Value>]),
}

fn json_float(f: f64) -> String {
    if f.is_nan() {
        "NaN".to_owned()
    } else if f.is_infinite() {
        if f > 0.0 { "Infinity" } else { "-Infinity" }.to_owned()
    } else {
        py::float_repr(f)
    }
}

fn newline_indent(level: usize, out: &mut String) {
    out.push('\n');
    for _ in 0..level {
        out.push_str("  ");
    }
}

fn write_json_string(s: &str, out: &mut String) {
    push_json_string(s, false, out);
}

/// `write_json_string(&html_escape(s, true))` in one pass: the entities `html.escape` produces
/// contain nothing JSON escapes, so each byte is either an entity, a JSON escape or copied.
fn write_escaped_json_string(s: &str, out: &mut String) {
    push_json_string(s, true, out);
}

/// A JSON string literal of `s`, HTML-escaped first (`quote=True`) when `html` is set.
fn push_json_string(s: &str, html: bool, out: &mut String) {
    out.reserve(s.len() + 2);
    out.push('"');
    let mut start = 0;
    for (i, b) in s.bytes().enumerate() {
        // Every escaped character is ASCII, so `i` is always a char boundary here.
        let entity = if html { html_entity(b, true) } else { None };
        let esc: Option<std::borrow::Cow<'static, str>> = match entity {
            Some(entity) => Some(entity.into()),
            None => match b {
                b'"' => Some("\\\"".into()),
                b'\\' => Some("\\\\".into()),
                b'\n' => Some("\\n".into()),
                b'\r' => Some("\\r".into()),
                b'\t' => Some("\\t".into()),
                0x08 => Some("\\b".into()),
                0x0c => Some("\\f".into()),
                b if b < 0x20 => Some(format!("\\u{b:04x}").into()),
                _ => None,
            },
        };
        if let Some(e) = esc {
            out.push_str(&s[start..i]);
            out.push_str(&e);
            start = i + 1;
        }
    }
    out.push_str(&s[start..]);
    out.push('"');
}

#[cfg(test)]
/// Recursively HTML-escapes every string value (never keys) with `quote=True`.
pub(crate) fn escape_json_strings(v: &Value) -> Value {
    match v {
        Value::String(s) => Value::String(html_escape(s, true)),
        Value::Array(items) => Value::Array(items.iter().map(escape_json_strings).collect()),
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, x)| (k.clone(), escape_json_strings(x)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Why a template could not be rendered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// `{name}` names a variable the template is not given.
    #[error("unknown placeholder {{{0}}}")]
    UnknownPlaceholder(String),
    /// A placeholder other than a plain `{name}` (conversions, format specs, indexing), or an
    /// unmatched brace.
    #[error("unsupported or malformed placeholder at byte {at}: {detail}")]
    Malformed {
        /// Byte offset in the template.
        at: usize,
        /// What is wrong.
        detail: String,
    },
}

/// Renders a template the way Python's `str.format(**vars)` does for plain placeholders:
/// `{name}` is replaced by the variable's value (values are not re-scanned), `{{` and `}}` are
/// literal braces. Anything else in braces is refused rather than guessed.
///
/// # Errors
/// A [`FormatError`] naming the placeholder.
pub(crate) fn format_template(
    template: &str,
    vars: &dyn Fn(&str) -> Option<String>,
) -> Result<String, FormatError> {
    let mut out = String::with_capacity(template.len());
    let mut chars = template.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '{' => {
                if let Some(&(_, '{')) = chars.peek() {
                    chars.next();
                    out.push('{');
                    continue;
                }
                let mut name = String::new();
                let mut closed = false;
                for (_, d) in chars.by_ref() {
                    if d == '}' {
                        closed = true;
                        break;
                    }
                    name.push(d);
                }
                if !closed {
                    return Err(FormatError::Malformed {
                        at: i,
                        detail: "unclosed '{'".into(),
                    });
                }
                let valid = !name.is_empty()
                    && name
                        .chars()
                        .next()
                        .is_some_and(|f| f.is_alphabetic() || f == '_')
                    && name.chars().all(|x| x.is_alphanumeric() || x == '_');
                if !valid {
                    return Err(FormatError::Malformed {
                        at: i,
                        detail: format!("placeholder {{{name}}} is not a plain variable name"),
                    });
                }
                match vars(&name) {
                    Some(v) => out.push_str(&v),
                    None => return Err(FormatError::UnknownPlaceholder(name)),
                }
            }
            '}' => {
                if let Some(&(_, '}')) = chars.peek() {
                    chars.next();
                    out.push('}');
                } else {
                    return Err(FormatError::Malformed {
                        at: i,
                        detail: "single '}' encountered".into(),
                    });
                }
            }
            other => out.push(other),
        }
    }
    Ok(out)
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
    fn content_keys_strip_and_casefold() {
        assert_eq!(content_key("  Straße \u{3000}"), Some("strasse".into()));
        assert_eq!(content_key(" \u{1c} "), None);
        assert_ne!(content_key("a  b"), content_key("a b"));
    }

    #[test]
    fn labels_are_stripped_and_lowered() {
        assert_eq!(normalize_label(" USER "), Some("user".into()));
        assert_eq!(normalize_label("  "), None);
    }

    #[test]
    fn pretty_json_matches_python_layout() {
        let v = json!({"a": [1, 0.9, 1e-5, null, true], "b": {}, "c": [], "d": "用户\n\"x\"\u{1}", "e": 1.0});
        assert_eq!(
            json_dumps_pretty(&v),
            "{\n  \"a\": [\n    1,\n    0.9,\n    1e-05,\n    null,\n    true\n  ],\n  \"b\": {},\n  \"c\": [],\n  \"d\": \"用户\\n\\\"x\\\"\\u0001\",\n  \"e\": 1.0\n}"
        );
    }

    #[test]
    fn escape_json_strings_touches_values_only() {
        let v = json!({"<k>": ["</current_memory>", 1]});
        assert_eq!(
            escape_json_strings(&v),
            json!({"<k>": ["&lt;/current_memory&gt;", 1]})
        );
    }

    #[test]
    fn format_template_follows_str_format() {
        let vars = |k: &str| (k == "x").then(|| "{y}".to_owned());
        assert_eq!(
            format_template("a {x} {{lit}} }}", &vars).unwrap(),
            "a {y} {lit} }"
        );
        assert_eq!(
            format_template("{missing}", &vars),
            Err(FormatError::UnknownPlaceholder("missing".into()))
        );
        for bad in ["{x!r}", "{x:>4}", "{0}", "{", "}", "{x.y}", "{}"] {
            assert!(format_template(bad, &vars).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn content_key_ascii_fast_path_matches_the_unicode_casefold() {
        for s in [
            "  User Prefers GO for new Services \n",
            "ABC xyz 0123 !@#[]{}~ \t",
            "MiXeD\tCase\u{7f}",
            "Straße",
            "ΣΊΣΥΦΟΣ",
            "Kelvin \u{212a} and long \u{17f}",
            "用户 likes Tea",
        ] {
            let stripped = py::strip(s);
            assert_eq!(content_key(s), Some(py::casefold(stripped)), "{s:?}");
        }
        assert_eq!(content_key(" \t\n"), None);
        assert_eq!(content_key("Straße").as_deref(), Some("strasse"));
    }

    proptest::proptest! {
        #[test]
        fn content_key_is_strip_then_casefold(s in "\\PC{0,40}") {
            let stripped = py::strip(&s);
            let expected = (!stripped.is_empty()).then(|| py::casefold(stripped));
            proptest::prop_assert_eq!(content_key(&s), expected);
        }

        #[test]
        fn one_pass_escaping_equals_html_escape_then_json(s in "\\PC{0,40}|[&<>\"'\\\\\\x00-\\x1f a-z]{0,40}") {
            let mut one = String::new();
            write_escaped_json_string(&s, &mut one);
            let mut two = String::new();
            write_json_string(&html_escape(&s, true), &mut two);
            proptest::prop_assert_eq!(one, two);
        }

        #[test]
        fn members_writer_equals_the_map_writer(
            a in "\\PC{0,12}", n in proptest::num::i64::ANY, f in proptest::num::f64::NORMAL,
            keys in proptest::collection::vec("[a-z<&]{1,6}", 0..4),
        ) {
            let inner: serde_json::Map<String, Value> =
                keys.iter().map(|k| (k.clone(), Value::String(format!("{a}{k}")))).collect();
            let facts = vec![inner.clone(), serde_json::Map::new(), inner.clone()];
            let whole = serde_json::json!({
                "version": a, "revision": n, "score": f, "user": inner, "facts": facts,
            });
            let mut out = String::new();
            write_pretty_escaped_members(
                &[
                    ("version", Member::Value(&whole["version"])),
                    ("revision", Member::Value(&whole["revision"])),
                    ("score", Member::Value(&whole["score"])),
                    ("user", Member::Map(&inner)),
                    ("facts", Member::Maps(&facts)),
                ],
                &mut out,
            );
            proptest::prop_assert_eq!(out, json_dumps_pretty_escaped(&whole));
        }

        #[test]
        fn ascii_content_key_is_strip_then_casefold(s in "[ -~\\t\\n\\r\\x0b\\x0c]{0,40}") {
            let stripped = py::strip(&s);
            let expected = (!stripped.is_empty()).then(|| py::casefold(stripped));
            proptest::prop_assert_eq!(content_key(&s), expected);
        }
    }
}
