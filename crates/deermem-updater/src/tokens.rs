//! Token counting for the injection budget: BPE counting with the `cl100k_base` encoding bundled in
//! `tiktoken-rs` (nothing is downloaded; the table is parsed once, lazily), or the network-free
//! CJK-aware character estimate.
//!
//! BPE counts of short texts are memoised in a bounded process-wide LRU map: the injection
//! formatter counts the same fact lines on every `get_context`, and a lookup costs far less
//! than re-encoding (the count is a pure function of the text, so results are identical).
//!
//! BPE merging costs grow with the square of a pre-token's length, and the encoding's
//! pre-tokenizer keeps a run of letters (CJK text has no spaces), of punctuation or of
//! whitespace as one pre-token: a 20,000-character CJK fact took about a second. Runs of one
//! character class longer than [`MAX_RUN_CHARS`] are therefore cut into pieces of that length,
//! each encoded on its own. Text without such runs counts exactly as the encoding counts it;
//! a cut run counts at most a token or so more per cut, which only matters to a budget as the
//! estimate it already is.

use std::num::NonZeroUsize;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Mutex, OnceLock};

use crate::TokenCounting;
use deermem_core::CacheBound;
use tiktoken_rs::CoreBPE;

static CL100K: OnceLock<Option<CoreBPE>> = OnceLock::new();

/// Texts longer than this (bytes) are not memoised (a whole injection block is a few KiB).
pub(crate) const MEMO_MAX_TEXT_BYTES: usize = 64 * 1024;
/// Memoised counts kept at most.
pub(crate) const MEMO_ENTRIES: usize = 16_384;
/// Bytes of memoised texts kept at most; the least recently used go first.
pub(crate) const MEMO_MAX_BYTES: usize = 8 * 1024 * 1024;

/// The memo: counts by text, and the bytes of the texts it holds.
struct MemoMap {
    counts: lru::LruCache<String, usize>,
    bytes: usize,
}

impl MemoMap {
    fn new() -> Self {
        Self {
            counts: lru::LruCache::new(
                NonZeroUsize::new(MEMO_ENTRIES).unwrap_or(NonZeroUsize::MIN),
            ),
            bytes: 0,
        }
    }

    fn put(&mut self, text: String, n: usize) {
        self.bytes += text.len();
        if let Some((old, _)) = self.counts.push(text, n) {
            self.bytes -= old.len();
        }
        while self.bytes > MEMO_MAX_BYTES {
            match self.counts.pop_lru() {
                Some((old, _)) => self.bytes -= old.len(),
                None => break,
            }
        }
    }
}

/// The name the memo's entries are reported under.
pub const MEMO_ENTRIES_NAME: &str = "updater.token_counts";
/// The name the memo's text bytes are reported under.
pub const MEMO_BYTES_NAME: &str = "updater.token_count_text";

/// The memo's bounds (entries and text bytes, process-wide) and what it holds now.
pub fn memo_bounds() -> [CacheBound; 2] {
    let (entries, bytes) = {
        let m = memo()
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        (m.counts.len(), m.bytes)
    };
    [
        CacheBound::entries(MEMO_ENTRIES_NAME, MEMO_ENTRIES, Some(entries)),
        CacheBound::bytes(
            MEMO_BYTES_NAME,
            MEMO_MAX_BYTES as u64,
            Some(u64::try_from(bytes).unwrap_or(u64::MAX)),
        ),
    ]
}

type Memo = Mutex<MemoMap>;
static MEMO: OnceLock<Memo> = OnceLock::new();

fn memo() -> &'static Memo {
    MEMO.get_or_init(|| Mutex::new(MemoMap::new()))
}

/// The longest run of characters of one class (letters, digits, whitespace, other) that is
/// encoded in one piece; longer runs are cut into pieces of this many characters.
pub(crate) const MAX_RUN_CHARS: usize = 128;

/// The character classes the encoding's pre-tokenizer splits between.
#[derive(Clone, Copy, PartialEq, Eq)]
enum CharClass {
    Letter,
    Digit,
    Space,
    Other,
}

