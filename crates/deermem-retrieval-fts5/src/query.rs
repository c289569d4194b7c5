//! Query sanitisation: the reference's advanced-syntax detection and quoted-OR fallback
//! (a query that looks like FTS5 syntax passes through, anything else becomes a quoted OR of its
//! words), extended so that CJK runs in a query search the bigram column.
//!
//! For a query without CJK letters the expressions are exactly the reference's. CJK runs become
//! terms over the `cjk` column: a run of one character is a prefix term (`"茶"*`), a run of two
//! is its bigram (`"東京"`), and a longer run is the phrase of its bigrams (an exact substring
//! match, ranked first) OR'ed with each bigram (partial matches, ranked lower), which is how the
//! reference's OR-of-words treats English.

use deermem_pycompat::py;

use crate::cjk::{self, Segment};

/// Most OR terms one plain query expands to; longer queries keep their first distinct terms.
pub const MAX_TERMS: usize = 128;

/// Longest query (in bytes) passed through as FTS5 syntax; longer ones are searched as words.
pub const MAX_ADVANCED_BYTES: usize = 4096;

/// Longest CJK run (in bigrams) also searched as one exact phrase; longer runs are searched
/// by their bigrams only (no fact is likely to contain such a run verbatim).
pub const MAX_PHRASE_BIGRAMS: usize = 64;

/// Python's `\w` for one character: `str.isalnum()` or `_`.
fn is_word(c: char) -> bool {
    c == '_' || py::is_alnum(c)
}

/// Whether the reference treats `q` as FTS5 syntax: Python's
/// `re.search(r'(\bAND\b|\bOR\b|\bNOT\b|\bNEAR\b|"\w.*?"|\w+\*|\(.*?\))', q)` with Unicode
/// `\w`/`\b` and `.` not matching a newline. Linear in the length of `q`.
pub fn is_advanced_query(q: &str) -> bool {
    let chars: Vec<char> = q.chars().collect();
    let n = chars.len();
    // next_x[i]: the first index >= i holding x (n when none).
    let next_of = |target: char| -> Vec<usize> {
        let mut v = vec![n; n + 1];
        for i in (0..n).rev() {
            v[i] = if chars[i] == target { i } else { v[i + 1] };
        }
        v
    };
    let next_quote = next_of('"');
    let next_close = next_of(')');
    let next_newline = next_of('\n');
    let word_at = |i: usize| i < n && is_word(chars[i]);
    const KEYWORDS: [&[char]; 4] = [
        &['A', 'N', 'D'],
        &['O', 'R'],
        &['N', 'O', 'T'],
        &['N', 'E', 'A', 'R'],
    ];
    for i in 0..n {
        let c = chars[i];
        if matches!(c, 'A' | 'O' | 'N') && (i == 0 || !word_at(i - 1)) {
            for kw in KEYWORDS {
                let end = i + kw.len();
                if end <= n && chars[i..end] == *kw && !word_at(end) {
                    return true;
                }
            }
        }
        if c == '"' && word_at(i + 1) && next_quote[i + 2] < next_newline[i + 2] {
            return true;
        }
        if is_word(c) && i + 1 < n && chars[i + 1] == '*' {
            return true;
        }
        if c == '(' && next_close[i + 1] < next_newline[i + 1] {
            return true;
        }
    }
    false
}

/// Python's `str.split()` with no arguments.
pub fn py_split(q: &str) -> impl Iterator<Item = &str> {
    q.split(py::is_space).filter(|t| !t.is_empty())
}

/// Quotes one token as an FTS5 string, doubling inner quotes.
fn quote(token: &str) -> String {
    format!("\"{}\"", token.replace('"', "\"\""))
}

/// The reference's fallback expression (without word segmentation): the whitespace tokens that
/// hold an alphanumeric character, each quoted, joined with `OR`; `""` when none is left.
pub fn reference_fallback(q: &str) -> String {
    py_split(q)
        .filter(|t| t.chars().any(py::is_alnum))
        .map(quote)
        .collect::<Vec<_>>()
        .join(" OR ")
}

