//! The OpenViking `backend_config`: pre-checks that reject removed and unknown fields, every
//! key's default and validation as the reference has them (read through core's config loader,
//! `deermem_core::config::lax`), and the USER API key read from the environment variable
//! `api_key_env` names (the lookup is injected, never ambient). `Serialize` is the display form
//! (the gateway's `/api/memory/config`): the base URL without credentials
//! (`deermem_core::config::shown`), every setting with its value or default; the key is not a
//! `backend_config` key and is not shown (were it serialised, its [`ConfigSecret`] type writes
//! `"***"`).

use std::time::Duration;

use deermem_core::ConfigError;
use deermem_core::config::{ConfigSecret, lax, shown};
use deermem_pycompat::py::strip;
pub use deermem_remote::FailurePolicy;
use deermem_remote::base_url::{self, TransportRule};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

/// The server a fresh installation talks to.
pub const DEFAULT_BASE_URL: &str = "http://127.0.0.1:1933";
/// The environment variable holding the USER API key by default.
pub const DEFAULT_API_KEY_ENV: &str = "OPENVIKING_API_KEY";
/// The actor peer used when no agent is named.
pub const DEFAULT_PEER_ID: &str = "deerflow";
/// The prefix reserved for hashed agent peers.
pub const RESERVED_PEER_PREFIX: &str = "df-agent-";
/// The fixed recall query (the user's message is never used as the query).
pub const DEFAULT_INJECTION_QUERY: &str = "user profile preferences important entities events ongoing goals constraints and prior decisions";

const PREFIX: &str = "memory.backend_config";

/// Hostnames that may be reached over plain `http` without the opt-in.
const LOOPBACK_HOSTS: [&str; 3] = ["127.0.0.1", "localhost", "openviking"];

/// Keys of the removed trusted-identity mode.
const TRUSTED_MODE_KEYS: [&str; 2] = ["auth_mode", "account"];

/// Keys of the removed custom HTTP client.
const REMOVED_HTTP_KEYS: [&str; 7] = [
    "connect_timeout_seconds",
    "max_connections",
    "max_keepalive_connections",
    "max_retries",
    "pool_timeout_seconds",
    "read_timeout_seconds",
    "write_timeout_seconds",
];

/// What `warm` does when `/health` is not healthy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StartupPolicy {
    /// Startup fails (`startup_check` returns an error).
    #[default]
    FailFast,
    /// Log and continue.
    Warn,
}

/// Which text of a recalled memory is injected.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ContentMode {
    /// Read the full content for level-2 hits with a uri, else overview, else abstract.
    Auto,
    /// Abstract, else overview.
    Abstract,
    /// Overview, else abstract.
    #[default]
    Overview,
    /// Read the full content of every hit (falling back to overview, then abstract).
    Read,
}

/// The `retrieval` mapping.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RetrievalConfig {
    /// Hits requested for the injection block, 1–100.
    #[serde(deserialize_with = "lax::int_in::<_, _, 1, 100>")]
    pub top_k: usize,
    /// Minimum score, in `[0, 1]`, sent to the server when set.
    #[serde(deserialize_with = "some_float")]
    pub score_threshold: Option<f64>,
    /// Character budget of the injection block (and of each memory's text), 256–100000.
    #[serde(deserialize_with = "lax::int_in::<_, _, 256, 100_000>")]
    pub max_injection_chars: usize,
    /// Which text of a memory is used.
    #[serde(deserialize_with = "content_mode")]
    pub content_mode: ContentMode,
    /// The fixed recall query.
    #[serde(deserialize_with = "stripped")]
    pub injection_query: String,
}

impl Default for RetrievalConfig {
    fn default() -> Self {
        Self {
            top_k: 8,
            score_threshold: None,
            max_injection_chars: 12_000,
            content_mode: ContentMode::Overview,
            injection_query: DEFAULT_INJECTION_QUERY.to_owned(),
        }
    }
}

