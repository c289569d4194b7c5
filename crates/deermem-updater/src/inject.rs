//! The memory text injected into conversations, in the reference's format: `User Context:`,
//! `History:` and `Facts:` sections, guaranteed categories first within their own budget, then the
//! rest by confidence under `max_injection_tokens`, and structure-aware truncation that shortens
//! the summaries before it would ever cut a fact.

use crate::DeerMemConfig;
use deermem_core::{Fact, MemoryDocument, MemoryMode, SummarySection};
use deermem_pycompat::py;
use serde_json::Value;

use crate::facts::display_category;
use crate::text::fmt2;
use crate::tokens::TokenCounter;
use deermem_pycompat::py::html_escape;

/// How the injection text is built.
#[derive(Clone, Debug, PartialEq)]
pub struct InjectionOptions {
    /// `injection_enabled`: when false the text is always empty.
    pub enabled: bool,
    /// Whether facts are included (middleware mode) or only summaries (tool mode).
    pub include_facts: bool,
    /// `max_injection_tokens`.
    pub max_tokens: usize,
    /// The token counter.
    pub counter: TokenCounter,
    /// Categories injected first, with their own budget.
    pub guaranteed_categories: Vec<String>,
    /// `guaranteed_token_budget`.
    pub guaranteed_token_budget: usize,
}

impl InjectionOptions {
    /// The options a configuration selects for a mode.
    pub fn from_config(cfg: &DeerMemConfig, mode: MemoryMode, injection_enabled: bool) -> Self {
        Self {
            enabled: injection_enabled,
            include_facts: mode == MemoryMode::Middleware,
            max_tokens: cfg.max_injection_tokens,
            counter: TokenCounter::new(cfg.token_counting),
            guaranteed_categories: cfg.guaranteed_categories.clone(),
            guaranteed_token_budget: cfg.guaranteed_token_budget,
        }
    }
}

const USER_LINES: [(&str, &str); 3] = [
    ("workContext", "Work"),
    ("personalContext", "Personal"),
    ("topOfMind", "Current Focus"),
];
const HISTORY_LINES: [(&str, &str); 3] = [
    ("recentMonths", "Recent"),
    ("earlierContext", "Earlier"),
    ("longTermBackground", "Background"),
];

/// A summary's text: strings as they are, other scalars as Python prints them; lists,
/// mappings and falsy values show nothing. A child that is not a mapping is skipped instead of
/// failing the whole injection (as a `null` section did in the reference).
fn summary_text(section: &SummarySection, key: &str) -> Option<String> {
    let v = section.as_map().get(key)?.as_object()?.get("summary")?;
    if !py::truthy(v) {
        return None;
    }
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Array(_) | Value::Object(_) => None,
        other => py::py_str(other),
    }
}

fn section_block(section: &SummarySection, title: &str, lines: &[(&str, &str)]) -> Option<String> {
    let body: Vec<String> = lines
        .iter()
        .filter_map(|(key, label)| {
            summary_text(section, key).map(|t| format!("- {label}: {}", html_escape(&t, false)))
        })
        .collect();
    (!body.is_empty()).then(|| format!("{title}:\n{}", body.join("\n")))
}

