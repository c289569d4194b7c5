//! The one base-URL and transport rule of the remote adapters: the URL parses as an `http` or
//! `https` URL with a host, embeds no credentials and has no query or fragment; a secret may
//! travel over plain `http` only to a trusted host, or with the `allow_insecure_http` opt-in.

use url::Url;

/// How a base URL is checked.
#[derive(Clone, Copy, Debug)]
pub struct TransportRule<'a> {
    /// The opt-in that allows a secret over plain `http` to any host.
    pub allow_insecure_http: bool,
    /// Whether requests carry a secret (an API key).
    pub sends_secret: bool,
    /// Hosts a secret may reach over plain `http` without the opt-in (lower case).
    pub trusted_http_hosts: &'a [&'a str],
}

/// A base URL the rule refuses.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BaseUrlError {
    /// Not a URL at all (the message holds the URL, cut to 80 characters, and the reason).
    #[error("must be an http(s) URL with a host (got {0})")]
    Invalid(String),
    /// A scheme other than `http` and `https`.
    #[error("must use http or https (got scheme {0:?})")]
    Scheme(String),
    /// No host.
    #[error("must include a host")]
    NoHost,
    /// A user name or password in the URL.
    #[error("must not embed credentials; the key has its own setting and is never part of the URL")]
    Credentials,
    /// A query string or fragment.
    #[error("must not have a query string or fragment")]
    QueryOrFragment,
    /// A secret would cross plain `http` to an untrusted host without the opt-in.
    #[error(
        "a key over plain http to {host} travels in clear text{}; use https or set allow_insecure_http: true",
        if .trusted.is_empty() { String::new() } else { format!(" (plain http is only allowed for {})", .trusted.join(", ")) }
    )]
    InsecureHttp {
        /// The host.
        host: String,
        /// The trusted hosts of the rule.
        trusted: Vec<String>,
    },
}

/// Checks `raw` against `rule`. Returns `Some(host)` when a secret crosses plain `http` to an
/// untrusted host because the opt-in is set (worth a warning).
///
/// # Errors
/// A [`BaseUrlError`] saying which part of the rule failed.
pub fn check(raw: &str, rule: TransportRule<'_>) -> Result<Option<String>, BaseUrlError> {
    let url = Url::parse(raw).map_err(|e| {
        BaseUrlError::Invalid(format!(
            "{:?}: {e}",
            raw.chars().take(80).collect::<String>()
        ))
    })?;
    let scheme = url.scheme();
    if scheme != "http" && scheme != "https" {
        return Err(BaseUrlError::Scheme(scheme.to_owned()));
    }
    let host = match url.host_str() {
        Some(h) if !h.is_empty() => h.to_ascii_lowercase(),
        _ => return Err(BaseUrlError::NoHost),
    };
    if !url.username().is_empty() || url.password().is_some() {
        return Err(BaseUrlError::Credentials);
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(BaseUrlError::QueryOrFragment);
    }
    let exposed =
        scheme == "http" && rule.sends_secret && !rule.trusted_http_hosts.contains(&host.as_str());
    if exposed && !rule.allow_insecure_http {
        return Err(BaseUrlError::InsecureHttp {
            host,
            trusted: rule
                .trusted_http_hosts
                .iter()
                .map(|h| (*h).to_owned())
                .collect(),
        });
    }
    Ok(exposed.then_some(host))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOOPBACK: &[&str] = &["127.0.0.1", "localhost"];

    fn rule(allow: bool, secret: bool, trusted: &'static [&'static str]) -> TransportRule<'static> {
        TransportRule {
            allow_insecure_http: allow,
            sends_secret: secret,
            trusted_http_hosts: trusted,
        }
    }

    #[test]
    fn shape_of_the_url() {
        assert_eq!(
            check("https://h.example/pfx", rule(false, true, &[])),
            Ok(None)
        );
        let err = |raw: &str| check(raw, rule(true, false, &[])).unwrap_err();
        assert!(matches!(err("localhost:8000"), BaseUrlError::Scheme(s) if s == "localhost"));
        assert!(matches!(err("not a url"), BaseUrlError::Invalid(_)));
        assert!(matches!(err("ftp://h"), BaseUrlError::Scheme(_)));
        assert_eq!(err("https://u:p@h"), BaseUrlError::Credentials);
        assert_eq!(err("https://u@h"), BaseUrlError::Credentials);
        assert_eq!(err("https://h/?q=1"), BaseUrlError::QueryOrFragment);
        assert_eq!(err("https://h/#f"), BaseUrlError::QueryOrFragment);
    }

    #[test]
    fn plain_http_with_a_secret() {
        // No secret: plain http is fine anywhere.
        assert!(check("http://h", rule(false, false, &[])).is_ok());
        // A secret to an untrusted host needs the opt-in, which is then reported.
        let e = check("HTTP://H", rule(false, true, &[])).unwrap_err();
        assert!(matches!(&e, BaseUrlError::InsecureHttp { host, .. } if host == "h"));
        assert!(e.to_string().contains("allow_insecure_http"));
        assert_eq!(
            check("http://h", rule(true, true, &[])),
            Ok(Some("h".to_owned()))
        );
        // Trusted hosts need no opt-in.
        assert_eq!(
            check("http://LOCALHOST:1933", rule(false, true, LOOPBACK)),
            Ok(None)
        );
        let e = check("http://10.0.0.1", rule(false, true, LOOPBACK)).unwrap_err();
        assert!(e.to_string().contains("127.0.0.1, localhost"), "{e}");
        // https never needs it.
        assert!(check("https://10.0.0.1", rule(false, true, LOOPBACK)).is_ok());
    }
}
