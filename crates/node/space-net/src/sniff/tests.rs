//! Tests of the sniffer: real rustls ClientHellos (whole, byte by byte, re-split into
//! records), hand-made malformed hellos, and HTTP/1 request heads.

use std::sync::Arc;

use rustls::pki_types::ServerName;

use super::*;

// ---- helpers: real ClientHellos from rustls ----

/// The bytes a rustls client sends first: its ClientHello, in TLS records.
fn rustls_client_hello(sni: &str, alpn: &[&[u8]]) -> Vec<u8> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let name = ServerName::try_from(sni.to_owned()).unwrap();
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let mut out = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut out).unwrap();
    }
    out
}

/// Concatenates the fragments of the handshake records in `records`.
fn handshake_bytes(mut records: &[u8]) -> Vec<u8> {
    let mut message = Vec::new();
    while !records.is_empty() {
        assert_eq!(records[0], CONTENT_HANDSHAKE);
        let len = usize::from(u16::from_be_bytes([records[3], records[4]]));
        message.extend_from_slice(&records[5..5 + len]);
        records = &records[5 + len..];
    }
    message
}

/// Wraps a handshake fragment in one TLS handshake record.
fn record(fragment: &[u8]) -> Vec<u8> {
    let mut out = vec![CONTENT_HANDSHAKE, 3, 1];
    out.extend_from_slice(&u16::try_from(fragment.len()).unwrap().to_be_bytes());
    out.extend_from_slice(fragment);
    out
}

/// Re-splits a handshake message into records of at most `size` bytes each.
fn records_of(message: &[u8], size: usize) -> Vec<u8> {
    message.chunks(size).flat_map(record).collect()
}

/// Feeds `stream` one chunk at a time, growing the caller's buffer; returns every result.
fn feed(stream: &[u8], chunk: usize) -> Vec<Result<Progress, SniffError>> {
    let mut sniffer = Sniffer::new();
    let mut results = Vec::new();
    let mut end = 0;
    while end < stream.len() {
        end = (end + chunk).min(stream.len());
        let result = sniffer.sniff(&stream[..end]);
        let last = !matches!(result, Ok(Progress::NeedMore));
        results.push(result);
        if last {
            break;
        }
    }
    results
}

/// Sniffs `stream` in one go.
fn sniff_all(stream: &[u8]) -> Result<Progress, SniffError> {
    Sniffer::new().sniff(stream)
}

fn expect_tls(progress: Progress, sni: &str, alpn: &[&str], consumed: usize) {
    let Progress::Done {
        sniffed: Sniffed::Tls {
            sni: got_sni,
            alpn: got_alpn,
        },
        consumed: got_consumed,
    } = progress
    else {
        panic!("not TLS: {progress:?}");
    };
    assert_eq!(got_sni.as_str(), sni);
    assert_eq!(got_alpn, alpn);
    assert_eq!(got_consumed, consumed);
}

// ---- helpers: hand-made ClientHellos ----

/// A ClientHello body (after the handshake header) with these extensions, encoded as given.
fn hello_body(extensions: &[(u16, Vec<u8>)]) -> Vec<u8> {
    let mut body = vec![3, 3];
    body.extend_from_slice(&[0x11; 32]); // random
    body.push(0); // empty session id
    body.extend_from_slice(&[0, 2, 0x13, 0x01]); // one cipher suite
    body.extend_from_slice(&[1, 0]); // null compression
    let mut block = Vec::new();
    for (ext_type, data) in extensions {
        block.extend_from_slice(&ext_type.to_be_bytes());
        block.extend_from_slice(&u16::try_from(data.len()).unwrap().to_be_bytes());
        block.extend_from_slice(data);
    }
    body.extend_from_slice(&u16::try_from(block.len()).unwrap().to_be_bytes());
    body.extend_from_slice(&block);
    body
}

