//! The offline proposer: when no model is configured, clear first-person statements of the
//! user ("I'm a …", "I prefer …", "my goal is …", "we decided …", "actually, X not Y", and their
//! Chinese and Japanese counterparts) become labelled fact proposals. They go through exactly
//! the same gates as a model's proposals (threshold, dedup, capacity, upload stripping).
//!
//! The rules are deliberately narrow: a sentence must start with the statement, questions are
//! ignored, and statements about "this"/"it" (the current task) are not memories.
//!
//! A correction ("actually, X, not Y") that names something a stored fact says (`Y`) replaces
//! that fact: the proposal is the stored text with `Y` changed to `X` (its `sourceError` is `Y`)
//! plus a contradiction removal of the stored fact naming the new one as its replacement, so
//! the gates remove the old fact only if the new one is kept. A correction that matches no
//! stored fact is recorded as a `correction` fact of its own.

use std::sync::OnceLock;

use deermem_core::{Fact, MemoryDocument, Message, MessageKind};
use deermem_pycompat::py;
use regex::Regex;

use crate::parse::{ProposedFact, ProposedUpdate, RemovalEntry, ReplacementRef};

/// What kind of statement a rule recognises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Identity,
    Preference,
    Goal,
    Decision,
    Correction,
}

impl Kind {
    /// The category, confidence and review window (days) of the facts this kind proposes.
    fn profile(self) -> (&'static str, f64, Option<i128>) {
        match self {
            Self::Identity => ("identity", 0.85, Some(3650)),
            Self::Preference => ("preference", 0.8, Some(365)),
            Self::Goal => ("goal", 0.75, Some(180)),
            Self::Decision => ("decision", 0.75, Some(180)),
            Self::Correction => ("correction", 0.9, None),
        }
    }
}

