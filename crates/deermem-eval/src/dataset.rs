//! The labelled dataset: JSON lines, one record each, `{"type": "fact", "user", "id", "content",
//! "category"?, "lang"?}` or `{"type": "query", "user", "id", "query", "kind", "lang"?,
//! "relevant": [fact ids of that user]}`. Reading checks every reference.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

/// One fact of one user.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalFact {
    /// Whose memory it is.
    pub user: String,
    /// Unique within the user.
    pub id: String,
    /// The fact text.
    pub content: String,
    /// An optional category.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
    /// An optional language tag (`en`, `zh`...), for per-language figures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lang: Option<String>,
}

/// One query with its hand-judged relevant facts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalQuery {
    /// Whose memory is searched.
    pub user: String,
    /// A label for reports.
    pub id: String,
    /// The query text.
    pub query: String,
    /// The query kind figures are grouped by (`lexical`, `paraphrase`, a LongMemEval type...).
    pub kind: String,
    /// An optional language tag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lang: Option<String>,
    /// Ids of the user's facts that answer it (at least one).
    pub relevant: Vec<String>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum Record {
    Fact(EvalFact),
    Query(EvalQuery),
}

/// A dataset that cannot be used, with the 1-based line at fault.
#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    /// A line is not a fact or query record.
    #[error("line {line}: {message}")]
    Malformed {
        /// The line.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// A fact id appears twice for one user.
    #[error("line {line}: fact {id:?} of user {user:?} appears twice")]
    DuplicateFact {
        /// The line.
        line: usize,
        /// The user.
        user: String,
        /// The id.
        id: String,
    },
    /// A query names a fact its user does not have, or none.
    #[error("line {line}: query {id:?} {problem}")]
    BadQuery {
        /// The line.
        line: usize,
        /// The query id.
        id: String,
        /// What is wrong.
        problem: String,
    },
    /// No query at all.
    #[error("the dataset has no queries")]
    Empty,
}

/// Facts and queries, in file order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dataset {
    /// Every fact.
    pub facts: Vec<EvalFact>,
    /// Every query.
    pub queries: Vec<EvalQuery>,
}

impl Dataset {
    /// Reads JSON lines; blank lines are skipped.
    ///
    /// # Errors
    /// The first unusable line, a duplicate fact, a query naming an unknown fact, or no query.
    pub fn parse(text: &str) -> Result<Self, DatasetError> {
        let mut out = Self::default();
        let (mut fact_lines, mut query_lines) = (Vec::new(), Vec::new());
        for (n, raw) in text.lines().enumerate() {
            if raw.trim().is_empty() {
                continue;
            }
            let record: Record =
                serde_json::from_str(raw).map_err(|e| DatasetError::Malformed {
                    line: n + 1,
                    message: e.to_string(),
                })?;
            match record {
                Record::Fact(f) => {
                    if f.content.trim().is_empty() {
                        return Err(DatasetError::Malformed {
                            line: n + 1,
                            message: format!("fact {:?} has no content", f.id),
                        });
                    }
                    fact_lines.push(n + 1);
                    out.facts.push(f);
                }
                Record::Query(q) => {
                    query_lines.push(n + 1);
                    out.queries.push(q);
                }
            }
        }
        let mut ids: HashMap<&str, HashSet<&str>> = HashMap::new();
        for (f, line) in out.facts.iter().zip(fact_lines) {
            if !ids.entry(&f.user).or_default().insert(&f.id) {
                return Err(DatasetError::DuplicateFact {
                    line,
                    user: f.user.clone(),
                    id: f.id.clone(),
                });
            }
        }
        for (q, line) in out.queries.iter().zip(query_lines) {
            let bad = |problem: String| DatasetError::BadQuery {
                line,
                id: q.id.clone(),
                problem,
            };
            if q.relevant.is_empty() {
                return Err(bad("names no relevant fact".into()));
            }
            let known = ids.get(q.user.as_str());
            for r in &q.relevant {
                if !known.is_some_and(|k| k.contains(r.as_str())) {
                    return Err(bad(format!(
                        "names fact {r:?}, which user {:?} does not have",
                        q.user
                    )));
                }
            }
        }
        if out.queries.is_empty() {
            return Err(DatasetError::Empty);
        }
        Ok(out)
    }

