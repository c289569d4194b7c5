//! `HonchoConfig`: the Honcho `backend_config` keys with the reference's defaults, validation
//! and error order. The API key is a [`Secret`], which never prints.

use std::collections::BTreeMap;
use std::time::Duration;

use deermem_core::ConfigError;
use deermem_remote::base_url::{self, BaseUrlError, TransportRule};
pub use deermem_remote::{FailurePolicy, Secret};
use serde_json::{Map, Value};

use crate::identity::is_honcho_id;

/// Honcho's `MAX_MESSAGE_SIZE`: the longest message content (in characters) the server takes.
pub const HONCHO_MAX_MESSAGE_CHARS: usize = 25_000;

/// The keys this backend reads from `backend_config`.
pub const HONCHO_KEYS: [&str; 13] = [
    "base_url",
    "api_key",
    "allow_insecure_http",
    "workspace_prefix",
    "workspace_overrides",
    "user_peer_overrides",
    "assistant_peer",
    "timeout_seconds",
    "connect_timeout_seconds",
    "message_char_limit",
    "max_injection_chars",
    "failure_policy",
    "storage_path",
];

const PREFIX: &str = "memory.backend_config";

fn key(k: &str) -> String {
    format!("{PREFIX}.{k}")
}

/// The Honcho backend settings, with the reference's keys, defaults and validation.
#[derive(Clone, Debug, PartialEq)]
pub struct HonchoConfig {
    /// Server base URL without a trailing `/` (a path prefix is kept).
    pub base_url: String,
    /// Bearer token, sent only when set.
    pub api_key: Option<Secret>,
    /// Allows an API key over plain `http://`.
    pub allow_insecure_http: bool,
    /// Prefix of derived workspace ids.
    pub workspace_prefix: String,
    /// Raw user id to workspace id.
    pub workspace_overrides: BTreeMap<String, String>,
    /// Raw user id to user peer id.
    pub user_peer_overrides: BTreeMap<String, String>,
    /// The assistant's peer id.
    pub assistant_peer: String,
    /// Per-request (read) timeout in seconds.
    pub timeout_seconds: f64,
    /// Connect timeout in seconds.
    pub connect_timeout_seconds: f64,
    /// Each message is cut to this many characters (after stripping).
    pub message_char_limit: usize,
    /// The injection text is cut to this many characters.
    pub max_injection_chars: usize,
    /// Read failure policy (`failure_policy.read`): under `fail_open` a failed read logs a
    /// warning and returns the empty value (`""`, `[]`, the empty document); under
    /// `fail_closed` it returns [`deermem_core::ManagerError::Unavailable`] / `Timeout`.
    pub read_policy: FailurePolicy,
    /// Injected by the host; not used by this backend.
    pub storage_path: String,
}

impl Default for HonchoConfig {
    fn default() -> Self {
        Self {
            base_url: "http://localhost:8000".into(),
            api_key: None,
            allow_insecure_http: false,
            workspace_prefix: "deerflow-u-".into(),
            workspace_overrides: BTreeMap::new(),
            user_peer_overrides: BTreeMap::new(),
            assistant_peer: "deerflow".into(),
            timeout_seconds: 10.0,
            connect_timeout_seconds: 3.0,
            message_char_limit: 8000,
            max_injection_chars: 6000,
            read_policy: FailurePolicy::FailOpen,
            storage_path: String::new(),
        }
    }
}

/// Python `str()` of a scalar config value; `None` for mappings and lists.
fn scalar_str(v: &Value) -> Option<String> {
    match v {
        Value::Array(_) | Value::Object(_) => None,
        other => deermem_pycompat::py::py_str(other),
    }
}

fn string(k: &str, v: &Value) -> Result<String, ConfigError> {
    scalar_str(v).ok_or_else(|| ConfigError::new(key(k), format!("must be a string (got {v})")))
}

fn boolean(k: &str, v: &Value) -> Result<bool, ConfigError> {
    match v {
        Value::Bool(b) => Ok(*b),
        Value::Number(n) if n.as_i64() == Some(0) => Ok(false),
        Value::Number(n) if n.as_i64() == Some(1) => Ok(true),
        Value::String(s) => match s.trim().to_ascii_lowercase().as_str() {
            "true" | "yes" | "on" | "1" | "t" | "y" => Ok(true),
            "false" | "no" | "off" | "0" | "f" | "n" | "" => Ok(false),
            _ => Err(ConfigError::new(
                key(k),
                format!("must be a boolean (got {v})"),
            )),
        },
        _ => Err(ConfigError::new(
            key(k),
            format!("must be a boolean (got {v})"),
        )),
    }
}

