//! A byte stream that first replays bytes already read from it.
//!
//! The handshake reads in chunks, so the chunk holding the guest's READY line may also hold
//! the first HTTP/2 bytes (the guest's SETTINGS frame). Those bytes belong to HTTP/2: this
//! wrapper hands them out before reading from the stream again.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// `inner`, with `prefix` read first. Writes go straight to `inner`.
#[derive(Debug)]
pub struct Prefixed<S> {
    prefix: Bytes,
    inner: S,
}

impl<S> Prefixed<S> {
    /// Wraps `inner` so that reads return `prefix` first.
    pub fn new(prefix: Bytes, inner: S) -> Self {
        Self { prefix, inner }
    }

    /// Bytes of the prefix not read yet.
    pub fn remaining_prefix(&self) -> usize {
        self.prefix.len()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.prefix.is_empty() {
            let n = this.prefix.len().min(buf.remaining());
            buf.put_slice(&this.prefix[..n]);
            this.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn prefix_then_stream() {
        let (a, mut b) = tokio::io::duplex(64);
        let mut p = Prefixed::new(Bytes::from_static(b"head-"), a);
        b.write_all(b"tail").await.unwrap();
        drop(b);
        let mut small = [0u8; 3];
        p.read_exact(&mut small).await.unwrap();
        assert_eq!(&small, b"hea");
        assert_eq!(p.remaining_prefix(), 2);
        let mut rest = Vec::new();
        p.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, b"d-tail");
    }

    #[tokio::test]
    async fn writes_pass_through() {
        let (a, mut b) = tokio::io::duplex(64);
        let mut p = Prefixed::new(Bytes::from_static(b"x"), a);
        p.write_all(b"out").await.unwrap();
        let mut got = [0u8; 3];
        b.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"out");
    }
}