/// A handshake message of type ClientHello around `body`.
fn handshake(body: &[u8]) -> Vec<u8> {
    let len = u32::try_from(body.len()).unwrap().to_be_bytes();
    let mut out = vec![HANDSHAKE_CLIENT_HELLO, len[1], len[2], len[3]];
    out.extend_from_slice(body);
    out
}

/// `server_name` extension data with these (type, name) entries.
fn sni_data(entries: &[(u8, &[u8])]) -> Vec<u8> {
    let mut list = Vec::new();
    for (name_type, name) in entries {
        list.push(*name_type);
        list.extend_from_slice(&u16::try_from(name.len()).unwrap().to_be_bytes());
        list.extend_from_slice(name);
    }
    let mut out = u16::try_from(list.len()).unwrap().to_be_bytes().to_vec();
    out.extend_from_slice(&list);
    out
}

/// ALPN extension data with these ids.
fn alpn_data(ids: &[&[u8]]) -> Vec<u8> {
    let mut list = Vec::new();
    for id in ids {
        list.push(u8::try_from(id.len()).unwrap());
        list.extend_from_slice(id);
    }
    let mut out = u16::try_from(list.len()).unwrap().to_be_bytes().to_vec();
    out.extend_from_slice(&list);
    out
}

fn sni_ext(name: &str) -> (u16, Vec<u8>) {
    (EXT_SERVER_NAME, sni_data(&[(0, name.as_bytes())]))
}

/// A one-record ClientHello stream with these extensions.
fn crafted(extensions: &[(u16, Vec<u8>)]) -> Vec<u8> {
    record(&handshake(&hello_body(extensions)))
}

// ---- TLS: real hellos ----

#[test]
fn rustls_hello_whole() {
    let stream = rustls_client_hello("api.example.com", &[b"h2", b"http/1.1"]);
    let progress = sniff_all(&stream).unwrap();
    expect_tls(
        progress,
        "api.example.com",
        &["h2", "http/1.1"],
        stream.len(),
    );
}

#[test]
fn rustls_hello_without_alpn() {
    let stream = rustls_client_hello("example.org", &[]);
    expect_tls(
        sniff_all(&stream).unwrap(),
        "example.org",
        &[],
        stream.len(),
    );
}

#[test]
fn rustls_hello_byte_by_byte() {
    let stream = rustls_client_hello("api.example.com", &[b"h2"]);
    let results = feed(&stream, 1);
    assert_eq!(results.len(), stream.len());
    let (last, rest) = results.split_last().unwrap();
    assert!(rest.iter().all(|r| matches!(r, Ok(Progress::NeedMore))));
    let last = last.as_ref().unwrap().clone();
    expect_tls(last, "api.example.com", &["h2"], stream.len());
}

#[test]
fn rustls_hello_resplit_into_records() {
    let stream = rustls_client_hello("api.example.com", &[b"http/1.1"]);
    let message = handshake_bytes(&stream);
    // One byte per record puts even the handshake header across four records.
    for size in [1, 3, 7, 100, 512] {
        let resplit = records_of(&message, size);
        expect_tls(
            sniff_all(&resplit).unwrap(),
            "api.example.com",
            &["http/1.1"],
            resplit.len(),
        );
        // And across TCP segments that cut record headers too.
        let last = feed(&resplit, 13).pop().unwrap().unwrap();
        expect_tls(last, "api.example.com", &["http/1.1"], resplit.len());
    }
}

#[test]
fn bytes_after_the_hello_are_not_consumed() {
    let mut stream = rustls_client_hello("api.example.com", &[]);
    let hello_len = stream.len();
    // A ChangeCipherSpec and early data may follow; the decision does not depend on them.
    stream.extend_from_slice(&[CONTENT_CHANGE_CIPHER_SPEC, 3, 3, 0, 1, 1]);
    expect_tls(
        sniff_all(&stream).unwrap(),
        "api.example.com",
        &[],
        hello_len,
    );
}

