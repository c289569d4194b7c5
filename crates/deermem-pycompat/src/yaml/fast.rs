//! Fast path of the front-matter reader for the block layout PyYAML's `safe_dump` and our writer
//! produce, declining (`None`) anything it does not fully understand so the full reader decides.
//!
//! Accepted, line by line (lines end at `\n`; no blank lines, comments, tabs or `\r`):
//!
//! * `key: scalar` and `key:` at column 0, where `key` is `[A-Za-z0-9_]+` and resolves to a
//!   string;
//! * under `key:`, either nothing (null), a block sequence of `- scalar` items (all at one
//!   indentation, column 0 included), or one nested mapping level of `key: scalar` / `key:` lines
//!   (all at one indentation greater than 0);
//! * scalars on one line: plain (typed by the same resolver and constructors as the full reader),
//!   single-quoted, double-quoted with yaml-rust2's escapes, and the empty `[]` / `{}`.
//!
//! Everything else — multi-line scalars, block scalars, other flow collections, anchors, aliases,
//! tags, directives, document markers, duplicate keys, values the constructors refuse, characters
//! the reader refuses or treats as line breaks — returns `None`. The contract, checked by
//! property tests against the full reader: whenever this returns `Some`, the full reader returns
//! `Ok` with exactly the same [`FrontMatter`].

use serde_json::{Map, Value};

use super::FrontMatter;
use super::read::{Special, plain_scalar};
use super::resolve::{Implicit, resolve_plain};

/// Longest key accepted (yaml-rust2 and PyYAML limit simple keys to 1024 characters).
const MAX_KEY: usize = 256;

/// Parses `text` when it has the plain block layout described in the module documentation.
pub(crate) fn parse(text: &str) -> Option<FrontMatter> {
    if text.is_empty() || !chars_ok(text) {
        return None;
    }
    let mut p = Parser {
        lines: text.split('\n').peekable(),
        fm: FrontMatter::default(),
        path: String::new(),
    };
    let mut map = Map::with_capacity(16);
    while let Some(line) = p.lines.next() {
        let (key, rest) = split_key(line)?;
        p.path.clear();
        p.path.push_str(key);
        let value = if rest.is_empty() {
            p.under_top_level_key()?
        } else {
            p.leaf(rest.strip_prefix(' ')?)?
        };
        if map.insert(key.to_owned(), value).is_some() {
            // A repeated key (the full reader keeps the first position and the last value).
            return None;
        }
    }
    p.fm.map = map;
    Some(p.fm)
}

/// Whether every character is one the fast path handles exactly like the full reader: what
/// the reader accepts, minus tabs, carriage returns and the characters either side may treat
/// as line breaks or byte-order marks.
fn chars_ok(text: &str) -> bool {
    if text.is_ascii() {
        return text
            .bytes()
            .all(|b| b == b'\n' || (0x20..=0x7E).contains(&b));
    }
    text.chars().all(|c| match c {
        '\n' | '\u{20}'..='\u{7E}' => true,
        '\u{85}' | '\u{2028}' | '\u{2029}' | '\u{FEFF}' => false,
        '\u{A0}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..='\u{10FFFF}' => true,
        _ => false,
    })
}

/// Number of leading spaces.
fn indent_of(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

/// Splits `key:rest` where `key` is a simple word that resolves to a string.
fn split_key(line: &str) -> Option<(&str, &str)> {
    // One pass: every byte before the first colon must be a word character.
    let colon = line
        .bytes()
        .position(|b| !(b.is_ascii_alphanumeric() || b == b'_'))
        .filter(|&i| line.as_bytes()[i] == b':')?;
    let key = &line[..colon];
    if key.is_empty() || key.len() > MAX_KEY || resolve_plain(key) != Implicit::Str {
        return None;
    }
    Some((key, &line[colon + 1..]))
}

struct Parser<'a> {
    lines: std::iter::Peekable<std::str::Split<'a, char>>,
    fm: FrontMatter,
    /// Dotted path of the value being read.
    path: String,
}

