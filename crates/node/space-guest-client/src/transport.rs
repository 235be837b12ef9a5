//! One HTTP/2 connection to the guest: setting it up with our limits, the task that drives
//! it (with keep-alive), and the request primitives the API methods are built from
//! (bounded JSON calls, streamed downloads, streamed uploads).
//!
//! Everything read from the guest goes through here, so this is where the bounds live:
//! HTTP/2 frame and header-list limits and receive windows (enforced by h2), body size
//! limits for JSON and error bodies, and a timeout on every step that waits for the guest
//! (except reading a stream's body, which is as long as the stream).

use std::future::poll_fn;
use std::io;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::future::FutureExt;
use futures::stream::{BoxStream, StreamExt};
use h2::client::{ResponseFuture, SendRequest};
use h2::{Ping, PingPong, RecvStream, SendStream};
use http::{Method, Request, Response};
use serde::de::DeserializeOwned;
use serde::Serialize;
use space_core::{ErrorBody, ErrorCode};
use space_guest_proto::limits::{MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE, MAX_JSON_BODY};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;

use crate::error::{code_for_status, from_h2, sanitise, GuestError};
use crate::options::{ClientOptions, MAX_ERROR_BODY};
use crate::query::Target;

/// Data we let h2 buffer per stream while the guest has not granted window for it: bounds
/// what an upload holds in memory beyond the caller's current chunk.
const MAX_SEND_BUFFER: usize = 64 * 1024;

/// Largest piece of an upload chunk handed to h2 at once.
pub(crate) const MAX_SEND_PIECE: usize = 64 * 1024;

/// Receiving end of "why the connection ended"; `None` while it is up.
pub(crate) type ClosedRx = watch::Receiver<Option<GuestError>>;

/// A live HTTP/2 connection: cheap to clone.
#[derive(Clone)]
pub(crate) struct Transport {
    send: SendRequest<Bytes>,
    closed: ClosedRx,
    /// Tells the connection task to end the connection now (see [`Transport::close`]).
    close: std::sync::Arc<watch::Sender<bool>>,
    pub(crate) opts: ClientOptions,
    /// Put before every request path: a guest reached through a node agent's relay
    /// (`/node/v1/sandboxes/{id}/guest`); `None` on the channel itself.
    pub(crate) prefix: Option<std::sync::Arc<str>>,
}

/// Starts HTTP/2 (prior knowledge) on `io` and spawns the task that drives it.
pub(crate) async fn start<S>(io: S, opts: ClientOptions) -> Result<Transport, GuestError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = h2::client::Builder::new();
    builder
        .initial_window_size(opts.stream_window)
        .initial_connection_window_size(opts.connection_window)
        .max_frame_size(MAX_FRAME_SIZE)
        .max_header_list_size(MAX_HEADER_LIST_SIZE)
        .max_send_buffer_size(MAX_SEND_BUFFER)
        .enable_push(false);
    let (send, mut conn) = builder.handshake::<_, Bytes>(io).await.map_err(from_h2)?;
    let ping = conn.ping_pong();
    let (tx, closed) = watch::channel(None);
    let (close, mut close_rx) = watch::channel(false);
    let (interval, timeout) = (opts.keepalive_interval, opts.keepalive_timeout);
    tokio::spawn(async move {
        let mut conn = Box::pin(conn);
        let outcome = tokio::select! {
            r = &mut conn => match r {
                Ok(()) => GuestError::Disconnected("the connection was closed".into()),
                Err(e) => from_h2(e),
            },
            e = keepalive(ping, interval, timeout) => e,
            () = async {
                // Every handle gone is no reason to end: streams may still be read.
                if close_rx.wait_for(|c| *c).await.is_err() {
                    std::future::pending::<()>().await;
                }
            } => GuestError::Disconnected("the host closed the connection".into()),
        };
        tracing::debug!(error = %outcome, "guest connection ended");
        // Publish before dropping the connection: dropping it fails every open stream,
        // and those failures should report this reason.
        tx.send_replace(Some(outcome));
        drop(conn);
    });
    Ok(Transport {
        send,
        closed,
        close: std::sync::Arc::new(close),
        opts,
        prefix: None,
    })
}

impl Transport {
    /// Ends the connection now, failing every open stream, however many handles and
    /// streams are still held.
    pub(crate) fn close(&self) {
        self.close.send_replace(true);
    }
}