#[test]
fn sni_is_canonicalised() {
    let stream = crafted(&[sni_ext("API.Example.COM")]);
    expect_tls(
        sniff_all(&stream).unwrap(),
        "api.example.com",
        &[],
        stream.len(),
    );
}

#[test]
fn grease_alpn_is_skipped() {
    let stream = crafted(&[
        sni_ext("a.example"),
        (EXT_ALPN, alpn_data(&[&[0x3a, 0x3a], b"h2"])),
    ]);
    expect_tls(
        sniff_all(&stream).unwrap(),
        "a.example",
        &["h2"],
        stream.len(),
    );
}

// ---- TLS: refusals ----

fn refused(stream: &[u8]) -> SniffError {
    match sniff_all(stream) {
        Err(e) => e,
        Ok(p) => panic!("accepted: {p:?}"),
    }
}

#[test]
fn sslv2_hello_is_refused() {
    let stream = [0x80, 0x2e, 0x01, 0x03, 0x01, 0x00, 0x15];
    assert!(matches!(refused(&stream), SniffError::Sslv2Hello));
}

#[test]
fn non_handshake_first_record_is_refused() {
    for content_type in [
        CONTENT_CHANGE_CIPHER_SPEC,
        CONTENT_ALERT,
        CONTENT_APPLICATION_DATA,
    ] {
        let stream = [content_type, 3, 3, 0, 1, 1];
        assert!(matches!(refused(&stream), SniffError::NotHandshake(t) if t == content_type));
    }
}

#[test]
fn non_handshake_record_mid_hello_is_refused() {
    let message = handshake_bytes(&rustls_client_hello("api.example.com", &[]));
    let mut stream = record(&message[..10]);
    stream.extend_from_slice(&[CONTENT_CHANGE_CIPHER_SPEC, 3, 3, 0, 1, 1]);
    stream.extend_from_slice(&record(&message[10..]));
    assert!(matches!(
        refused(&stream),
        SniffError::NotHandshake(CONTENT_CHANGE_CIPHER_SPEC)
    ));
}

#[test]
fn bad_record_headers_are_refused() {
    let empty = [CONTENT_HANDSHAKE, 3, 1, 0, 0];
    assert!(matches!(refused(&empty), SniffError::MalformedRecord(_)));
    let oversized = [CONTENT_HANDSHAKE, 3, 1, 0x40, 0x01];
    assert!(matches!(
        refused(&oversized),
        SniffError::MalformedRecord(_)
    ));
    let bad_version = [CONTENT_HANDSHAKE, 2, 0, 0, 1, 1];
    assert!(matches!(
        refused(&bad_version),
        SniffError::MalformedRecord(_)
    ));
}

#[test]
fn other_handshake_message_is_refused() {
    // A ServerHello type, refused as soon as its first byte arrives.
    let stream = [CONTENT_HANDSHAKE, 3, 3, 0, 50, 2];
    assert!(matches!(refused(&stream), SniffError::NotClientHello(2)));
}

#[test]
fn truncated_structures_are_refused() {
    // The handshake length covers the body, but the body ends inside the cipher suites.
    let body = hello_body(&[sni_ext("a.example")]);
    assert!(matches!(
        refused(&record(&handshake(&body[..36]))),
        SniffError::MalformedClientHello(_)
    ));
    // An extension whose length runs past the end of the block.
    let mut body = hello_body(&[sni_ext("a.example")]);
    let n = body.len();
    body[n - sni_data(&[(0, b"a.example")]).len() - 1] += 1;
    assert!(matches!(
        refused(&record(&handshake(&body))),
        SniffError::MalformedClientHello(_)
    ));
}

