//! The offline proposer: when no model is configured, clear first-person statements of the
//! user ("I'm a …", "I prefer …", "my goal is …", "we decided …", "actually, X not Y", and their
//! Chinese and Japanese counterparts) become labelled fact proposals. They go through exactly
//! the same gates as a model's proposals (threshold, dedup, capacity, upload stripping).
//!
//! The rules are deliberately narrow: a sentence must start with the statement, questions are
//! ignored, and statements about "this"/"it" (the current task) are not memories.

use std::sync::OnceLock;

use deermem_core::{Message, MessageKind, py};
use regex::Regex;

use crate::parse::{ProposedFact, ProposedUpdate};

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
    fn category(self) -> &'static str {
        match self {
            Self::Identity => "identity",
            Self::Preference => "preference",
            Self::Goal => "goal",
            Self::Decision => "decision",
            Self::Correction => "correction",
        }
    }

    fn confidence(self) -> f64 {
        match self {
            Self::Identity => 0.85,
            Self::Preference => 0.8,
            Self::Goal | Self::Decision => 0.75,
            Self::Correction => 0.9,
        }
    }

    fn valid_days(self) -> Option<i128> {
        match self {
            Self::Identity => Some(3650),
            Self::Preference => Some(365),
            Self::Goal | Self::Decision => Some(180),
            Self::Correction => None,
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

/// Extracts labelled proposals from the user turns of `feed`.
pub fn propose_offline(feed: &[Message]) -> ProposedUpdate {
    let mut update = ProposedUpdate::default();
    let mut index = 0usize;
    for msg in feed.iter().filter(|m| m.kind == MessageKind::Human) {
        for sentence in sentences(&msg.text()) {
            let Some((rule, caps)) = rules()
                .iter()
                .find_map(|r| r.re.captures(&sentence).map(|c| (r, c)))
            else {
                continue;
            };
            let Some((content, source_error)) = render(rule, &caps) else {
                continue;
            };
            update.new_facts.push(ProposedFact {
                index,
                content,
                category: rule.kind.category().to_owned(),
                confidence: rule.kind.confidence(),
                source_error,
                expected_valid_days: rule.kind.valid_days(),
                scope: Some("user".into()),
                durability: Some("durable".into()),
                authority: Some("descriptive".into()),
            });
            index += 1;
        }
    }
    update
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
}