/// One fact line: `- [{category} | {confidence:.2f}] {content}`, with ` (avoid: …)` after a
/// correction that records the earlier mistake.
pub(crate) fn fact_line(fact: &Fact) -> Option<String> {
    if py::strip(&fact.content).is_empty() {
        return None;
    }
    let category = html_escape(display_category(fact), false);
    let confidence = if fact.confidence.is_finite() {
        fact.confidence.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let mut line = format!(
        "- [{category} | {}] {}",
        fmt2(confidence),
        html_escape(&fact.content, false)
    );
    if category == "correction"
        && let Some(se) = fact.source_error().map(py::strip).filter(|s| !s.is_empty())
    {
        line.push_str(&format!(" (avoid: {})", html_escape(se, false)));
    }
    Some(line)
}

/// Greedy selection in confidence order: a fact whose line does not fit the remaining budget is
/// skipped and the less confident facts after it still get their turn, so one oversized fact
/// cannot empty the block (the reference stopped at the first fact that did not fit).
fn select_lines(facts: &[&Fact], budget: usize, counter: &TokenCounter) -> (Vec<String>, usize) {
    let mut lines = Vec::new();
    let mut used = 0usize;
    for f in facts {
        let Some(line) = fact_line(f) else {
            continue;
        };
        let piece = if lines.is_empty() {
            line.clone()
        } else {
            format!("\n{line}")
        };
        let cost = counter.count(&piece);
        if used + cost > budget {
            continue;
        }
        used += cost;
        lines.push(line);
    }
    (lines, used)
}

fn by_confidence<'a>(facts: impl Iterator<Item = &'a Fact>) -> Vec<&'a Fact> {
    let mut v: Vec<&Fact> = facts.collect();
    // Stable: ties keep storage order (id ascending).
    v.sort_by(|a, b| b.confidence.total_cmp(&a.confidence));
    v
}

const FACTS_HEADER: &str = "Facts:\n";

/// Formats the memory for injection (without the `<memory>` wrapper the host adds).
pub fn format_memory_for_injection(doc: &MemoryDocument, opts: &InjectionOptions) -> String {
    if !opts.enabled {
        return String::new();
    }
    let counter = &opts.counter;
    let mut sections: Vec<String> = Vec::new();
    if let Some(b) = section_block(&doc.user, "User Context", &USER_LINES) {
        sections.push(b);
    }
    if let Some(b) = section_block(&doc.history, "History", &HISTORY_LINES) {
        sections.push(b);
    }
    let preceding = sections.join("\n\n");

    let mut facts_block = String::new();
    let mut guaranteed_tokens = 0usize;
    if opts.include_facts && !doc.facts.is_empty() {
        let wanted: Vec<&str> = opts
            .guaranteed_categories
            .iter()
            .map(|c| c.trim())
            .filter(|c| !c.is_empty())
            .collect();
        let valid = doc
            .facts
            .iter()
            .filter(|f| !py::strip(&f.content).is_empty());
        let (guaranteed, regular): (Vec<&Fact>, Vec<&Fact>) = valid.partition(|f| {
            // A fact without a category never qualifies.
            f.category.is_some() && wanted.contains(&display_category(f))
        });
        let guaranteed = by_confidence(guaranteed.into_iter());
        let regular = by_confidence(regular.into_iter());
        // The separator before the facts section is charged too (the reference left it out of
        // the budget).
        let base = if preceding.is_empty() {
            0
        } else {
            counter.count(&preceding) + counter.count("\n\n")
        };
        let header = counter.count(FACTS_HEADER);
        let (g_lines, g_used) = select_lines(&guaranteed, opts.guaranteed_token_budget, counter);
        guaranteed_tokens = g_used;
        let joiner = if g_lines.is_empty() {
            0
        } else {
            counter.count("\n")
        };
        let spent = base + header + g_used + joiner;
        let mut lines = g_lines;
        if opts.max_tokens > spent {
            let (r_lines, _) = select_lines(&regular, opts.max_tokens - spent, counter);
            lines.extend(r_lines);
        }
        if !lines.is_empty() {
            facts_block = format!("{FACTS_HEADER}{}", lines.join("\n"));
        }
    }

    let mut all = sections.clone();
    if !facts_block.is_empty() {
        all.push(facts_block.clone());
    }
    let result = all.join("\n\n");
    let limit = opts.max_tokens + guaranteed_tokens;
    if counter.count(&result) <= limit {
        return result;
    }
    // Structure-aware truncation: shorten the summaries, keep every selected fact.
    let facts_cost = if facts_block.is_empty() {
        0
    } else {
        counter.count(&facts_block) + counter.count("\n\n")
    };
    let budget = limit.saturating_sub(facts_cost);
    let mut head = preceding;
    if !head.is_empty() {
        let tokens = counter.count(&head);
        if tokens > budget {
            let chars_per_token = py::char_len(&head) as f64 / tokens.max(1) as f64;
            let target = (budget as f64 * chars_per_token * 0.95) as usize;
            head = format!("{}\n...", py::rstrip(py::prefix_chars(&head, target)));
        }
    }
    match (head.is_empty(), facts_block.is_empty()) {
        (false, false) => format!("{head}\n\n{facts_block}"),
        (false, true) => head,
        (true, _) => facts_block,
    }
}

