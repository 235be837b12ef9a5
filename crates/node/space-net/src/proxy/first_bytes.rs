//! Reading a guest connection's first bytes until [`crate::sniff`] can say what it is for
//! (bounded in time and size), or until it is clear that no host name will come.

use std::io;
use std::time::Duration;

use space_core::egress::{Hostname, HostnameError};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::time::Instant;

use crate::sniff::{Progress, SniffError, Sniffed, Sniffer, MAX_HTTP_HEAD_LEN};

/// Bytes read from the guest per read call while sniffing.
const READ_CHUNK: usize = 4096;

/// What the first bytes of a guest stream said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum FirstBytes {
    /// A TLS ClientHello naming one valid host.
    Tls {
        /// The server name.
        sni: Hostname,
        /// The ALPN ids offered.
        alpn: Vec<String>,
    },
    /// An HTTP/1 request head with a valid `Host`.
    Http {
        /// The `Host` name.
        host: Hostname,
        /// The `Host` port, if any.
        port: Option<u16>,
    },
    /// An HTTP/1 `CONNECT` request.
    Connect,
    /// A stream without a usable host name.
    Unnamed(Unnamed),
}

/// Why a stream has no usable host name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unnamed {
    /// The guest sent nothing within the wait (a protocol where the server speaks first).
    #[error("the guest sent nothing")]
    Silent,
    /// The guest closed before the stream could be classified.
    #[error("the guest closed the connection early")]
    Closed,
    /// The first line is not an HTTP request line (an SSH banner, say).
    #[error("neither TLS nor HTTP")]
    NotHttp,
    /// The cleartext HTTP/2 prior-knowledge preface: the host is only inside HPACK-coded
    /// frames, which the proxy does not decode.
    #[error("cleartext HTTP/2 (prior knowledge)")]
    H2PriorKnowledge,
    /// Nothing decisive before the sniff timeout.
    #[error("nothing decisive within the sniff timeout")]
    Timeout,
    /// The sniffer refused the bytes.
    #[error("{error}")]
    Unparsable {
        /// The sniffer's error (never echoes guest bytes).
        error: String,
        /// The host was an IP address literal (or TLS carried none).
        ip_literal: bool,
    },
}

/// The bytes read and what they said.
#[derive(Debug)]
pub(super) struct First {
    /// Everything read from the guest so far, to be replayed verbatim.
    pub(super) buf: Vec<u8>,
    pub(super) what: FirstBytes,
}

impl First {
    /// Whether a refusal should be answered with an HTTP/1 response: the stream starts with
    /// what looks like an HTTP/1 request line.
    pub(super) fn looks_like_http1(&self) -> bool {
        match &self.what {
            FirstBytes::Http { .. } | FirstBytes::Connect => true,
            FirstBytes::Tls { .. } => false,
            FirstBytes::Unnamed(_) => first_line(&self.buf).is_some_and(is_http1_request_line),
        }
    }
}

