//! Markdown fact files: rendering a normalised fact as YAML front matter plus `# title` plus
//! body, and parsing and validating a stored file (id, scope and fact checks, any failure being
//! corruption) the way the reference does, with its exact newline and title rules.

use std::path::{Path, PathBuf};

use deermem_core::fact::{FactScope, NormalizeContext, normalize_fact};
use deermem_core::ids::safe_user_id;
use deermem_core::{AgentName, Fact, FactDraft, Timestamp, UserId};
use deermem_pycompat::py;
use serde_json::{Map, Value};

use crate::error::{Error, Result};
use deermem_pycompat::yaml;

/// Front-matter keys whose values storage validates: an unquoted timestamp or a non-finite
/// float there makes the fact invalid for the reference (PyYAML types them as `datetime` /
/// `float('nan')`), so it is corrupt for us too.
const VALIDATED_KEYS: [&str; 17] = [
    "id",
    "content",
    "title",
    "category",
    "confidence",
    "createdAt",
    "updatedAt",
    "source",
    "schemaVersion",
    "status",
    "topics",
    "consolidatedFrom",
    "lastConfirmedAt",
    "confirmationCount",
    "revision",
    "user_id",
    "agent_name",
];

/// Renders a normalised fact as the bytes of its Markdown file.
///
/// # Errors
/// `Invalid` when a value cannot be written as YAML the reference reads back.
pub(crate) fn render(fact: &Fact) -> Result<String> {
    let front = yaml::render_mapping(&fact.front_matter()).map_err(|e| {
        Error::invalid(
            "fact",
            format!("fact '{}' cannot be written as YAML: {e}", fact.id),
        )
    })?;
    let mut out = String::with_capacity(front.len() + fact.content.len() + fact.title.len() + 24);
    out.push_str("---\n");
    out.push_str(front.trim_end_matches('\n'));
    out.push_str("\n---\n\n# ");
    out.push_str(&fact.title);
    out.push_str("\n\n");
    out.push_str(py::rstrip(&fact.content));
    out.push('\n');
    Ok(out)
}

/// A fact file split into its parts, before validation.
#[derive(Debug)]
pub(crate) struct ParsedFile {
    /// Front-matter keys (without `user_id`/`agent_name`), then `title` and `content`: the
    /// JSON a [`FactDraft`] is made of when the file is validated.
    pub(crate) map: Map<String, Value>,
    /// The front matter's `user_id` (`Null` when absent).
    pub(crate) user_id: Value,
    /// The front matter's `agent_name` (`Null` when absent).
    pub(crate) agent_name: Value,
}

fn parse_error(path: &Path, reason: impl Into<String>) -> Error {
    Error::FactParse {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Splits a fact file into front matter, title and content, exactly like the reference.
///
/// # Errors
/// `FactParse` corruption for invalid UTF-8, a missing or unterminated front matter, invalid
/// YAML, a non-mapping front matter, or PyYAML-incompatible values in validated keys.
pub(crate) fn parse(path: &Path, bytes: &[u8]) -> Result<ParsedFile> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| parse_error(path, format!("'utf-8' codec can't decode: {e}")))?;
    let text = py::universal_newlines(text);
    let Some(rest) = text.strip_prefix("---\n") else {
        return Err(parse_error(path, "missing YAML front matter"));
    };
    let Some((front, body)) = rest.split_once("\n---\n") else {
        return Err(parse_error(
            path,
            "the YAML front matter has no closing '---' line",
        ));
    };
    let parsed = yaml::parse_front_matter(front).map_err(|e| parse_error(path, e.to_string()))?;
    for key_path in parsed
        .unquoted_timestamps
        .iter()
        .chain(parsed.non_finite_floats.iter())
    {
        let top = key_path.split('.').next().unwrap_or(key_path);
        if VALIDATED_KEYS.contains(&top) {
            return Err(Error::InvalidFact {
                path: path.to_path_buf(),
                reason: format!(
                    "front-matter key {key_path:?} holds a value PyYAML reads as a non-string/non-finite type"
                ),
            });
        }
    }
    let mut map = parsed.map;
    let user_id = map.shift_remove("user_id").unwrap_or(Value::Null);
    let agent_name = map.shift_remove("agent_name").unwrap_or(Value::Null);

    let body = body.trim_start_matches('\n');
    let (title, content) = split_body(body);
    map.insert("title".into(), Value::String(title.to_owned()));
    map.insert("content".into(), Value::String(content.into_owned()));
    Ok(ParsedFile {
        map,
        user_id,
        agent_name,
    })
}

