//! The query rule every full-text index shares: which terms a plain query text searches for,
//! OR'ed. Each whitespace token holding an alphanumeric character is one term (the reference's
//! quoted OR of words); inside a token, CJK runs become bigram terms (see [`super::cjk`]): a run
//! of one character is a prefix term, a run of two its bigram, and a longer run the phrase of its
//! bigrams (an exact substring match, ranked first) followed by each bigram (partial matches,
//! ranked lower). Long queries keep their first [`MAX_TERMS`] distinct terms.
//!
//! The terms are structured, not syntax: the FTS5 adapter writes each as a quoted FTS5 string,
//! the PostgreSQL adapter as a quoted `tsquery` lexeme, so neither builds the query by pasting
//! user text into its own syntax.

use deermem_pycompat::py;

use super::cjk::{self, Segment};
use super::tokens;

/// Most OR terms one plain query expands to; longer queries keep their first distinct terms.
pub const MAX_TERMS: usize = 128;

/// Longest CJK run (in bigrams) also searched as one exact phrase; longer runs are searched
/// by their bigrams only (no fact is likely to contain such a run verbatim).
pub const MAX_PHRASE_BIGRAMS: usize = 64;

/// One searched term.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Term {
    /// A whitespace token without CJK letters, or the text between the CJK runs of one, as
    /// written (the index splits it into words and searches them as a phrase).
    Word(String),
    /// A phrase of consecutive CJK bigrams (one bigram: that bigram).
    Grams(Vec<String>),
    /// A single CJK character: any indexed bigram (or run end) starting with it.
    Prefix(String),
}

/// What a term matches in the indexed tokens: a phrase of words, or one word's prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TermMatch {
    /// These tokens at consecutive positions (never empty).
    Phrase(Vec<String>),
    /// Any token starting with this text.
    Prefix(String),
}

impl Term {
    /// Whether the term searches CJK text (its hits come from the bigrams).
    pub fn is_cjk(&self) -> bool {
        !matches!(self, Self::Word(_))
    }

    /// What the term matches among the tokens of [`tokens::index_text`]; `None` when the term
    /// holds no word (it then matches nothing).
    pub fn matcher(&self) -> Option<TermMatch> {
        match self {
            Self::Word(w) => {
                let words = tokens::words(w);
                (!words.is_empty()).then_some(TermMatch::Phrase(words))
            }
            Self::Grams(g) => (!g.is_empty()).then(|| TermMatch::Phrase(g.clone())),
            Self::Prefix(p) => (!p.is_empty()).then(|| TermMatch::Prefix(p.clone())),
        }
    }
}

