//! Front-matter reader: yaml-rust2's event stream typed with PyYAML's YAML 1.1 `safe_load` rules.

use std::collections::HashMap;

use indexmap::IndexMap;
use serde_json::{Map, Number, Value};
use yaml_rust2::parser::{Event, Parser, Tag};
use yaml_rust2::scanner::{Marker, TScalarStyle};

use super::resolve::{
    Implicit, IntError, IntValue, TimestampError, check_timestamp, construct_bool, construct_float,
    construct_int, resolve_plain,
};
use super::{FrontMatter, MAX_ALIAS_NODES, MAX_DEPTH, YamlError};

/// The full tag prefix of the YAML core schema (`!!x` is `tag:yaml.org,2002:x`).
const CORE: &str = "tag:yaml.org,2002:";

/// What a leaf stood for in Python when JSON has no equivalent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Special {
    /// An ordinary JSON value.
    None,
    /// A `date`/`datetime` in Python; kept as its original text.
    Timestamp,
    /// A non-finite float in Python; kept as `.nan`, `.inf` or `-.inf`.
    NonFinite,
}

/// A composed node, before the conversion to JSON.
#[derive(Debug, Clone)]
enum Node {
    Leaf(Value, Special),
    Seq(Vec<Node>),
    Map(IndexMap<String, Node>),
}

impl Node {
    /// Number of nodes in this tree (used to bound alias expansion).
    fn size(&self) -> usize {
        match self {
            Node::Leaf(..) => 1,
            Node::Seq(items) => items.iter().fold(1, |n, i| n.saturating_add(i.size())),
            Node::Map(entries) => entries
                .values()
                .fold(1_usize, |n, v| n.saturating_add(v.size()).saturating_add(1)),
        }
    }
}

/// A collection under construction.
#[derive(Debug)]
enum Frame {
    Seq {
        anchor: usize,
        items: Vec<Node>,
    },
    Map {
        anchor: usize,
        entries: IndexMap<String, Node>,
        key: Option<String>,
    },
}

fn err_at(message: impl Into<String>, mark: &Marker) -> YamlError {
    YamlError::new(message, Some(mark.line()))
}

/// PyYAML's reader refuses these characters before any parsing.
fn check_printable(text: &str) -> Result<(), YamlError> {
    let mut line = 1;
    for c in text.chars() {
        let ok = matches!(c,
            '\t' | '\n' | '\r' | '\u{20}'..='\u{7E}' | '\u{85}' | '\u{A0}'..='\u{D7FF}'
            | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..='\u{10FFFF}');
        if !ok {
            return Err(YamlError::new(
                format!(
                    "unacceptable character #x{:04x}: special characters are not allowed",
                    u32::from(c)
                ),
                Some(line),
            ));
        }
        if c == '\n' {
            line += 1;
        }
    }
    Ok(())
}

/// The node tree of the one document in `text`, read as PyYAML's reader and composer do
/// (`None` for an empty stream).
fn compose_document(text: &str) -> Result<Option<Node>, YamlError> {
    check_printable(text)?;
    // YAML 1.1 (PyYAML) reads a raw NEL as a line break everywhere, exactly like `\n`; yaml-rust2
    // follows YAML 1.2, where it is content. Substituting it gives PyYAML's values (including
    // its quirk of reading a quoted string that starts with NEL back with a space).
    let text: std::borrow::Cow<'_, str> = if text.contains('\u{85}') {
        std::borrow::Cow::Owned(text.replace('\u{85}', "\n"))
    } else {
        std::borrow::Cow::Borrowed(text)
    };
    compose(&text)
}

/// Parses any YAML 1.1 document into a JSON value (`Null` for an empty stream).
pub(crate) fn parse_document(text: &str) -> Result<Value, YamlError> {
    let Some(root) = compose_document(text)? else {
        return Ok(Value::Null);
    };
    let (mut ts, mut nf) = (Vec::new(), Vec::new());
    Ok(convert(root, &mut Vec::new(), &mut ts, &mut nf))
}

