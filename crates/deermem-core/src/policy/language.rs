//! Language-aware ranking by meaning: each text's script group (derived from its characters),
//! and the calibration that keeps a query's language from outranking its meaning when a
//! memory holds facts in several scripts.
//!
//! Multilingual embedding models score a query higher against every text of its own language:
//! asked in Chinese, a Chinese fact on an unrelated topic outranks the English fact that
//! answers. [`calibrate_by_script`] lifts each other-script group by how far its background
//! level lies below the query's own script's, so facts compete on how well they stand out in
//! their own group rather than on the language they share with the query.

/// A text's script group, enough to tell the language groups of a memory apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScriptGroup {
    /// Han ideographs, kana or hangul (Chinese, Japanese, Korean).
    Cjk,
    /// Everything else (Latin, Cyrillic, digits, ...).
    Other,
}

impl ScriptGroup {
    /// The group's name as shown in reports (`cjk`, `other`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cjk => "cjk",
            Self::Other => "other",
        }
    }

    /// The group named by [`ScriptGroup::as_str`] (how an index stores the tag), or `None`.
    #[must_use]
    pub fn from_tag(tag: &str) -> Option<Self> {
        match tag {
            "cjk" => Some(Self::Cjk),
            "other" => Some(Self::Other),
            _ => None,
        }
    }
}

/// Whether `c` is a CJK ideograph, kana or hangul syllable.
fn is_cjk(c: char) -> bool {
    matches!(c,
        '\u{3040}'..='\u{30ff}'     // hiragana, katakana
        | '\u{3400}'..='\u{4dbf}'   // CJK extension A
        | '\u{4e00}'..='\u{9fff}'   // CJK unified ideographs
        | '\u{ac00}'..='\u{d7af}'   // hangul syllables
        | '\u{f900}'..='\u{faff}'   // CJK compatibility ideographs
        | '\u{20000}'..='\u{2ffff}' // CJK extensions B and later
    )
}

/// The script group of `text`: [`ScriptGroup::Cjk`] when it has at least one CJK character
/// (a Chinese sentence naming `Vim` or `HSK` is Chinese), else [`ScriptGroup::Other`].
#[must_use]
pub fn script_group(text: &str) -> ScriptGroup {
    if text.chars().any(is_cjk) {
        ScriptGroup::Cjk
    } else {
        ScriptGroup::Other
    }
}

/// A group's background level is the mean similarity of its this many best facts.
pub const GROUP_LEVEL_TOP: usize = 5;

/// A group of fewer facts than this is left as it is: its level would be its few facts' own
/// scores, not a background.
pub const MIN_GROUP: usize = 3;

