//! The server side of Connect over axum: reading unary and streamed requests, writing unary
//! and streamed responses (JSON codec, identity encoding; what the E2B SDKs speak).
//!
//! - Unary: `POST` with `Content-Type: application/json`, one JSON message each way; an
//!   error is its Connect code's HTTP status with a JSON error body.
//! - Server stream: the request is one enveloped message (`application/connect+json`); the
//!   response is HTTP 200 and envelopes, the last an end-of-stream envelope carrying the
//!   error, if any. Errors found before the first message still go out that way, since a
//!   streaming client reads errors only from there.
//! - Client stream: the request body is a stream of envelopes, read as they arrive (the
//!   Python SDK sends it chunked over HTTP/1.1); the response is one enveloped message and
//!   the end-of-stream envelope.
//!
//! Every message is bounded by [`MAX_MESSAGE_BYTES`] before it is buffered.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{FromRequest, Request};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::envelope::{Envelope, EnvelopeDecoder, EnvelopeError, MAX_MESSAGE_BYTES};
use super::error::{Code, ConnectError};
use space_core::error::excerpt;

/// Content type of unary JSON messages.
pub const UNARY_JSON: &str = "application/json";
/// Content type of streamed JSON messages.
pub const STREAM_JSON: &str = "application/connect+json";
/// Header with the client's deadline, in milliseconds.
pub const TIMEOUT_HEADER: &str = "connect-timeout-ms";
/// Header with the keepalive interval the E2B SDKs ask for, in seconds.
pub const KEEPALIVE_HEADER: &str = "keepalive-ping-interval";
/// Longest deadline honoured (a larger one is clamped: the stream ends at this deadline).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);
/// Keepalive interval when the client names none, and its bounds.
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(50);
/// Shortest keepalive interval honoured.
pub const MIN_KEEPALIVE: Duration = Duration::from_secs(1);
/// Longest keepalive interval honoured.
pub const MAX_KEEPALIVE: Duration = Duration::from_secs(300);

/// The content type's essence (`application/json; charset=utf-8` → `application/json`).
fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase())
        .unwrap_or_default()
}

/// Refuses an encoding other than identity (neither SDK compresses).
fn check_encoding(headers: &HeaderMap, header: &str) -> Result<(), ConnectError> {
    match headers.get(header).and_then(|v| v.to_str().ok()) {
        None => Ok(()),
        Some(e) if e.trim().eq_ignore_ascii_case("identity") || e.trim().is_empty() => Ok(()),
        Some(e) => Err(ConnectError::new(
            Code::Unimplemented,
            format!(
                "compression {:?} is not supported: send identity",
                excerpt(e, 32)
            ),
        )),
    }
}

/// The client's deadline (`Connect-Timeout-Ms`), clamped to [`MAX_TIMEOUT`]; `None` when it
/// set none. A malformed value is `invalid_argument`.
pub fn deadline(headers: &HeaderMap) -> Result<Option<Duration>, ConnectError> {
    let Some(raw) = headers.get(TIMEOUT_HEADER) else {
        return Ok(None);
    };
    let ms: u64 = raw
        .to_str()
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .filter(|s: &u64| *s <= 9_999_999_999)
        .ok_or_else(|| ConnectError::new(Code::InvalidArgument, "bad Connect-Timeout-Ms"))?;
    Ok(Some(Duration::from_millis(ms).min(MAX_TIMEOUT)))
}

/// The keepalive interval asked for (`Keepalive-Ping-Interval`, seconds), within bounds.
pub fn keepalive(headers: &HeaderMap) -> Duration {
    headers
        .get(KEEPALIVE_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_KEEPALIVE)
        .clamp(MIN_KEEPALIVE, MAX_KEEPALIVE)
}

fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ConnectError> {
    // proto3 JSON: an empty message may be sent as an empty body.
    let bytes = if bytes.iter().all(u8::is_ascii_whitespace) {
        &b"{}"[..]
    } else {
        bytes
    };
    serde_json::from_slice(bytes).map_err(|e| {
        ConnectError::new(
            Code::InvalidArgument,
            format!("invalid request message: {e}"),
        )
    })
}

impl From<EnvelopeError> for ConnectError {
    fn from(e: EnvelopeError) -> Self {
        let code = match e {
            EnvelopeError::TooLarge { .. } => Code::ResourceExhausted,
            // No compression was negotiated, so a compressed message breaks the protocol.
            EnvelopeError::Compressed
            | EnvelopeError::UnknownFlags(_)
            | EnvelopeError::Truncated(_) => Code::InvalidArgument,
        };
        ConnectError::new(code, e.to_string())
    }
}

