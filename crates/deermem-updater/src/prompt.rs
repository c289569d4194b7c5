//! The extraction prompt: template files in the reference's format (`memory_update.chat.yaml`,
//! `staleness_review.yaml`, `consolidation.yaml`, with per-agent overrides under
//! `prompts_dir/<agent>/`), our own bundled wording, and the variables: the current memory as
//! escaped JSON, the conversation, signal hints, and the staleness-review and consolidation
//! sections.

use std::collections::BTreeSet;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::DeerMemConfig;
use deermem_core::CacheBound;
use deermem_core::ports::ChatMessage;
use deermem_core::{AgentName, Fact, MemoryDocument, Message, MessageKind, Timestamp};
use deermem_pycompat::{json, py};
use lru::LruCache;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::consolidation::{
    consolidation_groups_text, select_consolidation_candidates, shown_groups, shown_ids,
};
use crate::signals::{Signal, SignalSet};
use crate::staleness::{select_stale_candidates, staleness_lines};
use crate::text::{FormatError, format_template};
use crate::uploads;

/// The chat template file.
pub const CHAT_TEMPLATE_FILE: &str = "memory_update.chat.yaml";
/// The staleness-review section template file.
pub const STALENESS_TEMPLATE_FILE: &str = "staleness_review.yaml";
/// The consolidation section template file.
pub const CONSOLIDATION_TEMPLATE_FILE: &str = "consolidation.yaml";

/// Conversation turns longer than this many code points are shortened.
pub(crate) const MAX_TURN_CHARS: usize = 1000;
const TURN_HEAD_CHARS: usize = 500;
const TURN_TAIL_CHARS: usize = 500;

/// Per-agent template sets kept (least recently used forgotten first).
const PER_AGENT_CACHE: usize = 1024;
/// The name the per-agent template cache is reported under.
pub const TEMPLATE_CACHE_NAME: &str = "updater.prompt_templates";

/// The variables a chat template may use.
pub(crate) const CHAT_VARIABLES: [&str; 5] = [
    "current_memory",
    "conversation",
    "correction_hint",
    "staleness_review_section",
    "consolidation_section",
];

/// Why a prompt template could not be loaded or rendered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PromptError {
    /// A template file does not exist.
    #[error("prompt template {path} is missing")]
    Missing {
        /// The file.
        path: PathBuf,
    },
    /// A template file could not be read.
    #[error("cannot read prompt template {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a valid template.
    #[error("invalid prompt template {path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// Rendering failed (unknown or malformed placeholder).
    #[error("prompt template {path} cannot be rendered: {source}")]
    Render {
        /// The file.
        path: PathBuf,
        /// The placeholder problem.
        #[source]
        source: FormatError,
    },
}

/// Who speaks a chat template message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TemplateRole {
    /// A system message.
    System,
    /// A user message (any role other than `system`).
    User,
}

/// One parsed template file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Template {
    /// `format: chat`: messages with roles.
    Chat(Vec<(TemplateRole, String)>),
    /// `format: text`: one template string.
    Text(String),
}

/// Parses a template file's YAML (`format: chat` with `messages`, or `format: text` with
/// `template`; a missing `format` is chat, or text when only `template` is present).
///
/// # Errors
/// [`PromptError::Invalid`] naming the problem.
pub(crate) fn parse_template(path: &Path, text: &str) -> Result<Template, PromptError> {
    let invalid = |m: &str| PromptError::Invalid {
        path: path.to_owned(),
        message: m.to_owned(),
    };
    // Read as DeerFlow's PyYAML reads it (YAML 1.1).
    let doc = deermem_pycompat::yaml::parse_document(text)
        .map_err(|e| invalid(&format!("not valid YAML: {e}")))?;
    let map = doc
        .as_object()
        .ok_or_else(|| invalid("the top level must be a mapping"))?;
    let format = match map.get("format") {
        None => {
            if map.contains_key("template") && !map.contains_key("messages") {
                "text"
            } else {
                "chat"
            }
        }
        Some(v) => v
            .as_str()
            .ok_or_else(|| invalid("format must be a string"))?,
    };
    match format {
        "chat" => {
            let msgs = map
                .get("messages")
                .and_then(serde_json::Value::as_array)
                .ok_or_else(|| invalid("a chat template needs a `messages` list"))?;
            let mut out = Vec::new();
            for (i, m) in msgs.iter().enumerate() {
                let role = m
                    .get("role")
                    .and_then(serde_json::Value::as_str)
                    .ok_or_else(|| invalid(&format!("message {i} needs a string `role`")))?;
                let content = m
                    .get("content")
                    .and_then(serde_json::Value::as_str)
                    .ok_or_else(|| invalid(&format!("message {i} needs a string `content`")))?;
                let role = if role == "system" {
                    TemplateRole::System
                } else {
                    TemplateRole::User
                };
                out.push((role, content.to_owned()));
            }
            if out.is_empty() {
                return Err(invalid("a chat template needs at least one message"));
            }
            Ok(Template::Chat(out))
        }
        "text" => {
            let t = map
                .get("template")
                .and_then(serde_json::Value::as_str)
                .ok_or_else(|| invalid("a text template needs a string `template`"))?;
            Ok(Template::Text(t.to_owned()))
        }
        other => Err(invalid(&format!("unknown format {other:?} (chat or text)"))),
    }
}

