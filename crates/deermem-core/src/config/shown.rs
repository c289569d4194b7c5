//! How configuration is shown (the gateway's `/api/memory/config`): every adapter's typed
//! settings derive `Serialize` as their display form, and the two rules that keep a secret out
//! of it live here, with the types they apply to, so no adapter writes them again:
//!
//! - a secret is a [`ConfigSecret`] (the core's settings, the gateway's and the remote
//!   adapters' alike): its `Serialize` writes [`HIDDEN`] (`"***"`), whatever the value, so a
//!   field of that type is never written in clear (an unset `Option` shows `null`), and its
//!   `Debug` and `Display` print [`REDACTED`];
//! - a URL field is serialised with [`url`] or [`opt_url`]: without user-info, query string or
//!   fragment ([`url_without_credentials`]).
//!
//! A key a settings type does not read is not one of its fields, so it is never shown.

use std::fmt;

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// What a secret is shown as.
pub const HIDDEN: &str = "***";

/// What a secret prints as (`Debug`, `Display`), and what [`ConfigSecret::scrub`] puts in its
/// place.
pub const REDACTED: &str = "<redacted>";

/// A secret setting (an API key, a connection URL that may hold a password), after `$VAR`
/// resolution, on `secrecy`'s `SecretString` (its memory is wiped on drop). `Debug` and
/// `Display` print [`REDACTED`] and `Serialize` writes [`HIDDEN`]: the value is reached only
/// through [`ConfigSecret::expose`], where it is used. Equality compares the values.
#[derive(Clone, Default)]
pub struct ConfigSecret(SecretString);

impl ConfigSecret {
    /// Wraps a secret.
    pub fn new(value: impl Into<String>) -> Self {
        Self(SecretString::from(value.into()))
    }

    /// The secret itself; call only where it is used.
    pub fn expose(&self) -> &str {
        self.0.expose_secret()
    }

    /// Whether the secret is empty.
    pub fn is_empty(&self) -> bool {
        self.expose().is_empty()
    }

    /// `text` with every occurrence of the secret replaced by [`REDACTED`] (for server
    /// messages that echo a request). An empty secret leaves `text` as it is.
    pub fn scrub(&self, text: &str) -> String {
        if self.is_empty() {
            text.to_owned()
        } else {
            text.replace(self.expose(), REDACTED)
        }
    }
}

impl PartialEq for ConfigSecret {
    fn eq(&self, other: &Self) -> bool {
        self.expose() == other.expose()
    }
}

impl Eq for ConfigSecret {}

impl From<String> for ConfigSecret {
    fn from(value: String) -> Self {
        Self::new(value)
    }
}

impl From<&str> for ConfigSecret {
    fn from(value: &str) -> Self {
        Self::new(value)
    }
}

impl fmt::Debug for ConfigSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl fmt::Display for ConfigSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

/// Always [`HIDDEN`]: the type is the rule.
impl Serialize for ConfigSecret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(HIDDEN)
    }
}

/// Read as a plain string (the configuration's own text).
impl<'de> Deserialize<'de> for ConfigSecret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Self::new)
    }
}

/// `#[serde(serialize_with = "deermem_core::config::shown::url")]`: a URL shown without
/// user-info, query string or fragment.
///
/// # Errors
/// The serializer's.
pub fn url<S: Serializer>(url: &str, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&url_without_credentials(url))
}

/// [`url`] for an optional URL (`None` shows `null`).
///
/// # Errors
/// The serializer's.
pub fn opt_url<S: Serializer>(url: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    match url {
        Some(u) => s.serialize_some(&url_without_credentials(u)),
        None => s.serialize_none(),
    }
}

