//! The request-head check the connection layer runs before hyper sees a head: it applies our
//! own size limits and hyper's own parsing rules, so that a head hyper would refuse (with an
//! empty-bodied 400, 414 or 431 of its own) is refused here instead, with a JSON body; and it
//! tells how the request's body is framed, so the next head can be found.

use axum::http::{HeaderName, HeaderValue, Method, StatusCode, Uri};

/// Largest request head (request line and headers) accepted, in bytes; larger heads get 431.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Most header fields accepted in one head; more get 431.
pub const MAX_HEADERS: usize = 100;
/// Longest request target (path and query) accepted, in bytes; longer ones get 414.
pub const MAX_URI_BYTES: usize = 16 * 1024;

/// How the body after a head is framed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Framing {
    /// A body of exactly this many bytes (zero: no body).
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// The connection may change protocol after this request (`CONNECT`, `Upgrade`): the
    /// rest of the stream is passed to hyper unexamined.
    Opaque,
}

/// The outcome of examining the bytes of a head received so far.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum HeadCheck {
    /// More bytes are needed.
    Partial,
    /// A complete, acceptable head of `len` bytes.
    Complete { len: usize, framing: Framing },
    /// A head to refuse with this status and message.
    Refuse(StatusCode, String),
}

fn refuse(status: StatusCode, message: impl Into<String>) -> HeadCheck {
    HeadCheck::Refuse(status, message.into())
}

/// Examines `buf`, the bytes received since the end of the previous request.
pub(crate) fn check_head(buf: &[u8]) -> HeadCheck {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => {
            if let Some(path) = req.path
                && path.len() > MAX_URI_BYTES
            {
                return uri_too_long(path.len());
            }
            if buf.len() > MAX_HEAD_BYTES {
                return head_too_large();
            }
            // The request line alone may still be arriving: a target already longer than the
            // limit is refused without waiting for the rest.
            if req.method.is_some() && target_so_far(buf) > MAX_URI_BYTES {
                return uri_too_long(target_so_far(buf));
            }
            return HeadCheck::Partial;
        }
        Err(httparse::Error::TooManyHeaders) => {
            return refuse(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                format!("request has more than {MAX_HEADERS} header fields"),
            );
        }
        Err(e) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                format!("malformed request head: {e}"),
            );
        }
    };
    if len > MAX_HEAD_BYTES {
        return head_too_large();
    }
    let (Some(method), Some(path), Some(version)) = (req.method, req.path, req.version) else {
        return refuse(StatusCode::BAD_REQUEST, "malformed request head");
    };
    if path.len() > MAX_URI_BYTES {
        return uri_too_long(path.len());
    }
    let Ok(method) = Method::from_bytes(method.as_bytes()) else {
        return refuse(StatusCode::BAD_REQUEST, "malformed request method");
    };
    if path.is_empty() || Uri::try_from(path).is_err() {
        return refuse(StatusCode::BAD_REQUEST, "malformed request target");
    }
    let mut lengths: Option<u64> = None;
    let mut chunked = false;
    let mut transfer_encoding = false;
    let mut upgrade = false;
    for h in req.headers.iter() {
        if HeaderName::from_bytes(h.name.as_bytes()).is_err()
            || HeaderValue::from_bytes(h.value).is_err()
        {
            return refuse(
                StatusCode::BAD_REQUEST,
                format!("malformed header field {:?}", h.name),
            );
        }
        if h.name.eq_ignore_ascii_case("content-length") {
            let Some(n) = parse_content_length(h.value) else {
                return refuse(StatusCode::BAD_REQUEST, "invalid content-length header");
            };
            if lengths.is_some_and(|prev| prev != n) {
                return refuse(
                    StatusCode::BAD_REQUEST,
                    "conflicting content-length headers",
                );
            }
            lengths = Some(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            transfer_encoding = true;
            // Only the final coding decides: the body is chunked when it is `chunked`.
            chunked = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.split(',').map(str::trim).rfind(|c| !c.is_empty()))
                .is_some_and(|last| last.eq_ignore_ascii_case("chunked"));
        } else if h.name.eq_ignore_ascii_case("upgrade") {
            upgrade = true;
        }
    }
    if transfer_encoding {
        if version == 0 {
            return refuse(
                StatusCode::BAD_REQUEST,
                "transfer-encoding is not allowed in HTTP/1.0",
            );
        }
        if !chunked {
            return refuse(
                StatusCode::BAD_REQUEST,
                "transfer-encoding must end with chunked",
            );
        }
    }
    let framing = if method == Method::CONNECT || upgrade {
        Framing::Opaque
    } else if chunked {
        Framing::Chunked
    } else {
        Framing::Length(lengths.unwrap_or(0))
    };
    HeadCheck::Complete { len, framing }
}