/// Parses front-matter text into a [`FrontMatter`].
pub(crate) fn parse(text: &str) -> Result<FrontMatter, YamlError> {
    let Some(root) = compose_document(text)? else {
        return Ok(FrontMatter::default());
    };
    let mut fm = FrontMatter::default();
    match root {
        Node::Map(entries) => {
            let mut path = Vec::new();
            fm.map = convert_map(
                entries,
                &mut path,
                &mut fm.unquoted_timestamps,
                &mut fm.non_finite_floats,
            );
            Ok(fm)
        }
        // The reference reads `yaml.safe_load(front) or {}`: every falsy value is an empty mapping.
        Node::Seq(items) if items.is_empty() => Ok(fm),
        Node::Leaf(v, Special::None) if !crate::py::truthy(&v) => Ok(fm),
        _ => Err(YamlError::new("front matter is not a mapping", Some(1))),
    }
}

fn convert_map(
    entries: IndexMap<String, Node>,
    path: &mut Vec<String>,
    ts: &mut Vec<String>,
    nf: &mut Vec<String>,
) -> Map<String, Value> {
    let mut out = Map::with_capacity(entries.len());
    for (k, v) in entries {
        path.push(k.clone());
        let value = convert(v, path, ts, nf);
        path.pop();
        out.insert(k, value);
    }
    out
}

fn convert(
    node: Node,
    path: &mut Vec<String>,
    ts: &mut Vec<String>,
    nf: &mut Vec<String>,
) -> Value {
    match node {
        Node::Leaf(v, special) => {
            match special {
                Special::None => {}
                Special::Timestamp => ts.push(path.join(".")),
                Special::NonFinite => nf.push(path.join(".")),
            }
            v
        }
        Node::Seq(items) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.into_iter().enumerate() {
                path.push(i.to_string());
                out.push(convert(item, path, ts, nf));
                path.pop();
            }
            Value::Array(out)
        }
        Node::Map(entries) => Value::Object(convert_map(entries, path, ts, nf)),
    }
}

/// Builds the node tree of the single document in `text` (`None` for an empty stream).
fn compose(text: &str) -> Result<Option<Node>, YamlError> {
    let mut parser = Parser::new_from_str(text);
    let mut stack: Vec<Frame> = Vec::new();
    let mut anchors: HashMap<usize, Node> = HashMap::new();
    let mut expanded: usize = 0;
    let mut root: Option<Node> = None;
    let mut documents = 0_usize;
    // Where a block scalar that ran to the end of an unterminated text sits, while only end
    // events follow it.
    let mut eof_block: Option<Vec<Step>> = None;
    loop {
        let (event, mark) = parser
            .next_token()
            .map_err(|e| YamlError::new(e.info().to_owned(), Some(e.marker().line())))?;
        let done: Option<(Node, usize)> = match event {
            Event::StreamEnd => break,
            Event::StreamStart | Event::Nothing | Event::DocumentEnd => None,
            Event::DocumentStart => {
                documents += 1;
                if documents > 1 {
                    return Err(err_at(
                        "expected a single document in the stream, but found another document",
                        &mark,
                    ));
                }
                None
            }
            Event::Alias(id) => {
                eof_block = None;
                let node = anchors
                    .get(&id)
                    .ok_or_else(|| err_at("found undefined alias", &mark))?;
                expanded = expanded.saturating_add(node.size());
                if expanded > MAX_ALIAS_NODES {
                    return Err(err_at(
                        format!("aliases expand to more than {MAX_ALIAS_NODES} nodes"),
                        &mark,
                    ));
                }
                Some((node.clone(), 0))
            }
            Event::Scalar(value, style, anchor, tag) => {
                let is_key = matches!(stack.last(), Some(Frame::Map { key: None, .. }));
                eof_block = None;
                if !is_key && !stack.is_empty() && block_scalar_ends_the_text(text, &value, style) {
                    eof_block = Some(path_of_next(&stack));
                }
                Some((scalar(value, style, tag.as_ref(), is_key, &mark)?, anchor))
            }
            Event::SequenceStart(anchor, tag) => {
                eof_block = None;
                check_collection_tag(tag.as_ref(), "seq", &mark)?;
                if stack.len() >= MAX_DEPTH {
                    return Err(err_at(
                        format!("nesting deeper than {MAX_DEPTH} levels"),
                        &mark,
                    ));
                }
                stack.push(Frame::Seq {
                    anchor,
                    items: Vec::new(),
                });
                None
            }
            Event::MappingStart(anchor, tag) => {
                eof_block = None;
                check_collection_tag(tag.as_ref(), "map", &mark)?;
                if stack.len() >= MAX_DEPTH {
                    return Err(err_at(
                        format!("nesting deeper than {MAX_DEPTH} levels"),
                        &mark,
                    ));
                }
                stack.push(Frame::Map {
                    anchor,
                    entries: IndexMap::new(),
                    key: None,
                });
                None
            }
            Event::SequenceEnd => match stack.pop() {
                Some(Frame::Seq { anchor, items }) => Some((Node::Seq(items), anchor)),
                _ => return Err(err_at("unbalanced sequence end", &mark)),
            },
            Event::MappingEnd => match stack.pop() {
                Some(Frame::Map {
                    anchor,
                    entries,
                    key: None,
                }) => Some((Node::Map(entries), anchor)),
                _ => return Err(err_at("unbalanced mapping end", &mark)),
            },
        };
        let Some((node, anchor)) = done else { continue };
        if anchor != 0 {
            anchors.insert(anchor, node.clone());
        }
        match stack.last_mut() {
            None => {
                if root.is_some() {
                    return Err(err_at("expected a single document in the stream", &mark));
                }
                root = Some(node);
            }
            Some(Frame::Seq { items, .. }) => items.push(node),
            Some(Frame::Map { entries, key, .. }) => match key.take() {
                None => *key = Some(key_string(node, &mark)?),
                Some(k) => {
                    // Python dict semantics: a repeated key keeps its first position, last value wins.
                    entries.insert(k, node);
                }
            },
        }
    }
    if let (Some(path), Some(root)) = (eof_block, root.as_mut()) {
        drop_final_line_break(root, &path);
    }
    Ok(root)
}