/// How late a keep-alive deadline may fire before the wait counts as this process's own
/// stall rather than the guest's silence.
const STALL: Duration = Duration::from_secs(1);

/// Pings the guest every `interval`; returns when one is not answered within `timeout`.
async fn keepalive(ping: Option<PingPong>, interval: Duration, timeout: Duration) -> GuestError {
    let Some(mut ping) = ping else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(interval).await;
        if let Err(e) = ping.send_ping(Ping::opaque()) {
            return from_h2(e);
        }
        let mut deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, poll_fn(|cx| ping.poll_pong(cx))).await {
                Ok(Ok(_)) => break,
                Ok(Err(e)) => return from_h2(e),
                // Fired much later than due: this process was not running (stopped,
                // starved), and the pong may be sitting unread on the connection, which
                // is driven by the same task. Judge the guest on a wait it was given.
                Err(_) if deadline.elapsed() > STALL => {
                    tracing::debug!(late = ?deadline.elapsed(), "keep-alive deadline fired late; waiting again");
                    deadline = tokio::time::Instant::now() + timeout;
                }
                Err(_) => {
                    return GuestError::Disconnected(format!(
                        "the guest did not answer a keep-alive ping within {timeout:?}"
                    ))
                }
            }
        }
    }
}

/// A request body.
pub(crate) enum Body {
    /// No body.
    Empty,
    /// A JSON document.
    Json(Bytes),
}

impl Body {
    /// `value` as a JSON body, refused locally when larger than the guest accepts.
    pub(crate) fn json<T: Serialize + ?Sized>(value: &T) -> Result<Body, GuestError> {
        let bytes = serde_json::to_vec(value).map_err(|e| {
            GuestError::local(
                ErrorCode::InvalidRequest,
                format!("cannot encode request: {e}"),
            )
        })?;
        if bytes.len() > MAX_JSON_BODY {
            return Err(GuestError::local(
                ErrorCode::PayloadTooLarge,
                format!("request body larger than {MAX_JSON_BODY} bytes"),
            ));
        }
        Ok(Body::Json(Bytes::from(bytes)))
    }
}

impl Transport {
    /// Why the connection ended, once it has.
    pub(crate) fn closed_reason(&self) -> Option<GuestError> {
        self.closed.borrow().clone()
    }

    pub(crate) fn closed_rx(&self) -> ClosedRx {
        self.closed.clone()
    }

    /// Maps an h2 error on one request, preferring the connection's own end reason when
    /// the request failed because the connection did.
    pub(crate) fn fault(&self, err: h2::Error) -> GuestError {
        fault(&self.closed, err)
    }