fn char_class(c: char) -> CharClass {
    if c.is_whitespace() {
        CharClass::Space
    } else if c.is_alphabetic() {
        CharClass::Letter
    } else if c.is_numeric() {
        CharClass::Digit
    } else {
        CharClass::Other
    }
}

/// Splits `text` into segments to encode one by one: a cut falls only inside a run of one
/// class longer than [`MAX_RUN_CHARS`] characters (digits are never cut: the encoding already
/// splits them into groups of three). Text without such a run is one segment.
fn segments(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0usize;
    let mut run_class = None;
    let mut run_len = 0usize;
    for (i, c) in text.char_indices() {
        let class = char_class(c);
        if Some(class) == run_class {
            run_len += 1;
            if run_len > MAX_RUN_CHARS && class != CharClass::Digit {
                out.push(&text[start..i]);
                start = i;
                run_len = 1;
            }
        } else {
            run_class = Some(class);
            run_len = 1;
        }
    }
    out.push(&text[start..]);
    out
}

/// The BPE count of `text`, segment by segment (see [`segments`]).
fn encode_count(bpe: &CoreBPE, text: &str) -> usize {
    #[cfg(feature = "test-probe")]
    probe::record(text);
    segments(text)
        .into_iter()
        .map(|segment| bpe.encode_ordinary(segment).len())
        .sum()
}

thread_local! {
    /// Inside [`memo_only`]: whether a count was missing from the memo (`None` outside).
    static MEMO_ONLY: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with BPE counting restricted to the memo on this thread: a text the memo lacks is
/// not encoded (it gets the character estimate) and the miss is reported. `Some(result)` when
/// every count came from the memo, so the result is exactly what full counting gives; `None`
/// when something would have needed encoding (do the work off the async workers then).
pub fn memo_only<T>(f: impl FnOnce() -> T) -> Option<T> {
    let outer = MEMO_ONLY.with(|m| m.replace(Some(false)));
    let result = f();
    let missed = MEMO_ONLY.with(|m| m.replace(outer)) == Some(true);
    (!missed).then_some(result)
}

/// The BPE count of `text`, through the memo for short texts.
fn bpe_count(bpe: &CoreBPE, text: &str) -> usize {
    let encode = || {
        catch_unwind(AssertUnwindSafe(|| encode_count(bpe, text)))
            .unwrap_or_else(|_| char_estimate(text))
    };
    let restricted = MEMO_ONLY.with(std::cell::Cell::get).is_some();
    let missed = || {
        MEMO_ONLY.with(|m| m.set(Some(true)));
        char_estimate(text)
    };
    if text.len() > MEMO_MAX_TEXT_BYTES {
        return if restricted { missed() } else { encode() };
    }
    if let Some(n) = memo()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .counts
        .get(text)
    {
        return *n;
    }
    if restricted {
        return missed();
    }
    let n = encode();
    memo()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .put(text.to_owned(), n);
    n
}

fn encoding() -> Option<&'static CoreBPE> {
    CL100K
        .get_or_init(|| match tiktoken_rs::cl100k_base() {
            Ok(bpe) => Some(bpe),
            Err(e) => {
                tracing::warn!(error = %e, "cl100k_base encoding unavailable; counting tokens by characters");
                None
            }
        })
        .as_ref()
}

/// The exact character estimate: `(code points − cjk) // 4 + cjk // 2`, where CJK counts
/// U+4E00–U+9FFF, U+3040–U+30FF and U+AC00–U+D7A3.
pub fn char_estimate(text: &str) -> usize {
    let mut total = 0usize;
    let mut cjk = 0usize;
    for c in text.chars() {
        total += 1;
        if matches!(c, '\u{4E00}'..='\u{9FFF}' | '\u{3040}'..='\u{30FF}' | '\u{AC00}'..='\u{D7A3}')
        {
            cjk += 1;
        }
    }
    (total - cjk) / 4 + cjk / 2
}

/// A token counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenCounter {
    mode: TokenCounting,
}

impl TokenCounter {
    /// A counter in the given mode.
    pub fn new(mode: TokenCounting) -> Self {
        Self { mode }
    }

