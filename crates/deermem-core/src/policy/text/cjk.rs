//! CJK text handling: which characters count as Chinese/Japanese/Korean, splitting text into
//! CJK runs and other text, and the overlapping bigrams every full-text index stores for them.
//!
//! A word tokenizer (SQLite's `unicode61`, PostgreSQL's default parser) makes a whole run of
//! Han, kana or Hangul characters one token, so `乌龙茶` never matches `用户喜欢喝乌龙茶`. The
//! indexes therefore store CJK runs apart from the rest of the text, as overlapping bigrams
//! followed by the run's last character: `乌龙茶` is indexed as `乌龙 龙茶 茶`. Any substring of
//! two or more characters of a run is then a phrase of consecutive bigrams, and a single
//! character is a prefix of some token.

/// Whether `c` is a CJK letter: Han ideographs (with the iteration and closing marks),
/// hiragana, katakana (full and half width, with the prolonged sound mark), bopomofo and Hangul.
///
/// CJK punctuation (`。`, `、`, `・`, brackets) and symbols are not letters: they end a run.
pub fn is_cjk(c: char) -> bool {
    if (c as u32) < 0x1100 {
        return false;
    }
    matches!(
        c as u32,
        0x1100..=0x11FF         // Hangul Jamo
        | 0x3005..=0x3007       // 々 〆 〇
        | 0x3021..=0x3029       // Hangzhou numerals
        | 0x3031..=0x3035       // vertical kana repeat marks
        | 0x3038..=0x303C       // Han numerals and masu mark
        | 0x3041..=0x3096       // hiragana
        | 0x309D..=0x309F       // hiragana iteration marks
        | 0x30A1..=0x30FA       // katakana
        | 0x30FC..=0x30FF       // prolonged sound mark, katakana iteration marks
        | 0x3105..=0x312F       // bopomofo
        | 0x3131..=0x318E       // Hangul compatibility Jamo
        | 0x31A0..=0x31BF       // bopomofo extended
        | 0x31F0..=0x31FF       // katakana phonetic extensions
        | 0x3400..=0x4DBF       // CJK extension A
        | 0x4E00..=0x9FFF       // CJK unified ideographs
        | 0xA960..=0xA97F       // Hangul Jamo extended A
        | 0xAC00..=0xD7A3       // Hangul syllables
        | 0xD7B0..=0xD7FF       // Hangul Jamo extended B
        | 0xF900..=0xFAFF       // CJK compatibility ideographs
        | 0xFF66..=0xFF9F       // half-width katakana
        | 0xFFA0..=0xFFDC       // half-width Hangul
        | 0x1B000..=0x1B16F     // kana supplement and extensions
        | 0x20000..=0x2FA1F     // CJK extensions B-F, compatibility supplement
        | 0x30000..=0x323AF // CJK extensions G-H
    )
}

/// Whether `c` is kana or Hangul (text that Chinese word segmentation must not touch).
pub fn is_kana_or_hangul(c: char) -> bool {
    matches!(
        c as u32,
        0x1100..=0x11FF
            | 0x3031..=0x3035
            | 0x3041..=0x30FF
            | 0x3131..=0x318E
            | 0x31F0..=0x31FF
            | 0xA960..=0xA97F
            | 0xAC00..=0xD7FF
            | 0xFF66..=0xFFDC
            | 0x1B000..=0x1B16F
    )
}

/// Whether the text holds at least one CJK letter.
pub fn has_cjk(s: &str) -> bool {
    s.chars().any(is_cjk)
}

/// One piece of text: a maximal run of CJK letters, or the text between such runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Segment<'a> {
    /// A maximal run of CJK letters.
    Cjk(&'a str),
    /// Anything else.
    Other(&'a str),
}

/// Splits `s` into alternating CJK runs and other text, in order; no piece is empty.
pub fn segments(s: &str) -> Vec<Segment<'_>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut current: Option<bool> = None;
    for (i, c) in s.char_indices() {
        let cjk = is_cjk(c);
        match current {
            Some(k) if k == cjk => {}
            Some(k) => {
                out.push(piece(&s[start..i], k));
                start = i;
                current = Some(cjk);
            }
            None => current = Some(cjk),
        }
    }
    if let Some(k) = current {
        out.push(piece(&s[start..], k));
    }
    out
}

fn piece(s: &str, cjk: bool) -> Segment<'_> {
    if cjk {
        Segment::Cjk(s)
    } else {
        Segment::Other(s)
    }
}

/// The overlapping bigrams of a run, as slices of it; empty for a single character.
pub fn bigrams(run: &str) -> Vec<&str> {
    let bounds: Vec<usize> = run
        .char_indices()
        .map(|(i, _)| i)
        .chain(std::iter::once(run.len()))
        .collect();
    if bounds.len() < 3 {
        return Vec::new();
    }
    (0..bounds.len() - 2)
        .map(|i| &run[bounds[i]..bounds[i + 2]])
        .collect()
}

/// The text of a fact as the two indexed parts hold it: the body (the text with every CJK run
/// replaced by a space, tokenized into words like the reference) and the CJK part (each run's
/// bigrams followed by its last character, space separated).
pub fn index_columns(content: &str) -> (String, String) {
    let mut body = String::with_capacity(content.len());
    let mut grams = String::new();
    for seg in segments(content) {
        match seg {
            Segment::Other(s) => body.push_str(s),
            Segment::Cjk(run) => {
                body.push(' ');
                for g in bigrams(run) {
                    grams.push_str(g);
                    grams.push(' ');
                }
                if let Some(last) = run.chars().last() {
                    grams.push(last);
                    grams.push(' ');
                }
            }
        }
    }
    (body, grams)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_scripts() {
        for c in ['乌', '東', 'に', 'カ', 'ー', '々', '서', 'ｶ', '〇'] {
            assert!(is_cjk(c), "{c} is CJK");
        }
        for c in ['a', 'é', '1', '。', '、', '・', '「', ' ', '！', '🦌', '_'] {
            assert!(!is_cjk(c), "{c} is not CJK");
        }
        assert!(is_kana_or_hangul('に') && is_kana_or_hangul('서'));
        assert!(!is_kana_or_hangul('東'));
    }

    #[test]
    fn splits_runs() {
        assert_eq!(
            segments("Rust东京, 乌龙茶!"),
            vec![
                Segment::Other("Rust"),
                Segment::Cjk("东京"),
                Segment::Other(", "),
                Segment::Cjk("乌龙茶"),
                Segment::Other("!"),
            ]
        );
        assert!(segments("").is_empty());
        assert_eq!(segments("abc"), vec![Segment::Other("abc")]);
    }

    #[test]
    fn bigrams_overlap() {
        assert_eq!(bigrams("乌龙茶"), vec!["乌龙", "龙茶"]);
        assert_eq!(bigrams("東京"), vec!["東京"]);
        assert!(bigrams("茶").is_empty());
        assert!(bigrams("").is_empty());
    }

    #[test]
    fn index_columns_separate_scripts() {
        let (body, grams) = index_columns("用户喜欢Rust。東京に住んでいる");
        assert_eq!(body, " Rust。 ");
        assert_eq!(
            grams,
            "用户 户喜 喜欢 欢 東京 京に に住 住ん んで でい いる る "
        );
        let (body, grams) = index_columns("plain english");
        assert_eq!(body, "plain english");
        assert!(grams.is_empty());
    }
}