/// The parsed OpenViking backend configuration. `Debug` never shows the API key.
///
/// Its fields are the key list (with `failure_policy`'s `read` and `write`): any other key is
/// refused.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default = "OpenVikingConfig::unset")]
pub struct OpenVikingConfig {
    /// Server root, without a trailing `/`.
    #[serde(deserialize_with = "lax::scalar_str", serialize_with = "shown::url")]
    pub base_url: String,
    /// Allows plain `http` to hosts other than the loopback names.
    #[serde(deserialize_with = "lax::bool")]
    pub allow_insecure_http: bool,
    /// The one DeerFlow user the USER API key belongs to.
    #[serde(deserialize_with = "stripped")]
    pub owner_user_id: String,
    /// The environment variable the key was read from.
    #[serde(deserialize_with = "stripped")]
    pub api_key_env: String,
    /// The USER API key, read from `api_key_env` (not a `backend_config` key, so not shown).
    #[serde(skip)]
    pub api_key: ConfigSecret,
    /// The actor peer of the default agent.
    #[serde(deserialize_with = "stripped")]
    pub default_peer_id: String,
    /// One timeout for connect, read and write of every request, in seconds.
    #[serde(deserialize_with = "lax::float")]
    pub timeout_seconds: f64,
    /// Root of the cursor files as configured. The host resolves it into the storage root it
    /// passes to [`crate::OpenVikingManager`], which is where the cursors live; it is kept here
    /// for the record and not applied again.
    #[serde(deserialize_with = "lax::scalar_str")]
    pub storage_path: String,
    /// What `warm` does on an unhealthy server.
    #[serde(deserialize_with = "startup_policy")]
    pub startup_policy: StartupPolicy,
    /// What reads and captures do on a backend failure (`failure_policy`, read as its own
    /// section).
    #[serde(skip_deserializing)]
    pub failure_policy: FailurePolicies,
    /// How many message hashes a cursor keeps, 16–10000.
    #[serde(deserialize_with = "lax::int_in::<_, _, 16, 10_000>")]
    pub max_seen_message_ids: usize,
    /// Recall settings.
    pub retrieval: RetrievalConfig,
}

/// The `failure_policy` mapping, shown with its configuration spelling.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FailurePolicies {
    /// What reads (`get_context`, `search`) do on a backend failure: `fail_open` logs a
    /// warning and returns nothing (`""` / `[]`), `raise` ([`FailurePolicy::FailClosed`])
    /// returns the error.
    #[serde(serialize_with = "show_read_policy")]
    pub read: FailurePolicy,
    /// What captures do on a backend failure: `log_and_drop` ([`FailurePolicy::FailOpen`])
    /// logs the error and the cursor keeps the unconfirmed messages for the next turn; `raise`
    /// reports it (at once for a direct `capture`, on the next `add` for queued ones).
    #[serde(serialize_with = "show_write_policy")]
    pub write: FailurePolicy,
}

fn show_policy<S: Serializer>(p: FailurePolicy, open: &str, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(match p {
        FailurePolicy::FailOpen => open,
        FailurePolicy::FailClosed => "raise",
    })
}

fn show_read_policy<S: Serializer>(p: &FailurePolicy, s: S) -> Result<S::Ok, S::Error> {
    show_policy(*p, "fail_open", s)
}

fn show_write_policy<S: Serializer>(p: &FailurePolicy, s: S) -> Result<S::Ok, S::Error> {
    show_policy(*p, "log_and_drop", s)
}

/// The `failure_policy` mapping as read.
#[derive(Default, Deserialize)]
#[serde(default)]
struct FailureSection {
    #[serde(deserialize_with = "read_policy")]
    read: FailurePolicy,
    #[serde(deserialize_with = "write_policy")]
    write: FailurePolicy,
}

fn policy<'de, D: Deserializer<'de>>(d: D, open: &str) -> Result<FailurePolicy, D::Error> {
    let v = Value::deserialize(d)?;
    match v.as_str() {
        Some(s) if s == open => Ok(FailurePolicy::FailOpen),
        Some("raise") => Ok(FailurePolicy::FailClosed),
        _ => Err(D::Error::custom(format!(
            "must be '{open}' or 'raise' (got {v})"
        ))),
    }
}

fn read_policy<'de, D: Deserializer<'de>>(d: D) -> Result<FailurePolicy, D::Error> {
    policy(d, "fail_open")
}

fn write_policy<'de, D: Deserializer<'de>>(d: D) -> Result<FailurePolicy, D::Error> {
    policy(d, "log_and_drop")
}

/// A string (or number) without Python-whitespace around it.
fn stripped<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    lax::scalar_str(d).map(|s| strip(&s).to_owned())
}

fn some_float<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    lax::float(d).map(Some)
}