fn seconds(k: &str, v: &Value) -> Result<f64, ConfigError> {
    let bad = || {
        ConfigError::new(
            key(k),
            format!("Honcho backend: {k} must be a finite value > 0 (got {v})"),
        )
    };
    let f = match v {
        Value::Number(n) => n.as_f64().ok_or_else(bad)?,
        Value::Bool(b) => f64::from(u8::from(*b)),
        Value::String(s) => deermem_pycompat::py::parse_float(s).ok_or_else(bad)?,
        _ => return Err(bad()),
    };
    check_seconds(k, f)?;
    Ok(f)
}

fn check_seconds(k: &str, f: f64) -> Result<(), ConfigError> {
    if f.is_finite() && f > 0.0 && Duration::try_from_secs_f64(f).is_ok() {
        Ok(())
    } else {
        Err(ConfigError::new(
            key(k),
            format!("Honcho backend: {k} must be a finite value > 0 (got {f})"),
        ))
    }
}

fn positive_int(k: &str, v: &Value) -> Result<usize, ConfigError> {
    let bad = || {
        ConfigError::new(
            key(k),
            format!("Honcho backend: {k} must be an integer > 0 (got {v})"),
        )
    };
    let i: i64 = match v {
        Value::Number(n) => match n.as_i64() {
            Some(i) => i,
            None => {
                let f = n.as_f64().ok_or_else(bad)?;
                if f.fract() == 0.0 && f.abs() < 9.0e15 {
                    f as i64
                } else {
                    return Err(bad());
                }
            }
        },
        Value::Bool(b) => i64::from(*b),
        Value::String(s) => s.trim().parse().map_err(|_| bad())?,
        _ => return Err(bad()),
    };
    check_positive(k, i)
}

fn check_positive(k: &str, i: i64) -> Result<usize, ConfigError> {
    if i > 0 {
        usize::try_from(i).map_err(|_| {
            ConfigError::new(
                key(k),
                format!("Honcho backend: {k} is too large (got {i})"),
            )
        })
    } else {
        Err(ConfigError::new(
            key(k),
            format!("Honcho backend: {k} must be an integer > 0 (got {i})"),
        ))
    }
}

fn overrides(k: &str, v: &Value) -> Result<BTreeMap<String, String>, ConfigError> {
    let map = match v {
        Value::Object(m) => m,
        _ => {
            return Err(ConfigError::new(
                key(k),
                format!("must be a mapping of user id to id (got {v})"),
            ));
        }
    };
    let mut out = BTreeMap::new();
    for (user, value) in map {
        let s = match value {
            Value::Null => None,
            other => scalar_str(other),
        };
        match s {
            Some(s) if !s.trim().is_empty() => {
                out.insert(user.clone(), s);
            }
            _ => {
                return Err(ConfigError::new(
                    key(k),
                    format!("the value for user {user:?} must be a non-empty string (got {value})"),
                ));
            }
        }
    }
    Ok(out)
}