#[test]
fn trailing_garbage_in_hello_is_refused() {
    // After the extensions block, inside the handshake message.
    let mut body = hello_body(&[sni_ext("a.example")]);
    body.extend_from_slice(&[0xde, 0xad]);
    assert!(matches!(
        refused(&record(&handshake(&body))),
        SniffError::MalformedClientHello(_)
    ));
    // Inside the extensions block, after the last extension.
    let mut body = hello_body(&[sni_ext("a.example")]);
    let block_len_at = body.len() - 4 - sni_data(&[(0, b"a.example")]).len() - 2;
    body.extend_from_slice(&[0, 0, 0]);
    let block_len = u16::from_be_bytes([body[block_len_at], body[block_len_at + 1]]) + 3;
    body[block_len_at..block_len_at + 2].copy_from_slice(&block_len.to_be_bytes());
    assert!(matches!(
        refused(&record(&handshake(&body))),
        SniffError::MalformedClientHello(_)
    ));
    // Inside the server_name extension, after the list.
    let mut data = sni_data(&[(0, b"a.example")]);
    data.push(0);
    let stream = crafted(&[(EXT_SERVER_NAME, data)]);
    assert!(matches!(
        refused(&stream),
        SniffError::MalformedClientHello(_)
    ));
    // Inside the server_name list, after the entry.
    let mut data = sni_data(&[(0, b"a.example")]);
    data.push(0);
    let list_len = u16::try_from(data.len() - 2).unwrap();
    data[..2].copy_from_slice(&list_len.to_be_bytes());
    let stream = crafted(&[(EXT_SERVER_NAME, data)]);
    assert!(matches!(
        refused(&stream),
        SniffError::MalformedClientHello(_)
    ));
}

#[test]
fn handshake_data_after_hello_is_refused() {
    let mut fragment = handshake(&hello_body(&[sni_ext("a.example")]));
    fragment.extend_from_slice(&[20, 0, 0, 0]);
    assert!(matches!(
        refused(&record(&fragment)),
        SniffError::TrailingHandshakeData
    ));
}

#[test]
fn missing_sni_is_refused() {
    let stream = crafted(&[(EXT_ALPN, alpn_data(&[b"h2"]))]);
    assert!(matches!(refused(&stream), SniffError::MissingSni));
    // No extensions block at all.
    let mut body = hello_body(&[]);
    body.truncate(body.len() - 2);
    assert!(matches!(
        refused(&record(&handshake(&body))),
        SniffError::MissingSni
    ));
    // An empty server_name extension (legal only from a server).
    let stream = crafted(&[(EXT_SERVER_NAME, Vec::new())]);
    assert!(matches!(
        refused(&stream),
        SniffError::MalformedClientHello(_)
    ));
}

#[test]
fn several_server_names_are_refused() {
    let data = sni_data(&[(0, b"a.example"), (0, b"b.example")]);
    assert!(matches!(
        refused(&crafted(&[(EXT_SERVER_NAME, data)])),
        SniffError::SniEntryCount(2)
    ));
    let data = sni_data(&[]);
    assert!(matches!(
        refused(&crafted(&[(EXT_SERVER_NAME, data)])),
        SniffError::SniEntryCount(0)
    ));
}

#[test]
fn other_name_type_is_refused() {
    let data = sni_data(&[(1, b"a.example")]);
    assert!(matches!(
        refused(&crafted(&[(EXT_SERVER_NAME, data)])),
        SniffError::SniNameType(1)
    ));
}

#[test]
fn duplicate_extensions_are_refused() {
    let stream = crafted(&[sni_ext("a.example"), sni_ext("b.example")]);
    assert!(matches!(
        refused(&stream),
        SniffError::DuplicateExtension(EXT_SERVER_NAME)
    ));
    let alpn = (EXT_ALPN, alpn_data(&[b"h2"]));
    let stream = crafted(&[sni_ext("a.example"), alpn.clone(), alpn]);
    assert!(matches!(
        refused(&stream),
        SniffError::DuplicateExtension(EXT_ALPN)
    ));
    let other = (23, Vec::new());
    let stream = crafted(&[other.clone(), sni_ext("a.example"), other]);
    assert!(matches!(
        refused(&stream),
        SniffError::DuplicateExtension(23)
    ));
}

