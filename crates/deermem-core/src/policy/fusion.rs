//! Ranking by meaning and by words together: exact vector ranking within a scope, reciprocal
//! rank fusion of ranked lists, and the hybrid search's policy ([`hybrid_fusion`]) built on it.

use std::collections::HashMap;

use super::language::{ScriptGroup, calibrate_by_script};

/// The `k` of reciprocal rank fusion: a document at rank `r` (1-based) in a list scores
/// `1 / (k + r)`; 60 is the constant of the original method and keeps one list's top ranks from
/// drowning the other's.
pub const RRF_K: f64 = 60.0;

/// Dot product of two vectors of the same dimension (the cosine similarity of unit vectors);
/// components past the shorter one are ignored.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The `limit` nearest candidates to `query` by dot product, best first; ties keep the
/// candidates' order, so the result is deterministic.
pub fn nearest<'a, K>(
    query: &[f32],
    candidates: &'a [(K, Vec<f32>)],
    limit: usize,
) -> Vec<(&'a K, f32)> {
    best_first(
        candidates,
        candidates.iter().map(|(_, v)| dot(query, v)).collect(),
        limit,
    )
}

/// [`nearest`] for a memory that may hold several languages: the similarities are calibrated
/// by script group ([`calibrate_by_script`]) before ranking, so a query's language does not
/// outrank its meaning; `group_of` gives a candidate's script group. The scores answered are
/// the calibrated ones (a cosine similarity, lifted for a group below the query's).
pub fn nearest_calibrated<'a, K>(
    query: &[f32],
    query_group: ScriptGroup,
    candidates: &'a [(K, Vec<f32>)],
    group_of: impl Fn(&K) -> ScriptGroup,
    limit: usize,
) -> Vec<(&'a K, f32)> {
    let mut scored: Vec<(f32, ScriptGroup)> = candidates
        .iter()
        .map(|(k, v)| (dot(query, v), group_of(k)))
        .collect();
    calibrate_by_script(&mut scored, query_group);
    best_first(
        candidates,
        scored.into_iter().map(|(s, _)| s).collect(),
        limit,
    )
}

/// The `limit` best of `candidates` by `scores` (one per candidate), ties in candidate order.
fn best_first<K>(candidates: &[(K, Vec<f32>)], scores: Vec<f32>, limit: usize) -> Vec<(&K, f32)> {
    let mut scored: Vec<(usize, f32)> = scores.into_iter().enumerate().collect();
    scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    scored
        .into_iter()
        .take(limit)
        .map(|(i, s)| (&candidates[i].0, s))
        .collect()
}

/// Fuses ranked lists (each best first, ids unique within a list) by reciprocal rank fusion
/// with [`RRF_K`]: the fused score of an id is the sum of `1 / (k + rank)` over the lists it
/// appears in. Best first; ties are broken by the best single rank, then by first appearance,
/// so the order is deterministic.
pub fn reciprocal_rank_fusion<K>(lists: &[&[K]]) -> Vec<(K, f64)>
where
    K: Clone + Eq + std::hash::Hash,
{
    fuse_ranks(lists.iter().flat_map(|list| list.iter().enumerate()))
}

/// A BM25 hit votes in a hybrid fusion only when its BM25 relevance is at least this share of
/// the best hit's: a hit far below the best is a partial match, typically on a function word
/// the query shares with the fact ("she", "does"), which says nothing about meaning.
pub const LEXICAL_FLOOR: f64 = 0.7;

/// A BM25 hit votes only when the ranking by meaning also puts it among its first
/// `MEANING_AGREEMENT` facts: words re-rank meaning's shortlist instead of pushing facts into it.
pub const MEANING_AGREEMENT: usize = 5;

/// BM25's first hit is a decisive word match, kept first whatever the vectors say, when it is
/// the only hit or its relevance is at least this many times the next best hit's.
pub const DECISIVE_RATIO: f64 = 2.0;