/// One step from a collection to a child.
#[derive(Debug)]
enum Step {
    Index(usize),
    Key(String),
}

/// The path from the root to the node the next completed node will become.
fn path_of_next(stack: &[Frame]) -> Vec<Step> {
    stack
        .iter()
        .map(|f| match f {
            Frame::Seq { items, .. } => Step::Index(items.len()),
            Frame::Map { key, .. } => Step::Key(key.clone().unwrap_or_default()),
        })
        .collect()
}

fn drop_final_line_break(root: &mut Node, path: &[Step]) {
    let mut node = root;
    for step in path {
        let next = match (node, step) {
            (Node::Seq(items), Step::Index(i)) => items.get_mut(*i),
            (Node::Map(entries), Step::Key(k)) => entries.get_mut(k),
            _ => None,
        };
        match next {
            Some(n) => node = n,
            None => return,
        }
    }
    if let Node::Leaf(Value::String(s), _) = node
        && s.ends_with('\n')
    {
        s.pop();
    }
}

/// PyYAML gives a block scalar whose last content line ends the text without a line break no
/// final line break (the front matter never ends with one); yaml-rust2 adds it. This says
/// whether `value` is such a scalar: the text's last line is its last content line.
fn block_scalar_ends_the_text(text: &str, value: &str, style: TScalarStyle) -> bool {
    if !matches!(style, TScalarStyle::Literal | TScalarStyle::Folded)
        || text.ends_with(['\n', '\r'])
        || !value.ends_with('\n')
    {
        return false;
    }
    let last_line = text.rsplit(['\n', '\r']).next().unwrap_or(text);
    let content = last_line.trim_start_matches(' ');
    if content.trim().is_empty() || content.len() == last_line.len() {
        return false;
    }
    let body = &value[..value.len() - 1];
    let value_last = body.rsplit('\n').next().unwrap_or(body);
    match style {
        TScalarStyle::Literal => {
            last_line.ends_with(value_last)
                && last_line.len() > value_last.len()
                && last_line[..last_line.len() - value_last.len()]
                    .chars()
                    .all(|c| c == ' ')
        }
        _ => value_last.ends_with(content),
    }
}