/// The three templates an update uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PromptTemplates {
    chat: Vec<(TemplateRole, String)>,
    chat_path: PathBuf,
    staleness: String,
    staleness_path: PathBuf,
    consolidation: String,
    consolidation_path: PathBuf,
}

const BUNDLED_CHAT: &str = include_str!("prompts/memory_update.chat.yaml");
const BUNDLED_STALENESS: &str = include_str!("prompts/staleness_review.yaml");
const BUNDLED_CONSOLIDATION: &str = include_str!("prompts/consolidation.yaml");

/// The text of a `format: text` template file.
fn text_template((path, text): (&Path, &str)) -> Result<String, PromptError> {
    match parse_template(path, text)? {
        Template::Text(s) => Ok(s),
        Template::Chat(_) => Err(PromptError::Invalid {
            path: path.to_owned(),
            message: "expected format: text".into(),
        }),
    }
}

impl PromptTemplates {
    /// Builds the set from the three files' texts (paths are for messages) and checks that
    /// every template renders with its variables.
    ///
    /// # Errors
    /// Invalid YAML, a wrong format, or an unknown or malformed placeholder.
    pub fn from_texts(
        chat: (&Path, &str),
        staleness: (&Path, &str),
        consolidation: (&Path, &str),
    ) -> Result<Self, PromptError> {
        let Template::Chat(chat_messages) = parse_template(chat.0, chat.1)? else {
            return Err(PromptError::Invalid {
                path: chat.0.to_owned(),
                message: "expected format: chat".into(),
            });
        };
        let t = Self {
            chat: chat_messages,
            chat_path: chat.0.to_owned(),
            staleness: text_template(staleness)?,
            staleness_path: staleness.0.to_owned(),
            consolidation: text_template(consolidation)?,
            consolidation_path: consolidation.0.to_owned(),
        };
        // Fail fast: render everything once with placeholder values.
        t.render_chat(&|k| CHAT_VARIABLES.contains(&k).then(String::new))?;
        t.render_staleness("")?;
        t.render_consolidation("", 1)?;
        Ok(t)
    }

    /// Our bundled templates.
    #[allow(
        clippy::expect_used,
        reason = "the templates are compiled into the binary and parsed by this module's tests; no input reaches them"
    )]
    pub fn bundled() -> Self {
        let p = |n: &str| PathBuf::from("bundled").join(n);
        Self::from_texts(
            (&p(CHAT_TEMPLATE_FILE), BUNDLED_CHAT),
            (&p(STALENESS_TEMPLATE_FILE), BUNDLED_STALENESS),
            (&p(CONSOLIDATION_TEMPLATE_FILE), BUNDLED_CONSOLIDATION),
        )
        .expect("the bundled prompt templates parse")
    }

    fn render_chat(
        &self,
        vars: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Vec<ChatMessage>, PromptError> {
        self.chat
            .iter()
            .map(|(role, content)| {
                let text =
                    format_template(content, vars).map_err(|source| PromptError::Render {
                        path: self.chat_path.clone(),
                        source,
                    })?;
                Ok(match role {
                    TemplateRole::System => ChatMessage::system(text),
                    TemplateRole::User => ChatMessage::user(text),
                })
            })
            .collect()
    }

    fn render_staleness(&self, stale_facts: &str) -> Result<String, PromptError> {
        format_template(&self.staleness, &|k| {
            (k == "stale_facts").then(|| stale_facts.to_owned())
        })
        .map_err(|source| PromptError::Render {
            path: self.staleness_path.clone(),
            source,
        })
    }

    fn render_consolidation(&self, groups: &str, max_groups: usize) -> Result<String, PromptError> {
        format_template(&self.consolidation, &|k| match k {
            "consolidation_groups" => Some(groups.to_owned()),
            "max_groups" => Some(max_groups.to_string()),
            _ => None,
        })
        .map_err(|source| PromptError::Render {
            path: self.consolidation_path.clone(),
            source,
        })
    }
}

/// Where templates come from: the bundled set, or an operator's `prompts_dir` with optional
/// per-agent overrides (`prompts_dir/<agent>/<file>` wins over `prompts_dir/<file>`).
#[derive(Debug)]
pub struct TemplateStore {
    dir: Option<PathBuf>,
    global: Arc<PromptTemplates>,
    per_agent: Mutex<LruCache<AgentName, Arc<PromptTemplates>>>,
}

