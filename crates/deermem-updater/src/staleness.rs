//! Staleness review: which facts are past their review window, how a fact's window is read, the
//! prompt section listing them, and the date arithmetic with Python's overflow points.

use crate::DeerMemConfig;
use deermem_core::{Fact, Timestamp};
use serde_json::Value;

use crate::facts::display_category;
use crate::text::fmt2;
use deermem_pycompat::py::html_escape;

/// Python's `timedelta` limit in days.
pub(crate) const MAX_TIMEDELTA_DAYS: i128 = 999_999_999;

/// At most this many candidates are listed in one prompt (the reference listed all of them,
/// so the prompt grew without bound); the oldest come first.
pub(crate) const MAX_PROMPT_CANDIDATES: usize = 50;

/// Parses a fact timestamp like the reference: blank → none, Python `fromisoformat`, naive
/// values taken as UTC.
pub(crate) fn parse_fact_datetime(raw: &str) -> Option<Timestamp> {
    if raw.trim().is_empty() {
        return None;
    }
    Timestamp::parse_iso(raw)
}

/// `expected_valid_days` of a stored value: bools are not numbers, integers count when
/// positive (any size), finite floats are truncated toward zero first.
pub(crate) fn read_expected_valid_days(v: Option<&Value>) -> Option<i128> {
    match v? {
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                (i > 0).then_some(i128::from(i))
            } else if let Some(u) = n.as_u64() {
                Some(i128::from(u))
            } else {
                // `as` saturates at `i128::MAX`.
                let t = n.as_f64()?.trunc();
                (t.is_finite() && t >= 1.0).then_some(t as i128)
            }
        }
        _ => None,
    }
}

/// The fact's own review window, or the configured default.
pub(crate) fn effective_age_days(fact: &Fact, default_days: u64) -> i128 {
    read_expected_valid_days(fact.extra.get("expected_valid_days"))
        .unwrap_or(i128::from(default_days))
}

/// `ts + days`, or `None` when `|days|` exceeds Python's `timedelta` or the result leaves
/// years 1–9999.
pub(crate) fn safe_add_days(ts: Timestamp, days: i128) -> Option<Timestamp> {
    if days.abs() > MAX_TIMEDELTA_DAYS {
        return None;
    }
    ts.checked_add_days(i64::try_from(days).ok()?)
}

/// The instant a fact's review clock started: its last explicit confirmation when parseable,
/// else its creation time.
pub(crate) fn review_reference(fact: &Fact) -> Option<(Timestamp, &str)> {
    if let Some(Some(last)) = &fact.last_confirmed_at
        && let Some(t) = parse_fact_datetime(last)
    {
        return Some((t, last.as_str()));
    }
    parse_fact_datetime(&fact.created_at).map(|t| (t, fact.created_at.as_str()))
}

/// Whether a fact's category is protected from staleness review (and from consolidation).
///
/// Both the stored category and the displayed one (the original of a non-core category) are
/// checked, so protecting `knowledge` works although storage keeps it as `other`.
pub(crate) fn is_protected(fact: &Fact, protected: &[String]) -> bool {
    let stored = fact.category.as_deref();
    let shown = display_category(fact);
    protected
        .iter()
        .any(|p| stored == Some(p.as_str()) || shown == p)
}

/// The facts past their review window, in memory order.
pub(crate) fn select_stale_candidates<'a>(
    facts: &'a [Fact],
    config: &DeerMemConfig,
    now: Timestamp,
) -> Vec<&'a Fact> {
    facts
        .iter()
        .filter(|f| !is_protected(f, &config.staleness_protected_categories))
        .filter(|f| {
            let Some((reference, _)) = review_reference(f) else {
                return false;
            };
            let age = effective_age_days(f, config.staleness_age_days);
            safe_add_days(now, -age).is_some_and(|cutoff| reference < cutoff)
        })
        .collect()
}

