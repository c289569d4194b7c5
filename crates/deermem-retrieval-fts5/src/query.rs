//! Query sanitisation: the reference's advanced-syntax detection and quoted-OR fallback
//! (a query that looks like FTS5 syntax passes through, anything else becomes a quoted OR of its
//! words), extended so that CJK runs in a query search the bigram column.
//!
//! The terms of a plain query are the core's shared rule (`deermem_core::policy::text::terms`);
//! this module writes them as FTS5 strings. For a query without CJK letters the expressions are
//! exactly the reference's. CJK runs become terms over the `cjk` column: a run of one character
//! is a prefix term (`"茶"*`), a run of two is its bigram (`"東京"`), and a longer run is the
//! phrase of its bigrams (an exact substring match, ranked first) OR'ed with each bigram
//! (partial matches, ranked lower), which is how the reference's OR-of-words treats English.

use deermem_core::policy::text::terms::{self, Term};
use deermem_pycompat::py;

use crate::cjk;

pub use deermem_core::policy::text::terms::{
    MAX_PHRASE_BIGRAMS, MAX_TERMS, NoSegmenter, Segmenter, py_split,
};

/// Longest query (in bytes) passed through as FTS5 syntax; longer ones are searched as words.
pub const MAX_ADVANCED_BYTES: usize = 4096;

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

/// Quotes one token as an FTS5 string, doubling inner quotes.
fn quote(token: &str) -> String {
    format!("\"{}\"", token.replace('"', "\"\""))
}

/// One shared term as an FTS5 expression: a quoted string (a phrase of bigrams for CJK), or a
/// quoted prefix for a single CJK character.
fn fts5_term(term: &Term) -> String {
    match term {
        Term::Word(w) => quote(w),
        Term::Grams(g) => quote(&g.join(" ")),
        Term::Prefix(p) => format!("{}*", quote(p)),
    }
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

/// The plain-words expression: the shared terms of the query (the reference's fallback for
/// tokens without CJK letters, CJK terms for the runs inside tokens), each written as an FTS5
/// string, joined with `OR`. `""` when nothing searchable is left.
pub fn plain_expression(q: &str, seg: &dyn Segmenter) -> String {
    terms::plain_terms(q, seg)
        .iter()
        .map(fts5_term)
        .collect::<Vec<_>>()
        .join(" OR ")
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
                out.push_str(&fts5_term(&terms::run_phrase(&run)));
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
    /// Whether `first` is the plain-words expression (an OR of terms: every document holding
    /// a term matches it), not the query's own FTS5 syntax.
    pub first_is_plain: bool,
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
        let first_is_plain = !plain.is_empty() && plain == first;
        let retry = (!plain.is_empty() && plain != first).then_some(plain);
        return Some(QueryPlan {
            first,
            retry,
            has_cjk,
            first_is_plain,
        });
    }
    if plain.is_empty() {
        return None;
    }
    Some(QueryPlan {
        first: plain,
        retry: None,
        has_cjk,
        first_is_plain: true,
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