/// Splits a CJK run into the words it should be searched as.
pub trait Segmenter: Send + Sync {
    /// The words of a run of CJK letters, in order (each a non-empty substring of `run`).
    fn words<'a>(&self, run: &'a str) -> Vec<&'a str>;
}

/// No word segmentation: a run is one word.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoSegmenter;

impl Segmenter for NoSegmenter {
    fn words<'a>(&self, run: &'a str) -> Vec<&'a str> {
        vec![run]
    }
}

/// Appends the terms searching one CJK run (see the module docs).
fn push_cjk_terms(run: &str, seg: &dyn Segmenter, out: &mut Vec<String>) {
    let words: Vec<&str> = seg.words(run);
    let multi: Vec<&str> = words
        .iter()
        .copied()
        .filter(|w| w.chars().nth(1).is_some() && w.chars().all(cjk::is_cjk))
        .collect();
    if words.len() > 1 && !multi.is_empty() {
        // Segmented: each word of two or more characters as an exact phrase.
        for w in multi {
            push_unique(out, phrase_of_bigrams(w));
        }
        let n = run.chars().count();
        if n > 2 && n <= MAX_PHRASE_BIGRAMS + 1 {
            push_unique(out, phrase_of_bigrams(run));
        }
        return;
    }
    let grams = cjk::bigrams(run);
    match grams.len() {
        0 => push_unique(out, format!("\"{run}\"*")),
        1 => push_unique(out, quote(grams[0])),
        n => {
            if n <= MAX_PHRASE_BIGRAMS {
                push_unique(out, phrase_of_bigrams(run));
            }
            for g in grams {
                push_unique(out, quote(g));
            }
        }
    }
}

fn phrase_of_bigrams(run: &str) -> String {
    let grams = cjk::bigrams(run);
    if grams.is_empty() {
        return format!("\"{run}\"*");
    }
    format!("\"{}\"", grams.join(" "))
}

fn push_unique(out: &mut Vec<String>, term: String) {
    if !out.contains(&term) {
        out.push(term);
    }
}

/// The plain-words expression: the reference's fallback for tokens without CJK letters, and CJK
/// terms for the runs inside tokens. Capped at [`MAX_TERMS`] terms (distinct terms once the
/// query is that long). `""` when nothing searchable is left.
pub fn plain_expression(q: &str, seg: &dyn Segmenter) -> String {
    let mut terms: Vec<String> = Vec::new();
    let mut cjk_terms: Vec<String> = Vec::new();
    for token in py_split(q) {
        if !token.chars().any(py::is_alnum) {
            continue;
        }
        if !cjk::has_cjk(token) {
            terms.push(quote(token));
        } else {
            for piece in cjk::segments(token) {
                match piece {
                    Segment::Other(s) => {
                        if s.chars().any(py::is_alnum) {
                            terms.push(quote(s));
                        }
                    }
                    Segment::Cjk(run) => {
                        let before = cjk_terms.len();
                        push_cjk_terms(run, seg, &mut cjk_terms);
                        terms.extend(cjk_terms[before..].iter().cloned());
                    }
                }
            }
        }
        if terms.len() > MAX_TERMS * 4 {
            break;
        }
    }
    if terms.len() > MAX_TERMS {
        let mut distinct: Vec<String> = Vec::with_capacity(MAX_TERMS);
        for t in terms {
            if distinct.len() == MAX_TERMS {
                break;
            }
            if !distinct.contains(&t) {
                distinct.push(t);
            }
        }
        terms = distinct;
    }
    terms.join(" OR ")
}

