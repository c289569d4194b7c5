//! The memory document's HTTP body, written straight into one pre-sized buffer: the bytes are
//! exactly what `serde_json::to_vec(&doc.for_http())` produces (same keys, order, skipped
//! fields, string escapes and number formatting), without the `for_http` pass, without
//! buffer regrowth and with a string escaper that skips clean runs a word at a time.
//!
//! Every struct is destructured exhaustively, so a field added to the public shapes in
//! `deermem-core` fails to compile here instead of silently vanishing from the wire.

use axum::body::Body;
use axum::http::HeaderValue;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use deermem_core::document::{PublicHistorySummaries, PublicUserSummaries, SummaryEntry};
use deermem_core::{FactScope, PublicFact, PublicMemoryDocument};

/// A `200 application/json` response holding a memory document in its HTTP shape (the
/// manager-level fact fields dropped, as [`PublicMemoryDocument::for_http`] does).
#[derive(Debug)]
pub(crate) struct JsonDocument(pub(crate) PublicMemoryDocument);

impl IntoResponse for JsonDocument {
    fn into_response(self) -> Response {
        json_response(document_bytes(&self.0))
    }
}

/// A `200 application/json` response over already serialised bytes.
pub(crate) fn json_response(bytes: Vec<u8>) -> Response {
    let mut resp = Response::new(Body::from(bytes));
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// The document's HTTP body.
pub(crate) fn document_bytes(doc: &PublicMemoryDocument) -> Vec<u8> {
    let mut out = Vec::with_capacity(size_hint(doc));
    write_document(&mut out, doc);
    out
}

/// A generous estimate of the body size, so the buffer is allocated once: the variable text
/// plus a fixed allowance per fact for keys, time stamps, numbers and punctuation.
pub(crate) fn size_hint(doc: &PublicMemoryDocument) -> usize {
    /// Keys, punctuation, ids, time stamps and numbers of one fact, with slack.
    const PER_FACT: usize = 448;
    /// Everything outside the facts array, with slack.
    const FIXED: usize = 1024;
    let summaries = [
        &doc.user.work_context,
        &doc.user.personal_context,
        &doc.user.top_of_mind,
        &doc.history.recent_months,
        &doc.history.earlier_context,
        &doc.history.long_term_background,
    ]
    .iter()
    .map(|e| e.summary.len() + e.updated_at.len())
    .sum::<usize>();
    let facts = doc
        .facts
        .iter()
        .map(|f| {
            PER_FACT
                + f.content.len()
                + f.category.len()
                + f.source.len()
                + f.source_error.as_ref().map_or(0, String::len)
                + f.category_extension.as_ref().map_or(0, String::len)
                + f.topics
                    .as_ref()
                    .map_or(0, |t| t.iter().map(|s| s.len() + 3).sum())
                + f.consolidated_from
                    .as_ref()
                    .map_or(0, |t| t.iter().map(|s| s.len() + 3).sum())
        })
        .sum::<usize>();
    // Escapes can grow a string up to six times; a larger body just regrows once.
    FIXED + summaries + facts
}

/// Appends a float the way `serde_json` writes it (shortest round-trip form; `null` for a
/// non-finite value).
fn write_f64(out: &mut Vec<u8>, v: f64) {
    // Writing a number into a Vec cannot fail; `null` stands in should it ever.
    if serde_json::to_writer(&mut *out, &v).is_err() {
        out.extend_from_slice(b"null");
    }
}

/// Appends an unsigned integer in decimal (what `serde_json` writes).
fn write_u64(out: &mut Vec<u8>, v: u64) {
    let mut digits = [0u8; 20];
    let mut n = v;
    let mut at = digits.len();
    loop {
        at -= 1;
        // `n % 10` is below 10.
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// `"key":` (keys here are fixed ASCII names that need no escaping).
fn key(out: &mut Vec<u8>, first: &mut bool, name: &str) {
    if !std::mem::take(first) {
        out.push(b',');
    }
    out.push(b'"');
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\":");
}

fn write_opt_str(out: &mut Vec<u8>, v: Option<&String>) {
    match v {
        Some(s) => write_str(out, s),
        None => out.extend_from_slice(b"null"),
    }
}

fn write_str_list(out: &mut Vec<u8>, items: &[String]) {
    out.push(b'[');
    for (i, s) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_str(out, s);
    }
    out.push(b']');
}

fn write_entry(out: &mut Vec<u8>, e: &SummaryEntry) {
    let SummaryEntry {
        summary,
        updated_at,
    } = e;
    out.extend_from_slice(b"{\"summary\":");
    write_str(out, summary);
    out.extend_from_slice(b",\"updatedAt\":");
    write_str(out, updated_at);
    out.push(b'}');
}

fn write_user(out: &mut Vec<u8>, u: &PublicUserSummaries) {
    let PublicUserSummaries {
        work_context,
        personal_context,
        top_of_mind,
    } = u;
    out.extend_from_slice(b"{\"workContext\":");
    write_entry(out, work_context);
    out.extend_from_slice(b",\"personalContext\":");
    write_entry(out, personal_context);
    out.extend_from_slice(b",\"topOfMind\":");
    write_entry(out, top_of_mind);
    out.push(b'}');
}

fn write_history(out: &mut Vec<u8>, h: &PublicHistorySummaries) {
    let PublicHistorySummaries {
        recent_months,
        earlier_context,
        long_term_background,
    } = h;
    out.extend_from_slice(b"{\"recentMonths\":");
    write_entry(out, recent_months);
    out.extend_from_slice(b",\"earlierContext\":");
    write_entry(out, earlier_context);
    out.extend_from_slice(b",\"longTermBackground\":");
    write_entry(out, long_term_background);
    out.push(b'}');
}

fn write_scope(out: &mut Vec<u8>, s: &FactScope) {
    let FactScope {
        user_id,
        agent_name,
    } = s;
    out.extend_from_slice(b"{\"userId\":");
    write_opt_str(out, user_id.as_ref());
    out.extend_from_slice(b",\"agentName\":");
    write_opt_str(out, agent_name.as_ref());
    out.push(b'}');
}

/// One fact in the HTTP shape: `title`, `expected_valid_days`, `lastConfirmedAt` and
/// `confirmationCount` are left out (what `PublicFact::for_http` clears); other `None`
/// options are skipped as their serde attributes say.
fn write_fact(out: &mut Vec<u8>, f: &PublicFact) {
    let PublicFact {
        id,
        content,
        category,
        category_extension,
        topics,
        confidence,
        created_at,
        source,
        source_error,
        schema_version,
        status,
        scope,
        revision,
        updated_at,
        consolidated_at,
        consolidated_from,
        title: _,
        expected_valid_days: _,
        last_confirmed_at: _,
        confirmation_count: _,
    } = f;
    let first = &mut true;
    out.push(b'{');
    key(out, first, "id");
    write_str(out, id);
    key(out, first, "content");
    write_str(out, content);
    key(out, first, "category");
    write_str(out, category);
    if let Some(v) = category_extension {
        key(out, first, "categoryExtension");
        write_str(out, v);
    }
    if let Some(v) = topics {
        key(out, first, "topics");
        write_str_list(out, v);
    }
    key(out, first, "confidence");
    write_f64(out, *confidence);
    key(out, first, "createdAt");
    write_str(out, created_at);
    key(out, first, "source");
    write_str(out, source);
    if let Some(v) = source_error {
        key(out, first, "sourceError");
        write_str(out, v);
    }
    if let Some(v) = schema_version {
        key(out, first, "schemaVersion");
        write_u64(out, *v);
    }
    if let Some(v) = status {
        key(out, first, "status");
        write_str(out, v);
    }
    if let Some(v) = scope {
        key(out, first, "scope");
        write_scope(out, v);
    }
    if let Some(v) = revision {
        key(out, first, "revision");
        write_u64(out, *v);
    }
    if let Some(v) = updated_at {
        key(out, first, "updatedAt");
        write_str(out, v);
    }
    if let Some(v) = consolidated_at {
        key(out, first, "consolidatedAt");
        write_str(out, v);
    }
    if let Some(v) = consolidated_from {
        key(out, first, "consolidatedFrom");
        write_str_list(out, v);
    }
    out.push(b'}');
}

/// The whole document in its HTTP shape.
pub(crate) fn write_document(out: &mut Vec<u8>, doc: &PublicMemoryDocument) {
    let PublicMemoryDocument {
        version,
        revision,
        last_updated,
        user,
        history,
        facts,
    } = doc;
    out.extend_from_slice(b"{\"version\":");
    write_str(out, version);
    if let Some(r) = revision {
        out.extend_from_slice(b",\"revision\":");
        write_u64(out, *r);
    }
    out.extend_from_slice(b",\"lastUpdated\":");
    write_str(out, last_updated);
    out.extend_from_slice(b",\"user\":");
    write_user(out, user);
    out.extend_from_slice(b",\"history\":");
    write_history(out, history);
    out.extend_from_slice(b",\"facts\":[");
    for (i, f) in facts.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_fact(out, f);
    }
    out.extend_from_slice(b"]}");
}

