//! The scores: recall@1, recall@5 and mean reciprocal rank, per mode and query kind (and per
//! language), over all users and over each half of them (the half the hybrid policy was tuned
//! on and the held-out half), printed as a table and written as JSON; and the targets of
//! issue #42 checked against them ([`Report::targets`]).

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

/// The languages the targets are checked in.
const LANGS: [&str; 2] = ["en", "zh"];
/// The query kinds the targets are checked on.
const KINDS: [&str; 3] = ["lexical", "paraphrase", "crosslingual"];
/// Hybrid paraphrase recall@5 in each language, in each half of the users.
pub const PARAPHRASE_R5: f64 = 0.92;
/// Hybrid crosslingual recall@5 (both directions), in each half of the users.
pub const CROSSLINGUAL_R5: f64 = 0.85;
/// How far hybrid recall@1 may fall below the better of BM25 and vector, per kind and language.
pub const PARTS_SLACK: f64 = 0.02;
/// How far apart the tuned and held-out users' hybrid recall@1 and recall@5 may be, per kind.
pub const HALVES_GAP: f64 = 0.05;

/// One target of issue #42 checked against a report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Target {
    /// What is required, e.g. `hybrid paraphrase en recall@5 >= 0.92 (tuned)`.
    pub name: String,
    /// The figure(s) it was checked on.
    pub figure: String,
    /// Whether it holds.
    pub holds: bool,
}

impl Report {
    /// The targets of issue #42 (multilingual and cross-lingual search) on this report, each
    /// with the figures and whether it holds; empty without the hybrid mode. A target over
    /// queries the dataset lacks (a kind or language it has none of) is left out.
    pub fn targets(&self) -> Vec<Target> {
        let mut out = Vec::new();
        let h = |users: &str, kind: &str, lang: &str| self.get_in(Mode::Hybrid, users, kind, lang);
        if self.get(Mode::Hybrid, "all", "all").is_none() {
            return out;
        }
        for users in [TUNED, HELD_OUT] {
            for lang in LANGS {
                if let Some(s) = h(users, "paraphrase", lang) {
                    out.push(Target {
                        name: format!(
                            "hybrid paraphrase {lang} recall@5 >= {PARAPHRASE_R5} ({users})"
                        ),
                        figure: format!("{:.3}", s.recall_at_5),
                        holds: s.recall_at_5 >= PARAPHRASE_R5,
                    });
                }
            }
            if let Some(s) = h(users, "crosslingual", "all") {
                out.push(Target {
                    name: format!("hybrid crosslingual recall@5 >= {CROSSLINGUAL_R5} ({users})"),
                    figure: format!("{:.3}", s.recall_at_5),
                    holds: s.recall_at_5 >= CROSSLINGUAL_R5,
                });
            }
        }
        for lang in LANGS {
            if let (Some(b), Some(s)) = (
                self.get(Mode::Bm25, "lexical", lang),
                self.get(Mode::Hybrid, "lexical", lang),
            ) {
                out.push(Target {
                    name: format!("hybrid lexical {lang} >= bm25 (recall@1, recall@5, MRR)"),
                    figure: format!(
                        "{:.3}/{:.3}/{:.3} vs {:.3}/{:.3}/{:.3}",
                        s.recall_at_1, s.recall_at_5, s.mrr, b.recall_at_1, b.recall_at_5, b.mrr
                    ),
                    holds: s.recall_at_1 >= b.recall_at_1
                        && s.recall_at_5 >= b.recall_at_5
                        && s.mrr >= b.mrr,
                });
            }
        }
        for kind in KINDS {
            for lang in LANGS {
                let (Some(b), Some(v), Some(s)) = (
                    self.get(Mode::Bm25, kind, lang),
                    self.get(Mode::Vector, kind, lang),
                    self.get(Mode::Hybrid, kind, lang),
                ) else {
                    continue;
                };
                let parts = b.recall_at_1.max(v.recall_at_1);
                out.push(Target {
                    name: format!(
                        "hybrid {kind} {lang} recall@1 >= max(bm25, vector) - {PARTS_SLACK}"
                    ),
                    figure: format!(
                        "{:.3} vs {:.3}/{:.3}",
                        s.recall_at_1, b.recall_at_1, v.recall_at_1
                    ),
                    holds: s.recall_at_1 >= parts - PARTS_SLACK - 1e-9,
                });
            }
        }
        for kind in KINDS {
            let (Some(t), Some(o)) = (h(TUNED, kind, "all"), h(HELD_OUT, kind, "all")) else {
                continue;
            };
            let gap = (t.recall_at_1 - o.recall_at_1)
                .abs()
                .max((t.recall_at_5 - o.recall_at_5).abs());
            out.push(Target {
                name: format!(
                    "hybrid {kind} tuned and held-out within {HALVES_GAP} (recall@1, recall@5)"
                ),
                figure: format!(
                    "{:.3}/{:.3} vs {:.3}/{:.3}",
                    t.recall_at_1, t.recall_at_5, o.recall_at_1, o.recall_at_5
                ),
                holds: gap <= HALVES_GAP + 1e-9,
            });
        }
        out
    }