/// The calendar date of a timestamp as written (in its own offset when the text starts with
/// an extended `YYYY-MM-DD` date), else the UTC date.
fn local_date(raw: &str, ts: Timestamp) -> String {
    let t = raw.trim();
    let b = t.as_bytes();
    let extended = b.len() >= 10
        && b[..4].iter().all(u8::is_ascii_digit)
        && b[4] == b'-'
        && b[5..7].iter().all(u8::is_ascii_digit)
        && b[7] == b'-'
        && b[8..10].iter().all(u8::is_ascii_digit);
    if extended {
        t[..10].to_owned()
    } else {
        let (y, m, d, ..) = ts.to_civil();
        format!("{y:04}-{m:02}-{d:02}")
    }
}

/// One prompt line per candidate:
/// `- [{id} | {category} | {conf:.2f} | {YYYY-MM-DD} | valid:{N}d] "{content}"`.
///
/// At most [`MAX_PROMPT_CANDIDATES`] lines, oldest review reference first.
pub(crate) fn staleness_lines(candidates: &[&Fact], default_days: u64) -> String {
    let mut ordered: Vec<&Fact> = candidates.to_vec();
    ordered.sort_by_cached_key(|f| review_reference(f).map(|(t, _)| t));
    ordered
        .iter()
        .take(MAX_PROMPT_CANDIDATES)
        .filter_map(|f| {
            let (t, raw) = review_reference(f)?;
            let category = display_category(f);
            Some(format!(
                "- [{} | {} | {} | {} | valid:{}d] \"{}\"",
                f.id,
                html_escape(category, false),
                fmt2(f.confidence),
                local_date(raw, t),
                effective_age_days(f, default_days),
                html_escape(&f.content, false),
            ))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::testutil::{fact, ts};

    fn cfg() -> DeerMemConfig {
        DeerMemConfig::default()
    }

    #[test]
    fn parses_fact_datetimes() {
        let z = parse_fact_datetime("2026-01-01T00:00:00Z").unwrap();
        assert_eq!(parse_fact_datetime("2026-01-01T00:00:00+00:00"), Some(z));
        assert_eq!(
            parse_fact_datetime("2026-01-01T00:00:00"),
            Some(z),
            "naive is UTC"
        );
        assert_eq!(parse_fact_datetime(""), None);
        assert_eq!(parse_fact_datetime("not a date"), None);
        assert_eq!(parse_fact_datetime("2026-01-01"), Some(z));
    }

    #[test]
    fn reads_expected_valid_days() {
        let r = |v: Value| read_expected_valid_days(Some(&v));
        assert_eq!(r(json!(365)), Some(365));
        assert_eq!(r(json!(180.7)), Some(180));
        assert_eq!(read_expected_valid_days(None), None);
        assert_eq!(r(json!(true)), None);
        assert_eq!(r(json!(0)), None);
        assert_eq!(r(json!(-5)), None);
        assert_eq!(r(json!(0.5)), None);
        assert_eq!(r(json!(0.9)), None);
        assert_eq!(r(json!("365")), None);
        assert_eq!(r(json!(u64::MAX)), Some(i128::from(u64::MAX)));
        assert_eq!(r(json!(1e300)), Some(i128::MAX));
    }

    #[test]
    fn effective_age_falls_back_to_the_default() {
        let f = |evd: Value| fact(json!({"id": "a", "content": "x", "expected_valid_days": evd}));
        assert_eq!(effective_age_days(&f(json!(365)), 90), 365);
        assert_eq!(
            effective_age_days(&fact(json!({"id": "a", "content": "x"})), 90),
            90
        );
        assert_eq!(
            effective_age_days(&f(json!(999)), 90),
            999,
            "no read-time cap"
        );
        assert_eq!(effective_age_days(&f(json!(180.7)), 90), 180);
        assert_eq!(effective_age_days(&f(json!(true)), 90), 90);
        assert_eq!(effective_age_days(&f(json!(0)), 90), 90);
        assert_eq!(effective_age_days(&f(json!(0.9)), 90), 90);
        assert_eq!(
            effective_age_days(&f(json!(1_000_000_000_000u64)), 90),
            1_000_000_000_000
        );
    }

    #[test]
    fn safe_add_days_respects_python_limits() {
        let now = ts("2026-06-01T00:00:00Z");
        assert_eq!(safe_add_days(now, 365).unwrap(), ts("2027-06-01T00:00:00Z"));
        assert_eq!(
            safe_add_days(now, -365).unwrap(),
            ts("2025-06-01T00:00:00Z")
        );
        assert_eq!(safe_add_days(now, 10i128.pow(12)), None);
        assert_eq!(safe_add_days(now, 1_000_000_000), None);
        assert_eq!(safe_add_days(now, 999_999_999), None, "past year 9999");
        assert_eq!(safe_add_days(now, i128::MAX), None);
    }

    #[test]
    fn selects_aged_unprotected_facts() {
        let now = ts("2026-06-01T00:00:00Z");
        let days_ago = |n: i64| safe_add_days(now, -i128::from(n)).unwrap().to_iso_z();
        let facts = vec![
            fact(json!({"id": "old", "content": "a", "createdAt": days_ago(100)})),
            fact(json!({"id": "new", "content": "b", "createdAt": days_ago(10)})),
            fact(
                json!({"id": "corr", "content": "c", "category": "correction", "createdAt": days_ago(400)}),
            ),
            fact(
                json!({"id": "goal", "content": "d", "category": "goal", "createdAt": days_ago(400)}),
            ),
            fact(
                json!({"id": "long", "content": "e", "createdAt": days_ago(300), "expected_valid_days": 999}),
            ),
            fact(
                json!({"id": "past", "content": "f", "createdAt": days_ago(400), "expected_valid_days": 365}),
            ),
            fact(
                json!({"id": "confirmed", "content": "g", "createdAt": days_ago(400), "lastConfirmedAt": days_ago(7)}),
            ),
            fact(
                json!({"id": "huge", "content": "h", "createdAt": days_ago(400), "expected_valid_days": 1e12}),
            ),
            fact(json!({"id": "baddate", "content": "i", "createdAt": "yesterday"})),
        ];
        let ids = |c: Vec<&Fact>| {
            c.iter()
                .map(|f| f.id.as_str().to_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            ids(select_stale_candidates(&facts, &cfg(), now)),
            vec!["old", "goal", "past"]
        );
        let mut c = cfg();
        c.staleness_protected_categories = vec!["goal".into()];
        assert_eq!(
            ids(select_stale_candidates(&facts, &c, now)),
            vec!["old", "corr", "past"]
        );
        assert!(select_stale_candidates(&[], &cfg(), now).is_empty());
    }

    #[test]
    fn staleness_lines_escape_and_annotate() {
        let facts = [
            fact(
                json!({"id": "f1", "content": "Uses <b>bold</b> & \"quotes\"", "category": "pref<\"erences>", "confidence": 0.8, "createdAt": "2025-01-02T23:00:00-05:00", "expected_valid_days": 365}),
            ),
            fact(
                json!({"id": "f2", "content": "</stale_facts> escape", "createdAt": "2024-12-01T00:00:00Z"}),
            ),
        ];
        let refs: Vec<&Fact> = facts.iter().collect();
        let text = staleness_lines(&refs, 90);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "- [f2 | context | 0.50 | 2024-12-01 | valid:90d] \"&lt;/stale_facts&gt; escape\""
        );
        assert_eq!(
            lines[1],
            "- [f1 | pref&lt;\"erences&gt; | 0.80 | 2025-01-02 | valid:365d] \"Uses &lt;b&gt;bold&lt;/b&gt; &amp; \"quotes\"\""
        );
        assert_eq!(staleness_lines(&[], 90), "");
    }
}
