//! The guest protocol through a node agent, and the node protocol's typed calls beside it.
//!
//! Across machines the control plane does not hold a sandbox's channel: the node agent does,
//! and relays the guest protocol's requests to it. Both ends are here, so the relay is the
//! guest protocol itself, with every bound of this crate, not a second protocol:
//!
//! - [`NodeConnection`] is the control plane's end: one HTTP/2 connection to a node agent
//!   (over mutual TLS, set up by the caller) that carries the guest calls of every sandbox
//!   of that node and the typed node calls. A [`GuestClient`] from
//!   [`NodeConnection::guest`] behaves as one on the channel; only its request paths are
//!   prefixed with the sandbox's relay route.
//! - [`GuestClient::forward`] is the agent's end: one request relayed as it comes, bodies
//!   streamed both ways as flow control allows, nothing buffered beyond h2's windows.

use std::io;
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::BoxStream;
use http::{HeaderMap, Method, Response};
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::error::GuestError;
use crate::query::Target;
use crate::transport::{self, Body, Transport};
use crate::{ClientOptions, GuestClient, Inner, Ready};

/// Response headers a relay passes on (the rest are hop-by-hop or the agent's own).
const RELAYED_HEADERS: [&str; 2] = ["content-type", space_guest_proto::routes::FILE_SIZE_HEADER];

/// The control plane's connection to one node agent. Cheap to clone; every clone and every
/// guest client made from it share the one HTTP/2 connection.
#[derive(Clone)]
pub struct NodeConnection {
    transport: Transport,
}

impl std::fmt::Debug for NodeConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeConnection")
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl NodeConnection {
    /// Starts HTTP/2 (prior knowledge, after the caller's TLS handshake) on `io`.
    pub async fn start<S>(io: S, opts: ClientOptions) -> Result<NodeConnection, GuestError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let deadline = opts.stream_open_timeout;
        let transport = match tokio::time::timeout(deadline, transport::start(io, opts)).await {
            Ok(r) => r?,
            Err(_) => return Err(GuestError::Timeout("starting HTTP/2 with the node".into())),
        };
        Ok(NodeConnection { transport })
    }

    /// True once the connection has ended (the next call needs a new one).
    pub fn is_closed(&self) -> bool {
        self.transport.closed_reason().is_some()
    }

    /// A guest client whose requests go to `prefix` + the guest route (the agent's relay
    /// route for one sandbox), with the daemon's `ready` as the agent reported it.
    pub fn guest(&self, prefix: String, ready: Ready) -> GuestClient {
        let mut transport = self.transport.clone();
        transport.prefix = Some(Arc::from(prefix));
        GuestClient {
            inner: Arc::new(Inner { transport, ready }),
        }
    }

    /// `POST path` with a JSON body, answered by JSON of at most `limit` bytes, within
    /// `timeout`. A non-2xx answer is a [`GuestError::Remote`] made of its `ErrorBody`.
    pub async fn post_json<T: DeserializeOwned + Send + 'static>(
        &self,
        path: &str,
        body: Bytes,
        limit: usize,
        timeout: std::time::Duration,
    ) -> Result<T, GuestError> {
        let mut transport = self.transport.clone();
        transport.opts.json_timeout = timeout;
        transport
            .json(Method::POST, Target::encoded(path), Body::Json(body), limit)
            .await
    }

    /// `GET path` answered by an NDJSON stream of `T`, lines of at most `max_line` bytes.
    pub async fn ndjson<T: DeserializeOwned + Send + 'static>(
        &self,
        path: &str,
        max_line: usize,
    ) -> Result<BoxStream<'static, Result<T, GuestError>>, GuestError> {
        let resp = self
            .transport
            .open_stream(Method::GET, Target::encoded(path))
            .await?;
        Ok(crate::stream::ndjson(
            resp.into_body(),
            self.transport.closed_rx(),
            max_line,
            "node event stream",
        ))
    }
}

/// A relayed answer: status, the headers worth passing on, the body as it comes.
pub type RelayedResponse = Response<BoxStream<'static, Result<Bytes, GuestError>>>;

impl GuestClient {
    /// Relays one request to the guest: `method` on `path_and_query` (already encoded, a
    /// guest route), the body streamed from `body` while the answer streams back, as flow
    /// control allows. The guest's answer is passed on whatever its status (its error body
    /// included); only the wait for the answer's head is timed. A body that fails midway
    /// resets the stream, so the guest never takes a truncated body for a whole one.
    pub async fn forward(
        &self,
        method: Method,
        path_and_query: &str,
        content_type: Option<&str>,
        body: BoxStream<'static, Result<Bytes, io::Error>>,
    ) -> Result<RelayedResponse, GuestError> {
        let transport = self.transport();
        let target = Target::encoded(path_and_query);
        let what = format!("{method} {path_and_query}");
        let limit = transport.opts.stream_open_timeout;
        let (resp_fut, mut send) = transport
            .with_timeout(
                limit,
                &what,
                transport.send_head(method, &target, content_type.unwrap_or(""), false),
            )
            .await?;
        // The body goes on in its own task: a duplex stream (a port connection) answers
        // before its request body ends, and that answer must reach the caller meanwhile.
        tokio::spawn(async move {
            if transport::pump(&mut send, body).await.is_err() {
                send.send_reset(h2::Reason::CANCEL);
            }
        });
        let resp = match tokio::time::timeout(limit, resp_fut).await {
            Ok(r) => r.map_err(|e| transport.fault(e))?,
            Err(_) => {
                return Err(GuestError::Timeout(format!(
                    "{what}: no answer within {limit:?}"
                )))
            }
        };
        let (parts, recv) = resp.into_parts();
        let mut headers = HeaderMap::new();
        for name in RELAYED_HEADERS {
            if let Some(v) = parts.headers.get(name) {
                headers.insert(name, v.clone());
            }
        }
        let mut out = Response::new(crate::stream::bytes(recv, transport.closed_rx()));
        *out.status_mut() = parts.status;
        *out.headers_mut() = headers;
        Ok(out)
    }
}

/// The `Ready` of a daemon as a node agent reports it (the nonce is the agent's business).
pub fn ready_of(version: u32, boot_id: String, daemon_version: String) -> Ready {
    Ready {
        version,
        nonce: String::new(),
        boot_id,
        daemon_version,
    }
}
