//! Host side of the text handshake (see `space_guest_proto::handshake`): send HELLO with a
//! fresh nonce every [`HELLO_INTERVAL`] until the guest answers READY with that nonce.
//!
//! Everything before our READY is stale or garbage and is skipped, at most
//! `MAX_HANDSHAKE_DISCARD` bytes of it; lines are at most `MAX_HANDSHAKE_LINE` bytes. The
//! bytes after the READY line belong to HTTP/2 and are handed back. The scanner is pure;
//! the I/O loop works on any `AsyncRead + AsyncWrite` so tests can drive it over
//! `tokio::io::duplex`.

use std::future::poll_fn;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use space_guest_proto::handshake::{Hello, Ready, READY, REFUSED};
use space_guest_proto::limits::{MAX_HANDSHAKE_DISCARD, MAX_HANDSHAKE_LINE};
use space_guest_proto::PROTOCOL_VERSION;
use std::future::Future;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::time::Instant;

use crate::error::{sanitise, GuestError};

/// How often HELLO is repeated until the guest answers.
pub const HELLO_INTERVAL: Duration = Duration::from_millis(250);
/// First HELLO retry; retries double up to [`HELLO_INTERVAL`]. Kept at the full interval:
/// a resumed VM answers the first HELLO at once (the node parks the channel before pausing),
/// and after a restore from a live checkpoint the daemon's stale session eats the first
/// HELLO; fast retries there raced with that session's teardown ("frame with invalid
/// size" on the new session), which the full interval avoids in practice.
const FIRST_HELLO_RETRY: Duration = HELLO_INTERVAL;

/// A completed handshake.
#[derive(Debug, Clone)]
pub struct Handshake {
    /// The guest's READY.
    pub ready: Ready,
    /// Bytes read after the READY line: the start of the guest's HTTP/2 stream.
    pub leftover: Bytes,
}

/// What feeding bytes to the scanner found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scan {
    /// Not yet: everything fed so far was skipped (or is an unfinished line).
    Pending,
    /// Our READY, ending `consumed` bytes into the chunk just fed.
    Ready(Ready, usize),
}

/// Why the handshake failed on the guest's bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScanError {
    /// More than `MAX_HANDSHAKE_DISCARD` bytes arrived without our READY.
    #[error("no READY within {MAX_HANDSHAKE_DISCARD} bytes")]
    TooMuchGarbage,
    /// Our READY names a protocol version we do not speak.
    #[error("guest answered with protocol version {0}, expected {PROTOCOL_VERSION}")]
    Version(u32),
    /// The guest refused our protocol version.
    #[error("guest refused protocol version {PROTOCOL_VERSION}: {0}")]
    Refused(String),
}

/// Finds the READY line that answers our nonce in a byte stream, skipping the rest.
#[derive(Debug)]
pub struct ReadyScanner {
    nonce: String,
    line: Vec<u8>,
    /// Bytes skipped so far (complete lines that were not our READY).
    discarded: usize,
}

impl ReadyScanner {
    /// A scanner waiting for READY with `nonce`.
    pub fn new(nonce: &str) -> Self {
        Self {
            nonce: nonce.to_owned(),
            line: Vec::with_capacity(MAX_HANDSHAKE_LINE),
            discarded: 0,
        }
    }

    /// Feeds the next chunk of the stream.
    pub fn feed(&mut self, data: &[u8]) -> Result<Scan, ScanError> {
        for (i, &b) in data.iter().enumerate() {
            if b == b'\n' {
                let len = self.line.len() + 1;
                if let Some(ready) = self.check_line()? {
                    return Ok(Scan::Ready(ready, i + 1));
                }
                self.discarded += len;
                self.line.clear();
            } else {
                if self.line.len() + 1 >= MAX_HANDSHAKE_LINE {
                    // Keep only the tail: the unfinished output of an earlier session (a
                    // virtio-serial port outlives host connections) may precede READY on the
                    // same line, and a READY line always fits in the tail.
                    self.line.remove(0);
                    self.discarded += 1;
                }
                self.line.push(b);
            }
            if self.discarded + self.line.len() > MAX_HANDSHAKE_DISCARD {
                return Err(ScanError::TooMuchGarbage);
            }
        }
        Ok(Scan::Pending)
    }