/// A unary error response (status from the code, JSON body).
impl IntoResponse for ConnectError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.code.http_status())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, [(CONTENT_TYPE, UNARY_JSON)], self.unary_body()).into_response()
    }
}

/// A unary request's message.
#[derive(Debug)]
pub struct Unary<T>(pub T);

/// What a malformed unary request gets.
pub struct UnaryRejection(Response);

impl IntoResponse for UnaryRejection {
    fn into_response(self) -> Response {
        self.0
    }
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Unary<T> {
    type Rejection = UnaryRejection;

    async fn from_request(req: Request, _state: &S) -> Result<Self, UnaryRejection> {
        let reject = |e: ConnectError| UnaryRejection(e.into_response());
        let ct = content_type(req.headers());
        if ct == "application/proto" {
            return Err(reject(ConnectError::new(
                Code::Unimplemented,
                "the binary protobuf codec is not supported: use JSON",
            )));
        }
        if ct != UNARY_JSON {
            // Connect's answer to a unary request it cannot decode at all.
            return Err(UnaryRejection(
                (
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    format!(
                        "unsupported content type {:?}: send application/json",
                        excerpt(&ct, 64)
                    ),
                )
                    .into_response(),
            ));
        }
        check_encoding(req.headers(), "content-encoding").map_err(reject)?;
        let bytes = axum::body::to_bytes(req.into_body(), MAX_MESSAGE_BYTES)
            .await
            .map_err(|_| {
                reject(ConnectError::new(
                    Code::ResourceExhausted,
                    format!("request message larger than {MAX_MESSAGE_BYTES} bytes"),
                ))
            })?;
        parse(&bytes).map(Unary).map_err(reject)
    }
}

/// A unary response's message.
pub struct UnaryResponse<T>(pub T);

impl<T: Serialize> IntoResponse for UnaryResponse<T> {
    fn into_response(self) -> Response {
        match serde_json::to_vec(&self.0) {
            Ok(body) => ([(CONTENT_TYPE, UNARY_JSON)], body).into_response(),
            Err(e) => ConnectError::new(Code::Internal, format!("encoding the response: {e}"))
                .into_response(),
        }
    }
}

/// Result of a unary handler.
pub type UnaryResult<T> = Result<UnaryResponse<T>, ConnectError>;

/// Checks a streaming request's content type and encoding.
fn check_stream_request(headers: &HeaderMap) -> Result<(), ConnectError> {
    let ct = content_type(headers);
    if ct == "application/connect+proto" {
        return Err(ConnectError::new(
            Code::Unimplemented,
            "the binary protobuf codec is not supported: use JSON",
        ));
    }
    if ct != STREAM_JSON {
        return Err(ConnectError::new(
            Code::InvalidArgument,
            format!(
                "unsupported content type {:?}: send application/connect+json",
                excerpt(&ct, 64)
            ),
        ));
    }
    check_encoding(headers, "connect-content-encoding")
}

/// A streaming request whose content type and encoding are right, taken apart; otherwise
/// its rejection (the body read and dropped).
async fn checked_stream(
    req: Request,
) -> Result<(axum::http::request::Parts, Body), StreamRejection> {
    if let Err(e) = check_stream_request(req.headers()) {
        discard(req).await;
        return Err(StreamRejection(e));
    }
    Ok(req.into_parts())
}

/// A server-stream request: its one message, and the headers (deadline, keepalive).
#[derive(Debug)]
pub struct StreamRequest<T> {
    /// The message.
    pub message: T,
    /// The request's headers.
    pub headers: HeaderMap,
}

/// What a malformed streaming request gets: HTTP 200 and an end-of-stream error.
pub struct StreamRejection(pub ConnectError);

impl IntoResponse for StreamRejection {
    fn into_response(self) -> Response {
        stream_error(self.0)
    }
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for StreamRequest<T> {
    type Rejection = StreamRejection;

    async fn from_request(req: Request, _state: &S) -> Result<Self, StreamRejection> {
        let (parts, body) = checked_stream(req).await?;
        let mut envelopes = envelopes(body);
        let first = match envelopes.next().await {
            Some(Ok(env)) if !env.is_end_of_stream() => env,
            Some(Err(e)) => return Err(StreamRejection(e)),
            _ => {
                return Err(StreamRejection(ConnectError::new(
                    Code::InvalidArgument,
                    "the request has no message",
                )))
            }
        };
        if let Some(extra) = envelopes.next().await {
            return Err(StreamRejection(match extra {
                Err(e) => e,
                Ok(_) => ConnectError::new(
                    Code::InvalidArgument,
                    "a server-streaming request carries exactly one message",
                ),
            }));
        }
        let message = parse(&first.payload).map_err(StreamRejection)?;
        Ok(StreamRequest {
            message,
            headers: parts.headers,
        })
    }
}

/// A client-stream request: its messages as they arrive.
pub struct ClientStream<T> {
    /// The messages; the stream ends with the request body.
    pub messages: BoxStream<'static, Result<T, ConnectError>>,
    /// The request's headers.
    pub headers: HeaderMap,
}

impl<S: Send + Sync, T: DeserializeOwned + Send + 'static> FromRequest<S> for ClientStream<T> {
    type Rejection = StreamRejection;