    /// Writes the dataset as JSON lines (the format [`Dataset::parse`] reads).
    pub fn to_jsonl(&self) -> String {
        let mut out = String::new();
        for f in &self.facts {
            let mut v = serde_json::to_value(f).unwrap_or_default();
            v["type"] = "fact".into();
            out.push_str(&v.to_string());
            out.push('\n');
        }
        for q in &self.queries {
            let mut v = serde_json::to_value(q).unwrap_or_default();
            v["type"] = "query".into();
            out.push_str(&v.to_string());
            out.push('\n');
        }
        out
    }

    /// The first `per_user` queries of each user and every fact of those users: the CI slice.
    #[must_use]
    pub fn slice(&self, users: usize, per_user: usize) -> Self {
        let mut chosen: Vec<&str> = Vec::new();
        for q in &self.queries {
            if !chosen.contains(&q.user.as_str()) && chosen.len() < users {
                chosen.push(&q.user);
            }
        }
        let mut taken: HashMap<&str, usize> = HashMap::new();
        let queries = self
            .queries
            .iter()
            .filter(|q| chosen.contains(&q.user.as_str()))
            .filter(|q| {
                let n = taken.entry(&q.user).or_default();
                *n += 1;
                *n <= per_user
            })
            .cloned()
            .collect();
        Self {
            facts: self
                .facts
                .iter()
                .filter(|f| chosen.contains(&f.user.as_str()))
                .cloned()
                .collect(),
            queries,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: &str = r#"{"type": "fact", "user": "u", "id": "a", "content": "Likes tea"}
{"type": "fact", "user": "u", "id": "b", "content": "Lives in Oslo", "category": "context"}

{"type": "query", "user": "u", "id": "q", "query": "tea", "kind": "lexical", "relevant": ["a"]}
"#;

    #[test]
    fn reads_and_writes_the_format() {
        let d = Dataset::parse(OK).unwrap();
        assert_eq!(d.facts.len(), 2);
        assert_eq!(d.facts[1].category.as_deref(), Some("context"));
        assert_eq!(d.queries[0].relevant, vec!["a"]);
        assert_eq!(Dataset::parse(&d.to_jsonl()).unwrap(), d);
    }

    #[test]
    fn refuses_what_cannot_be_scored() {
        let cases = [
            ("{\"type\": \"fact\"}", "line 1"),
            (
                "{\"type\": \"note\", \"user\": \"u\"}",
                "unknown variant `note`",
            ),
            (
                &OK.replace("\"id\": \"b\"", "\"id\": \"a\""),
                "fact \"a\" of user \"u\" appears twice",
            ),
            (
                &OK.replace("[\"a\"]", "[\"zz\"]"),
                "names fact \"zz\", which user \"u\" does not have",
            ),
            (&OK.replace("[\"a\"]", "[]"), "names no relevant fact"),
            (
                &OK.replace(
                    "\"user\": \"u\", \"id\": \"q\"",
                    "\"user\": \"v\", \"id\": \"q\"",
                ),
                "user \"v\" does not have",
            ),
            (OK.lines().next().unwrap(), "no queries"),
            (&OK.replace("Likes tea", "  "), "has no content"),
        ];
        for (text, says) in cases {
            let err = Dataset::parse(text).unwrap_err().to_string();
            assert!(err.contains(says), "{err:?} does not say {says:?}");
        }
    }

    #[test]
    fn the_slice_keeps_the_chosen_users_facts() {
        let text = format!(
            "{OK}{}",
            r#"{"type": "fact", "user": "w", "id": "c", "content": "Has a dog"}
{"type": "query", "user": "w", "id": "q2", "query": "dog", "kind": "lexical", "relevant": ["c"]}
{"type": "query", "user": "u", "id": "q3", "query": "Oslo", "kind": "lexical", "relevant": ["b"]}
"#
        );
        let d = Dataset::parse(&text).unwrap();
        let s = d.slice(1, 1);
        assert_eq!(s.queries.len(), 1);
        assert_eq!(s.queries[0].id, "q");
        assert_eq!(s.facts.len(), 2);
        assert!(s.facts.iter().all(|f| f.user == "u"));
    }
}