impl Parser<'_> {
    /// The value of a top-level `key:` with nothing after the colon.
    fn under_top_level_key(&mut self) -> Option<Value> {
        let Some(next) = self.lines.peek() else {
            return Some(Value::Null);
        };
        let indent = indent_of(next);
        let body = &next[indent..];
        if body.starts_with('-') {
            return if body.starts_with("- ") {
                self.sequence(indent)
            } else {
                None
            };
        }
        if indent == 0 {
            // The next top-level key (checked when it is read).
            return Some(Value::Null);
        }
        self.nested_mapping(indent)
    }

    /// A block sequence whose `- ` items sit at `indent`; the following line must be a
    /// top-level key.
    fn sequence(&mut self, indent: usize) -> Option<Value> {
        let mut items = Vec::new();
        let base = self.path.len();
        while let Some(next) = self.lines.peek() {
            if indent_of(next) != indent {
                if indent_of(next) == 0 {
                    break;
                }
                return None;
            }
            let Some(item) = next[indent..].strip_prefix("- ") else {
                if indent == 0 {
                    break;
                }
                return None;
            };
            self.lines.next();
            self.path.truncate(base);
            self.path.push('.');
            self.path.push_str(&items.len().to_string());
            items.push(self.leaf(item)?);
        }
        self.path.truncate(base);
        Some(Value::Array(items))
    }

    /// One nested mapping whose keys sit at `indent` (> 0) and hold scalars.
    fn nested_mapping(&mut self, indent: usize) -> Option<Value> {
        let mut map = Map::new();
        let base = self.path.len();
        while let Some(next) = self.lines.peek() {
            let here = indent_of(next);
            if here == 0 {
                break;
            }
            if here != indent {
                return None;
            }
            let line = &next[indent..];
            self.lines.next();
            let (key, rest) = split_key(line)?;
            self.path.truncate(base);
            self.path.push('.');
            self.path.push_str(key);
            let value = if rest.is_empty() {
                // Null unless something nests under it (a deeper line, or a sequence at the
                // same indentation).
                match self.lines.peek() {
                    None => Value::Null,
                    Some(after) => {
                        let i = indent_of(after);
                        if i > indent || after[i..].starts_with('-') {
                            return None;
                        }
                        Value::Null
                    }
                }
            } else {
                self.leaf(rest.strip_prefix(' ')?)?
            };
            if map.insert(key.to_owned(), value).is_some() {
                return None;
            }
        }
        self.path.truncate(base);
        if map.is_empty() {
            return None;
        }
        Some(Value::Object(map))
    }

    /// A scalar (or empty flow collection) that fills the rest of its line.
    fn leaf(&mut self, text: &str) -> Option<Value> {
        let (value, special) = match text.as_bytes().first()? {
            b'\'' => (Value::String(single_quoted(text)?), Special::None),
            b'"' => (Value::String(double_quoted(text)?), Special::None),
            b'[' if text == "[]" => (Value::Array(Vec::new()), Special::None),
            b'{' if text == "{}" => (Value::Object(Map::new()), Special::None),
            _ => {
                if !is_simple_plain(text) {
                    return None;
                }
                plain_scalar(text.to_owned(), false).ok()?
            }
        };
        match special {
            Special::None => {}
            Special::Timestamp => self.fm.unquoted_timestamps.push(self.path.clone()),
            Special::NonFinite => self.fm.non_finite_floats.push(self.path.clone()),
        }
        Some(value)
    }
}

/// Whether `text` is, on its own line after `key: ` or `- `, one whole plain scalar in block
/// context: no indicator at the start, no `: ` / ` #` inside, no trailing space or colon.
fn is_simple_plain(text: &str) -> bool {
    let bytes = text.as_bytes();
    let Some(&first) = bytes.first() else {
        return false;
    };
    match first {
        b'[' | b']' | b'{' | b'}' | b',' | b'#' | b'&' | b'*' | b'!' | b'|' | b'>' | b'\''
        | b'"' | b'%' | b'@' | b'`' | b' ' => return false,
        b'-' | b'?' | b':' if bytes.get(1).is_none_or(|&b| b == b' ') => return false,
        _ => {}
    }
    if text.ends_with(' ') || text.ends_with(':') {
        return false;
    }
    // Neither `: ` nor ` #` inside (a byte scan: both are ASCII pairs).
    !bytes
        .windows(2)
        .any(|w| (w[0] == b':' && w[1] == b' ') || (w[0] == b' ' && w[1] == b'#'))
}

/// The value of a one-line single-quoted scalar (`''` is a quote).
fn single_quoted(text: &str) -> Option<String> {
    let inner = text.strip_prefix('\'')?.strip_suffix('\'')?;
    if !inner.contains('\'') {
        return Some(inner.to_owned());
    }
    let mut out = String::with_capacity(inner.len());
    let mut rest = inner;
    while let Some(at) = rest.find('\'') {
        out.push_str(&rest[..at]);
        if rest.as_bytes().get(at + 1) != Some(&b'\'') {
            return None;
        }
        out.push('\'');
        rest = &rest[at + 2..];
    }
    out.push_str(rest);
    Some(out)
}

/// The value of a one-line double-quoted scalar with yaml-rust2's escapes.
fn double_quoted(text: &str) -> Option<String> {
    let body = text.strip_prefix('"')?;
    let mut out = String::with_capacity(body.len());
    let mut chars = body.char_indices();
    while let Some((at, c)) = chars.next() {
        match c {
            '"' => {
                // The closing quote must end the line.
                return (at + 1 == body.len()).then_some(out);
            }
            '\\' => {
                let (_, e) = chars.next()?;
                let width = match e {
                    'x' => 2,
                    'u' => 4,
                    'U' => 8,
                    _ => {
                        out.push(simple_escape(e)?);
                        continue;
                    }
                };
                let mut code = 0_u32;
                for _ in 0..width {
                    let (_, h) = chars.next()?;
                    code = (code << 4) | h.to_digit(16)?;
                }
                out.push(char::from_u32(code)?);
            }
            c => out.push(c),
        }
    }
    // No closing quote on this line.
    None
}

