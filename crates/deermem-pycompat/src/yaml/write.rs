//! Front-matter writer: block-style YAML laid out the way PyYAML's `safe_dump` lays it out.
//!
//! The layout rules (indentation, indentless sequences under keys, scalar style choice, folding
//! at column 80) follow the observable output of `yaml.safe_dump(data, allow_unicode=True,
//! sort_keys=False)`, so files we rewrite stay byte-identical to what the reference writes.

use serde_json::{Map, Value};

use super::resolve::{Implicit, resolve_plain};
use super::{MAX_DEPTH, YamlError};

/// PyYAML's preferred line width.
const BEST_WIDTH: usize = 80;
/// PyYAML's indentation step.
const BEST_INDENT: usize = 2;

/// Renders a mapping; see [`super::render_mapping`].
pub(crate) fn render(map: &Map<String, Value>) -> Result<String, YamlError> {
    let mut e = Emitter::default();
    if map.is_empty() {
        e.flow_empty('{', '}');
    } else {
        e.block_mapping(map, 0)?;
    }
    // `safe_dump` ends with a line break; the caller strips it (only the line break: other
    // trailing characters are data).
    while e.out.ends_with('\n') {
        e.out.pop();
    }
    Ok(e.out)
}

/// How a string may be written, from PyYAML's scalar analysis.
#[derive(Debug, Clone, Copy)]
struct Analysis {
    empty: bool,
    multiline: bool,
    allow_block_plain: bool,
    allow_single_quoted: bool,
}

fn is_break(c: char) -> bool {
    matches!(c, '\n' | '\u{85}' | '\u{2028}' | '\u{2029}')
}

fn is_blank_or_end(c: Option<char>) -> bool {
    matches!(
        c,
        None | Some('\0' | ' ' | '\t' | '\r' | '\n' | '\u{85}' | '\u{2028}' | '\u{2029}')
    )
}

/// Printable in PyYAML's sense with `allow_unicode=True` (anything else forces double quotes).
fn is_printable_unicode(c: char) -> bool {
    c == '\n'
        || ('\u{20}'..='\u{7E}').contains(&c)
        || (c == '\u{85}'
            || ('\u{A0}'..='\u{D7FF}').contains(&c)
            || ('\u{E000}'..='\u{FFFD}').contains(&c)
            || ('\u{10000}'..'\u{10FFFF}').contains(&c))
            && c != '\u{FEFF}'
}