/// Python's `str.split()` with no arguments.
pub fn py_split(q: &str) -> impl Iterator<Item = &str> {
    q.split(py::is_space).filter(|t| !t.is_empty())
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

/// The term searching a whole CJK run exactly: the phrase of its bigrams, or a prefix term for
/// a single character.
pub fn run_phrase(run: &str) -> Term {
    let grams = cjk::bigrams(run);
    if grams.is_empty() {
        return Term::Prefix(run.to_owned());
    }
    Term::Grams(grams.into_iter().map(str::to_owned).collect())
}

/// Appends the terms searching one CJK run (see the module docs).
fn push_cjk_terms(run: &str, seg: &dyn Segmenter, out: &mut Vec<Term>) {
    let words: Vec<&str> = seg.words(run);
    let multi: Vec<&str> = words
        .iter()
        .copied()
        .filter(|w| w.chars().nth(1).is_some() && w.chars().all(cjk::is_cjk))
        .collect();
    if words.len() > 1 && !multi.is_empty() {
        // Segmented: each word of two or more characters as an exact phrase.
        for w in multi {
            push_unique(out, run_phrase(w));
        }
        let n = run.chars().count();
        if n > 2 && n <= MAX_PHRASE_BIGRAMS + 1 {
            push_unique(out, run_phrase(run));
        }
        return;
    }
    let grams = cjk::bigrams(run);
    match grams.len() {
        0 => push_unique(out, Term::Prefix(run.to_owned())),
        1 => push_unique(out, Term::Grams(vec![grams[0].to_owned()])),
        n => {
            if n <= MAX_PHRASE_BIGRAMS {
                push_unique(out, run_phrase(run));
            }
            for g in grams {
                push_unique(out, Term::Grams(vec![g.to_owned()]));
            }
        }
    }
}

fn push_unique(out: &mut Vec<Term>, term: Term) {
    if !out.contains(&term) {
        out.push(term);
    }
}

/// The terms of a plain query, in order: the reference's words for tokens without CJK letters
/// (duplicates kept, as the reference keeps them), CJK terms for the runs inside tokens. Capped
/// at [`MAX_TERMS`] terms (distinct terms once the query is that long). Empty when nothing
/// searchable is left (blank, or punctuation only).
pub fn plain_terms(q: &str, seg: &dyn Segmenter) -> Vec<Term> {
    let mut terms: Vec<Term> = Vec::new();
    let mut cjk_terms: Vec<Term> = Vec::new();
    for token in py_split(q) {
        if !token.chars().any(py::is_alnum) {
            continue;
        }
        if !cjk::has_cjk(token) {
            terms.push(Term::Word(token.to_owned()));
        } else {
            for piece in cjk::segments(token) {
                match piece {
                    Segment::Other(s) => {
                        if s.chars().any(py::is_alnum) {
                            terms.push(Term::Word(s.to_owned()));
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
        let mut distinct: Vec<Term> = Vec::with_capacity(MAX_TERMS);
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
    terms
}

#[cfg(test)]
mod tests {
    use super::*;

    fn word(s: &str) -> Term {
        Term::Word(s.to_owned())
    }

    fn grams(g: &[&str]) -> Term {
        Term::Grams(g.iter().map(|s| (*s).to_owned()).collect())
    }

    #[test]
    fn words_are_whitespace_tokens_with_an_alphanumeric() {
        assert_eq!(
            plain_terms("real-time  node.js -js !!! _ C++", &NoSegmenter),
            vec![word("real-time"), word("node.js"), word("-js"), word("C++")]
        );
        assert!(plain_terms("。！ ... ", &NoSegmenter).is_empty());
    }

    #[test]
    fn cjk_runs_become_bigram_terms() {
        assert_eq!(
            plain_terms("乌龙茶", &NoSegmenter),
            vec![grams(&["乌龙", "龙茶"]), grams(&["乌龙"]), grams(&["龙茶"])]
        );
        assert_eq!(plain_terms("東京", &NoSegmenter), vec![grams(&["東京"])]);
        assert_eq!(
            plain_terms("茶", &NoSegmenter),
            vec![Term::Prefix("茶".into())]
        );
        assert_eq!(
            plain_terms("Rust东京!", &NoSegmenter),
            vec![word("Rust"), grams(&["东京"])]
        );
    }

    #[test]
    fn matchers_split_words_like_the_index() {
        assert_eq!(
            word("Real-Time").matcher(),
            Some(TermMatch::Phrase(vec!["real".into(), "time".into()]))
        );
        assert_eq!(
            Term::Prefix("茶".into()).matcher(),
            Some(TermMatch::Prefix("茶".into()))
        );
        assert_eq!(word("--").matcher(), None);
        assert!(grams(&["東京"]).is_cjk() && !word("x").is_cjk());
    }

    #[test]
    fn long_queries_keep_their_first_distinct_terms() {
        let q: String = (0..10_000).map(|i| format!("w{i} ")).collect();
        assert_eq!(plain_terms(&q, &NoSegmenter).len(), MAX_TERMS);
        let repeated = "same ".repeat(1000);
        assert_eq!(plain_terms(&repeated, &NoSegmenter), vec![word("same")]);
        assert_eq!(
            plain_terms("same same", &NoSegmenter),
            vec![word("same"), word("same")]
        );
    }
}