/// yaml-rust2's one-character escapes (`\x`, `\u`, `\U` are handled by the caller).
fn simple_escape(e: char) -> Option<char> {
    Some(match e {
        '0' => '\0',
        'a' => '\x07',
        'b' => '\x08',
        't' => '\t',
        'n' => '\n',
        'v' => '\x0b',
        'f' => '\x0c',
        'r' => '\r',
        'e' => '\x1b',
        ' ' => ' ',
        '"' => '"',
        '/' => '/',
        '\\' => '\\',
        'N' => '\u{85}',
        '_' => '\u{A0}',
        'L' => '\u{2028}',
        'P' => '\u{2029}',
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full(text: &str) -> FrontMatter {
        super::super::read::parse(text).expect("full parser accepts")
    }

    #[test]
    fn typical_fact_front_matter_takes_the_fast_path() {
        let text = "category: context\nconfidence: 0.946\ntopics:\n- \"tab\\there\"\n- '0123'\n- 中文\n- 1e-5\nsource:\n  type: import\n  threadId: null\nid: fact_6aa8b9e0231b3e14\ncreatedAt: '2026-04-02T10:00:00Z'\nschemaVersion: 2\nstatus: active\nconsolidatedFrom: []\nrevision: 1\nuser_id: carol\nagent_name: __default__";
        let fast = parse(text).expect("fast path accepts");
        assert_eq!(fast, full(text));
        assert_eq!(fast.map["topics"][3], Value::String("1e-5".into()));
        assert_eq!(fast.map["confidence"], serde_json::json!(0.946));
    }

    #[test]
    fn yaml_1_1_types_match_the_full_reader() {
        for v in [
            "yes",
            "on",
            "Off",
            "~",
            "null",
            "0123",
            "0x1F",
            "1_000",
            "-0b101",
            "1:30",
            "1.5",
            "1.0e+5",
            "1.0e5",
            ".inf",
            "-.inf",
            ".nan",
            "2026-01-01",
            "2026-01-01T00:00:00Z",
            "abc def",
            "a#b",
            "-5",
            "?x",
            "é",
        ] {
            let text = format!("k: {v}\nseq:\n- {v}\nm:\n  n: {v}").replace(": \n", ":\n");
            let fast = parse(&text).unwrap_or_else(|| panic!("declined {text:?}"));
            assert_eq!(fast, full(&text), "{text:?}");
        }
    }

    #[test]
    fn anything_unusual_is_declined() {
        for text in [
            "k: &a x",
            "k: *a",
            "k: !!str 1",
            "k: |\n  x",
            "k: [a]",
            "k: 'a\n  b'",
            "k: a\n  b",
            "k: a # c",
            "k: a: b",
            "k: x\nk: y",
            "k:\n  a:\n    b: c",
            "k:\n  a:\n  - x",
            "# c\nk: v",
            "k: v\n",
            "k:  v",
            "k: \"\\q\"",
            "k: \"\\ud800\"",
            "k: 9223372036854775808000",
            "k: 2026-13-45",
            "k: <<",
            "k: \"a\" b",
            "k: 'a' b",
            "yes: 1",
            "k: a\tb",
            "k: a\u{2028}b",
            "---\nk: v",
        ] {
            assert_eq!(parse(text), None, "{text:?}");
        }
    }

    #[test]
    fn quoted_scalars_decode_like_the_full_reader() {
        for v in [
            "''",
            "'it''s'",
            "''''",
            "'a ''b'' c'",
            "\"\"",
            "\"\\x41\\u00e9\\U0001F98C\\N\\_\\L\\P\\/\\ \\\"\\\\\"",
            "\"\\0\\a\\b\\t\\n\\v\\f\\r\\e\"",
            "\"a  b\"",
        ] {
            let text = format!("k: {v}");
            let fast = parse(&text).unwrap_or_else(|| panic!("declined {text:?}"));
            assert_eq!(fast, full(&text), "{text:?}");
        }
    }

    #[test]
    fn special_values_are_reported_by_path() {
        let text = "a: 2026-01-01\nb:\n- x\n- .nan\nc:\n  d: 2026-01-01 10:00:00";
        let fast = parse(text).expect("fast path accepts");
        assert_eq!(fast.unquoted_timestamps, vec!["a", "c.d"]);
        assert_eq!(fast.non_finite_floats, vec!["b.1"]);
        assert_eq!(fast, full(text));
    }
}