/// Reads the three template files, each from `{dir}/{agent}/` when an agent is given and that
/// directory holds it, else from `dir` (where all three are required), and checks that they
/// render.
fn read_set(dir: &Path, agent: Option<&AgentName>) -> Result<PromptTemplates, PromptError> {
    let read = |path: PathBuf| match std::fs::read_to_string(&path) {
        Ok(text) => Ok(Some((path, text))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(PromptError::Io { path, source }),
    };
    let mut texts = Vec::with_capacity(3);
    for name in [
        CHAT_TEMPLATE_FILE,
        STALENESS_TEMPLATE_FILE,
        CONSOLIDATION_TEMPLATE_FILE,
    ] {
        let own = match agent {
            Some(a) => read(dir.join(a.as_str()).join(name))?,
            None => None,
        };
        let found = match own {
            Some(found) => found,
            None => {
                let path = dir.join(name);
                read(path.clone())?.ok_or(PromptError::Missing { path })?
            }
        };
        texts.push(found);
    }
    match texts.as_slice() {
        [(cp, ct), (sp, st), (op, ot)] => PromptTemplates::from_texts((cp, ct), (sp, st), (op, ot)),
        _ => Err(PromptError::Missing {
            path: dir.to_owned(),
        }),
    }
}

impl TemplateStore {
    /// The bundled templates only.
    pub fn bundled() -> Self {
        Self {
            dir: None,
            global: Arc::new(PromptTemplates::bundled()),
            per_agent: Mutex::new(LruCache::new(NonZeroUsize::MIN)),
        }
    }

    /// Loads the three global templates from `dir` and checks that they render (all three
    /// files are required).
    ///
    /// # Errors
    /// A missing or unreadable file, or an invalid template.
    pub async fn load(dir: &Path) -> Result<Self, PromptError> {
        let global = Self::load_set(dir, None).await?;
        Ok(Self::over(dir, global))
    }

    /// [`TemplateStore::load`] with blocking reads, for synchronous constructors at start-up
    /// (three small files). Per-agent overrides are still loaded lazily by
    /// [`TemplateStore::for_agent`].
    ///
    /// # Errors
    /// As [`TemplateStore::load`].
    pub fn load_blocking(dir: &Path) -> Result<Self, PromptError> {
        Ok(Self::over(dir, read_set(dir, None)?))
    }

    fn over(dir: &Path, global: PromptTemplates) -> Self {
        Self {
            dir: Some(dir.to_owned()),
            global: Arc::new(global),
            per_agent: Mutex::new(LruCache::new(
                NonZeroUsize::new(PER_AGENT_CACHE).unwrap_or(NonZeroUsize::MIN),
            )),
        }
    }

    /// [`read_set`] on a blocking thread.
    async fn load_set(
        dir: &Path,
        agent: Option<&AgentName>,
    ) -> Result<PromptTemplates, PromptError> {
        let (owned_dir, agent) = (dir.to_owned(), agent.cloned());
        tokio::task::spawn_blocking(move || read_set(&owned_dir, agent.as_ref()))
            .await
            .map_err(|e| PromptError::Io {
                path: dir.to_owned(),
                source: std::io::Error::other(e),
            })?
    }

    /// The per-agent template sets held (at most 1,024 agents; the bundled set needs none).
    pub fn cache_bound(&self) -> CacheBound {
        let bound = if self.dir.is_some() {
            PER_AGENT_CACHE
        } else {
            0
        };
        let held = self
            .per_agent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len();
        CacheBound::entries(TEMPLATE_CACHE_NAME, bound, Some(held))
    }

    /// The templates for one agent (cached; edits need a restart, as in the reference).
    ///
    /// # Errors
    /// An unreadable or invalid per-agent template.
    pub async fn for_agent(&self, agent: &AgentName) -> Result<Arc<PromptTemplates>, PromptError> {
        let Some(dir) = &self.dir else {
            return Ok(self.global.clone());
        };
        if let Some(t) = self
            .per_agent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(agent)
        {
            return Ok(t.clone());
        }
        let has_override = tokio::fs::metadata(dir.join(agent.as_str()))
            .await
            .is_ok_and(|m| m.is_dir());
        let set = if has_override {
            Arc::new(Self::load_set(dir, Some(agent)).await?)
        } else {
            self.global.clone()
        };
        self.per_agent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .put(agent.clone(), set.clone());
        Ok(set)
    }
}

/// What a prompt is built from.
#[derive(Debug, Clone, Copy)]
pub struct PromptInput<'a> {
    /// The current memory snapshot.
    pub memory: &'a MemoryDocument,
    /// The new messages to learn from.
    pub feed: &'a [Message],
    /// Signals of the feed.
    pub signals: SignalSet,
    /// The configuration.
    pub config: &'a DeerMemConfig,
    /// Now (for staleness candidates).
    pub now: Timestamp,
}

