//! Stream plumbing of one guest connection: replaying the sniffed bytes ([`Prefixed`]),
//! counting bytes and activity ([`Metered`], [`Activity`]), the idle timeout ([`idle`]) and
//! the byte-for-byte splice of pass-through connections ([`splice`]), and the guard that
//! cuts a spliced stream carrying a credential placeholder ([`PlaceholderGuard`]).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use super::Counters;

/// When a connection last moved a byte in either direction (millisecond resolution).
#[derive(Debug)]
pub(super) struct Activity {
    base: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    pub(super) fn new() -> Arc<Activity> {
        Arc::new(Activity {
            base: Instant::now(),
            last_ms: AtomicU64::new(0),
        })
    }

    fn touch(&self) {
        let ms = u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.fetch_max(ms, Ordering::Relaxed);
    }

    fn last(&self) -> Instant {
        self.base + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }
}

/// A guest stream spliced to an address (no host name, so no credential can be injected):
/// reading the credential placeholder prefix from it is an error, so the stream is cut
/// before the placeholder goes upstream. The prefix is found across reads too (the last
/// bytes of each read are kept to be searched with the next).
#[derive(Debug)]
pub(super) struct PlaceholderGuard<S> {
    inner: S,
    /// Whether it looks at all (off: the stream passes as it is).
    enabled: bool,
    /// The end of what was read so far, at most the prefix's length less one.
    tail: Vec<u8>,
    /// Set once the prefix was seen.
    tripped: bool,
}

/// What [`PlaceholderGuard`] looks for.
const PLACEHOLDER_PREFIX: &[u8] = space_secrets::placeholder::PLACEHOLDER_PREFIX.as_bytes();

impl<S> PlaceholderGuard<S> {
    /// `inner`, looked at if `enabled`.
    pub(super) fn new(inner: S, enabled: bool) -> Self {
        PlaceholderGuard {
            inner,
            enabled,
            tail: Vec::with_capacity(PLACEHOLDER_PREFIX.len()),
            tripped: false,
        }
    }

    /// Whether the prefix was seen (the stream was cut).
    pub(super) fn tripped(&self) -> bool {
        self.tripped
    }

    /// Looks for the prefix in `bytes` following what was read before (never, disabled).
    pub(super) fn scan(&mut self, bytes: &[u8]) -> bool {
        if !self.enabled {
            return false;
        }
        let keep = PLACEHOLDER_PREFIX.len() - 1;
        let found = if self.tail.is_empty() {
            memchr::memmem::find(bytes, PLACEHOLDER_PREFIX).is_some()
        } else {
            // Only the seam needs the copy: the tail and the first bytes of this read.
            let mut seam = std::mem::take(&mut self.tail);
            seam.extend_from_slice(&bytes[..bytes.len().min(keep)]);
            memchr::memmem::find(&seam, PLACEHOLDER_PREFIX).is_some()
                || memchr::memmem::find(bytes, PLACEHOLDER_PREFIX).is_some()
        };
        let from = bytes.len().saturating_sub(keep);
        self.tail.clear();
        self.tail.extend_from_slice(&bytes[from..]);
        self.tripped |= found;
        found
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for PlaceholderGuard<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.tripped {
            return Poll::Ready(Err(placeholder_error()));
        }
        let before = buf.filled().len();
        let res = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = res {
            if self.scan(&buf.filled()[before..]) {
                // Not one byte of this read goes on.
                buf.set_filled(before);
                return Poll::Ready(Err(placeholder_error()));
            }
        }
        res
    }
}

fn placeholder_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        "credential placeholder in a stream to an address",
    )
}

impl<S: AsyncWrite + Unpin> AsyncWrite for PlaceholderGuard<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Completes once `activity` has seen no byte for `timeout`.
pub(super) async fn idle(activity: &Activity, timeout: Duration) {
    loop {
        let deadline = activity.last() + timeout;
        if Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep_until(deadline).await;
    }
}

/// The guest's stream, counting bytes read from it (up) and written to it (down) into the
/// sandbox's counters, and touching the connection's [`Activity`].
#[derive(Debug)]
pub(super) struct Metered<S> {
    inner: S,
    counters: Arc<Counters>,
    activity: Arc<Activity>,
}

impl<S> Metered<S> {
    pub(super) fn new(inner: S, counters: Arc<Counters>, activity: Arc<Activity>) -> Self {
        activity.touch();
        Metered {
            inner,
            counters,
            activity,
        }
    }

