//! A minimal HTTP/1.1 keep-alive client for the gateway workload: one connection, one request
//! at a time, `Content-Length` or chunked bodies. It exists so the bench measures the server,
//! not a client library's pooling.

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Largest response head accepted.
const MAX_HEAD: usize = 64 * 1024;

/// Bytes asked of each `read`: a whole ~40 KB document usually arrives in one or two reads.
const READ_CHUNK: usize = 64 * 1024;

/// One keep-alive connection.
#[derive(Debug)]
pub struct Connection {
    stream: TcpStream,
    /// Received bytes; those before `pos` are consumed.
    buf: Vec<u8>,
    pos: usize,
    /// The request being sent (reused between requests).
    req: Vec<u8>,
}

/// A response: status and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// HTTP status code.
    pub status: u16,
    /// The body bytes.
    pub body: Vec<u8>,
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

impl Connection {
    /// Connects to `addr` (`127.0.0.1:port`).
    ///
    /// # Errors
    /// Connection failures.
    pub async fn connect(addr: std::net::SocketAddr) -> Result<Self> {
        let stream = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream,
            buf: Vec::with_capacity(READ_CHUNK),
            pos: 0,
            req: Vec::with_capacity(256),
        })
    }

    /// The received, not yet consumed bytes.
    fn pending(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    /// Reads once from the socket straight into the buffer (no intermediate copy).
    async fn fill(&mut self) -> Result<()> {
        if self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        } else if self.pos > 0 && self.buf.capacity() - self.buf.len() < READ_CHUNK / 2 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        self.buf.reserve(READ_CHUNK);
        let n = self.stream.read_buf(&mut self.buf).await?;
        if n == 0 {
            bail!("connection closed by the server");
        }
        Ok(())
    }

    /// Waits until `n` bytes are pending.
    async fn want(&mut self, n: usize) -> Result<()> {
        while self.pending().len() < n {
            self.fill().await?;
        }
        Ok(())
    }

    /// Consumes `n` pending bytes.
    fn consume(&mut self, n: usize) {
        self.pos += n;
    }

    async fn take(&mut self, n: usize) -> Result<Vec<u8>> {
        self.want(n).await?;
        let out = self.pending()[..n].to_vec();
        self.consume(n);
        Ok(out)
    }

    async fn line(&mut self) -> Result<String> {
        loop {
            if let Some(i) = find(self.pending(), b"\r\n") {
                let line = String::from_utf8_lossy(&self.pending()[..i]).into_owned();
                self.consume(i + 2);
                return Ok(line);
            }
            if self.pending().len() > MAX_HEAD {
                bail!("line too long");
            }
            self.fill().await?;
        }
    }

    /// Sends `GET path` with the given extra header lines and reads the whole response.
    ///
    /// # Errors
    /// I/O failures or a malformed response.
    pub async fn get(&mut self, path: &str, headers: &str) -> Result<Response> {
        self.send("GET", path, headers, None).await
    }

    /// Sends `POST path` with a JSON body and reads the whole response.
    ///
    /// # Errors
    /// I/O failures or a malformed response.
    pub async fn post_json(&mut self, path: &str, headers: &str, body: &[u8]) -> Result<Response> {
        self.send("POST", path, headers, Some(body)).await
    }

    async fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &str,
        body: Option<&[u8]>,
    ) -> Result<Response> {
        self.req.clear();
        for part in [
            method,
            " ",
            path,
            " HTTP/1.1\r\nHost: 127.0.0.1\r\n",
            headers,
        ] {
            self.req.extend_from_slice(part.as_bytes());
        }
        if let Some(body) = body {
            self.req.extend_from_slice(
                format!(
                    "Content-Type: application/json\r\nContent-Length: {}\r\n",
                    body.len()
                )
                .as_bytes(),
            );
        }
        self.req.extend_from_slice(b"\r\n");
        if let Some(body) = body {
            self.req.extend_from_slice(body);
        }
        self.stream.write_all(&self.req).await?;
        let head_end = loop {
            if let Some(i) = find(self.pending(), b"\r\n\r\n") {
                break i;
            }
            if self.pending().len() > MAX_HEAD {
                bail!("response head too large");
            }
            self.fill().await?;
        };
        let head = String::from_utf8_lossy(&self.pending()[..head_end]).into_owned();
        self.consume(head_end + 4);
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let status: u16 = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("bad status line {status_line:?}"))?;
        let mut length: Option<usize> = None;
        let mut chunked = false;
        for l in lines {
            let Some((k, v)) = l.split_once(':') else {
                continue;
            };
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
            if k == "content-length" {
                length = Some(v.parse().context("bad content-length")?);
            } else if k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked") {
                chunked = true;
            }
        }
        let body = if chunked {
            let mut body = Vec::new();
            loop {
                let size_line = self.line().await?;
                let size =
                    usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
                        .with_context(|| format!("bad chunk size {size_line:?}"))?;
                if size == 0 {
                    // Trailers end with an empty line.
                    while !self.line().await?.is_empty() {}
                    break;
                }
                body.extend(self.take(size).await?);
                self.take(2).await?;
            }
            body
        } else {
            self.take(length.unwrap_or(0)).await?
        };
        Ok(Response { status, body })
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn reads_length_and_chunked_responses_on_one_connection() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            let mut buf = [0u8; 1024];
            for reply in [
                "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello".to_owned(),
                "HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n".to_owned(),
            ] {
                loop {
                    let n = s.read(&mut buf).await.unwrap();
                    seen.extend_from_slice(&buf[..n]);
                    if find(&seen, b"\r\n\r\n").is_some() {
                        break;
                    }
                }
                seen.clear();
                s.write_all(reply.as_bytes()).await.unwrap();
            }
        });
        let mut c = Connection::connect(addr).await.unwrap();
        let r = c.get("/a", "").await.unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, b"hello".as_slice()));
        let r = c.get("/b", "X-Test: 1\r\n").await.unwrap();
        assert_eq!((r.status, r.body.as_slice()), (404, b"abcde".as_slice()));
        server.await.unwrap();
    }

    #[tokio::test]
    async fn posts_a_json_body_with_its_length() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            let mut buf = [0u8; 1024];
            while !seen.ends_with(b"{\"a\":1}") {
                let n = s.read(&mut buf).await.unwrap();
                assert!(n > 0, "closed before the body arrived");
                seen.extend_from_slice(&buf[..n]);
            }
            s.write_all(b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok")
                .await
                .unwrap();
            String::from_utf8(seen).unwrap()
        });
        let mut c = Connection::connect(addr).await.unwrap();
        let r = c.post_json("/p", "", br#"{"a":1}"#).await.unwrap();
        assert_eq!((r.status, r.body.as_slice()), (201, b"ok".as_slice()));
        let sent = server.await.unwrap();
        assert!(sent.starts_with("POST /p HTTP/1.1\r\n"), "{sent}");
        assert!(sent.contains("Content-Length: 7\r\n"), "{sent}");
        assert!(
            sent.contains("Content-Type: application/json\r\n"),
            "{sent}"
        );
    }
}