/// Whether `c` is one of the line boundaries of Python's `str.splitlines` other than `\n` (the
/// text was already given universal newlines, so `\r` cannot occur).
fn is_other_line_boundary(c: char) -> bool {
    matches!(
        c,
        '\r' | '\x0b' | '\x0c' | '\x1c' | '\x1d' | '\x1e' | '\u{85}' | '\u{2028}' | '\u{2029}'
    )
}

/// The title and content of a fact body, as the reference splits them: the body's lines
/// (`str.splitlines`), a first line `# title` taken as the title (stripped) along with one
/// blank line after it, and the rest joined with `\n` and stripped of trailing newlines.
///
/// When `\n` is the body's only line boundary, the rest is a slice of the body and nothing is
/// copied; otherwise the lines are split and joined as the reference does.
fn split_body(body: &str) -> (&str, std::borrow::Cow<'_, str>) {
    let only_newlines = if body.is_ascii() {
        !body
            .bytes()
            .any(|b| matches!(b, b'\r' | 0x0b | 0x0c | 0x1c..=0x1e))
    } else {
        !body.chars().any(is_other_line_boundary)
    };
    if !only_newlines {
        let mut lines = py::splitlines(body);
        let mut title = "";
        if lines.first().is_some_and(|l| l.starts_with("# ")) {
            let first = lines.remove(0);
            title = py::strip(&first[2..]);
            if lines.first().is_some_and(|l| py::strip(l).is_empty()) {
                lines.remove(0);
            }
        }
        let content = lines.join("\n");
        let content = content.trim_end_matches('\n').to_owned();
        return (title, std::borrow::Cow::Owned(content));
    }
    // `\n` is the only boundary: a line is the text up to the next `\n`, and joining lines
    // with `\n` gives back the text they came from (minus the final newline, which the
    // trailing-newline strip removes anyway).
    let mut title = "";
    let mut rest = body;
    if rest.starts_with("# ") {
        let (first, after) = rest.split_once('\n').unwrap_or((rest, ""));
        title = py::strip(&first[2..]);
        rest = after;
        let (next, after_next) = rest.split_once('\n').unwrap_or((rest, ""));
        // Python's `splitlines` yields no line for an empty remainder.
        if !rest.is_empty() && py::strip(next).is_empty() {
            rest = after_next;
        }
    }
    (
        title,
        std::borrow::Cow::Borrowed(rest.trim_end_matches('\n')),
    )
}

/// The scope a read expects: the requesting user and agent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Expected<'a> {
    pub(crate) user: Option<&'a UserId>,
    pub(crate) agent: &'a str,
}

/// A validated fact read from disk.
#[derive(Debug, Clone)]
pub(crate) struct LoadedFact {
    /// The fact as the caller sees it: owned by the requesting user's raw id.
    pub(crate) fact: Fact,
    /// Whether the file records another raw id of the same bucket (for example the bucket name
    /// written by the reference's `--all-users` migration); the next write of the fact records
    /// the requester's raw id.
    pub(crate) foreign_owner: bool,
}

fn describe_scope(user: &Value, agent: &Value) -> String {
    serde_json::json!({"userId": user, "agentName": agent}).to_string()
}

/// Whether a fact's recorded user belongs to the requested user: the same raw id, or (for ids
/// the bucket mapping made lossy) a raw id with the same bucket.
pub(crate) fn owner_matches(recorded: &Value, requested: Option<&UserId>) -> bool {
    match (recorded, requested) {
        (Value::Null, None) => true,
        (Value::String(s), Some(u)) => {
            s == u.as_str() || safe_user_id(s).is_ok_and(|b| b == u.bucket())
        }
        _ => false,
    }
}

