//! What a guest's TCP stream is for, decided from the first bytes the guest sends.
//!
//! Every TCP connection a sandbox opens lands on the node's transparent proxy, which must
//! name the host the connection is for before it connects anywhere: the TLS ClientHello's
//! `server_name`, or the HTTP/1 `Host` header. Those bytes come from a hostile guest, so
//! parsing is bounded and fails closed: anything ambiguous (two names, a name we cannot see,
//! structures that do not add up) is an error, never a best guess.
//!
//! The caller owns the bytes. It appends what it reads to its own buffer and hands the whole
//! buffer to [`Sniffer::sniff`] each time; the sniffer only reads it, so in pass-through mode
//! the proxy replays that buffer upstream verbatim. The sniffer keeps just enough state (how
//! far TLS records have been walked, the reassembled handshake bytes, how far the HTTP head
//! terminator has been searched) that each call looks only at the new bytes.
//!
//! Structure parsing uses `tls-parser` (ClientHello body, extension framing, `server_name`
//! and ALPN contents) and `httparse` (request heads); TLS record reassembly, the bounds and
//! the strictness checks those crates leave out (trailing bytes, duplicate extensions, entry
//! counts) are ours.

use std::collections::HashSet;

use space_core::egress::{Hostname, HostnameError};
use tls_parser::{SNIType, TlsExtension, TlsExtensionType};

/// Most bytes of a TLS stream (record headers included) read before the ClientHello must be
/// complete. Real ClientHellos are well under 2 KiB (about 8 KiB with large post-quantum key
/// shares and padding); 64 KiB leaves room for anything legitimate while bounding what a guest
/// can make us buffer, including a hello cut into many tiny records.
pub const MAX_TLS_HELLO_LEN: usize = 64 * 1024;

/// Most bytes of an HTTP/1 request head (request line, headers, blank line). Common servers
/// refuse heads over 8–16 KiB, so nothing legitimate is lost.
pub const MAX_HTTP_HEAD_LEN: usize = 16 * 1024;

/// Most header fields in an HTTP/1 request head; more is an error.
pub const MAX_HTTP_HEADERS: usize = 100;

/// Most bytes the sniffer may need before it decides: a caller can stop reading into its
/// buffer past this (plus whatever its last read brought).
pub const MAX_SNIFF_LEN: usize = if MAX_TLS_HELLO_LEN > MAX_HTTP_HEAD_LEN {
    MAX_TLS_HELLO_LEN
} else {
    MAX_HTTP_HEAD_LEN
};

/// The HTTP/2 connection preface a client sends first with prior knowledge (RFC 9113 §3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// TLS record header: content type (1), legacy version (2), length (2).
const TLS_RECORD_HEADER_LEN: usize = 5;
/// Largest plaintext record fragment (RFC 8446 §5.1).
const MAX_TLS_FRAGMENT_LEN: usize = 1 << 14;
/// Handshake message header: type (1), length (3).
const HANDSHAKE_HEADER_LEN: usize = 4;

/// TLS record content types (RFC 8446 §5.1, RFC 6520).
const CONTENT_CHANGE_CIPHER_SPEC: u8 = 20;
const CONTENT_ALERT: u8 = 21;
const CONTENT_HANDSHAKE: u8 = 22;
const CONTENT_APPLICATION_DATA: u8 = 23;
const CONTENT_HEARTBEAT: u8 = 24;
/// Major version byte of every TLS (and SSLv3) record.
const TLS_MAJOR_VERSION: u8 = 3;
/// Highest minor version a record header may carry (TLS 1.3 keeps 0x0303, but 0x0304 is harmless).
const MAX_TLS_MINOR_VERSION: u8 = 4;
/// Handshake type of ClientHello.
const HANDSHAKE_CLIENT_HELLO: u8 = 1;

/// Extension types we look at (IANA "TLS ExtensionType Values").
const EXT_SERVER_NAME: u16 = 0;
const EXT_ALPN: u16 = 16;
/// `encrypted_client_hello` (RFC 9849): the real name is in an inner hello we cannot read.
const EXT_ENCRYPTED_CLIENT_HELLO: u16 = 0xfe0d;
/// The draft ESNI extension, same problem.
const EXT_ENCRYPTED_SERVER_NAME: u16 = 0xffce;

