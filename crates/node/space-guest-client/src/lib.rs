//! Node side of the private host-guest channel: connects to a sandbox's daemon and calls it.
//!
//! [`GuestClient::connect`] opens the host end of the channel (QEMU's virtio-serial chardev
//! socket, or `spaced agent --channel unix:…` in development), runs the text handshake
//! (`handshake.rs`), then speaks HTTP/2 with prior knowledge over the same stream
//! (`transport.rs`). The API methods (`processes.rs`, `files.rs`, `ports.rs`, `lifecycle.rs`)
//! map one-to-one onto the routes of `space_guest_proto::routes`.
//!
//! The guest is hostile. Everything read from it is bounded (handshake bytes, HTTP/2
//! frames, header lists and windows, JSON and error bodies, NDJSON lines) and parsed
//! defensively; a misbehaving guest fails its own client with [`GuestError::Protocol`] or
//! [`GuestError::Disconnected`], never the node. Every call that waits for the guest has a
//! timeout ([`ClientOptions`]); streams have none, but HTTP/2 keep-alive ends a connection
//! whose guest stops answering.

mod error;
mod files;
pub mod handshake;
mod lifecycle;
pub mod ndjson;
mod options;
mod ports;
pub mod prefixed;
mod processes;
mod query;
mod relay;
mod stream;
mod transport;

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::UnixStream;
use tokio::time::Instant;

pub use error::GuestError;
pub use options::{ClientOptions, MAX_ERROR_BODY, MAX_LISTING_BODY};
pub use ports::PortStream;
pub use relay::{ready_of, NodeConnection, RelayedResponse};
pub use space_guest_proto::handshake::Ready;
pub use space_guest_proto::{Activity, GuestConfig, GuestMetrics, Health, IdentityRequest};

use crate::prefixed::Prefixed;
use crate::transport::Transport;

/// Pause between attempts to reach a channel socket that is not there yet.
const CONNECT_RETRY: Duration = Duration::from_millis(50);

/// A connection to one sandbox's guest daemon. Cheap to clone; all clones share one
/// HTTP/2 connection, which closes when the last clone and the last open stream are dropped.
#[derive(Clone)]
pub struct GuestClient {
    inner: Arc<Inner>,
}

struct Inner {
    transport: Transport,
    ready: Ready,
}