#[test]
fn invalid_names_are_refused() {
    let bad: [&[u8]; 7] = [
        "bücher.example".as_bytes(),
        b"a.example.",
        b"a\0.example",
        b"a example",
        b"10.0.0.1",
        b"under_score.example",
        b"",
    ];
    for name in bad {
        let stream = crafted(&[(EXT_SERVER_NAME, sni_data(&[(0, name)]))]);
        assert!(
            matches!(refused(&stream), SniffError::InvalidSni(_)),
            "{name:?}"
        );
    }
}

#[test]
fn encrypted_client_hello_is_refused() {
    for ext in [EXT_ENCRYPTED_CLIENT_HELLO, EXT_ENCRYPTED_SERVER_NAME] {
        let stream = crafted(&[sni_ext("public.example"), (ext, vec![0, 1, 2, 3])]);
        assert!(matches!(refused(&stream), SniffError::EncryptedClientHello));
    }
}

#[test]
fn bad_alpn_is_refused() {
    let stream = crafted(&[sni_ext("a.example"), (EXT_ALPN, alpn_data(&[b"h 2"]))]);
    assert!(matches!(refused(&stream), SniffError::InvalidAlpn));
    let stream = crafted(&[sni_ext("a.example"), (EXT_ALPN, alpn_data(&[b""]))]);
    assert!(matches!(refused(&stream), SniffError::InvalidAlpn));
    let stream = crafted(&[sni_ext("a.example"), (EXT_ALPN, alpn_data(&[]))]);
    assert!(matches!(
        refused(&stream),
        SniffError::MalformedClientHello(_)
    ));
}

#[test]
fn oversized_hello_is_refused() {
    // A handshake header announcing more than the bound fails as soon as it is read.
    let stream = record(&[HANDSHAKE_CLIENT_HELLO, 0x01, 0x00, 0x00]);
    assert!(matches!(refused(&stream), SniffError::TooLong { .. }));
    // Records that would carry the stream past the bound fail at the record header.
    let body_len = MAX_TLS_HELLO_LEN - 2 * TLS_RECORD_HEADER_LEN - HANDSHAKE_HEADER_LEN;
    let len = u32::try_from(body_len).unwrap().to_be_bytes();
    let mut message = vec![HANDSHAKE_CLIENT_HELLO, len[1], len[2], len[3]];
    message.resize(HANDSHAKE_HEADER_LEN + body_len, 0);
    let stream = records_of(&message, 1000);
    assert!(matches!(refused(&stream), SniffError::TooLong { .. }));
}

#[test]
fn incomplete_hello_needs_more() {
    let stream = rustls_client_hello("api.example.com", &[]);
    assert_eq!(sniff_all(&[]).unwrap(), Progress::NeedMore);
    assert_eq!(sniff_all(&stream[..3]).unwrap(), Progress::NeedMore);
    assert_eq!(
        sniff_all(&stream[..stream.len() - 1]).unwrap(),
        Progress::NeedMore
    );
}

#[test]
fn misuse_is_an_error_not_a_panic() {
    let stream = rustls_client_hello("api.example.com", &[]);
    let mut sniffer = Sniffer::new();
    assert_eq!(sniffer.sniff(&stream[..20]).unwrap(), Progress::NeedMore);
    assert!(matches!(
        sniffer.sniff(&stream[..10]),
        Err(SniffError::BufferShrank { .. })
    ));
    let mut sniffer = Sniffer::new();
    assert!(sniffer.sniff(&stream).is_ok());
    assert!(matches!(sniffer.sniff(&stream), Err(SniffError::Finished)));
}

// ---- HTTP/1 ----

fn expect_http(progress: Progress, host: &str, port: Option<u16>, method: &str, is_connect: bool) {
    let Progress::Done {
        sniffed:
            Sniffed::Http1 {
                host: got_host,
                port: got_port,
                method: got_method,
                is_connect: got_connect,
            },
        ..
    } = progress
    else {
        panic!("not HTTP/1: {progress:?}");
    };
    assert_eq!(got_host.as_str(), host);
    assert_eq!(got_port, port);
    assert_eq!(got_method, method);
    assert_eq!(got_connect, is_connect);
}