fn head_too_large() -> HeadCheck {
    refuse(
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        format!("request head is larger than {MAX_HEAD_BYTES} bytes"),
    )
}

fn uri_too_long(len: usize) -> HeadCheck {
    refuse(
        StatusCode::URI_TOO_LONG,
        format!("request target is {len} bytes; the limit is {MAX_URI_BYTES}"),
    )
}

/// The length of the request target received so far on an unfinished request line.
fn target_so_far(buf: &[u8]) -> usize {
    let line = buf.split(|&b| b == b'\n').next().unwrap_or(buf);
    let Some(sp) = line.iter().position(|&b| b == b' ') else {
        return 0;
    };
    let rest = &line[sp + 1..];
    rest.iter().position(|&b| b == b' ').unwrap_or(rest.len())
}

/// A `Content-Length` value: digits only (a list of equal values is accepted, as hyper does).
fn parse_content_length(v: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(v).ok()?;
    let mut out: Option<u64> = None;
    for part in text.split(',') {
        let part = part.trim();
        if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let n: u64 = part.parse().ok()?;
        if out.is_some_and(|o| o != n) {
            return None;
        }
        out = Some(n);
    }
    out
}

/// Tracks a chunked body byte by byte, to find where it ends. Malformed framing is left to
/// hyper (which fails the request and closes the connection): the tracker then reports it and
/// the connection layer stops examining the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Chunked {
    /// Reading a chunk-size line; `digits` hex digits seen, `ext` inside an extension.
    Size { size: u64, digits: u8, ext: bool },
    /// Expecting the LF ending a chunk-size line.
    SizeLf { size: u64 },
    /// Inside a chunk's data.
    Data(u64),
    /// Expecting the CR after a chunk's data.
    DataCr,
    /// Expecting the LF after a chunk's data.
    DataLf,
    /// At the start of a trailer line (or the final empty line).
    TrailerStart,
    /// Inside a trailer line.
    Trailer,
    /// Expecting the LF ending a trailer line; `last` when the line was empty.
    TrailerLf { last: bool },
}

/// What [`Chunked::feed`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ChunkStep {
    /// Everything given belongs to the body, which continues.
    More,
    /// The body ends after this many of the given bytes.
    End(usize),
    /// The framing is malformed.
    Malformed,
}

impl Chunked {
    /// The state at the start of a chunked body.
    pub(crate) const START: Self = Self::Size {
        size: 0,
        digits: 0,
        ext: false,
    };

