//! The scores: recall@1, recall@5 and mean reciprocal rank, per mode and query kind (and per
//! language), printed as a table and written as JSON.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::dataset::Dataset;
use crate::rank::{Mode, RankError, Ranker};

/// The scores of one group of queries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Scores {
    /// Queries in the group.
    pub queries: usize,
    /// Mean share of the relevant facts found in the top 1.
    pub recall_at_1: f64,
    /// Mean share of the relevant facts found in the top 5.
    pub recall_at_5: f64,
    /// Mean of 1 / rank of the first relevant fact (0 when none is ranked).
    pub mrr: f64,
}

/// One line of the report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    /// The search mode.
    pub mode: &'static str,
    /// The query kind, or `all`.
    pub kind: String,
    /// The language, or `all`.
    pub lang: String,
    /// The figures.
    #[serde(flatten)]
    pub scores: Scores,
}

/// Every row, ordered by mode, kind, language.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Report {
    /// The rows.
    pub rows: Vec<Row>,
}

impl Report {
    /// The row of `mode`, `kind` and `lang` (`all` for every kind or language).
    pub fn get(&self, mode: Mode, kind: &str, lang: &str) -> Option<&Scores> {
        self.rows
            .iter()
            .find(|r| r.mode == mode.as_str() && r.kind == kind && r.lang == lang)
            .map(|r| &r.scores)
    }

    /// A plain-text table.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{:<7} {:<12} {:<5} {:>7} {:>8} {:>8} {:>7}\n",
            "mode", "kind", "lang", "queries", "recall@1", "recall@5", "MRR"
        );
        for r in &self.rows {
            out.push_str(&format!(
                "{:<7} {:<12} {:<5} {:>7} {:>8.3} {:>8.3} {:>7.3}\n",
                r.mode,
                r.kind,
                r.lang,
                r.scores.queries,
                r.scores.recall_at_1,
                r.scores.recall_at_5,
                r.scores.mrr
            ));
        }
        out
    }
}

/// The figures of one ranking against its relevant ids.
fn one(ranked: &[String], relevant: &[String]) -> (f64, f64, f64) {
    let found = |k: usize| {
        let top = &ranked[..ranked.len().min(k)];
        relevant.iter().filter(|r| top.contains(r)).count() as f64 / relevant.len() as f64
    };
    let rr = ranked
        .iter()
        .position(|id| relevant.contains(id))
        .map_or(0.0, |p| 1.0 / (p as f64 + 1.0));
    (found(1), found(5), rr)
}

#[derive(Default)]
struct Sum {
    n: usize,
    r1: f64,
    r5: f64,
    rr: f64,
}

/// Ranks every query in every mode the ranker offers and scores them.
///
/// # Errors
/// An index or embedder failure.
pub async fn evaluate(dataset: &Dataset, ranker: &Ranker) -> Result<Report, RankError> {
    let mut sums: BTreeMap<(Mode, String, String), Sum> = BTreeMap::new();
    for mode in ranker.modes() {
        for q in &dataset.queries {
            let ranked = ranker.rank(mode, q).await?;
            let (r1, r5, rr) = one(&ranked, &q.relevant);
            let lang = q.lang.clone().unwrap_or_else(|| "-".into());
            for key in [
                (mode, "all".to_owned(), "all".to_owned()),
                (mode, q.kind.clone(), "all".to_owned()),
                (mode, q.kind.clone(), lang.clone()),
            ] {
                let s = sums.entry(key).or_default();
                s.n += 1;
                s.r1 += r1;
                s.r5 += r5;
                s.rr += rr;
            }
        }
    }
    ranker.check_embedder().await?;
    let rows = sums
        .into_iter()
        .map(|((mode, kind, lang), s)| Row {
            mode: mode.as_str(),
            kind,
            lang,
            scores: Scores {
                queries: s.n,
                recall_at_1: s.r1 / s.n as f64,
                recall_at_5: s.r5 / s.n as f64,
                mrr: s.rr / s.n as f64,
            },
        })
        .collect();
    Ok(Report { rows })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn figures_of_one_ranking() {
        assert_eq!(one(&ids(&["a", "b"]), &ids(&["a"])), (1.0, 1.0, 1.0));
        assert_eq!(one(&ids(&["x", "a"]), &ids(&["a"])), (0.0, 1.0, 0.5));
        assert_eq!(
            one(&ids(&["x", "y", "z", "w", "v", "a"]), &ids(&["a"])),
            (0.0, 0.0, 1.0 / 6.0)
        );
        assert_eq!(
            one(&ids(&["b", "x", "a"]), &ids(&["a", "b"])),
            (0.5, 1.0, 1.0)
        );
        assert_eq!(one(&[], &ids(&["a"])), (0.0, 0.0, 0.0));
    }
}