    /// A JSON call with a JSON answer read with at most `limit` bytes; bounded by the JSON timeout.
    pub(crate) async fn json<T: DeserializeOwned + Send + 'static>(
        &self,
        method: Method,
        target: Target,
        body: Body,
        limit: usize,
    ) -> Result<T, GuestError> {
        let what = format!("{method} {}", target.as_str());
        self.with_timeout(self.opts.json_timeout, &what, async {
            let resp = self.exchange(method.clone(), &target, body).await?;
            let bytes = self.read_body(resp.into_body(), limit).await?;
            parse_json(bytes, &what).await
        })
        .await
    }

    /// A call whose answer carries nothing (204); bounded by the JSON timeout.
    pub(crate) async fn unit(
        &self,
        method: Method,
        target: Target,
        body: Body,
    ) -> Result<(), GuestError> {
        let what = format!("{method} {}", target.as_str());
        self.with_timeout(self.opts.json_timeout, &what, async {
            // The body of a success is ignored; dropping the stream resets it if the guest
            // sends one anyway.
            self.exchange(method, &target, body).await.map(drop)
        })
        .await
    }

    /// Opens a streamed download: returns the successful response with its body unread.
    /// Only the wait for the response head is bounded (stream-open timeout).
    pub(crate) async fn open_stream(
        &self,
        method: Method,
        target: Target,
    ) -> Result<Response<RecvStream>, GuestError> {
        let what = format!("{method} {}", target.as_str());
        self.with_timeout(
            self.opts.stream_open_timeout,
            &what,
            self.exchange(method, &target, Body::Empty),
        )
        .await
    }

    /// Opens a stream that carries bytes both ways: sends the request head (the body is the
    /// caller's to send on the returned `SendStream`), waits for a successful answer's head.
    /// Both waits are bounded by the stream-open timeout; the stream itself is not.
    pub(crate) async fn open_duplex(
        &self,
        method: Method,
        target: Target,
    ) -> Result<(Response<RecvStream>, SendStream<Bytes>), GuestError> {
        let what = format!("{method} {}", target.as_str());
        self.with_timeout(self.opts.stream_open_timeout, &what, async {
            let (resp_fut, send) = self
                .send_head(method, &target, "application/octet-stream", false)
                .await?;
            let resp = resp_fut.await.map_err(|e| self.fault(e))?;
            Ok((self.check_status(resp).await?, send))
        })
        .await
    }

    /// A streamed upload with a JSON answer; see [`Transport::upload`] for the timeouts.
    pub(crate) async fn upload_json<T: DeserializeOwned + Send + 'static>(
        &self,
        method: Method,
        target: Target,
        body: BoxStream<'static, Result<Bytes, io::Error>>,
    ) -> Result<T, GuestError> {
        let what = format!("{method} {}", target.as_str());
        let resp = self.upload(method, &target, body).await?;
        self.with_timeout(self.opts.json_timeout, &what, async {
            let bytes = self.read_body(resp.into_body(), MAX_JSON_BODY).await?;
            parse_json(bytes, &what).await
        })
        .await
    }

    /// A streamed upload with an empty answer.
    pub(crate) async fn upload_unit(
        &self,
        method: Method,
        target: Target,
        body: BoxStream<'static, Result<Bytes, io::Error>>,
    ) -> Result<(), GuestError> {
        self.upload(method, &target, body).await.map(drop)
    }

    /// Sends a request whose body the caller streams. Opening the stream is bounded by the
    /// stream-open timeout; sending the body is not (flow control paces it and keep-alive
    /// catches a dead guest); after the body is sent, the answer must come within the
    /// stream-open timeout. An answer that comes early (an error before the body is done)
    /// stops the upload.
    async fn upload(
        &self,
        method: Method,
        target: &Target,
        body: BoxStream<'static, Result<Bytes, io::Error>>,
    ) -> Result<Response<RecvStream>, GuestError> {
        let what = format!("{method} {}", target.as_str());
        let limit = self.opts.stream_open_timeout;
        let (resp_fut, send) = self
            .with_timeout(
                limit,
                &what,
                self.send_head(method, target, "application/octet-stream", false),
            )
            .await?;
        let resp = match self.send_body(resp_fut, send, body).await? {
            Sent::Answered(resp) => resp,
            Sent::BodyDone(resp_fut) => match tokio::time::timeout(limit, resp_fut).await {
                Ok(r) => r.map_err(|e| self.fault(e))?,
                Err(_) => {
                    return Err(GuestError::Timeout(format!(
                        "{what}: no answer within {limit:?} after the body was sent"
                    )))
                }
            },
        };
        self.with_timeout(limit, &what, self.check_status(resp))
            .await
    }

    /// Sends the request head and body, waits for the head of a successful answer.
    async fn exchange(
        &self,
        method: Method,
        target: &Target,
        body: Body,
    ) -> Result<Response<RecvStream>, GuestError> {
        let resp = match body {
            Body::Empty => {
                let (resp_fut, _send) = self.send_head(method, target, "", true).await?;
                resp_fut.await.map_err(|e| self.fault(e))?
            }
            Body::Json(bytes) => {
                let (resp_fut, send) = self
                    .send_head(method, target, "application/json", false)
                    .await?;
                let once = futures::stream::once(async move { Ok::<_, io::Error>(bytes) }).boxed();
                match self.send_body(resp_fut, send, once).await? {
                    Sent::Answered(resp) => resp,
                    Sent::BodyDone(resp_fut) => resp_fut.await.map_err(|e| self.fault(e))?,
                }
            }
        };
        self.check_status(resp).await
    }

    /// Streams `body` while watching for an early answer.
    async fn send_body(
        &self,
        mut resp_fut: ResponseFuture,
        mut send: SendStream<Bytes>,
        body: BoxStream<'static, Result<Bytes, io::Error>>,
    ) -> Result<Sent, GuestError> {
        let pumped = {
            let pump = pump(&mut send, body);
            tokio::pin!(pump);
            tokio::select! {
                biased;
                r = &mut resp_fut => Err(r),
                p = &mut pump => Ok(p),
            }
        };
        let early = match pumped {
            Ok(Ok(())) => return Ok(Sent::BodyDone(resp_fut)),
            Ok(Err(PumpError::Caller(e))) => {
                // Abort, so the guest never takes a truncated body for a whole one.
                send.send_reset(h2::Reason::CANCEL);
                return Err(GuestError::local(
                    ErrorCode::InvalidRequest,
                    format!("the request body failed: {e}"),
                ));
            }
            Ok(Err(stop)) => match (&mut resp_fut).now_or_never() {
                // The guest answered and stopped the upload at the same time.
                Some(r) => r,
                None => return Err(self.pump_fault(stop)),
            },
            Err(r) => {
                // Answered before the whole body was sent: end our side cleanly (a reset
                // would also discard the answer's body, e.g. its ErrorBody).
                let _ = send.send_data(Bytes::new(), true);
                r
            }
        };
        early.map(Sent::Answered).map_err(|e| self.fault(e))
    }

    fn pump_fault(&self, stop: PumpError) -> GuestError {
        match stop {
            PumpError::Caller(e) => GuestError::local(
                ErrorCode::InvalidRequest,
                format!("the request body failed: {e}"),
            ),
            PumpError::H2(e) => self.fault(e),
            PumpError::Reset(reason) => {
                if let Some(e) = self.closed_reason() {
                    return e;
                }
                let (status, code) = match reason {
                    Some(h2::Reason::REFUSED_STREAM) => (429, ErrorCode::TooManyRequests),
                    _ => (500, ErrorCode::Internal),
                };
                GuestError::Remote {
                    status,
                    body: ErrorBody::new(
                        code,
                        format!("the guest stopped the upload without an answer ({reason:?})"),
                    ),
                }
            }
        }
    }

    /// Waits for a stream slot and sends the request head.
    pub(crate) async fn send_head(
        &self,
        method: Method,
        target: &Target,
        content_type: &str,
        end_of_stream: bool,
    ) -> Result<(ResponseFuture, SendStream<Bytes>), GuestError> {
        if let Some(e) = self.closed_reason() {
            return Err(e);
        }
        let uri = match &self.prefix {
            Some(prefix) => format!("http://node{prefix}{}", target.as_str()),
            None => target.uri(),
        };
        let mut builder = Request::builder().method(method).uri(uri);
        if !content_type.is_empty() {
            builder = builder.header(http::header::CONTENT_TYPE, content_type);
        }
        let req = builder.body(()).map_err(|e| {
            GuestError::local(
                ErrorCode::InvalidRequest,
                format!("cannot build request: {e}"),
            )
        })?;
        // ready() waits while the guest's MAX_CONCURRENT_STREAMS are all in use.
        let mut send = self.send.clone().ready().await.map_err(|e| self.fault(e))?;
        send.send_request(req, end_of_stream)
            .map_err(|e| self.fault(e))
    }

    /// Passes a 2xx answer through; turns anything else into an error.
    async fn check_status(
        &self,
        resp: Response<RecvStream>,
    ) -> Result<Response<RecvStream>, GuestError> {
        let status = resp.status().as_u16();
        if (200..300).contains(&status) {
            return Ok(resp);
        }
        if !(400..600).contains(&status) {
            return Err(GuestError::protocol(format!("unexpected status {status}")));
        }
        let bytes = self.read_body(resp.into_body(), MAX_ERROR_BODY).await?;
        Err(remote_error(status, &bytes))
    }

    /// Reads a whole body, at most `limit` bytes (more is a protocol violation).
    async fn read_body(&self, mut body: RecvStream, limit: usize) -> Result<Bytes, GuestError> {
        let mut buf = BytesMut::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(|e| self.fault(e))?;
            // Window is returned as soon as the bytes are ours; the limit bounds the total.
            let _ = body.flow_control().release_capacity(chunk.len());
            if buf.len() + chunk.len() > limit {
                return Err(GuestError::protocol(format!(
                    "answer body larger than {limit} bytes"
                )));
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(buf.freeze())
    }

    pub(crate) async fn with_timeout<T>(
        &self,
        limit: Duration,
        what: &str,
        fut: impl std::future::Future<Output = Result<T, GuestError>>,
    ) -> Result<T, GuestError> {
        match tokio::time::timeout(limit, fut).await {
            Ok(r) => r,
            Err(_) => Err(GuestError::Timeout(format!(
                "{what}: no answer within {limit:?}"
            ))),
        }
    }
}