/// A URL without what may hold a credential: the user-info before `@` in the authority, the
/// query string and the fragment (`http://svc:PASSWORD@host/v1?key=K` is `http://host/v1`).
/// Text that is not a URL loses the same parts.
pub fn url_without_credentials(url: &str) -> String {
    let url = url.split(['?', '#']).next().unwrap_or("");
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    match scheme {
        Some(scheme) => format!("{scheme}://{host}{path}"),
        None => format!("{host}{path}"),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[derive(Serialize, Deserialize)]
    struct Settings {
        key: ConfigSecret,
        maybe: Option<ConfigSecret>,
        unset: Option<ConfigSecret>,
        #[serde(serialize_with = "url")]
        base: String,
        #[serde(serialize_with = "opt_url")]
        other: Option<String>,
    }

    #[test]
    fn a_secret_never_shows_and_urls_lose_their_credentials() {
        let s: Settings = serde_json::from_value(json!({
            "key": "sk-DISTINCT-7f3a", "maybe": "mk-DISTINCT-7f3a", "unset": null,
            "base": "http://svcuser:PASSWORD@llm.internal:8080/v1?api-key=QKEY#frag",
            "other": "https://u:pw-DISTINCT@h/p",
        }))
        .unwrap();
        assert_eq!(s.key.expose(), "sk-DISTINCT-7f3a");
        let text = serde_json::to_string(&s).unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&text).unwrap(),
            json!({"key": "***", "maybe": "***", "unset": null,
                   "base": "http://llm.internal:8080/v1", "other": "https://h/p"})
        );
        for secret in ["DISTINCT", "PASSWORD", "svcuser", "QKEY", "frag"] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert_eq!(format!("{:?}", s.key), "<redacted>");
    }

    #[test]
    fn the_model_and_embedding_settings_show_no_secret() {
        let m: crate::config::ModelConfig = serde_json::from_value(json!({
            "model": "gpt-x", "api_key": "sk-DISTINCT-91c2",
            "base_url": "http://svc:PW-DISTINCT@llm.internal/v1?key=Q-DISTINCT",
        }))
        .unwrap();
        let e: crate::config::EmbeddingConfig = serde_json::from_value(json!({
            "provider": "openai", "api_key": "ek-DISTINCT-91c2",
            "base_url": "https://u:PW-DISTINCT@emb.internal/v1#t=DISTINCT",
        }))
        .unwrap();
        let (m, e) = (
            serde_json::to_value(&m).unwrap(),
            serde_json::to_value(&e).unwrap(),
        );
        assert_eq!(
            (&m["api_key"], &m["base_url"]),
            (&json!("***"), &json!("http://llm.internal/v1"))
        );
        assert_eq!(
            (&e["api_key"], &e["base_url"]),
            (&json!("***"), &json!("https://emb.internal/v1"))
        );
        assert_eq!(m["timeout_seconds"], 60.0, "defaults are shown too");
        for text in [m.to_string(), e.to_string()] {
            assert!(
                !text.contains("DISTINCT") && !text.contains("svc"),
                "{text}"
            );
        }
        let unset = serde_json::to_value(crate::config::ModelConfig::default()).unwrap();
        assert_eq!(
            (&unset["api_key"], &unset["base_url"]),
            (&json!(null), &json!(null))
        );
    }

    #[test]
    fn a_secret_never_prints_and_scrubs() {
        let s = ConfigSecret::new("sk-very-secret");
        assert_eq!(
            format!("{s} {s:?} {:?}", Some(&s)),
            "<redacted> <redacted> Some(<redacted>)"
        );
        assert_eq!(s.expose(), "sk-very-secret");
        assert_eq!(
            s.scrub("key sk-very-secret echoed"),
            "key <redacted> echoed"
        );
        assert_eq!(ConfigSecret::new("").scrub("as is"), "as is");
        assert_eq!(s, ConfigSecret::new("sk-very-secret"));
        assert_eq!(s, ConfigSecret::from("sk-very-secret"));
        assert_eq!(s, ConfigSecret::from(String::from("sk-very-secret")));
        assert_ne!(s, ConfigSecret::new("other"));
        assert!(ConfigSecret::default().is_empty() && !s.is_empty());
        let shown = serde_json::to_string(&[Some(&s), None]).unwrap();
        assert_eq!(shown, r#"["***",null]"#);
    }

    #[test]
    fn urls_lose_user_info_query_and_fragment() {
        for (given, want) in [
            ("http://svcuser:PASSWORD@host/v1", "http://host/v1"),
            ("https://u@host:8443", "https://host:8443"),
            ("https://host/v1?key=abc", "https://host/v1"),
            ("https://host/v1#key=abc", "https://host/v1"),
            ("http://a:b@c@host/p", "http://host/p"),
            ("user:pw@host/v1", "host/v1"),
            ("https://api.openai.com/v1", "https://api.openai.com/v1"),
            ("http://[::1]:8080/v1", "http://[::1]:8080/v1"),
            ("", ""),
        ] {
            assert_eq!(url_without_credentials(given), want, "{given}");
        }
    }
}