    async fn from_request(req: Request, _state: &S) -> Result<Self, StreamRejection> {
        let (parts, body) = checked_stream(req).await?;
        let messages = envelopes(body)
            .filter(|e| std::future::ready(!matches!(e, Ok(env) if env.is_end_of_stream())))
            .map(|e| e.and_then(|env| parse(&env.payload)))
            .boxed();
        Ok(ClientStream {
            messages,
            headers: parts.headers,
        })
    }
}

/// Reads and drops what is left of a request answered early (bounded in bytes and time),
/// so an HTTP/1.1 client gets the answer on a connection it can keep using rather than a
/// reset.
pub async fn discard(req: Request) {
    space_control::api::files::drain(req.into_body()).await;
}

/// The envelopes of a request body, decoded as its chunks arrive; a broken body or bad
/// framing ends the stream with that error.
fn envelopes(body: Body) -> BoxStream<'static, Result<Envelope, ConnectError>> {
    let state = (body.into_data_stream(), EnvelopeDecoder::new(), false);
    futures::stream::unfold(state, |(mut data, mut decoder, mut done)| async move {
        if done {
            return None;
        }
        loop {
            match decoder.next_envelope() {
                Ok(Some(env)) => return Some((Ok(env), (data, decoder, done))),
                Ok(None) => {}
                Err(e) => {
                    done = true;
                    return Some((Err(e.into()), (data, decoder, done)));
                }
            }
            match data.next().await {
                Some(Ok(chunk)) => decoder.push(&chunk),
                Some(Err(e)) => {
                    done = true;
                    let err =
                        ConnectError::new(Code::Canceled, format!("reading the request: {e}"));
                    return Some((Err(err), (data, decoder, done)));
                }
                None => {
                    done = true;
                    return match decoder.finish() {
                        Ok(()) => None,
                        Err(e) => Some((Err(e.into()), (data, decoder, done))),
                    };
                }
            }
        }
    })
    .boxed()
}

