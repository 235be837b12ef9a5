//! TCP connections to servers inside the guest, so the host can reach them
//! (`POST /v1/ports/{port}/connect`): the daemon connects to loopback and splices the
//! connection to the request's HTTP/2 stream.
//!
//! Architecture invariant: this is the one place the daemon opens a TCP socket, and it only
//! ever *connects*, to `127.0.0.1` or `[::1]`; it listens on no network socket.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use http_body_util::BodyExt;
use space_core::ErrorCode;
use space_guest_proto::limits::PORT_CONNECT_TIMEOUT_MS;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;

use crate::error::ApiError;

/// Bytes read from the connection at once (one response chunk).
const READ_CHUNK: usize = 16 * 1024;

/// The error for a port nothing listens on; the words "port is not open" are what clients
/// (the E2B SDKs among them) look for.
fn closed(port: u16, e: &io::Error) -> ApiError {
    ApiError::new(
        ErrorCode::PortClosed,
        format!(
            "port is not open: nothing in the sandbox accepts connections on port {port} ({e})"
        ),
    )
}

/// Connects to `127.0.0.1:{port}`, then `[::1]:{port}` if that is refused.
pub async fn connect(port: u16) -> Result<TcpStream, ApiError> {
    let attempt = async {
        let v4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
        let e = match TcpStream::connect(v4).await {
            Ok(s) => return Ok(s),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => e,
            Err(e) => return Err(closed(port, &e)),
        };
        let v6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), port);
        // Without IPv6 in the guest this fails too; IPv4's refusal is the answer then.
        TcpStream::connect(v6).await.map_err(|_| closed(port, &e))
    };
    let timeout = Duration::from_millis(PORT_CONNECT_TIMEOUT_MS);
    let stream = tokio::time::timeout(timeout, attempt).await.map_err(|_| {
        ApiError::new(
            ErrorCode::Timeout,
            format!("port {port} did not accept the connection within {timeout:?}"),
        )
    })??;
    // Interactive traffic (terminals, WebSockets) should not wait for Nagle.
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// Splices `tcp` to one HTTP/2 stream: `body` (the request's) is written to the connection
/// frame by frame, its end half-closes the write side; the returned stream (the response's
/// body) is what the connection sends, until it closes. `permit` is held until both
/// directions are done. Flow control bounds both: the next request frame is not read until
/// the last is written, and the connection is read only as the response is sent.
pub fn splice(
    tcp: TcpStream,
    body: Body,
    permit: OwnedSemaphorePermit,
) -> impl Stream<Item = io::Result<Bytes>> + Send + 'static {
    let permit = Arc::new(permit);
    let (read, write) = tcp.into_split();
    tokio::spawn(feed(body, write, permit.clone()));
    tokio_util::io::ReaderStream::with_capacity(read, READ_CHUNK).map(move |chunk| {
        let _held = &permit;
        chunk
    })
}

/// Writes the request body to the connection; at its end, half-closes it. A body that fails
/// (the host reset the stream) drops the write side.
async fn feed(mut body: Body, mut write: OwnedWriteHalf, _permit: Arc<OwnedSemaphorePermit>) {
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return;
        };
        if let Ok(data) = frame.into_data() {
            if write.write_all(&data).await.is_err() {
                return;
            }
        }
    }
    let _ = write.shutdown().await;
}