    /// Advances over `data`.
    pub(crate) fn feed(&mut self, data: &[u8]) -> ChunkStep {
        let mut i = 0;
        while i < data.len() {
            let b = data[i];
            match *self {
                Self::Size { size, digits, ext } => match b {
                    b'\r' if digits > 0 => *self = Self::SizeLf { size },
                    _ if ext => {}
                    b';' | b' ' | b'\t' if digits > 0 => {
                        *self = Self::Size {
                            size,
                            digits,
                            ext: true,
                        }
                    }
                    _ => {
                        let Some(d) = (b as char).to_digit(16) else {
                            return ChunkStep::Malformed;
                        };
                        if digits >= 16 {
                            return ChunkStep::Malformed;
                        }
                        *self = Self::Size {
                            size: size * 16 + u64::from(d),
                            digits: digits + 1,
                            ext: false,
                        };
                    }
                },
                Self::SizeLf { size } => {
                    if b != b'\n' {
                        return ChunkStep::Malformed;
                    }
                    *self = if size == 0 {
                        Self::TrailerStart
                    } else {
                        Self::Data(size)
                    };
                }
                Self::Data(left) => {
                    let take = usize::try_from(left)
                        .unwrap_or(usize::MAX)
                        .min(data.len() - i);
                    let left = left - take as u64;
                    *self = if left == 0 {
                        Self::DataCr
                    } else {
                        Self::Data(left)
                    };
                    i += take;
                    continue;
                }
                Self::DataCr => {
                    if b != b'\r' {
                        return ChunkStep::Malformed;
                    }
                    *self = Self::DataLf;
                }
                Self::DataLf => {
                    if b != b'\n' {
                        return ChunkStep::Malformed;
                    }
                    *self = Self::START;
                }
                Self::TrailerStart => {
                    *self = if b == b'\r' {
                        Self::TrailerLf { last: true }
                    } else {
                        Self::Trailer
                    };
                }
                Self::Trailer => {
                    if b == b'\r' {
                        *self = Self::TrailerLf { last: false };
                    }
                }
                Self::TrailerLf { last } => {
                    if b != b'\n' {
                        return ChunkStep::Malformed;
                    }
                    if last {
                        return ChunkStep::End(i + 1);
                    }
                    *self = Self::TrailerStart;
                }
            }
            i += 1;
        }
        ChunkStep::More
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(buf: &[u8]) -> Option<StatusCode> {
        match check_head(buf) {
            HeadCheck::Refuse(s, _) => Some(s),
            _ => None,
        }
    }

    #[test]
    fn complete_heads_report_their_length_and_framing() {
        let h =
            b"POST /api/memory/facts HTTP/1.1\r\nHost: x\r\nContent-Length: 12\r\n\r\n{\"a\":1}";
        assert_eq!(
            check_head(h),
            HeadCheck::Complete {
                len: h.len() - 7,
                framing: Framing::Length(12)
            }
        );
        let h = b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n";
        assert!(matches!(
            check_head(h),
            HeadCheck::Complete {
                framing: Framing::Chunked,
                ..
            }
        ));
        let h = b"GET /healthz HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n";
        assert!(matches!(
            check_head(h),
            HeadCheck::Complete {
                framing: Framing::Opaque,
                ..
            }
        ));
        assert_eq!(
            check_head(b"GET /healthz HTTP/1.1\r\nHost: x\r\n"),
            HeadCheck::Partial
        );
        assert_eq!(check_head(b""), HeadCheck::Partial);
    }

    #[test]
    fn heads_hyper_would_refuse_are_refused_with_the_same_status() {
        assert_eq!(
            status(b"GET /\x01 HTTP/1.1\r\n\r\n"),
            Some(StatusCode::BAD_REQUEST)
        );
        assert_eq!(
            status(b"GE(T / HTTP/1.1\r\n\r\n"),
            Some(StatusCode::BAD_REQUEST)
        );
        assert_eq!(
            status(b"GET / HTTP/2.0\r\n\r\n"),
            Some(StatusCode::BAD_REQUEST)
        );
        assert_eq!(
            status(b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n"),
            Some(StatusCode::BAD_REQUEST)
        );
        assert_eq!(
            status(b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"),
            Some(StatusCode::BAD_REQUEST)
        );
        assert_eq!(
            status(b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n"),
            Some(StatusCode::BAD_REQUEST)
        );
        assert_eq!(
            status(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n"),
            Some(StatusCode::BAD_REQUEST)
        );
        assert_eq!(
            status(b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Some(StatusCode::BAD_REQUEST)
        );
        let long = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(MAX_URI_BYTES));
        assert_eq!(status(long.as_bytes()), Some(StatusCode::URI_TOO_LONG));
        // A long target is refused before its request line is complete.
        let partial = format!("GET /{}", "a".repeat(MAX_URI_BYTES + 1));
        assert_eq!(status(partial.as_bytes()), Some(StatusCode::URI_TOO_LONG));
        let big = format!(
            "GET / HTTP/1.1\r\nX-Big: {}\r\n",
            "b".repeat(MAX_HEAD_BYTES)
        );
        assert_eq!(
            status(big.as_bytes()),
            Some(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)
        );
        let many: String = (0..=MAX_HEADERS).map(|i| format!("X-{i}: v\r\n")).collect();
        let many = format!("GET / HTTP/1.1\r\n{many}\r\n");
        assert_eq!(
            status(many.as_bytes()),
            Some(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)
        );
    }

    #[test]
    fn chunked_bodies_end_where_the_last_chunk_and_trailers_end() {
        let body = b"5;ext=1\r\nhello\r\n0\r\nX-T: 1\r\n\r\nGET /next";
        let mut c = Chunked::START;
        assert_eq!(c.feed(body), ChunkStep::End(body.len() - 9));
        // Byte by byte gives the same end.
        let mut c = Chunked::START;
        let mut end = None;
        for (i, b) in body.iter().enumerate() {
            if let ChunkStep::End(_) = c.feed(std::slice::from_ref(b)) {
                end = Some(i + 1);
                break;
            }
        }
        assert_eq!(end, Some(body.len() - 9));
        let mut c = Chunked::START;
        assert_eq!(c.feed(b"zz\r\n"), ChunkStep::Malformed);
        let mut c = Chunked::START;
        assert_eq!(c.feed(b"3\r\nabcX"), ChunkStep::Malformed);
    }
}