/// The hybrid search's fusion of a BM25 list and a list by meaning, both best first with ids
/// unique within each list; `lexical` carries each hit's raw BM25 relevance (positive, higher
/// is better).
///
/// The base is reciprocal rank fusion with [`RRF_K`], refined so that words help where they are
/// evidence and stay out of the way where they are not:
///
/// 1. **A decisive word match stays first**: BM25's first hit, when it is BM25's only hit or its
///    relevance is at least [`DECISIVE_RATIO`] times every other hit's, is ranked first with
///    the highest fused score there is, `2 / (k + 1)` (first in both lists).
/// 2. **Weak word matches do not vote**: a BM25 hit below [`LEXICAL_FLOOR`] times the best
///    relevance adds nothing.
/// 3. **Words confirm meaning**: any other BM25 hit adds its `1 / (k + rank)` only when it is
///    among the first [`MEANING_AGREEMENT`] of the list by meaning.
///
/// Every id of the list by meaning keeps its own `1 / (k + rank)`. BM25 hits that neither
/// voted nor appear in the list by meaning are not lost: they follow the fused list, in BM25
/// order, with score 0. Best first; ties are broken as [`reciprocal_rank_fusion`] breaks them.
pub fn hybrid_fusion<K>(lexical: &[(K, f64)], semantic: &[K]) -> Vec<(K, f64)>
where
    K: Clone + Eq + std::hash::Hash,
{
    let best = lexical
        .iter()
        .map(|(_, r)| *r)
        .fold(f64::NEG_INFINITY, f64::max);
    let decisive = match lexical.split_first() {
        Some(((id, first), rest)) => rest
            .iter()
            .all(|(_, r)| *first >= DECISIVE_RATIO * *r)
            .then_some(id),
        None => None,
    };
    let shortlist = &semantic[..semantic.len().min(MEANING_AGREEMENT)];
    // Non-voting hits keep their place in BM25's list as a gap, so voters keep their ranks.
    let voting: Vec<Option<K>> = lexical
        .iter()
        .map(|(id, r)| (*r >= LEXICAL_FLOOR * best && shortlist.contains(id)).then(|| id.clone()))
        .collect();
    let mut fused = fuse_ranks(
        voting
            .iter()
            .enumerate()
            .filter_map(|(r, id)| id.as_ref().map(|id| (r, id)))
            .chain(semantic.iter().enumerate()),
    );
    if let Some(id) = decisive {
        fused.retain(|(k, _)| k != id);
        fused.insert(0, (id.clone(), 2.0 / (RRF_K + 1.0)));
    }
    for (id, _) in lexical {
        if !fused.iter().any(|(k, _)| k == id) {
            fused.push((id.clone(), 0.0));
        }
    }
    fused
}