fn analyze(text: &[char]) -> Analysis {
    if text.is_empty() {
        return Analysis {
            empty: true,
            multiline: false,
            allow_block_plain: true,
            allow_single_quoted: true,
        };
    }
    // Only block-context plain scalars are ever written (flow collections are always empty),
    // so PyYAML's flow-indicator tracking is not needed.
    let mut block_indicators = false;
    let mut line_breaks = false;
    let mut special = false;
    let (mut leading_space, mut leading_break) = (false, false);
    let (mut trailing_space, mut trailing_break) = (false, false);
    let (mut break_space, mut space_break) = (false, false);
    let (mut previous_space, mut previous_break) = (false, false);

    let starts_with = |p: &str| text.len() >= 3 && p.chars().zip(text.iter()).all(|(a, &b)| a == b);
    if starts_with("---") || starts_with("...") {
        block_indicators = true;
    }
    let mut preceded_by_ws = true;
    let mut followed_by_ws = is_blank_or_end(text.get(1).copied());
    let last = text.len() - 1;
    for (index, &ch) in text.iter().enumerate() {
        if index == 0 {
            if "#,[]{}&*!|>'\"%@`".contains(ch)
                || ((ch == '?' || ch == ':' || ch == '-') && followed_by_ws)
            {
                block_indicators = true;
            }
        } else if (ch == ':' && followed_by_ws) || (ch == '#' && preceded_by_ws) {
            block_indicators = true;
        }
        if is_break(ch) {
            line_breaks = true;
            // Divergence from PyYAML: NEL, LS and PS are written escaped in double quotes, never
            // raw (PyYAML writes them raw in single quotes, and reads a leading NEL back as a space).
            if ch != '\n' {
                special = true;
            }
        }
        if !is_printable_unicode(ch) {
            special = true;
        }
        let (space, brk) = (ch == ' ', is_break(ch));
        if space {
            leading_space |= index == 0;
            trailing_space |= index == last;
            break_space |= previous_break;
        } else if brk {
            leading_break |= index == 0;
            trailing_break |= index == last;
            space_break |= previous_space;
        }
        (previous_space, previous_break) = (space, brk);
        preceded_by_ws = is_blank_or_end(Some(ch));
        followed_by_ws = index + 1 >= last || is_blank_or_end(text.get(index + 2).copied());
    }
    Analysis {
        empty: false,
        multiline: line_breaks,
        allow_block_plain: !(leading_space
            || leading_break
            || trailing_space
            || trailing_break
            || break_space
            || space_break
            || special
            || line_breaks
            || block_indicators),
        allow_single_quoted: !(break_space || space_break || special),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Style {
    Plain,
    Single,
    Double,
}

#[derive(Debug)]
struct Emitter {
    out: String,
    column: usize,
    whitespace: bool,
    indention: bool,
    indent: Option<usize>,
    indents: Vec<Option<usize>>,
}

impl Default for Emitter {
    fn default() -> Self {
        Self {
            out: String::new(),
            column: 0,
            whitespace: true,
            indention: true,
            indent: None,
            indents: Vec::new(),
        }
    }
}

impl Emitter {
    fn increase_indent(&mut self, flow: bool, indentless: bool) {
        self.indents.push(self.indent);
        self.indent = match self.indent {
            None => Some(if flow { BEST_INDENT } else { 0 }),
            Some(i) if !indentless => Some(i + BEST_INDENT),
            Some(i) => Some(i),
        };
    }

    fn pop_indent(&mut self) {
        self.indent = self.indents.pop().flatten();
    }

    fn write(&mut self, s: &str, columns: usize) {
        self.out.push_str(s);
        self.column += columns;
    }

    fn write_line_break(&mut self, brk: Option<char>) {
        self.out.push(brk.unwrap_or('\n'));
        self.whitespace = true;
        self.indention = true;
        self.column = 0;
    }

    fn write_indent(&mut self) {
        let indent = self.indent.unwrap_or(0);
        if !self.indention || self.column > indent || (self.column == indent && !self.whitespace) {
            self.write_line_break(None);
        }
        if self.column < indent {
            self.whitespace = true;
            for _ in self.column..indent {
                self.out.push(' ');
            }
            self.column = indent;
        }
    }

    fn write_indicator(
        &mut self,
        indicator: &str,
        need_ws: bool,
        whitespace: bool,
        indention: bool,
    ) {
        if !self.whitespace && need_ws {
            self.write(" ", 1);
        }
        self.write(indicator, indicator.chars().count());
        self.whitespace = whitespace;
        self.indention = self.indention && indention;
    }

    fn flow_empty(&mut self, open: char, close: char) {
        let mut buf = [0_u8; 4];
        self.write_indicator(open.encode_utf8(&mut buf), true, true, false);
        self.write_indicator(close.encode_utf8(&mut buf), false, false, false);
    }

    /// `expect_node` for a value; `mapping` is PyYAML's mapping context (indentless sequences).
    fn node(
        &mut self,
        v: &Value,
        mapping: bool,
        simple_key: bool,
        depth: usize,
    ) -> Result<(), YamlError> {
        if depth > MAX_DEPTH {
            return Err(YamlError::new(
                format!("value nests deeper than {MAX_DEPTH} levels"),
                None,
            ));
        }
        match v {
            Value::Array(items) if items.is_empty() => self.flow_empty('[', ']'),
            Value::Object(map) if map.is_empty() => self.flow_empty('{', '}'),
            Value::Array(items) => {
                let indentless = mapping && !self.indention;
                self.increase_indent(false, indentless);
                for item in items {
                    self.write_indent();
                    self.write_indicator("-", true, false, true);
                    self.node(item, false, false, depth + 1)?;
                }
                self.pop_indent();
            }
            Value::Object(map) => self.block_mapping(map, depth + 1)?,
            Value::Null => self.scalar("null", true, simple_key),
            Value::Bool(b) => self.scalar(if *b { "true" } else { "false" }, true, simple_key),
            Value::Number(n) => {
                let text = if let Some(i) = n.as_i64() {
                    i.to_string()
                } else if let Some(u) = n.as_u64() {
                    u.to_string()
                } else {
                    float_text(n.as_f64().unwrap_or(f64::NAN))
                };
                self.scalar(&text, true, simple_key);
            }
            Value::String(s) => self.scalar(s, resolve_plain(s) == Implicit::Str, simple_key),
        }
        Ok(())
    }

    fn block_mapping(&mut self, map: &Map<String, Value>, depth: usize) -> Result<(), YamlError> {
        self.increase_indent(false, false);
        for (k, v) in map {
            self.write_indent();
            if simple_key_ok(k) {
                self.node(&Value::String(k.clone()), true, true, depth)?;
                self.write_indicator(":", false, false, false);
            } else {
                self.write_indicator("?", true, false, true);
                self.node(&Value::String(k.clone()), true, false, depth)?;
                self.write_indent();
                self.write_indicator(":", true, false, true);
            }
            self.node(v, true, false, depth)?;
        }
        self.pop_indent();
        Ok(())
    }

    /// `expect_scalar` + `process_scalar`: `implicit_plain` says the resolver reads the text back
    /// as the intended type when written plain.
    fn scalar(&mut self, text: &str, implicit_plain: bool, simple_key: bool) {
        self.increase_indent(true, false);
        let chars: Vec<char> = text.chars().collect();
        let a = analyze(&chars);
        // Scalars are only ever written in block context (flow collections are always empty).
        let plain_ok = a.allow_block_plain;
        let style = if implicit_plain && !(simple_key && (a.empty || a.multiline)) && plain_ok {
            Style::Plain
        } else if a.allow_single_quoted && !(simple_key && a.multiline) {
            Style::Single
        } else {
            Style::Double
        };
        let split = !simple_key;
        match style {
            Style::Plain => self.write_plain(&chars, split),
            Style::Single => self.write_single_quoted(&chars, split),
            Style::Double => self.write_double_quoted(&chars, split),
        }
        self.pop_indent();
    }

    fn write_chars(&mut self, chars: &[char]) {
        self.out.extend(chars.iter());
        self.column += chars.len();
    }

    fn write_plain(&mut self, text: &[char], split: bool) {
        if text.is_empty() {
            return;
        }
        if !self.whitespace {
            self.write(" ", 1);
        }
        self.whitespace = false;
        self.indention = false;
        let mut spaces = false;
        let mut start = 0;
        for end in 0..=text.len() {
            let ch = text.get(end).copied();
            if spaces {
                if ch != Some(' ') {
                    if start + 1 == end && self.column > BEST_WIDTH && split {
                        self.write_indent();
                        self.whitespace = false;
                        self.indention = false;
                    } else {
                        self.write_chars(&text[start..end]);
                    }
                    start = end;
                }
            } else if ch.is_none_or(|c| c == ' ' || is_break(c)) {
                self.write_chars(&text[start..end]);
                start = end;
            }
            if let Some(c) = ch {
                spaces = c == ' ';
            }
        }
    }

    fn write_single_quoted(&mut self, text: &[char], split: bool) {
        self.write_indicator("'", true, false, false);
        let mut spaces = false;
        let mut breaks = false;
        let mut start = 0;
        for end in 0..=text.len() {
            let ch = text.get(end).copied();
            if spaces {
                if ch != Some(' ') {
                    if start + 1 == end
                        && self.column > BEST_WIDTH
                        && split
                        && start != 0
                        && end != text.len()
                    {
                        self.write_indent();
                    } else {
                        self.write_chars(&text[start..end]);
                    }
                    start = end;
                }
            } else if breaks {
                if ch.is_none_or(|c| !is_break(c)) {
                    if text[start] == '\n' {
                        self.write_line_break(None);
                    }
                    for &br in &text[start..end] {
                        if br == '\n' {
                            self.write_line_break(None);
                        } else {
                            self.write_line_break(Some(br));
                        }
                    }
                    self.write_indent();
                    start = end;
                }
            } else if ch.is_none_or(|c| c == ' ' || is_break(c) || c == '\'') && start < end {
                self.write_chars(&text[start..end]);
                start = end;
            }
            if ch == Some('\'') {
                self.write("''", 2);
                start = end + 1;
            }
            if let Some(c) = ch {
                spaces = c == ' ';
                breaks = is_break(c);
            }
        }
        self.write_indicator("'", false, false, false);
    }

    fn write_double_quoted(&mut self, text: &[char], split: bool) {
        self.write_indicator("\"", true, false, false);
        let len = text.len();
        let mut start = 0_usize;
        let mut end = 0_usize;
        while end <= len {
            let ch = text.get(end).copied();
            let needs_escape = match ch {
                None => true,
                Some(c) => {
                    matches!(
                        c,
                        '"' | '\\' | '\u{85}' | '\u{2028}' | '\u{2029}' | '\u{FEFF}'
                    ) || !(('\u{20}'..='\u{7E}').contains(&c)
                        || ('\u{A0}'..='\u{D7FF}').contains(&c)
                        || ('\u{E000}'..='\u{FFFD}').contains(&c))
                }
            };
            if needs_escape {
                if start < end {
                    self.write_chars(&text[start..end]);
                    start = end;
                }
                if let Some(c) = ch {
                    let data = escape(c);
                    self.write(&data, data.len());
                    start = end + 1;
                }
            }
            if 0 < end
                && end + 1 < len
                && (ch == Some(' ') || start >= end)
                && self.column as isize + (end as isize - start as isize) > BEST_WIDTH as isize
                && split
            {
                if start < end {
                    self.write_chars(&text[start..end]);
                    start = end;
                }
                self.write("\\", 1);
                self.write_indent();
                self.whitespace = false;
                self.indention = false;
                if text.get(start) == Some(&' ') {
                    self.write("\\", 1);
                }
            }
            end += 1;
        }
        self.write_indicator("\"", false, false, false);
    }
}

/// PyYAML's double-quoted escape for one character.
fn escape(c: char) -> String {
    let short = match c {
        '\0' => Some('0'),
        '\u{07}' => Some('a'),
        '\u{08}' => Some('b'),
        '\t' => Some('t'),
        '\n' => Some('n'),
        '\u{0B}' => Some('v'),
        '\u{0C}' => Some('f'),
        '\r' => Some('r'),
        '\u{1B}' => Some('e'),
        '"' => Some('"'),
        '\\' => Some('\\'),
        '\u{85}' => Some('N'),
        '\u{A0}' => Some('_'),
        '\u{2028}' => Some('L'),
        '\u{2029}' => Some('P'),
        _ => None,
    };
    let code = u32::from(c);
    match short {
        Some(s) => format!("\\{s}"),
        None if code <= 0xFF => format!("\\x{code:02X}"),
        None if code <= 0xFFFF => format!("\\u{code:04X}"),
        None => format!("\\U{code:08X}"),
    }
}

/// PyYAML's `check_simple_key` for a string key: shorter than 128 with its `!!str` tag, one line.
fn simple_key_ok(key: &str) -> bool {
    let len = key.chars().count();
    len + "!!str".len() < 128 && len > 0 && !key.chars().any(is_break)
}

/// PyYAML's `represent_float`: Python `repr`, lower-cased, with `.0` added before a bare exponent.
pub(crate) fn float_text(f: f64) -> String {
    if f.is_nan() {
        return ".nan".to_owned();
    }
    if f.is_infinite() {
        return if f > 0.0 { ".inf" } else { "-.inf" }.to_owned();
    }
    let repr = crate::py::float_repr(f).to_lowercase();
    if !repr.contains('.') && repr.contains('e') {
        repr.replacen('e', ".0e", 1)
    } else {
        repr
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_are_written_like_represent_float() {
        for (f, want) in [
            (0.95, "0.95"),
            (1.0, "1.0"),
            (-0.0, "-0.0"),
            (1e-5, "1.0e-05"),
            (1e16, "1.0e+16"),
            (1.5e20, "1.5e+20"),
            (f64::NAN, ".nan"),
            (f64::INFINITY, ".inf"),
            (f64::NEG_INFINITY, "-.inf"),
        ] {
            assert_eq!(float_text(f), want, "{f}");
        }
    }

    #[test]
    fn simple_keys_stop_at_123_characters_and_line_breaks() {
        assert!(simple_key_ok(&"k".repeat(122)));
        assert!(!simple_key_ok(&"k".repeat(123)));
        assert!(!simple_key_ok(""));
        assert!(!simple_key_ok("a\nb"));
        assert!(!simple_key_ok("a\u{2028}b"));
    }

    #[test]
    fn escapes_match_pyyaml() {
        assert_eq!(escape('\t'), "\\t");
        assert_eq!(escape('\u{85}'), "\\N");
        assert_eq!(escape('\u{7f}'), "\\x7F");
        assert_eq!(escape('\u{feff}'), "\\uFEFF");
        assert_eq!(escape('\u{1F98C}'), "\\U0001F98C");
    }

    /// The front matter written for values PyYAML would misread if left plain: YAML 1.1
    /// booleans and nulls, octal/sexagesimal/date look-alikes, indicators, leading and trailing
    /// spaces, line breaks, non-printable and astral characters, long lines, nested values.
    #[test]
    fn tricky_values_are_written_as_pyyaml_writes_them() {
        let value = serde_json::json!({
            "id": "fact_0123abcd",
            "yes_word": "yes",
            "off_word": "Off",
            "tilde": "~",
            "null_word": "null",
            "octal": "0o17",
            "old_octal": "017",
            "sexagesimal": "1:20",
            "date": "2026-12-05",
            "float_text": "1e3",
            "colon_space": "key: value",
            "hash": "# not a comment",
            "leading_space": "  indented",
            "trailing_space": "trailing  ",
            "dash": "- item",
            "quote": "it's \"quoted\"",
            "multi_line": "first line\nsecond line\n",
            "tab": "a\tb",
            "nel": "a\u{85}b",
            "bom": "\u{feff}start",
            "emoji": "deer \u{1F98C}",
            "cjk": "乌龙茶が好き",
            "long": "word ".repeat(30),
            "empty": "",
            "number": 42,
            "float": 0.95,
            "small": 1e-5,
            "flag": true,
            "nothing": null,
            "list": ["a", "yes", 1, {"k": "v"}],
            "nested": {"inner": "on", "deeper": {"x": [] }},
            "empty_map": {},
        });
        let map = value.as_object().cloned().unwrap_or_default();
        let text = render(&map).unwrap_or_else(|e| panic!("render: {e}"));
        insta::assert_snapshot!("tricky_values", text);
    }
}
