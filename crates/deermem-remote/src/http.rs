//! The HTTP side every remote adapter shares: the reqwest client (no redirects, its timeouts),
//! one exchange that reads at most a bounded body and the server's `Retry-After`, percent-
//! encoded path segments, a key as a sensitive `Bearer` header value, and error text that names
//! neither the URL nor a secret.

use std::time::Duration;

use deermem_core::config::ConfigSecret;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::StatusCode;
use reqwest::header::{HeaderValue, InvalidHeaderValue, RETRY_AFTER};

/// The `User-Agent` of clients that identify themselves.
pub const USER_AGENT: &str = concat!("deermem-rs/", env!("CARGO_PKG_VERSION"));

/// Everything but RFC 3986 unreserved characters is escaped inside a path segment.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// What a client tells and takes from its surroundings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Profile {
    /// Sends `User-Agent: deermem-rs/<version>` and honours the `HTTP(S)_PROXY` variables.
    Standard,
    /// Sends no `User-Agent` and reads no proxy variables.
    Bare,
}

/// A reqwest client with these timeouts that never follows redirects.
///
/// # Errors
/// The HTTP stack cannot be initialised (no TLS roots...).
pub fn client(
    timeout: Duration,
    connect_timeout: Duration,
    profile: Profile,
) -> Result<reqwest::Client, reqwest::Error> {
    let builder = reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(connect_timeout)
        .redirect(reqwest::redirect::Policy::none());
    match profile {
        Profile::Standard => builder.user_agent(USER_AGENT),
        Profile::Bare => builder.no_proxy(),
    }
    .build()
}

/// The answer to one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// The status.
    pub status: StatusCode,
    /// The server's `Retry-After` in seconds, when it sent one.
    pub retry_after: Option<Duration>,
    /// The body, at most the limit's bytes.
    pub body: Vec<u8>,
    /// Whether the body was longer than the limit (and cut).
    pub truncated: bool,
}

/// Sends `request` and reads the answer's body up to `success_limit` bytes for a 2xx status,
/// `error_limit` bytes otherwise.
///
/// # Errors
/// The request could not be sent or the body not read (reqwest's `is_timeout` and
/// `is_connect` tell which).
pub async fn exchange(
    request: reqwest::RequestBuilder,
    success_limit: usize,
    error_limit: usize,
) -> Result<Reply, reqwest::Error> {
    let mut resp = request.send().await?;
    let status = resp.status();
    let retry_after = resp
        .headers()
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(parse_retry_after);
    let limit = if status.is_success() {
        success_limit
    } else {
        error_limit
    };
    let (mut body, mut truncated) = (Vec::new(), false);
    while let Some(chunk) = resp.chunk().await? {
        let room = limit - body.len();
        truncated = chunk.len() > room;
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if truncated {
            break;
        }
    }
    Ok(Reply {
        status,
        retry_after,
        body,
        truncated,
    })
}

/// Parses a `Retry-After` header given in seconds (`"3"`, `"1.5"`). HTTP-date values and
/// anything negative or non-finite give `None` (the caller then uses its own backoff); values
/// over a day are cut to a day (each caller caps further).
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    let secs: f64 = value.trim().parse().ok()?;
    if !secs.is_finite() || secs < 0.0 {
        return None;
    }
    Duration::try_from_secs_f64(secs.min(86_400.0)).ok()
}

/// `e` and its sources, joined with `": "`.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// The first `max_chars` characters of `s`, with `…` when it was longer.
pub fn excerpt(s: &str, max_chars: usize) -> String {
    match s.char_indices().nth(max_chars) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

/// Percent-encodes one URL path segment (everything but RFC 3986 unreserved characters).
pub fn encode_segment(segment: &str) -> String {
    utf8_percent_encode(segment, SEGMENT).to_string()
}

/// `Bearer <secret>` as a header value marked sensitive (never logged by the HTTP stack).
///
/// # Errors
/// The secret holds characters an HTTP header cannot carry.
pub fn bearer(secret: &ConfigSecret) -> Result<HeaderValue, InvalidHeaderValue> {
    let mut v = HeaderValue::from_str(&format!("Bearer {}", secret.expose()))?;
    v.set_sensitive(true);
    Ok(v)
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[test]
    fn parses_retry_after_seconds_only() {
        assert_eq!(parse_retry_after("2"), Some(Duration::from_secs(2)));
        assert_eq!(
            parse_retry_after(" 1.5 "),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(parse_retry_after("-1"), None);
        assert_eq!(parse_retry_after("NaN"), None);
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(
            parse_retry_after("1e300"),
            Some(Duration::from_secs(86_400))
        );
    }

    #[test]
    fn text_helpers() {
        assert_eq!(excerpt("日本語テキスト", 3), "日本語…");
        assert_eq!(excerpt("abc", 3), "abc");
        assert_eq!(encode_segment("team ws?x"), "team%20ws%3Fx");
        assert_eq!(encode_segment("a/../b"), "a%2F..%2Fb");
        assert_eq!(encode_segment("ok-id_1.~"), "ok-id_1.~");
        assert_eq!(encode_segment("日本"), "%E6%97%A5%E6%9C%AC");
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("outer")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = Outer(std::io::Error::other("inner"));
        assert_eq!(error_chain(&e), "outer: inner");
    }

    /// Serves one raw HTTP response on loopback.
    async fn one_shot(response: Vec<u8>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            let _ = s.write_all(&response).await;
        });
        format!("http://{addr}/")
    }

    fn http_client() -> reqwest::Client {
        client(
            Duration::from_secs(5),
            Duration::from_secs(5),
            Profile::Bare,
        )
        .unwrap()
    }

    #[tokio::test]
    async fn bodies_are_bounded_per_status_class() {
        let body = "x".repeat(100);
        let ok = format!("HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{body}");
        let url = one_shot(ok.into_bytes()).await;
        let r = exchange(http_client().get(&url), 10, 1000).await.unwrap();
        assert_eq!((r.body.len(), r.truncated), (10, true));

        let err = format!(
            "HTTP/1.1 429 Too Many Requests\r\nretry-after: 7\r\ncontent-length: 100\r\n\r\n{body}"
        );
        let url = one_shot(err.into_bytes()).await;
        let r = exchange(http_client().get(&url), 10, 1000).await.unwrap();
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.retry_after, Some(Duration::from_secs(7)));
        assert_eq!((r.body.len(), r.truncated), (100, false));
    }

    #[tokio::test]
    async fn refused_connections_are_connect_failures() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let e = exchange(http_client().get(format!("http://127.0.0.1:{port}/")), 1, 1)
            .await
            .unwrap_err();
        assert!(e.is_connect());
        assert!(!error_chain(&e).is_empty());
    }

    #[test]
    fn bearer_is_sensitive_and_refuses_newlines() {
        let v = bearer(&ConfigSecret::new("k1")).unwrap();
        assert!(v.is_sensitive());
        assert_eq!(v.to_str().unwrap(), "Bearer k1");
        assert!(bearer(&ConfigSecret::new("bad\nkey")).is_err());
    }
}