/// Reciprocal rank fusion of `(rank, id)` entries (0-based ranks, several lists chained), with
/// the tie-breaking of [`reciprocal_rank_fusion`].
fn fuse_ranks<'a, K>(entries: impl Iterator<Item = (usize, &'a K)>) -> Vec<(K, f64)>
where
    K: Clone + Eq + std::hash::Hash + 'a,
{
    let mut fused: Vec<(K, f64, usize)> = Vec::new();
    let mut at: HashMap<K, usize> = HashMap::new();
    for (rank0, id) in entries {
        let score = 1.0 / (RRF_K + rank0 as f64 + 1.0);
        match at.get(id) {
            Some(&i) => {
                fused[i].1 += score;
                fused[i].2 = fused[i].2.min(rank0);
            }
            None => {
                at.insert(id.clone(), fused.len());
                fused.push((id.clone(), score, rank0));
            }
        }
    }
    // Stable: equal scores and best ranks keep their first appearance's order.
    fused.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.2.cmp(&b.2)));
    fused
        .into_iter()
        .map(|(id, score, _)| (id, score))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids<K: Copy>(fused: &[(K, f64)]) -> Vec<K> {
        fused.iter().map(|(k, _)| *k).collect()
    }

    /// A query that only shares a function word with some facts: BM25 finds them, meaning
    /// finds the right fact; plain fusion lets the word matches push it down, the hybrid
    /// policy does not (they are outside meaning's shortlist, so they do not vote).
    #[test]
    fn word_matches_outside_the_meaning_shortlist_do_not_vote() {
        let lexical = [("w1", 3.0), ("w2", 2.9), ("w3", 2.8)];
        let semantic = ["right", "a", "b", "c", "d", "w1", "w2", "w3"];
        let plain = reciprocal_rank_fusion(&[&["w1", "w2", "w3"][..], &semantic[..]]);
        assert_eq!(plain[0].0, "w1");
        let fused = hybrid_fusion(&lexical, &semantic);
        assert_eq!(&ids(&fused)[..5], &["right", "a", "b", "c", "d"]);
        assert!((fused[0].1 - 1.0 / 61.0).abs() < 1e-12);
        assert_eq!(fused.len(), 8);
    }

    /// Words re-rank meaning's shortlist: a strong word match among the first five by meaning
    /// votes; one below the relevance floor does not.
    #[test]
    fn strong_word_matches_in_the_shortlist_vote_and_weak_ones_do_not() {
        let semantic = ["a", "b", "c", "d", "e"];
        // c (rank 1 by words) and e (rank 2, close to c) vote; d is far below the best.
        let fused = hybrid_fusion(&[("c", 2.0), ("e", 1.9), ("d", 0.5)], &semantic);
        assert_eq!(ids(&fused), vec!["c", "e", "a", "b", "d"]);
        assert!((fused[0].1 - (1.0 / 61.0 + 1.0 / 63.0)).abs() < 1e-12);
        assert!((fused[1].1 - (1.0 / 62.0 + 1.0 / 65.0)).abs() < 1e-12);
        // d keeps only its rank by meaning.
        assert!((fused[4].1 - 1.0 / 64.0).abs() < 1e-12);
    }

    /// BM25's first hit is kept first when it is the only hit or clearly ahead, even when
    /// meaning does not know the word (a name, a code, another language).
    #[test]
    fn a_decisive_word_match_stays_first() {
        let semantic = ["a", "b", "c", "d", "e", "f", "x"];
        let only = hybrid_fusion(&[("x", 1.2)], &semantic);
        assert_eq!(ids(&only)[..2], ["x", "a"]);
        assert!((only[0].1 - 2.0 / 61.0).abs() < 1e-12);
        assert_eq!(only.len(), 7);
        let ahead = hybrid_fusion(&[("x", 4.0), ("b", 2.0)], &semantic);
        assert_eq!(ids(&ahead)[0], "x");
        // Not decisive (4.0 < 2 × 3.0): fusion decides; x is outside the shortlist, b votes.
        let close = hybrid_fusion(&[("x", 4.0), ("b", 3.0)], &semantic);
        assert_eq!(ids(&close)[..2], ["b", "a"]);
        // A word match found by neither the shortlist nor meaning's list is kept at the end.
        let lost = hybrid_fusion(&[("y", 4.0), ("z", 3.9)], &["a", "b"]);
        assert_eq!(
            lost.iter().map(|(k, s)| (*k, *s)).collect::<Vec<_>>(),
            vec![("a", 1.0 / 61.0), ("b", 1.0 / 62.0), ("y", 0.0), ("z", 0.0)]
        );
    }

    #[test]
    fn empty_lists_fuse_to_the_other_list() {
        assert!(hybrid_fusion::<&str>(&[], &[]).is_empty());
        assert_eq!(ids(&hybrid_fusion(&[], &["a", "b"])), vec!["a", "b"]);
        // A lone BM25 hit is decisive.
        assert_eq!(ids(&hybrid_fusion(&[("a", 1.0)], &[])), vec!["a"]);
        assert_eq!(
            ids(&hybrid_fusion(&[("a", 1.0), ("b", 0.9)], &[])),
            vec!["a", "b"]
        );
    }

    #[test]
    fn fusion_rewards_agreement_and_is_deterministic() {
        let lexical = ["a", "b", "c"];
        let semantic = ["c", "d", "a"];
        let fused = reciprocal_rank_fusion(&[&lexical, &semantic]);
        let ids: Vec<_> = fused.iter().map(|(id, _)| *id).collect();
        // a and c both score 1/61 + 1/63 with a best rank of 1, a seen first; b and d 1/62.
        assert_eq!(ids, vec!["a", "c", "b", "d"]);
        assert!((fused[0].1 - (1.0 / 61.0 + 1.0 / 63.0)).abs() < 1e-12);
        assert!((fused[2].1 - 1.0 / 62.0).abs() < 1e-12);
        assert!(reciprocal_rank_fusion::<&str>(&[]).is_empty());
        let one = reciprocal_rank_fusion(&[&["x", "y"][..]]);
        assert_eq!(
            one.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
            vec!["x", "y"]
        );
    }

    /// A Chinese question over a mixed memory: raw similarity prefers the Chinese facts;
    /// calibrated, the English answer comes first.
    #[test]
    fn calibrated_nearest_lets_meaning_cross_languages() {
        use ScriptGroup::{Cjk, Other};
        // One dimension is enough: the query is [1, 0], a candidate's first component is its
        // similarity.
        let v = |s: f32| vec![s, (1.0 - s * s).sqrt()];
        let candidates = vec![
            (("answer", Other), v(0.84)),
            (("en1", Other), v(0.77)),
            (("en2", Other), v(0.76)),
            (("en3", Other), v(0.75)),
            (("zh1", Cjk), v(0.87)),
            (("zh2", Cjk), v(0.86)),
            (("zh3", Cjk), v(0.85)),
        ];
        let raw: Vec<_> = nearest(&[1.0, 0.0], &candidates, 2)
            .into_iter()
            .map(|(k, _)| k.0)
            .collect();
        assert_eq!(raw, vec!["zh1", "zh2"]);
        let calibrated = nearest_calibrated(&[1.0, 0.0], Cjk, &candidates, |k| k.1, 2);
        assert_eq!(calibrated[0].0.0, "answer");
        assert!((calibrated[0].1 - (0.84 + 0.86 - 0.78)).abs() < 1e-5);
    }

    #[test]
    fn nearest_orders_by_similarity_with_stable_ties() {
        let candidates = vec![
            ("far", vec![0.0, 1.0]),
            ("near", vec![1.0, 0.0]),
            ("twin", vec![1.0, 0.0]),
            ("mid", vec![0.6, 0.8]),
        ];
        let got: Vec<_> = nearest(&[1.0, 0.0], &candidates, 3)
            .into_iter()
            .map(|(k, _)| *k)
            .collect();
        assert_eq!(got, vec!["near", "twin", "mid"]);
        assert!(nearest(&[1.0, 0.0], &candidates, 0).is_empty());
    }
}
