//! The reference's ranking, shared by the full-text indexes: `rel = -bm25` (SQLite FTS5's
//! `bm25()` with its defaults, written out in [`bm25_term`] for indexes that compute it
//! themselves), a 30-day grace period then `exp(-0.01 * (age_days - 30))` decay on `createdAt`,
//! plus `0.2 * confidence`.

use crate::{Fact, Timestamp};

/// Days a fact keeps its full relevance.
pub const DECAY_GRACE_DAYS: i64 = 30;
/// Decay rate per day after the grace period.
pub const DECAY_RATE: f64 = 0.01;
/// Weight of the confidence in the score.
pub const CONFIDENCE_WEIGHT: f64 = 0.2;

/// `createdAt` as the decay reads it: microseconds since the epoch when the text parses with
/// Python's `fromisoformat` *and* carries an offset; `None` (no decay) for naive or unparseable
/// values, as the reference skips decay when aware-minus-naive raises.
pub fn created_micros(created_at: &str) -> Option<i64> {
    match Timestamp::parse_iso_aware(created_at) {
        Some((ts, true)) => Some(ts.unix_micros()),
        _ => None,
    }
}

/// The confidence stored in the index: the reference's `float(confidence or 0.5)`, so `0.0`
/// counts as `0.5`, and non-finite values count as `0.5`.
pub fn index_confidence(fact: &Fact) -> f64 {
    let c = fact.confidence;
    if c == 0.0 || !c.is_finite() { 0.5 } else { c }
}

/// The decay factor at `now` for a fact created at `created` (microseconds), `1.0` when unknown.
pub fn decay(now: Timestamp, created: Option<i64>) -> f64 {
    let Some(created) = created else {
        return 1.0;
    };
    let age_days = now.whole_days_since(Timestamp::from_unix_micros(created));
    if age_days < DECAY_GRACE_DAYS {
        1.0
    } else {
        (-DECAY_RATE * (age_days - DECAY_GRACE_DAYS) as f64).exp()
    }
}

/// BM25's `k1` (FTS5's value).
pub const BM25_K1: f64 = 1.2;
/// BM25's `b` (FTS5's value).
pub const BM25_B: f64 = 0.75;

/// FTS5's inverse document frequency of a term found in `hits` of `rows` documents:
/// `ln((rows - hits + 0.5) / (hits + 0.5))`, at least `1e-6` (a term in most documents still
/// counts a little).
pub fn bm25_idf(rows: u64, hits: u64) -> f64 {
    let (n, h) = (rows as f64, hits as f64);
    let idf = ((n - h + 0.5) / (h + 0.5)).ln();
    if idf <= 0.0 { 1e-6 } else { idf }
}

/// One term's share of a document's BM25 relevance (FTS5's formula, `-bm25()` summed over the
/// terms): the term occurs `freq` times in a document of `doc_len` tokens, where the documents
/// average `avg_len` tokens.
pub fn bm25_term(idf: f64, freq: usize, doc_len: usize, avg_len: f64) -> f64 {
    let f = freq as f64;
    let avg = if avg_len > 0.0 { avg_len } else { 1.0 };
    idf * (f * (BM25_K1 + 1.0)) / (f + BM25_K1 * (1.0 - BM25_B + BM25_B * doc_len as f64 / avg))
}

/// The final score: `rel * decay + 0.2 * confidence` (confidence `0.5` when not finite).
pub fn final_score(rel: f64, decay: f64, confidence: f64) -> f64 {
    let conf = if confidence.is_finite() {
        confidence
    } else {
        0.5
    };
    rel * decay + CONFIDENCE_WEIGHT * conf
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        Timestamp::parse_iso(s).unwrap()
    }

    #[test]
    fn decay_has_a_thirty_day_grace_period() {
        let now = ts("2026-12-31T00:00:00Z");
        let at = |s: &str| created_micros(s);
        assert_eq!(decay(now, at("2026-12-30T00:00:00Z")), 1.0);
        // 29 days and 23 hours floor to 29.
        assert_eq!(decay(now, at("2026-12-01T00:00:01Z")), 1.0);
        assert_eq!(decay(now, at("2026-12-01T00:00:00Z")), 1.0);
        let d = decay(now, at("2026-11-21T00:00:00Z"));
        assert!((d - (-0.1f64).exp()).abs() < 1e-12, "40 days: {d}");
        // Future timestamps have negative age: no decay.
        assert_eq!(decay(now, at("2030-01-01T00:00:00Z")), 1.0);
        // Offsets count.
        let d = decay(now, at("2020-01-01T00:00:00+05:00"));
        assert!(d < 1e-8);
    }

    #[test]
    fn naive_and_unparseable_timestamps_skip_decay() {
        assert_eq!(created_micros("2020-01-01T00:00:00"), None);
        assert_eq!(created_micros("yesterday"), None);
        assert_eq!(created_micros(""), None);
        assert!(created_micros("2020-01-01T00:00:00Z").is_some());
        assert_eq!(decay(ts("2026-01-01T00:00:00Z"), None), 1.0);
    }

    #[test]
    fn bm25_follows_fts5() {
        // A term in 1 of 3 documents: ln(2.5 / 1.5).
        assert!((bm25_idf(3, 1) - (2.5f64 / 1.5).ln()).abs() < 1e-12);
        // In every document: clamped to a tiny positive weight.
        assert_eq!(bm25_idf(2, 2), 1e-6);
        // One occurrence in an average-length document: idf * 2.2 / 2.2.
        assert!((bm25_term(2.0, 1, 4, 4.0) - 2.0).abs() < 1e-12);
        // Longer documents and fewer occurrences rank lower.
        assert!(bm25_term(1.0, 1, 8, 4.0) < bm25_term(1.0, 1, 2, 4.0));
        assert!(bm25_term(1.0, 1, 4, 4.0) < bm25_term(1.0, 3, 4, 4.0));
        assert_eq!(bm25_term(1.0, 0, 4, 4.0), 0.0);
    }

    #[test]
    fn score_adds_weighted_confidence() {
        assert!((final_score(2.0, 0.5, 1.0) - 1.2).abs() < 1e-12);
        assert!((final_score(1.0, 1.0, f64::NAN) - 1.1).abs() < 1e-12);
        // A recent fact outranks an old one with the same relevance (the reference's pin).
        let now = ts("2026-12-02T00:00:00Z");
        let recent = final_score(1.0, decay(now, created_micros("2026-12-01T00:00:00Z")), 0.5);
        let old = final_score(1.0, decay(now, created_micros("2020-01-01T00:00:00Z")), 0.5);
        assert!(recent > old);
    }
}
