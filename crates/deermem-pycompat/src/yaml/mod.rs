//! The YAML 1.1 codec, compatible with PyYAML in both directions: the fact files' front matter
//! and, through [`parse_document`], any YAML document DeerFlow's PyYAML reads (configuration).
//!
//! DeerMem fact files start with a YAML block that the Python reference writes with
//! `yaml.safe_dump(metadata, allow_unicode=True, sort_keys=False)` and reads with
//! `yaml.safe_load` (YAML 1.1 implicit typing). This module reproduces both sides:
//!
//! * [`parse_front_matter`] / [`parse_mapping`] read a block the way `safe_load` does: block and
//!   flow collections, all scalar styles, comments, anchors and aliases; PLAIN scalars are typed
//!   by PyYAML's YAML 1.1 resolver (`yes`/`on`/`off` are booleans, `010` is 8, `1:30` is 90,
//!   `1.0e5` is a string but `1.0e+5` a float, `2026-01-01` a timestamp, ...). Quoted scalars
//!   and `!!str` are always strings; `!!int`, `!!float`, `!!bool`, `!!null`, `!!timestamp`,
//!   `!!seq`, `!!map` and the non-specific `!` are honoured; other tags are errors.
//! * [`render_mapping`] writes block YAML laid out like `safe_dump` (2-space mapping indent,
//!   sequences under a key not indented, `[]`/`{}` for empty collections, Python-`repr` floats
//!   with a `.`, strings plain when PyYAML would read them back as the same string, otherwise
//!   single-quoted, or double-quoted with escapes for control and non-printable characters,
//!   long scalars folded at column 80). PyYAML reads the output back to exactly the same values.
//!
//! # Values JSON cannot hold
//!
//! Two PyYAML types have no JSON equivalent, so [`FrontMatter`] says where they occurred, by
//! dotted key path (top-level `createdAt` is `"createdAt"`, nested `source.threadId` is
//! `"source.threadId"`, the second item of `topics` is `"topics.1"`; keys are joined as they
//! are, so a key that itself contains a `.` makes the path ambiguous):
//!
//! * an unquoted timestamp (`createdAt: 2026-01-01T00:00:00Z`; Python gets a `date` or
//!   `datetime`) is returned as its original text, listed in [`FrontMatter::unquoted_timestamps`];
//! * a non-finite float (`.nan`, `.inf`, `-.inf`, or a literal that overflows) is returned as
//!   the string PyYAML prints for it (`".nan"`, `".inf"`, `"-.inf"`), listed in
//!   [`FrontMatter::non_finite_floats`].
//!
//! The storage treats the fact as corrupt when such a value sits in a key the reference
//! validates (`createdAt`/`updatedAt`/`lastConfirmedAt` must be strings, `confidence` must be
//! finite), exactly as the reference does, and keeps it as a string everywhere else.
//!
//! # Limits and errors
//!
//! Every malformed input is a [`YamlError`], never a panic: characters PyYAML's reader refuses,
//! syntax errors, more than one document, non-mapping top levels, sequence or mapping keys,
//! merge keys `<<` and the value key `=` (unquoted), unknown tags, integers outside the 64-bit
//! range, invalid dates. Nesting is limited to [`MAX_DEPTH`] levels and alias expansion to
//! [`MAX_ALIAS_NODES`] nodes (no "billion laughs"). Deliberate differences from PyYAML are
//! listed in `docs/compat.md` (section "YAML front matter").

mod fast;
mod read;
mod resolve;
mod write;

use serde_json::{Map, Value};

/// Deepest nesting of collections accepted by the reader and the writer.
pub const MAX_DEPTH: usize = 100;

/// Most nodes that aliases may expand to, in total, in one document.
pub const MAX_ALIAS_NODES: usize = 100_000;

/// A parse or render failure, with the 1-based line of the front-matter text when known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.describe())]
pub struct YamlError {
    /// What went wrong.
    pub message: String,
    /// 1-based line of the front-matter text where it went wrong, if known.
    pub line: Option<usize>,
}

impl YamlError {
    /// Builds an error with an optional 1-based line number.
    pub fn new(message: impl Into<String>, line: Option<usize>) -> Self {
        Self {
            message: message.into(),
            line,
        }
    }

    fn describe(&self) -> String {
        match self.line {
            Some(line) => format!("YAML front matter, line {line}: {}", self.message),
            None => format!("YAML front matter: {}", self.message),
        }
    }
}