/// Calibrates similarity scores by script group, in place. `scored` holds each candidate's
/// similarity to the query and its script group; `query` is the query's group.
///
/// A group's level is the mean of its [`GROUP_LEVEL_TOP`] best scores. Each group other than
/// the query's whose level is below the query's group's level is lifted by the difference; the
/// query's own group, a group above it, and a group of fewer than [`MIN_GROUP`] facts keep
/// their scores. Nothing changes when the query's group has fewer than [`MIN_GROUP`] facts
/// (a memory in one language, or a query in a language the memory barely holds).
///
/// The rule (the statistic, lifting only, the group minimum) was chosen on the development
/// set's tuned users and checked on the held-out ones: see `docs/search.md`.
pub fn calibrate_by_script(scored: &mut [(f32, ScriptGroup)], query: ScriptGroup) {
    let level = |group: ScriptGroup| -> Option<f32> {
        let mut scores: Vec<f32> = scored
            .iter()
            .filter(|(_, g)| *g == group)
            .map(|(s, _)| *s)
            .collect();
        if scores.len() < MIN_GROUP {
            return None;
        }
        scores.sort_by(|a, b| b.total_cmp(a));
        scores.truncate(GROUP_LEVEL_TOP);
        Some(scores.iter().sum::<f32>() / scores.len() as f32)
    };
    let Some(own) = level(query) else {
        return;
    };
    let lifts: Vec<(ScriptGroup, f32)> = [ScriptGroup::Cjk, ScriptGroup::Other]
        .into_iter()
        .filter(|g| *g != query)
        .filter_map(|g| level(g).map(|theirs| (g, own - theirs)))
        .filter(|(_, lift)| *lift > 0.0)
        .collect();
    for (group, lift) in lifts {
        for (s, g) in scored.iter_mut() {
            if *g == group {
                *s += lift;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use ScriptGroup::{Cjk, Other};

    #[test]
    fn script_groups_follow_the_characters() {
        assert_eq!(script_group("Plays basketball every Sunday"), Other);
        assert_eq!(script_group("他周末做什么运动"), Cjk);
        assert_eq!(script_group("用 Vim 写代码"), Cjk);
        assert_eq!(script_group("ひらがな"), Cjk);
        assert_eq!(script_group("한국어"), Cjk);
        assert_eq!(script_group("Привет"), Other);
        assert_eq!(script_group(""), Other);
        assert_eq!(Cjk.as_str(), "cjk");
        for g in [Cjk, Other] {
            assert_eq!(ScriptGroup::from_tag(g.as_str()), Some(g));
        }
        assert_eq!(ScriptGroup::from_tag("CJK"), None);
    }

    fn scores(list: &[(f32, ScriptGroup)]) -> Vec<f32> {
        list.iter()
            .map(|(s, _)| (s * 1000.0).round() / 1000.0)
            .collect()
    }

    /// A Chinese query over a mixed memory: the Chinese facts score higher across the board;
    /// the English group is lifted by the gap between the two groups' best five, so the
    /// English answer (0.84, clearly above its group) ranks first.
    #[test]
    fn the_other_script_group_is_lifted_to_the_query_group_level() {
        let mut list = vec![
            (0.84, Other), // the answer
            (0.77, Other),
            (0.76, Other),
            (0.76, Other),
            (0.75, Other),
            (0.75, Other),
            (0.87, Cjk),
            (0.86, Cjk),
            (0.85, Cjk),
            (0.85, Cjk),
            (0.84, Cjk),
            (0.80, Cjk),
        ];
        calibrate_by_script(&mut list, Cjk);
        // English best five mean 0.776, Chinese 0.854: English lifted by 0.078.
        assert_eq!(
            scores(&list),
            vec![
                0.918, 0.848, 0.838, 0.838, 0.828, 0.828, 0.87, 0.86, 0.85, 0.85, 0.84, 0.8
            ]
        );
        // Asked in English, the Chinese group is already above the query's group: a group is
        // never lowered, so nothing changes.
        let raw: Vec<(f32, ScriptGroup)> = vec![
            (0.84, Other),
            (0.77, Other),
            (0.76, Other),
            (0.87, Cjk),
            (0.86, Cjk),
            (0.85, Cjk),
        ];
        let mut english = raw.clone();
        calibrate_by_script(&mut english, Other);
        assert_eq!(english, raw);
    }

    #[test]
    fn small_groups_and_single_language_memories_are_left_alone() {
        let one_language = vec![(0.9, Other), (0.8, Other), (0.7, Other), (0.6, Other)];
        let mut list = one_language.clone();
        calibrate_by_script(&mut list, Cjk);
        assert_eq!(list, one_language);
        calibrate_by_script(&mut list, Other);
        assert_eq!(list, one_language);
        // Two Chinese facts are too few to have a level: nothing is lifted.
        let mut few = vec![
            (0.9, Cjk),
            (0.8, Cjk),
            (0.5, Other),
            (0.4, Other),
            (0.3, Other),
        ];
        let before = few.clone();
        calibrate_by_script(&mut few, Cjk);
        assert_eq!(few, before);
        calibrate_by_script(&mut few, Other);
        assert_eq!(few, before);
        calibrate_by_script(&mut [], Cjk);
    }
}
