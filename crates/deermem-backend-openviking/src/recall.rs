//! Recall: reading memory hits from a `find`/`search` result (memory files only: the server also
//! returns its directory summaries, which are left out), the memory type from the hit's
//! `memory_type=…` tag, choosing each hit's text by `content_mode`, and formatting the injection
//! block under the character budget (counted in Unicode code points).

use std::collections::HashSet;

use serde_json::{Map, Value};

use crate::config::ContentMode;

/// One recalled memory.
#[derive(Clone, Debug, PartialEq)]
pub struct RecalledMemory {
    /// `viking://` uri of the memory (empty when the server sent none).
    pub uri: String,
    /// The chosen text, already cut to the per-memory budget.
    pub content: String,
    /// The memory type: the hit's `memory_type=…` tag (what current servers send), else its
    /// `category` field (what older servers sent).
    pub category: Option<String>,
    /// The relevance score, when sent.
    pub score: Option<f64>,
}

/// The tag prefix naming a memory's type (`memory_type=preferences`).
pub const MEMORY_TYPE_TAG: &str = "memory_type=";

/// The memory hits of a retrieval result (`result.memories`); resources and skills are ignored,
/// entries that are not objects are skipped, and so are directory entries (see
/// [`is_directory_entry`]).
pub(crate) fn memory_hits(result: &Value) -> Vec<Map<String, Value>> {
    result
        .get("memories")
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(|h| h.as_object())
                .filter(|h| !is_directory_entry(h))
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

/// Whether a hit is one of the server's directory summaries rather than a memory: a `level`
/// below 2 (0 is a directory's abstract, 1 its overview), or a uri whose last segment is a
/// hidden summary file (`.abstract.md`, `.overview.md`). Their text is a listing such as
/// `# Preferences Overview … [diet](./diet.md)`, not something the user said.
pub fn is_directory_entry(hit: &Map<String, Value>) -> bool {
    if hit
        .get("level")
        .and_then(Value::as_f64)
        .is_some_and(|l| l < 2.0)
    {
        return true;
    }
    hit_uri(hit)
        .and_then(|u| u.trim_end_matches('/').rsplit('/').next())
        .is_some_and(|last| last.starts_with('.'))
}

/// The memory type of a hit: the value of its first `memory_type=…` tag, else its `category`.
pub fn memory_type(hit: &Map<String, Value>) -> Option<String> {
    let from_tags = hit
        .get("tags")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .find_map(|t| t.strip_prefix(MEMORY_TYPE_TAG))
        .filter(|t| !t.is_empty());
    from_tags
        .or_else(|| {
            hit.get("category")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
        })
        .map(str::to_owned)
}

/// The text of a memory file without a leading YAML header (`---` … `---`), which the server
/// adds to some files it generates.
pub(crate) fn strip_front_matter(text: &str) -> &str {
    let Some(rest) = text.strip_prefix("---\n") else {
        return text;
    };
    match rest.find("\n---\n") {
        Some(end) => rest[end + 5..].trim_start_matches('\n'),
        None => text,
    }
}

fn truthy_field<'a>(hit: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    hit.get(key).filter(|v| deermem_pycompat::py::truthy(v))
}

/// The text a mode picks without reading the full content: overview-first for
/// `overview`/`read`/`auto`, abstract-first for `abstract`.
pub(crate) fn summary_content(hit: &Map<String, Value>, mode: ContentMode) -> Option<&Value> {
    match mode {
        ContentMode::Abstract => {
            truthy_field(hit, "abstract").or_else(|| truthy_field(hit, "overview"))
        }
        _ => truthy_field(hit, "overview").or_else(|| truthy_field(hit, "abstract")),
    }
}

