//! Text helpers with the reference's exact semantics: `str.format`-style template rendering,
//! dedup keys (strip + casefold) and gate-label normalisation. HTML escaping and the prompt's
//! JSON layout are Python rules shared by every crate: `deermem_pycompat`.

use deermem_pycompat::py;

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
    use super::*;

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
        fn ascii_content_key_is_strip_then_casefold(s in "[ -~\\t\\n\\r\\x0b\\x0c]{0,40}") {
            let stripped = py::strip(&s);
            let expected = (!stripped.is_empty()).then(|| py::casefold(stripped));
            proptest::prop_assert_eq!(content_key(&s), expected);
        }
    }
}
