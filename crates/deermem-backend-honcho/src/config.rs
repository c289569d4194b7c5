//! `HonchoConfig`: the Honcho `backend_config` keys with the reference's defaults, validation
//! and error order, read through core's config loader (`deermem_core::config::lax`). The API
//! key is a [`ConfigSecret`], which never prints. `Serialize` is the display form (the gateway's
//! `/api/memory/config`): the key as `"***"` by its type, the base URL without credentials
//! (`deermem_core::config::shown`), every other setting with its value or default.

use std::collections::BTreeMap;
use std::time::Duration;

use deermem_core::ConfigError;
use deermem_core::config::{ConfigSecret, lax, shown};
use deermem_pycompat::py;
pub use deermem_remote::FailurePolicy;
use deermem_remote::base_url::{self, BaseUrlError, TransportRule};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use crate::identity::is_honcho_id;

/// Honcho's `MAX_MESSAGE_SIZE`: the longest message content (in characters) the server takes.
pub const HONCHO_MAX_MESSAGE_CHARS: usize = 25_000;

const PREFIX: &str = "memory.backend_config";

fn key(k: &str) -> String {
    format!("{PREFIX}.{k}")
}

/// The Honcho backend settings, with the reference's keys, defaults and validation. Its
/// fields are the key list: any other key is warned about and ignored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HonchoConfig {
    /// Server base URL without a trailing `/` (a path prefix is kept).
    #[serde(deserialize_with = "base_url", serialize_with = "shown::url")]
    pub base_url: String,
    /// Bearer token, sent only when set.
    #[serde(deserialize_with = "api_key")]
    pub api_key: Option<ConfigSecret>,
    /// Allows an API key over plain `http://`.
    #[serde(deserialize_with = "lax::bool")]
    pub allow_insecure_http: bool,
    /// Prefix of derived workspace ids.
    #[serde(deserialize_with = "lax::scalar_str")]
    pub workspace_prefix: String,
    /// Raw user id to workspace id.
    #[serde(deserialize_with = "overrides")]
    pub workspace_overrides: BTreeMap<String, String>,
    /// Raw user id to user peer id.
    #[serde(deserialize_with = "overrides")]
    pub user_peer_overrides: BTreeMap<String, String>,
    /// The assistant's peer id.
    #[serde(deserialize_with = "lax::scalar_str")]
    pub assistant_peer: String,
    /// Per-request (read) timeout in seconds.
    #[serde(deserialize_with = "seconds")]
    pub timeout_seconds: f64,
    /// Connect timeout in seconds.
    #[serde(deserialize_with = "seconds")]
    pub connect_timeout_seconds: f64,
    /// Each message is cut to this many characters (after stripping).
    #[serde(deserialize_with = "lax::int_in::<_, _, 1, { i64::MAX }>")]
    pub message_char_limit: usize,
    /// The injection text is cut to this many characters.
    #[serde(deserialize_with = "lax::int_in::<_, _, 1, { i64::MAX }>")]
    pub max_injection_chars: usize,
    /// Read failure policy (`failure_policy.read`): under `fail_open` a failed read logs a
    /// warning and returns the empty value (`""`, `[]`, the empty document); under
    /// `fail_closed` it returns [`deermem_core::ManagerError::Unavailable`] / `Timeout`.
    #[serde(
        rename = "failure_policy",
        deserialize_with = "failure_policy",
        serialize_with = "show_failure_policy"
    )]
    pub read_policy: FailurePolicy,
    /// Injected by the host; not used by this backend.
    #[serde(deserialize_with = "lax::scalar_str")]
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

fn base_url<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    lax::scalar_str(d).map(|s| s.trim_end_matches('/').to_owned())
}

/// A lax float; [`HonchoConfig::validate`] checks that it is finite and positive.
fn seconds<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    let v = Value::deserialize(d)?;
    lax::to_float(&v)
        .ok_or_else(|| D::Error::custom(format!("must be a finite value > 0 (got {v})")))
}

fn api_key<'de, D: Deserializer<'de>>(d: D) -> Result<Option<ConfigSecret>, D::Error> {
    Ok(Some(lax::scalar_str(d)?)
        .filter(|k| !k.is_empty())
        .map(ConfigSecret::new))
}

/// A mapping of user id to a non-blank id.
fn overrides<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    let v = Value::deserialize(d)?;
    let Value::Object(map) = &v else {
        return Err(D::Error::custom(format!(
            "must be a mapping of user id to id (got {v})"
        )));
    };
    let mut out = BTreeMap::new();
    for (user, value) in map {
        let id = match value {
            Value::String(_) | Value::Number(_) | Value::Bool(_) => py::py_str(value),
            _ => None,
        };
        let Some(id) = id.filter(|s| !s.trim().is_empty()) else {
            return Err(D::Error::custom(format!(
                "the value for user {user:?} must be a non-empty string (got {value})"
            )));
        };
        out.insert(user.clone(), id);
    }
    Ok(out)
}

