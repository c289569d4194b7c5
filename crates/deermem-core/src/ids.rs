//! Identity types: raw user ids and their storage buckets, agent names, fact ids and scopes.
//!
//! Every name that ends up in a path is validated here, once, so that adapters can build
//! paths from these types without re-checking them.

use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::IdError;

/// The user every caller is when authentication is off (`DEFAULT_USER_ID` in the reference).
pub const DEFAULT_USER_ID: &str = "default";

/// The reserved fact bucket used whenever no agent is named.
pub const DEFAULT_AGENT_BUCKET: &str = "__default__";

/// The longest directory or file name component most filesystems accept, in bytes.
const MAX_COMPONENT_BYTES: usize = 255;

/// The longest fact id we accept, in bytes.
///
/// A fact file is written through a temporary `.{id}.md.{32 hex}.tmp`, which must itself fit
/// in one path component, so ids longer than this would fail on write with an OS error.
pub const MAX_FACT_ID_BYTES: usize = 200;

/// The longest agent name we accept, in bytes.
pub const MAX_AGENT_NAME_BYTES: usize = 128;

/// The longest raw user id we accept, in bytes (its bucket must fit in one path component).
pub const MAX_USER_ID_BYTES: usize = 1024;

fn is_safe_id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

/// The storage bucket (directory name) for a raw user id, exactly as the reference's
/// `safe_user_id` / `make_safe_user_id` derive it.
///
/// Every code point outside `[A-Za-z0-9_-]` becomes one `-`; if anything changed, a `-` and the
/// first 16 hex characters of the SHA-256 of the raw id's UTF-8 bytes are appended.
///
/// # Errors
/// An empty id is rejected with the reference's message.
pub fn safe_user_id(raw: &str) -> Result<String, IdError> {
    if raw.is_empty() {
        return Err(IdError::EmptyUserId);
    }
    let mut changed = false;
    let sanitized: String = raw
        .chars()
        .map(|c| {
            if is_safe_id_char(c) {
                c
            } else {
                changed = true;
                '-'
            }
        })
        .collect();
    if !changed {
        return Ok(sanitized);
    }
    let digest = Sha256::digest(raw.as_bytes());
    let hex = hex::encode(digest);
    Ok(format!("{sanitized}-{}", &hex[..16]))
}

/// Whether a raw user id has the shape of a bucket [`safe_user_id`] derives from *another* id:
/// only `[A-Za-z0-9_-]`, ending in `-` and 16 lowercase hex digits, with at least one more `-`
/// before that suffix (an id with a character outside the safe set always leaves one there).
///
/// Such an id maps to itself, so a caller naming it would share the directory of the user whose
/// id was sanitised into it (`victim@corp.com` is stored in `victim-corp-com-7b46e3848256709a`).
/// An id with unsafe characters is never bucket-shaped here: its bucket carries its own hash.
/// Where raw ids come from callers, [`refuse_derived_bucket`] refuses such ids.
pub fn is_derived_bucket_shape(raw: &str) -> bool {
    const HASH_HEX: usize = 16;
    if !raw.chars().all(is_safe_id_char) || raw.len() < HASH_HEX + 2 {
        return false;
    }
    let (head, hash) = raw.split_at(raw.len() - HASH_HEX);
    let Some(prefix) = head.strip_suffix('-') else {
        return false;
    };
    hash.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        && prefix.contains('-')
}

/// The one rule for identities taken from outside (a session cookie's `sub`, a bearer token's
/// user, an owner header, an MCP server's user, the Python package's `user_id`): a raw id with
/// the shape of a bucket derived from *another* id (see [`is_derived_bucket_shape`]) is refused,
/// since naming that bucket would act as its owner. Surrounding whitespace is ignored.
///
/// # Errors
/// [`DerivedBucketId`], whose message says why and what to use instead.
pub fn refuse_derived_bucket(raw: &str) -> Result<(), DerivedBucketId> {
    let raw = raw.trim();
    if is_derived_bucket_shape(raw) {
        return Err(DerivedBucketId(raw.to_owned()));
    }
    Ok(())
}

/// A raw user id shaped like another id's storage bucket, refused by [`refuse_derived_bucket`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "user id {0:?} has the shape of a storage bucket derived from another user id \
     (`<sanitised id>-<16 hex>`, e.g. `victim@corp.com` is stored as \
     `victim-corp-com-7b46e3848256709a`) and would act as that user; name the user by their own \
     id instead"
)]
pub struct DerivedBucketId(pub String);

