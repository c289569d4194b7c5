//! Words as the FTS5 index sees them, for indexes that must tokenize text themselves (the
//! PostgreSQL adapter): SQLite's `unicode61` rule with its defaults. A word starts with a letter,
//! a number or a private-use character and continues through those and combining diacritics; it
//! is lower-cased, and diacritics are removed (combining marks dropped, precomposed Latin-1 and
//! Latin Extended-A letters replaced by their base letter).
//!
//! [`index_text`] is the indexed text of a fact's content: its words (CJK runs cut out), then
//! its CJK bigrams (see [`super::cjk`]), space separated, so that every token is one word to any
//! word parser and positions run in the order FTS5 gives its two columns.

use deermem_pycompat::py;

use super::cjk;
use super::terms::TermMatch;

/// Whether `c` can start a word: a letter or number (Python's `str.isalnum`), or a private-use
/// character (`unicode61`'s default categories `L* N* Co`).
pub fn is_word_char(c: char) -> bool {
    py::is_alnum(c)
        || matches!(c as u32, 0xE000..=0xF8FF | 0xF_0000..=0xF_FFFD | 0x10_0000..=0x10_FFFD)
}

/// Whether `c` is a combining diacritic (kept inside a word, then dropped).
fn is_diacritic(c: char) -> bool {
    matches!(c as u32, 0x0300..=0x036F)
}

/// Base letters of the lower-case Latin-1 Supplement letters U+00E0..=U+00FF (`_` keeps the
/// letter: it has no decomposition).
const LATIN1_BASE: &str = "aaaaaa_ceeeeiiii_nooooo__uuuuy_y";
/// Base letters of Latin Extended-A U+0100..=U+017F (`_` keeps the letter).
const LATIN_EXT_A_BASE: &str = "aaaaaaccccccccdd__eeeeeeeeeegggggggghh__iiiiiiiii___jjkk_llllll____nnnnnn___oooooo__rrrrrrsssssssstttt__uuuuuuuuuuuuwwyyyzzzzzz_";

/// The folded form of one word character: lower-cased, diacritics removed.
fn fold(c: char) -> char {
    let mut lower = c.to_lowercase();
    let l = match (lower.next(), lower.next()) {
        (Some(l), None) => l,
        _ => c,
    };
    let base = match l as u32 {
        0xE0..=0xFF => LATIN1_BASE.chars().nth((l as u32 - 0xE0) as usize),
        0x100..=0x17F => LATIN_EXT_A_BASE.chars().nth((l as u32 - 0x100) as usize),
        _ => None,
    };
    match base {
        Some(b) if b != '_' => b,
        _ => l,
    }
}

/// The words of `text`, folded, in order.
pub fn words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for c in text.chars() {
        if is_word_char(c) {
            current.push(fold(c));
        } else if is_diacritic(c) && !current.is_empty() {
            // Inside a word: removed.
        } else if !current.is_empty() {
            out.push(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// The indexed text of a fact's content: its words outside CJK runs, then each CJK run's
/// bigrams followed by its last character, all separated by single spaces; with its number of
/// tokens.
pub fn index_text(content: &str) -> (String, usize) {
    let (body, grams) = cjk::index_columns(content);
    let mut tokens = words(&body);
    tokens.extend(
        grams
            .split(' ')
            .filter(|g| !g.is_empty())
            .map(str::to_owned),
    );
    (tokens.join(" "), tokens.len())
}

/// How often `term` occurs in `tokens` (phrases at consecutive positions, overlapping
/// occurrences counted, as FTS5 counts phrase instances).
pub fn count_matches(tokens: &[&str], term: &TermMatch) -> usize {
    match term {
        TermMatch::Prefix(p) => tokens.iter().filter(|t| t.starts_with(p.as_str())).count(),
        TermMatch::Phrase(words) if words.is_empty() => 0,
        TermMatch::Phrase(words) => tokens
            .windows(words.len())
            .filter(|w| w.iter().zip(words).all(|(a, b)| *a == b.as_str()))
            .count(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_follow_unicode61() {
        assert_eq!(
            words("Real-time co_pilot, node.js! C++ x²"),
            vec!["real", "time", "co", "pilot", "node", "js", "c", "x²"]
        );
        assert_eq!(
            words("Café NAÏVE Ångström Łódź"),
            vec!["cafe", "naive", "angstrom", "łodz"]
        );
        assert_eq!(words("e\u{301}\u{301}x \u{301}"), vec!["ex"]);
        assert_eq!(words("ǅ ß Straße"), vec!["ǆ", "ß", "straße"]);
        assert!(words(" '\";--\\%_$$ ").is_empty());
    }

    #[test]
    fn latin_tables_cover_their_ranges() {
        assert_eq!(LATIN1_BASE.chars().count(), 0x20);
        assert_eq!(LATIN_EXT_A_BASE.chars().count(), 0x80);
        assert_eq!(fold('Ž'), 'z');
        assert_eq!(fold('ÿ'), 'y');
        assert_eq!(fold('÷'), '÷');
        assert_eq!(fold('Œ'), 'œ');
    }

    #[test]
    fn index_text_puts_words_before_bigrams() {
        let (text, n) = index_text("用户喜欢Rust。東京に住んでいる");
        assert_eq!(
            text,
            "rust 用户 户喜 喜欢 欢 東京 京に に住 住ん んで でい いる る"
        );
        assert_eq!(n, 13);
        assert_eq!(index_text(""), (String::new(), 0));
    }

    #[test]
    fn counts_phrases_and_prefixes() {
        let toks = ["a", "b", "a", "b", "a", "茶", "茶x"];
        let p = |w: &[&str]| TermMatch::Phrase(w.iter().map(|s| (*s).to_owned()).collect());
        assert_eq!(count_matches(&toks, &p(&["a", "b"])), 2);
        assert_eq!(count_matches(&toks, &p(&["a"])), 3);
        assert_eq!(
            count_matches(&toks, &p(&["b", "a", "b", "a", "茶", "茶x", "z"])),
            0
        );
        assert_eq!(count_matches(&toks, &TermMatch::Prefix("茶".into())), 2);
    }
}