/// Validates a parsed file against its file name and the requested scope, and normalises it.
///
/// # Errors
/// `FactIdMismatch`, `ScopeMismatch` or `InvalidFact` corruption.
pub(crate) fn validate(
    path: &Path,
    parsed: ParsedFile,
    expected: Expected<'_>,
    now: Timestamp,
) -> Result<LoadedFact> {
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_default();
    let id_text = parsed.map.get("id").and_then(py::py_str);
    if id_text.as_deref() != Some(stem) {
        return Err(Error::FactIdMismatch {
            path: path.to_path_buf(),
        });
    }
    let agent_ok = parsed
        .agent_name
        .as_str()
        .is_some_and(|a| a == expected.agent || py::lower(a) == py::lower(expected.agent));
    if !agent_ok || !owner_matches(&parsed.user_id, expected.user) {
        let want_user = expected
            .user
            .map_or(Value::Null, |u| Value::String(u.as_str().to_owned()));
        return Err(Error::ScopeMismatch {
            path: path.to_path_buf(),
            expected: describe_scope(&want_user, &Value::String(expected.agent.to_owned())),
            found: describe_scope(&parsed.user_id, &parsed.agent_name),
        });
    }
    let file_scope = FactScope {
        user_id: parsed.user_id.as_str().map(str::to_owned),
        agent_name: parsed.agent_name.as_str().map(str::to_owned),
    };
    let new_id = crate::fresh_fact_id;
    let ctx = NormalizeContext {
        scope: &file_scope,
        existing: None,
        now,
        new_id: &new_id,
    };
    let draft = FactDraft::from_json(parsed.map);
    let mut fact =
        draft
            .and_then(|d| normalize_fact(&d, &ctx))
            .map_err(|e| Error::InvalidFact {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })?;
    let requested_raw = expected.user.map(UserId::as_str);
    let foreign_owner = fact.scope.user_id.as_deref() != requested_raw;
    if foreign_owner {
        fact.scope.user_id = requested_raw.map(str::to_owned);
    }
    Ok(LoadedFact {
        fact,
        foreign_owner,
    })
}

/// Reads, parses and validates one fact file.
///
/// # Errors
/// `FactParse` for unreadable files; as [`validate`].
pub(crate) fn load_file(path: &Path, expected: Expected<'_>, now: Timestamp) -> Result<LoadedFact> {
    load_file_with(path, expected, now, &mut Vec::new())
}

/// [`load_file`] reading into `buf` (reused across the files of a scope).
///
/// # Errors
/// As [`load_file`].
pub(crate) fn load_file_with(
    path: &Path,
    expected: Expected<'_>,
    now: Timestamp,
    buf: &mut Vec<u8>,
) -> Result<LoadedFact> {
    crate::fsutil::read_into(path, buf).map_err(|e| parse_error(path, e.to_string()))?;
    let parsed = parse(path, buf)?;
    validate(path, parsed, expected, now)
}