/// The `failure_policy` mapping; only `read` is used (other keys are warned about).
fn failure_policy<'de, D: Deserializer<'de>>(d: D) -> Result<FailurePolicy, D::Error> {
    #[derive(Deserialize, Default)]
    #[serde(default)]
    struct Section {
        #[serde(deserialize_with = "read")]
        read: FailurePolicy,
    }
    fn read<'de, D: Deserializer<'de>>(d: D) -> Result<FailurePolicy, D::Error> {
        let s = lax::scalar_str(d)?;
        match s.trim().to_ascii_lowercase().as_str() {
            "fail_open" => Ok(FailurePolicy::FailOpen),
            "fail_closed" => Ok(FailurePolicy::FailClosed),
            _ => Err(D::Error::custom(format!(
                "must be 'fail_open' or 'fail_closed' (got {s:?})"
            ))),
        }
    }
    Section::deserialize(d).map(|s| s.read)
}

/// The `failure_policy` mapping as written: `{"read": "fail_open" | "fail_closed"}`.
fn show_failure_policy<S: Serializer>(read: &FailurePolicy, s: S) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct Section {
        read: &'static str,
    }
    let read = match read {
        FailurePolicy::FailOpen => "fail_open",
        FailurePolicy::FailClosed => "fail_closed",
    };
    Section { read }.serialize(s)
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
        let (c, ignored) = lax::deserialize::<Self>(&Value::Object(bc.clone()), PREFIX)?;
        let mut warnings: Vec<String> = ignored
            .iter()
            // Where the cursors live (`storage_class: postgres` and its block): the facade's.
            .filter(|k| *k != "storage_class" && *k != "postgres" && !k.starts_with("postgres."))
            .map(|k| {
                if k.starts_with("failure_policy.") {
                    format!("{PREFIX}.{k} is not used by the Honcho backend and was ignored")
                } else {
                    format!("{PREFIX}.{k} is not a Honcho backend setting and was ignored")
                }
            })
            .collect();
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

    /// Checks the invariants (also for a directly constructed value), in the reference's
    /// order: the transport rule, blank overrides, finite positive timeouts and positive
    /// character budgets.
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
        for (name, f) in [
            ("timeout_seconds", self.timeout_seconds),
            ("connect_timeout_seconds", self.connect_timeout_seconds),
        ] {
            if !(f.is_finite() && f > 0.0 && Duration::try_from_secs_f64(f).is_ok()) {
                return Err(ConfigError::new(
                    key(name),
                    format!("Honcho backend: {name} must be a finite value > 0 (got {f})"),
                ));
            }
        }
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
        // The one lax bool of every config key: `""` and padded words are errors, `t` is true.
        for bad in [json!(""), json!(" true"), json!(2)] {
            let e = parse(json!({"allow_insecure_http": bad.clone()})).unwrap_err();
            assert_eq!(e.key, "memory.backend_config.allow_insecure_http", "{bad}");
        }
        assert!(
            parse(json!({"api_key": "sk", "base_url": "http://h", "allow_insecure_http": "t"}))
                .is_ok()
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
            api_key: Some(ConfigSecret::new("k")),
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
        assert_eq!(ConfigSecret::new("x").to_string(), "<redacted>");
    }

    #[test]
    fn the_display_never_shows_the_key_or_url_credentials() {
        let (c, _) = parse(json!({
            "api_key": "hk-DISTINCT-5e1d",
            "base_url": "https://honcho.internal/pfx/",
            "user_peer_overrides": {"alice@example.com": "alice"},
            "failure_policy": {"read": "fail_closed"},
            "my_llm_credential": "cred-DISTINCT",
        }))
        .unwrap();
        let shown = serde_json::to_value(&c).unwrap();
        assert!(!shown.to_string().contains("DISTINCT"), "{shown}");
        assert_eq!(shown["api_key"], "***");
        assert_eq!(shown["base_url"], "https://honcho.internal/pfx");
        assert_eq!(shown["failure_policy"], json!({"read": "fail_closed"}));
        assert_eq!(
            shown["user_peer_overrides"],
            json!({"alice@example.com": "alice"})
        );
        assert_eq!(shown["timeout_seconds"], 10.0, "defaults are shown");
        assert!(shown.get("my_llm_credential").is_none());
        let unset = serde_json::to_value(HonchoConfig::default()).unwrap();
        assert_eq!(unset["api_key"], json!(null));
        // The rule is the types', not validation's: a URL the loader would refuse still loses
        // its credentials.
        let built = HonchoConfig {
            base_url: "https://svc:PW-DISTINCT@honcho.internal/pfx?token=Q-DISTINCT#f".into(),
            api_key: Some(ConfigSecret::new("hk-DISTINCT-5e1d")),
            ..HonchoConfig::default()
        };
        let text = serde_json::to_string(&built).unwrap();
        for secret in ["DISTINCT", "svc"] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
    }
}