/// Turns a mapping key into the JSON object key.
fn key_string(node: Node, mark: &Marker) -> Result<String, YamlError> {
    match node {
        Node::Leaf(Value::String(s), _) => Ok(s),
        // Python keeps non-string keys; JSON cannot: they become the text `json.dumps` would use.
        Node::Leaf(Value::Null, _) => Ok("null".to_owned()),
        Node::Leaf(Value::Bool(b), _) => Ok(if b { "true" } else { "false" }.to_owned()),
        Node::Leaf(Value::Number(n), _) => Ok(match n.as_f64() {
            Some(f) if n.is_f64() => crate::py::float_repr(f),
            _ => n.to_string(),
        }),
        Node::Leaf(other, _) => Ok(other.to_string()),
        Node::Seq(_) | Node::Map(_) => Err(err_at(
            "found unhashable key (a sequence or mapping used as a mapping key)",
            mark,
        )),
    }
}

fn check_collection_tag(tag: Option<&Tag>, kind: &str, mark: &Marker) -> Result<(), YamlError> {
    let Some(tag) = tag else { return Ok(()) };
    let full = format!("{}{}", tag.handle, tag.suffix);
    if full == "!" || full == format!("{CORE}{kind}") {
        Ok(())
    } else {
        Err(err_at(
            format!("unsupported tag {full:?} on a collection"),
            mark,
        ))
    }
}

fn number_leaf(v: f64) -> Leaf {
    match Number::from_f64(v) {
        Some(n) => (Value::Number(n), Special::None),
        None => {
            let text = if v.is_nan() {
                ".nan"
            } else if v > 0.0 {
                ".inf"
            } else {
                "-.inf"
            };
            (Value::String(text.to_owned()), Special::NonFinite)
        }
    }
}

/// Why a scalar cannot be typed the way PyYAML's safe loader types it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum ScalarError {
    #[error(
        "found character '\\t' that cannot start any token (tabs are not allowed in plain scalars)"
    )]
    Tab,
    #[error("invalid integer {0:?}")]
    Int(String),
    #[error("integer {0:?} is outside the 64-bit range this reader supports")]
    IntRange(String),
    #[error("invalid float {0:?}")]
    Float(String),
    #[error("invalid boolean {0:?}")]
    Bool(String),
    #[error("invalid timestamp {value:?}: {why}")]
    Timestamp { value: String, why: TimestampError },
    #[error("merge keys (`<<`) are not supported; quote the text if it is meant as a string")]
    Merge,
    #[error("plain scalar {0:?} has a YAML type PyYAML's safe loader cannot construct; quote it")]
    Unconstructible(String),
}

/// A typed scalar: the value and what it stood for in Python.
type Leaf = (Value, Special);

fn int_leaf(value: &str) -> Result<Leaf, ScalarError> {
    match construct_int(value) {
        Ok(IntValue::Signed(i)) => Ok((Value::Number(i.into()), Special::None)),
        Ok(IntValue::Unsigned(u)) => Ok((Value::Number(u.into()), Special::None)),
        Err(IntError::Invalid) => Err(ScalarError::Int(value.to_owned())),
        Err(IntError::OutOfRange) => Err(ScalarError::IntRange(value.to_owned())),
    }
}

fn float_leaf(value: &str) -> Result<Leaf, ScalarError> {
    construct_float(value)
        .map(number_leaf)
        .ok_or_else(|| ScalarError::Float(value.to_owned()))
}

fn timestamp_leaf(value: String) -> Result<Leaf, ScalarError> {
    match check_timestamp(&value) {
        Ok(()) => Ok((Value::String(value), Special::Timestamp)),
        Err(why) => Err(ScalarError::Timestamp { value, why }),
    }
}

fn bool_leaf(value: &str) -> Result<Leaf, ScalarError> {
    construct_bool(value)
        .map(|b| (Value::Bool(b), Special::None))
        .ok_or_else(|| ScalarError::Bool(value.to_owned()))
}

/// Types an untagged PLAIN scalar with PyYAML's implicit resolver (shared by the full reader
/// and the fast path, so both give the same value).
pub(super) fn plain_scalar(value: String, is_key: bool) -> Result<Leaf, ScalarError> {
    if value.contains('\t') {
        // PyYAML's scanner ends a plain scalar at a tab and then cannot start a token there.
        return Err(ScalarError::Tab);
    }
    resolve_untagged(value, is_key)
}

