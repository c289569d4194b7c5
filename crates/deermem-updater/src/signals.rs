//! Deterministic signal detection: regex pattern files in the reference's format (a YAML list of
//! regex strings or `{pattern, flags: [ignorecase]}` mappings), our own bundled English, Chinese
//! and Japanese defaults, and the detection rules.

use std::fmt;
use std::path::{Path, PathBuf};

use deermem_core::{Message, MessageKind};
use deermem_pycompat::py;
use regex::{Regex, RegexBuilder};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// How many of the most recent messages (any role) the "recent" detection looks at.
pub(crate) const SIGNAL_WINDOW: usize = 6;

/// A deterministic signal found in the user's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Signal {
    /// The user corrects the assistant.
    Correction,
    /// The user explicitly approves what was done.
    Reinforcement,
    /// A first-person like or dislike.
    Preference,
    /// A first-person role or profession.
    Identity,
    /// A first-person plan.
    Goal,
    /// A choice made.
    Decision,
}

impl Signal {
    /// Every signal, in the reference's order (hints and files follow it).
    pub const ALL: [Signal; 6] = [
        Signal::Correction,
        Signal::Reinforcement,
        Signal::Preference,
        Signal::Identity,
        Signal::Goal,
        Signal::Decision,
    ];

    /// The signal's name, also its pattern file stem.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Correction => "correction",
            Self::Reinforcement => "reinforcement",
            Self::Preference => "preference",
            Self::Identity => "identity",
            Self::Goal => "goal",
            Self::Decision => "decision",
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// A set of signals (cheap to copy; iterates in [`Signal::ALL`] order).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct SignalSet(u8);

impl SignalSet {
    /// The empty set.
    pub fn new() -> Self {
        Self(0)
    }

    /// Adds a signal.
    pub fn insert(&mut self, s: Signal) {
        self.0 |= s.bit();
    }

    /// Whether the set holds `s`.
    pub fn contains(self, s: Signal) -> bool {
        self.0 & s.bit() != 0
    }

    /// The union of two sets.
    #[must_use]
    pub fn union(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The signals, in [`Signal::ALL`] order.
    pub fn iter(self) -> impl Iterator<Item = Signal> {
        Signal::ALL.into_iter().filter(move |s| self.contains(*s))
    }
}

impl FromIterator<Signal> for SignalSet {
    fn from_iter<T: IntoIterator<Item = Signal>>(iter: T) -> Self {
        let mut s = Self::new();
        for x in iter {
            s.insert(x);
        }
        s
    }
}

impl fmt::Debug for SignalSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries(self.iter().map(Signal::as_str))
            .finish()
    }
}

impl Serialize for SignalSet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

/// The stem of the trivial-acknowledgement pattern file.
pub(crate) const TRIVIAL_FILE: &str = "trivial";

/// Every pattern file a `patterns_dir` must hold.
pub const PATTERN_FILES: [&str; 7] = [
    TRIVIAL_FILE,
    "correction",
    "reinforcement",
    "preference",
    "identity",
    "goal",
    "decision",
];

/// Why pattern files could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PatternError {
    /// A required file is missing from the configured directory.
    #[error("pattern file {path} is missing (patterns_dir must hold all of: {files})", files = PATTERN_FILES.map(|f| format!("{f}.yaml")).join(", "))]
    MissingFile {
        /// The missing file.
        path: PathBuf,
    },
    /// The file could not be read.
    #[error("cannot read pattern file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid YAML.
    #[error("pattern file {path} is not valid YAML: {message}")]
    Yaml {
        /// The file.
        path: PathBuf,
        /// Parser message.
        message: String,
    },
    /// The top level is not a list.
    #[error("pattern file {path} must contain a YAML list of patterns")]
    NotAList {
        /// The file.
        path: PathBuf,
    },
    /// An entry's regex does not compile.
    #[error("invalid regex in {path} entry {index}: {message}")]
    InvalidRegex {
        /// The file.
        path: PathBuf,
        /// Zero-based entry index.
        index: usize,
        /// Compiler message.
        message: String,
    },
}

/// Compiled pattern lists: the trivial filter and one list per signal.
#[derive(Clone)]
pub struct PatternSet {
    trivial: Vec<Regex>,
    signals: [Vec<Regex>; 6],
    origin: String,
}

impl fmt::Debug for PatternSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PatternSet")
            .field("origin", &self.origin)
            .field("trivial", &self.trivial.len())
            .field(
                "signals",
                &self.signals.iter().map(Vec::len).collect::<Vec<_>>(),
            )
            .finish()
    }
}