/// Default ports used to compare an absolute-form request target with the Host header.
const HTTP_DEFAULT_PORT: u16 = 80;
const HTTPS_DEFAULT_PORT: u16 = 443;
/// Most digits in a port number (65535).
const MAX_PORT_DIGITS: usize = 5;

/// What a stream turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sniffed {
    /// A TLS ClientHello naming exactly one host.
    Tls {
        /// The `server_name` (SNI) host.
        sni: Hostname,
        /// The ALPN protocol ids offered, in the client's order (GREASE values left out).
        alpn: Vec<String>,
    },
    /// A plaintext HTTP/1.x request.
    Http1 {
        /// The `Host` header's host.
        host: Hostname,
        /// The `Host` header's port, if it named one.
        port: Option<u16>,
        /// The request method, as sent (methods are case-sensitive).
        method: String,
        /// `CONNECT`: the guest asks us to tunnel; the proxy refuses it.
        is_connect: bool,
    },
    /// The HTTP/2 prior-knowledge preface: the host is only in HPACK-coded frames after it.
    H2PriorKnowledge,
}

/// The result of one [`Sniffer::sniff`] call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// Not enough bytes yet: read more, append, call again.
    NeedMore,
    /// Decided.
    Done {
        /// What the stream is.
        sniffed: Sniffed,
        /// How many bytes at the start of the buffer the decision rests on (the whole
        /// ClientHello's records, the HTTP head, the preface). The caller replays the whole
        /// buffer, including bytes past this, verbatim.
        consumed: usize,
    },
}

