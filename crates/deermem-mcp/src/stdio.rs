//! The line-delimited JSON-RPC transport (stdio, or any byte pipe): one message per line.
//!
//! Unlike the SDK's own byte transport, malformed input is always answered: a line that is
//! not JSON gets a `-32700` parse error, and JSON that is not a JSON-RPC message gets a
//! `-32600` invalid-request error carrying the request id when one can be read (`-32602` when
//! it names a known method with params that do not fit). A lone UTF-16 surrogate escape is
//! read as U+FFFD, so such a request is answered like any other. The server then keeps reading.
//! The errors this transport answers itself are logged at DEBUG (they are the client's mistakes,
//! not the server's); the handler logs the ones it answers.

use std::io;
use std::sync::Arc;

use deermem_core::ports::MemoryManager;
use futures::channel::mpsc;
use futures::{SinkExt, Stream, StreamExt};
use rmcp::ServiceExt;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};

use crate::error::McpServeError;
use crate::handler::{McpIdentity, MemoryMcpServer};
use crate::jsonrpc::{
    INVALID_PARAMS, INVALID_REQUEST, PARSE_ERROR, error_line, invalid_params_message,
    repair_lone_surrogates, request_id,
};

/// The longest line (one message) accepted, in bytes; longer lines are discarded and answered
/// with an invalid-request error.
pub const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

/// Outgoing lines waiting for the writer.
const OUTGOING_QUEUE: usize = 64;

/// Serves the memory tools over this process's stdin and stdout for one identity, until the
/// client closes stdin.
///
/// # Errors
/// When the client never completes the MCP handshake, or the server task fails.
pub async fn serve_stdio(
    manager: Arc<dyn MemoryManager>,
    identity: McpIdentity,
) -> Result<(), McpServeError> {
    serve_io(manager, identity, tokio::io::stdin(), tokio::io::stdout()).await
}

/// Serves the memory tools over any reader/writer pair (one JSON-RPC message per line) for one
/// identity, until the reader reaches end of input.
///
/// # Errors
/// As [`serve_stdio`], and [`McpServeError::Identity`] (before anything is read) for a user id
/// shaped like the storage bucket of another id.
pub async fn serve_io<R, W>(
    manager: Arc<dyn MemoryManager>,
    identity: McpIdentity,
    reader: R,
    writer: W,
) -> Result<(), McpServeError>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    deermem_core::ids::refuse_derived_bucket(identity.user.as_str())?;
    let (out_tx, out_rx) = mpsc::channel::<String>(OUTGOING_QUEUE);
    let writer_task = tokio::spawn(write_lines(writer, out_rx));

    let sink = out_tx
        .clone()
        .sink_map_err(|e| io::Error::new(io::ErrorKind::BrokenPipe, e))
        .with(|message: ServerJsonRpcMessage| {
            futures::future::ready(serde_json::to_string(&message).map_err(io::Error::from))
        });
    let stream = incoming(reader, out_tx);

    let handler = MemoryMcpServer::for_identity(manager, &identity);
    let outcome = match handler.serve((Box::pin(sink), stream)).await {
        Ok(running) => running
            .waiting()
            .await
            .map(|_| ())
            .map_err(|e| McpServeError::Task(e.to_string())),
        Err(e) => Err(McpServeError::Initialize(e.to_string())),
    };
    // Every sender is gone once the service has stopped, so the writer drains and ends.
    if let Err(e) = writer_task.await {
        tracing::warn!(error = %e, "MCP writer task failed");
    }
    outcome
}

/// Writes each queued line followed by `\n`, flushing after each message.
async fn write_lines<W: AsyncWrite + Unpin>(mut writer: W, mut lines: mpsc::Receiver<String>) {
    while let Some(line) = lines.next().await {
        let written = async {
            writer.write_all(line.as_bytes()).await?;
            writer.write_all(b"\n").await?;
            writer.flush().await
        }
        .await;
        if let Err(e) = written {
            tracing::warn!(error = %e, "MCP output closed");
            break;
        }
    }
}

struct Incoming<R> {
    reader: BufReader<R>,
    replies: mpsc::Sender<String>,
    /// Until the first request, stray notifications and responses are dropped: the SDK would
    /// otherwise end the session on them.
    seen_request: bool,
}

/// The stream of well-formed client messages; malformed lines are answered on `replies`.
fn incoming<R>(
    reader: R,
    replies: mpsc::Sender<String>,
) -> impl Stream<Item = ClientJsonRpcMessage> + Unpin + Send + 'static
where
    R: AsyncRead + Unpin + Send + 'static,
{
    let state = Incoming {
        reader: BufReader::new(reader),
        replies,
        seen_request: false,
    };
    Box::pin(futures::stream::unfold(state, |mut st| async move {
        loop {
            let line = match read_line(&mut st.reader).await {
                Line::Eof => return None,
                Line::TooLong => {
                    let reply = error_line(
                        Value::Null,
                        INVALID_REQUEST,
                        &format!("Invalid Request: message longer than {MAX_LINE_BYTES} bytes"),
                    );
                    let _ = st.replies.send(reply).await;
                    continue;
                }
                Line::Data(bytes) => bytes,
            };
            match classify(&line) {
                Parsed::Blank => {}
                Parsed::Message(message) => {
                    let is_request = matches!(*message, ClientJsonRpcMessage::Request(_));
                    if is_request || st.seen_request {
                        st.seen_request |= is_request;
                        return Some((*message, st));
                    }
                    tracing::debug!("dropping a message received before the first request");
                }
                Parsed::Reply(reply) => {
                    if st.replies.send(reply).await.is_err() {
                        return None;
                    }
                }
            }
        }
    }))
}

