//! The OpenViking `backend_config`: pre-checks that reject removed and unknown fields, every
//! key's default and validation as the reference has them, and the USER API key read from
//! the environment variable `api_key_env` names (the lookup is injected, never ambient).

use std::time::Duration;

use deermem_core::ConfigError;
pub use deermem_remote::FailurePolicy;
/// The OpenViking USER API key: a [`deermem_remote::Secret`], which never prints.
pub use deermem_remote::Secret as ApiKey;
use deermem_remote::base_url::{self, TransportRule};
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

const TOP_KEYS: [&str; 11] = [
    "base_url",
    "allow_insecure_http",
    "owner_user_id",
    "api_key_env",
    "default_peer_id",
    "timeout_seconds",
    "storage_path",
    "startup_policy",
    "failure_policy",
    "max_seen_message_ids",
    "retrieval",
];
const RETRIEVAL_KEYS: [&str; 5] = [
    "top_k",
    "score_threshold",
    "max_injection_chars",
    "content_mode",
    "injection_query",
];
const FAILURE_KEYS: [&str; 2] = ["read", "write"];

/// What `warm` does when `/health` is not healthy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StartupPolicy {
    /// Startup fails (`startup_check` returns an error).
    #[default]
    FailFast,
    /// Log and continue.
    Warn,
}

/// Which text of a recalled memory is injected.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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

impl ContentMode {
    /// The config value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Abstract => "abstract",
            Self::Overview => "overview",
            Self::Read => "read",
        }
    }
}

/// The `retrieval` mapping.
#[derive(Clone, Debug, PartialEq)]
pub struct RetrievalConfig {
    /// Hits requested for the injection block, 1–100.
    pub top_k: usize,
    /// Minimum score, in `[0, 1]`, sent to the server when set.
    pub score_threshold: Option<f64>,
    /// Character budget of the injection block (and of each memory's text), 256–100000.
    pub max_injection_chars: usize,
    /// Which text of a memory is used.
    pub content_mode: ContentMode,
    /// The fixed recall query.
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
#[derive(Clone, Debug, PartialEq)]
pub struct OpenVikingConfig {
    /// Server root, without a trailing `/`.
    pub base_url: String,
    /// Allows plain `http` to hosts other than the loopback names.
    pub allow_insecure_http: bool,
    /// The one DeerFlow user the USER API key belongs to.
    pub owner_user_id: String,
    /// The environment variable the key was read from.
    pub api_key_env: String,
    /// The USER API key.
    pub api_key: ApiKey,
    /// The actor peer of the default agent.
    pub default_peer_id: String,
    /// One timeout for connect, read and write of every request, in seconds.
    pub timeout_seconds: f64,
    /// Root of the cursor files as configured. The host resolves it into the storage root it
    /// passes to [`crate::OpenVikingManager`], which is where the cursors live; it is kept here
    /// for the record and not applied again.
    pub storage_path: String,
    /// What `warm` does on an unhealthy server.
    pub startup_policy: StartupPolicy,
    /// What reads (`get_context`, `search`) do on a backend failure: `fail_open` logs a
    /// warning and returns nothing (`""` / `[]`), `raise` ([`FailurePolicy::FailClosed`])
    /// returns the error.
    pub read_failure_policy: FailurePolicy,
    /// What captures do on a backend failure: `log_and_drop` ([`FailurePolicy::FailOpen`])
    /// logs the error and the cursor keeps the unconfirmed messages for the next turn; `raise`
    /// reports it (at once for a direct `capture`, on the next `add` for queued ones).
    pub write_failure_policy: FailurePolicy,
    /// How many message hashes a cursor keeps, 16–10000.
    pub max_seen_message_ids: usize,
    /// Recall settings.
    pub retrieval: RetrievalConfig,
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
            api_key: ApiKey::new(api_key),
            default_peer_id: DEFAULT_PEER_ID.to_owned(),
            timeout_seconds: 30.0,
            storage_path: String::new(),
            startup_policy: StartupPolicy::FailFast,
            read_failure_policy: FailurePolicy::FailOpen,
            write_failure_policy: FailurePolicy::FailOpen,
            max_seen_message_ids: 512,
            retrieval: RetrievalConfig::default(),
        }
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
        let mut warnings = Vec::new();
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
        let retrieval = sub_mapping(backend_config, "retrieval")?;
        let failure = sub_mapping(backend_config, "failure_policy")?;

        let mut c = Self::new("", "");
        let get = |k: &str| present(backend_config, k);