/// The parsed front matter plus where PyYAML would have produced values JSON cannot hold.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FrontMatter {
    /// The mapping, keys in document order (a repeated key keeps its first position and its
    /// last value, like a Python dict).
    pub map: Map<String, Value>,
    /// Dotted key paths of unquoted timestamps, kept in `map` as their original text.
    pub unquoted_timestamps: Vec<String>,
    /// Dotted key paths of non-finite floats, kept in `map` as `".nan"`, `".inf"` or `"-.inf"`.
    pub non_finite_floats: Vec<String>,
}

/// Parses a YAML front-matter block (the text between the `---` lines) the way the reference
/// reads it: `yaml.safe_load(text) or {}`, which must be a mapping.
///
/// An empty document, `null` or any other value Python treats as false (`false`, `0`, `''`,
/// `[]`) is an empty mapping; any other non-mapping top level is an error
/// ("front matter is not a mapping").
///
/// Front matter in the plain block layout the writers produce is read by a fast path (see
/// [`parse_front_matter_fast`]); anything else goes through the full reader.
pub fn parse_front_matter(text: &str) -> Result<FrontMatter, YamlError> {
    fast::parse(text).map_or_else(|| read::parse(text), Ok)
}

/// The fast path alone: `Some` only for the plain block layout PyYAML's `safe_dump` and
/// [`render_mapping`] produce (a block mapping of one-line plain, single- or double-quoted
/// scalars, `[]`/`{}`, block sequences of those, one nested mapping level), `None` for anything
/// it does not fully understand, errors included. Whenever it returns `Some`, the value equals
/// [`parse_front_matter_full`]'s. Public for the agreement tests and benchmarks.
pub fn parse_front_matter_fast(text: &str) -> Option<FrontMatter> {
    fast::parse(text)
}

/// The full reader alone (yaml-rust2's parser typed by the YAML 1.1 resolver), which
/// [`parse_front_matter`] falls back to. Public for the agreement tests and benchmarks.
pub fn parse_front_matter_full(text: &str) -> Result<FrontMatter, YamlError> {
    read::parse(text)
}

/// Parses any YAML 1.1 document the way PyYAML's `yaml.safe_load` reads it, as a JSON value:
/// `Null` for an empty document, and any top level (mapping, sequence, scalar). Plain scalars
/// are typed by the YAML 1.1 resolver (`yes`/`on` are `true`, `017` is 15 but `0o17` a string,
/// `1_000` is 1000, `~` is null). Mapping keys become strings as the fact files need them: the text
/// `json.dumps` writes for a non-string key (`1` is `"1"`, `yes` is `"true"`, `~` is `"null"`,
/// `1.5` is `"1.5"`); a sequence or mapping as a key is an error.
/// Two PyYAML types JSON cannot hold are kept as text: an unquoted timestamp keeps its
/// original text, and a non-finite float becomes `".nan"`, `".inf"` or `"-.inf"`.
///
/// Errors and limits are the front-matter reader's ([`MAX_DEPTH`], [`MAX_ALIAS_NODES`]).
///
/// ```
/// use deermem_pycompat::yaml::parse_document;
/// use serde_json::json;
///
/// let v = parse_document("memory:\n  enabled: yes\n  mode: 017\n  alt: 0o17\n  name: ~\n").unwrap();
/// assert_eq!(v, json!({"memory": {"enabled": true, "mode": 15, "alt": "0o17", "name": null}}));
/// ```
pub fn parse_document(text: &str) -> Result<Value, YamlError> {
    read::parse_document(text)
}

/// Parses a YAML front-matter block (the text between the `---` lines) the way PyYAML's
/// `safe_load` reads it; see [`parse_front_matter`] for the positions of non-JSON values.
pub fn parse_mapping(text: &str) -> Result<Map<String, Value>, YamlError> {
    parse_front_matter(text).map(|f| f.map)
}

/// Renders a mapping as block-style YAML that PyYAML reads back to exactly the same values
/// (no trailing newline, like PyYAML's output `.strip()`ed). An empty mapping is `{}`.
///
/// Fails only for values nested deeper than [`MAX_DEPTH`].
pub fn render_mapping(map: &Map<String, Value>) -> Result<String, YamlError> {
    write::render(map)
}