/// The hit's uri, when it has a non-empty string one.
pub(crate) fn hit_uri(hit: &Map<String, Value>) -> Option<&str> {
    hit.get("uri")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// Whether the mode reads this hit's full content.
pub(crate) fn wants_read(hit: &Map<String, Value>, mode: ContentMode) -> bool {
    match mode {
        ContentMode::Read => hit_uri(hit).is_some(),
        ContentMode::Auto => {
            hit_uri(hit).is_some() && hit.get("level").and_then(Value::as_f64) == Some(2.0)
        }
        _ => false,
    }
}

/// A string as is, other values as two-space indented JSON, `null` as empty; text longer than
/// `max_chars` becomes its first `max_chars` characters plus `\n...[truncated]`.
pub(crate) fn stringify(v: Option<&Value>, max_chars: usize) -> String {
    let text = match v {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => serde_json::to_string_pretty(other).unwrap_or_default(),
    };
    if text.chars().count() > max_chars {
        format!(
            "{}\n...[truncated]",
            deermem_pycompat::py::prefix_chars(&text, max_chars)
        )
    } else {
        text
    }
}

/// Builds a recalled memory from a hit and its chosen content.
pub(crate) fn to_memory(hit: &Map<String, Value>, content: String) -> RecalledMemory {
    RecalledMemory {
        uri: hit_uri(hit).unwrap_or_default().to_owned(),
        content,
        category: memory_type(hit),
        score: hit.get("score").and_then(Value::as_f64),
    }
}

/// Python's `" ".join(s.split())`.
fn collapse_whitespace(s: &str) -> String {
    s.split(deermem_pycompat::py::is_space)
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The injection text: one `- [category] content` line per distinct (case-folded) non-empty
/// memory, stopping before the budget is exceeded; a line that does not fit is cut with `…`
/// when more than 16 characters remain, so the result is at most `max_chars` characters.
pub fn format_context(memories: &[RecalledMemory], max_chars: usize) -> String {
    let mut seen = HashSet::new();
    let mut lines: Vec<String> = Vec::new();
    let mut total = 0usize;
    for m in memories {
        let content = collapse_whitespace(&m.content);
        if content.is_empty() || !seen.insert(deermem_pycompat::py::casefold(&content)) {
            continue;
        }
        let line = format!(
            "- [{}] {content}",
            m.category.as_deref().unwrap_or("memory")
        );
        let sep = usize::from(!lines.is_empty());
        let line_len = line.chars().count();
        if total + sep + line_len > max_chars {
            let remaining = max_chars.saturating_sub(total + sep);
            if remaining > 16 {
                let cut = deermem_pycompat::py::prefix_chars(&line, remaining - 1);
                lines.push(format!("{cut}…"));
            }
            break;
        }
        total += sep + line_len;
        lines.push(line);
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn mem(content: &str, category: Option<&str>) -> RecalledMemory {
        RecalledMemory {
            uri: String::new(),
            content: content.into(),
            category: category.map(str::to_owned),
            score: None,
        }
    }

    #[test]
    fn formats_collapses_and_dedups() {
        let out = format_context(
            &[
                mem("Prefers  concise\nanswers.", Some("preferences")),
                mem("prefers concise ANSWERS.", None),
                mem("   ", None),
                mem("Uses Vim", None),
            ],
            1000,
        );
        assert_eq!(
            out,
            "- [preferences] Prefers concise answers.\n- [memory] Uses Vim"
        );
    }

    #[test]
    fn truncates_at_exactly_the_budget_with_an_ellipsis() {
        let first = "a".repeat(240);
        let out = format_context(&[mem(&first, None), mem(&"é".repeat(100), None)], 300);
        assert_eq!(out.chars().count(), 300);
        assert!(out.ends_with('…'));
        let lines: Vec<&str> = out.split('\n').collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[1].starts_with("- [memory] éé"));
        // Only 16 characters left: the line is dropped, not cut.
        let first = "b".repeat(300 - 11 - 17);
        let out = format_context(
            &[mem(&first, None), mem("more text here please", None)],
            300,
        );
        assert_eq!(out.chars().count(), 300 - 17);
        assert!(!out.contains('\n'));
    }

    #[test]
    fn stringify_cuts_long_text_on_char_boundaries() {
        let v = json!("ü".repeat(300));
        let s = stringify(Some(&v), 256);
        assert!(s.ends_with("\n...[truncated]"));
        assert_eq!(s.chars().count(), 256 + "\n...[truncated]".chars().count());
        assert_eq!(stringify(Some(&json!({"a": 1})), 256), "{\n  \"a\": 1\n}");
        assert_eq!(stringify(None, 256), "");
    }

    #[test]
    fn content_choice_by_mode() {
        let hit = json!({"uri": "viking://user/memories/a.md", "level": 2, "abstract": "abs", "overview": "ov"});
        let hit = hit.as_object().unwrap();
        assert_eq!(
            summary_content(hit, ContentMode::Overview),
            Some(&json!("ov"))
        );
        assert_eq!(
            summary_content(hit, ContentMode::Abstract),
            Some(&json!("abs"))
        );
        let only_abstract = json!({"abstract": "abs", "overview": ""});
        assert_eq!(
            summary_content(only_abstract.as_object().unwrap(), ContentMode::Overview),
            Some(&json!("abs"))
        );
        assert!(wants_read(hit, ContentMode::Read));
        assert!(wants_read(hit, ContentMode::Auto));
        let l1 = json!({"uri": "u", "level": 1});
        assert!(!wants_read(l1.as_object().unwrap(), ContentMode::Auto));
        assert!(!wants_read(hit, ContentMode::Overview));
    }

    #[test]
    fn directory_entries_are_not_memories() {
        // Shapes the real 0.5.2 server returns for a user with one preference.
        let r = json!({"memories": [
            {"context_type": "memory", "uri": "viking://user/u1/memories/preferences/u1/.overview.md",
             "level": 1, "score": 0.66, "abstract": "# Preferences Overview\n- [editor](./editor.md)", "tags": []},
            {"context_type": "memory", "uri": "viking://user/u1/memories/preferences/u1/editor.md",
             "level": 2, "score": 0.59, "abstract": "- Uses Vim.", "tags": ["memory_type=preferences"]},
            {"context_type": "memory", "uri": "viking://user/u1/memories/.abstract.md",
             "level": 0, "score": 0.5, "abstract": "User memories.", "tags": []},
            {"context_type": "memory", "uri": "viking://user/u1/memories/.overview.md",
             "score": 0.5, "abstract": "no level, but a summary file", "tags": []}
        ]});
        let hits = memory_hits(&r);
        assert_eq!(hits.len(), 1);
        assert_eq!(
            hit_uri(&hits[0]),
            Some("viking://user/u1/memories/preferences/u1/editor.md")
        );
        assert_eq!(memory_type(&hits[0]).as_deref(), Some("preferences"));
        let old = json!({"uri": "u.md", "level": 2, "category": "goals"});
        assert_eq!(
            memory_type(old.as_object().unwrap()).as_deref(),
            Some("goals")
        );
        let none = json!({"uri": "u.md", "tags": ["source=chat", "memory_type="]});
        assert_eq!(memory_type(none.as_object().unwrap()), None);
    }

    #[test]
    fn front_matter_is_stripped_from_read_content() {
        assert_eq!(
            strip_front_matter("---\ndirectory: x\nfreshness:\n  total: 1\n---\n\n# Title\nbody\n"),
            "# Title\nbody\n"
        );
        assert_eq!(strip_front_matter("- Uses Vim."), "- Uses Vim.");
        assert_eq!(strip_front_matter("---\nnever closed"), "---\nnever closed");
    }

    #[test]
    fn memory_hits_ignore_resources_and_garbage() {
        let r = json!({"memories": [{"uri": "m"}, 3, "x"], "resources": [{"uri": "r"}]});
        let hits = memory_hits(&r);
        assert_eq!(hits.len(), 1);
        assert!(memory_hits(&json!({})).is_empty());
        assert!(memory_hits(&json!({"memories": {"a": 1}})).is_empty());
    }
}