        if let Some(v) = get("allow_insecure_http") {
            c.allow_insecure_http = parse_bool("allow_insecure_http", v)?;
        }
        if let Some(v) = get("base_url") {
            c.base_url = scalar_string("base_url", v)?;
        }
        c.base_url = deermem_pycompat::py::strip(&c.base_url)
            .trim_end_matches('/')
            .to_owned();
        if let Some(w) = check_base_url(&c.base_url, c.allow_insecure_http)? {
            warnings.push(w);
        }
        if let Some(v) = get("owner_user_id") {
            c.owner_user_id =
                deermem_pycompat::py::strip(&scalar_string("owner_user_id", v)?).to_owned();
        }
        if c.owner_user_id.is_empty() {
            return Err(key_err(
                "owner_user_id",
                "must not be empty; set it to the DeerFlow user the USER API key belongs to ('default' when auth is off)",
            ));
        }
        if let Some(v) = get("api_key_env") {
            c.api_key_env =
                deermem_pycompat::py::strip(&scalar_string("api_key_env", v)?).to_owned();
        }
        if c.api_key_env.is_empty() {
            return Err(key_err("api_key_env", "must not be empty"));
        }
        if let Some(v) = get("default_peer_id") {
            c.default_peer_id =
                deermem_pycompat::py::strip(&scalar_string("default_peer_id", v)?).to_owned();
        }
        check_default_peer(&c.default_peer_id)?;
        if let Some(v) = get("timeout_seconds") {
            c.timeout_seconds = parse_float("timeout_seconds", v)?;
        }
        check_timeout(c.timeout_seconds)?;
        if let Some(v) = get("storage_path") {
            c.storage_path = scalar_string("storage_path", v)?;
        }
        if let Some(v) = get("startup_policy") {
            let s =
                deermem_pycompat::py::strip(&scalar_string("startup_policy", v)?).to_lowercase();
            c.startup_policy = match s.as_str() {
                "fail_fast" => StartupPolicy::FailFast,
                "warn" => StartupPolicy::Warn,
                _ => {
                    return Err(key_err(
                        "startup_policy",
                        format!("must be 'fail_fast' or 'warn' (got {v})"),
                    ));
                }
            };
        }
        if let Some(v) = present(&failure, "read") {
            c.read_failure_policy = match v.as_str() {
                Some("fail_open") => FailurePolicy::FailOpen,
                Some("raise") => FailurePolicy::FailClosed,
                _ => {
                    return Err(key_err(
                        "failure_policy.read",
                        format!("must be 'fail_open' or 'raise' (got {v})"),
                    ));
                }
            };
        }
        if let Some(v) = present(&failure, "write") {
            c.write_failure_policy = match v.as_str() {
                Some("log_and_drop") => FailurePolicy::FailOpen,
                Some("raise") => FailurePolicy::FailClosed,
                _ => {
                    return Err(key_err(
                        "failure_policy.write",
                        format!("must be 'log_and_drop' or 'raise' (got {v})"),
                    ));
                }
            };
        }
        if let Some(v) = get("max_seen_message_ids") {
            c.max_seen_message_ids = parse_int_range("max_seen_message_ids", v, 16, 10_000)?;
        }
        if let Some(v) = present(&retrieval, "top_k") {
            c.retrieval.top_k = parse_int_range("retrieval.top_k", v, 1, 100)?;
        }
        if let Some(v) = present(&retrieval, "score_threshold") {
            let f = parse_float("retrieval.score_threshold", v)?;
            c.retrieval.score_threshold = Some(f);
        }
        check_score_threshold(c.retrieval.score_threshold)?;
        if let Some(v) = present(&retrieval, "max_injection_chars") {
            c.retrieval.max_injection_chars =
                parse_int_range("retrieval.max_injection_chars", v, 256, 100_000)?;
        }
        if let Some(v) = present(&retrieval, "content_mode") {
            let s = deermem_pycompat::py::strip(&scalar_string("retrieval.content_mode", v)?)
                .to_lowercase();
            c.retrieval.content_mode = match s.as_str() {
                "auto" => ContentMode::Auto,
                "abstract" => ContentMode::Abstract,
                "overview" => ContentMode::Overview,
                "read" => ContentMode::Read,
                _ => {
                    return Err(key_err(
                        "retrieval.content_mode",
                        format!("must be one of auto, abstract, overview, read (got {v})"),
                    ));
                }
            };
        }
        if let Some(v) = present(&retrieval, "injection_query") {
            c.retrieval.injection_query =
                deermem_pycompat::py::strip(&scalar_string("retrieval.injection_query", v)?)
                    .to_owned();
        }
        if c.retrieval.injection_query.is_empty() {
            return Err(key_err("retrieval.injection_query", "must not be empty"));
        }

        let mut unknown: Vec<String> = backend_config
            .keys()
            .filter(|k| !TOP_KEYS.contains(&k.as_str()))
            .cloned()
            .chain(
                retrieval
                    .keys()
                    .filter(|k| !RETRIEVAL_KEYS.contains(&k.as_str()))
                    .map(|k| format!("retrieval.{k}")),
            )
            .chain(
                failure
                    .keys()
                    .filter(|k| !FAILURE_KEYS.contains(&k.as_str()))
                    .map(|k| format!("failure_policy.{k}")),
            )
            .collect();
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