/// How a rule turns its captures into fact text.
#[derive(Clone, Copy, Debug)]
enum Render {
    /// `prefix` + third-person verb form of capture `verb` + " " + `x`.
    Verb(&'static str),
    /// `template` with `{x}` (and optionally `{v}` for capture `v`) replaced.
    Template(&'static str),
    /// A correction: `x` is what is right, `y` what was wrong.
    Correction,
}

struct Rule {
    kind: Kind,
    re: Regex,
    render: Render,
}

fn rules() -> &'static [Rule] {
    static RULES: OnceLock<Vec<Rule>> = OnceLock::new();
    RULES.get_or_init(|| {
        let mk = |kind, pattern: &str, render| {
            Regex::new(pattern).ok().map(|re| Rule { kind, re, render })
        };
        [
            // English.
            mk(Kind::Identity, r"(?i)^(?:i'm|i am) (?P<a>an?) (?P<x>.+)$", Render::Template("User is {a} {x}")),
            mk(Kind::Identity, r"(?i)^i work as (?P<a>an?) (?P<x>.+)$", Render::Template("User works as {a} {x}")),
            mk(Kind::Identity, r"(?i)^my (?P<v>job|role|profession|occupation|job title) is (?P<x>.+)$", Render::Template("User's {v} is {x}")),
            mk(Kind::Identity, r"(?i)^my name is (?P<x>.+)$", Render::Template("User's name is {x}")),
            mk(Kind::Preference, r"(?i)^i (?:really |strongly |generally |usually |much |definitely |always )?(?P<verb>prefer|like|love|enjoy|hate|dislike) (?P<x>.+)$", Render::Verb("User ")),
            mk(Kind::Preference, r"(?i)^i(?:'d| would) rather (?P<x>.+)$", Render::Template("User would rather {x}")),
            mk(Kind::Preference, r"(?i)^my favou?rite (?P<v>[\w -]{1,30}?) is (?P<x>.+)$", Render::Template("User's favorite {v} is {x}")),
            mk(Kind::Goal, r"(?i)^(?:my|our) (?:main |long-term |ultimate )?(?:goal|aim|objective) is to (?P<x>.+)$", Render::Template("User's goal is to {x}")),
            mk(Kind::Goal, r"(?i)^i(?:'m| am) (?:planning|aiming) to (?P<x>.+)$", Render::Template("User plans to {x}")),
            mk(Kind::Goal, r"(?i)^i plan to (?P<x>.+)$", Render::Template("User plans to {x}")),
            mk(Kind::Decision, r"(?i)^(?:we|i)(?:'ve| have)? decided (?P<v>to|on) (?P<x>.+)$", Render::Template("User decided {v} {x}")),
            mk(Kind::Correction, r"(?i)^(?:no,?\s+)?actually,?\s+(?:it'?s\s+|it is\s+)?(?P<x>.+?),?\s+not\s+(?P<y>.+)$", Render::Correction),
            // Chinese.
            mk(Kind::Identity, r"^我是(?P<x>一[名个位].{1,30}|.{1,20}(?:工程师|开发者|程序员|设计师|研究员|学生|老师|教师|教授|经理|分析师|医生|律师|作家|创始人|架构师|科学家))$", Render::Template("用户是{x}")),
            mk(Kind::Identity, r"^我的?(?P<v>职业|工作|职位)是(?P<x>.+)$", Render::Template("用户的{v}是{x}")),
            mk(Kind::Preference, r"^我(?:更|比较|很|非常|特别|一直)?(?P<v>喜欢|偏好|爱用|习惯用|讨厌|不喜欢)(?P<x>.+)$", Render::Template("用户{v}{x}")),
            mk(Kind::Goal, r"^我的目标是(?P<x>.+)$", Render::Template("用户的目标是{x}")),
            mk(Kind::Goal, r"^我(?:打算|计划)(?P<x>.+)$", Render::Template("用户计划{x}")),
            mk(Kind::Decision, r"^我们?决定(?P<x>.+)$", Render::Template("用户决定{x}")),
            mk(Kind::Correction, r"^(?:其实)?不是(?P<y>.+?)[,，]\s*(?:而)?是(?P<x>.+)$", Render::Correction),
            mk(Kind::Correction, r"^其实是(?P<x>.+?)[,，]\s*不是(?P<y>.+)$", Render::Correction),
            // Japanese.
            mk(Kind::Identity, r"^私は(?P<x>.{1,20}(?:エンジニア|開発者|学生|デザイナー|研究者|教師|医者))です$", Render::Template("ユーザーは{x}です")),
            mk(Kind::Preference, r"^(?P<x>.{1,30})が(?P<v>好き|嫌い)です$", Render::Template("ユーザーは{x}が{v}")),
        ]
        .into_iter()
        .flatten()
        .collect()
    })
}

/// First words that make an English capture about the task at hand, not the user.
const TASK_WORDS: [&str; 14] = [
    "it", "this", "that", "these", "those", "them", "your", "you", "bit", "little", "tad", "lot",
    "moment", "second",
];

const MIN_CAPTURE_CHARS: usize = 2;
const MAX_CAPTURE_CHARS: usize = 160;

fn third_person(verb: &str) -> String {
    let v = verb.to_lowercase();
    if v.ends_with('s')
        || v.ends_with("sh")
        || v.ends_with("ch")
        || v.ends_with('x')
        || v.ends_with('o')
    {
        format!("{v}es")
    } else {
        format!("{v}s")
    }
}

fn clean(capture: &str) -> Option<String> {
    let t = py::strip(capture).trim_end_matches([',', ';', ':', '，', '；', '：']);
    let t = py::strip(t);
    let n = py::char_len(t);
    if !(MIN_CAPTURE_CHARS..=MAX_CAPTURE_CHARS).contains(&n) {
        return None;
    }
    let first = t.split_whitespace().next().unwrap_or("").to_lowercase();
    if TASK_WORDS.contains(&first.as_str()) {
        return None;
    }
    Some(t.to_owned())
}

/// Splits a user turn into sentences, dropping questions.
fn sentences(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for c in text.chars() {
        match c {
            '.' | '!' | '。' | '！' | '\n' => {
                out.push(std::mem::take(&mut cur));
            }
            '?' | '？' => {
                cur.clear();
            }
            other => cur.push(other),
        }
    }
    out.push(cur);
    out.into_iter()
        .map(|s| {
            let s = py::strip(&s);
            // Leading fillers ("Also, ", "By the way, ", "Oh and ") do not change the statement.
            for filler in [
                "also, ",
                "also ",
                "btw, ",
                "btw ",
                "by the way, ",
                "fyi, ",
                "oh, ",
                "oh and ",
                "and ",
                "well, ",
                "ok, ",
                "okay, ",
            ] {
                if let Some(head) = s.get(..filler.len())
                    && head.eq_ignore_ascii_case(filler)
                {
                    return py::strip(&s[filler.len()..]).to_owned();
                }
            }
            s.to_owned()
        })
        .filter(|s| !s.is_empty())
        .collect()
}

fn render(rule: &Rule, caps: &regex::Captures<'_>) -> Option<(String, Option<String>)> {
    let get = |name: &str| caps.name(name).map(|m| m.as_str());
    match rule.render {
        Render::Verb(prefix) => {
            let x = clean(get("x")?)?;
            Some((format!("{prefix}{} {x}", third_person(get("verb")?)), None))
        }
        Render::Template(t) => {
            let x = clean(get("x")?)?;
            let mut s = t.replace("{x}", &x);
            if let Some(a) = get("a") {
                s = s.replace("{a}", &a.to_lowercase());
            }
            if let Some(v) = get("v") {
                s = s.replace("{v}", v);
            }
            Some((s, None))
        }
        Render::Correction => {
            let x = clean(get("x")?)?;
            let y = clean(get("y")?)?;
            Some((format!("Correction: {x}, not {y}"), Some(y)))
        }
    }
}

#[cfg(test)]
/// Extracts labelled proposals from the user turns of `feed`, without looking at memory.
pub(crate) fn propose_offline(feed: &[Message]) -> ProposedUpdate {
    propose_offline_with_memory(feed, None)
}

/// Extracts labelled proposals from the user turns of `feed`; corrections that name what a fact
/// of `memory` says replace that fact (see the module documentation).
pub(crate) fn propose_offline_with_memory(
    feed: &[Message],
    memory: Option<&MemoryDocument>,
) -> ProposedUpdate {
    let mut update = ProposedUpdate::default();
    let mut replaced: Vec<&str> = Vec::new();
    for msg in feed.iter().filter(|m| m.kind == MessageKind::Human) {
        for sentence in sentences(&msg.text()) {
            let Some((rule, caps)) = rules()
                .iter()
                .find_map(|r| r.re.captures(&sentence).map(|c| (r, c)))
            else {
                continue;
            };
            let index = update.new_facts.len();
            if rule.kind == Kind::Correction
                && let Some(memory) = memory
                && let Some((old, content, wrong)) = correct_stored_fact(&caps, memory, &replaced)
            {
                replaced.push(old.id.as_str());
                update.new_facts.push(ProposedFact {
                    index,
                    content,
                    category: old.category_or_default().to_owned(),
                    confidence: Kind::Correction.profile().1,
                    source_error: Some(wrong.clone()),
                    expected_valid_days: old.expected_valid_days().map(i128::from),
                    scope: Some("user".into()),
                    durability: Some("durable".into()),
                    authority: Some("descriptive".into()),
                });
                update.facts_to_remove.push(RemovalEntry {
                    id: old.id.as_str().to_owned(),
                    scope: Some("user".into()),
                    reason: Some(format!("the user corrected it: not {wrong}")),
                    replacement: ReplacementRef::Index(index),
                });
                continue;
            }
            let Some((content, source_error)) = render(rule, &caps) else {
                continue;
            };
            let (category, confidence, expected_valid_days) = rule.kind.profile();
            update.new_facts.push(ProposedFact {
                index,
                content,
                category: category.to_owned(),
                confidence,
                source_error,
                expected_valid_days,
                scope: Some("user".into()),
                durability: Some("durable".into()),
                authority: Some("descriptive".into()),
            });
        }
    }
    update
}

/// For a correction "X, not Y": the stored fact that says `Y` (and not already `X`), its text
/// with `Y` replaced by the part of `X` that contrasts with it, and `Y`.
fn correct_stored_fact<'m>(
    caps: &regex::Captures<'_>,
    memory: &'m MemoryDocument,
    already: &[&str],
) -> Option<(&'m Fact, String, String)> {
    let right = clean(caps.name("x")?.as_str())?;
    let wrong = clean(caps.name("y")?.as_str())?;
    let right = contrasting_tail(&right, &wrong);
    if wrong.chars().count() < 2 || right.is_empty() || right.eq_ignore_ascii_case(&wrong) {
        return None;
    }
    let mut best: Option<(&Fact, usize)> = None;
    for fact in memory.facts.iter() {
        if already.contains(&fact.id.as_str()) || fact.category_or_default() == "correction" {
            continue;
        }
        let Some(at) = find_term(&fact.content, &wrong) else {
            continue;
        };
        if find_term(&fact.content, &right).is_some() {
            continue;
        }
        // The most recently written fact wins a tie between several that say `Y`.
        if best.is_none_or(|(b, _)| fact.updated_at > b.updated_at) {
            best = Some((fact, at));
        }
    }
    let (fact, at) = best?;
    let mut content = String::with_capacity(fact.content.len() + right.len());
    content.push_str(&fact.content[..at]);
    content.push_str(&right);
    content.push_str(&fact.content[at + wrong.len()..]);
    Some((fact, content, wrong))
}