    /// The targets as text: one line each, `holds` or `FAILS`, then the figures.
    pub fn targets_table(&self) -> String {
        self.targets()
            .iter()
            .map(|t| {
                format!(
                    "{:<5} {:<70} {}\n",
                    if t.holds { "holds" } else { "FAILS" },
                    t.name,
                    t.figure
                )
            })
            .collect()
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

    fn row(mode: Mode, users: &'static str, kind: &str, lang: &str, r1: f64, r5: f64) -> Row {
        Row {
            mode: mode.as_str(),
            users,
            kind: kind.into(),
            lang: lang.into(),
            scores: Scores {
                queries: 10,
                recall_at_1: r1,
                recall_at_5: r5,
                mrr: r1,
            },
        }
    }

    #[test]
    fn targets_say_which_hold() {
        assert!(Report::default().targets().is_empty());
        let mut rows = Vec::new();
        for mode in [Mode::Bm25, Mode::Vector, Mode::Hybrid] {
            let (para, cross) = match mode {
                Mode::Bm25 => (0.0, 0.0),
                Mode::Vector => (0.70, 0.80),
                // Hybrid loses 0.03 of vector's recall@1 on English paraphrases.
                Mode::Hybrid => (0.67, 0.80),
            };
            rows.push(row(mode, ALL, "all", "all", 0.5, 0.5));
            rows.push(row(mode, ALL, "lexical", "en", 1.0, 1.0));
            rows.push(row(mode, ALL, "paraphrase", "en", para, 0.93));
            rows.push(row(mode, ALL, "crosslingual", "zh", cross, 0.9));
            for users in [TUNED, HELD_OUT] {
                let gap = if users == TUNED { 0.0 } else { 0.06 };
                rows.push(row(mode, users, "paraphrase", "en", para, 0.93 - gap));
                rows.push(row(mode, users, "paraphrase", "all", para, 0.93 - gap));
                rows.push(row(mode, users, "crosslingual", "all", cross, 0.9));
            }
        }
        let report = Report { rows };
        let targets = report.targets();
        let holds = |prefix: &str| -> Vec<bool> {
            targets
                .iter()
                .filter(|t| t.name.starts_with(prefix))
                .map(|t| t.holds)
                .collect()
        };
        // Tuned 0.93 holds, held-out 0.87 fails; no Chinese paraphrases, so no target.
        assert_eq!(holds("hybrid paraphrase en recall@5"), vec![true, false]);
        assert!(holds("hybrid paraphrase zh").is_empty());
        assert_eq!(holds("hybrid crosslingual recall@5"), vec![true, true]);
        assert_eq!(holds("hybrid lexical en >= bm25"), vec![true]);
        assert_eq!(holds("hybrid paraphrase en recall@1 >= max"), vec![false]);
        assert_eq!(holds("hybrid crosslingual zh recall@1 >= max"), vec![true]);
        assert_eq!(holds("hybrid paraphrase tuned and held-out"), vec![false]);
        assert_eq!(holds("hybrid crosslingual tuned and held-out"), vec![true]);
        let table = report.targets_table();
        assert!(
            table
                .lines()
                .any(|l| l.starts_with("FAILS") && l.contains("held-out"))
        );
        assert_eq!(table.lines().count(), targets.len());
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
