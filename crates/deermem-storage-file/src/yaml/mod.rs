//! YAML front-matter codec of the file storage, compatible with PyYAML (`safe_load` / `safe_dump`).
//!
//! INTERIM implementation backed by `serde_yaml`; the public API below is final.

use serde_json::{Map, Value};

/// A parse or render failure, with the 1-based line when known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", match self.line { Some(l) => format!("YAML front matter, line {l}: {}", self.message), None => format!("YAML front matter: {}", self.message) })]
pub struct YamlError {
    /// What went wrong.
    pub message: String,
    /// 1-based line of the front-matter text where it went wrong, if known.
    pub line: Option<usize>,
}

impl YamlError {
    /// Builds an error with an optional line number.
    pub fn new(message: impl Into<String>, line: Option<usize>) -> Self {
        Self {
            message: message.into(),
            line,
        }
    }
}

/// The parsed front matter plus where PyYAML would have produced non-JSON values.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FrontMatter {
    /// The mapping, keys in document order.
    pub map: Map<String, Value>,
    /// Dotted key paths of unquoted timestamps (kept as their original text).
    pub unquoted_timestamps: Vec<String>,
    /// Dotted key paths of non-finite floats (kept as `".nan"`, `".inf"`, `"-.inf"`).
    pub non_finite_floats: Vec<String>,
}

/// Parses a YAML front-matter block the way PyYAML's `safe_load` reads it.
pub fn parse_front_matter(text: &str) -> Result<FrontMatter, YamlError> {
    let value: serde_yaml::Value =
        serde_yaml::from_str(text).map_err(|e| YamlError::new(e.to_string(), None))?;
    let json = serde_json::to_value(&value).map_err(|e| YamlError::new(e.to_string(), None))?;
    match json {
        Value::Null => Ok(FrontMatter::default()),
        Value::Object(map) => Ok(FrontMatter {
            map,
            ..FrontMatter::default()
        }),
        _ => Err(YamlError::new("front matter is not a mapping", None)),
    }
}

/// Parses a YAML front-matter block (the text between the `---` lines) the way PyYAML's safe_load reads it.
pub fn parse_mapping(text: &str) -> Result<Map<String, Value>, YamlError> {
    parse_front_matter(text).map(|f| f.map)
}

/// Renders a mapping as block-style YAML that PyYAML reads back to exactly the same values
/// (no trailing newline, like PyYAML's output `.strip()`ed).
pub fn render_mapping(map: &Map<String, Value>) -> Result<String, YamlError> {
    let s = serde_yaml::to_string(map).map_err(|e| YamlError::new(e.to_string(), None))?;
    Ok(s.trim_end().to_owned())
}