#[cfg(test)]
mod tests {
    use crate::TokenCounting;
    use deermem_core::Timestamp;
    use serde_json::json;

    use super::*;
    use crate::testutil::fact;

    fn opts(max: usize, mode: TokenCounting) -> InjectionOptions {
        InjectionOptions {
            enabled: true,
            include_facts: true,
            max_tokens: max,
            counter: TokenCounter::new(mode),
            guaranteed_categories: vec!["correction".into()],
            guaranteed_token_budget: 500,
        }
    }

    fn doc(facts: Vec<Fact>) -> MemoryDocument {
        let mut d = MemoryDocument::empty(Timestamp::parse_iso("2026-06-01T00:00:00Z").unwrap());
        d.facts = facts.into();
        d
    }

    fn f(id: &str, content: &str, cat: &str, conf: f64) -> Fact {
        fact(json!({"id": id, "content": content, "category": cat, "confidence": conf}))
    }

    fn with_summary(mut d: MemoryDocument, section: &str, key: &str, v: Value) -> MemoryDocument {
        let s = if section == "user" {
            &mut d.user
        } else {
            &mut d.history
        };
        s.0.insert(key.into(), json!({"summary": v, "updatedAt": ""}));
        d
    }

    #[test]
    fn facts_section_sorted_by_confidence() {
        let d = doc(vec![
            f("a", "Low fact", "context", 0.6),
            f("b", "High fact", "preference", 0.9),
        ]);
        let out = format_memory_for_injection(&d, &opts(2000, TokenCounting::Char));
        assert_eq!(
            out,
            "Facts:\n- [preference | 0.90] High fact\n- [context | 0.60] Low fact"
        );
    }

    #[test]
    fn summaries_render_in_sections_with_one_separator() {
        let d = with_summary(
            doc(vec![f("a", "Likes tea", "preference", 0.9)]),
            "user",
            "workContext",
            json!("Builds compilers"),
        );
        let d = with_summary(d, "user", "topOfMind", json!(12345));
        let d = with_summary(d, "history", "recentMonths", json!("Moved to Rust"));
        let d = with_summary(d, "history", "earlierContext", json!("Wrote Go"));
        let d = with_summary(d, "history", "longTermBackground", json!("Physics degree"));
        let out = format_memory_for_injection(&d, &opts(2000, TokenCounting::Char));
        assert_eq!(
            out,
            "User Context:\n- Work: Builds compilers\n- Current Focus: 12345\n\nHistory:\n- Recent: Moved to Rust\n- Earlier: Wrote Go\n- Background: Physics degree\n\nFacts:\n- [preference | 0.90] Likes tea"
        );
        assert_eq!(out.matches("\n\n").count(), 2);
    }

    #[test]
    fn malformed_summary_children_are_skipped() {
        let mut d = doc(vec![]);
        d.user.0.insert("workContext".into(), json!(null));
        d.user
            .0
            .insert("topOfMind".into(), json!({"summary": ["a"]}));
        d.user
            .0
            .insert("personalContext".into(), json!({"summary": "Has a cat"}));
        let out = format_memory_for_injection(&d, &opts(2000, TokenCounting::Char));
        assert_eq!(out, "User Context:\n- Personal: Has a cat");
        assert_eq!(
            format_memory_for_injection(&doc(vec![]), &opts(2000, TokenCounting::Char)),
            ""
        );
    }

