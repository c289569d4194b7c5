//! Ranking by meaning and by words together: exact vector ranking within a scope and
//! reciprocal rank fusion of ranked lists.

use std::collections::HashMap;

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
    let mut scored: Vec<(usize, f32)> = candidates
        .iter()
        .enumerate()
        .map(|(i, (_, v))| (i, dot(query, v)))
        .collect();
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
    let mut fused: Vec<(K, f64, usize)> = Vec::new();
    let mut at: HashMap<K, usize> = HashMap::new();
    for list in lists {
        for (rank0, id) in list.iter().enumerate() {
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
    }
    let mut order: Vec<usize> = (0..fused.len()).collect();
    order.sort_by(|&a, &b| {
        fused[b]
            .1
            .total_cmp(&fused[a].1)
            .then(fused[a].2.cmp(&fused[b].2))
            .then(a.cmp(&b))
    });
    order
        .into_iter()
        .map(|i| (fused[i].0.clone(), fused[i].1))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
