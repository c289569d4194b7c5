//! Human-readable and JSON output.

use std::io::Write;

use deermem_core::{PublicFact, PublicMemoryDocument};
use serde::Serialize;

use crate::error::CliError;

/// Prints a value as pretty JSON on stdout.
pub(crate) fn print_json<T: Serialize + ?Sized>(value: &T) -> Result<(), CliError> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| CliError::failure(format!("cannot encode JSON: {e}")))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}").or_else(ignore_broken_pipe)
}

/// Prints `value` as pretty JSON with `--json`, else the text `text` makes.
pub(crate) fn print<T: Serialize + ?Sized>(
    json: bool,
    value: &T,
    text: impl FnOnce() -> String,
) -> Result<(), CliError> {
    if json {
        print_json(value)
    } else {
        print_text(&text())
    }
}

/// Prints lines on stdout.
pub(crate) fn print_text(text: &str) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes()).or_else(ignore_broken_pipe)?;
    if !text.ends_with('\n') {
        out.write_all(b"\n").or_else(ignore_broken_pipe)?;
    }
    Ok(())
}

/// A reader that stopped reading (`deermem ... | head`) is not an error.
fn ignore_broken_pipe(e: std::io::Error) -> Result<(), CliError> {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        Ok(())
    } else {
        Err(CliError::failure(format!("cannot write to stdout: {e}")))
    }
}

/// Shortens text to `max` characters on one line.
pub(crate) fn one_line(s: &str, max: usize) -> String {
    let flat: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() <= max {
        flat
    } else {
        let mut out: String = flat.chars().take(max.saturating_sub(1)).collect();
        out.push('…');
        out
    }
}

/// A facts table: id, category, confidence, revision, source, content.
pub(crate) fn facts_table(facts: &[PublicFact]) -> String {
    if facts.is_empty() {
        return "(no facts)\n".to_owned();
    }
    let id_w = facts
        .iter()
        .map(|f| f.id.chars().count())
        .max()
        .unwrap_or(2)
        .max(2);
    let cat_w = facts
        .iter()
        .map(|f| f.category.chars().count())
        .max()
        .unwrap_or(8)
        .max(8);
    let mut out = format!(
        "{:<id_w$}  {:<cat_w$}  {:>4}  {:>3}  CONTENT\n",
        "ID", "CATEGORY", "CONF", "REV"
    );
    for f in facts {
        out.push_str(&format!(
            "{:<id_w$}  {:<cat_w$}  {:>4.2}  {:>3}  {}\n",
            f.id,
            f.category,
            f.confidence,
            f.revision.map_or_else(|| "-".to_owned(), |r| r.to_string()),
            one_line(&f.content, 80)
        ));
    }
    out
}

/// One fact, key by key.
pub(crate) fn fact_details(f: &PublicFact) -> String {
    let mut out = String::new();
    out.push_str(&format!("id:          {}\n", f.id));
    out.push_str(&format!("content:     {}\n", f.content));
    out.push_str(&format!("category:    {}\n", f.category));
    if let Some(ext) = &f.category_extension {
        out.push_str(&format!("extension:   {ext}\n"));
    }
    out.push_str(&format!("confidence:  {}\n", f.confidence));
    out.push_str(&format!("source:      {}\n", f.source));
    out.push_str(&format!("created:     {}\n", f.created_at));
    if let Some(u) = &f.updated_at {
        out.push_str(&format!("updated:     {u}\n"));
    }
    if let Some(r) = f.revision {
        out.push_str(&format!("revision:    {r}\n"));
    }
    if let Some(t) = &f.topics
        && !t.is_empty()
    {
        out.push_str(&format!("topics:      {}\n", t.join(", ")));
    }
    out
}

/// The summaries of a document.
pub(crate) fn summaries_text(doc: &PublicMemoryDocument) -> String {
    let rows = [
        ("work context", &doc.user.work_context),
        ("personal context", &doc.user.personal_context),
        ("top of mind", &doc.user.top_of_mind),
        ("recent months", &doc.history.recent_months),
        ("earlier context", &doc.history.earlier_context),
        ("long-term background", &doc.history.long_term_background),
    ];
    let mut out = String::new();
    for (label, entry) in rows {
        let text = if entry.summary.trim().is_empty() {
            "(empty)"
        } else {
            entry.summary.as_str()
        };
        out.push_str(&format!("{label:<21} {text}\n"));
    }
    out.push_str(&format!(
        "revision              {}\n",
        doc.revision.unwrap_or(0)
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_flattens_and_truncates() {
        assert_eq!(one_line("a\nb", 10), "a b");
        assert_eq!(one_line("abcdef", 4), "abc…");
        assert_eq!(one_line("用户喜欢喝乌龙茶", 3), "用户…");
    }
}