/// A rendered prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct UpdatePrompt {
    /// The system and user messages.
    pub messages: Vec<ChatMessage>,
    /// The fact ids offered for consolidation (`None` when the section is absent).
    pub consolidation_shown: Option<BTreeSet<String>>,
    /// How many stale candidates were listed.
    pub stale_candidates_listed: usize,
}

fn is_manual(f: &Fact) -> bool {
    f.source.kind() == "manual"
}

/// The `{current_memory}` value: the snapshot as JSON with `[MANUAL]` marks on hand-written
/// facts and every string value HTML-escaped, laid out like Python's `json.dumps(indent=2)`.
pub(crate) fn current_memory_json(memory: &MemoryDocument) -> String {
    let facts: Vec<Map<String, Value>> = memory
        .facts
        .iter()
        .map(|f| {
            let mut fm = f.to_internal_map();
            if is_manual(f) && !f.content.starts_with("[MANUAL]") {
                fm.insert(
                    "content".into(),
                    Value::String(format!("[MANUAL] {}", f.content)),
                );
            }
            fm
        })
        .collect();
    // `json.dumps(snapshot, indent=2, ensure_ascii=False)` of the HTML-escaped object, written
    // from borrowed parts (no copy of the summaries, no intermediate array).
    let snapshot = Snapshot {
        version: &memory.version,
        revision: memory.revision,
        last_updated: &memory.last_updated,
        user: memory.user.as_map(),
        history: memory.history.as_map(),
        facts: &facts,
    };
    // Borrowed strings, integers and JSON maps always serialise.
    json::dumps_html_escaped(&snapshot).unwrap_or_default()
}

/// The memory snapshot the prompt shows, in the reference's key order.
#[derive(Serialize)]
struct Snapshot<'a> {
    version: &'a str,
    revision: u64,
    #[serde(rename = "lastUpdated")]
    last_updated: &'a str,
    user: &'a Map<String, Value>,
    history: &'a Map<String, Value>,
    facts: &'a [Map<String, Value>],
}

fn turn_text(msg: &Message) -> String {
    match &msg.content {
        Value::Array(items) => {
            let parts: Vec<&str> = items
                .iter()
                .filter_map(|i| match i {
                    Value::String(s) => Some(s.as_str()),
                    Value::Object(o) => o.get("text").and_then(Value::as_str),
                    _ => None,
                })
                .collect();
            if parts.is_empty() && !items.is_empty() {
                // The reference leaked the Python repr of image blocks here.
                "[non-text content]".to_owned()
            } else {
                parts.join(" ")
            }
        }
        _ => msg.text(),
    }
}

fn shorten(s: &str) -> String {
    let n = py::char_len(s);
    if n <= MAX_TURN_CHARS {
        return s.to_owned();
    }
    let head = py::prefix_chars(s, TURN_HEAD_CHARS);
    let tail: String = s.chars().skip(n - TURN_TAIL_CHARS).collect();
    format!("{head}\n...[truncated]...\n{tail}")
}

/// The `{conversation}` value: `User: …` / `Assistant: …` turns separated by blank lines,
/// upload blocks removed from user turns, long turns shortened, text HTML-escaped.
pub(crate) fn format_conversation(feed: &[Message]) -> String {
    let mut lines = Vec::new();
    for msg in feed {
        let prefix = match msg.kind {
            MessageKind::Human => "User: ",
            MessageKind::Ai => "Assistant: ",
            _ => continue,
        };
        let mut content = turn_text(msg);
        if msg.kind == MessageKind::Human {
            // Case-insensitive, like the message filter (the reference was case-sensitive here).
            content = uploads::strip_upload_blocks(&content);
            if content.is_empty() {
                continue;
            }
        }
        lines.push(format!(
            "{prefix}{}",
            py::html_escape(&shorten(&content), false)
        ));
    }
    lines.join("\n\n")
}

fn hint(signal: Signal) -> &'static str {
    match signal {
        Signal::Correction => {
            "IMPORTANT: Explicit correction signals were detected: the user says something the assistant did or assumed was wrong. Record a correction fact (with sourceError) only if it is a lasting, user-level working preference, and then use confidence 0.95 or more; a fix that only concerns the current task or this thread is not a memory."
        }
        Signal::Reinforcement => {
            "IMPORTANT: Positive reinforcement signals were detected: the user approved what was just done. If this confirms a lasting, user-level preference or an existing fact, record or confirm it (factsToReinforce); approval of the current task's output alone is not a memory for an unrelated thread."
        }
        Signal::Preference => {
            "IMPORTANT: The user stated a preference. Store it only if it is a lasting, user-level preference, not a choice for the current task or this thread."
        }
        Signal::Identity => {
            "IMPORTANT: The user said something about who they are (role, profession, background). Store it as a user-level fact if it is stated clearly, not something tied to the current task."
        }
        Signal::Goal => {
            "IMPORTANT: The user mentioned a plan or goal. Store long-term, user-level goals; steps of the current task or this thread are not memories."
        }
        Signal::Decision => {
            "IMPORTANT: The user made a decision. Store it only if it is a lasting, user-level choice about how they work, not a decision that only shapes the current task or this thread."
        }
    }
}

