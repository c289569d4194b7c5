//! Upload handling at its three layers: upload blocks stripped from user messages, again from the
//! prompt's conversation, and upload-event sentences and facts removed from memory after an update.

use std::sync::OnceLock;

use regex::Regex;

#[allow(
    clippy::expect_used,
    reason = "the patterns are constants of this file, compiled by its tests; no input reaches them"
)]
fn compile(pattern: &str) -> Regex {
    Regex::new(pattern).expect("a built-in upload pattern compiles")
}

/// `<uploaded_files>…</uploaded_files>` and `<current_uploads>…</current_uploads>` blocks with
/// the newlines after them, matched case-insensitively with matching tag names.
fn upload_block_re() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        compile(
            r"(?i)<uploaded_files>[\s\S]*?</uploaded_files>\n*|<current_uploads>[\s\S]*?</current_uploads>\n*",
        )
    })
}

/// One sentence that talks about an upload event, with the `\b` the reference put before the
/// path and tag alternatives removed so that those branches can match.
fn upload_sentence_re() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        compile(
            r"(?i)[^.!?]*(?:\b(?:upload(?:ed|ing)?(?:\s+\w+){0,3}\s+(?:file|files?|document|documents?|attachment|attachments?)|file\s+upload)|/mnt/user-data/uploads/|<(?:uploaded_files|current_uploads)>)[^.!?]*[.!?]?\s*",
        )
    })
}

fn multi_space_re() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| compile(r" {2,}"))
}

/// Whether the lower-cased text mentions an upload block tag.
pub(crate) fn mentions_upload_block(text: &str) -> bool {
    let lower = text.to_lowercase();
    lower.contains("<uploaded_files>") || lower.contains("<current_uploads>")
}

/// Removes every upload block (case-insensitive tags) and strips the remainder.
pub(crate) fn strip_upload_blocks(text: &str) -> String {
    deermem_pycompat::py::strip(&upload_block_re().replace_all(text, "")).to_owned()
}

/// Removes upload-event sentences from a summary and collapses runs of spaces.
///
/// A removed sentence leaves behind the whitespace that preceded it, so the sentences around it
/// stay separated ("A. B." rather than the reference's "A.B.").
pub(crate) fn strip_upload_sentences(summary: &str) -> String {
    let removed = upload_sentence_re().replace_all(summary, |caps: &regex::Captures<'_>| {
        let m = caps.get(0).map_or("", |m| m.as_str());
        let lead = m.len() - m.trim_start().len();
        m[..lead].to_owned()
    });
    let stripped = deermem_pycompat::py::strip(&removed);
    multi_space_re().replace_all(stripped, " ").into_owned()
}

/// Whether a fact's content mentions an upload event (such facts are deleted).
pub(crate) fn mentions_upload_event(content: &str) -> bool {
    upload_sentence_re().is_match(content)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_removed_with_matching_tags_only() {
        assert_eq!(
            strip_upload_blocks(
                "<uploaded_files>\n/mnt/x.csv\n</uploaded_files>\n\nWhat is in it?"
            ),
            "What is in it?"
        );
        assert_eq!(
            strip_upload_blocks("<CURRENT_UPLOADS>a</Current_Uploads>\nhi"),
            "hi"
        );
        // Mismatched tags are not a block.
        assert_eq!(
            strip_upload_blocks("<uploaded_files>a</current_uploads>"),
            "<uploaded_files>a</current_uploads>"
        );
        assert!(mentions_upload_block("x <Uploaded_Files> y"));
        assert!(!mentions_upload_block("uploaded files"));
    }

    #[test]
    fn upload_sentences_are_removed_from_summaries() {
        assert_eq!(
            strip_upload_sentences(
                "User works on data pipelines. User uploaded a CSV file for analysis. Prefers Polars."
            ),
            "User works on data pipelines. Prefers Polars."
        );
        assert_eq!(
            strip_upload_sentences(
                "Analyses the folder /mnt/user-data/uploads/ every day. Likes tea."
            ),
            "Likes tea."
        );
        assert_eq!(
            strip_upload_sentences("User works with CSV files daily."),
            "User works with CSV files daily."
        );
        assert_eq!(
            strip_upload_sentences("Prefers PDF export for reports."),
            "Prefers PDF export for reports."
        );
        assert_eq!(
            strip_upload_sentences("Upload  file  works! Rest."),
            "Rest."
        );
        assert_eq!(strip_upload_sentences("a  b"), "a b");
    }

    #[test]
    fn path_and_tag_branches_match_without_a_word_before_them() {
        // The reference's `\b` made these two branches unreachable.
        assert!(mentions_upload_event("see /mnt/user-data/uploads/x.csv"));
        assert!(mentions_upload_event("<uploaded_files> listed"));
        assert!(mentions_upload_event(
            "User is uploading a test file to check parsing"
        ));
        assert!(!mentions_upload_event("uploaded a 3 page pdf document"));
        assert!(!mentions_upload_event("User prefers dark mode"));
    }
}