/// Reads a fact if its file exists.
///
/// # Errors
/// As [`load_file`].
pub(crate) fn load_optional(
    path: &Path,
    expected: Expected<'_>,
    now: Timestamp,
) -> Result<Option<LoadedFact>> {
    match std::fs::read(path) {
        Ok(bytes) => {
            let parsed = parse(path, &bytes)?;
            validate(path, parsed, expected, now).map(Some)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(parse_error(path, e.to_string())),
    }
}

/// Every fact of an agent directory (any `*.md` below `facts/`, as the reference lists them),
/// sorted by id. When a misplaced copy and the canonical shard file share an id, only the
/// canonical one is returned (the reference listed the id twice).
///
/// # Errors
/// The first corrupt file fails the whole read, as in the reference.
pub(crate) fn load_all(
    facts_dir: &Path,
    expected: Expected<'_>,
    now: Timestamp,
) -> Result<Vec<LoadedFact>> {
    // Each entry of `facts/` (a shard directory, or a misplaced file) is listed and loaded
    // independently, possibly on two threads; the results are then taken in path order, so
    // errors and duplicates resolve exactly as in a sequential read.
    let Some(dir) = crate::walk::FactsDir::open(facts_dir)? else {
        return Ok(Vec::new());
    };
    let per_entry = crate::par::map_in_order(dir.entries(), |entry| {
        let mut buf = Vec::new();
        dir.read_entry(entry, &mut buf, |path, read, bytes| {
            let loaded = read
                .map_err(|e| parse_error(&path, e.to_string()))
                .and_then(|()| parse(&path, bytes))
                .and_then(|parsed| validate(&path, parsed, expected, now));
            (path, loaded)
        })
    });
    // Every file is listed before any is read, as in the reference: a listing error comes first.
    let mut all = Vec::new();
    for listed in per_entry {
        let listed: Result<Vec<(PathBuf, Result<LoadedFact>)>> = listed;
        all.extend(listed?);
    }
    let mut by_id: std::collections::BTreeMap<String, (bool, LoadedFact)> =
        std::collections::BTreeMap::new();
    for (path, loaded) in all {
        let loaded = loaded?;
        // `validate` checked that the file stem is the id, so the file is canonical when it
        // sits directly in `facts_dir/<shard>/`.
        let canonical = path.parent().is_some_and(|shard_dir| {
            shard_dir.parent() == Some(facts_dir)
                && shard_dir
                    .file_name()
                    .is_some_and(|n| n.to_str() == Some(loaded.fact.id.shard().as_str()))
        }) && path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.strip_suffix(".md") == Some(loaded.fact.id.as_str()));
        if !canonical {
            tracing::warn!(path = %path.display(), "fact file outside its shard directory");
        }
        let id = loaded.fact.id.as_str().to_owned();
        match by_id.get(&id) {
            Some((true, _)) => {}
            _ => {
                by_id.insert(id, (canonical, loaded));
            }
        }
    }
    Ok(by_id.into_values().map(|(_, l)| l).collect())
}

/// The canonical agent name of a directory name, when it is one DeerMem can write.
pub(crate) fn canonical_agent_dir(name: &str) -> Option<AgentName> {
    AgentName::parse(name).ok().filter(|a| a.as_str() == name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The reference's split, line by line (the definition `split_body` must match).
    fn split_body_by_lines(body: &str) -> (String, String) {
        let mut lines = py::splitlines(body);
        let mut title = String::new();
        if lines.first().is_some_and(|l| l.starts_with("# ")) {
            let first = lines.remove(0);
            title = py::strip(&first[2..]).to_owned();
            if lines.first().is_some_and(|l| py::strip(l).is_empty()) {
                lines.remove(0);
            }
        }
        let content = lines.join("\n");
        (title, content.trim_end_matches('\n').to_owned())
    }

    fn check(body: &str) {
        let (title, content) = split_body(body);
        let (want_title, want_content) = split_body_by_lines(body);
        assert_eq!(
            (title, content.as_ref()),
            (want_title.as_str(), want_content.as_str()),
            "{body:?}"
        );
    }

    #[test]
    fn body_split_matches_the_line_by_line_definition_on_edge_cases() {
        for body in [
            "",
            "\n",
            "\n\n",
            "# ",
            "# T",
            "# T\n",
            "# T\n\n",
            "# T\n\nC\n",
            "# T\nC",
            "# T\n   \n",
            "# T\n   ",
            "# T\n \t\nC\n\n",
            "A\n\nB\n\n\n",
            "A \n",
            "#T\nC",
            "# T\n\n\nC",
            "# T\x0bU\nC",
            "# T\n\x1c\nC",
            "C\u{2028}D\n",
            "# T\r\nC",
            "# \u{3000}T\u{3000}\n\u{3000}\nC",
            "# T\n\x1f\nC",
            "\n# T\nC",
        ] {
            check(body);
        }
    }

    proptest! {
        #[test]
        fn body_split_matches_the_line_by_line_definition(
            body in proptest::collection::vec(
                prop_oneof![
                    Just("# ".to_owned()), Just("\n".to_owned()), Just(" ".to_owned()),
                    Just("\t".to_owned()), Just("\x0b".to_owned()), Just("\x1c".to_owned()),
                    Just("\u{85}".to_owned()), Just("\u{2029}".to_owned()), Just("\u{3000}".to_owned()),
                    Just("\x1f".to_owned()), "[a-z#]{1,4}",
                ],
                0..12,
            ).prop_map(|parts| parts.concat())
        ) {
            check(&body);
        }
    }
}