    fn check_line(&self) -> Result<Option<Ready>, ScanError> {
        let ready_at = self
            .line
            .windows(READY.len())
            .rposition(|w| w == READY.as_bytes());
        if let Some(at) = ready_at {
            if let Some(ready) = Ready::parse(&self.line[at..]) {
                if ready.nonce.eq_ignore_ascii_case(&self.nonce) {
                    if ready.version != PROTOCOL_VERSION {
                        return Err(ScanError::Version(ready.version));
                    }
                    return Ok(Some(ready));
                }
            }
        } else if self.line.starts_with(REFUSED.as_bytes()) {
            // A refusal carries no nonce; a guest that speaks another version answers every
            // HELLO this way, so there is nothing to wait for.
            let text = String::from_utf8_lossy(&self.line).into_owned();
            return Err(ScanError::Refused(sanitise(text)));
        }
        Ok(None)
    }
}

/// Runs the handshake on `io` with a fresh random nonce; fails with
/// [`GuestError::Timeout`] at `deadline`.
pub async fn handshake<S>(io: &mut S, deadline: Instant) -> Result<Handshake, GuestError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let nonce = hex::encode(rand::random::<[u8; 16]>());
    handshake_with(io, &nonce, HELLO_INTERVAL, deadline).await
}

/// [`handshake`] with a given nonce and HELLO interval (tests).
pub async fn handshake_with<S>(
    io: &mut S,
    nonce: &str,
    interval: Duration,
    deadline: Instant,
) -> Result<Handshake, GuestError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    match tokio::time::timeout_at(deadline, exchange(io, nonce, interval)).await {
        Ok(result) => result,
        Err(_) => Err(GuestError::Timeout(
            "the guest did not answer the handshake in time".into(),
        )),
    }
}