/// Bodies larger than this are parsed on the blocking pool: a 16 MiB listing takes long
/// enough to stall the other connections served by the same runtime thread.
const PARSE_INLINE_MAX: usize = 256 * 1024;

/// Parses a JSON answer; malformed JSON is a protocol violation.
async fn parse_json<T: DeserializeOwned + Send + 'static>(
    bytes: Bytes,
    what: &str,
) -> Result<T, GuestError> {
    let parsed = if bytes.len() <= PARSE_INLINE_MAX {
        serde_json::from_slice(&bytes)
    } else {
        match tokio::task::spawn_blocking(move || serde_json::from_slice(&bytes)).await {
            Ok(r) => r,
            Err(e) => {
                return Err(GuestError::Disconnected(format!(
                    "parsing the answer to {what} was cancelled: {e}"
                )))
            }
        }
    };
    parsed.map_err(|e| GuestError::protocol(format!("bad JSON answer to {what}: {e}")))
}

/// [`Transport::fault`] for code that holds only the closed receiver (body streams).
pub(crate) fn fault(closed: &ClosedRx, err: h2::Error) -> GuestError {
    let mapped = from_h2(err);
    if mapped.is_channel_fault() {
        if let Some(reason) = closed.borrow().clone() {
            return reason;
        }
    }
    mapped
}