        let key = env(&c.api_key_env).unwrap_or_default();
        let key = deermem_pycompat::py::strip(&key);
        if key.is_empty() {
            return Err(key_err(
                "api_key_env",
                format!("OpenViking USER API key is missing; set {}", c.api_key_env),
            ));
        }
        c.api_key = ApiKey::new(key);
        check_api_key(&c.api_key, &c.api_key_env)?;
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
        check_base_url(&self.base_url, self.allow_insecure_http)?;
        if deermem_pycompat::py::strip(&self.owner_user_id).is_empty() {
            return Err(key_err("owner_user_id", "must not be empty"));
        }
        if deermem_pycompat::py::strip(&self.api_key_env).is_empty() {
            return Err(key_err("api_key_env", "must not be empty"));
        }
        if self.api_key.is_empty() {
            return Err(key_err(
                "api_key_env",
                format!(
                    "OpenViking USER API key is missing; set {}",
                    self.api_key_env
                ),
            ));
        }
        check_api_key(&self.api_key, &self.api_key_env)?;
        check_default_peer(&self.default_peer_id)?;
        check_timeout(self.timeout_seconds)?;
        if !(16..=10_000).contains(&self.max_seen_message_ids) {
            return Err(key_err(
                "max_seen_message_ids",
                format!(
                    "must be an integer between 16 and 10000 (got {})",
                    self.max_seen_message_ids
                ),
            ));
        }
        let r = &self.retrieval;
        if !(1..=100).contains(&r.top_k) {
            return Err(key_err(
                "retrieval.top_k",
                format!("must be an integer between 1 and 100 (got {})", r.top_k),
            ));
        }
        check_score_threshold(r.score_threshold)?;
        if !(256..=100_000).contains(&r.max_injection_chars) {
            return Err(key_err(
                "retrieval.max_injection_chars",
                format!(
                    "must be an integer between 256 and 100000 (got {})",
                    r.max_injection_chars
                ),
            ));
        }
        if deermem_pycompat::py::strip(&r.injection_query).is_empty() {
            return Err(key_err("retrieval.injection_query", "must not be empty"));
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
    if s.chars().count() <= MAX {
        format!("{s:?}").trim_matches('"').to_owned()
    } else {
        let head: String = s.chars().take(MAX).collect();
        format!("{}…", format!("{head:?}").trim_matches('"'))
    }
}

fn present<'a>(m: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    m.get(key).filter(|v| !v.is_null())
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

fn scalar_string(key: &str, v: &Value) -> Result<String, ConfigError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        _ => Err(key_err(key, format!("must be a string (got {v})"))),
    }
}

fn parse_bool(key: &str, v: &Value) -> Result<bool, ConfigError> {
    match v {
        Value::Bool(b) => Ok(*b),
        Value::String(s) => match deermem_pycompat::py::strip(s).to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Ok(true),
            "false" | "0" | "no" | "off" => Ok(false),
            _ => Err(key_err(key, format!("must be a boolean (got {v})"))),
        },
        _ => Err(key_err(key, format!("must be a boolean (got {v})"))),
    }
}

fn parse_float(key: &str, v: &Value) -> Result<f64, ConfigError> {
    let f = match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => deermem_pycompat::py::parse_float(s),
        _ => None,
    };
    match f {
        Some(f) if f.is_finite() => Ok(f),
        Some(_) => Err(key_err(key, format!("must be a finite number (got {v})"))),
        None => Err(key_err(key, format!("must be a number (got {v})"))),
    }
}

fn parse_int_range(key: &str, v: &Value, lo: i64, hi: i64) -> Result<usize, ConfigError> {
    let bad = || {
        key_err(
            key,
            format!("must be an integer between {lo} and {hi} (got {v})"),
        )
    };
    let i = match v {
        Value::Number(n) => match n.as_i64() {
            Some(i) => i,
            None => {
                let f = n.as_f64().ok_or_else(bad)?;
                if f.fract() != 0.0 || f.abs() > 1e15 {
                    return Err(bad());
                }
                f as i64
            }
        },
        Value::String(s) => deermem_pycompat::py::strip(s)
            .parse::<i64>()
            .map_err(|_| bad())?,
        _ => return Err(bad()),
    };
    if (lo..=hi).contains(&i) {
        usize::try_from(i).map_err(|_| bad())
    } else {
        Err(bad())
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

fn check_api_key(key: &ApiKey, env_name: &str) -> Result<(), ConfigError> {
    if !key.expose().bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        return Err(key_err(
            "api_key_env",
            format!(
                "the OpenViking USER API key in {env_name} contains characters that cannot be sent in an HTTP header"
            ),
        ));
    }
    Ok(())
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
        assert_eq!(c.read_failure_policy, FailurePolicy::FailOpen);
        assert_eq!(c.write_failure_policy, FailurePolicy::FailOpen);
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
        assert_eq!(c.read_failure_policy, FailurePolicy::FailClosed);
        assert_eq!(c.write_failure_policy, FailurePolicy::FailClosed);
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
        assert_eq!(c.read_failure_policy, FailurePolicy::FailOpen);
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
    fn allow_insecure_http_accepts_bools_and_words_only() {
        for (v, want) in [
            (json!(true), true),
            (json!("on"), true),
            (json!("1"), true),
            (json!("Off"), false),
            (json!("no"), false),
            (json!(false), false),
        ] {
            let c = parse(json!({"owner_user_id": "a", "allow_insecure_http": v})).unwrap();
            assert_eq!(c.allow_insecure_http, want);
        }
        for v in [json!(1), json!("maybe"), json!([true])] {
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
}