/// Why a stream was refused. Every error is final: the connection should be closed.
#[derive(Debug, thiserror::Error)]
pub enum SniffError {
    /// The buffer passed was shorter than one passed before: a caller bug.
    #[error("sniff buffer shrank from {seen} to {now} bytes")]
    BufferShrank {
        /// Length seen by the previous call.
        seen: usize,
        /// Length of this call's buffer.
        now: usize,
    },
    /// `sniff` was called after it had already returned `Done` or an error.
    #[error("sniffer already finished")]
    Finished,
    /// The first byte starts neither TLS nor HTTP.
    #[error("unrecognised protocol (first byte {0:#04x})")]
    Unrecognized(u8),
    /// An SSLv2-style (two-byte header with the high bit set) hello.
    #[error("SSLv2-style hello")]
    Sslv2Hello,
    /// A TLS record other than handshake before the ClientHello was complete.
    #[error("TLS record of content type {0} before the ClientHello was complete")]
    NotHandshake(u8),
    /// A TLS record header that cannot be right.
    #[error("malformed TLS record: {0}")]
    MalformedRecord(&'static str),
    /// The first handshake message is not a ClientHello.
    #[error("first handshake message has type {0}, not ClientHello")]
    NotClientHello(u8),
    /// The stream would exceed a documented bound before we could decide.
    #[error("more than {limit} bytes before the {what} was complete")]
    TooLong {
        /// What was being read.
        what: &'static str,
        /// The bound in bytes.
        limit: usize,
    },
    /// More handshake bytes followed the ClientHello in the records that carried it.
    #[error("handshake data after the ClientHello")]
    TrailingHandshakeData,
    /// The ClientHello's structure does not parse or does not add up.
    #[error("malformed ClientHello: {0}")]
    MalformedClientHello(&'static str),
    /// An extension type appears twice.
    #[error("duplicate TLS extension {0:#06x}")]
    DuplicateExtension(u16),
    /// No `server_name` extension.
    #[error("ClientHello has no server_name")]
    MissingSni,
    /// The `server_name` list does not hold exactly one entry.
    #[error("server_name lists {0} names, not exactly one")]
    SniEntryCount(usize),
    /// The `server_name` entry is not of type `host_name`.
    #[error("server_name entry of type {0}, not host_name")]
    SniNameType(u8),
    /// The `server_name` is not a valid host name.
    #[error("invalid server_name: {0}")]
    InvalidSni(#[source] HostnameError),
    /// `encrypted_client_hello` (or draft ESNI): the name that matters is hidden from us.
    #[error("encrypted ClientHello or server name")]
    EncryptedClientHello,
    /// An ALPN protocol id is empty or not printable ASCII.
    #[error("invalid ALPN protocol id")]
    InvalidAlpn,
    /// The request head does not parse.
    #[error("malformed HTTP/1 request head: {0}")]
    HttpParse(#[from] httparse::Error),
    /// The request head breaks a rule we enforce beyond parsing.
    #[error("malformed HTTP/1 request head: {0}")]
    MalformedHttp(&'static str),
    /// No `Host` header.
    #[error("HTTP request has no Host header")]
    MissingHost,
    /// More than one `Host` header.
    #[error("HTTP request has several Host headers")]
    DuplicateHost,
    /// The `Host` header (or request-target authority) is not `hostname[:port]`.
    #[error("invalid HTTP host: {0}")]
    InvalidHost(&'static str),
    /// The `Host` header's host is not a valid host name.
    #[error("invalid HTTP host name: {0}")]
    InvalidHostname(#[source] HostnameError),
    /// The request target names a different authority than the `Host` header.
    #[error("request target authority does not match the Host header")]
    AuthorityMismatch,
}

/// Classifies one guest TCP stream from its first bytes; see the module docs.
#[derive(Debug, Default)]
pub struct Sniffer {
    state: State,
    /// Buffer length at the previous call, to catch a caller that lost bytes.
    seen: usize,
}

#[derive(Debug, Default)]
enum State {
    /// Nothing decided yet.
    #[default]
    Start,
    /// Walking TLS records towards a complete ClientHello.
    Tls(TlsReassembly),
    /// Waiting for the end of an HTTP/1 head.
    Http {
        /// Offset up to which the head terminator has been searched.
        scanned: usize,
    },
    /// `Done` or an error has been returned.
    Finished,
}

impl Sniffer {
    /// A sniffer for a new stream.
    pub fn new() -> Sniffer {
        Sniffer::default()
    }

    /// Looks at `buf`, everything the guest has sent so far (each call's buffer must extend the
    /// previous one). Returns `NeedMore` until it can decide; `Done` or an error is final.
    pub fn sniff(&mut self, buf: &[u8]) -> Result<Progress, SniffError> {
        if buf.len() < self.seen {
            return Err(SniffError::BufferShrank {
                seen: self.seen,
                now: buf.len(),
            });
        }
        self.seen = buf.len();
        let result = self.step(buf);
        match &result {
            Ok(Progress::NeedMore) => {}
            Ok(Progress::Done { sniffed, consumed }) => {
                tracing::trace!(?sniffed, consumed, "sniffed guest stream");
                self.state = State::Finished;
            }
            Err(error) => {
                tracing::debug!(%error, "refused guest stream");
                self.state = State::Finished;
            }
        }
        result
    }

    fn step(&mut self, buf: &[u8]) -> Result<Progress, SniffError> {
        if let State::Start = self.state {
            match classify(buf)? {
                Some(state) => self.state = state,
                None => return Ok(Progress::NeedMore),
            }
        }
        match &mut self.state {
            State::Start => Ok(Progress::NeedMore),
            State::Tls(reassembly) => reassembly.advance(buf),
            State::Http { scanned } => sniff_http(buf, scanned),
            State::Finished => Err(SniffError::Finished),
        }
    }
}

/// Picks the protocol from the first bytes, or `None` if more are needed to tell.
fn classify(buf: &[u8]) -> Result<Option<State>, SniffError> {
    let Some(&first) = buf.first() else {
        return Ok(None);
    };
    match first {
        CONTENT_HANDSHAKE => Ok(Some(State::Tls(TlsReassembly::default()))),
        CONTENT_CHANGE_CIPHER_SPEC
        | CONTENT_ALERT
        | CONTENT_APPLICATION_DATA
        | CONTENT_HEARTBEAT => Err(SniffError::NotHandshake(first)),
        // An SSLv2 record header's first byte has its high bit set; no TLS record or HTTP
        // method starts that way.
        b if b & 0x80 != 0 => Err(SniffError::Sslv2Hello),
        // HTTP methods are tokens; in practice letters. The HTTP/2 preface starts "PRI", which
        // is also a valid method, so it is told apart in `sniff_http`.
        b if b.is_ascii_alphabetic() => Ok(Some(State::Http { scanned: 0 })),
        b => Err(SniffError::Unrecognized(b)),
    }
}

/// TLS record walk state: the caller's buffer holds the records; we copy only the handshake
/// fragments, which are interleaved with record headers and must be contiguous to parse.
#[derive(Debug, Default)]
struct TlsReassembly {
    /// Offset of the next record header not yet consumed.
    next_record: usize,
    /// Concatenated handshake fragments so far.
    message: Vec<u8>,
}

impl TlsReassembly {
    fn advance(&mut self, buf: &[u8]) -> Result<Progress, SniffError> {
        loop {
            let rest = buf.get(self.next_record..).unwrap_or_default();
            let Some(header) = rest.get(..TLS_RECORD_HEADER_LEN) else {
                return Ok(Progress::NeedMore);
            };
            let fragment_len = check_record_header(header)?;
            let record_end = self.next_record + TLS_RECORD_HEADER_LEN + fragment_len;
            if record_end > MAX_TLS_HELLO_LEN {
                return Err(too_long_tls());
            }
            let available = &rest[TLS_RECORD_HEADER_LEN..];
            let Some(fragment) = available.get(..fragment_len) else {
                // Fail early on a first fragment that cannot start a ClientHello.
                if self.message.is_empty() {
                    check_handshake_type(available)?;
                }
                return Ok(Progress::NeedMore);
            };
            self.message.extend_from_slice(fragment);
            self.next_record = record_end;
            if let Some(sniffed) = self.try_complete()? {
                return Ok(Progress::Done {
                    sniffed,
                    consumed: self.next_record,
                });
            }
        }
    }

    /// Parses the ClientHello once all its bytes have arrived.
    fn try_complete(&self) -> Result<Option<Sniffed>, SniffError> {
        check_handshake_type(&self.message)?;
        let Some(header) = self.message.get(..HANDSHAKE_HEADER_LEN) else {
            return Ok(None);
        };
        let body_len =
            usize::from(header[1]) << 16 | usize::from(header[2]) << 8 | usize::from(header[3]);
        let total = HANDSHAKE_HEADER_LEN + body_len;
        // The message still needs at least one more record header to arrive around it.
        if total + TLS_RECORD_HEADER_LEN > MAX_TLS_HELLO_LEN {
            return Err(too_long_tls());
        }
        match self.message.len().cmp(&total) {
            std::cmp::Ordering::Less => Ok(None),
            // A client sends nothing else in handshake records before the server answers.
            std::cmp::Ordering::Greater => Err(SniffError::TrailingHandshakeData),
            std::cmp::Ordering::Equal => {
                parse_client_hello(&self.message[HANDSHAKE_HEADER_LEN..]).map(Some)
            }
        }
    }
}

fn too_long_tls() -> SniffError {
    SniffError::TooLong {
        what: "TLS ClientHello",
        limit: MAX_TLS_HELLO_LEN,
    }
}

/// Validates a record header; returns its fragment length.
fn check_record_header(header: &[u8]) -> Result<usize, SniffError> {
    let &[content_type, major, minor, len_hi, len_lo] = header else {
        return Err(SniffError::MalformedRecord("short header"));
    };
    if content_type != CONTENT_HANDSHAKE {
        return Err(SniffError::NotHandshake(content_type));
    }
    if major != TLS_MAJOR_VERSION || minor > MAX_TLS_MINOR_VERSION {
        return Err(SniffError::MalformedRecord("version"));
    }
    let len = usize::from(u16::from_be_bytes([len_hi, len_lo]));
    // RFC 8446 §5.1: handshake fragments are never empty and never over 2^14 bytes.
    if len == 0 {
        return Err(SniffError::MalformedRecord("empty handshake fragment"));
    }
    if len > MAX_TLS_FRAGMENT_LEN {
        return Err(SniffError::MalformedRecord("fragment over 2^14 bytes"));
    }
    Ok(len)
}

/// Fails unless the (possibly partial) handshake bytes start with a ClientHello type.
fn check_handshake_type(message: &[u8]) -> Result<(), SniffError> {
    match message.first() {
        Some(&t) if t != HANDSHAKE_CLIENT_HELLO => Err(SniffError::NotClientHello(t)),
        _ => Ok(()),
    }
}

/// Parses a complete ClientHello body (after the handshake header).
fn parse_client_hello(body: &[u8]) -> Result<Sniffed, SniffError> {
    let (rest, hello) = tls_parser::parse_tls_handshake_client_hello(body)
        .map_err(|_| SniffError::MalformedClientHello("structure"))?;
    // tls-parser stops where its structure ends; anything after it (including an extensions
    // block whose length does not fit) is left over, and we refuse it.
    if !rest.is_empty() {
        return Err(SniffError::MalformedClientHello("trailing bytes"));
    }
    let extensions = hello.ext.ok_or(SniffError::MissingSni)?;
    let mut seen = HashSet::new();
    let mut sni = None;
    let mut alpn = Vec::new();
    for (ext_type, data) in split_extensions(extensions)? {
        if !seen.insert(ext_type) {
            return Err(SniffError::DuplicateExtension(ext_type));
        }
        match ext_type {
            EXT_SERVER_NAME => sni = Some(parse_sni(data)?),
            EXT_ALPN => alpn = parse_alpn(data)?,
            EXT_ENCRYPTED_CLIENT_HELLO | EXT_ENCRYPTED_SERVER_NAME => {
                return Err(SniffError::EncryptedClientHello)
            }
            _ => {}
        }
    }
    let sni = sni.ok_or(SniffError::MissingSni)?;
    Ok(Sniffed::Tls { sni, alpn })
}

/// Splits the extensions block into (type, data) pairs; it must split exactly.
fn split_extensions(mut block: &[u8]) -> Result<Vec<(u16, &[u8])>, SniffError> {
    let mut out = Vec::new();
    while !block.is_empty() {
        // The "unknown" parser is tls-parser's raw framing: type, length, data.
        let (rest, ext) = tls_parser::parse_tls_extension_unknown(block)
            .map_err(|_| SniffError::MalformedClientHello("extension framing"))?;
        let TlsExtension::Unknown(TlsExtensionType(ext_type), data) = ext else {
            return Err(SniffError::MalformedClientHello("extension framing"));
        };
        out.push((ext_type, data));
        block = rest;
    }
    Ok(out)
}

/// Parses the `server_name` extension: exactly one `host_name` entry, and nothing else.
fn parse_sni(data: &[u8]) -> Result<Hostname, SniffError> {
    let (rest, ext) = tls_parser::parse_tls_extension_sni_content(data)
        .map_err(|_| SniffError::MalformedClientHello("server_name"))?;
    let TlsExtension::SNI(entries) = ext else {
        return Err(SniffError::MalformedClientHello("server_name"));
    };
    // tls-parser stops quietly at an entry it cannot parse; insist the entries it found,
    // with their framing (list length 2, then type 1 + length 2 each), are all there is.
    let parsed: usize = 2 + entries
        .iter()
        .map(|(_, name)| 3 + name.len())
        .sum::<usize>();
    if !rest.is_empty() || parsed != data.len() {
        return Err(SniffError::MalformedClientHello("server_name"));
    }
    let [(name_type, name)] = entries.as_slice() else {
        return Err(SniffError::SniEntryCount(entries.len()));
    };
    if *name_type != SNIType::HostName {
        return Err(SniffError::SniNameType(name_type.0));
    }
    Hostname::from_sni(name).map_err(SniffError::InvalidSni)
}

/// Parses the ALPN extension into printable protocol ids, leaving out GREASE values.
fn parse_alpn(data: &[u8]) -> Result<Vec<String>, SniffError> {
    let (rest, ext) = tls_parser::parse_tls_extension_alpn_content(data)
        .map_err(|_| SniffError::MalformedClientHello("ALPN"))?;
    let TlsExtension::ALPN(ids) = ext else {
        return Err(SniffError::MalformedClientHello("ALPN"));
    };
    // Same exactness check as for server_name: list length 2, then length 1 + id each.
    let parsed: usize = 2 + ids.iter().map(|id| 1 + id.len()).sum::<usize>();
    if !rest.is_empty() || parsed != data.len() || ids.is_empty() {
        return Err(SniffError::MalformedClientHello("ALPN"));
    }
    let mut out = Vec::with_capacity(ids.len());
    for id in ids.into_iter().filter(|id| !is_grease_alpn(id)) {
        if id.is_empty() || !id.iter().all(|b| b.is_ascii_graphic()) {
            return Err(SniffError::InvalidAlpn);
        }
        // Printable ASCII is valid UTF-8.
        out.push(String::from_utf8_lossy(id).into_owned());
    }
    Ok(out)
}

/// RFC 8701 GREASE ALPN ids: two equal bytes of the form 0x?A.
fn is_grease_alpn(id: &[u8]) -> bool {
    matches!(id, [a, b] if a == b && a & 0x0f == 0x0a)
}

/// Waits for the end of an HTTP/1 head (or the HTTP/2 preface) and parses it.
fn sniff_http(buf: &[u8], scanned: &mut usize) -> Result<Progress, SniffError> {
    if let Some(progress) = sniff_h2_preface(buf) {
        return Ok(progress);
    }
    let window = &buf[..buf.len().min(MAX_HTTP_HEAD_LEN)];
    const TERMINATOR: &[u8] = b"\r\n\r\n";
    // Resume a few bytes back, in case the terminator straddles the previous end.
    let from = scanned.saturating_sub(TERMINATOR.len() - 1);
    let found = window[from..]
        .windows(TERMINATOR.len())
        .position(|w| w == TERMINATOR)
        .map(|at| from + at + TERMINATOR.len());
    *scanned = window.len();
    match found {
        Some(head_len) => {
            let sniffed = parse_http_head(&buf[..head_len])?;
            Ok(Progress::Done {
                sniffed,
                consumed: head_len,
            })
        }
        None if buf.len() >= MAX_HTTP_HEAD_LEN => Err(SniffError::TooLong {
            what: "HTTP/1 request head",
            limit: MAX_HTTP_HEAD_LEN,
        }),
        None => Ok(Progress::NeedMore),
    }
}

/// `Some` once `buf` is known to be (or start with) the HTTP/2 preface, or to be a strict
/// prefix of it; `None` once it diverges.
fn sniff_h2_preface(buf: &[u8]) -> Option<Progress> {
    if buf.starts_with(H2_PREFACE) {
        return Some(Progress::Done {
            sniffed: Sniffed::H2PriorKnowledge,
            consumed: H2_PREFACE.len(),
        });
    }
    H2_PREFACE.starts_with(buf).then_some(Progress::NeedMore)
}

/// Parses a complete request head (ending in CRLF CRLF).
fn parse_http_head(head: &[u8]) -> Result<Sniffed, SniffError> {
    check_line_endings(head)?;
    let mut headers = [httparse::EMPTY_HEADER; MAX_HTTP_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    // httparse's defaults are the strict ones for requests: no obs-fold (a line starting with
    // whitespace is an invalid header name), no space before the colon, single spaces in the
    // request line.
    match request.parse(head)? {
        httparse::Status::Complete(len) if len == head.len() => {}
        _ => {
            return Err(SniffError::MalformedHttp(
                "head does not end at the blank line",
            ))
        }
    }
    let method = request
        .method
        .ok_or(SniffError::MalformedHttp("no method"))?;
    let target = request
        .path
        .ok_or(SniffError::MalformedHttp("no request target"))?;
    let (host, port) = parse_authority(single_host(request.headers)?)?;
    let is_connect = method == "CONNECT";
    check_target(method, target, &host, port)?;
    Ok(Sniffed::Http1 {
        host,
        port,
        method: method.to_owned(),
        is_connect,
    })
}

/// Refuses bare CR or LF: `httparse` accepts LF line endings, and a head that one parser
/// splits differently from another is a request-smuggling tool.
fn check_line_endings(head: &[u8]) -> Result<(), SniffError> {
    for (i, &b) in head.iter().enumerate() {
        let bare_lf = b == b'\n' && (i == 0 || head[i - 1] != b'\r');
        let bare_cr = b == b'\r' && head.get(i + 1) != Some(&b'\n');
        if bare_lf || bare_cr {
            return Err(SniffError::MalformedHttp("bare CR or LF"));
        }
    }
    Ok(())
}

/// The value of the one `Host` header, without optional whitespace around it.
fn single_host<'h>(headers: &[httparse::Header<'h>]) -> Result<&'h str, SniffError> {
    let mut hosts = headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("host"));
    let host = hosts.next().ok_or(SniffError::MissingHost)?;
    if hosts.next().is_some() {
        return Err(SniffError::DuplicateHost);
    }
    // RFC 9110 §7.2: the Host value is a URI authority, ASCII only. `Hostname::parse` would
    // map a Unicode name to its A-label, but then we would vet one name and forward another.
    if !host.value.is_ascii() {
        return Err(SniffError::InvalidHost("not ASCII"));
    }
    let value =
        std::str::from_utf8(host.value).map_err(|_| SniffError::InvalidHost("not ASCII"))?;
    Ok(value.trim_matches([' ', '\t']))
}

/// Parses `hostname[:port]`. IP literals are refused (by `Hostname`): the proxy only connects
/// to addresses it resolved for an allowed name.
fn parse_authority(authority: &str) -> Result<(Hostname, Option<u16>), SniffError> {
    if authority.starts_with('[') {
        return Err(SniffError::InvalidHost("IP literal"));
    }
    if authority.contains('@') {
        return Err(SniffError::InvalidHost("userinfo"));
    }
    let (host, port) = match authority.split_once(':') {
        Some((host, port)) => (host, Some(parse_port(port)?)),
        None => (authority, None),
    };
    let host = Hostname::parse(host).map_err(SniffError::InvalidHostname)?;
    Ok((host, port))
}

/// Parses a decimal port: 1–5 digits, 1..=65535.
fn parse_port(port: &str) -> Result<u16, SniffError> {
    let digits_only = !port.is_empty()
        && port.len() <= MAX_PORT_DIGITS
        && port.bytes().all(|b| b.is_ascii_digit());
    match port.parse::<u16>() {
        Ok(p) if digits_only && p != 0 => Ok(p),
        _ => Err(SniffError::InvalidHost("port")),
    }
}

/// Checks the request target against the Host header (RFC 9112 §3.2).
fn check_target(
    method: &str,
    target: &str,
    host: &Hostname,
    port: Option<u16>,
) -> Result<(), SniffError> {
    if method == "CONNECT" {
        // authority-form; the proxy refuses CONNECT, but a mismatch is refused even earlier.
        let (target_host, target_port) = parse_authority(target)?;
        if target_port.is_none() {
            return Err(SniffError::InvalidHost("CONNECT target without a port"));
        }
        return same_authority((&target_host, target_port), (host, port), None);
    }
    if target.starts_with('/') {
        return Ok(()); // origin-form
    }
    if target == "*" {
        return match method {
            "OPTIONS" => Ok(()),
            _ => Err(SniffError::MalformedHttp(
                "asterisk-form target outside OPTIONS",
            )),
        };
    }
    // absolute-form
    let (scheme, rest) = target
        .split_once("://")
        .ok_or(SniffError::MalformedHttp("request target form"))?;
    let default_port = if scheme.eq_ignore_ascii_case("http") {
        HTTP_DEFAULT_PORT
    } else if scheme.eq_ignore_ascii_case("https") {
        HTTPS_DEFAULT_PORT
    } else {
        return Err(SniffError::MalformedHttp("request target scheme"));
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (target_host, target_port) = parse_authority(&rest[..authority_end])?;
    same_authority(
        (&target_host, target_port),
        (host, port),
        Some(default_port),
    )
}

/// Compares two authorities; with a default port, an absent port means that one.
fn same_authority(
    a: (&Hostname, Option<u16>),
    b: (&Hostname, Option<u16>),
    default_port: Option<u16>,
) -> Result<(), SniffError> {
    let port = |p: Option<u16>| p.or(default_port);
    if a.0 == b.0 && port(a.1) == port(b.1) {
        Ok(())
    } else {
        Err(SniffError::AuthorityMismatch)
    }
}

#[cfg(test)]
mod tests;
