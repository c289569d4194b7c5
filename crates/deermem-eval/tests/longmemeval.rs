//! The LongMemEval converter on a small synthetic file in LongMemEval's schema: the result reads
//! back as a valid dataset, evidence turns become the relevant facts, abstentions are left out.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use deermem_eval::Dataset;
use deermem_eval::longmemeval::convert;

const SAMPLE: &str = r#"[
  {
    "question_id": "q1",
    "question_type": "single-session-user",
    "question": "What degree did I graduate with?",
    "answer": "Business Administration",
    "question_date": "2023/05/30 (Tue) 23:40",
    "haystack_dates": ["2023/05/20 (Sat) 02:21", "2023/05/21 (Sun) 10:00"],
    "haystack_session_ids": ["sharegpt_abc_0", "answer_280352e9"],
    "haystack_sessions": [
      [{"role": "user", "content": "Recommend a sci-fi novel."},
       {"role": "assistant", "content": "Try Hyperion."}],
      [{"role": "user", "content": "I graduated with a degree in Business Administration.", "has_answer": true},
       {"role": "assistant", "content": "Congratulations!"},
       {"role": "user", "content": ""}]
    ],
    "answer_session_ids": ["answer_280352e9"]
  },
  {
    "question_id": "q2",
    "question_type": "multi-session",
    "question": "How many bikes do I own?",
    "answer": "3",
    "question_date": "2023/05/30",
    "haystack_dates": ["d"],
    "haystack_session_ids": ["answer_x.1"],
    "haystack_sessions": [[{"role": "user", "content": "I bought a third bike."},
                           {"role": "assistant", "content": "Nice."}]],
    "answer_session_ids": ["answer_x.1"]
  },
  {
    "question_id": "q3_abs",
    "question_type": "temporal-reasoning",
    "question": "When did I adopt my cat?",
    "answer": "You never mentioned a cat.",
    "question_date": "d",
    "haystack_dates": ["d"],
    "haystack_session_ids": ["s9"],
    "haystack_sessions": [[{"role": "user", "content": "Hello."}]],
    "answer_session_ids": []
  }
]"#;

#[test]
fn converts_longmemeval_questions_into_users_facts_and_queries() {
    let out = convert(SAMPLE).unwrap();
    assert_eq!(out.skipped_abstentions, 1);
    let d = &out.dataset;
    assert_eq!(d.queries.len(), 2);
    assert_eq!(d.queries[0].relevant, vec!["answer_280352e9-0"]);
    assert_eq!(d.queries[0].kind, "single-session-user");
    // No turn marked: every user turn of the answer session, with the id made safe.
    assert_eq!(d.queries[1].relevant, vec!["answer_x_1-0"]);
    // Empty turns are dropped; the abstention's facts are not kept.
    assert_eq!(d.facts.iter().filter(|f| f.user == "q1").count(), 4);
    assert!(d.facts.iter().all(|f| f.user != "q3_abs"));
    let again = Dataset::parse(&d.to_jsonl()).unwrap();
    assert_eq!(&again, d);
}

#[test]
fn refuses_files_in_another_shape() {
    assert!(convert("{\"not\": \"a list\"}").is_err());
    let bad = SAMPLE.replace(
        "\"haystack_session_ids\": [\"s9\"]",
        "\"haystack_session_ids\": []",
    );
    let err = convert(&bad).unwrap_err().to_string();
    assert!(
        err.contains("q3_abs") && err.contains("0 session ids for 1 sessions"),
        "{err}"
    );
}