enum Line {
    Data(Vec<u8>),
    TooLong,
    Eof,
}

/// Reads one `\n`-terminated line (without the terminator and any `\r`), discarding lines
/// longer than [`MAX_LINE_BYTES`] without buffering them.
async fn read_line<R: AsyncRead + Unpin>(reader: &mut BufReader<R>) -> Line {
    let mut line = Vec::new();
    let mut too_long = false;
    loop {
        let available = match reader.fill_buf().await {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "MCP input failed");
                return Line::Eof;
            }
        };
        if available.is_empty() {
            // End of input: a final unterminated line still counts.
            return if too_long {
                Line::TooLong
            } else if line.is_empty() {
                Line::Eof
            } else {
                Line::Data(line)
            };
        }
        let (chunk, found) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (&available[..i], Some(i)),
            None => (available, None),
        };
        if !too_long {
            if line.len() + chunk.len() > MAX_LINE_BYTES {
                too_long = true;
                line = Vec::new();
            } else {
                line.extend_from_slice(chunk);
            }
        }
        let consumed = found.map_or(available.len(), |i| i + 1);
        reader.consume(consumed);
        if found.is_some() {
            if too_long {
                return Line::TooLong;
            }
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            return Line::Data(line);
        }
    }
}

enum Parsed {
    Blank,
    Message(Box<ClientJsonRpcMessage>),
    Reply(String),
}

fn classify(line: &[u8]) -> Parsed {
    let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return Parsed::Blank;
    }
    let line = repair_lone_surrogates(line);
    let value: Value = match serde_json::from_slice(&line) {
        Ok(v) => v,
        Err(e) => return reply(Value::Null, PARSE_ERROR, &format!("Parse error: {e}")),
    };
    match check_message(value) {
        Ok(message) => Parsed::Message(Box::new(message)),
        Err((id, code, message)) => reply(id, code, &message),
    }
}

fn reply(id: Value, code: i64, message: &str) -> Parsed {
    tracing::debug!(?id, code, message, "answered a JSON-RPC error");
    Parsed::Reply(error_line(id, code, message))
}

/// The client message `value` holds, or the error to answer it with: `-32602` for a request
/// naming a known method whose params do not fit, `-32600` otherwise.
pub(crate) fn check_message(value: Value) -> Result<ClientJsonRpcMessage, (Value, i64, String)> {
    let id = request_id(&value);
    let method = value
        .get("method")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let params = value.get("params").cloned();
    match serde_json::from_value::<ClientJsonRpcMessage>(value) {
        Ok(message) => Ok(message),
        Err(e) => {
            let invalid_params = method
                .as_deref()
                .filter(|_| !id.is_null())
                .and_then(|m| invalid_params_message(m, params.as_ref()));
            Err(match invalid_params {
                Some(message) => (id, INVALID_PARAMS, message),
                None => (id, INVALID_REQUEST, format!("Invalid Request: {e}")),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_split_and_bounded() {
        let long = vec![b'x'; MAX_LINE_BYTES + 10];
        let mut input = b"first\r\n\nsecond\n".to_vec();
        input.extend_from_slice(&long);
        input.extend_from_slice(b"\nlast");
        let mut r = BufReader::new(&input[..]);
        assert!(matches!(read_line(&mut r).await, Line::Data(l) if l == b"first"));
        assert!(matches!(read_line(&mut r).await, Line::Data(l) if l.is_empty()));
        assert!(matches!(read_line(&mut r).await, Line::Data(l) if l == b"second"));
        assert!(matches!(read_line(&mut r).await, Line::TooLong));
        assert!(matches!(read_line(&mut r).await, Line::Data(l) if l == b"last"));
        assert!(matches!(read_line(&mut r).await, Line::Eof));
    }

    #[test]
    fn malformed_lines_get_json_rpc_errors() {
        let Parsed::Reply(r) = classify(b"{not json") else {
            panic!("expected a parse error reply");
        };
        let v: Value = serde_json::from_str(&r).expect("reply is JSON");
        assert_eq!(v["error"]["code"], PARSE_ERROR);
        assert_eq!(v["id"], Value::Null);
        let Parsed::Reply(r) = classify(br#"{"jsonrpc":"2.0","id":7,"params":{}}"#) else {
            panic!("expected an invalid-request reply");
        };
        let v: Value = serde_json::from_str(&r).expect("reply is JSON");
        assert_eq!(v["error"]["code"], INVALID_REQUEST);
        assert_eq!(v["id"], 7);
        let Parsed::Reply(r) =
            classify(br#"{"jsonrpc":"2.0","id":8,"method":"tools/list","params":5}"#)
        else {
            panic!("expected an invalid-params reply");
        };
        let v: Value = serde_json::from_str(&r).expect("reply is JSON");
        assert_eq!(v["error"]["code"], INVALID_PARAMS, "{v}");
        assert_eq!(v["id"], 8);
        assert!(matches!(
            classify(br#"{"jsonrpc":"2.0","id":9,"method":"ping","params":{"x":"\ud83c"}}"#),
            Parsed::Message(_)
        ));
        assert!(matches!(classify(b"  \t"), Parsed::Blank));
        assert!(matches!(
            classify(b"\xEF\xBB\xBF{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}"),
            Parsed::Message(_)
        ));
    }
}