    fn wrote(&self, n: usize) {
        if n > 0 {
            self.counters.add_down(n);
            self.activity.touch();
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Metered<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len().saturating_sub(before);
        if n > 0 {
            self.counters.add_up(n);
            self.activity.touch();
        }
        poll
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Metered<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = poll {
            self.wrote(n);
        }
        poll
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = poll {
            self.wrote(n);
        }
        poll
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A stream that first yields `prefix` (the bytes already read to sniff the connection),
/// then reads from `inner`. Writes go straight to `inner`. This is how rustls and hyper see
/// the guest's stream from its first byte although the proxy has read some of it already.
#[derive(Debug)]
pub(super) struct Prefixed<S> {
    prefix: Vec<u8>,
    pos: usize,
    inner: S,
}

impl<S> Prefixed<S> {
    pub(super) fn new(prefix: Vec<u8>, inner: S) -> Self {
        Prefixed {
            prefix,
            pos: 0,
            inner,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.pos < this.prefix.len() {
            let rest = &this.prefix[this.pos..];
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            this.pos += n;
            if this.pos == this.prefix.len() {
                this.prefix = Vec::new();
                this.pos = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Buffer of each direction of a splice. tokio's default (8 KiB) costs a read and a write
/// per 8 KiB: the gateway benchmark measured +137 ms of CPU per 100 MiB passed through with
/// it, +36 ms with 256 KiB. 64 KiB keeps most of that gain at 128 KiB per connection.
const SPLICE_BUFFER: usize = 64 * 1024;

/// Copies both ways between the guest and upstream until both sides are done, either
/// fails, or nothing moved for `timeout` (the guest's stream carries every byte either
/// way, so its [`Activity`] is the connection's).
pub(super) async fn splice<G, U>(
    guest: &mut G,
    upstream: &mut U,
    activity: &Activity,
    timeout: Duration,
) -> io::Result<()>
where
    G: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    tokio::select! {
        copied = tokio::io::copy_bidirectional_with_sizes(guest, upstream, SPLICE_BUFFER, SPLICE_BUFFER) => copied.map(drop),
        () = idle(activity, timeout) => {
            tracing::debug!("egress: idle connection closed");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn the_guard_cuts_a_stream_at_a_placeholder_even_split_across_reads() {
        let text = b"GET /?k=space-placeholder-abcdefghijklmnopqrstuvwx HTTP/1.1\r\n\r\n";
        for split in 0..text.len() {
            let (mut a, b) = tokio::io::duplex(1024);
            let mut g = PlaceholderGuard::new(b, true);
            a.write_all(&text[..split]).await.unwrap();
            let mut got = vec![0u8; 1024];
            let mut seen = 0;
            if split > 0 {
                match g.read(&mut got).await {
                    Ok(n) => seen += n,
                    Err(_) => assert!(g.tripped()),
                }
            }
            a.write_all(&text[split..]).await.unwrap();
            drop(a);
            let mut rest = Vec::new();
            let err = g.read_to_end(&mut rest).await;
            assert!(err.is_err() && g.tripped(), "split {split}");
            // Never the whole prefix past the guard.
            assert!(
                seen + rest.len() < 8 + PLACEHOLDER_PREFIX.len(),
                "split {split}"
            );
        }
        // A stream without one passes whole.
        let (mut a, b) = tokio::io::duplex(1024);
        a.write_all(b"space-placeholder ssh banner").await.unwrap();
        drop(a);
        let mut out = Vec::new();
        PlaceholderGuard::new(b, true)
            .read_to_end(&mut out)
            .await
            .unwrap();
        assert_eq!(out, b"space-placeholder ssh banner");
    }

    #[tokio::test]
    async fn prefixed_replays_then_reads_on() {
        let (mut a, b) = tokio::io::duplex(64);
        a.write_all(b" world").await.unwrap();
        drop(a);
        let mut s = Prefixed::new(b"hello".to_vec(), b);
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.unwrap();
        assert_eq!(out, b"hello world");
    }

    #[tokio::test]
    async fn prefixed_respects_small_read_buffers() {
        let (_a, b) = tokio::io::duplex(64);
        let mut s = Prefixed::new(b"abcdef".to_vec(), b);
        let mut two = [0u8; 2];
        s.read_exact(&mut two).await.unwrap();
        assert_eq!(&two, b"ab");
        s.read_exact(&mut two).await.unwrap();
        assert_eq!(&two, b"cd");
        s.read_exact(&mut two).await.unwrap();
        assert_eq!(&two, b"ef");
    }

    #[tokio::test]
    async fn metered_counts_both_ways() {
        let counters = Arc::new(Counters::default());
        let (mut a, b) = tokio::io::duplex(64);
        let mut m = Metered::new(b, counters.clone(), Activity::new());
        a.write_all(b"12345").await.unwrap();
        let mut buf = [0u8; 5];
        m.read_exact(&mut buf).await.unwrap();
        m.write_all(b"abc").await.unwrap();
        let stats = counters.snapshot();
        assert_eq!((stats.bytes_up, stats.bytes_down), (5, 3));
    }

    #[tokio::test]
    async fn idle_waits_for_quiet() {
        let activity = Activity::new();
        let start = Instant::now();
        let toucher = async {
            for _ in 0..3 {
                tokio::time::sleep(Duration::from_millis(30)).await;
                activity.touch();
            }
        };
        tokio::join!(toucher, idle(&activity, Duration::from_millis(60)));
        // Quiet only after the last touch (~90 ms), then 60 ms more.
        assert!(
            start.elapsed() >= Duration::from_millis(140),
            "{:?}",
            start.elapsed()
        );
    }
}
