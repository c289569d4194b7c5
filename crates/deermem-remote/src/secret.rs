//! [`Secret`]: an API key or token on `secrecy`'s `SecretString`. `Debug` and `Display` print
//! `<redacted>`, `Serialize` (the display form of the settings holding it) writes
//! [`deermem_core::config::shown::HIDDEN`], the memory is wiped on drop, and the value is
//! reached only through [`Secret::expose`] where it is sent.

use std::fmt;

use reqwest::header::{HeaderValue, InvalidHeaderValue};
use secrecy::{ExposeSecret, SecretString};

/// What a secret prints as, and what [`Secret::scrub`] puts in its place.
pub const REDACTED: &str = "<redacted>";

/// A secret string. Equality compares the values.
#[derive(Clone)]
pub struct Secret(SecretString);

impl Secret {
    /// Wraps a secret.
    pub fn new(value: impl Into<String>) -> Self {
        Self(SecretString::from(value.into()))
    }

    /// The secret itself; call only where it is sent.
    pub fn expose(&self) -> &str {
        self.0.expose_secret()
    }

    /// Whether the secret is empty.
    pub fn is_empty(&self) -> bool {
        self.expose().is_empty()
    }

    /// `Bearer <secret>` as a header value marked sensitive (never logged by the HTTP stack).
    ///
    /// # Errors
    /// The secret holds characters an HTTP header cannot carry.
    pub fn bearer(&self) -> Result<HeaderValue, InvalidHeaderValue> {
        let mut v = HeaderValue::from_str(&format!("Bearer {}", self.expose()))?;
        v.set_sensitive(true);
        Ok(v)
    }

    /// `text` with every occurrence of the secret replaced by `<redacted>` (for server messages
    /// that echo a request).
    pub fn scrub(&self, text: &str) -> String {
        if self.is_empty() {
            text.to_owned()
        } else {
            text.replace(self.expose(), REDACTED)
        }
    }
}

impl PartialEq for Secret {
    fn eq(&self, other: &Self) -> bool {
        self.expose() == other.expose()
    }
}

impl Eq for Secret {}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

/// Always `"***"`, the one display of a secret (`deermem_core::config::shown`): the type is
/// the rule, so settings holding a `Secret` derive their display form.
impl serde::Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(deermem_core::config::shown::HIDDEN)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_prints_and_scrubs() {
        let s = Secret::new("sk-very-secret");
        assert_eq!(
            format!("{s} {s:?} {:?}", Some(&s)),
            "<redacted> <redacted> Some(<redacted>)"
        );
        assert_eq!(s.expose(), "sk-very-secret");
        assert_eq!(
            s.scrub("key sk-very-secret echoed"),
            "key <redacted> echoed"
        );
        assert_eq!(Secret::new("").scrub("as is"), "as is");
        assert_eq!(s, Secret::new("sk-very-secret"));
        assert_ne!(s, Secret::new("other"));
        let shown = serde_json::to_string(&[Some(&s), None]).unwrap();
        assert_eq!(shown, r#"["***",null]"#);
    }

    #[test]
    fn bearer_is_sensitive_and_refuses_newlines() {
        let v = Secret::new("k1").bearer().unwrap();
        assert!(v.is_sensitive());
        assert_eq!(v.to_str().unwrap(), "Bearer k1");
        assert!(Secret::new("bad\nkey").bearer().is_err());
    }
}