/// A raw user id as the host gave it (for example `bob@example.com`), with its storage bucket.
///
/// The raw id is what scopes, caches, front matter and the search index record; only the
/// directory name uses the bucket.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(try_from = "String")]
pub struct UserId {
    raw: String,
    bucket: String,
}

impl UserId {
    /// Validates a raw user id and derives its bucket.
    ///
    /// # Errors
    /// Empty ids, ids holding NUL, and ids too long for their bucket to be a file name.
    pub fn new(raw: impl Into<String>) -> Result<Self, IdError> {
        let raw = raw.into();
        if raw.contains('\0') {
            return Err(IdError::UserIdNul);
        }
        if raw.len() > MAX_USER_ID_BYTES {
            return Err(IdError::UserIdTooLong {
                len: raw.len(),
                max: MAX_USER_ID_BYTES,
            });
        }
        let bucket = safe_user_id(&raw)?;
        if bucket.len() > MAX_COMPONENT_BYTES {
            return Err(IdError::UserIdTooLong {
                len: raw.len(),
                max: MAX_COMPONENT_BYTES - 17,
            });
        }
        Ok(Self { raw, bucket })
    }

    /// The `default` user.
    pub fn default_user() -> Self {
        Self {
            raw: DEFAULT_USER_ID.to_owned(),
            bucket: DEFAULT_USER_ID.to_owned(),
        }
    }

    /// The raw id, as given.
    pub fn as_str(&self) -> &str {
        &self.raw
    }

    /// The directory name under `users/`.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }
}

impl fmt::Debug for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UserId({:?})", self.raw)
    }
}

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw)
    }
}

impl TryFrom<String> for UserId {
    type Error = IdError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl TryFrom<&str> for UserId {
    type Error = IdError;
    fn try_from(value: &str) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl Serialize for UserId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.raw)
    }
}

/// An agent bucket name: a custom agent (`^[A-Za-z0-9-]+$`, case-insensitive, stored lowercase)
/// or the reserved [`DEFAULT_AGENT_BUCKET`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct AgentName(String);

impl AgentName {
    /// Parses a public agent name: lowercases it, then accepts `__default__` or the custom-agent
    /// grammar (a full match: unlike the reference, a trailing newline is rejected).
    ///
    /// # Errors
    /// Empty names, names outside the grammar, and names longer than [`MAX_AGENT_NAME_BYTES`].
    pub fn parse(name: &str) -> Result<Self, IdError> {
        if name.is_empty() {
            return Err(IdError::EmptyAgentName);
        }
        if name.len() > MAX_AGENT_NAME_BYTES {
            return Err(IdError::AgentNameTooLong {
                len: name.len(),
                max: MAX_AGENT_NAME_BYTES,
            });
        }
        let lower = name.to_ascii_lowercase();
        if lower == DEFAULT_AGENT_BUCKET {
            return Ok(Self(lower));
        }
        if lower.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            Ok(Self(lower))
        } else {
            Err(IdError::InvalidAgentName {
                name: truncate_for_message(name),
            })
        }
    }

    /// Parses a custom agent name, refusing the reserved default bucket.
    ///
    /// # Errors
    /// As [`AgentName::parse`], plus the reserved `__default__`.
    pub fn parse_custom(name: &str) -> Result<Self, IdError> {
        let parsed = Self::parse(name)?;
        if parsed.is_default() {
            return Err(IdError::InvalidAgentName {
                name: truncate_for_message(name),
            });
        }
        Ok(parsed)
    }

    /// The reserved default bucket.
    pub fn default_bucket() -> Self {
        Self(DEFAULT_AGENT_BUCKET.to_owned())
    }

    /// Resolves an optional agent the way the manager does: `None` is the default bucket.
    ///
    /// # Errors
    /// As [`AgentName::parse`].
    pub fn resolve(name: Option<&str>) -> Result<Self, IdError> {
        match name {
            None => Ok(Self::default_bucket()),
            Some(n) => Self::parse(n),
        }
    }

    /// Whether this is the reserved default bucket.
    pub fn is_default(&self) -> bool {
        self.0 == DEFAULT_AGENT_BUCKET
    }

    /// The canonical (lowercase) name, also the directory name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for AgentName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for AgentName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        Self::parse(&raw).map_err(serde::de::Error::custom)
    }
}