#[test]
fn http_head_is_parsed() {
    let head =
        b"GET /v1/models?x=1 HTTP/1.1\r\nHost: API.example.com:8080\r\nUser-Agent: t\r\n\r\n";
    let mut stream = head.to_vec();
    stream.extend_from_slice(b"body bytes");
    let progress = sniff_all(&stream).unwrap();
    assert!(matches!(&progress, Progress::Done { consumed, .. } if *consumed == head.len()));
    expect_http(progress, "api.example.com", Some(8080), "GET", false);

    let head = b"POST / HTTP/1.0\r\nhost:\texample.org \r\n\r\n";
    expect_http(sniff_all(head).unwrap(), "example.org", None, "POST", false);
}

#[test]
fn http_head_byte_by_byte() {
    let head = b"GET / HTTP/1.1\r\nHost: example.org\r\n\r\n";
    let results = feed(head, 1);
    assert_eq!(results.len(), head.len());
    let last = results.last().unwrap().as_ref().unwrap().clone();
    expect_http(last, "example.org", None, "GET", false);
}

#[test]
fn absolute_form_must_match_host() {
    let ok = b"GET http://example.org/x HTTP/1.1\r\nHost: example.org\r\n\r\n";
    expect_http(sniff_all(ok).unwrap(), "example.org", None, "GET", false);
    let ok_default_port = b"GET http://example.org:80/x HTTP/1.1\r\nHost: example.org\r\n\r\n";
    assert!(sniff_all(ok_default_port).is_ok());
    let mismatch = [
        &b"GET http://evil.example/x HTTP/1.1\r\nHost: example.org\r\n\r\n"[..],
        b"GET http://example.org:8080/ HTTP/1.1\r\nHost: example.org\r\n\r\n",
        b"GET https://example.org/ HTTP/1.1\r\nHost: example.org:80\r\n\r\n",
    ];
    for head in mismatch {
        assert!(
            matches!(refused(head), SniffError::AuthorityMismatch),
            "{head:?}"
        );
    }
    let userinfo = b"GET http://example.org@evil.example/ HTTP/1.1\r\nHost: example.org\r\n\r\n";
    assert!(matches!(refused(userinfo), SniffError::InvalidHost(_)));
    let scheme = b"GET ftp://example.org/ HTTP/1.1\r\nHost: example.org\r\n\r\n";
    assert!(matches!(refused(scheme), SniffError::MalformedHttp(_)));
}

#[test]
fn host_header_must_be_single() {
    let two = b"GET / HTTP/1.1\r\nHost: a.example\r\nHOST: b.example\r\n\r\n";
    assert!(matches!(refused(two), SniffError::DuplicateHost));
    let none = b"GET / HTTP/1.1\r\nAccept: */*\r\n\r\n";
    assert!(matches!(refused(none), SniffError::MissingHost));
}

#[test]
fn bad_hosts_are_refused() {
    let heads: [&[u8]; 8] = [
        "GET / HTTP/1.1\r\nHost: bücher.example\r\n\r\n".as_bytes(),
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a.example:\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a.example:99999\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a.example:+80\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a.example b.example\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: \r\n\r\n",
    ];
    for head in heads {
        assert!(
            matches!(
                refused(head),
                SniffError::InvalidHost(_) | SniffError::InvalidHostname(_)
            ),
            "{:?}",
            String::from_utf8_lossy(head)
        );
    }
}

#[test]
fn connect_is_flagged() {
    let head = b"CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com:443\r\n\r\n";
    expect_http(
        sniff_all(head).unwrap(),
        "api.example.com",
        Some(443),
        "CONNECT",
        true,
    );
    let mismatch = b"CONNECT evil.example:443 HTTP/1.1\r\nHost: api.example.com:443\r\n\r\n";
    assert!(matches!(refused(mismatch), SniffError::AuthorityMismatch));
}

