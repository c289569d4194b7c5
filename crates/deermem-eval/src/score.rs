//! The scores: recall@1, recall@5 and mean reciprocal rank, per mode and query kind (and per
//! language), over all users and over each half of them (the half the hybrid policy was tuned
//! on and the held-out half), printed as a table and written as JSON.

use std::collections::{BTreeMap, HashMap};

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
    /// The users: `all`, `tuned` (the even-numbered half) or `held-out` (the odd-numbered).
    pub users: &'static str,
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
    /// The row of `mode`, `kind` and `lang` (`all` for every kind or language) over all users.
    pub fn get(&self, mode: Mode, kind: &str, lang: &str) -> Option<&Scores> {
        self.get_in(mode, ALL, kind, lang)
    }

    /// The row of `mode`, `users` ([`ALL`], [`TUNED`] or [`HELD_OUT`]), `kind` and `lang`.
    pub fn get_in(&self, mode: Mode, users: &str, kind: &str, lang: &str) -> Option<&Scores> {
        self.rows
            .iter()
            .find(|r| {
                r.mode == mode.as_str() && r.users == users && r.kind == kind && r.lang == lang
            })
            .map(|r| &r.scores)
    }

    /// A plain-text table.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{:<7} {:<8} {:<12} {:<5} {:>7} {:>8} {:>8} {:>7}\n",
            "mode", "users", "kind", "lang", "queries", "recall@1", "recall@5", "MRR"
        );
        for r in &self.rows {
            out.push_str(&format!(
                "{:<7} {:<8} {:<12} {:<5} {:>7} {:>8.3} {:>8.3} {:>7.3}\n",
                r.mode,
                r.users,
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

/// Every user.
pub const ALL: &str = "all";
/// The even-numbered users (0, 2, …, in order of first appearance in the dataset): the half
/// the hybrid policy's constants were chosen on.
pub const TUNED: &str = "tuned";
/// The odd-numbered users: the half held out of that choice.
pub const HELD_OUT: &str = "held-out";

/// The half of the users each user belongs to, numbering users by first appearance in the
/// facts, then the queries.
pub fn halves(dataset: &Dataset) -> HashMap<&str, &'static str> {
    let mut out: HashMap<&str, &'static str> = HashMap::new();
    let users = dataset
        .facts
        .iter()
        .map(|f| f.user.as_str())
        .chain(dataset.queries.iter().map(|q| q.user.as_str()));
    for u in users {
        let n = out.len();
        out.entry(u)
            .or_insert(if n.is_multiple_of(2) { TUNED } else { HELD_OUT });
    }
    out
}

/// Ranks every query in every mode the ranker offers and scores them.
///
/// # Errors
/// An index or embedder failure.
pub async fn evaluate(dataset: &Dataset, ranker: &Ranker) -> Result<Report, RankError> {
    let half = halves(dataset);
    // Sums of each group's figures, made means at the end.
    let mut sums: BTreeMap<(Mode, usize, String, String), Scores> = BTreeMap::new();
    let group = |users: &str| match users {
        ALL => 0,
        TUNED => 1,
        _ => 2,
    };
    for mode in ranker.modes() {
        for q in &dataset.queries {
            let ranked = ranker.rank(mode, q).await?;
            let (r1, r5, rr) = one(&ranked, &q.relevant);
            let lang = q.lang.clone().unwrap_or_else(|| "-".into());
            let mine = group(half.get(q.user.as_str()).copied().unwrap_or(HELD_OUT));
            let mut keys = Vec::with_capacity(6);
            for users in [0, mine] {
                keys.push((mode, users, "all".to_owned(), "all".to_owned()));
                keys.push((mode, users, q.kind.clone(), "all".to_owned()));
                keys.push((mode, users, q.kind.clone(), lang.clone()));
            }
            for key in keys {
                let s = sums.entry(key).or_default();
                s.queries += 1;
                s.recall_at_1 += r1;
                s.recall_at_5 += r5;
                s.mrr += rr;
            }
        }
    }
    ranker.check_embedder().await?;
    let rows = sums
        .into_iter()
        .map(|((mode, users, kind, lang), s)| {
            let n = s.queries as f64;
            Row {
                mode: mode.as_str(),
                users: [ALL, TUNED, HELD_OUT][users.min(2)],
                kind,
                lang,
                scores: Scores {
                    recall_at_1: s.recall_at_1 / n,
                    recall_at_5: s.recall_at_5 / n,
                    mrr: s.mrr / n,
                    ..s
                },
            }
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
    fn users_alternate_between_the_halves_in_order_of_appearance() {
        let fact = |user: &str, id: &str| crate::EvalFact {
            user: user.into(),
            id: id.into(),
            content: "x".into(),
            category: None,
            lang: None,
        };
        let d = Dataset {
            facts: vec![
                fact("b", "b1"),
                fact("a", "a1"),
                fact("b", "b2"),
                fact("c", "c1"),
            ],
            queries: Vec::new(),
        };
        let h = halves(&d);
        assert_eq!((h["b"], h["a"], h["c"]), (TUNED, HELD_OUT, TUNED));
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