/// Whether a byte must be escaped in a JSON string: control characters, `"` and `\`.
fn needs_escape(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\'
}

/// Whether any of the eight bytes of `w` needs escaping. Exact for "any" (the per-byte
/// high bits may be wrong above a hit, which is why a hit is rescanned byte by byte).
fn word_needs_escape(w: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // A byte below 0x20: subtracting 0x20 borrows into its high bit (which was clear).
    let control = w.wrapping_sub(ONES * 0x20) & !w & HIGH;
    let quote = w ^ (ONES * u64::from(b'"'));
    let backslash = w ^ (ONES * u64::from(b'\\'));
    let has_zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGH;
    (control | has_zero(quote) | has_zero(backslash)) != 0
}

/// Appends `s` as a JSON string exactly as `serde_json` escapes it: `\"`, `\\`, `\b`, `\f`,
/// `\n`, `\r`, `\t`, other control characters as `\u00xx` (lowercase hex); everything else,
/// non-ASCII included, verbatim.
pub(crate) fn write_str(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        if let Some(chunk) = bytes.get(i..i + 8) {
            let mut w = [0u8; 8];
            w.copy_from_slice(chunk);
            if !word_needs_escape(u64::from_le_bytes(w)) {
                i += 8;
                continue;
            }
        }
        let end = (i + 8).min(bytes.len());
        while i < end {
            let b = bytes[i];
            if needs_escape(b) {
                out.extend_from_slice(&bytes[start..i]);
                push_escape(out, b);
                start = i + 1;
            }
            i += 1;
        }
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

fn push_escape(out: &mut Vec<u8>, b: u8) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    match b {
        b'"' => out.extend_from_slice(b"\\\""),
        b'\\' => out.extend_from_slice(b"\\\\"),
        0x08 => out.extend_from_slice(b"\\b"),
        0x0c => out.extend_from_slice(b"\\f"),
        b'\n' => out.extend_from_slice(b"\\n"),
        b'\r' => out.extend_from_slice(b"\\r"),
        b'\t' => out.extend_from_slice(b"\\t"),
        _ => out.extend_from_slice(&[
            b'\\',
            b'u',
            b'0',
            b'0',
            HEX[usize::from(b >> 4)],
            HEX[usize::from(b & 0xf)],
        ]),
    }
}