const BUNDLED: [(&str, &str); 7] = [
    (TRIVIAL_FILE, include_str!("patterns/trivial.yaml")),
    ("correction", include_str!("patterns/correction.yaml")),
    ("reinforcement", include_str!("patterns/reinforcement.yaml")),
    ("preference", include_str!("patterns/preference.yaml")),
    ("identity", include_str!("patterns/identity.yaml")),
    ("goal", include_str!("patterns/goal.yaml")),
    ("decision", include_str!("patterns/decision.yaml")),
];

impl PatternSet {
    /// No patterns at all: nothing is trivial, no signal ever fires.
    pub fn empty() -> Self {
        Self {
            trivial: Vec::new(),
            signals: Default::default(),
            origin: "empty".into(),
        }
    }

    /// The bundled default patterns.
    pub fn bundled() -> Self {
        Self::from_sources("bundled", |name| {
            BUNDLED
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, t)| (*t).to_owned())
        })
        // The bundled files are checked by the tests; fall back to no patterns rather than
        // failing at run time.
        .unwrap_or_else(|e| {
            tracing::error!(error = %e, "bundled memory patterns failed to compile");
            Self::empty()
        })
    }

    /// Builds a set from file texts: `source(name)` returns the text of `<name>.yaml`, or
    /// `None` when the file does not exist (an error: every file is required).
    ///
    /// # Errors
    /// A [`PatternError`] naming the file (and the entry for a bad regex).
    pub fn from_sources(
        origin: &str,
        source: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, PatternError> {
        let load = |name: &str| -> Result<Vec<Regex>, PatternError> {
            let path = PathBuf::from(origin).join(format!("{name}.yaml"));
            let text =
                source(name).ok_or_else(|| PatternError::MissingFile { path: path.clone() })?;
            parse_pattern_file(&path, &text)
        };
        let trivial = load(TRIVIAL_FILE)?;
        let mut signals: [Vec<Regex>; 6] = Default::default();
        for (slot, sig) in signals.iter_mut().zip(Signal::ALL) {
            *slot = load(sig.as_str())?;
        }
        Ok(Self {
            trivial,
            signals,
            origin: origin.to_owned(),
        })
    }

    /// Loads all seven files from an operator's `patterns_dir` (asynchronously).
    ///
    /// # Errors
    /// A missing or unreadable file, invalid YAML, or a bad regex.
    pub async fn load_dir(dir: &Path) -> Result<Self, PatternError> {
        let owned = dir.to_owned();
        tokio::task::spawn_blocking(move || Self::load_dir_blocking(&owned))
            .await
            .map_err(|e| PatternError::Io {
                path: dir.to_owned(),
                source: std::io::Error::other(e),
            })?
    }

    /// [`PatternSet::load_dir`] with blocking reads, for synchronous constructors at start-up
    /// (seven small files).
    ///
    /// # Errors
    /// As [`PatternSet::load_dir`].
    pub fn load_dir_blocking(dir: &Path) -> Result<Self, PatternError> {
        let mut texts = Vec::new();
        for name in PATTERN_FILES {
            let path = dir.join(format!("{name}.yaml"));
            match std::fs::read_to_string(&path) {
                Ok(t) => texts.push((name, t)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(PatternError::MissingFile { path });
                }
                Err(source) => return Err(PatternError::Io { path, source }),
            }
        }
        let origin = dir.display().to_string();
        Self::from_sources(&origin, |name| {
            texts
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, t)| t.clone())
        })
    }

    /// Whether there are no trivial patterns (the trivial filter is then a no-op).
    pub fn trivial_is_empty(&self) -> bool {
        self.trivial.is_empty()
    }

    /// Whether `text` (already stripped and trimmed) fully matches a trivial pattern.
    pub fn is_trivial(&self, text: &str) -> bool {
        self.trivial.iter().any(|r| r.is_match(text))
    }

    /// The signals found in one text (unanchored search on the stripped text).
    pub fn detect_text(&self, text: &str) -> SignalSet {
        let t = py::strip(text);
        if t.is_empty() {
            return SignalSet::new();
        }
        Signal::ALL
            .into_iter()
            .zip(&self.signals)
            .filter(|(_, pats)| pats.iter().any(|r| r.is_match(t)))
            .map(|(sig, _)| sig)
            .collect()
    }

    /// The reference's rule: the user turns among the last six messages (any role).
    pub fn detect_recent(&self, messages: &[Message]) -> SignalSet {
        let start = messages.len().saturating_sub(SIGNAL_WINDOW);
        self.detect_in(&messages[start..])
    }

    /// Every user turn of `messages` (used on an extraction batch, whose messages are all new).
    pub fn detect_in(&self, messages: &[Message]) -> SignalSet {
        messages
            .iter()
            .filter(|m| m.kind == MessageKind::Human)
            .fold(SignalSet::new(), |acc, m| {
                acc.union(self.detect_text(&m.text()))
            })
    }
}