fn startup_policy<'de, D: Deserializer<'de>>(d: D) -> Result<StartupPolicy, D::Error> {
    let s = stripped(d)?;
    match s.to_lowercase().as_str() {
        "fail_fast" => Ok(StartupPolicy::FailFast),
        "warn" => Ok(StartupPolicy::Warn),
        _ => Err(D::Error::custom(format!(
            "must be 'fail_fast' or 'warn' (got {s:?})"
        ))),
    }
}

fn content_mode<'de, D: Deserializer<'de>>(d: D) -> Result<ContentMode, D::Error> {
    let s = stripped(d)?;
    match s.to_lowercase().as_str() {
        "auto" => Ok(ContentMode::Auto),
        "abstract" => Ok(ContentMode::Abstract),
        "overview" => Ok(ContentMode::Overview),
        "read" => Ok(ContentMode::Read),
        _ => Err(D::Error::custom(format!(
            "must be one of auto, abstract, overview, read (got {s:?})"
        ))),
    }
}

impl OpenVikingConfig {
    /// A configuration with every default, for `owner_user_id` and `api_key`. Call
    /// [`OpenVikingConfig::validate`] after changing fields.
    pub fn new(owner_user_id: impl Into<String>, api_key: impl Into<String>) -> Self {
        Self {
            base_url: DEFAULT_BASE_URL.to_owned(),
            allow_insecure_http: false,
            owner_user_id: owner_user_id.into(),
            api_key_env: DEFAULT_API_KEY_ENV.to_owned(),
            api_key: ConfigSecret::new(api_key),
            default_peer_id: DEFAULT_PEER_ID.to_owned(),
            timeout_seconds: 30.0,
            storage_path: String::new(),
            startup_policy: StartupPolicy::FailFast,
            failure_policy: FailurePolicies::default(),
            max_seen_message_ids: 512,
            retrieval: RetrievalConfig::default(),
        }
    }

    /// The defaults before a `backend_config` is read (no owner, no key yet).
    fn unset() -> Self {
        Self::new("", "")
    }