impl HonchoConfig {
    /// Parses the Honcho `backend_config` (already `$VAR`-resolved by the host).
    ///
    /// `null` values take the default; unknown keys are ignored with a warning; values that
    /// Honcho will reject at runtime (ids outside `[A-Za-z0-9_-]`, a message limit above the
    /// server's 25 000 characters) produce warnings.
    ///
    /// # Errors
    /// A [`ConfigError`] naming `memory.backend_config.<key>`: an API key over plain `http://`
    /// without `allow_insecure_http`, a blank override value, a non-finite or non-positive
    /// timeout, a non-positive character budget, an unknown `failure_policy.read`, a base URL
    /// that is not `http(s)`.
    pub fn from_backend_config(
        bc: &Map<String, Value>,
    ) -> Result<(Self, Vec<String>), ConfigError> {
        let mut c = Self::default();
        let mut warnings = Vec::new();
        let g = |k: &str| bc.get(k).filter(|v| !v.is_null());

        for k in bc.keys() {
            if !HONCHO_KEYS.contains(&k.as_str()) {
                warnings.push(format!(
                    "{PREFIX}.{k} is not a Honcho backend setting and was ignored"
                ));
            }
        }

        if let Some(v) = g("base_url") {
            c.base_url = string("base_url", v)?.trim_end_matches('/').to_owned();
        }
        if let Some(v) = g("api_key") {
            let k = string("api_key", v)?;
            if !k.is_empty() {
                c.api_key = Some(Secret::new(k));
            }
        }
        if let Some(v) = g("allow_insecure_http") {
            c.allow_insecure_http = boolean("allow_insecure_http", v)?;
        }
        if let Some(v) = g("workspace_prefix") {
            c.workspace_prefix = string("workspace_prefix", v)?;
        }
        if let Some(v) = g("assistant_peer") {
            c.assistant_peer = string("assistant_peer", v)?;
        }
        if let Some(v) = g("storage_path") {
            c.storage_path = string("storage_path", v)?;
        }
        // The reference checks the insecure key first, then the override maps, then numbers.
        c.check_transport()?;
        if let Some(v) = g("workspace_overrides") {
            c.workspace_overrides = overrides("workspace_overrides", v)?;
        }
        if let Some(v) = g("user_peer_overrides") {
            c.user_peer_overrides = overrides("user_peer_overrides", v)?;
        }
        if let Some(v) = g("timeout_seconds") {
            c.timeout_seconds = seconds("timeout_seconds", v)?;
        }
        if let Some(v) = g("connect_timeout_seconds") {
            c.connect_timeout_seconds = seconds("connect_timeout_seconds", v)?;
        }
        if let Some(v) = g("message_char_limit") {
            c.message_char_limit = positive_int("message_char_limit", v)?;
        }
        if let Some(v) = g("max_injection_chars") {
            c.max_injection_chars = positive_int("max_injection_chars", v)?;
        }
        if let Some(v) = g("failure_policy") {
            let Value::Object(fp) = v else {
                return Err(ConfigError::new(
                    key("failure_policy"),
                    format!("must be a mapping like {{read: fail_open}} (got {v})"),
                ));
            };
            for k in fp.keys() {
                if k != "read" {
                    warnings.push(format!(
                        "{PREFIX}.failure_policy.{k} is not used by the Honcho backend and was ignored"
                    ));
                }
            }
            if let Some(r) = fp.get("read").filter(|r| !r.is_null()) {
                let s = string("failure_policy.read", r)?;
                c.read_policy = match s.trim().to_ascii_lowercase().as_str() {
                    "fail_open" => FailurePolicy::FailOpen,
                    "fail_closed" => FailurePolicy::FailClosed,
                    _ => {
                        return Err(ConfigError::new(
                            key("failure_policy.read"),
                            format!("must be 'fail_open' or 'fail_closed' (got {s:?})"),
                        ));
                    }
                };
            }
        }
        c.validate()?;
        warnings.extend(c.runtime_warnings());
        Ok((c, warnings))
    }

    fn check_transport(&self) -> Result<(), ConfigError> {
        let rule = TransportRule {
            allow_insecure_http: self.allow_insecure_http,
            sends_secret: self.api_key.is_some(),
            trusted_http_hosts: &[],
        };
        base_url::check(&self.base_url, rule)
            .map(|_| ())
            .map_err(|e| {
                let k = match e {
                    BaseUrlError::InsecureHttp { .. } => "api_key",
                    _ => "base_url",
                };
                ConfigError::new(key(k), e.to_string())
            })
    }