const MANUAL_NOTE: &str = "NOTE: Facts marked [MANUAL] were entered by the user by hand and are high-trust. Change or remove one only when the user explicitly and unambiguously corrects it.";

/// The `{correction_hint}` value: one line per detected signal, plus the `[MANUAL]` note when
/// hand-written facts exist.
pub(crate) fn signal_hints(signals: SignalSet, has_manual_facts: bool) -> String {
    let mut lines: Vec<&str> = signals.iter().map(hint).collect();
    if has_manual_facts {
        lines.push(MANUAL_NOTE);
    }
    lines.join("\n")
}

/// Builds the prompt, or `None` when the conversation has no text to learn from.
///
/// # Errors
/// A template that fails to render.
pub fn build_update_prompt(
    templates: &PromptTemplates,
    input: &PromptInput<'_>,
) -> Result<Option<UpdatePrompt>, PromptError> {
    let conversation = format_conversation(input.feed);
    if py::strip(&conversation).is_empty() {
        return Ok(None);
    }
    let cfg = input.config;
    let facts = &input.memory.facts;
    let current_memory = current_memory_json(input.memory);
    let hints = signal_hints(input.signals, facts.iter().any(is_manual));

    let (mut stale_listed, mut staleness_section) = (0, String::new());
    if cfg.staleness_review_enabled {
        let candidates = select_stale_candidates(facts, cfg, input.now);
        if candidates.len() >= cfg.staleness_min_candidates {
            stale_listed = candidates
                .len()
                .min(crate::staleness::MAX_PROMPT_CANDIDATES);
            staleness_section = templates
                .render_staleness(&staleness_lines(&candidates, cfg.staleness_age_days))?;
        }
    }

    let (mut consolidation_shown, mut consolidation_section) = (None, String::new());
    if cfg.consolidation_enabled {
        let candidates = select_consolidation_candidates(facts, cfg);
        if !candidates.is_empty() {
            let groups = shown_groups(&candidates, cfg);
            consolidation_shown = Some(shown_ids(&groups));
            consolidation_section = templates.render_consolidation(
                &consolidation_groups_text(&groups),
                cfg.consolidation_max_groups_per_cycle,
            )?;
        }
    }

    let messages = templates.render_chat(&|k| match k {
        "current_memory" => Some(current_memory.clone()),
        "conversation" => Some(conversation.clone()),
        "correction_hint" => Some(hints.clone()),
        "staleness_review_section" => Some(staleness_section.clone()),
        "consolidation_section" => Some(consolidation_section.clone()),
        _ => None,
    })?;
    Ok(Some(UpdatePrompt {
        messages,
        consolidation_shown,
        stale_candidates_listed: stale_listed,
    }))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::staleness::safe_add_days;
    use crate::testutil::{fact, ts};

    fn now() -> Timestamp {
        ts("2026-06-01T00:00:00Z")
    }

    fn doc(facts: Vec<Fact>) -> MemoryDocument {
        let mut d = MemoryDocument::empty(now());
        d.facts = facts.into();
        d
    }

    fn feed() -> Vec<Message> {
        vec![Message::human("I prefer tabs"), Message::ai("Noted")]
    }

    fn build(
        d: &MemoryDocument,
        f: &[Message],
        signals: SignalSet,
        cfg: &DeerMemConfig,
    ) -> UpdatePrompt {
        build_update_prompt(
            &PromptTemplates::bundled(),
            &PromptInput {
                memory: d,
                feed: f,
                signals,
                config: cfg,
                now: now(),
            },
        )
        .unwrap()
        .unwrap()
    }

    fn user_msg(p: &UpdatePrompt) -> &str {
        &p.messages[1].content
    }

    fn aged(n: usize, days: i64) -> Vec<Fact> {
        let created = safe_add_days(now(), -i128::from(days)).unwrap().to_iso_z();
        (0..n)
            .map(|i| fact(json!({"id": format!("f{i}"), "content": format!("fact {i}"), "createdAt": created, "category": "preference"})))
            .collect()
    }

    #[test]
    fn bundled_templates_render_and_pin_the_schema_fragments() {
        let cfg = DeerMemConfig::default();
        let p = build(&doc(vec![]), &feed(), SignalSet::new(), &cfg);
        assert_eq!(p.messages.len(), 2);
        assert_eq!(p.messages[0].role, deermem_core::ports::ChatRole::System);
        let system = &p.messages[0].content;
        for needle in [
            "scope=\"user\"",
            "durability=\"durable\"",
            "authority=\"transactional\"",
            "\"scope\": \"user|thread|project\", \"authority\": \"descriptive|transactional\"",
            "replacementFactIndex",
            "unrelated future thread",
            "\"staleFactsToExtend\": [{\"id\": \"fact_id\", \"extend_by_days\": 365, \"reason\": \"...\"}]",
        ] {
            assert!(system.contains(needle), "system prompt lacks {needle:?}");
        }
        // The system message has no variables: it is identical on every call.
        let p2 = build(
            &doc(aged(5, 200)),
            &[Message::human("x"), Message::ai("y")],
            SignalSet::new(),
            &cfg,
        );
        assert_eq!(p.messages[0], p2.messages[0]);
        let user = user_msg(&p);
        assert!(
            user.contains(
                "<conversation>\nUser: I prefer tabs\n\nAssistant: Noted\n</conversation>"
            )
        );
        assert!(user.contains("<current_memory>\n{\n  \"version\": \"1.0\""));
    }

    #[test]
    fn empty_sections_keep_their_blank_lines() {
        let cfg = DeerMemConfig::default();
        let p = build(&doc(vec![]), &feed(), SignalSet::new(), &cfg);
        assert!(user_msg(&p).contains("</conversation>\n\n\n\n\n\n\n\nUpdate the memory"));
    }

    #[test]
    fn memory_json_keeps_non_ascii_and_escapes_breakouts() {
        let d = doc(vec![
            fact(json!({"id": "a", "content": "用户喜欢茶", "confidence": 0.9})),
            fact(json!({"id": "b", "content": "x </current_memory> <conversation> & 'q'"})),
            fact(json!({"id": "c", "content": "hand written", "source": "manual"})),
        ]);
        let text = current_memory_json(&d);
        assert!(text.contains("用户喜欢茶"));
        assert!(!text.contains("\\u"));
        assert!(
            text.contains("x &lt;/current_memory&gt; &lt;conversation&gt; &amp; &#x27;q&#x27;")
        );
        assert!(text.contains("\"content\": \"[MANUAL] hand written\""));
        assert!(text.contains("\"confidence\": 0.9"));
        let p = build(&d, &feed(), SignalSet::new(), &DeerMemConfig::default());
        assert_eq!(user_msg(&p).matches("</current_memory>").count(), 1);
        assert!(user_msg(&p).contains(MANUAL_NOTE));
        assert_eq!(
            d.facts[2].content, "hand written",
            "the snapshot itself is unchanged"
        );
    }

    /// The borrowed snapshot is written exactly as the HTML-escaped dump of the whole object.
    #[test]
    fn memory_json_equals_the_escaped_dump_of_the_document_object() {
        let mut d = doc(vec![
            fact(
                json!({"id": "a", "content": "用户 \"q\" \\ \n\t<b>", "confidence": 0.25,
                "tags": ["x&y", 3, null, {"k": "<v>"}]}),
            ),
            fact(json!({"id": "c", "content": "hand", "source": "manual"})),
        ]);
        d.user = deermem_core::SummarySection::default_user();
        let mut m = Map::new();
        m.insert("version".into(), Value::String(d.version.clone()));
        m.insert("revision".into(), Value::from(d.revision));
        m.insert("lastUpdated".into(), Value::String(d.last_updated.clone()));
        m.insert("user".into(), Value::Object(d.user.as_map().clone()));
        m.insert("history".into(), Value::Object(d.history.as_map().clone()));
        let facts = d
            .facts
            .iter()
            .map(|f| {
                let mut fm = f.to_internal_map();
                if is_manual(f) && !f.content.starts_with("[MANUAL]") {
                    fm.insert(
                        "content".into(),
                        Value::String(format!("[MANUAL] {}", f.content)),
                    );
                }
                Value::Object(fm)
            })
            .collect();
        m.insert("facts".into(), Value::Array(facts));
        assert_eq!(
            current_memory_json(&d),
            json::dumps_html_escaped(&Value::Object(m)).unwrap()
        );
        assert_eq!(
            current_memory_json(&doc(vec![])),
            json::dumps_html_escaped(&json!({
                "version": d.version, "revision": d.revision, "lastUpdated": d.last_updated,
                "user": d.user.as_map(), "history": d.history.as_map(), "facts": []
            }))
            .unwrap()
        );
    }

    #[test]
    fn conversation_formatting() {
        let mut list = Message::human("");
        list.content = json!(["plain", {"type": "text", "text": "block"}]);
        let mut image = Message::human("");
        image.content = json!([{"type": "image_url", "image_url": {"url": "data:..."}}]);
        let long = "a".repeat(600) + &"b".repeat(600);
        let feed = vec![
            list,
            Message::ai("see </conversation> & <current_memory>"),
            Message::human("<UPLOADED_FILES>x</UPLOADED_FILES>"),
            image,
            Message::human(long),
            Message::tool("ignored"),
        ];
        let text = format_conversation(&feed);
        let turns: Vec<&str> = text.split("\n\n").collect();
        assert_eq!(turns[0], "User: plain block");
        assert_eq!(
            turns[1],
            "Assistant: see &lt;/conversation&gt; &amp; &lt;current_memory&gt;"
        );
        assert_eq!(turns[2], "User: [non-text content]");
        assert_eq!(
            turns[3],
            format!(
                "User: {}\n...[truncated]...\n{}",
                "a".repeat(500),
                "b".repeat(500)
            )
        );
        assert_eq!(turns.len(), 4);
        assert!(
            format_conversation(&[Message::human("<uploaded_files>x</uploaded_files>")]).is_empty()
        );
    }

    #[test]
    fn blank_conversation_gives_no_prompt() {
        let cfg = DeerMemConfig::default();
        let r = build_update_prompt(
            &PromptTemplates::bundled(),
            &PromptInput {
                memory: &doc(vec![]),
                feed: &[Message::human("  ")],
                signals: SignalSet::new(),
                config: &cfg,
                now: now(),
            },
        )
        .unwrap();
        assert!(r.is_none());
    }

    #[test]
    fn hints_follow_signals() {
        let cfg = DeerMemConfig::default();
        let both: SignalSet = [Signal::Correction, Signal::Reinforcement]
            .into_iter()
            .collect();
        let p = build(&doc(vec![]), &feed(), both, &cfg);
        let u = user_msg(&p);
        assert!(u.contains("Explicit correction signals were detected"));
        assert!(u.contains("Positive reinforcement signals were detected"));
        let none = build(&doc(vec![]), &feed(), SignalSet::new(), &cfg);
        assert!(!user_msg(&none).contains("signals were detected"));
        let all: SignalSet = Signal::ALL.into_iter().collect();
        let h = signal_hints(all, false);
        assert_eq!(h.lines().count(), 6);
        for w in ["user-level", "current task", "thread"] {
            assert!(h.contains(w));
        }
        assert!(h.lines().next().unwrap().contains("0.95"));
    }

    #[test]
    fn staleness_section_appears_only_when_triggered() {
        let cfg = DeerMemConfig::default();
        let p = build(&doc(aged(5, 100)), &feed(), SignalSet::new(), &cfg);
        assert!(user_msg(&p).contains("Staleness Review"));
        assert!(user_msg(&p).contains("<stale_facts>\n- [f0 | preference | 0.50 |"));
        assert!(user_msg(&p).contains("valid:90d]"));
        assert_eq!(p.stale_candidates_listed, 5);
        assert!(
            !user_msg(&build(&doc(aged(2, 100)), &feed(), SignalSet::new(), &cfg))
                .contains("Staleness Review")
        );
        assert!(
            !user_msg(&build(&doc(vec![]), &feed(), SignalSet::new(), &cfg))
                .contains("Staleness Review")
        );
        let mut off = cfg.clone();
        off.staleness_review_enabled = false;
        assert!(
            !user_msg(&build(&doc(aged(5, 100)), &feed(), SignalSet::new(), &off))
                .contains("Staleness Review")
        );
        let mut facts = aged(3, 400);
        facts[0].set_extra("expected_valid_days", Some(json!(365)));
        assert!(
            user_msg(&build(&doc(facts), &feed(), SignalSet::new(), &cfg)).contains("valid:365d")
        );
        let many = build(&doc(aged(80, 100)), &feed(), SignalSet::new(), &cfg);
        assert_eq!(
            many.stale_candidates_listed,
            crate::staleness::MAX_PROMPT_CANDIDATES
        );
    }

    #[test]
    fn consolidation_section_appears_only_when_enabled_and_triggered() {
        let mut cfg = DeerMemConfig {
            consolidation_enabled: true,
            ..DeerMemConfig::default()
        };
        let p = build(&doc(aged(10, 1)), &feed(), SignalSet::new(), &cfg);
        assert!(user_msg(&p).contains("Memory Consolidation"));
        assert!(
            user_msg(&p).contains("<consolidation_candidates category=\"preference\" count=\"8\">")
        );
        assert!(user_msg(&p).contains("Merge at\nmost 3 groups"));
        assert_eq!(p.consolidation_shown.as_ref().unwrap().len(), 8);
        assert!(
            !user_msg(&build(&doc(aged(1, 1)), &feed(), SignalSet::new(), &cfg))
                .contains("Memory Consolidation")
        );
        cfg.consolidation_enabled = false;
        let p = build(&doc(aged(10, 1)), &feed(), SignalSet::new(), &cfg);
        assert!(!user_msg(&p).contains("Memory Consolidation"));
        assert!(p.consolidation_shown.is_none());
    }

    #[test]
    fn template_files_are_validated() {
        let p = Path::new("t.yaml");
        assert!(matches!(
            parse_template(p, "format: chat\nmessages: []\n"),
            Err(PromptError::Invalid { .. })
        ));
        assert!(matches!(
            parse_template(p, "[1]"),
            Err(PromptError::Invalid { .. })
        ));
        assert!(matches!(
            parse_template(p, "format: xml\n"),
            Err(PromptError::Invalid { .. })
        ));
        assert!(matches!(
            parse_template(p, ": : :"),
            Err(PromptError::Invalid { .. })
        ));
        assert_eq!(
            parse_template(p, "messages:\n  - {role: assistant, content: hi}\n").unwrap(),
            Template::Chat(vec![(TemplateRole::User, "hi".into())])
        );
        assert_eq!(
            parse_template(p, "template: x\n").unwrap(),
            Template::Text("x".into())
        );
        let chat = "format: chat\nmessages:\n  - {role: user, content: '{nope}'}\n";
        let err = PromptTemplates::from_texts(
            (p, chat),
            (p, "template: '{stale_facts}'"),
            (p, "template: x"),
        )
        .unwrap_err();
        assert!(matches!(err, PromptError::Render { .. }), "{err}");
    }

    #[tokio::test]
    async fn prompts_dir_with_per_agent_overrides() {
        let dir = tempfile::tempdir().unwrap();
        let chat = "format: chat\nmessages:\n  - {role: system, content: GLOBAL}\n  - {role: user, content: '{conversation}|{current_memory}|{correction_hint}{staleness_review_section}{consolidation_section}'}\n";
        std::fs::write(dir.path().join(CHAT_TEMPLATE_FILE), chat).unwrap();
        std::fs::write(
            dir.path().join(STALENESS_TEMPLATE_FILE),
            "format: text\ntemplate: 'S {stale_facts}'\n",
        )
        .unwrap();
        let missing = TemplateStore::load(dir.path()).await.unwrap_err();
        assert!(matches!(missing, PromptError::Missing { .. }));
        std::fs::write(
            dir.path().join(CONSOLIDATION_TEMPLATE_FILE),
            "format: text\ntemplate: 'C {consolidation_groups} {max_groups}'\n",
        )
        .unwrap();
        let store = TemplateStore::load(dir.path()).await.unwrap();
        std::fs::create_dir(dir.path().join("coder")).unwrap();
        std::fs::write(
            dir.path().join("coder").join(CHAT_TEMPLATE_FILE),
            chat.replace("GLOBAL", "CODER"),
        )
        .unwrap();
        let cfg = DeerMemConfig::default();
        let d = doc(vec![]);
        let f = feed();
        let input = PromptInput {
            memory: &d,
            feed: &f,
            signals: SignalSet::new(),
            config: &cfg,
            now: now(),
        };
        let coder = store
            .for_agent(&AgentName::parse("Coder").unwrap())
            .await
            .unwrap();
        let p = build_update_prompt(&coder, &input).unwrap().unwrap();
        assert_eq!(p.messages[0].content, "CODER");
        let other = store.for_agent(&AgentName::default_bucket()).await.unwrap();
        let p = build_update_prompt(&other, &input).unwrap().unwrap();
        assert_eq!(p.messages[0].content, "GLOBAL");
        assert!(p.messages[1].content.starts_with("User: I prefer tabs"));
        // A broken per-agent override is a typed error for that agent only.
        std::fs::create_dir(dir.path().join("broken")).unwrap();
        std::fs::write(
            dir.path().join("broken").join(STALENESS_TEMPLATE_FILE),
            "format: text\ntemplate: '{unknown}'\n",
        )
        .unwrap();
        assert!(
            store
                .for_agent(&AgentName::parse("broken").unwrap())
                .await
                .is_err()
        );
    }

    /// The whole extraction prompt for one turn: the system text, the current memory with a
    /// hand-written fact, the conversation, the signal hints and the staleness section. A change
    /// to any template or to how the inputs are rendered shows up here as a reviewed diff.
    #[test]
    fn the_whole_extraction_prompt_is_pinned() {
        let mut facts = aged(3, 400);
        facts.push(fact(json!({
            "id": "manual1",
            "content": "Prefers tabs over spaces",
            "category": "preference",
            "confidence": 0.95,
            "createdAt": "2026-05-01T00:00:00Z",
            "source": "manual",
        })));
        let cfg = DeerMemConfig {
            staleness_review_enabled: true,
            staleness_min_candidates: 1,
            ..DeerMemConfig::default()
        };
        let feed = vec![
            Message::human("Actually, I moved to Lisbon last month."),
            Message::ai("Thanks, I will remember that."),
        ];
        let mut signals = SignalSet::new();
        signals.insert(crate::signals::Signal::Correction);
        let p = build(&doc(facts), &feed, signals, &cfg);
        let text: Vec<String> = p
            .messages
            .iter()
            .map(|m| format!("--- {:?} ---\n{}", m.role, m.content))
            .collect();
        insta::assert_snapshot!("extraction_prompt", text.join("\n"));
    }
}
