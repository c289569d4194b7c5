//! The connection's byte stream as hyper sees it: request heads are held back until they are
//! complete and checked (see `head`), so a slow or partial head never reaches hyper; a head to
//! refuse is replaced by a request for the connection's private rejection path, answered with
//! a JSON body by the connection's service; the header-read and keep-alive idle timeouts end
//! connections that send nothing useful.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::http::StatusCode;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use super::head::{ChunkStep, Chunked, Framing, HeadCheck, check_head};

/// State shared between a connection's stream and its service.
#[derive(Debug)]
pub(crate) struct ConnShared {
    /// The path of the synthetic request that stands for a refused head.
    pub(crate) reject_path: String,
    inner: Mutex<SharedInner>,
}

#[derive(Debug)]
struct SharedInner {
    /// The refusal the next synthetic request answers.
    rejection: Option<(StatusCode, String)>,
    /// Requests handed to the service whose response is not built yet.
    in_flight: usize,
    /// Last time bytes moved or a response was built.
    last_activity: Instant,
    /// The stream's reader, woken when the last request in flight is answered.
    reader: Option<Waker>,
}

impl ConnShared {
    pub(crate) fn new(reject_path: String) -> Arc<Self> {
        Arc::new(Self {
            reject_path,
            inner: Mutex::new(SharedInner {
                rejection: None,
                in_flight: 0,
                last_activity: Instant::now(),
                reader: None,
            }),
        })
    }

    /// Takes the pending refusal (the synthetic request's answer).
    pub(crate) fn take_rejection(&self) -> Option<(StatusCode, String)> {
        self.inner.lock().rejection.take()
    }

    /// Marks a request as handed to the service; the guard ends it.
    pub(crate) fn begin_request(self: &Arc<Self>) -> InFlight {
        self.inner.lock().in_flight += 1;
        InFlight(Arc::clone(self))
    }

    fn touch(&self) {
        self.inner.lock().last_activity = Instant::now();
    }
}