async fn exchange<S>(io: &mut S, nonce: &str, interval: Duration) -> Result<Handshake, GuestError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let hello = Hello {
        version: PROTOCOL_VERSION,
        nonce: nonce.to_owned(),
    }
    .encode()
    .into_bytes();
    let mut scanner = ReadyScanner::new(nonce);
    // Bytes of the current HELLO already written; hello.len() when idle.
    let mut written = 0usize;
    let mut need_flush = false;
    // Retry fast at first, then back off to `interval`: a guest that was just resumed or
    // restored answers within milliseconds, but may miss a HELLO that arrived while its
    // port was not open yet; a booting guest needs seconds and only gets `interval`.
    let mut period = FIRST_HELLO_RETRY.min(interval);
    let mut retry = Box::pin(tokio::time::sleep(period));
    let mut buf = vec![0u8; 4096];

    // Reading, writing and the retry timer run in one poll loop so that a guest that does
    // not read (a full virtio-serial buffer while it boots) cannot stop us from reading its
    // READY, and a write is never torn by cancellation.
    let found = poll_fn(|cx| loop {
        while written < hello.len() {
            match Pin::new(&mut *io).poll_write(cx, &hello[written..]) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(GuestError::Disconnected(
                        "channel closed during handshake".into(),
                    )))
                }
                Poll::Ready(Ok(n)) => {
                    written += n;
                    need_flush = true;
                }
                Poll::Ready(Err(e)) => {
                    return Poll::Ready(Err(GuestError::Disconnected(format!(
                        "writing HELLO: {e}"
                    ))))
                }
                Poll::Pending => break,
            }
        }
        if need_flush && written == hello.len() {
            match Pin::new(&mut *io).poll_flush(cx) {
                Poll::Ready(Ok(())) => need_flush = false,
                Poll::Ready(Err(e)) => {
                    return Poll::Ready(Err(GuestError::Disconnected(format!(
                        "writing HELLO: {e}"
                    ))))
                }
                Poll::Pending => {}
            }
        }
        if retry.as_mut().poll(cx).is_ready() {
            period = (period * 2).min(interval);
            retry.as_mut().reset(Instant::now() + period);
            if written == hello.len() {
                written = 0;
            }
            continue;
        }
        let mut rb = ReadBuf::new(&mut buf);
        match Pin::new(&mut *io).poll_read(cx, &mut rb) {
            Poll::Ready(Ok(())) => {
                let filled = rb.filled();
                if filled.is_empty() {
                    return Poll::Ready(Err(GuestError::Disconnected(
                        "channel closed during handshake".into(),
                    )));
                }
                match scanner.feed(filled) {
                    Ok(Scan::Pending) => continue,
                    Ok(Scan::Ready(ready, consumed)) => {
                        let leftover = Bytes::copy_from_slice(&filled[consumed..]);
                        return Poll::Ready(Ok((Handshake { ready, leftover }, written)));
                    }
                    Err(e) => {
                        return Poll::Ready(Err(GuestError::protocol(format!("handshake: {e}"))))
                    }
                }
            }
            Poll::Ready(Err(e)) => {
                return Poll::Ready(Err(GuestError::Disconnected(format!(
                    "reading handshake: {e}"
                ))))
            }
            Poll::Pending => return Poll::Pending,
        }
    })
    .await;
    let (handshake, written) = found?;
    // A HELLO cut short would glue onto the HTTP/2 preface; finish the line first.
    if written < hello.len() {
        io.write_all(&hello[written..])
            .await
            .map_err(|e| GuestError::Disconnected(format!("writing HELLO: {e}")))?;
    }
    io.flush()
        .await
        .map_err(|e| GuestError::Disconnected(format!("writing HELLO: {e}")))?;
    Ok(handshake)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

    fn ready_line(nonce: &str) -> String {
        Ready {
            version: PROTOCOL_VERSION,
            nonce: nonce.into(),
            boot_id: "boot1".into(),
            daemon_version: "0.1.0".into(),
        }
        .encode()
    }

    #[test]
    fn scanner_skips_stale_and_foreign_lines() {
        let mut s = ReadyScanner::new("abcd");
        let mut input = Vec::new();
        input.extend_from_slice(b"\x00\x01garbage\n");
        input.extend_from_slice(ready_line("ffff").as_bytes());
        input.extend_from_slice(b"SPACE-READY 1 abcd bad\ttoken x\n");
        let good = ready_line("abcd");
        input.extend_from_slice(good.as_bytes());
        input.extend_from_slice(b"PRI * HTTP/2.0");
        let (first, second) = input.split_at(7);
        assert_eq!(s.feed(first), Ok(Scan::Pending));
        match s.feed(second).unwrap() {
            Scan::Ready(r, consumed) => {
                assert_eq!(r.boot_id, "boot1");
                assert_eq!(&second[consumed..], b"PRI * HTTP/2.0");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn scanner_bounds_garbage() {
        let mut s = ReadyScanner::new("abcd");
        let chunk = vec![b'x'; 1000];
        let mut result = Ok(Scan::Pending);
        for _ in 0..100 {
            result = s.feed(&chunk);
            if result.is_err() {
                break;
            }
        }
        assert_eq!(result, Err(ScanError::TooMuchGarbage));
        // Many short lines count too.
        let mut s = ReadyScanner::new("abcd");
        let lines = b"nope\n".repeat(MAX_HANDSHAKE_DISCARD / 5 + 1);
        assert_eq!(s.feed(&lines), Err(ScanError::TooMuchGarbage));
    }

    #[test]
    fn scanner_finds_ready_after_stale_bytes_on_the_same_line() {
        // What a port shows after a host reconnects: the tail of the last session's HTTP/2
        // frames, no newline, then READY.
        let mut s = ReadyScanner::new("abcd");
        let mut line = vec![0u8, 0, 8, 7, 0, 0, 0, 0, 0];
        line.extend(std::iter::repeat_n(b'x', 3 * MAX_HANDSHAKE_LINE));
        line.extend_from_slice(ready_line("abcd").as_bytes());
        match s.feed(&line).unwrap() {
            Scan::Ready(r, used) => {
                assert_eq!(r.nonce, "abcd");
                assert_eq!(used, line.len());
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn scanner_rejects_wrong_version_and_refusal() {
        let mut s = ReadyScanner::new("abcd");
        assert_eq!(
            s.feed(b"SPACE-READY 7 abcd b v\n"),
            Err(ScanError::Version(7))
        );
        let mut s = ReadyScanner::new("abcd");
        assert!(matches!(
            s.feed(space_guest_proto::handshake::refused(2).as_bytes()),
            Err(ScanError::Refused(_))
        ));
    }

    #[tokio::test]
    async fn handshake_over_duplex_with_stale_data() {
        let (mut host, guest) = tokio::io::duplex(1024);
        let peer = tokio::spawn(async move {
            let mut guest = BufReader::new(guest);
            // Stale bytes and answers to an earlier host before anything is read.
            guest
                .get_mut()
                .write_all(b"\x17\x03junk from an old session\n")
                .await
                .unwrap();
            guest
                .get_mut()
                .write_all(ready_line("0123").as_bytes())
                .await
                .unwrap();
            let mut line = String::new();
            guest.read_line(&mut line).await.unwrap();
            let hello = Hello::parse(line.trim_end().as_bytes()).unwrap();
            guest
                .get_mut()
                .write_all(ready_line("99").as_bytes())
                .await
                .unwrap();
            let mut out = ready_line(&hello.nonce).into_bytes();
            out.extend_from_slice(b"H2-BYTES");
            guest.get_mut().write_all(&out).await.unwrap();
            guest
        });
        let hs = handshake(&mut host, Instant::now() + Duration::from_secs(30))
            .await
            .unwrap();
        assert_eq!(hs.ready.daemon_version, "0.1.0");
        let mut rest = hs.leftover.to_vec();
        let _guest = peer.await.unwrap();
        while rest.len() < 8 {
            let mut b = [0u8; 8];
            let n = host.read(&mut b).await.unwrap();
            rest.extend_from_slice(&b[..n]);
        }
        assert_eq!(rest, b"H2-BYTES");
    }

    #[tokio::test]
    async fn hello_is_repeated_until_answered() {
        let (mut host, guest) = tokio::io::duplex(1024);
        let peer = tokio::spawn(async move {
            let mut guest = BufReader::new(guest);
            let mut line = String::new();
            // Ignore the first two HELLOs (a guest still booting), answer the third.
            for _ in 0..3 {
                line.clear();
                guest.read_line(&mut line).await.unwrap();
            }
            let hello = Hello::parse(line.trim_end().as_bytes()).unwrap();
            guest
                .get_mut()
                .write_all(ready_line(&hello.nonce).as_bytes())
                .await
                .unwrap();
            guest
        });
        let hs = handshake_with(
            &mut host,
            "abc123",
            Duration::from_millis(10),
            Instant::now() + Duration::from_secs(30),
        )
        .await
        .unwrap();
        assert_eq!(hs.ready.nonce, "abc123");
        assert!(hs.leftover.is_empty());
        drop(peer.await.unwrap());
    }

    #[tokio::test]
    async fn endless_garbage_is_a_protocol_error() {
        let (mut host, mut guest) = tokio::io::duplex(64 * 1024);
        let peer = tokio::spawn(async move {
            let chunk = vec![b'z'; 8192];
            // No newline, ever. Stops when the host goes away.
            while guest.write_all(&chunk).await.is_ok() {}
        });
        let err = handshake(&mut host, Instant::now() + Duration::from_secs(60))
            .await
            .unwrap_err();
        assert!(matches!(err, GuestError::Protocol(_)), "{err:?}");
        drop(host);
        peer.await.unwrap();
    }

    #[tokio::test]
    async fn silent_peer_times_out() {
        let (mut host, _guest) = tokio::io::duplex(64 * 1024);
        let err = handshake_with(
            &mut host,
            "ab",
            Duration::from_millis(5),
            Instant::now() + Duration::from_millis(200),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, GuestError::Timeout(_)), "{err:?}");
    }

    #[tokio::test]
    async fn peer_that_never_reads_still_times_out() {
        // A 16-byte pipe fills with the first HELLO: writes stay pending, the deadline still holds.
        let (mut host, _guest) = tokio::io::duplex(16);
        let err = handshake_with(
            &mut host,
            "ab",
            Duration::from_millis(5),
            Instant::now() + Duration::from_millis(200),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, GuestError::Timeout(_)), "{err:?}");
    }

    #[tokio::test]
    async fn closed_peer_is_disconnected() {
        let (mut host, guest) = tokio::io::duplex(1024);
        drop(guest);
        let err = handshake(&mut host, Instant::now() + Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(err, GuestError::Disconnected(_)), "{err:?}");
    }

    #[tokio::test]
    async fn answer_arriving_while_hello_write_is_blocked() {
        // The guest answers before reading anything; our HELLO write is stuck half-way in a
        // tiny pipe. The handshake must complete the HELLO line before returning.
        let (mut host, guest) = tokio::io::duplex(8);
        let peer = tokio::spawn(async move {
            let mut guest = guest;
            guest
                .write_all(ready_line("abcdef").as_bytes())
                .await
                .unwrap();
            let mut all = Vec::new();
            let mut b = [0u8; 64];
            loop {
                let n = guest.read(&mut b).await.unwrap();
                if n == 0 {
                    break;
                }
                all.extend_from_slice(&b[..n]);
            }
            all
        });
        let hs = handshake_with(
            &mut host,
            "abcdef",
            Duration::from_secs(60),
            Instant::now() + Duration::from_secs(30),
        )
        .await
        .unwrap();
        assert_eq!(hs.ready.nonce, "abcdef");
        drop(host);
        let written = peer.await.unwrap();
        assert!(written.ends_with(b"\n"));
        assert_eq!(
            String::from_utf8(written).unwrap(),
            Hello {
                version: 1,
                nonce: "abcdef".into()
            }
            .encode()
        );
    }
}