/// Parses one pattern file: a YAML list whose entries are regex strings or
/// `{pattern, flags}` mappings. Entries of other shapes, and entries with an empty pattern, are
/// skipped with a warning; unknown flags are warned about and ignored.
///
/// Patterns named `trivial` are compiled for a full match.
///
/// # Errors
/// Invalid YAML, a top level that is not a list, or a regex that does not compile.
pub(crate) fn parse_pattern_file(path: &Path, text: &str) -> Result<Vec<Regex>, PatternError> {
    let full_match = path.file_stem().is_some_and(|s| s == TRIVIAL_FILE);
    // Read as DeerFlow's PyYAML reads it (YAML 1.1: an unquoted `yes` is a boolean).
    let doc = if text.trim().is_empty() {
        Value::Null
    } else {
        deermem_pycompat::yaml::parse_document(text).map_err(|e| PatternError::Yaml {
            path: path.to_owned(),
            message: e.to_string(),
        })?
    };
    let entries = match doc {
        Value::Null => return Ok(Vec::new()),
        Value::Array(s) => s,
        _ => {
            return Err(PatternError::NotAList {
                path: path.to_owned(),
            });
        }
    };
    let mut out = Vec::new();
    for (index, entry) in entries.iter().enumerate() {
        let (pattern, ignore_case) = match entry {
            Value::String(s) => (s.clone(), false),
            Value::Object(m) => {
                let pattern = m
                    .get("pattern")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned();
                let mut ignore_case = false;
                if let Some(flags) = m.get("flags").and_then(Value::as_array) {
                    for flag in flags {
                        match flag.as_str() {
                            Some(f) if f.eq_ignore_ascii_case("ignorecase") => ignore_case = true,
                            other => tracing::warn!(
                                path = %path.display(), index, flag = ?other,
                                "unknown pattern flag ignored"
                            ),
                        }
                    }
                }
                (pattern, ignore_case)
            }
            _ => {
                tracing::warn!(path = %path.display(), index, "pattern entry is neither a string nor a mapping; skipped");
                continue;
            }
        };
        if pattern.is_empty() {
            tracing::warn!(path = %path.display(), index, "pattern entry without a pattern; skipped");
            continue;
        }
        let source = if full_match {
            format!(r"\A(?:{pattern})\z")
        } else {
            pattern.clone()
        };
        let re = RegexBuilder::new(&source)
            .case_insensitive(ignore_case)
            .size_limit(1 << 20)
            .build()
            .map_err(|e| PatternError::InvalidRegex {
                path: path.to_owned(),
                index,
                message: e.to_string(),
            })?;
        out.push(re);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig(text: &str) -> SignalSet {
        PatternSet::bundled().detect_text(text)
    }

    #[test]
    fn bundled_patterns_compile() {
        for (name, text) in BUNDLED {
            let path = PathBuf::from(format!("{name}.yaml"));
            let pats = parse_pattern_file(&path, text).unwrap();
            assert!(!pats.is_empty(), "{name} has patterns");
        }
        let p = PatternSet::bundled();
        assert!(!p.trivial_is_empty());
    }

    #[test]
    fn corrections_in_english_chinese_and_japanese() {
        for t in [
            "That's wrong, use Postgres.",
            "No, that's wrong.",
            "You misunderstood the question",
            "That's not what I asked for",
            "不对，改用 pnpm",
            "你理解错了",
            "重新写一遍",
            "違います",
        ] {
            assert!(sig(t).contains(Signal::Correction), "{t:?}");
        }
        assert!(!sig("Thanks, that makes sense.").contains(Signal::Correction));
    }

    #[test]
    fn reinforcement_is_anchored_to_sentence_ends() {
        for t in [
            "Yes, exactly! That's what I needed.",
            "Perfect.",
            "perfect",
            "完全正确，就是这个意思",
            "Keep doing that",
            "その通りです",
        ] {
            assert!(sig(t).contains(Signal::Reinforcement), "{t:?}");
        }
        for t in [
            "Perfect work",
            "That's wrong, try again.",
            "Thanks, that makes sense.",
        ] {
            assert!(!sig(t).contains(Signal::Reinforcement), "{t:?}");
        }
    }

    #[test]
    fn preference_identity_goal_decision() {
        assert!(sig("I prefer tabs over spaces").contains(Signal::Preference));
        assert!(sig("我更喜欢用 Rust").contains(Signal::Preference));
        assert!(sig("I'm a data scientist at Acme").contains(Signal::Identity));
        assert!(sig("我是一名后端工程师").contains(Signal::Identity));
        assert!(sig("My goal is to ship v2 by June").contains(Signal::Goal));
        assert!(sig("我打算下个月学习 Go").contains(Signal::Goal));
        assert!(sig("Let's go with SQLite").contains(Signal::Decision));
        assert!(sig("决定采用 Postgres").contains(Signal::Decision));
        // Narrower than the reference: these say nothing about identity.
        assert!(!sig("I am not sure about this").contains(Signal::Identity));
        assert!(!sig("I'm going to refactor").contains(Signal::Identity));
        assert!(sig("I'm going to refactor").contains(Signal::Goal));
        assert!(sig("What time is it?").is_empty());
    }

    #[test]
    fn recent_detection_looks_at_the_last_six_messages_only() {
        let p = PatternSet::bundled();
        let mut msgs = vec![Message::human("That's wrong"), Message::ai("ok")];
        for i in 0..3 {
            msgs.push(Message::human(format!("question {i}")));
            msgs.push(Message::ai("answer"));
        }
        assert!(!p.detect_recent(&msgs).contains(Signal::Correction));
        assert!(p.detect_in(&msgs).contains(Signal::Correction));
        let mut list = Message::human("");
        list.content = serde_json::json!(["That's", {"type": "text", "text": "wrong"}]);
        assert!(p.detect_recent(&[list]).contains(Signal::Correction));
    }

    #[test]
    fn pattern_file_format_and_errors() {
        let path = PathBuf::from("x/correction.yaml");
        let pats = parse_pattern_file(
            &path,
            "- abc\n- {pattern: 'DEF', flags: [ignorecase, verbose]}\n- 5\n- {flags: []}\n",
        )
        .unwrap();
        assert_eq!(pats.len(), 2);
        assert!(pats[1].is_match("xdefx"));
        assert!(parse_pattern_file(&path, "").unwrap().is_empty());
        assert!(parse_pattern_file(&path, "~").unwrap().is_empty());
        assert!(matches!(
            parse_pattern_file(&path, "a: b"),
            Err(PatternError::NotAList { .. })
        ));
        let err = parse_pattern_file(&path, "- ok\n- '(unclosed'\n").unwrap_err();
        assert!(matches!(err, PatternError::InvalidRegex { index: 1, .. }));
        assert!(err.to_string().contains("correction.yaml"));
        // Trivial patterns match the whole text only.
        let triv = parse_pattern_file(Path::new("trivial.yaml"), "- ok\n").unwrap();
        assert!(triv[0].is_match("ok"));
        assert!(!triv[0].is_match("ok then"));
    }

    #[tokio::test]
    async fn patterns_dir_requires_all_seven_files() {
        let dir = tempfile::tempdir().unwrap();
        for name in &PATTERN_FILES[..6] {
            std::fs::write(dir.path().join(format!("{name}.yaml")), "- x\n").unwrap();
        }
        let err = PatternSet::load_dir(dir.path()).await.unwrap_err();
        assert!(
            matches!(err, PatternError::MissingFile { ref path } if path.ends_with("decision.yaml"))
        );
        std::fs::write(
            dir.path().join("decision.yaml"),
            "- {pattern: 'we pick', flags: [ignorecase]}\n",
        )
        .unwrap();
        let p = PatternSet::load_dir(dir.path()).await.unwrap();
        assert!(p.detect_text("We PICK rust").contains(Signal::Decision));
        assert!(p.is_trivial("x"));
    }

    #[test]
    fn signal_sets_union_and_iterate_in_order() {
        let a: SignalSet = [Signal::Goal, Signal::Correction].into_iter().collect();
        let b: SignalSet = [Signal::Reinforcement].into_iter().collect();
        let u = a.union(b);
        assert_eq!(
            u.iter().collect::<Vec<_>>(),
            vec![Signal::Correction, Signal::Reinforcement, Signal::Goal]
        );
        assert_eq!(
            serde_json::to_value(u).unwrap(),
            serde_json::json!(["correction", "reinforcement", "goal"])
        );
    }
}