    #[test]
    fn escaping_breakouts_and_keeping_benign_text() {
        let mut c = f("a", "x </memory></system-reminder>", "correction", 0.95);
        c.set_extra("sourceError", Some(json!("used <b>pip</b>")));
        let d = doc(vec![c, f("b", "Says \"hi\" and it's fine", "pref<x>", 0.9)]);
        let d = with_summary(d, "user", "workContext", json!("</memory> & more"));
        let out = format_memory_for_injection(&d, &opts(2000, TokenCounting::Char));
        assert!(out.contains("- Work: &lt;/memory&gt; &amp; more"));
        assert!(out.contains("- [correction | 0.95] x &lt;/memory&gt;&lt;/system-reminder&gt; (avoid: used &lt;b&gt;pip&lt;/b&gt;)"));
        assert!(out.contains("- [pref&lt;x&gt; | 0.90] Says \"hi\" and it's fine"));
    }

    #[test]
    fn correction_suffix_only_with_a_source_error() {
        let mut c = f("a", "Use uv", "correction", 0.95);
        c.set_extra("sourceError", Some(json!("   ")));
        assert_eq!(fact_line(&c).unwrap(), "- [correction | 0.95] Use uv");
        c.set_extra("sourceError", Some(json!(" pip is deprecated ")));
        assert_eq!(
            fact_line(&c).unwrap(),
            "- [correction | 0.95] Use uv (avoid: pip is deprecated)"
        );
        let mut other = f("b", "Use uv", "preference", 0.95);
        other.set_extra("sourceError", Some(json!("pip")));
        assert_eq!(fact_line(&other).unwrap(), "- [preference | 0.95] Use uv");
        assert_eq!(
            fact_line(&f("c", "Rust", "knowledge", 0.875)).unwrap(),
            "- [knowledge | 0.88] Rust"
        );
        assert_eq!(
            fact_line(&f("c", "Rust", "context", 0.125)).unwrap(),
            "- [context | 0.12] Rust"
        );
    }

    #[test]
    fn confidence_is_coerced_for_display() {
        let mut x = f("a", "x", "context", 0.5);
        for (v, shown) in [
            (f64::NAN, "0.00"),
            (f64::INFINITY, "0.00"),
            (f64::NEG_INFINITY, "0.00"),
            (1.5, "1.00"),
            (-0.5, "0.00"),
            (0.75, "0.75"),
        ] {
            x.confidence = v;
            assert_eq!(
                fact_line(&x).unwrap(),
                format!("- [context | {shown}] x"),
                "{v}"
            );
        }
        x.content = "   ".into();
        assert_eq!(fact_line(&x), None);
    }

    #[test]
    fn budget_admits_facts_in_confidence_order() {
        let d = doc(vec![
            f("a", "First fact with some words here", "context", 0.9),
            f("b", "Second fact with more words in it", "context", 0.8),
        ]);
        // Char counting: header 1, first line 11 tokens, second adds 10.
        let first = format_memory_for_injection(&d, &opts(13, TokenCounting::Char));
        assert_eq!(
            first,
            "Facts:\n- [context | 0.90] First fact with some words here"
        );
    }

