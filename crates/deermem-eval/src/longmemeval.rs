//! LongMemEval to the harness format: each question becomes a user whose facts are the turns of
//! its haystack sessions, and one query whose relevant facts are the turns marked
//! `has_answer` (or, when a question marks none, every user turn of its answer sessions).
//! Abstention questions (no evidence) are left out and counted.

use serde::Deserialize;

use crate::dataset::{Dataset, EvalFact, EvalQuery};

/// One LongMemEval question, as in `longmemeval_s.json` / `_m` / `_oracle`.
#[derive(Debug, Deserialize)]
pub struct Instance {
    /// The question's id.
    pub question_id: String,
    /// Its type (`single-session-user`, `multi-session`, `temporal-reasoning`...).
    pub question_type: String,
    /// The question.
    pub question: String,
    /// The ids of `haystack_sessions`, in order.
    pub haystack_session_ids: Vec<String>,
    /// The conversation sessions.
    pub haystack_sessions: Vec<Vec<Turn>>,
    /// The sessions holding the evidence.
    #[serde(default)]
    pub answer_session_ids: Vec<String>,
}

/// One turn of a session.
#[derive(Debug, Deserialize)]
pub struct Turn {
    /// `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
    /// Whether this turn holds the evidence.
    #[serde(default)]
    pub has_answer: bool,
}

/// Why a file cannot be converted.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// Not LongMemEval's JSON.
    #[error("not a LongMemEval file: {0}")]
    Format(#[from] serde_json::Error),
    /// Session ids and sessions disagree.
    #[error("question {0:?}: {1} session ids for {2} sessions")]
    Sessions(String, usize, usize),
}

/// What the conversion did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Converted {
    /// The dataset.
    pub dataset: Dataset,
    /// Questions left out because they have no evidence to find.
    pub skipped_abstentions: usize,
}

/// An id made of the characters the engine accepts (`[A-Za-z0-9_-]`), at most 200 bytes.
fn safe(raw: &str) -> String {
    let s: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(200)
        .collect();
    if s.is_empty() { "_".into() } else { s }
}

/// Converts the JSON text of a LongMemEval file.
///
/// # Errors
/// Text that is not a list of LongMemEval questions.
pub fn convert(text: &str) -> Result<Converted, ConvertError> {
    let instances: Vec<Instance> = serde_json::from_str(text)?;
    let mut out = Converted::default();
    for inst in instances {
        if inst.haystack_session_ids.len() != inst.haystack_sessions.len() {
            return Err(ConvertError::Sessions(
                inst.question_id,
                inst.haystack_session_ids.len(),
                inst.haystack_sessions.len(),
            ));
        }
        let user = safe(&inst.question_id);
        let mut facts = Vec::new();
        let mut marked = Vec::new();
        let mut answer_user_turns = Vec::new();
        for (sid, session) in inst
            .haystack_session_ids
            .iter()
            .zip(&inst.haystack_sessions)
        {
            let in_answer = inst.answer_session_ids.contains(sid);
            for (t, turn) in session.iter().enumerate() {
                if turn.content.trim().is_empty() {
                    continue;
                }
                let id = safe(&format!("{sid}-{t}"));
                if turn.has_answer {
                    marked.push(id.clone());
                }
                if in_answer && turn.role == "user" {
                    answer_user_turns.push(id.clone());
                }
                facts.push(EvalFact {
                    user: user.clone(),
                    id,
                    content: turn.content.clone(),
                    category: None,
                    lang: Some("en".into()),
                });
            }
        }
        let relevant = if marked.is_empty() {
            answer_user_turns
        } else {
            marked
        };
        if relevant.is_empty() || inst.question_id.ends_with("_abs") {
            out.skipped_abstentions += 1;
            continue;
        }
        out.dataset.facts.extend(facts);
        out.dataset.queries.push(EvalQuery {
            user,
            id: inst.question_id.clone(),
            query: inst.question,
            kind: inst.question_type,
            lang: Some("en".into()),
            relevant,
        });
    }
    Ok(out)
}