/// The words at the end of `right` that stand against `wrong`: as many words as `wrong` has
/// ("the deadline is April" against "March" is "April").
fn contrasting_tail(right: &str, wrong: &str) -> String {
    let n = wrong.split_whitespace().count().max(1);
    let words: Vec<&str> = right.split_whitespace().collect();
    if words.len() <= n {
        return right.to_owned();
    }
    words[words.len() - n..].join(" ")
}

/// The byte offset of `term` in `text`, case-insensitively for ASCII, at word boundaries where
/// the neighbours are ASCII alphanumerics (CJK text has no spaces, so any position counts).
fn find_term(text: &str, term: &str) -> Option<usize> {
    if term.is_empty() || term.len() > text.len() {
        return None;
    }
    let hay = text.as_bytes();
    let needle = term.as_bytes();
    (0..=hay.len() - needle.len()).find(|&i| {
        text.is_char_boundary(i)
            && text.is_char_boundary(i + needle.len())
            && hay[i..i + needle.len()].eq_ignore_ascii_case(needle)
            && !(i > 0 && hay[i - 1].is_ascii_alphanumeric() && needle[0].is_ascii_alphanumeric())
            && !(i + needle.len() < hay.len()
                && hay[i + needle.len()].is_ascii_alphanumeric()
                && needle[needle.len() - 1].is_ascii_alphanumeric())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(text: &str) -> Vec<(String, String)> {
        propose_offline(&[Message::human(text), Message::ai("ok")])
            .new_facts
            .into_iter()
            .map(|f| (f.content, f.category))
            .collect()
    }

    #[test]
    fn english_statements() {
        assert_eq!(
            facts("I'm a data scientist at Acme."),
            vec![("User is a data scientist at Acme".into(), "identity".into())]
        );
        assert_eq!(
            facts("I prefer tabs over spaces"),
            vec![("User prefers tabs over spaces".into(), "preference".into())]
        );
        assert_eq!(
            facts("Also, I really like dark themes!"),
            vec![("User likes dark themes".into(), "preference".into())]
        );
        assert_eq!(
            facts("My goal is to ship v2 by June."),
            vec![("User's goal is to ship v2 by June".into(), "goal".into())]
        );
        assert_eq!(
            facts("We decided to use Postgres for everything."),
            vec![(
                "User decided to use Postgres for everything".into(),
                "decision".into()
            )]
        );
        assert_eq!(
            facts("My favorite editor is Helix"),
            vec![(
                "User's favorite editor is Helix".into(),
                "preference".into()
            )]
        );
    }

    #[test]
    fn corrections_record_what_was_wrong() {
        let u = propose_offline(&[Message::human("Actually, I use Postgres, not MySQL.")]);
        assert_eq!(u.new_facts.len(), 1);
        let f = &u.new_facts[0];
        assert_eq!(f.content, "Correction: I use Postgres, not MySQL");
        assert_eq!(f.category, "correction");
        assert_eq!(f.source_error.as_deref(), Some("MySQL"));
        assert!(f.confidence >= 0.9);
        let u = propose_offline(&[Message::human("不是MySQL，是Postgres")]);
        assert_eq!(u.new_facts[0].content, "Correction: Postgres, not MySQL");
    }

    #[test]
    fn chinese_and_japanese_statements() {
        assert_eq!(
            facts("我是一名后端工程师。"),
            vec![("用户是一名后端工程师".into(), "identity".into())]
        );
        assert_eq!(
            facts("我更喜欢用 Rust 写服务"),
            vec![("用户喜欢用 Rust 写服务".into(), "preference".into())]
        );
        assert_eq!(
            facts("我的目标是今年通过考试"),
            vec![("用户的目标是今年通过考试".into(), "goal".into())]
        );
        assert_eq!(
            facts("我们决定采用 Postgres"),
            vec![("用户决定采用 Postgres".into(), "decision".into())]
        );
        assert_eq!(
            facts("私はソフトウェアエンジニアです"),
            vec![(
                "ユーザーはソフトウェアエンジニアです".into(),
                "identity".into()
            )]
        );
    }

    #[test]
    fn questions_task_talk_and_vague_statements_are_ignored() {
        for t in [
            "Do I prefer tabs?",
            "I like this answer",
            "I like it",
            "I'm a bit confused",
            "I am not sure about this",
            "Can you fix the bug",
            "我是说这个不行",
            "",
        ] {
            assert!(facts(t).is_empty(), "{t:?}: {:?}", facts(t));
        }
        // Assistant turns never produce facts.
        assert!(
            propose_offline(&[Message::ai("I prefer tabs")])
                .new_facts
                .is_empty()
        );
    }

    #[test]
    fn proposals_are_labelled_for_the_gates() {
        let u = propose_offline(&[Message::human("I prefer tabs. I'm an SRE. My name is Ada")]);
        assert_eq!(u.new_facts.len(), 3);
        for (i, f) in u.new_facts.iter().enumerate() {
            assert_eq!(f.index, i);
            assert_eq!(f.scope.as_deref(), Some("user"));
            assert_eq!(f.durability.as_deref(), Some("durable"));
            assert_eq!(f.authority.as_deref(), Some("descriptive"));
        }
        assert!(u.facts_to_remove.is_empty());
    }

    fn memory(facts: &[(&str, &str, &str)]) -> MemoryDocument {
        let mut d = MemoryDocument::empty(crate::testutil::ts("2026-06-01T00:00:00Z"));
        d.facts = facts
            .iter()
            .map(|(id, category, content)| {
                crate::testutil::fact(serde_json::json!({
                    "id": id, "category": category, "content": content, "confidence": 0.75,
                    "expected_valid_days": 180,
                }))
            })
            .collect();
        d
    }

    #[test]
    fn a_correction_naming_a_stored_fact_replaces_it() {
        let d = memory(&[
            (
                "fact_goal",
                "goal",
                "User's goal is to ship the service before March",
            ),
            ("fact_tea", "preference", "User likes tea"),
        ]);
        let feed = [Message::human(
            "Actually, the deadline is April, not March.",
        )];
        let u = propose_offline_with_memory(&feed, Some(&d));
        assert_eq!(u.new_facts.len(), 1, "{u:?}");
        let f = &u.new_facts[0];
        assert_eq!(f.content, "User's goal is to ship the service before April");
        assert_eq!(f.category, "goal", "the replaced fact's category is kept");
        assert_eq!(f.source_error.as_deref(), Some("March"));
        assert_eq!(f.expected_valid_days, Some(180));
        assert_eq!(u.facts_to_remove.len(), 1);
        let r = &u.facts_to_remove[0];
        assert_eq!(r.id, "fact_goal");
        assert_eq!(r.replacement, ReplacementRef::Index(0));

        // Without memory, or when nothing stored says "March", it is a correction fact.
        let alone = propose_offline(&feed);
        assert_eq!(
            alone.new_facts[0].content,
            "Correction: the deadline is April, not March"
        );
        assert!(alone.facts_to_remove.is_empty());
        let unrelated = memory(&[("fact_tea", "preference", "User likes tea")]);
        let u = propose_offline_with_memory(&feed, Some(&unrelated));
        assert_eq!(u.new_facts[0].category, "correction");
        assert!(u.facts_to_remove.is_empty());
    }

    #[test]
    fn correction_matching_respects_words_case_and_what_is_already_right() {
        // "Mar" inside "Marseille" is not the word "Mar".
        let d = memory(&[("fact_city", "identity", "User lives in Marseille")]);
        let u = propose_offline_with_memory(
            &[Message::human("Actually, it's Apr, not Mar.")],
            Some(&d),
        );
        assert!(u.facts_to_remove.is_empty(), "{u:?}");
        // Case-insensitive match, the stored text keeps its own surroundings.
        let d = memory(&[(
            "fact_db",
            "decision",
            "We store everything in mysql for now",
        )]);
        let u = propose_offline_with_memory(
            &[Message::human("Actually, I use Postgres, not MySQL.")],
            Some(&d),
        );
        assert_eq!(
            u.new_facts[0].content,
            "We store everything in Postgres for now"
        );
        assert_eq!(u.facts_to_remove[0].id, "fact_db");
        // A fact that already says the right thing is not "corrected".
        let d = memory(&[("fact_db", "decision", "Moved from MySQL to Postgres")]);
        let u = propose_offline_with_memory(
            &[Message::human("Actually, I use Postgres, not MySQL.")],
            Some(&d),
        );
        assert!(u.facts_to_remove.is_empty());
        // Chinese: no spaces, the whole phrase is the term.
        let d = memory(&[("fact_db", "decision", "项目数据库用MySQL")]);
        let u = propose_offline_with_memory(&[Message::human("不是MySQL，是Postgres")], Some(&d));
        assert_eq!(u.new_facts[0].content, "项目数据库用Postgres");
        // One stored fact is replaced once even when two sentences name it.
        let d = memory(&[("fact_db", "decision", "The database is MySQL")]);
        let u = propose_offline_with_memory(
            &[Message::human(
                "Actually, it's Postgres, not MySQL. Actually, it's SQLite, not MySQL.",
            )],
            Some(&d),
        );
        assert_eq!(u.facts_to_remove.len(), 1);
        assert_eq!(u.new_facts.len(), 2);
        assert_eq!(u.new_facts[1].category, "correction");
    }

    #[test]
    fn a_replacement_passes_the_gates_and_removes_the_old_fact() {
        use crate::apply::{ApplyContext, apply_update};
        let d = memory(&[(
            "fact_goal",
            "goal",
            "User's goal is to ship the service before March",
        )]);
        let u = propose_offline_with_memory(
            &[Message::human(
                "Actually, the deadline is April, not March.",
            )],
            Some(&d),
        );
        let cfg = crate::DeerMemConfig::default();
        let usage = deermem_core::policy::eviction::FactUsageMap::new();
        let ids =
            crate::facts::FactIdSource::from_fn(|| deermem_core::FactId::new("fact_new").unwrap());
        let s = crate::testutil::scope();
        let ctx = ApplyContext {
            config: &cfg,
            now: crate::testutil::ts("2026-06-02T00:00:00Z"),
            thread_id: "t",
            turns: &[],
            signals: crate::signals::SignalSet::new(),
            scope: &s,
            usage: &usage,
            ids: &ids,
            consolidation_allowed: None,
        };
        let out = apply_update(&d, &u, &ctx);
        let contents: Vec<&str> = out
            .document
            .facts
            .iter()
            .map(|f| f.content.as_str())
            .collect();
        assert_eq!(
            contents,
            ["User's goal is to ship the service before April"]
        );
        assert_eq!(out.document.facts[0].source_error(), Some("March"));
    }
}