/// A fact id: `[A-Za-z0-9_-]+`, ASCII, at most [`MAX_FACT_ID_BYTES`] bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct FactId(String);

impl FactId {
    /// Validates a fact id.
    ///
    /// # Errors
    /// Empty ids, ids with characters outside the alphabet, and over-long ids.
    pub fn new(id: impl Into<String>) -> Result<Self, IdError> {
        let id = id.into();
        if id.is_empty() {
            return Err(IdError::EmptyFactId);
        }
        if id.len() > MAX_FACT_ID_BYTES {
            return Err(IdError::FactIdTooLong {
                len: id.len(),
                max: MAX_FACT_ID_BYTES,
            });
        }
        if !id.chars().all(is_safe_id_char) {
            return Err(IdError::InvalidFactId {
                id: truncate_for_message(&id),
            });
        }
        Ok(Self(id))
    }

    /// A manager-style id: `fact_` followed by the first 8 hex characters of `random_hex`.
    ///
    /// # Errors
    /// When `random_hex` holds fewer than 8 hex characters.
    pub fn short_from_hex(random_hex: &str) -> Result<Self, IdError> {
        Self::from_hex(random_hex, 8)
    }

    /// A storage-style id: `fact_` followed by 32 hex characters.
    ///
    /// # Errors
    /// When `random_hex` holds fewer than 32 hex characters.
    pub fn long_from_hex(random_hex: &str) -> Result<Self, IdError> {
        Self::from_hex(random_hex, 32)
    }

    /// The id of a fact created under a client's idempotency key (an `Idempotency-Key`
    /// header): `fact_` and the first 32 hex characters of the key's SHA-256, so every replica
    /// and every retry of that create names the same fact.
    pub fn for_idempotency_key(key: &str) -> Self {
        use sha2::Digest as _;
        let digest = sha2::Sha256::new()
            .chain_update(b"deermem-idempotency-key\0")
            .chain_update(key.as_bytes())
            .finalize();
        Self(format!("fact_{}", &hex::encode(digest)[..32]))
    }

    /// `fact_` and the first `len` hex characters of `random_hex`, lowercased.
    fn from_hex(random_hex: &str, len: usize) -> Result<Self, IdError> {
        let hex: String = random_hex
            .chars()
            .filter(char::is_ascii_hexdigit)
            .take(len)
            .collect();
        if hex.len() < len {
            return Err(IdError::InvalidFactId {
                id: format!("fact_{hex}"),
            });
        }
        Self::new(format!("fact_{}", hex.to_ascii_lowercase()))
    }

    /// The reference's short shape from 32 random bits: `fact_` and 8 lowercase hex digits
    /// (the first 8 hex digits of a random UUID). Always a valid id.
    pub fn short_from_bits(bits: u32) -> Self {
        Self(format!("fact_{bits:08x}"))
    }

    /// The storage shape from 128 random bits: `fact_` and 32 lowercase hex digits (a random
    /// UUID without dashes). Always a valid id.
    pub fn long_from_bits(bits: u128) -> Self {
        Self(format!("fact_{bits:032x}"))
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The shard directory: the first two lowercase hex characters of `sha256(id)`.
    pub fn shard(&self) -> String {
        let digest = Sha256::digest(self.0.as_bytes());
        hex::encode(&digest[..1])
    }
}

impl fmt::Display for FactId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<&str> for FactId {
    type Error = IdError;
    fn try_from(value: &str) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl<'de> Deserialize<'de> for FactId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        Self::new(raw).map_err(serde::de::Error::custom)
    }
}

impl std::borrow::Borrow<str> for FactId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

/// Where a storage operation reads or writes: one user (or the legacy no-user layout when
/// `user` is `None`) and optionally one agent bucket.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Scope {
    /// The user, or `None` for the legacy root layout.
    pub user: Option<UserId>,
    /// The agent bucket, or `None` for user-level (summaries only) operations.
    pub agent: Option<AgentName>,
}

impl Scope {
    /// A scope for one user and agent.
    pub fn new(user: Option<UserId>, agent: Option<AgentName>) -> Self {
        Self { user, agent }
    }

