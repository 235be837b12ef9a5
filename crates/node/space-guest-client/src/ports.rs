//! Connections to TCP ports inside the guest (`POST /v1/ports/{port}/connect`): one HTTP/2
//! stream carries the connection both ways, wrapped as a byte stream ([`PortStream`]).
//!
//! Both directions are bounded: a read takes at most one received chunk from h2 (whose
//! window is returned only then, so a reader that stops reading stops the guest); a write
//! hands h2 only what the guest's window has room for (h2 buffers at most
//! `max_send_buffer_size` per stream), and waits otherwise.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use h2::{RecvStream, SendStream};
use http::Method;
use space_core::ErrorCode;
use space_guest_proto::routes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::error::GuestError;
use crate::query::Target;
use crate::transport::{fault, ClosedRx, MAX_SEND_PIECE};
use crate::GuestClient;

/// One TCP connection to a server in the guest. Reading gives what the server sends (EOF
/// once it closes); writing sends to it; `shutdown` half-closes the connection (the server
/// reads EOF and may still answer). Dropping it resets the stream, which closes the
/// connection in the guest.
pub struct PortStream {
    send: SendStream<Bytes>,
    recv: RecvStream,
    closed: ClosedRx,
    /// Received but not yet read.
    pending: Bytes,
    /// The write side has been ended.
    shut: bool,
}

impl std::fmt::Debug for PortStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortStream")
            .field("pending", &self.pending.len())
            .field("shut", &self.shut)
            .finish()
    }
}

fn io_error(e: GuestError) -> io::Error {
    let kind = if e.is_channel_fault() {
        io::ErrorKind::ConnectionAborted
    } else {
        io::ErrorKind::ConnectionReset
    };
    io::Error::new(kind, e)
}

impl PortStream {
    fn h2_error(&self, e: h2::Error) -> io::Error {
        io_error(fault(&self.closed, e))
    }
}

impl AsyncRead for PortStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.pending.is_empty() {
            match ready!(self.recv.poll_data(cx)) {
                // The server closed its side.
                None => return Poll::Ready(Ok(())),
                Some(Ok(chunk)) => {
                    let _ = self.recv.flow_control().release_capacity(chunk.len());
                    self.pending = chunk;
                }
                Some(Err(e)) => return Poll::Ready(Err(self.h2_error(e))),
            }
        }
        let n = buf.remaining().min(self.pending.len());
        let piece = self.pending.split_to(n);
        buf.put_slice(&piece);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for PortStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.shut {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        self.send.reserve_capacity(buf.len().min(MAX_SEND_PIECE));
        loop {
            let granted = self.send.capacity();
            if granted > 0 {
                let n = granted.min(buf.len());
                let piece = Bytes::copy_from_slice(&buf[..n]);
                return match self.send.send_data(piece, false) {
                    Ok(()) => Poll::Ready(Ok(n)),
                    Err(e) => Poll::Ready(Err(self.h2_error(e))),
                };
            }
            match ready!(self.send.poll_capacity(cx)) {
                Some(Ok(_)) => {}
                Some(Err(e)) => return Poll::Ready(Err(self.h2_error(e))),
                // No longer sendable: the guest reset the stream or the connection ended.
                None => return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // h2 sends what it was handed as soon as the connection task runs.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.shut {
            self.shut = true;
            if let Err(e) = self.send.send_data(Bytes::new(), true) {
                return Poll::Ready(Err(self.h2_error(e)));
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl GuestClient {
    /// `POST /v1/ports/{port}/connect`: a TCP connection to `127.0.0.1:{port}` (or
    /// `[::1]:{port}`) inside the guest. Nothing listening there is a
    /// [`GuestError::Remote`] with code `port_closed` (status 502, "port is not open");
    /// port 0 is refused locally. Only the wait for the connection is timed.
    pub async fn connect_port(&self, port: u16) -> Result<PortStream, GuestError> {
        if port == 0 {
            return Err(GuestError::local(
                ErrorCode::InvalidRequest,
                "port must be 1..=65535",
            ));
        }
        let target = Target::new(routes::port_connect(port));
        let (resp, send) = self.transport().open_duplex(Method::POST, target).await?;
        Ok(PortStream {
            send,
            recv: resp.into_body(),
            closed: self.transport().closed_rx(),
            pending: Bytes::new(),
            shut: false,
        })
    }
}
