//! Channel sessions: the handshake, then HTTP/2 until the session ends, then again.
//!
//! A virtio-serial port is one byte stream for the whole boot: host connections come and go
//! on it (a `read` returns 0 while no host is connected), so we loop handshake -> HTTP/2 ->
//! handshake forever. vsock and Unix sockets give one stream per host connection.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use bytes::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use space_guest_proto::limits;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::api::DAEMON_VERSION;
use crate::channel::Channel;
use crate::fdstream::{FdStream, Prefixed};
use crate::handshake::{Scanner, Step};
use crate::state::AppState;

/// Pause between reads of a virtio-serial port with no host connected (a guard; the port
/// bridge paces these reports itself).
const NO_HOST_POLL: Duration = Duration::from_millis(5);
/// A READY that cannot be written in this time means the host is gone.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// How a session ended before HTTP/2 started.
#[derive(Debug, thiserror::Error)]
enum HandshakeEnd {
    /// The peer closed the stream.
    #[error("peer closed the channel")]
    Closed,
    /// The peer sent something that is not the protocol after READY.
    #[error("peer sent garbage after READY")]
    Garbage,
    /// I/O error.
    #[error("channel I/O: {0}")]
    Io(#[from] io::Error),
}

/// Runs the handshake. With `persistent` (virtio-serial), EOF means "no host yet" and
/// garbage restarts the scan; otherwise both end the session.
async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    boot_id: &str,
    persistent: bool,
) -> Result<Bytes, HandshakeEnd> {
    let mut scanner = Scanner::new(boot_id, DAEMON_VERSION);
    let mut buf = vec![0u8; 4096];
    loop {
        match scanner.next_step() {
            Step::NeedMore => {
                let n = s.read(&mut buf).await?;
                if n == 0 {
                    if !persistent {
                        return Err(HandshakeEnd::Closed);
                    }
                    // No host connected: whatever we had buffered belonged to a gone host.
                    // (The port bridge already paces these reports; the pause is a guard.)
                    scanner = Scanner::new(boot_id, DAEMON_VERSION);
                    tokio::time::sleep(NO_HOST_POLL).await;
                    continue;
                }
                scanner.push(&buf[..n]);
            }
            Step::Reply(line) => {
                let write = async {
                    s.write_all(line.as_bytes()).await?;
                    s.flush().await
                };
                match tokio::time::timeout(REPLY_TIMEOUT, write).await {
                    Ok(Ok(())) => tracing::debug!(reply = line.trim_end(), "handshake reply"),
                    Ok(Err(e)) if !persistent => return Err(e.into()),
                    Ok(Err(e)) => tracing::warn!(error = %e, "handshake reply failed"),
                    Err(_) if !persistent => return Err(HandshakeEnd::Closed),
                    Err(_) => {
                        tracing::warn!("handshake reply timed out");
                        scanner = Scanner::new(boot_id, DAEMON_VERSION);
                    }
                }
            }
            Step::Start(prefix) => return Ok(prefix),
            Step::Garbage if persistent => {
                tracing::info!("garbage after READY; waiting for a new HELLO");
                scanner.reset();
            }
            Step::Garbage => return Err(HandshakeEnd::Garbage),
        }
    }
}

/// The HTTP/2 server settings shared by every session.
fn h2_builder() -> hyper::server::conn::http2::Builder<TokioExecutor> {
    let mut b = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    b.timer(TokioTimer::new())
        .max_concurrent_streams(limits::MAX_CONCURRENT_STREAMS)
        .max_frame_size(limits::MAX_FRAME_SIZE)
        .max_header_list_size(limits::MAX_HEADER_LIST_SIZE)
        .initial_stream_window_size(limits::STREAM_WINDOW)
        .initial_connection_window_size(limits::CONNECTION_WINDOW)
        .keep_alive_interval(Some(Duration::from_secs(limits::KEEPALIVE_INTERVAL_SECS)))
        .keep_alive_timeout(Duration::from_secs(limits::KEEPALIVE_TIMEOUT_SECS));
    b
}

/// Serves HTTP/2 on `io` (after the handshake) until the session ends.
async fn serve_h2<S: AsyncRead + AsyncWrite + Unpin>(io: Prefixed<S>, router: Router) {
    let svc = TowerToHyperService::new(router);
    match h2_builder().serve_connection(TokioIo::new(io), svc).await {
        Ok(()) => tracing::info!("session ended"),
        Err(e) => tracing::info!(error = %e, "session ended with an error"),
    }
}

/// One session on a per-connection stream (vsock, Unix socket).
async fn serve_stream<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    state: Arc<AppState>,
    router: Router,
) {
    match handshake(&mut s, &state.boot_id, false).await {
        Ok(prefix) => {
            tracing::info!("session started");
            serve_h2(Prefixed::new(prefix, s), router).await;
        }
        Err(e) => tracing::info!(error = %e, "session ended during handshake"),
    }
}

/// Serves the channel forever.
pub async fn serve(channel: Channel, state: Arc<AppState>, router: Router) -> io::Result<()> {
    match channel {
        Channel::VirtioSerial { path, fd } => {
            tracing::info!(port = %path.display(), "serving on virtio-serial port");
            let mut port = crate::portbridge::PortStream::new(fd)?;
            loop {
                match handshake(&mut port, &state.boot_id, true).await {
                    Ok(prefix) => {
                        tracing::info!("session started");
                        serve_h2(Prefixed::new(prefix, &mut port), router.clone()).await;
                    }
                    Err(e) => {
                        // Only I/O errors get here; do not spin on a broken port.
                        tracing::warn!(error = %e, "virtio-serial port error");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        }
        Channel::Vsock(listener) => {
            tracing::info!("serving on vsock");
            crate::fdstream::set_nonblocking(&listener)?;
            let listener = crate::fdstream::register(listener)?;
            loop {
                let conn = accept(&listener).await?;
                // One host connection at a time: a second host waits in the backlog.
                serve_stream(FdStream::new(conn)?, state.clone(), router.clone()).await;
            }
        }
        Channel::Unix(listener, path) => {
            tracing::info!(path = %path.display(), "serving on unix socket (development channel)");
            loop {
                let (conn, _) = listener.accept().await?;
                tokio::spawn(serve_stream(conn, state.clone(), router.clone()));
            }
        }
    }
}

async fn accept(listener: &AsyncFd<OwnedFd>) -> io::Result<OwnedFd> {
    loop {
        let mut guard = listener.readable().await?;
        let res = guard.try_io(|l| {
            // SAFETY: accept4 on our listening socket; we do not need the peer address.
            let fd = unsafe {
                libc::accept4(
                    l.get_ref().as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                )
            };
            if fd < 0 {
                Err(io::Error::last_os_error())
            } else {
                // SAFETY: fd was just returned by accept4.
                Ok(unsafe { OwnedFd::from_raw_fd(fd) })
            }
        });
        match res {
            Ok(Ok(fd)) => return Ok(fd),
            Ok(Err(e))
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR | libc::ECONNABORTED | libc::EMFILE | libc::ENFILE)
                ) =>
            {
                tracing::warn!(error = %e, "accept");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => {}
        }
    }
}