    /// Parses `memory.backend_config`, reading the API key through `env`.
    ///
    /// Returns the configuration and non-fatal warnings.
    ///
    /// # Errors
    /// The reference's pre-check errors (trusted mode, removed HTTP client fields, non-mapping
    /// sections, unknown fields) and a [`ConfigError`] naming each invalid key.
    pub fn from_backend_config(
        backend_config: &Map<String, Value>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(Self, Vec<String>), ConfigError> {
        let (mut c, warnings) = Self::settings_from_backend_config(backend_config)?;
        let key = env(&c.api_key_env).unwrap_or_default();
        c.api_key = ConfigSecret::new(strip(&key));
        c.check_api_key()?;
        Ok((c, warnings))
    }

    /// [`OpenVikingConfig::from_backend_config`] without the key: every setting parsed and
    /// checked, the environment not read and `api_key` left empty (for showing the settings).
    ///
    /// # Errors
    /// As [`OpenVikingConfig::from_backend_config`], but for the key.
    pub fn settings_from_backend_config(
        backend_config: &Map<String, Value>,
    ) -> Result<(Self, Vec<String>), ConfigError> {
        if TRUSTED_MODE_KEYS
            .iter()
            .any(|k| backend_config.contains_key(*k))
        {
            return Err(ConfigError::new(
                PREFIX,
                "OpenViking trusted mode is no longer supported by this backend; use a USER API key and configure owner_user_id",
            ));
        }
        let mut removed: Vec<&str> = REMOVED_HTTP_KEYS
            .iter()
            .copied()
            .filter(|k| backend_config.contains_key(*k))
            .collect();
        if !removed.is_empty() {
            removed.sort_unstable();
            return Err(ConfigError::new(
                PREFIX,
                format!(
                    "OpenViking custom HTTP client fields are no longer supported: {}",
                    removed.join(", ")
                ),
            ));
        }
        sub_mapping(backend_config, "retrieval")?;
        let failure = sub_mapping(backend_config, "failure_policy")?;

        // `failure_policy` fills two fields, so it is read as its own section.
        let mut rest = backend_config.clone();
        rest.remove("failure_policy");
        // Where the cursors live (`storage_class: postgres` and its block): the facade's keys.
        rest.remove("storage_class");
        rest.remove("postgres");
        let (mut c, mut unknown) = lax::deserialize::<Self>(&Value::Object(rest), PREFIX)?;
        let (policies, ignored) = lax::deserialize::<FailureSection>(
            &Value::Object(failure),
            &format!("{PREFIX}.failure_policy"),
        )?;
        c.failure_policy = FailurePolicies {
            read: policies.read,
            write: policies.write,
        };
        unknown.extend(ignored.iter().map(|k| format!("failure_policy.{k}")));
        c.base_url = strip(&c.base_url).trim_end_matches('/').to_owned();
        let warnings = c.check_settings()?.into_iter().collect();

        if !unknown.is_empty() {
            unknown.sort();
            return Err(ConfigError::new(
                PREFIX,
                format!(
                    "Unknown OpenViking backend_config fields: {}",
                    unknown
                        .iter()
                        .map(|k| truncate_for_message(k))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        Ok((c, warnings))
    }

    /// Checks every field the way [`OpenVikingConfig::from_backend_config`] does (for configs
    /// built in code).
    ///
    /// # Errors
    /// A [`ConfigError`] naming the first invalid key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.base_url.trim_end_matches('/') != self.base_url {
            return Err(key_err("base_url", "must not end with '/'"));
        }
        self.check_settings()?;
        self.check_api_key()
    }

    /// The checks of every setting but the key; returns the warning of an opted-in insecure
    /// base URL.
    fn check_settings(&self) -> Result<Option<String>, ConfigError> {
        let warning = check_base_url(&self.base_url, self.allow_insecure_http)?;
        if strip(&self.owner_user_id).is_empty() {
            return Err(key_err(
                "owner_user_id",
                "must not be empty; set it to the DeerFlow user the USER API key belongs to ('default' when auth is off)",
            ));
        }
        if strip(&self.api_key_env).is_empty() {
            return Err(key_err("api_key_env", "must not be empty"));
        }
        check_default_peer(&self.default_peer_id)?;
        check_timeout(self.timeout_seconds)?;
        let ranges = [
            (
                "max_seen_message_ids",
                self.max_seen_message_ids,
                16,
                10_000,
            ),
            ("retrieval.top_k", self.retrieval.top_k, 1, 100),
            (
                "retrieval.max_injection_chars",
                self.retrieval.max_injection_chars,
                256,
                100_000,
            ),
        ];
        for (name, v, lo, hi) in ranges {
            if !(lo..=hi).contains(&v) {
                return Err(key_err(
                    name,
                    format!("must be an integer between {lo} and {hi} (got {v})"),
                ));
            }
        }
        check_score_threshold(self.retrieval.score_threshold)?;
        if strip(&self.retrieval.injection_query).is_empty() {
            return Err(key_err("retrieval.injection_query", "must not be empty"));
        }
        Ok(warning)
    }

    /// The USER API key is set and can be sent in a header.
    fn check_api_key(&self) -> Result<(), ConfigError> {
        if self.api_key.is_empty() {
            return Err(key_err(
                "api_key_env",
                format!(
                    "OpenViking USER API key is missing; set {}",
                    self.api_key_env
                ),
            ));
        }
        if !self
            .api_key
            .expose()
            .bytes()
            .all(|b| (0x21..=0x7e).contains(&b))
        {
            return Err(key_err(
                "api_key_env",
                format!(
                    "the OpenViking USER API key in {} contains characters that cannot be sent in an HTTP header",
                    self.api_key_env
                ),
            ));
        }
        Ok(())
    }

    /// The request timeout.
    pub fn timeout(&self) -> Duration {
        Duration::try_from_secs_f64(self.timeout_seconds).unwrap_or(Duration::from_secs(30))
    }
}

fn key_err(key: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::new(format!("{PREFIX}.{key}"), message)
}

fn truncate_for_message(s: &str) -> String {
    const MAX: usize = 80;
    let head: String = s.chars().take(MAX).collect();
    let more = if s.chars().nth(MAX).is_some() {
        "…"
    } else {
        ""
    };
    format!("{}{more}", format!("{head:?}").trim_matches('"'))
}

fn sub_mapping(m: &Map<String, Value>, name: &str) -> Result<Map<String, Value>, ConfigError> {
    match m.get(name) {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(o)) => Ok(o.clone()),
        Some(_) => Err(key_err(
            name,
            format!("OpenViking {name} must be a mapping"),
        )),
    }
}

/// Checks the base URL against the shared transport rule (the key travels with every
/// request); returns a warning for an opted-in insecure URL.
fn check_base_url(
    base_url: &str,
    allow_insecure_http: bool,
) -> Result<Option<String>, ConfigError> {
    let rule = TransportRule {
        allow_insecure_http,
        sends_secret: true,
        trusted_http_hosts: &LOOPBACK_HOSTS,
    };
    let checked =
        base_url::check(base_url, rule).map_err(|e| key_err("base_url", e.to_string()))?;
    Ok(checked.map(|host| format!(
        "{PREFIX}.base_url uses plain http to {host}: the OpenViking API key travels unencrypted (allow_insecure_http is set)"
    )))
}

/// Whether `s` matches `^[a-z0-9][a-z0-9_-]{0,63}$`.
pub(crate) fn is_safe_peer(s: &str) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 64
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_' || *b == b'-')
}

fn check_default_peer(peer: &str) -> Result<(), ConfigError> {
    if !is_safe_peer(peer) {
        return Err(key_err(
            "default_peer_id",
            format!(
                "must match ^[a-z0-9][a-z0-9_-]{{0,63}}$ (got {:?})",
                truncate_for_message(peer)
            ),
        ));
    }
    if peer.starts_with(RESERVED_PEER_PREFIX) {
        return Err(key_err(
            "default_peer_id",
            format!("must not use the reserved prefix {RESERVED_PEER_PREFIX:?}"),
        ));
    }
    Ok(())
}

fn check_timeout(t: f64) -> Result<(), ConfigError> {
    if !t.is_finite() || t <= 0.0 {
        return Err(key_err(
            "timeout_seconds",
            format!("must be a finite number > 0 (got {t})"),
        ));
    }
    if Duration::try_from_secs_f64(t).is_err() {
        return Err(key_err(
            "timeout_seconds",
            format!("is too large (got {t})"),
        ));
    }
    Ok(())
}

fn check_score_threshold(s: Option<f64>) -> Result<(), ConfigError> {
    match s {
        Some(f) if !f.is_finite() || !(0.0..=1.0).contains(&f) => Err(key_err(
            "retrieval.score_threshold",
            format!("must be a finite number between 0 and 1 (got {f})"),
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn env_with_key(name: &str) -> Option<String> {
        (name == "OPENVIKING_API_KEY").then(|| "  ov-user-secret-123  ".to_owned())
    }

    fn parse(v: Value) -> Result<OpenVikingConfig, ConfigError> {
        OpenVikingConfig::from_backend_config(v.as_object().unwrap(), &env_with_key).map(|x| x.0)
    }

    #[test]
    fn defaults_match_the_reference() {
        let c = parse(json!({"owner_user_id": " alice "})).unwrap();
        assert_eq!(c.base_url, "http://127.0.0.1:1933");
        assert!(!c.allow_insecure_http);
        assert_eq!(c.owner_user_id, "alice");
        assert_eq!(c.api_key_env, "OPENVIKING_API_KEY");
        assert_eq!(c.api_key.expose(), "ov-user-secret-123");
        assert_eq!(c.default_peer_id, "deerflow");
        assert_eq!(c.timeout_seconds, 30.0);
        assert_eq!(c.storage_path, "");
        assert_eq!(c.startup_policy, StartupPolicy::FailFast);
        assert_eq!(c.failure_policy.read, FailurePolicy::FailOpen);
        assert_eq!(c.failure_policy.write, FailurePolicy::FailOpen);
        assert_eq!(c.max_seen_message_ids, 512);
        assert_eq!(c.retrieval, RetrievalConfig::default());
        assert_eq!(c.retrieval.top_k, 8);
        assert_eq!(c.retrieval.max_injection_chars, 12_000);
        assert_eq!(c.retrieval.content_mode, ContentMode::Overview);
        assert!(c.validate().is_ok());
    }

    #[test]
    fn parses_every_knob() {
        let c = parse(json!({
            "owner_user_id": "alice",
            "base_url": "https://ov.example.com/api/",
            "default_peer_id": "my_bot-1",
            "timeout_seconds": "12.5",
            "storage_path": "/tmp/x",
            "startup_policy": "WARN",
            "failure_policy": {"read": "raise", "write": "raise"},
            "max_seen_message_ids": 16,
            "retrieval": {"top_k": 3, "score_threshold": 0.25, "max_injection_chars": 256,
                          "content_mode": "Read", "injection_query": "  who am I  "}
        }))
        .unwrap();
        assert_eq!(c.base_url, "https://ov.example.com/api");
        assert_eq!(c.default_peer_id, "my_bot-1");
        assert_eq!(c.timeout_seconds, 12.5);
        assert_eq!(c.storage_path, "/tmp/x");
        assert_eq!(c.startup_policy, StartupPolicy::Warn);
        assert_eq!(c.failure_policy.read, FailurePolicy::FailClosed);
        assert_eq!(c.failure_policy.write, FailurePolicy::FailClosed);
        assert_eq!(c.max_seen_message_ids, 16);
        assert_eq!(c.retrieval.top_k, 3);
        assert_eq!(c.retrieval.score_threshold, Some(0.25));
        assert_eq!(c.retrieval.max_injection_chars, 256);
        assert_eq!(c.retrieval.content_mode, ContentMode::Read);
        assert_eq!(c.retrieval.injection_query, "who am I");
        assert!(c.validate().is_ok());
    }

    #[test]
    fn pre_checks_reject_removed_fields_in_order() {
        let e = parse(json!({"owner_user_id": "a", "auth_mode": "trusted", "max_retries": 3}))
            .unwrap_err();
        assert!(
            e.message
                .contains("trusted mode is no longer supported by this backend"),
            "{e}"
        );
        let e = parse(json!({"owner_user_id": "a", "account": "acme"})).unwrap_err();
        assert!(e.message.contains("trusted mode"), "{e}");
        let e =
            parse(json!({"owner_user_id": "a", "max_retries": 3, "connect_timeout_seconds": 1}))
                .unwrap_err();
        assert_eq!(
            e.message,
            "OpenViking custom HTTP client fields are no longer supported: connect_timeout_seconds, max_retries"
        );
        for key in REMOVED_HTTP_KEYS {
            let e = parse(json!({"owner_user_id": "a", key: 1})).unwrap_err();
            assert!(
                e.message.contains("custom HTTP client fields"),
                "{key}: {e}"
            );
        }
        let e = parse(json!({"owner_user_id": "a", "retrieval": [1]})).unwrap_err();
        assert_eq!(e.message, "OpenViking retrieval must be a mapping");
        let e = parse(json!({"owner_user_id": "a", "failure_policy": "raise"})).unwrap_err();
        assert_eq!(e.message, "OpenViking failure_policy must be a mapping");
        let c = parse(json!({"owner_user_id": "a", "failure_policy": null, "retrieval": null}))
            .unwrap();
        assert_eq!(c.failure_policy.read, FailurePolicy::FailOpen);
    }

    #[test]
    fn unknown_keys_are_rejected_sorted_with_their_section() {
        let e = parse(json!({
            "owner_user_id": "a", "zeta": 1, "alpha": 2,
            "retrieval": {"topk": 1}, "failure_policy": {"reed": "raise"}
        }))
        .unwrap_err();
        assert_eq!(
            e.message,
            "Unknown OpenViking backend_config fields: alpha, failure_policy.reed, retrieval.topk, zeta"
        );
    }

    #[test]
    fn plain_http_only_on_loopback_names_unless_opted_in() {
        for ok in [
            "http://127.0.0.1:1933",
            "http://localhost:1933/",
            "http://LOCALHOST",
            "http://openviking:1933",
            "https://ov.example.com",
            "https://[::1]:1933",
        ] {
            assert!(
                parse(json!({"owner_user_id": "a", "base_url": ok})).is_ok(),
                "{ok}"
            );
        }
        for bad in [
            "http://ov.example.com",
            "http://10.0.0.5:1933",
            "http://[::1]:1933",
            "http://127.0.0.2",
        ] {
            let e = parse(json!({"owner_user_id": "a", "base_url": bad})).unwrap_err();
            assert_eq!(e.key, "memory.backend_config.base_url", "{bad}");
            assert!(e.message.contains("allow_insecure_http"), "{bad}: {e}");
            let (c, w) = OpenVikingConfig::from_backend_config(
                json!({"owner_user_id": "a", "base_url": bad, "allow_insecure_http": "YES"})
                    .as_object()
                    .unwrap(),
                &env_with_key,
            )
            .unwrap();
            assert!(c.allow_insecure_http);
            assert!(w[0].contains("unencrypted"), "{w:?}");
        }
        for bad in [
            "ftp://127.0.0.1",
            "127.0.0.1:1933",
            "http://",
            "https://user:pw@ov.example.com",
            "https://ov.example.com/?q=1",
            "not a url",
        ] {
            let e = parse(json!({"owner_user_id": "a", "base_url": bad})).unwrap_err();
            assert_eq!(e.key, "memory.backend_config.base_url", "{bad}");
        }
    }

    #[test]
    fn allow_insecure_http_is_a_lax_bool() {
        // pydantic's lax bool, shared by every config key (see docs/compat.md).
        for (v, want) in [
            (json!(true), true),
            (json!("on"), true),
            (json!("1"), true),
            (json!(1), true),
            (json!("T"), true),
            (json!("Off"), false),
            (json!("no"), false),
            (json!(0), false),
            (json!(false), false),
        ] {
            let c = parse(json!({"owner_user_id": "a", "allow_insecure_http": v})).unwrap();
            assert_eq!(c.allow_insecure_http, want);
        }
        for v in [json!(2), json!(" on"), json!("maybe"), json!([true])] {
            let e = parse(json!({"owner_user_id": "a", "allow_insecure_http": v})).unwrap_err();
            assert!(e.message.contains("must be a boolean"), "{e}");
        }
    }

    #[test]
    fn every_key_is_validated_naming_it() {
        let cases: &[(&str, Value)] = &[
            ("owner_user_id", json!("   ")),
            ("api_key_env", json!(" ")),
            ("default_peer_id", json!("df-agent-x")),
            ("default_peer_id", json!("Upper")),
            ("default_peer_id", json!("-dash")),
            ("default_peer_id", json!("a".repeat(65))),
            ("default_peer_id", json!("a/b")),
            ("timeout_seconds", json!(0)),
            ("timeout_seconds", json!(-1)),
            ("timeout_seconds", json!("nan")),
            ("timeout_seconds", json!("inf")),
            ("timeout_seconds", json!(1e300)),
            ("startup_policy", json!("explode")),
            ("max_seen_message_ids", json!(15)),
            ("max_seen_message_ids", json!(10_001)),
            ("max_seen_message_ids", json!(20.5)),
        ];
        for (key, value) in cases {
            let mut m = json!({"owner_user_id": "a"});
            m[*key] = value.clone();
            let e = parse(m).expect_err(&format!("{key}={value} must fail"));
            assert_eq!(e.key, format!("memory.backend_config.{key}"), "{e}");
        }
        let e = parse(json!({"owner_user_id": "a", "default_peer_id": "df-agent-x"})).unwrap_err();
        assert!(e.message.contains("reserved prefix"), "{e}");
        let nested: &[(&str, &str, Value)] = &[
            ("retrieval", "top_k", json!(0)),
            ("retrieval", "top_k", json!(101)),
            ("retrieval", "score_threshold", json!(1.5)),
            ("retrieval", "score_threshold", json!(-0.1)),
            ("retrieval", "score_threshold", json!("nan")),
            ("retrieval", "max_injection_chars", json!(255)),
            ("retrieval", "max_injection_chars", json!(100_001)),
            ("retrieval", "content_mode", json!("full")),
            ("retrieval", "injection_query", json!("  ")),
            ("failure_policy", "read", json!("fail_closed")),
            ("failure_policy", "write", json!("ignore")),
        ];
        for (section, key, value) in nested {
            let e = parse(json!({"owner_user_id": "a", *section: {*key: value.clone()}}))
                .expect_err(&format!("{section}.{key}={value} must fail"));
            assert_eq!(
                e.key,
                format!("memory.backend_config.{section}.{key}"),
                "{e}"
            );
        }
    }

    #[test]
    fn missing_or_unsendable_key_is_rejected_without_showing_it() {
        let none = |_: &str| None;
        let e = OpenVikingConfig::from_backend_config(
            json!({"owner_user_id": "a"}).as_object().unwrap(),
            &none,
        )
        .unwrap_err();
        assert_eq!(
            e.message,
            "OpenViking USER API key is missing; set OPENVIKING_API_KEY"
        );
        let blank = |_: &str| Some("   ".to_owned());
        let e = OpenVikingConfig::from_backend_config(
            json!({"owner_user_id": "a", "api_key_env": "MY_OV"})
                .as_object()
                .unwrap(),
            &blank,
        )
        .unwrap_err();
        assert!(e.message.contains("set MY_OV"), "{e}");
        let bad = |_: &str| Some("sk-with\nnewline-secret".to_owned());
        let e = OpenVikingConfig::from_backend_config(
            json!({"owner_user_id": "a"}).as_object().unwrap(),
            &bad,
        )
        .unwrap_err();
        assert!(e.message.contains("cannot be sent"), "{e}");
        assert!(!e.message.contains("secret"), "{e}");
    }

    #[test]
    fn custom_env_name_is_used() {
        let env = |k: &str| (k == "TEAM_OV_KEY").then(|| "team-key".to_owned());
        let (c, _) = OpenVikingConfig::from_backend_config(
            json!({"owner_user_id": "a", "api_key_env": " TEAM_OV_KEY "})
                .as_object()
                .unwrap(),
            &env,
        )
        .unwrap();
        assert_eq!(c.api_key_env, "TEAM_OV_KEY");
        assert_eq!(c.api_key.expose(), "team-key");
    }

    #[test]
    fn debug_never_shows_the_key() {
        let c = parse(json!({"owner_user_id": "alice"})).unwrap();
        let dbg = format!("{c:?} {:?} {}", c.api_key, c.api_key);
        assert!(!dbg.contains("ov-user-secret-123"), "{dbg}");
        assert!(dbg.contains("alice"));
        assert!(dbg.contains("<redacted>"));
    }

    #[test]
    fn validate_checks_code_built_configs() {
        let mut c = OpenVikingConfig::new("alice", "k");
        assert!(c.validate().is_ok());
        c.retrieval.top_k = 0;
        assert_eq!(
            c.validate().unwrap_err().key,
            "memory.backend_config.retrieval.top_k"
        );
        let mut c = OpenVikingConfig::new("alice", "");
        assert_eq!(
            c.validate().unwrap_err().key,
            "memory.backend_config.api_key_env"
        );
        c = OpenVikingConfig::new("alice", "k");
        c.base_url = "http://example.com".into();
        assert!(c.validate().is_err());
        c.allow_insecure_http = true;
        assert!(c.validate().is_ok());
        c.timeout_seconds = f64::NAN;
        assert!(c.validate().is_err());
    }

    #[test]
    fn the_display_never_shows_the_key_or_url_credentials() {
        let env =
            |name: &str| (name == "OPENVIKING_API_KEY").then(|| "ov-DISTINCT-4b7e".to_owned());
        let (c, _) = OpenVikingConfig::from_backend_config(
            json!({
                "owner_user_id": "alice",
                "base_url": "https://ov.internal:1933/",
                "failure_policy": {"write": "raise"},
                "retrieval": {"content_mode": "read"},
            })
            .as_object()
            .unwrap(),
            &env,
        )
        .unwrap();
        assert_eq!(c.api_key.expose(), "ov-DISTINCT-4b7e");
        let shown = serde_json::to_value(&c).unwrap();
        let text = shown.to_string();
        assert!(!text.contains("DISTINCT"), "{text}");
        assert_eq!(shown["base_url"], "https://ov.internal:1933");
        assert!(shown.get("api_key").is_none(), "{text}");
        assert_eq!(shown["api_key_env"], "OPENVIKING_API_KEY");
        assert_eq!(
            shown["failure_policy"],
            json!({"read": "fail_open", "write": "raise"})
        );
        assert_eq!(shown["startup_policy"], "fail_fast");
        assert_eq!(shown["retrieval"]["content_mode"], "read");
        assert_eq!(shown["retrieval"]["top_k"], 8, "defaults are shown");
        // The settings alone (for display) need no key and read no environment.
        let (s, _) = OpenVikingConfig::settings_from_backend_config(
            json!({"owner_user_id": "alice"}).as_object().unwrap(),
        )
        .unwrap();
        assert!(s.api_key.is_empty());
        // The rule is the types', not validation's: a URL the loader would refuse still loses
        // its credentials.
        let mut built = OpenVikingConfig::new("alice", "ov-DISTINCT-4b7e");
        built.base_url = "https://svc:PW-DISTINCT@ov.internal:1933?token=Q-DISTINCT#f".into();
        let text = serde_json::to_string(&built).unwrap();
        for secret in ["DISTINCT", "svc"] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
    }
}