impl std::fmt::Debug for GuestClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestClient")
            .field("ready", &self.inner.ready)
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl GuestClient {
    /// Connects to the Unix socket that is the host end of the channel, runs the handshake
    /// and starts HTTP/2, with default [`ClientOptions`]. `deadline` bounds the whole thing;
    /// until it passes, a socket that is missing or refuses (the VMM is starting) and a
    /// channel that closes during the handshake (the daemon restarted) are retried.
    pub async fn connect(socket: &Path, deadline: Duration) -> Result<GuestClient, GuestError> {
        Self::connect_with(socket, deadline, ClientOptions::default()).await
    }

    /// [`GuestClient::connect`] with explicit options.
    pub async fn connect_with(
        socket: &Path,
        deadline: Duration,
        opts: ClientOptions,
    ) -> Result<GuestClient, GuestError> {
        let end = Instant::now() + deadline;
        let mut last: String;
        loop {
            match tokio::time::timeout_at(end, UnixStream::connect(socket)).await {
                Err(_) => last = "connecting timed out".into(),
                Ok(Ok(stream)) => match Self::connect_stream_until(stream, end, opts.clone()).await
                {
                    Ok(client) => return Ok(client),
                    Err(GuestError::Disconnected(why)) => last = why,
                    Err(GuestError::Timeout(why)) => last = why,
                    Err(e) => return Err(e),
                },
                Ok(Err(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                    ) =>
                {
                    last = e.to_string();
                }
                Ok(Err(e)) => {
                    return Err(GuestError::Disconnected(format!(
                        "connecting to {}: {e}",
                        socket.display()
                    )))
                }
            }
            if Instant::now() + CONNECT_RETRY >= end {
                return Err(GuestError::Timeout(format!(
                    "guest channel {} not ready within {deadline:?} ({last})",
                    socket.display()
                )));
            }
            tracing::trace!(socket = %socket.display(), %last, "guest channel not ready, retrying");
            tokio::time::sleep(CONNECT_RETRY).await;
        }
    }

    /// Leaves the daemon waiting for a new handshake, then disconnects. A daemon may still be
    /// serving the HTTP/2 session of a host connection that just closed (on a virtio-serial
    /// port it learns of the close only when it next reads); a VM paused or saved in that
    /// moment would carry the stale session into its resume or restore, where it eats the
    /// next host's first HELLO. A completed handshake proves the stale session is over.
    /// Call it after dropping every client of the channel and before pausing or saving.
    pub async fn park(socket: &Path, deadline: Duration) -> Result<(), GuestError> {
        let end = Instant::now() + deadline;
        let mut stream = tokio::time::timeout_at(end, UnixStream::connect(socket))
            .await
            .map_err(|_| GuestError::Timeout("connecting to park the guest channel".into()))?
            .map_err(|e| {
                GuestError::Disconnected(format!("connecting to {}: {e}", socket.display()))
            })?;
        handshake::handshake(&mut stream, end).await.map(drop)
    }

    /// Runs the handshake and starts HTTP/2 on an already open byte stream (e.g. a
    /// Firecracker vsock connection after its `CONNECT` exchange). No retries.
    pub async fn connect_stream<S>(
        io: S,
        deadline: Duration,
        opts: ClientOptions,
    ) -> Result<GuestClient, GuestError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        Self::connect_stream_until(io, Instant::now() + deadline, opts).await
    }

    async fn connect_stream_until<S>(
        mut io: S,
        end: Instant,
        opts: ClientOptions,
    ) -> Result<GuestClient, GuestError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let hs = handshake::handshake(&mut io, end).await?;
        let io = Prefixed::new(hs.leftover, io);
        let transport = match tokio::time::timeout_at(end, transport::start(io, opts)).await {
            Ok(r) => r?,
            Err(_) => return Err(GuestError::Timeout("starting HTTP/2 with the guest".into())),
        };
        tracing::debug!(boot_id = %hs.ready.boot_id, daemon = %hs.ready.daemon_version, "guest channel up");
        Ok(GuestClient {
            inner: Arc::new(Inner {
                transport,
                ready: hs.ready,
            }),
        })
    }

    /// A handle on the same connection whose calls use other timeouts (e.g. a longer one
    /// for a `configure` that grows the root file system under TCG).
    pub fn with_timeouts(
        &self,
        json_timeout: Duration,
        stream_open_timeout: Duration,
    ) -> GuestClient {
        let mut transport = self.inner.transport.clone();
        transport.opts.json_timeout = json_timeout;
        transport.opts.stream_open_timeout = stream_open_timeout;
        GuestClient {
            inner: Arc::new(Inner {
                transport,
                ready: self.inner.ready.clone(),
            }),
        }
    }

    /// The guest's READY: boot id and daemon version.
    pub fn ready(&self) -> &Ready {
        &self.inner.ready
    }

    /// Resolves when the HTTP/2 connection has ended, with why: [`GuestError::Disconnected`]
    /// for EOF, a GOAWAY or an unanswered keep-alive; [`GuestError::Protocol`] when the guest
    /// violated HTTP/2 (garbage, oversize frames or headers, flow-control abuse).
    pub fn closed(&self) -> impl Future<Output = GuestError> + Send + 'static {
        let mut rx = self.inner.transport.closed_rx();
        async move {
            loop {
                let reason = rx.borrow_and_update().clone();
                if let Some(e) = reason {
                    return e;
                }
                if rx.changed().await.is_err() {
                    let reason = rx.borrow().clone();
                    return reason.unwrap_or_else(|| {
                        GuestError::Disconnected("the connection task ended".into())
                    });
                }
            }
        }
    }

    /// Ends the connection now: every open stream of every handle on it fails (output
    /// streams, downloads, uploads). The node does this before it pauses or parks a VM,
    /// since a stream still open then would keep the old session alive in the guest.
    pub fn close(&self) {
        self.inner.transport.close();
    }

    /// True once the HTTP/2 connection has ended.
    pub fn is_closed(&self) -> bool {
        self.inner.transport.closed_reason().is_some()
    }

    fn transport(&self) -> &Transport {
        &self.inner.transport
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send_sync<T: Send + Sync + Clone + 'static>() {}
    fn spawnable<F: Future + Send + 'static>(_: &F) {}

    #[allow(dead_code)]
    fn futures_are_spawnable(c: &GuestClient) {
        spawnable(&c.closed());
        spawnable(&{
            let c = c.clone();
            async move { c.health().await }
        });
        spawnable(&{
            let c = c.clone();
            async move { c.output(1, None).await }
        });
    }

    fn byte_stream<T: AsyncRead + AsyncWrite + Unpin + Send + 'static>() {}

    #[test]
    fn client_is_shareable() {
        send_sync::<GuestClient>();
        send_sync::<GuestError>();
        byte_stream::<PortStream>();
    }
}