#[cfg(test)]
mod tests {
    use deermem_core::document::SummaryEntry;
    use serde_json::json;

    use super::*;

    fn fact(i: usize, content: &str) -> PublicFact {
        PublicFact {
            id: format!("fact_{i:08x}"),
            content: content.to_owned(),
            category: "preference".into(),
            category_extension: (i.is_multiple_of(3)).then(|| "hobby \"x\"".to_owned()),
            topics: (i.is_multiple_of(2)).then(|| vec!["tools".to_owned(), "é\u{1}".to_owned()]),
            confidence: [0.5, 0.9, 1.0, 0.0, 0.123_456_789, 1e-7][i % 6],
            created_at: "2026-01-02T03:04:05.678901Z".into(),
            source: if i.is_multiple_of(4) {
                "thread-1"
            } else {
                "unknown"
            }
            .into(),
            source_error: (i.is_multiple_of(5)).then(|| "was\twrong\n".to_owned()),
            schema_version: (!i.is_multiple_of(7)).then_some(2),
            status: (i % 7 != 1).then(|| "active".to_owned()),
            scope: (i % 7 != 2).then(|| FactScope {
                user_id: (i.is_multiple_of(2)).then(|| "alice".to_owned()),
                agent_name: Some("__default__".to_owned()),
            }),
            revision: (i % 7 != 3).then_some(u64::MAX - i as u64),
            updated_at: (i % 7 != 4).then(|| "2026-01-02T03:04:05Z".to_owned()),
            consolidated_at: (i % 7 == 5).then(|| "2026-02-02T00:00:00Z".to_owned()),
            consolidated_from: (i % 7 != 6).then(|| vec![format!("fact_{i:x}")]),
            title: Some("a title".into()),
            expected_valid_days: Some(json!(30)),
            last_confirmed_at: Some("2026-03-01T00:00:00Z".into()),
            confirmation_count: Some(3),
        }
    }