/// Rewrites the CJK runs inside an FTS5 expression into bigram terms, leaving everything else
/// as written. Outside a string a run becomes a quoted phrase (a single character a prefix
/// term); inside a string it becomes its space-separated bigrams.
pub fn rewrite_cjk_in_expression(q: &str) -> String {
    let chars: Vec<char> = q.chars().collect();
    let mut out = String::with_capacity(q.len() * 2);
    let mut in_string = false;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' {
            if in_string && chars.get(i + 1) == Some(&'"') {
                out.push_str("\"\"");
                i += 2;
                continue;
            }
            in_string = !in_string;
            out.push('"');
            i += 1;
            continue;
        }
        if cjk::is_cjk(c) {
            let start = i;
            while i < chars.len() && cjk::is_cjk(chars[i]) {
                i += 1;
            }
            let run: String = chars[start..i].iter().collect();
            let grams = cjk::bigrams(&run);
            out.push(' ');
            if in_string {
                if grams.is_empty() {
                    out.push_str(&run);
                } else {
                    out.push_str(&grams.join(" "));
                }
            } else {
                if chars.get(i) == Some(&'*') {
                    i += 1;
                }
                out.push_str(&phrase_of_bigrams(&run));
            }
            out.push(' ');
            continue;
        }
        out.push(c);
        i += 1;
    }
    out
}

/// What to run for one query text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueryPlan {
    /// The expression to run first.
    pub first: String,
    /// The expression to run when `first` is not valid FTS5 syntax.
    pub retry: Option<String>,
    /// Whether the query holds CJK letters (hits may come from the `cjk` column alone).
    pub has_cjk: bool,
}