fn stream_headers() -> [(axum::http::HeaderName, &'static str); 2] {
    [(CONTENT_TYPE, STREAM_JSON), (CACHE_CONTROL, "no-store")]
}

/// A streamed response that is only an error.
pub fn stream_error(e: ConnectError) -> Response {
    let body = Envelope::end_of_stream(ConnectError::end_of_stream(Err(&e))).encode();
    (StatusCode::OK, stream_headers(), body).into_response()
}

/// A streamed response of `messages`: each `Ok` is one envelope; the first `Err` ends the
/// stream with that error; the end of `messages` ends it cleanly.
pub fn stream_response<M, S>(messages: S) -> Response
where
    M: Serialize + Send + 'static,
    S: Stream<Item = Result<M, ConnectError>> + Send + 'static,
{
    let frames = futures::stream::unfold(
        (Box::pin(messages), false),
        |(mut messages, ended)| async move {
            if ended {
                return None;
            }
            let (frame, ended) = match messages.next().await {
                Some(Ok(m)) => match serde_json::to_vec(&m) {
                    Ok(json) => (Envelope::message(json).encode(), false),
                    Err(e) => {
                        let e = ConnectError::new(Code::Internal, format!("encoding: {e}"));
                        (end_frame(Err(&e)), true)
                    }
                },
                Some(Err(e)) => (end_frame(Err(&e)), true),
                None => (end_frame(Ok(())), true),
            };
            Some((
                Ok::<Bytes, std::convert::Infallible>(frame),
                (messages, ended),
            ))
        },
    );
    (StatusCode::OK, stream_headers(), Body::from_stream(frames)).into_response()
}

fn end_frame(result: Result<(), &ConnectError>) -> Bytes {
    Envelope::end_of_stream(ConnectError::end_of_stream(result)).encode()
}

/// The response of a client-stream call: one message, then the end of the stream.
pub fn client_stream_response<M: Serialize>(result: Result<M, ConnectError>) -> Response {
    match result.and_then(|m| {
        serde_json::to_vec(&m)
            .map_err(|e| ConnectError::new(Code::Internal, format!("encoding: {e}")))
    }) {
        Ok(json) => {
            let mut body = Envelope::message(json).encode().to_vec();
            body.extend_from_slice(&end_frame(Ok(())));
            (StatusCode::OK, stream_headers(), body).into_response()
        }
        Err(e) => stream_error(e),
    }
}

/// The error that ends a stream at its deadline.
pub fn deadline_passed() -> ConnectError {
    ConnectError::new(Code::DeadlineExceeded, "the request's deadline passed")
}

/// `events` with a `keepalive()` message whenever nothing was sent for `every`, ending with
/// `deadline_exceeded` once `deadline` passes (if one is set).
pub fn with_keepalive_and_deadline<M, S>(
    events: S,
    every: Duration,
    deadline: Option<Duration>,
    keepalive: fn() -> M,
) -> BoxStream<'static, Result<M, ConnectError>>
where
    M: Send + 'static,
    S: Stream<Item = Result<M, ConnectError>> + Send + 'static,
{
    let end_at = deadline.map(|d| tokio::time::Instant::now() + d);
    let state = (Box::pin(events), false);
    futures::stream::unfold(state, move |(mut events, done)| async move {
        if done {
            return None;
        }
        let expired = async {
            match end_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            next = events.next() => next.map(|item| (item, (events, false))),
            () = tokio::time::sleep(every) => Some((Ok(keepalive()), (events, false))),
            () = expired => Some((Err(deadline_passed()), (events, true))),
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn deadlines_and_keepalives_are_bounded() {
        let mut h = HeaderMap::new();
        assert_eq!(deadline(&h).unwrap(), None);
        assert_eq!(keepalive(&h), DEFAULT_KEEPALIVE);
        h.insert(TIMEOUT_HEADER, HeaderValue::from_static("1500"));
        h.insert(KEEPALIVE_HEADER, HeaderValue::from_static("0"));
        assert_eq!(deadline(&h).unwrap(), Some(Duration::from_millis(1500)));
        assert_eq!(keepalive(&h), MIN_KEEPALIVE);
        h.insert(TIMEOUT_HEADER, HeaderValue::from_static("99999999999999"));
        assert!(deadline(&h).is_err());
        h.insert(TIMEOUT_HEADER, HeaderValue::from_static("9999999999"));
        assert_eq!(deadline(&h).unwrap(), Some(MAX_TIMEOUT));
    }

    #[tokio::test]
    async fn request_bodies_decode_into_envelopes_or_errors() {
        let mut wire = Envelope::message(&b"{\"a\":1}"[..]).encode().to_vec();
        wire.extend_from_slice(&[0, 0, 0]);
        let got: Vec<_> = envelopes(Body::from(wire)).collect().await;
        assert_eq!(got.len(), 2);
        assert!(got[0].is_ok());
        assert_eq!(got[1].as_ref().unwrap_err().code, Code::InvalidArgument);
        let huge = vec![0u8, 0xff, 0xff, 0xff, 0xff];
        let got: Vec<_> = envelopes(Body::from(huge)).collect().await;
        assert_eq!(got[0].as_ref().unwrap_err().code, Code::ResourceExhausted);
    }

    #[tokio::test]
    async fn streams_end_with_an_end_of_stream_envelope() {
        let ok = stream_response(futures::stream::iter(vec![Ok::<_, ConnectError>(1u32)]));
        let body = axum::body::to_bytes(ok.into_body(), 1024).await.unwrap();
        let mut d = EnvelopeDecoder::new();
        d.push(&body);
        assert_eq!(d.next_envelope().unwrap().unwrap().payload, &b"1"[..]);
        let end = d.next_envelope().unwrap().unwrap();
        assert!(end.is_end_of_stream());
        assert_eq!(end.payload, &b"{}"[..]);
        let err = stream_error(ConnectError::new(Code::NotFound, "x"));
        assert_eq!(err.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn quiet_streams_get_keepalives_and_end_at_the_deadline() {
        let events = futures::stream::pending::<Result<u32, ConnectError>>();
        let mut s = with_keepalive_and_deadline(
            events,
            Duration::from_millis(20),
            Some(Duration::from_millis(500)),
            || 0,
        );
        // Keepalives while nothing happens, then the deadline ends the stream (real time:
        // the counts are not asserted, only the order).
        let mut keepalives = 0;
        let end = loop {
            match s.next().await {
                Some(Ok(0)) => keepalives += 1,
                other => break other,
            }
        };
        assert!(keepalives >= 1);
        assert_eq!(end.unwrap().unwrap_err().code, Code::DeadlineExceeded);
        assert!(s.next().await.is_none());
    }
}