    /// The mode.
    pub fn mode(&self) -> TokenCounting {
        self.mode
    }

    /// Counts the tokens of `text`. In `tiktoken` mode the encoding is loaded on first use;
    /// if it cannot be loaded, or encoding fails, the character estimate is used.
    pub fn count(&self, text: &str) -> usize {
        match self.mode {
            TokenCounting::Char => char_estimate(text),
            TokenCounting::Tiktoken => match encoding() {
                Some(bpe) => bpe_count(bpe, text),
                None => char_estimate(text),
            },
        }
    }

    /// Loads the encoding now (on the calling thread) and says whether counting is exact.
    /// `char` mode is always ready and never touches the encoding.
    pub fn warm(&self) -> bool {
        match self.mode {
            TokenCounting::Char => true,
            TokenCounting::Tiktoken => encoding().is_some(),
        }
    }

    /// [`TokenCounter::warm`] on a blocking thread, so an async caller is not stalled while
    /// the table is parsed.
    pub async fn warm_async(&self) -> bool {
        let me = *self;
        tokio::task::spawn_blocking(move || me.warm())
            .await
            .unwrap_or(false)
    }
}

/// Which threads encoded texts holding a marker, so a test can tell where counting ran (the
/// `test-probe` feature, enabled only by the engine's tests).
#[cfg(feature = "test-probe")]
pub mod probe {
    use std::sync::Mutex;
    use std::thread::ThreadId;

    /// Texts holding this are recorded.
    pub const MARKER: &str = "thread-probe-4f1c";

    static SEEN: Mutex<Vec<(String, ThreadId)>> = Mutex::new(Vec::new());

    pub fn record(text: &str) {
        if text.contains(MARKER) {
            SEEN.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((text.to_owned(), std::thread::current().id()));
        }
    }

    /// The threads that counted a text containing `needle`.
    pub fn threads_counting(needle: &str) -> Vec<ThreadId> {
        SEEN.lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(text, _)| text.contains(needle))
            .map(|(_, thread)| *thread)
            .collect()
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn memo_only_answers_from_the_memo_or_reports_the_miss() {
        let counter = TokenCounter::new(TokenCounting::Tiktoken);
        let text = "a text the memo has not seen: memo-only-probe-8a2e";
        assert_eq!(
            memo_only(|| counter.count(text)),
            None,
            "a miss is reported"
        );
        let exact = counter.count(text);
        assert_eq!(memo_only(|| counter.count(text)), Some(exact));
        // Outside memo_only counting is unrestricted again, and nesting restores the outer state.
        let fresh = "another unseen text: memo-only-probe-51c0";
        assert_eq!(memo_only(|| memo_only(|| 1)), Some(Some(1)));
        assert!(counter.count(fresh) > 0);
        assert_eq!(
            memo_only(|| counter.count(fresh)),
            Some(counter.count(fresh))
        );
    }

    use super::*;

    #[test]
    fn char_estimate_matches_the_reference() {
        assert_eq!(char_estimate("hello world"), 2);
        assert_eq!(char_estimate("你好世界abc"), 2);
        assert_eq!(char_estimate("Facts:\n"), 1);
        assert_eq!(char_estimate("\n"), 0);
        assert_eq!(char_estimate("ひらがなカタカナ한국어"), 5);
        assert_eq!(char_estimate(""), 0);
    }

    #[test]
    fn tiktoken_counts_with_the_bundled_encoding() {
        let t = TokenCounter::new(TokenCounting::Tiktoken);
        assert!(t.warm());
        assert_eq!(t.count("hello world"), 2);
        assert_eq!(t.count(""), 0);
        // Special-token text is counted as ordinary text, never an error.
        assert!(t.count("<|endoftext|>") > 1);
        assert!(t.count("用户喜欢喝茶") >= 3);
        let c = TokenCounter::new(TokenCounting::Char);
        assert!(c.warm());
        assert_eq!(c.count("hello world"), 2);
    }