/// Plans a query: `None` when nothing in it can match (blank, or punctuation only).
pub fn plan(text: &str, seg: &dyn Segmenter) -> Option<QueryPlan> {
    let cleaned;
    let text = if text.contains('\0') {
        cleaned = text.replace('\0', " ");
        cleaned.as_str()
    } else {
        text
    };
    let q = py::strip(text);
    if q.is_empty() {
        return None;
    }
    let has_cjk = cjk::has_cjk(q);
    let plain = plain_expression(q, seg);
    if q.len() <= MAX_ADVANCED_BYTES && is_advanced_query(q) {
        let first = if has_cjk {
            rewrite_cjk_in_expression(q)
        } else {
            q.to_owned()
        };
        let retry = (!plain.is_empty() && plain != first).then_some(plain);
        return Some(QueryPlan {
            first,
            retry,
            has_cjk,
        });
    }
    if plain.is_empty() {
        return None;
    }
    Some(QueryPlan {
        first: plain,
        retry: None,
        has_cjk,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference's sanitisation, on queries whose output was checked against it.
    #[test]
    fn reference_sanitisation_table() {
        let table: [(&str, bool, &str); 11] = [
            (
                "real-time co-pilot node -js +python",
                false,
                r#""real-time" OR "co-pilot" OR "node" OR "-js" OR "+python""#,
            ),
            ("python AND rust", true, r#""python" OR "AND" OR "rust""#),
            ("python and rust", false, r#""python" OR "and" OR "rust""#),
            (
                r#"say "hello world""#,
                true,
                r#""say" OR """hello" OR "world""""#,
            ),
            ("pref*", true, r#""pref*""#),
            ("(optional)", true, r#""(optional)""#),
            ("NOT", true, r#""NOT""#),
            ("C++ OR Rust", true, r#""C++" OR "OR" OR "Rust""#),
            (r#"a"b"#, false, r#""a""b""#),
            ("!!!", false, ""),
            ("_", false, ""),
        ];
        for (q, advanced, fallback) in table {
            assert_eq!(is_advanced_query(q), advanced, "advanced({q:?})");
            assert_eq!(reference_fallback(q), fallback, "fallback({q:?})");
            assert_eq!(plain_expression(q, &NoSegmenter), fallback, "plain({q:?})");
        }
    }

    #[test]
    fn advanced_detection_follows_python_regex() {
        for q in [
            "x NEAR y",
            "ORACLE OR",
            "\"é\"",
            "日本*",
            "(a\n)(b)",
            "a AND",
            "NEAR",
        ] {
            assert!(is_advanced_query(q), "{q:?} is advanced");
        }
        for q in [
            "ANDROID",
            "CANNOT",
            "x_AND_y",
            "and or not",
            "\"a\nb\"",
            "\" a\"",
            "(\n)",
            "(a\n)b)",
            "* a",
            "a *",
            "ÉAND",
            "",
            "((((((",
        ] {
            assert!(!is_advanced_query(q), "{q:?} is not advanced");
        }
    }

    #[test]
    fn python_split_uses_python_whitespace() {
        let v: Vec<&str> = py_split("a\u{3000}b\u{85}c\x1fd  e").collect();
        assert_eq!(v, vec!["a", "b", "c", "d", "e"]);
    }

    #[test]
    fn cjk_terms_for_plain_queries() {
        assert_eq!(
            plain_expression("乌龙茶", &NoSegmenter),
            r#""乌龙 龙茶" OR "乌龙" OR "龙茶""#
        );
        assert_eq!(plain_expression("東京", &NoSegmenter), r#""東京""#);
        assert_eq!(plain_expression("茶", &NoSegmenter), r#""茶"*"#);
        assert_eq!(
            plain_expression("Rust 东京", &NoSegmenter),
            r#""Rust" OR "东京""#
        );
        assert_eq!(
            plain_expression("Rust东京!", &NoSegmenter),
            r#""Rust" OR "东京""#
        );
        assert_eq!(plain_expression("。！", &NoSegmenter), "");
    }

    #[test]
    fn long_queries_are_capped() {
        let q: String = (0..10_000).map(|i| format!("w{i} ")).collect();
        let e = plain_expression(&q, &NoSegmenter);
        assert_eq!(e.matches(" OR ").count(), MAX_TERMS - 1);
        let repeated = "same ".repeat(1000);
        assert_eq!(plain_expression(&repeated, &NoSegmenter), r#""same""#);
        let few = "same same";
        assert_eq!(
            plain_expression(few, &NoSegmenter),
            r#""same" OR "same""#,
            "short queries keep the reference's duplicates"
        );
    }

    #[test]
    fn long_cjk_runs_are_searched_by_distinct_bigrams() {
        let e = plain_expression(&"東".repeat(40_000), &NoSegmenter);
        assert_eq!(e, r#""東東""#);
        let run = format!("一{}", "乌龙茶".repeat(30));
        let e = plain_expression(&run, &NoSegmenter);
        assert!(!e.contains("乌龙 龙茶 茶乌"), "no 90-character phrase: {e}");
        assert!(e.contains(r#""乌龙""#));
    }

    #[test]
    fn rewrites_cjk_inside_expressions() {
        assert_eq!(
            rewrite_cjk_in_expression("乌龙茶 AND rust*"),
            r#" "乌龙 龙茶"  AND rust*"#
        );
        assert_eq!(rewrite_cjk_in_expression("東* OR x"), r#" "東"*  OR x"#);
        assert_eq!(
            rewrite_cjk_in_expression(r#""喝乌龙茶 now""#),
            r#"" 喝乌 乌龙 龙茶  now""#
        );
        assert_eq!(rewrite_cjk_in_expression(r#""a""東""#), r#""a"" 東 ""#);
    }

    #[test]
    fn plans() {
        assert_eq!(plan("   ", &NoSegmenter), None);
        assert_eq!(plan("!!!", &NoSegmenter), None);
        let p = plan("python AND rust", &NoSegmenter).unwrap();
        assert_eq!(p.first, "python AND rust");
        assert_eq!(p.retry.as_deref(), Some(r#""python" OR "AND" OR "rust""#));
        let p = plan("  rust  ", &NoSegmenter).unwrap();
        assert_eq!(p.first, r#""rust""#);
        assert!(p.retry.is_none() && !p.has_cjk);
        let p = plan("a\0b", &NoSegmenter).unwrap();
        assert_eq!(p.first, r#""a" OR "b""#);
        assert!(plan("東京", &NoSegmenter).unwrap().has_cjk);
        let big = format!("({})", "x ".repeat(5000));
        let p = plan(&big, &NoSegmenter).unwrap();
        assert!(p.retry.is_none(), "over-long syntax is searched as words");
    }
}