    /// A scope for one user and one agent.
    pub fn agent(user: &UserId, agent: &AgentName) -> Self {
        Self {
            user: Some(user.clone()),
            agent: Some(agent.clone()),
        }
    }

    /// The scope as facts and the search index record it: raw user id and agent name.
    pub fn to_fact_scope(&self) -> crate::fact::FactScope {
        crate::fact::FactScope {
            user_id: self.user.as_ref().map(|u| u.as_str().to_owned()),
            agent_name: self.agent.as_ref().map(|a| a.as_str().to_owned()),
        }
    }
}

/// Shortens a hostile input for use in an error message.
pub(crate) fn truncate_for_message(s: &str) -> String {
    const MAX: usize = 80;
    let mut out: String = s
        .chars()
        .take(MAX)
        .map(|c| if c == '\0' { '\u{2400}' } else { c })
        .collect();
    if s.chars().count() > MAX {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_from_random_bits_match_the_hex_shapes_and_validate() {
        let short = FactId::short_from_bits(0x00ab_cdef);
        assert_eq!(short.as_str(), "fact_00abcdef");
        assert_eq!(FactId::new(short.as_str()).unwrap(), short);
        assert_eq!(FactId::short_from_hex("00abcdef").unwrap(), short);
        let bits = 0x0123_4567_89ab_cdef_0011_2233_4455_6677_u128;
        let long = FactId::long_from_bits(bits);
        assert_eq!(long.as_str(), "fact_0123456789abcdef0011223344556677");
        assert_eq!(FactId::new(long.as_str()).unwrap(), long);
        assert_eq!(
            FactId::long_from_hex(&format!("{bits:032x}")).unwrap(),
            long
        );
        assert_eq!(FactId::long_from_bits(u128::MAX).as_str().len(), 5 + 32);
    }

    #[test]
    fn safe_user_id_matches_reference_vectors() {
        let cases = [
            ("alice", "alice"),
            ("-1001234567890", "-1001234567890"),
            ("feishu|ou_AbC/123", "feishu-ou_AbC-123-bbd8f53c62c2d1ce"),
            ("a@b.com", "a-b-com-fb98d44ad7501a95"),
            ("../x", "---x-d6b96a97d147daaa"),
            ("用户", "---0d0e1a86b3aa7877"),
            ("a b", "a-b-c8687a08aa5d6ed2"),
            ("test@example.com", "test-example-com-973dfe463ec85785"),
            ("Ünïcode", "-n-code-00b24be80c8dd6e9"),
            ("bob@example.com", "bob-example-com-5ff860bf1190596c"),
            ("dave@corp.example", "dave-corp-example-24e6e8e886de6c22"),
        ];
        for (raw, bucket) in cases {
            assert_eq!(safe_user_id(raw).unwrap(), bucket, "raw {raw:?}");
            assert_eq!(UserId::new(raw).unwrap().bucket(), bucket);
        }
    }

    #[test]
    fn derived_buckets_are_recognised_and_plain_ids_are_not() {
        // Every bucket derived from an id with unsafe characters has the shape...
        for raw in [
            "victim@corp.com",
            "a@b.com",
            "@",
            "ab@",
            "用户",
            "../x",
            "feishu|ou_AbC/123",
        ] {
            let bucket = safe_user_id(raw).unwrap();
            assert!(is_derived_bucket_shape(&bucket), "{raw:?} -> {bucket}");
            // ...and the raw id itself does not (its bucket carries its own hash).
            assert!(!is_derived_bucket_shape(raw), "{raw:?}");
        }
        assert!(is_derived_bucket_shape("victim-corp-com-7b46e3848256709a"));
        for plain in [
            "alice",
            "default",
            "-1001234567890",
            "550e8400-e29b-41d4-a716-446655440000",
            // No `-` before the suffix: no sanitised id can produce it.
            "build-0123456789abcdef",
            // Upper-case hex, a 15-digit or 17-digit suffix, no separator.
            "a-b-0123456789ABCDEF",
            "a-b-0123456789abcde",
            "a-b-0123456789abcdef0",
            "a-b0123456789abcdef",
            "a-b-0123456789abcdeg",
        ] {
            assert!(!is_derived_bucket_shape(plain), "{plain:?}");
        }
    }

    #[test]
    fn safe_user_id_is_idempotent_on_buckets() {
        for raw in ["a@b.com", "用户", "../x"] {
            let b = safe_user_id(raw).unwrap();
            assert_eq!(safe_user_id(&b).unwrap(), b);
        }
    }

    #[test]
    fn empty_user_id_is_rejected_with_reference_message() {
        assert_eq!(
            safe_user_id("").unwrap_err().to_string(),
            "user_id must be a non-empty string."
        );
        assert!(UserId::new("").is_err());
    }

    #[test]
    fn hostile_user_ids_are_typed_errors_or_safe_buckets() {
        assert!(matches!(UserId::new("a\0b"), Err(IdError::UserIdNul)));
        assert!(matches!(
            UserId::new("x".repeat(5000)),
            Err(IdError::UserIdTooLong { .. })
        ));
        let traversal = UserId::new("../../etc/passwd").unwrap();
        assert!(!traversal.bucket().contains('/'));
        assert!(!traversal.bucket().contains(".."));
        // 250 unsafe characters would give a bucket over 255 bytes.
        assert!(UserId::new("@".repeat(250)).is_err());
    }

    #[test]
    fn agent_names_are_lowercased_and_validated() {
        assert_eq!(AgentName::parse("Coder").unwrap().as_str(), "coder");
        assert_eq!(
            AgentName::parse("Lead-Agent").unwrap().as_str(),
            "lead-agent"
        );
        assert!(AgentName::parse("__DEFAULT__").unwrap().is_default());
        assert_eq!(
            AgentName::resolve(None).unwrap(),
            AgentName::default_bucket()
        );
        for bad in [
            "",
            "a_b",
            "../x",
            "a/b",
            "agent\n",
            "a b",
            "a\0",
            "__default",
            "ü",
        ] {
            assert!(AgentName::parse(bad).is_err(), "{bad:?} must be rejected");
        }
        assert!(AgentName::parse_custom("__default__").is_err());
        assert!(AgentName::parse(&"a".repeat(MAX_AGENT_NAME_BYTES + 1)).is_err());
    }

    #[test]
    fn agent_name_error_messages_match_reference() {
        assert_eq!(
            AgentName::parse("").unwrap_err().to_string(),
            "Agent name must be a non-empty string."
        );
        assert_eq!(
            AgentName::parse("Bad_Name").unwrap_err().to_string(),
            "Invalid agent name 'Bad_Name': names must match ^[A-Za-z0-9-]+$"
        );
    }

    #[test]
    fn fact_ids_follow_the_alphabet() {
        assert!(FactId::new("fact_01HZZ-x").is_ok());
        for bad in ["", "a.b", "../x", "a/b", "a\0", "fact id", "ü"] {
            assert!(FactId::new(bad).is_err(), "{bad:?} must be rejected");
        }
        assert!(FactId::new("a".repeat(MAX_FACT_ID_BYTES + 1)).is_err());
        // An idempotency key names one valid id, the same every time, another for another key.
        let keyed = FactId::for_idempotency_key("retry-7f3a");
        assert_eq!(FactId::new(keyed.as_str()).unwrap(), keyed);
        assert_eq!(keyed, FactId::for_idempotency_key("retry-7f3a"));
        assert_ne!(keyed, FactId::for_idempotency_key("retry-7f3b"));
        assert_eq!(keyed.as_str().len(), "fact_".len() + 32);
        assert_eq!(
            FactId::new("a.b").unwrap_err().to_string(),
            "Fact id may contain only letters, numbers, '_' and '-'."
        );
    }

    #[test]
    fn shard_is_first_byte_of_sha256() {
        let id = FactId::new("fact_01HZZZZZZZZZZZZZZZZZZZZZZZ").unwrap();
        assert_eq!(id.shard(), "9e");
    }

    #[test]
    fn generated_ids_have_reference_shapes() {
        let short = FactId::short_from_hex("0123456789abcdef0123456789abcdef").unwrap();
        assert_eq!(short.as_str(), "fact_01234567");
        let long = FactId::long_from_hex("0123456789ABCDEF0123456789abcdef").unwrap();
        assert_eq!(long.as_str(), "fact_0123456789abcdef0123456789abcdef");
        assert!(FactId::short_from_hex("xyz").is_err());
    }
}