/// Reads from `stream` until the sniffer decides, it is clear no host name is coming, the
/// guest closes, or `timeout` passes. With `silent_wait`, a guest that sends nothing at all
/// for that long is taken as a server-speaks-first protocol (the caller passes it only when
/// the destination may be reached without a name anyway).
pub(super) async fn read<S: AsyncRead + Unpin>(
    stream: &mut S,
    timeout: Duration,
    silent_wait: Option<Duration>,
) -> io::Result<First> {
    let start = Instant::now();
    let deadline = start + timeout;
    let mut buf = Vec::new();
    let mut sniffer = Sniffer::new();
    let mut chunk = [0u8; READ_CHUNK];
    loop {
        let until = match silent_wait {
            Some(wait) if buf.is_empty() => deadline.min(start + wait),
            _ => deadline,
        };
        let n = match tokio::time::timeout_at(until, stream.read(&mut chunk)).await {
            Err(_) if buf.is_empty() && until < deadline => {
                return Ok(unnamed(buf, Unnamed::Silent))
            }
            Err(_) => return Ok(unnamed(buf, Unnamed::Timeout)),
            Ok(Err(e)) => return Err(e),
            Ok(Ok(0)) => return Ok(unnamed(buf, Unnamed::Closed)),
            Ok(Ok(n)) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        match sniffer.sniff(&buf) {
            Ok(Progress::Done { sniffed, .. }) => {
                let what = classify(sniffed);
                return Ok(First { buf, what });
            }
            Ok(Progress::NeedMore) => {
                // The sniffer waits for a blank line that a non-HTTP protocol starting with
                // a letter (an SSH banner) never sends: decide on the first line instead.
                let starts_alpha = buf.first().is_some_and(u8::is_ascii_alphabetic);
                if starts_alpha && first_line(&buf).is_some_and(|line| !is_http_request_line(line))
                {
                    return Ok(unnamed(buf, Unnamed::NotHttp));
                }
            }
            Err(error) => {
                let ip_literal = is_ip_literal_error(&error);
                let what = Unnamed::Unparsable {
                    error: error.to_string(),
                    ip_literal,
                };
                return Ok(unnamed(buf, what));
            }
        }
    }
}

fn unnamed(buf: Vec<u8>, why: Unnamed) -> First {
    First {
        buf,
        what: FirstBytes::Unnamed(why),
    }
}

fn classify(sniffed: Sniffed) -> FirstBytes {
    match sniffed {
        Sniffed::Tls { sni, alpn } => FirstBytes::Tls { sni, alpn },
        Sniffed::Http1 {
            is_connect: true, ..
        } => FirstBytes::Connect,
        Sniffed::Http1 { host, port, .. } => FirstBytes::Http { host, port },
        Sniffed::H2PriorKnowledge => FirstBytes::Unnamed(Unnamed::H2PriorKnowledge),
    }
}

/// Errors that mean "an address instead of a name" (or no name at all in TLS).
fn is_ip_literal_error(error: &SniffError) -> bool {
    matches!(
        error,
        SniffError::MissingSni
            | SniffError::InvalidSni(HostnameError::IpLiteral)
            | SniffError::InvalidHostname(HostnameError::IpLiteral)
            | SniffError::InvalidHost("IP literal")
    )
}

/// The first line (without its line ending) once it is complete, within the head bound.
fn first_line(buf: &[u8]) -> Option<&[u8]> {
    let window = &buf[..buf.len().min(MAX_HTTP_HEAD_LEN)];
    let end = window.iter().position(|&b| b == b'\n')?;
    let line = &window[..end];
    Some(line.strip_suffix(b"\r").unwrap_or(line))
}

/// `METHOD SP target SP HTTP/1.x`, or the HTTP/2 preface's first line.
fn is_http_request_line(line: &[u8]) -> bool {
    is_http1_request_line(line) || line == b"PRI * HTTP/2.0"
}

fn is_http1_request_line(line: &[u8]) -> bool {
    line.ends_with(b" HTTP/1.1") || line.ends_with(b" HTTP/1.0")
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;

    use super::*;

    async fn read_bytes(bytes: &[u8], silent: Option<Duration>) -> First {
        let (mut guest, mut proxy) = tokio::io::duplex(1 << 16);
        guest.write_all(bytes).await.unwrap();
        read(&mut proxy, Duration::from_secs(10), silent)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn an_http_head_is_named() {
        let first = read_bytes(b"GET / HTTP/1.1\r\nHost: a.example.com:8080\r\n\r\n", None).await;
        assert_eq!(
            first.what,
            FirstBytes::Http {
                host: Hostname::parse("a.example.com").unwrap(),
                port: Some(8080)
            }
        );
        assert!(first.looks_like_http1());
    }

    #[tokio::test]
    async fn an_ssh_banner_is_decided_on_its_first_line() {
        let first = read_bytes(b"SSH-2.0-OpenSSH_9.6\r\n", None).await;
        assert_eq!(first.what, FirstBytes::Unnamed(Unnamed::NotHttp));
        assert!(!first.looks_like_http1());
        assert_eq!(first.buf, b"SSH-2.0-OpenSSH_9.6\r\n");
    }

    #[tokio::test]
    async fn an_ip_literal_host_is_unnamed() {
        let first = read_bytes(b"GET / HTTP/1.1\r\nHost: 10.0.0.1\r\n\r\n", None).await;
        assert!(matches!(
            first.what,
            FirstBytes::Unnamed(Unnamed::Unparsable {
                ip_literal: true,
                ..
            })
        ));
        assert!(first.looks_like_http1());
    }

    #[tokio::test]
    async fn h2_prior_knowledge_is_unnamed() {
        let first = read_bytes(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", None).await;
        assert_eq!(first.what, FirstBytes::Unnamed(Unnamed::H2PriorKnowledge));
    }

    const SHORT: Duration = Duration::from_millis(50);
    const LONGER: Duration = Duration::from_millis(300);

    #[tokio::test]
    async fn silence_is_bounded() {
        let (_guest, mut proxy) = tokio::io::duplex(64);
        let start = Instant::now();
        let first = read(&mut proxy, LONGER, Some(SHORT)).await.unwrap();
        assert_eq!(first.what, FirstBytes::Unnamed(Unnamed::Silent));
        assert!(start.elapsed() < LONGER);
        let first = read(&mut proxy, SHORT, None).await.unwrap();
        assert_eq!(first.what, FirstBytes::Unnamed(Unnamed::Timeout));
    }

    #[tokio::test]
    async fn a_partial_hello_times_out() {
        let (mut guest, mut proxy) = tokio::io::duplex(64);
        guest.write_all(&[22, 3, 1, 0, 200, 1]).await.unwrap();
        let first = read(&mut proxy, LONGER, Some(SHORT)).await.unwrap();
        assert_eq!(first.what, FirstBytes::Unnamed(Unnamed::Timeout));
        assert_eq!(first.buf.len(), 6);
    }

    #[tokio::test]
    async fn garbage_is_unparsable() {
        let first = read_bytes(b"\x00\x01\x02", None).await;
        assert!(matches!(
            first.what,
            FirstBytes::Unnamed(Unnamed::Unparsable {
                ip_literal: false,
                ..
            })
        ));
    }
}
