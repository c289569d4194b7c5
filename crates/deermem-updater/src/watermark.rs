//! The conversation watermark: the identity of the last message already extracted, per
//! `(thread, user, agent)`, in a bounded LRU, so each update feeds the model only the messages it
//! has not seen.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::num::NonZeroUsize;

use deermem_core::{AgentName, Message, UserId};
use lru::LruCache;

/// The key of a conversation: thread, raw user id, agent bucket.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConversationKey {
    /// The host thread id.
    pub thread_id: String,
    /// The raw user id, if any.
    pub user: Option<String>,
    /// The agent bucket.
    pub agent: String,
}

impl ConversationKey {
    /// The key of a thread for a user and agent.
    pub fn new(thread_id: &str, user: Option<&UserId>, agent: &AgentName) -> Self {
        Self {
            thread_id: thread_id.to_owned(),
            user: user.map(|u| u.as_str().to_owned()),
            agent: agent.as_str().to_owned(),
        }
    }
}

/// How a message is recognised again: its id, or its type and text (kept as a length and a
/// hash, so long messages are not copied into the cache).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum MessageIdentity {
    /// A non-empty message id.
    Id(String),
    /// Type and text.
    Content {
        /// Message type.
        kind: String,
        /// Text length in bytes.
        len: usize,
        /// Hash of the text.
        hash: u64,
    },
}

/// A message's identity, or `None` when it has neither an id nor text.
pub(crate) fn message_identity(m: &Message) -> Option<MessageIdentity> {
    if let Some(id) = m.id.as_deref().filter(|s| !s.is_empty()) {
        return Some(MessageIdentity::Id(id.to_owned()));
    }
    let text = m.text();
    if text.is_empty() {
        return None;
    }
    let mut h = DefaultHasher::new();
    text.hash(&mut h);
    Some(MessageIdentity::Content {
        kind: m.kind.as_str().to_owned(),
        len: text.len(),
        hash: h.finish(),
    })
}

/// The name the watermark cache is reported under.
pub const WATERMARK_CACHE_NAME: &str = "updater.watermarks";

/// The watermark cache: a bounded LRU (0 = unbounded).
#[derive(Debug)]
pub(crate) struct Watermarks {
    cache: LruCache<ConversationKey, Option<MessageIdentity>>,
}

impl Watermarks {
    /// A cache holding at most `max_keys` conversations (0 = unbounded).
    pub(crate) fn new(max_keys: usize) -> Self {
        Self {
            cache: match NonZeroUsize::new(max_keys) {
                Some(n) => LruCache::new(n),
                None => LruCache::unbounded(),
            },
        }
    }

    /// The messages after the watermark: all of them when there is no watermark or it is no
    /// longer in the list (safe over-extraction). Reading touches the entry.
    pub(crate) fn feed_after<'a>(
        &mut self,
        key: &ConversationKey,
        messages: &'a [Message],
    ) -> &'a [Message] {
        let Some(Some(last)) = self.cache.get(key) else {
            return messages;
        };
        match messages
            .iter()
            .position(|m| message_identity(m).as_ref() == Some(last))
        {
            Some(i) => &messages[i + 1..],
            None => messages,
        }
    }

    /// Moves the watermark to `last` (the least recently used entry is dropped when full).
    pub(crate) fn set(&mut self, key: ConversationKey, last: Option<MessageIdentity>) {
        self.cache.put(key, last);
    }

    /// How many conversations are tracked.
    pub(crate) fn len(&self) -> usize {
        self.cache.len()
    }

    #[cfg(test)]
    /// Whether a conversation is tracked (without touching it).
    pub(crate) fn contains(&self, key: &ConversationKey) -> bool {
        self.cache.contains(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(t: &str) -> ConversationKey {
        ConversationKey::new(t, None, &AgentName::default_bucket())
    }

    fn with_id(text: &str, id: &str) -> Message {
        let mut m = Message::human(text);
        m.id = Some(id.into());
        m
    }

    #[test]
    fn identity_prefers_ids_then_content() {
        assert_eq!(
            message_identity(&with_id("x", "m1")),
            Some(MessageIdentity::Id("m1".into()))
        );
        let a = message_identity(&Message::human("hello")).unwrap();
        assert_eq!(a, message_identity(&Message::human("hello")).unwrap());
        assert_ne!(a, message_identity(&Message::ai("hello")).unwrap());
        assert_eq!(message_identity(&Message::ai("")), None);
    }

    #[test]
    fn feed_after_the_watermark() {
        let mut w = Watermarks::new(10);
        let msgs = vec![with_id("a", "1"), with_id("b", "2"), with_id("c", "3")];
        assert_eq!(w.feed_after(&key("t"), &msgs).len(), 3);
        w.set(key("t"), message_identity(&msgs[1]));
        assert_eq!(w.feed_after(&key("t"), &msgs), &msgs[2..]);
        // Front removed by summarisation: still found, the tail is fed.
        assert_eq!(w.feed_after(&key("t"), &msgs[1..]), &msgs[2..]);
        // Conversation shrank: the watermark is gone, everything is fed.
        assert_eq!(w.feed_after(&key("t"), &msgs[2..]).len(), 1);
        assert_eq!(w.feed_after(&key("t"), &msgs[..1]).len(), 1);
        // Other threads start fresh; a stored None feeds everything.
        assert_eq!(w.feed_after(&key("u"), &msgs).len(), 3);
        w.set(key("t"), None);
        assert_eq!(w.feed_after(&key("t"), &msgs).len(), 3);
    }

    #[test]
    fn bounded_lru_drops_the_least_recently_used() {
        let mut w = Watermarks::new(2);
        let m = [with_id("a", "1")];
        w.set(key("t1"), message_identity(&m[0]));
        w.set(key("t2"), message_identity(&m[0]));
        let _ = w.feed_after(&key("t1"), &m); // touch t1
        w.set(key("t3"), message_identity(&m[0]));
        assert!(w.contains(&key("t1")));
        assert!(!w.contains(&key("t2")));
        assert_eq!(w.len(), 2);
        let mut unbounded = Watermarks::new(0);
        for i in 0..100 {
            unbounded.set(key(&i.to_string()), None);
        }
        assert_eq!(unbounded.len(), 100);
    }
}