    /// Checks the invariants (also for a directly constructed value): the transport rule, blank
    /// overrides, finite positive timeouts and positive character budgets.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check_transport()?;
        for (name, map) in [
            ("workspace_overrides", &self.workspace_overrides),
            ("user_peer_overrides", &self.user_peer_overrides),
        ] {
            if let Some((user, _)) = map.iter().find(|(_, v)| v.trim().is_empty()) {
                return Err(ConfigError::new(
                    key(name),
                    format!("the value for user {user:?} must be a non-empty string"),
                ));
            }
        }
        check_seconds("timeout_seconds", self.timeout_seconds)?;
        check_seconds("connect_timeout_seconds", self.connect_timeout_seconds)?;
        for (name, v) in [
            ("message_char_limit", self.message_char_limit),
            ("max_injection_chars", self.max_injection_chars),
        ] {
            if v == 0 {
                return Err(ConfigError::new(
                    key(name),
                    format!("Honcho backend: {name} must be an integer > 0 (got 0)"),
                ));
            }
        }
        Ok(())
    }

    /// Values that parse but that Honcho rejects or clamps at runtime.
    fn runtime_warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        let mut check = |what: String, id: &str| {
            if !is_honcho_id(id) {
                w.push(format!(
                    "{what} {id:?} is not a valid Honcho id ([A-Za-z0-9_-], 1-512 characters); Honcho will reject requests that use it"
                ));
            }
        };
        check(format!("{PREFIX}.assistant_peer"), &self.assistant_peer);
        if !self.workspace_prefix.is_empty() {
            check(format!("{PREFIX}.workspace_prefix"), &self.workspace_prefix);
        }
        for (u, v) in &self.workspace_overrides {
            check(format!("{PREFIX}.workspace_overrides[{u:?}]"), v);
        }
        for (u, v) in &self.user_peer_overrides {
            check(format!("{PREFIX}.user_peer_overrides[{u:?}]"), v);
        }
        if self.message_char_limit > HONCHO_MAX_MESSAGE_CHARS {
            w.push(format!(
                "{PREFIX}.message_char_limit={} exceeds Honcho's {HONCHO_MAX_MESSAGE_CHARS}-character message limit; messages are cut to {HONCHO_MAX_MESSAGE_CHARS}",
                self.message_char_limit
            ));
        }
        w
    }

    /// The per-message character cap actually applied: `message_char_limit`, never above the
    /// server's limit.
    pub fn effective_message_chars(&self) -> usize {
        self.message_char_limit.min(HONCHO_MAX_MESSAGE_CHARS)
    }

    /// The read timeout.
    pub fn timeout(&self) -> Duration {
        Duration::try_from_secs_f64(self.timeout_seconds).unwrap_or(Duration::from_secs(10))
    }

    /// The connect timeout.
    pub fn connect_timeout(&self) -> Duration {
        Duration::try_from_secs_f64(self.connect_timeout_seconds).unwrap_or(Duration::from_secs(3))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parse(v: Value) -> Result<(HonchoConfig, Vec<String>), ConfigError> {
        HonchoConfig::from_backend_config(v.as_object().unwrap())
    }

    #[test]
    fn defaults_match_the_reference() {
        let (c, w) = parse(json!({})).unwrap();
        assert!(w.is_empty());
        assert_eq!(c, HonchoConfig::default());
        assert_eq!(c.base_url, "http://localhost:8000");
        assert!(c.api_key.is_none());
        assert_eq!(c.workspace_prefix, "deerflow-u-");
        assert_eq!(c.assistant_peer, "deerflow");
        assert_eq!((c.timeout_seconds, c.connect_timeout_seconds), (10.0, 3.0));
        assert_eq!((c.message_char_limit, c.max_injection_chars), (8000, 6000));
        assert_eq!(c.read_policy, FailurePolicy::FailOpen);
    }

    #[test]
    fn parses_knobs_and_warns_about_unknown_keys() {
        let (c, w) = parse(json!({
            "base_url": "https://honcho.example/pfx/",
            "api_key": "sk-h",
            "workspace_overrides": {"alice": "team-ws"},
            "user_peer_overrides": {"alice": "alice-peer"},
            "failure_policy": {"read": "FAIL_CLOSED"},
            "storage_path": "/data",
            "timeout_seconds": "2.5",
            "connect_timeout_seconds": 0.5,
            "message_char_limit": 12,
            "max_injection_chars": 8.0,
            "bogus": 1
        }))
        .unwrap();
        assert_eq!(c.base_url, "https://honcho.example/pfx");
        assert_eq!(c.api_key.as_ref().unwrap().expose(), "sk-h");
        assert_eq!(c.workspace_overrides["alice"], "team-ws");
        assert_eq!(c.user_peer_overrides["alice"], "alice-peer");
        assert_eq!(c.read_policy, FailurePolicy::FailClosed);
        assert_eq!(c.storage_path, "/data");
        assert_eq!((c.timeout_seconds, c.connect_timeout_seconds), (2.5, 0.5));
        assert_eq!((c.message_char_limit, c.max_injection_chars), (12, 8));
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("memory.backend_config.bogus"), "{w:?}");
    }

    #[test]
    fn api_key_over_http_needs_opt_in() {
        let e = parse(json!({"api_key": "sk", "base_url": "http://h"})).unwrap_err();
        assert_eq!(e.key, "memory.backend_config.api_key");
        assert!(e.message.contains("allow_insecure_http"));
        let e = parse(json!({"api_key": "sk", "base_url": "HTTP://h"})).unwrap_err();
        assert!(e.message.contains("allow_insecure_http"));
        assert!(
            parse(json!({"api_key": "sk", "base_url": "http://h", "allow_insecure_http": true}))
                .is_ok()
        );
        // Unlike Python's bool("false"), the string "false" is false.
        assert!(
            parse(json!({"api_key": "sk", "base_url": "http://h", "allow_insecure_http": "false"}))
                .is_err()
        );
        assert!(parse(json!({"base_url": "http://h"})).is_ok());
        assert!(parse(json!({"api_key": "sk", "base_url": "https://h"})).is_ok());
        assert!(parse(json!({"api_key": "", "base_url": "http://h"})).is_ok());
        assert_eq!(
            parse(json!({"base_url": "localhost:8000"}))
                .unwrap_err()
                .key,
            "memory.backend_config.base_url"
        );
    }

    #[test]
    fn blank_override_values_are_rejected() {
        for map in ["workspace_overrides", "user_peer_overrides"] {
            for bad in [json!(""), json!(null), json!("  "), json!([1])] {
                let e = parse(json!({ map: {"alice": bad.clone()} })).unwrap_err();
                assert_eq!(e.key, format!("memory.backend_config.{map}"), "{bad}");
            }
            assert!(parse(json!({ map: "alice" })).is_err());
        }
    }

    #[test]
    fn rejects_bad_timeouts_and_budgets() {
        for k in ["timeout_seconds", "connect_timeout_seconds"] {
            for bad in [
                json!(0),
                json!(-1),
                json!("nan"),
                json!("inf"),
                json!("-inf"),
                json!("x"),
                json!(1e300),
            ] {
                let e = parse(json!({ k: bad.clone() })).unwrap_err();
                assert_eq!(e.key, format!("memory.backend_config.{k}"), "{k}={bad}");
                assert!(e.message.contains("finite value > 0"), "{e}");
            }
        }
        for k in ["message_char_limit", "max_injection_chars"] {
            for bad in [json!(0), json!(-1), json!(2.5), json!("many")] {
                let e = parse(json!({ k: bad.clone() })).unwrap_err();
                assert_eq!(e.key, format!("memory.backend_config.{k}"), "{k}={bad}");
            }
        }
    }

    #[test]
    fn direct_construction_is_validated_too() {
        let c = HonchoConfig {
            timeout_seconds: f64::NAN,
            ..HonchoConfig::default()
        };
        assert_eq!(
            c.validate().unwrap_err().key,
            "memory.backend_config.timeout_seconds"
        );
        let c = HonchoConfig {
            max_injection_chars: 0,
            ..HonchoConfig::default()
        };
        assert_eq!(
            c.validate().unwrap_err().key,
            "memory.backend_config.max_injection_chars"
        );
        let c = HonchoConfig {
            api_key: Some(Secret::new("k")),
            ..HonchoConfig::default()
        };
        assert_eq!(
            c.validate().unwrap_err().key,
            "memory.backend_config.api_key"
        );
    }

    #[test]
    fn failure_policy_is_validated() {
        let e = parse(json!({"failure_policy": {"read": "fail_closd"}})).unwrap_err();
        assert_eq!(e.key, "memory.backend_config.failure_policy.read");
        assert!(parse(json!({"failure_policy": "fail_closed"})).is_err());
        let (c, w) =
            parse(json!({"failure_policy": {"read": "fail_open", "write": "raise"}})).unwrap();
        assert_eq!(c.read_policy, FailurePolicy::FailOpen);
        assert!(w[0].contains("failure_policy.write"));
    }

    #[test]
    fn warns_about_ids_honcho_rejects_and_clamps_message_limit() {
        let (c, w) = parse(json!({
            "assistant_peer": "deer flow",
            "workspace_overrides": {"bob": "team ws"},
            "message_char_limit": 30000
        }))
        .unwrap();
        assert_eq!(c.effective_message_chars(), HONCHO_MAX_MESSAGE_CHARS);
        assert_eq!(w.len(), 3, "{w:?}");
    }

    #[test]
    fn debug_never_shows_the_key() {
        let (c, _) = parse(json!({"api_key": "sk-very-secret", "base_url": "https://h"})).unwrap();
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("sk-very-secret"));
        assert!(dbg.contains("<redacted>"));
        assert_eq!(Secret::new("x").to_string(), "<redacted>");
    }
}