/// Types a scalar by the implicit resolver (an untagged plain scalar after the tab check, or
/// any scalar with the non-specific tag `!`).
fn resolve_untagged(value: String, is_key: bool) -> Result<Leaf, ScalarError> {
    match resolve_plain(&value) {
        Implicit::Str => Ok((Value::String(value), Special::None)),
        Implicit::Null => Ok((Value::Null, Special::None)),
        Implicit::Bool => bool_leaf(&value),
        Implicit::Int => int_leaf(&value),
        Implicit::Float => float_leaf(&value),
        Implicit::Timestamp => timestamp_leaf(value),
        Implicit::Merge => Err(ScalarError::Merge),
        // As a mapping key PyYAML turns the value key `=` into the string "=".
        Implicit::Value if is_key => Ok((Value::String(value), Special::None)),
        Implicit::Value | Implicit::Yaml => Err(ScalarError::Unconstructible(value)),
    }
}

/// Types one scalar: plain scalars by the implicit resolver, quoted ones as strings, tags honoured.
fn scalar(
    value: String,
    style: TScalarStyle,
    tag: Option<&Tag>,
    is_key: bool,
    mark: &Marker,
) -> Result<Node, YamlError> {
    let at = |e: ScalarError| err_at(e.to_string(), mark);
    let leaf = |(v, special): Leaf| Node::Leaf(v, special);
    // PyYAML resolves a scalar with the non-specific tag `!` like an untagged plain one.
    let non_specific = tag.is_some_and(|t| format!("{}{}", t.handle, t.suffix) == "!");
    if let (Some(tag), false) = (tag, non_specific) {
        let full = format!("{}{}", tag.handle, tag.suffix);
        return match full.strip_prefix(CORE) {
            Some("str") => Ok(Node::Leaf(Value::String(value), Special::None)),
            Some("null") => Ok(Node::Leaf(Value::Null, Special::None)),
            Some("bool") => bool_leaf(&value).map(leaf).map_err(at),
            Some("int") => int_leaf(&value).map(leaf).map_err(at),
            Some("float") => float_leaf(&value).map(leaf).map_err(at),
            Some("timestamp") => timestamp_leaf(value).map(leaf).map_err(at),
            _ => Err(err_at(
                format!("unsupported tag {full:?} on a scalar"),
                mark,
            )),
        };
    }
    if style != TScalarStyle::Plain && !non_specific {
        return Ok(Node::Leaf(Value::String(value), Special::None));
    }
    if style != TScalarStyle::Plain {
        // A quoted scalar with the non-specific tag: resolved like a plain one, tabs included.
        return resolve_untagged(value, is_key).map(leaf).map_err(at);
    }
    plain_scalar(value, is_key).map(leaf).map_err(at)
}

#[cfg(test)]
mod tests {
    use super::super::parse_document;

    /// Each scalar the safe loader cannot construct is refused with its own message and line.
    #[test]
    fn unconstructible_scalars_are_refused_with_their_reason() {
        for (text, line, message) in [
            (
                "a: 1\nb: x\ty\n",
                2,
                "found character '\\t' that cannot start any token",
            ),
            (
                "n: 99999999999999999999999\n",
                1,
                "integer \"99999999999999999999999\" is outside the 64-bit range",
            ),
            (
                "d: 2023-02-29\n",
                1,
                "invalid timestamp \"2023-02-29\": day is out of range for month",
            ),
            ("t: !!timestamp 2026-13-01\n", 1, "month must be in 1..12"),
            ("b: !!bool maybe\n", 1, "invalid boolean \"maybe\""),
            ("f: !!float x1\n", 1, "invalid float \"x1\""),
            ("i: !!int 1.5\n", 1, "invalid integer \"1.5\""),
            ("m: <<\n", 1, "merge keys (`<<`) are not supported"),
            ("v: =\n", 1, "plain scalar \"=\" has a YAML type"),
        ] {
            let err = parse_document(text).expect_err(text);
            assert!(
                err.message.contains(message),
                "{text:?}: {:?} does not say {message:?}",
                err.message
            );
            assert_eq!(err.line, Some(line), "{text:?}");
        }
    }
}