    fn entry(s: &str) -> SummaryEntry {
        SummaryEntry {
            summary: s.to_owned(),
            updated_at: "2026-01-01T00:00:00Z".to_owned(),
        }
    }

    fn doc(contents: &[&str]) -> PublicMemoryDocument {
        let mut d = PublicMemoryDocument::empty();
        d.revision = Some(42);
        d.last_updated = "2026-04-05T06:07:08Z".into();
        d.user.work_context = entry("Builds \"memory\" engines\\in Rust.");
        d.history.long_term_background = entry("line one\nline two\u{7f}\u{1f}");
        d.facts = contents
            .iter()
            .enumerate()
            .map(|(i, c)| fact(i, c))
            .collect();
        d
    }

    fn reference(d: &PublicMemoryDocument) -> Vec<u8> {
        serde_json::to_vec(&d.clone().for_http()).unwrap()
    }

    #[test]
    fn bytes_match_serde_json_of_the_http_shape() {
        let tricky = [
            "",
            "plain ascii text that is longer than eight bytes",
            "\"",
            "\\",
            "ends with a quote\"",
            "\u{0}\u{1}\u{8}\u{9}\u{a}\u{b}\u{c}\u{d}\u{1f} \u{7f}",
            "日本語のテキストと絵文字 🦌 mixed with ASCII",
            "1234567\"",
            "12345678\\",
            "é\"é\\é\né",
            "\u{2028}\u{2029}</script>",
        ];
        let d = doc(&tricky);
        assert_eq!(
            String::from_utf8(document_bytes(&d)).unwrap(),
            String::from_utf8(reference(&d)).unwrap()
        );
        let empty = PublicMemoryDocument::empty();
        assert_eq!(document_bytes(&empty), reference(&empty));
    }

    #[test]
    fn every_string_of_ascii_and_controls_escapes_like_serde_json() {
        // Each byte value at each offset of a 17-byte string (covers word boundaries).
        for b in 0u8..0x80 {
            for at in 0..17 {
                let mut s = vec![b'a'; 17];
                s[at] = b;
                let s = String::from_utf8(s).unwrap();
                let mut out = Vec::new();
                write_str(&mut out, &s);
                assert_eq!(out, serde_json::to_vec(&s).unwrap(), "byte {b:#x} at {at}");
            }
        }
    }

    #[test]
    fn the_size_hint_covers_a_typical_document() {
        let content = "The user prefers short answers with code samples in Rust.";
        let d = doc(&[content; 100]);
        assert!(size_hint(&d) >= document_bytes(&d).len());
    }

    #[test]
    fn non_finite_confidence_is_null_like_serde_json() {
        let mut d = doc(&["x"]);
        d.facts[0].confidence = f64::NAN;
        assert_eq!(document_bytes(&d), reference(&d));
    }
}