/// The error for a non-2xx answer: the guest's `ErrorBody` if it sent one, else one made
/// from the status (a guest that answers an unknown route with a bare 404 has not broken
/// the channel).
pub(crate) fn remote_error(status: u16, body: &[u8]) -> GuestError {
    let body = match serde_json::from_slice::<ErrorBody>(body) {
        Ok(b) => b.sanitised(),
        Err(_) => {
            let snippet: String =
                String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
            ErrorBody::new(
                code_for_status(status),
                sanitise(format!("guest answered {status}: {snippet}")),
            )
        }
    };
    GuestError::Remote { status, body }
}

/// How far a request got.
enum Sent {
    /// The guest answered before the body was fully sent.
    Answered(Response<RecvStream>),
    /// The body was sent; the answer is still to come.
    BodyDone(ResponseFuture),
}

pub(crate) enum PumpError {
    /// The caller's body stream failed.
    Caller(io::Error),
    /// h2 refused to send.
    H2(h2::Error),
    /// The stream is no longer sendable: the guest reset it (with this reason, if known)
    /// or the connection ended.
    Reset(Option<h2::Reason>),
}

/// Sends `body` on `send` as the guest grants window, then ends the stream. Holds at most
/// one caller chunk plus `MAX_SEND_BUFFER` in h2.
pub(crate) async fn pump(
    send: &mut SendStream<Bytes>,
    mut body: BoxStream<'static, Result<Bytes, io::Error>>,
) -> Result<(), PumpError> {
    while let Some(item) = body.next().await {
        let mut chunk = item.map_err(PumpError::Caller)?;
        while !chunk.is_empty() {
            send.reserve_capacity(chunk.len().min(MAX_SEND_PIECE));
            let granted = loop {
                let cap = send.capacity();
                if cap > 0 {
                    break cap;
                }
                match poll_fn(|cx| send.poll_capacity(cx)).await {
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => return Err(PumpError::H2(e)),
                    // No longer sendable: the guest reset the stream or the connection ended.
                    None => {
                        return Err(match poll_fn(|cx| send.poll_reset(cx)).now_or_never() {
                            Some(Ok(reason)) => PumpError::Reset(Some(reason)),
                            Some(Err(e)) => PumpError::H2(e),
                            None => PumpError::Reset(None),
                        });
                    }
                }
            };
            let piece = chunk.split_to(granted.min(chunk.len()));
            send.send_data(piece, false).map_err(PumpError::H2)?;
        }
    }
    send.send_data(Bytes::new(), true).map_err(PumpError::H2)
}
