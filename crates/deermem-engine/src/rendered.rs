//! The rendered `<memory>` blocks of recently asked scopes, so a `get_context` whose scope has
//! not changed since the last call returns the text without formatting or counting it again.
//!
//! A block is a pure function of the scope's facts, its two summary sections and the
//! injection options (token budget, guaranteed categories, counting, mode). An entry keeps what
//! it was built from and answers only a document that provably holds the same: the same fact
//! list (the storage hands out clones of one shared, copy-on-write list while its own cache
//! vouches for the scope, so identity of the list is the storage's own "nothing changed"; a
//! write, or another process's write the storage detects, gives a new list), equal summaries
//! and equal options. The entry holds a clone of the list it was built from, so that list
//! cannot be written in place (a shared list is copied on its first write) nor its allocation
//! reused by another list while the entry can still vouch for it.
//!
//! Bounded: at most [`MAX_ENTRIES`] scopes and [`MAX_TEXT_BYTES`] bytes of rendered text;
//! the least recently asked scope is forgotten first.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, MutexGuard};

use deermem_core::{AgentName, CacheBound, Facts, MemoryDocument, SummarySection, UserId};
use deermem_updater::InjectionOptions;
use lru::LruCache;

/// Scopes whose rendered block is kept.
pub const MAX_ENTRIES: usize = 1024;
/// Rendered text kept in all, in bytes (a default 2,000-token block is about 8 KB).
pub const MAX_TEXT_BYTES: usize = 16 * 1024 * 1024;

/// The name the rendered blocks are reported under (entries).
pub const ENTRIES_NAME: &str = "engine.rendered_blocks";
/// The name the rendered blocks' text is reported under (bytes).
pub const TEXT_NAME: &str = "engine.rendered_text";

type Key = (Option<UserId>, Option<AgentName>);

#[derive(Debug)]
struct Entry {
    options: InjectionOptions,
    facts: Facts,
    user: SummarySection,
    history: SummarySection,
    text: Arc<str>,
}

impl Entry {
    fn renders(&self, doc: &MemoryDocument, options: &InjectionOptions) -> bool {
        self.facts.shares_with(&doc.facts)
            && self.user == doc.user
            && self.history == doc.history
            && self.options == *options
    }
}

#[derive(Debug)]
struct Blocks {
    entries: LruCache<Key, Entry>,
    text_bytes: usize,
}

/// The cache of rendered blocks (cheap to clone; clones share it).
#[derive(Debug, Clone)]
pub(crate) struct RenderedBlocks {
    inner: Arc<Mutex<Blocks>>,
    max_entries: usize,
    max_text_bytes: usize,
}

/// What the cache holds now and may hold at most.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RenderedCacheUsage {
    /// Scopes with a rendered block.
    pub entries: usize,
    /// Their text, in bytes.
    pub text_bytes: usize,
    /// The bound on entries.
    pub max_entries: usize,
    /// The bound on text bytes.
    pub max_text_bytes: usize,
}

impl Default for RenderedBlocks {
    fn default() -> Self {
        Self::with_bounds(MAX_ENTRIES, MAX_TEXT_BYTES)
    }
}