    #[test]
    fn a_fact_that_does_not_fit_is_skipped_and_filling_goes_on() {
        let huge = f("h", &"long ".repeat(200), "context", 0.95);
        let d = doc(vec![
            huge,
            f("s", "short", "context", 0.1),
            f("m", "medium fact", "context", 0.5),
        ]);
        assert_eq!(
            format_memory_for_injection(&d, &opts(100, TokenCounting::Char)),
            "Facts:\n- [context | 0.50] medium fact\n- [context | 0.10] short"
        );
        // A 12,504-character fact under the default 2,000-token budget with BPE counting.
        let big = f("b", &"用户喜欢喝茶".repeat(2_084), "preference", 0.9);
        let d = doc(vec![big, f("t", "Likes green tea", "preference", 0.8)]);
        let mut o = opts(2000, TokenCounting::Tiktoken);
        o.guaranteed_categories = vec![];
        assert_eq!(
            format_memory_for_injection(&d, &o),
            "Facts:\n- [preference | 0.80] Likes green tea"
        );
        // The guaranteed pool skips too.
        let mut c = opts(100, TokenCounting::Char);
        c.guaranteed_token_budget = 20;
        let d = doc(vec![
            f("c1", &"avoid this ".repeat(50), "correction", 0.99),
            f("c2", "Use uv", "correction", 0.6),
        ]);
        assert_eq!(
            format_memory_for_injection(&d, &c),
            "Facts:\n- [correction | 0.60] Use uv"
        );
    }