    #[test]
    fn only_long_runs_of_one_class_are_cut() {
        let english = "User prefers concise answers, in English. ".repeat(200);
        assert_eq!(segments(&english), vec![english.as_str()]);
        let cjk: String = "用户喜欢喝乌龙茶".chars().cycle().take(20_000).collect();
        let parts = segments(&cjk);
        assert_eq!(parts.len(), 20_000usize.div_ceil(MAX_RUN_CHARS));
        assert!(parts.iter().all(|p| p.chars().count() <= MAX_RUN_CHARS));
        assert_eq!(parts.concat(), cjk);
        let digits = "1234567890".repeat(100);
        assert_eq!(segments(&digits).len(), 1, "digits are never cut");
        for run in ["!".repeat(1000), " ".repeat(1000), "x".repeat(1000)] {
            let parts = segments(&run);
            assert_eq!(parts.len(), 1000usize.div_ceil(MAX_RUN_CHARS));
            assert_eq!(parts.concat(), run);
        }
        assert_eq!(segments(""), vec![""]);
    }

    #[test]
    fn long_unbroken_text_counts_close_to_the_exact_encoding() {
        let t = TokenCounter::new(TokenCounting::Tiktoken);
        assert!(t.warm());
        let bpe = encoding().unwrap();
        let cjk: String = "用户喜欢喝乌龙茶每天早上跑步"
            .chars()
            .cycle()
            .take(3_000)
            .collect();
        let cuts = segments(&cjk).len() - 1;
        let exact = bpe.encode_ordinary(&cjk).len();
        let counted = t.count(&cjk);
        assert!(counted.abs_diff(exact) <= cuts, "{counted} vs {exact}");
        let dashes = format!("a{}b", "-".repeat(2_000));
        let exact = bpe.encode_ordinary(&dashes).len();
        let counted = t.count(&dashes);
        let cuts = segments(&dashes).len() - 1;
        assert!(counted.abs_diff(exact) <= cuts, "{counted} vs {exact}");
    }

    #[test]
    fn memoised_counts_equal_fresh_encodings() {
        let t = TokenCounter::new(TokenCounting::Tiktoken);
        assert!(t.warm());
        let bpe = encoding().unwrap();
        let long = "word ".repeat(MEMO_MAX_TEXT_BYTES / 4);
        let texts = [
            "- [preference | 0.92] User prefers Go for new services",
            "用户喜欢喝乌龙茶，每天早上跑步",
            "Facts:\n",
            long.as_str(),
        ];
        for text in texts {
            let fresh = bpe.encode_ordinary(text).len();
            // The first call fills the memo, the second reads it.
            assert_eq!(t.count(text), fresh, "{text:?}");
            assert_eq!(t.count(text), fresh, "{text:?}");
        }
        let memo = memo().lock().unwrap();
        assert!(memo.counts.contains(texts[0]));
        assert!(
            !memo.counts.contains(long.as_str()),
            "long texts are not memoised"
        );
        assert!(memo.bytes <= MEMO_MAX_BYTES);
    }

    #[test]
    fn the_memo_stays_within_its_byte_budget() {
        let mut m = MemoMap::new();
        let big = "x".repeat(MEMO_MAX_TEXT_BYTES);
        for i in 0..(MEMO_MAX_BYTES / MEMO_MAX_TEXT_BYTES + 10) {
            m.put(format!("{i}{big}"), i);
        }
        assert!(m.bytes <= MEMO_MAX_BYTES);
        assert_eq!(
            m.bytes,
            m.counts.iter().map(|(k, _)| k.len()).sum::<usize>()
        );
        // Re-putting a key does not count its bytes twice.
        let before = m.bytes;
        let k = m.counts.peek_mru().map(|(k, _)| k.clone()).unwrap();
        m.put(k, 1);
        assert_eq!(m.bytes, before);
    }

    #[tokio::test]
    async fn warm_async_reports_readiness() {
        assert!(
            TokenCounter::new(TokenCounting::Tiktoken)
                .warm_async()
                .await
        );
        assert!(TokenCounter::new(TokenCounting::Char).warm_async().await);
    }
}