impl RenderedBlocks {
    /// A cache of at most `max_entries` scopes and `max_text_bytes` of text.
    pub(crate) fn with_bounds(max_entries: usize, max_text_bytes: usize) -> Self {
        let max_entries = max_entries.max(1);
        Self {
            inner: Arc::new(Mutex::new(Blocks {
                entries: LruCache::new(NonZeroUsize::new(max_entries).unwrap_or(NonZeroUsize::MIN)),
                text_bytes: 0,
            })),
            max_entries,
            max_text_bytes,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Blocks> {
        // The cache holds no invariant a panicking holder could break half-way that a lookup
        // would trust: every entry is validated against the caller's document.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The block rendered earlier from this very document state with these options.
    pub(crate) fn get(
        &self,
        user: Option<&UserId>,
        bucket: Option<&AgentName>,
        doc: &MemoryDocument,
        options: &InjectionOptions,
    ) -> Option<String> {
        let key = (user.cloned(), bucket.cloned());
        let text = {
            let mut blocks = self.lock();
            let entry = blocks.entries.get(&key)?;
            if !entry.renders(doc, options) {
                return None;
            }
            Arc::clone(&entry.text)
        };
        Some(String::from(&*text))
    }

    /// Remembers the block `text` rendered from `doc` with `options`.
    pub(crate) fn put(
        &self,
        user: Option<&UserId>,
        bucket: Option<&AgentName>,
        doc: &MemoryDocument,
        options: &InjectionOptions,
        text: &str,
    ) {
        if text.len() > self.max_text_bytes {
            return;
        }
        let entry = Entry {
            options: options.clone(),
            facts: doc.facts.clone(),
            user: doc.user.clone(),
            history: doc.history.clone(),
            text: Arc::from(text),
        };
        let mut blocks = self.lock();
        blocks.text_bytes += text.len();
        if let Some((_, old)) = blocks.entries.push((user.cloned(), bucket.cloned()), entry) {
            blocks.text_bytes -= old.text.len();
        }
        while blocks.text_bytes > self.max_text_bytes {
            match blocks.entries.pop_lru() {
                Some((_, old)) => blocks.text_bytes -= old.text.len(),
                None => break,
            }
        }
    }

    /// The bounds of the cache (entries and text bytes) and what it holds now.
    pub(crate) fn cache_bounds(&self) -> [CacheBound; 2] {
        let u = self.usage();
        let bytes = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        [
            CacheBound::entries(ENTRIES_NAME, u.max_entries, Some(u.entries)),
            CacheBound::bytes(
                TEXT_NAME,
                bytes(u.max_text_bytes),
                Some(bytes(u.text_bytes)),
            ),
        ]
    }

    /// What the cache holds and its bounds.
    pub(crate) fn usage(&self) -> RenderedCacheUsage {
        let blocks = self.lock();
        RenderedCacheUsage {
            entries: blocks.entries.len(),
            text_bytes: blocks.text_bytes,
            max_entries: self.max_entries,
            max_text_bytes: self.max_text_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use deermem_core::fact::{NormalizeContext, normalize_fact};
    use deermem_core::{Fact, FactId, FactScope, MemoryMode, Timestamp};
    use deermem_updater::DeerMemConfig;
    use serde_json::json;

    use super::*;

    fn doc(contents: &[&str]) -> MemoryDocument {
        let now = Timestamp::parse_iso("2026-06-01T00:00:00Z").unwrap();
        let scope = FactScope {
            user_id: Some("alice".into()),
            agent_name: Some("__default__".into()),
        };
        let new_id = || FactId::new("generated").unwrap();
        let ctx = NormalizeContext {
            scope: &scope,
            existing: None,
            now,
            new_id: &new_id,
        };
        let mut d = MemoryDocument::empty(now);
        d.facts = contents
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let draft = json!({"id": format!("fact_{i}"), "content": c,
                    "category": "context", "confidence": 0.9});
                normalize_fact(&draft.try_into().unwrap(), &ctx).unwrap()
            })
            .collect::<Vec<Fact>>()
            .into();
        d
    }

    fn options(max_tokens: usize) -> InjectionOptions {
        let mut o =
            InjectionOptions::from_config(&DeerMemConfig::default(), MemoryMode::Middleware, true);
        o.max_tokens = max_tokens;
        o
    }

    #[test]
    fn a_block_answers_only_the_state_and_options_it_was_built_from() {
        let cache = RenderedBlocks::default();
        let user = UserId::new("alice").unwrap();
        let agent = AgentName::default_bucket();
        let d = doc(&["Likes tea"]);
        let o = options(2000);
        assert_eq!(cache.get(Some(&user), Some(&agent), &d, &o), None);
        cache.put(Some(&user), Some(&agent), &d, &o, "block");
        // A clone shares the fact list: same state.
        assert_eq!(
            cache.get(Some(&user), Some(&agent), &d.clone(), &o),
            Some("block".into())
        );
        // Equal facts in another list: not provably the same state.
        assert_eq!(
            cache.get(Some(&user), Some(&agent), &doc(&["Likes tea"]), &o),
            None
        );
        // A written clone (copy on write) is another state.
        let mut written = d.clone();
        written.facts[0].content = "Likes coffee".into();
        assert_eq!(cache.get(Some(&user), Some(&agent), &written, &o), None);
        // Summaries, options, scope.
        let mut summarised = d.clone();
        summarised.user.0.insert(
            "workContext".into(),
            json!({"summary": "x", "updatedAt": ""}),
        );
        assert_eq!(cache.get(Some(&user), Some(&agent), &summarised, &o), None);
        assert_eq!(cache.get(Some(&user), Some(&agent), &d, &options(10)), None);
        assert_eq!(cache.get(Some(&user), None, &d, &o), None);
        assert_eq!(cache.get(None, Some(&agent), &d, &o), None);
    }

    #[test]
    fn the_cache_stays_within_its_bounds() {
        let cache = RenderedBlocks::with_bounds(3, 10);
        let d = doc(&["x"]);
        let o = options(2000);
        for i in 0..5 {
            let u = UserId::new(format!("u{i}")).unwrap();
            cache.put(Some(&u), None, &d, &o, "abcd");
            let usage = cache.usage();
            assert!(usage.entries <= 2, "{usage:?}");
            assert!(usage.text_bytes <= 10, "{usage:?}");
        }
        let newest = UserId::new("u4").unwrap();
        assert_eq!(cache.get(Some(&newest), None, &d, &o), Some("abcd".into()));
        // A text larger than the whole budget is not kept.
        cache.put(Some(&newest), None, &d, &o, "0123456789ab");
        assert_eq!(cache.get(Some(&newest), None, &d, &o), Some("abcd".into()));
        let cache = RenderedBlocks::with_bounds(2, 1000);
        for i in 0..4 {
            let u = UserId::new(format!("u{i}")).unwrap();
            cache.put(Some(&u), None, &d, &o, "abcd");
        }
        assert_eq!(cache.usage().entries, 2);
        assert_eq!(cache.usage().text_bytes, 8);
    }
}