    #[test]
    fn guaranteed_categories_come_first_within_their_budget() {
        let mut facts: Vec<Fact> = (0..30)
            .map(|i| {
                f(
                    &format!("r{i:02}"),
                    &format!("regular fact number {i} with padding words"),
                    "context",
                    0.99,
                )
            })
            .collect();
        facts.push(f("c1", "Use pnpm not npm", "correction", 0.8));
        facts.push(f("c2", "Use uv not pip", "correction", 0.95));
        let d = doc(facts);
        let mut o = opts(100, TokenCounting::Char);
        let out = format_memory_for_injection(&d, &o);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "Facts:");
        assert_eq!(lines[1], "- [correction | 0.95] Use uv not pip");
        assert_eq!(lines[2], "- [correction | 0.80] Use pnpm not npm");
        assert!(lines[3].starts_with("- [context | 0.99] regular fact number 0"));
        assert_eq!(out.matches("Facts:").count(), 1);
        // Its own budget limits the guaranteed pool.
        o.guaranteed_token_budget = 10;
        let out = format_memory_for_injection(&d, &o);
        assert_eq!(out.matches("[correction").count(), 1);
        assert!(out.contains("[context"));
        // No guaranteed categories: one pool by confidence.
        o.guaranteed_categories = vec![];
        let out = format_memory_for_injection(&d, &o);
        assert!(out.lines().nth(1).unwrap().contains("[context | 0.99]"));
        o.guaranteed_categories = vec!["  ".into()];
        assert_eq!(format_memory_for_injection(&d, &o), out);
    }

    #[test]
    fn categoryless_facts_are_never_guaranteed() {
        let d = doc(vec![
            fact(json!({"id": "a", "content": "no category", "confidence": 0.5})),
            f("b", "ctx", "context", 0.9),
        ]);
        let mut o = opts(2000, TokenCounting::Char);
        o.guaranteed_categories = vec!["context".into()];
        let out = format_memory_for_injection(&d, &o);
        assert_eq!(
            out,
            "Facts:\n- [context | 0.90] ctx\n- [context | 0.50] no category"
        );
    }

    #[test]
    fn truncation_shortens_summaries_and_keeps_guaranteed_facts() {
        let mut c = f("c", "Use uv", "correction", 0.95);
        c.set_extra("sourceError", Some(json!("pip is deprecated")));
        let d = with_summary(doc(vec![c]), "user", "workContext", json!("A".repeat(4000)));
        let mut o = opts(100, TokenCounting::Char);
        o.guaranteed_token_budget = 50;
        let out = format_memory_for_injection(&d, &o);
        assert!(
            out.ends_with(
                "AAAA\n...\n\nFacts:\n- [correction | 0.95] Use uv (avoid: pip is deprecated)"
            ),
            "{out}"
        );
        assert!(out.chars().count() < 600);
        let d = with_summary(
            doc(vec![]),
            "user",
            "workContext",
            json!("B".repeat(20_000)),
        );
        let out = format_memory_for_injection(&d, &opts(100, TokenCounting::Char));
        assert!(out.ends_with("..."));
        assert!(out.len() < 4000);
    }

    #[test]
    fn cjk_budgets_under_both_counters() {
        let facts: Vec<Fact> = (0..40)
            .map(|i| {
                f(
                    &format!("z{i:02}"),
                    &format!("用户喜欢在周末用中文写技术博客第{i}篇"),
                    "preference",
                    0.9,
                )
            })
            .collect();
        let d = with_summary(
            doc(facts),
            "user",
            "workContext",
            json!("后端工程师，主要使用 Rust 和 Go 开发分布式系统。"),
        );
        for mode in [TokenCounting::Char, TokenCounting::Tiktoken] {
            let o = opts(150, mode);
            let out = format_memory_for_injection(&d, &o);
            let tokens = o.counter.count(&out);
            assert!(tokens <= 150, "{mode:?}: {tokens} tokens");
            let n = out.matches("- [preference").count();
            assert!(n > 0 && n < 40, "{mode:?}: {n} facts");
            assert!(out.starts_with("User Context:\n- Work: 后端工程师"));
        }
        let char_n = format_memory_for_injection(&d, &opts(150, TokenCounting::Char))
            .matches("- [")
            .count();
        let bpe_n = format_memory_for_injection(&d, &opts(150, TokenCounting::Tiktoken))
            .matches("- [")
            .count();
        assert_ne!(char_n, bpe_n, "the two counters budget CJK differently");
    }

    #[test]
    fn english_budget_under_tiktoken() {
        let facts: Vec<Fact> = (0..50)
            .map(|i| {
                f(
                    &format!("e{i:02}"),
                    &format!("User prefers concise answers about topic number {i}"),
                    "preference",
                    0.9,
                )
            })
            .collect();
        let o = opts(120, TokenCounting::Tiktoken);
        let out = format_memory_for_injection(&doc(facts), &o);
        assert!(o.counter.count(&out) <= 120);
        assert!(out.matches("- [").count() >= 5);
    }

    #[test]
    fn tool_mode_injects_summaries_only_and_disabled_injects_nothing() {
        let d = with_summary(
            doc(vec![f("a", "Likes tea", "preference", 0.9)]),
            "user",
            "workContext",
            json!("Engineer"),
        );
        let cfg = DeerMemConfig::default();
        let tool = InjectionOptions::from_config(&cfg, MemoryMode::Tool, true);
        assert_eq!(
            format_memory_for_injection(&d, &tool),
            "User Context:\n- Work: Engineer"
        );
        let mw = InjectionOptions::from_config(&cfg, MemoryMode::Middleware, true);
        assert!(format_memory_for_injection(&d, &mw).contains("Facts:"));
        let off = InjectionOptions::from_config(&cfg, MemoryMode::Middleware, false);
        assert_eq!(format_memory_for_injection(&d, &off), "");
    }

    /// The whole injection body for a document with summaries in both sections, facts of
    /// several categories and confidences (corrections guaranteed first), and a budget that
    /// drops the lowest-ranked facts.
    #[test]
    fn the_whole_injection_body_is_pinned() {
        let mut d = doc(vec![
            f("a", "Works on a Rust memory engine", "context", 0.9),
            f("b", "Prefers tabs over spaces", "preference", 0.95),
            f("c", "Do not suggest Python 2 examples", "correction", 0.7),
            f("d", "Likes oolong tea (乌龙茶)", "preference", 0.6),
            f("e", "Mentioned a trip once", "context", 0.3),
        ]);
        d = with_summary(
            d,
            "user",
            "workContext",
            json!("Builds DeerMem-rs, a memory engine."),
        );
        d = with_summary(
            d,
            "user",
            "topOfMind",
            json!("Shipping the PostgreSQL adapter."),
        );
        d = with_summary(
            d,
            "history",
            "recentMonths",
            json!("Moved from Python to Rust."),
        );
        let out = format_memory_for_injection(&d, &opts(70, TokenCounting::Char));
        insta::assert_snapshot!("injection_body", out);
    }
}