#[test]
fn whitespace_tricks_are_refused() {
    let heads: [&[u8]; 5] = [
        // obs-fold continuing the Host header
        b"GET / HTTP/1.1\r\nHost: a.example\r\n b.example\r\n\r\n",
        // whitespace before the colon
        b"GET / HTTP/1.1\r\nHost : a.example\r\n\r\n",
        // bare LF line endings
        b"GET / HTTP/1.1\nHost: a.example\n\r\n\r\n",
        // bare CR inside a value
        b"GET / HTTP/1.1\r\nHost: a.example\rX: y\r\n\r\n",
        // double space in the request line
        b"GET  / HTTP/1.1\r\nHost: a.example\r\n\r\n",
    ];
    for head in heads {
        assert!(
            matches!(
                refused(head),
                SniffError::HttpParse(_) | SniffError::MalformedHttp(_)
            ),
            "{:?}",
            String::from_utf8_lossy(head)
        );
    }
}

#[test]
fn asterisk_form_only_for_options() {
    let ok = b"OPTIONS * HTTP/1.1\r\nHost: a.example\r\n\r\n";
    expect_http(sniff_all(ok).unwrap(), "a.example", None, "OPTIONS", false);
    let bad = b"GET * HTTP/1.1\r\nHost: a.example\r\n\r\n";
    assert!(matches!(refused(bad), SniffError::MalformedHttp(_)));
}

#[test]
fn too_long_head_is_refused() {
    let mut head = b"GET / HTTP/1.1\r\nHost: a.example\r\nX: ".to_vec();
    head.resize(MAX_HTTP_HEAD_LEN, b'a');
    assert!(matches!(refused(&head), SniffError::TooLong { .. }));
    // Too many headers, within the byte bound.
    let mut head = b"GET / HTTP/1.1\r\nHost: a.example\r\n".to_vec();
    for _ in 0..MAX_HTTP_HEADERS {
        head.extend_from_slice(b"X: y\r\n");
    }
    head.extend_from_slice(b"\r\n");
    assert!(matches!(
        refused(&head),
        SniffError::HttpParse(httparse::Error::TooManyHeaders)
    ));
}

#[test]
fn incomplete_head_needs_more() {
    let head = b"GET / HTTP/1.1\r\nHost: a.example\r\n";
    assert_eq!(sniff_all(head).unwrap(), Progress::NeedMore);
    assert_eq!(sniff_all(b"G").unwrap(), Progress::NeedMore);
}

// ---- HTTP/2 prior knowledge and the rest ----

#[test]
fn h2_preface_is_recognised() {
    let mut stream = H2_PREFACE.to_vec();
    stream.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]); // an empty SETTINGS frame
    assert_eq!(
        sniff_all(&stream).unwrap(),
        Progress::Done {
            sniffed: Sniffed::H2PriorKnowledge,
            consumed: H2_PREFACE.len()
        }
    );
    assert_eq!(sniff_all(&H2_PREFACE[..10]).unwrap(), Progress::NeedMore);
    let results = feed(&stream, 1);
    assert!(matches!(
        results.last(),
        Some(Ok(Progress::Done {
            sniffed: Sniffed::H2PriorKnowledge,
            ..
        }))
    ));
    // "PRI" as an HTTP/1 method is not the preface.
    let head = b"PRI / HTTP/1.1\r\nHost: a.example\r\n\r\n";
    expect_http(sniff_all(head).unwrap(), "a.example", None, "PRI", false);
}

#[test]
fn unrecognised_first_bytes_are_refused() {
    for first in [0u8, b'\r', b' ', b'{', 0x7f] {
        assert!(matches!(refused(&[first, 1, 2, 3]), SniffError::Unrecognized(b) if b == first));
    }
}