/// A request in flight on its connection (ends when dropped).
#[derive(Debug)]
pub(crate) struct InFlight(Arc<ConnShared>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let waker = {
            let mut s = self.0.inner.lock();
            s.in_flight = s.in_flight.saturating_sub(1);
            s.last_activity = Instant::now();
            if s.in_flight == 0 {
                s.reader.take()
            } else {
                None
            }
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// Where the stream is in the sequence of requests.
#[derive(Debug)]
enum Phase {
    /// Collecting a head; `started` is when its deadline started counting (accept for the
    /// first request, the first byte for later ones), `None` while no byte has arrived.
    Head { started: Option<Instant> },
    /// Passing a body of this many more bytes.
    Body(u64),
    /// Passing a chunked body.
    Chunked(Chunked),
    /// Passing everything unexamined (after an upgrade request or malformed chunking).
    Opaque,
    /// A refusal was handed over; nothing more is read.
    Refused,
    /// The connection ends (idle or head timeout with nothing received): reads give EOF.
    Ended,
}

/// The timeouts a stream applies.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timeouts {
    pub(crate) header_read: Duration,
    pub(crate) keep_alive: Duration,
}

/// A TCP stream (or any byte stream) with its request heads checked before hyper reads them.
#[derive(Debug)]
pub(crate) struct GuardedIo<S> {
    inner: S,
    shared: Arc<ConnShared>,
    timeouts: Timeouts,
    phase: Phase,
    /// Bytes received and not yet classified (a head being collected, or what followed one).
    pending: Vec<u8>,
    /// How much of `pending` the head check has already seen without a verdict.
    examined: usize,
    /// Bytes ready for hyper (a checked head, or the synthetic request).
    out: Vec<u8>,
    out_pos: usize,
    timer: Pin<Box<Sleep>>,
}

impl<S> GuardedIo<S> {
    pub(crate) fn new(inner: S, shared: Arc<ConnShared>, timeouts: Timeouts) -> Self {
        let now = Instant::now();
        Self {
            inner,
            shared,
            timeouts,
            phase: Phase::Head { started: Some(now) },
            pending: Vec::new(),
            examined: 0,
            out: Vec::new(),
            out_pos: 0,
            timer: Box::pin(tokio::time::sleep_until(now + timeouts.header_read)),
        }
    }

    /// Replaces the head being collected by the synthetic request for the rejection path.
    fn refuse(&mut self, status: StatusCode, message: String) {
        self.shared.inner.lock().rejection = Some((status, message));
        self.out = format!(
            "GET {} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n",
            self.shared.reject_path
        )
        .into_bytes();
        self.out_pos = 0;
        self.pending = Vec::new();
        self.examined = 0;
        self.phase = Phase::Refused;
    }

    /// Classifies `pending` as far as it goes in the head phase; true when bytes for hyper
    /// are ready (or the phase left `Head`).
    ///
    /// A head can only complete, or break a rule, at a line end or by its size, so a head that
    /// trickles in byte by byte is parsed again only when a line ends (at most once per header
    /// field, which are at most [`head::MAX_HEADERS`](super::head::MAX_HEADERS)), not per byte.
    fn examine_head(&mut self) -> bool {
        if self.pending.is_empty() {
            return false;
        }
        let fresh = &self.pending[self.examined.min(self.pending.len())..];
        let line_ended = fresh.contains(&b'\n');
        // (`contains` stops at the request line's end, and only runs past the URI limit.)
        let oversized = self.pending.len() > super::head::MAX_HEAD_BYTES
            || (self.pending.len() > super::head::MAX_URI_BYTES && !self.pending.contains(&b'\n'));
        if !line_ended && !oversized && self.examined > 0 {
            self.examined = self.pending.len();
            return false;
        }
        self.examined = self.pending.len();
        match check_head(&self.pending) {
            HeadCheck::Partial => false,
            HeadCheck::Refuse(status, message) => {
                tracing::debug!(status = status.as_u16(), %message, "request head refused");
                self.refuse(status, message);
                true
            }
            HeadCheck::Complete { len, framing } => {
                let rest = self.pending.split_off(len);
                self.out = std::mem::replace(&mut self.pending, rest);
                self.examined = 0;
                self.out_pos = 0;
                self.phase = match framing {
                    Framing::Length(0) => Phase::Head { started: None },
                    Framing::Length(n) => Phase::Body(n),
                    Framing::Chunked => Phase::Chunked(Chunked::START),
                    Framing::Opaque => Phase::Opaque,
                };
                true
            }
        }
    }

    /// The deadline the head phase waits for, if any: the head's own, or the idle limit when
    /// no request is in flight (the reader is then registered to hear when it is answered).
    fn head_deadline(&self, started: Option<Instant>, cx: &Context<'_>) -> Option<Instant> {
        if let Some(t) = started {
            return Some(t + self.timeouts.header_read);
        }
        let mut s = self.shared.inner.lock();
        if s.in_flight > 0 {
            s.reader = Some(cx.waker().clone());
            return None;
        }
        Some(s.last_activity + self.timeouts.keep_alive)
    }
}

/// Copies from `src[*pos..]` into `buf`; true when something was copied.
fn drain_into(src: &mut Vec<u8>, pos: &mut usize, buf: &mut ReadBuf<'_>) -> bool {
    if *pos >= src.len() {
        return false;
    }
    let n = (src.len() - *pos).min(buf.remaining());
    buf.put_slice(&src[*pos..*pos + n]);
    *pos += n;
    if *pos >= src.len() {
        src.clear();
        *pos = 0;
    }
    n > 0
}

impl<S: AsyncRead + Unpin> GuardedIo<S> {
    /// Reads from the socket into `pending`; `Ready(Ok(0))` is end of stream.
    fn fill_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let mut chunk = [0u8; 8192];
        let mut rb = ReadBuf::new(&mut chunk);
        match Pin::new(&mut self.inner).poll_read(cx, &mut rb) {
            Poll::Ready(Ok(())) => {
                let got = rb.filled();
                self.pending.extend_from_slice(got);
                if !got.is_empty() {
                    self.shared.touch();
                }
                Poll::Ready(Ok(got.len()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }

    /// Moves body bytes into `buf`, from `pending` first, then from the socket, up to `limit`.
    fn read_body(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
        limit: u64,
    ) -> Poll<io::Result<usize>> {
        let room = usize::try_from(limit)
            .unwrap_or(usize::MAX)
            .min(buf.remaining());
        if !self.pending.is_empty() {
            let n = room.min(self.pending.len());
            buf.put_slice(&self.pending[..n]);
            self.pending.drain(..n);
            return Poll::Ready(Ok(n));
        }
        if room >= buf.remaining() {
            let before = buf.filled().len();
            std::task::ready!(Pin::new(&mut self.inner).poll_read(cx, buf))?;
            let n = buf.filled().len() - before;
            if n > 0 {
                self.shared.touch();
            }
            return Poll::Ready(Ok(n));
        }
        // Less of the body is left than `buf` holds: read no further than the body's end.
        let mut chunk = [0u8; 8192];
        let want = room.min(chunk.len());
        let mut rb = ReadBuf::new(&mut chunk[..want]);
        std::task::ready!(Pin::new(&mut self.inner).poll_read(cx, &mut rb))?;
        let n = rb.filled().len();
        buf.put_slice(rb.filled());
        if n > 0 {
            self.shared.touch();
        }
        Poll::Ready(Ok(n))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for GuardedIo<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if drain_into(&mut this.out, &mut this.out_pos, buf) {
                return Poll::Ready(Ok(()));
            }
            match this.phase {
                Phase::Ended => return Poll::Ready(Ok(())),
                Phase::Refused => {
                    // hyper answers the synthetic request and closes (it asked for
                    // `connection: close`); nothing more is read from this client.
                    return Poll::Pending;
                }
                Phase::Opaque => {
                    if !this.pending.is_empty() {
                        let n = buf.remaining().min(this.pending.len());
                        buf.put_slice(&this.pending[..n]);
                        this.pending.drain(..n);
                        return Poll::Ready(Ok(()));
                    }
                    return Pin::new(&mut this.inner).poll_read(cx, buf);
                }
                Phase::Body(left) => {
                    let n = std::task::ready!(this.read_body(cx, buf, left))?;
                    if n == 0 {
                        // End of stream inside a body: hyper reports the truncated request.
                        return Poll::Ready(Ok(()));
                    }
                    let left = left - n as u64;
                    this.phase = if left == 0 {
                        Phase::Head { started: None }
                    } else {
                        Phase::Body(left)
                    };
                    return Poll::Ready(Ok(()));
                }
                Phase::Chunked(mut state) => {
                    let before = buf.filled().len();
                    let n = std::task::ready!(this.read_body(cx, buf, u64::MAX))?;
                    if n == 0 {
                        return Poll::Ready(Ok(()));
                    }
                    match state.feed(&buf.filled()[before..before + n]) {
                        ChunkStep::More => this.phase = Phase::Chunked(state),
                        ChunkStep::Malformed => this.phase = Phase::Opaque,
                        ChunkStep::End(k) => {
                            // What follows the body is the next head: keep it back.
                            let extra = buf.filled()[before + k..before + n].to_vec();
                            buf.set_filled(before + k);
                            let mut rest = extra;
                            rest.append(&mut this.pending);
                            this.pending = rest;
                            this.phase = Phase::Head { started: None };
                        }
                    }
                    return Poll::Ready(Ok(()));
                }
                Phase::Head { started } => {
                    if started.is_none() && !this.pending.is_empty() {
                        this.phase = Phase::Head {
                            started: Some(Instant::now()),
                        };
                        continue;
                    }
                    if this.examine_head() {
                        continue;
                    }
                    match this.fill_pending(cx) {
                        Poll::Ready(Ok(0)) => {
                            // The client closed: a partial head is dropped (hyper, seeing
                            // nothing, ends the connection quietly).
                            this.pending.clear();
                            this.phase = Phase::Ended;
                        }
                        Poll::Ready(Ok(_)) => {}
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                        Poll::Pending => {
                            let Some(deadline) = this.head_deadline(started, cx) else {
                                return Poll::Pending;
                            };
                            if this.timer.deadline() != deadline {
                                this.timer.as_mut().reset(deadline);
                            }
                            if this.timer.as_mut().poll(cx).is_pending() {
                                return Poll::Pending;
                            }
                            if this.pending.is_empty() {
                                tracing::debug!(
                                    "closing a connection that sent no request in time"
                                );
                                this.phase = Phase::Ended;
                            } else {
                                let secs = this.timeouts.header_read.as_secs_f64();
                                this.refuse(
                                    StatusCode::REQUEST_TIMEOUT,
                                    format!("request head not received within {secs} seconds"),
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for GuardedIo<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, data);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            this.shared.touch();
        }
        r
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            this.shared.touch();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
