//! The client against a hostile guest over a real Unix socket: every misbehaviour must end
//! in an error for this client only (Protocol / Disconnected / Remote), never a hang, a
//! panic or unbounded memory.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{fake_guest, guard, read_all, respond, send_all, serve_h2};
use futures::StreamExt;
use space_core::files::FileStat;
use space_core::{ErrorBody, ErrorCode};
use space_guest_client::{ClientOptions, GuestClient, GuestError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const DEADLINE: Duration = Duration::from_secs(30);

fn fast_keepalive() -> ClientOptions {
    ClientOptions {
        keepalive_interval: Duration::from_millis(100),
        keepalive_timeout: Duration::from_millis(300),
        ..ClientOptions::default()
    }
}

#[tokio::test]
async fn garbage_instead_of_http2_fails_the_channel() {
    let guest = fake_guest(|mut io| async move {
        let garbage = vec![0xffu8; 4096];
        // Keep reading what the host sends so it is never blocked on writing.
        let (mut r, mut w) = tokio::io::split(&mut io);
        let reader = async {
            while r
                .read(&mut [0u8; 4096])
                .await
                .map(|n| n > 0)
                .unwrap_or(false)
            {}
        };
        let writer = async {
            for _ in 0..64 {
                if w.write_all(&garbage).await.is_err() {
                    break;
                }
            }
        };
        tokio::join!(reader, writer);
    });
    guard(async {
        match GuestClient::connect(&guest.sock, DEADLINE).await {
            Err(e) => assert!(e.is_channel_fault(), "{e:?}"),
            Ok(client) => {
                let err = client.health().await.unwrap_err();
                assert!(err.is_channel_fault(), "{err:?}");
                let why = client.closed().await;
                assert!(matches!(why, GuestError::Protocol(_)), "{why:?}");
                assert!(client.is_closed());
                // Later calls fail at once with the same reason.
                assert!(client.health().await.unwrap_err().is_channel_fault());
            }
        }
    })
    .await;
}

#[tokio::test]
async fn eof_after_handshake_is_disconnected() {
    let guest = fake_guest(|io| async move { drop(io) });
    guard(async {
        match GuestClient::connect(&guest.sock, DEADLINE).await {
            Err(e) => assert!(e.is_channel_fault(), "{e:?}"),
            Ok(client) => {
                let why = client.closed().await;
                assert!(why.is_channel_fault(), "{why:?}");
                let err = client.health().await.unwrap_err();
                assert!(err.is_channel_fault(), "{err:?}");
            }
        }
    })
    .await;
}

#[tokio::test]
async fn silent_guest_is_caught_by_keepalive() {
    // Handshake, then read everything and never answer: no SETTINGS, no PING ACK.
    let guest = fake_guest(|mut io| async move {
        while io
            .read(&mut [0u8; 4096])
            .await
            .map(|n| n > 0)
            .unwrap_or(false)
        {}
    });
    guard(async {
        let client = GuestClient::connect_with(&guest.sock, DEADLINE, fast_keepalive())
            .await
            .unwrap();
        let pending = tokio::spawn({
            let client = client.clone();
            async move { client.health().await }
        });
        let why = client.closed().await;
        assert!(
            matches!(&why, GuestError::Disconnected(m) if m.contains("keep-alive")),
            "{why:?}"
        );
        let err = pending.await.unwrap().unwrap_err();
        assert!(err.is_channel_fault(), "{err:?}");
    })
    .await;
}

#[tokio::test]
async fn guest_that_never_answers_handshake_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("mute.sock");
    let listener = tokio::net::UnixListener::bind(&sock).unwrap();
    let peer = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        while s
            .read(&mut [0u8; 1024])
            .await
            .map(|n| n > 0)
            .unwrap_or(false)
        {}
    });
    let err = guard(GuestClient::connect(&sock, Duration::from_millis(600)))
        .await
        .unwrap_err();
    assert!(matches!(err, GuestError::Timeout(_)), "{err:?}");
    peer.abort();
}

#[tokio::test]
async fn missing_socket_is_retried_until_it_appears() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("late.sock");
    let late = sock.clone();
    // The VMM creates the socket a little later.
    let peer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let listener = tokio::net::UnixListener::bind(&late).unwrap();
        let (s, _) = listener.accept().await.unwrap();
        let io = common::guest_handshake(s).await.unwrap();
        serve_h2(io, |_req, resp| async move {
            respond(
                resp,
                200,
                br#"{"version":"0.0.0-fake","boot_id":"fakeboot","uptime_ms":1,"processes":0}"#,
            )
            .await
        })
        .await;
    });
    let client = guard(GuestClient::connect(&sock, DEADLINE)).await.unwrap();
    assert_eq!(client.ready().boot_id, "fakeboot");
    assert_eq!(client.health().await.unwrap().processes, 0);
    peer.abort();
    // And a socket that never appears is a timeout.
    let err = guard(GuestClient::connect(
        &dir.path().join("never.sock"),
        Duration::from_millis(300),
    ))
    .await
    .unwrap_err();
    assert!(matches!(err, GuestError::Timeout(_)), "{err:?}");
}

#[tokio::test]
async fn huge_json_answer_is_a_protocol_error() {
    let guest = fake_guest(|io| {
        serve_h2(io, |_req, mut respond| async move {
            // 100 MiB without a content-length, as fast as the window allows.
            let resp = http::Response::builder().status(200).body(()).unwrap();
            let Ok(mut s) = respond.send_response(resp, false) else {
                return;
            };
            let chunk = Bytes::from(vec![b' '; 1024 * 1024]);
            for _ in 0..100 {
                if !send_all(&mut s, chunk.clone(), false).await {
                    return;
                }
            }
        })
    });
    let client = guard(GuestClient::connect(&guest.sock, DEADLINE))
        .await
        .unwrap();
    let err = guard(client.health()).await.unwrap_err();
    assert!(
        matches!(&err, GuestError::Protocol(m) if m.contains("larger than")),
        "{err:?}"
    );
    assert!(
        !client.is_closed(),
        "an oversize answer fails the call, the connection survives"
    );
}

#[tokio::test]
async fn declared_huge_answer_is_refused_and_bad_json_is_protocol() {
    let guest = fake_guest(|io| {
        serve_h2(io, |req, respond| async move {
            match req.uri().path() {
                "/v1/health" => common::respond(respond, 200, b"{\"version\": 1").await,
                _ => common::respond(respond, 200, br#"{"path":"/x","name":"x","kind":"file","size":-1,"mode":0,"uid":0,"gid":0,"modified_ms":0}"#).await,
            }
        })
    });
    let client = guard(GuestClient::connect(&guest.sock, DEADLINE))
        .await
        .unwrap();
    let err = guard(client.health()).await.unwrap_err();
    assert!(matches!(err, GuestError::Protocol(_)), "{err:?}");
    let err = guard(client.stat("/x", None)).await.unwrap_err();
    assert!(matches!(err, GuestError::Protocol(_)), "{err:?}");
}

#[tokio::test]
async fn endless_ndjson_line_ends_the_output_stream() {
    let guest = fake_guest(|io| {
        serve_h2(io, |_req, mut respond| async move {
            let resp = http::Response::builder()
                .status(200)
                .header("content-type", "application/x-ndjson")
                .body(())
                .unwrap();
            let Ok(mut s) = respond.send_response(resp, false) else {
                return;
            };
            // One good event, then a line that never ends.
            if !send_all(&mut s, Bytes::from_static(b"{\"type\":\"started\",\"seq\":1,\"id\":7,\"pid\":42}\n{\"type\":\"data\",\"seq\":2,\"stream\":\"stdout\",\"data\":\""), false).await {
                return;
            }
            let chunk = Bytes::from(vec![b'A'; 64 * 1024]);
            while send_all(&mut s, chunk.clone(), false).await {}
        })
    });
    let client = guard(GuestClient::connect(&guest.sock, DEADLINE))
        .await
        .unwrap();
    let mut events = guard(client.output(7, None)).await.unwrap();
    let first = guard(events.next()).await.unwrap().unwrap();
    assert_eq!(first.seq(), 1);
    let err = guard(events.next()).await.unwrap().unwrap_err();
    assert!(
        matches!(&err, GuestError::Protocol(m) if m.contains("longer than")),
        "{err:?}"
    );
    assert!(
        guard(events.next()).await.is_none(),
        "the stream ends after its error"
    );
}

#[tokio::test]
async fn output_stream_checks_events_and_exit() {
    let guest = fake_guest(|io| {
        serve_h2(io, |req, respond| async move {
            let body: &[u8] = match req.uri().path() {
                // Split oddly, CRLF, a blank line, then exit; then junk that must be ignored.
                "/v1/processes/1/output" => b"{\"type\":\"data\",\"seq\":1,\"stream\":\"stdout\",\"data\":\"aGk=\"}\r\n\n{\"type\":\"exit\",\"seq\":2,\"exit_code\":0,\"signal\":null,\"timed_out\":false}\nGARBAGE",
                "/v1/processes/2/output" => b"{\"type\":\"data\",\"seq\":1,\"stream\":\"stdout\",\"data\":\"aGk=\"}\n",
                _ => b"{\"type\":\"data\",\"seq\":1,\"stream\":\"stdout\",\"data\":\"not base64!\"}\n",
            };
            common::respond(respond, 200, body).await
        })
    });
    let client = guard(GuestClient::connect(&guest.sock, DEADLINE))
        .await
        .unwrap();
    let all: Vec<_> = guard(client.output(1, Some(0)).await.unwrap().collect()).await;
    assert_eq!(all.len(), 2, "{all:?}");
    assert_eq!(all[0].as_ref().unwrap().bytes().unwrap().1, b"hi");
    assert!(matches!(
        all[1],
        Ok(space_core::process::OutputEvent::Exit { .. })
    ));
    let all: Vec<_> = guard(client.output(2, None).await.unwrap().collect()).await;
    assert!(
        matches!(all.last(), Some(Err(GuestError::Protocol(m))) if m.contains("without an exit")),
        "{all:?}"
    );
    let all: Vec<_> = guard(client.output(3, None).await.unwrap().collect()).await;
    assert!(
        matches!(all.last(), Some(Err(GuestError::Protocol(_)))),
        "{all:?}"
    );
}

#[tokio::test]
async fn error_answers_are_remote_and_sanitised() {
    let guest = fake_guest(|io| {
        serve_h2(io, |req, respond| async move {
            match req.uri().path() {
                "/v1/files/stat" => {
                    let body = ErrorBody::new(
                        ErrorCode::NotFound,
                        format!("no such file\n\u{1b}[2J{}", "x".repeat(5000)),
                    );
                    common::respond(respond, 404, &serde_json::to_vec(&body).unwrap()).await
                }
                "/v1/processes/9" => common::respond(respond, 500, b"<html>oops</html>").await,
                "/v1/files/list" => common::respond(respond, 500, &vec![b'{'; 200 * 1024]).await,
                _ => common::respond(respond, 302, b"").await,
            }
        })
    });
    let client = guard(GuestClient::connect(&guest.sock, DEADLINE))
        .await
        .unwrap();
    let err = guard(client.stat("/nope", None)).await.unwrap_err();
    match &err {
        GuestError::Remote { status: 404, body } => {
            assert_eq!(body.code, ErrorCode::NotFound);
            assert!(body.message.len() <= space_core::error::MAX_ERROR_MESSAGE);
            assert!(!body.message.chars().any(char::is_control));
        }
        other => panic!("{other:?}"),
    }
    assert!(!err.is_channel_fault());
    let err = guard(client.process(9)).await.unwrap_err();
    assert!(
        matches!(&err, GuestError::Remote { status: 500, body } if body.code == ErrorCode::Internal),
        "{err:?}"
    );
    let err = guard(client.list("/", 1, None)).await.unwrap_err();
    assert!(
        matches!(err, GuestError::Protocol(_)),
        "oversize error body: {err:?}"
    );
    let err = guard(client.health()).await.unwrap_err();
    assert!(matches!(err, GuestError::Protocol(_)), "3xx: {err:?}");
}

#[tokio::test]
async fn stream_reset_fails_one_call_only() {
    let guest = fake_guest(|io| {
        serve_h2(io, |req, mut respond| async move {
            if req.uri().path() == "/v1/processes" {
                respond.send_reset(h2::Reason::INTERNAL_ERROR);
            } else {
                common::respond(
                    respond,
                    200,
                    br#"{"version":"v","boot_id":"b","uptime_ms":1,"processes":0}"#,
                )
                .await
            }
        })
    });
    let client = guard(GuestClient::connect(&guest.sock, DEADLINE))
        .await
        .unwrap();
    let err = guard(client.list_processes()).await.unwrap_err();
    assert!(matches!(err, GuestError::Remote { .. }), "{err:?}");
    assert!(!err.is_channel_fault());
    assert_eq!(guard(client.health()).await.unwrap().version, "v");
}

#[tokio::test]
async fn oversize_response_headers_fail_the_call() {
    let guest = fake_guest(|io| {
        serve_h2(io, |_req, mut respond| async move {
            let mut resp = http::Response::builder().status(200);
            for i in 0..64 {
                resp = resp.header(format!("x-junk-{i}"), "y".repeat(1000));
            }
            let _ = respond.send_response(resp.body(()).unwrap(), true);
        })
    });
    let client = guard(GuestClient::connect(&guest.sock, DEADLINE))
        .await
        .unwrap();
    let err = guard(client.health()).await.unwrap_err();
    // h2 treats a header block over our limit as a connection error: the guest broke HTTP/2.
    assert!(matches!(err, GuestError::Protocol(_)), "{err:?}");
}

#[tokio::test]
async fn json_calls_time_out() {
    let guest = fake_guest(|io| {
        serve_h2(io, |_req, respond| async move {
            // Never answer, but keep the stream open.
            std::future::pending::<()>().await;
            drop(respond);
        })
    });
    let opts = ClientOptions {
        json_timeout: Duration::from_millis(300),
        ..ClientOptions::default()
    };
    let client = guard(GuestClient::connect_with(&guest.sock, DEADLINE, opts))
        .await
        .unwrap();
    let err = guard(client.health()).await.unwrap_err();
    assert!(matches!(err, GuestError::Timeout(_)), "{err:?}");
    assert!(!err.is_channel_fault());
    assert!(!client.is_closed());
    // The same connection with other timeouts: the stream-open limit applies to streams.
    let quick = client.with_timeouts(Duration::from_secs(600), Duration::from_millis(200));
    let err = guard(quick.output(1, None)).await.map(|_| ()).unwrap_err();
    assert!(matches!(err, GuestError::Timeout(_)), "{err:?}");
}

#[tokio::test]
async fn query_strings_survive_hostile_paths() {
    let guest = fake_guest(|io| {
        serve_h2(io, |req, respond| async move {
            // Decode the way axum's Query does and echo the path back in a FileStat.
            let query = req.uri().query().unwrap_or("");
            let path = form_urlencoded::parse(query.as_bytes())
                .find(|(k, _)| k == "path")
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default();
            let stat = FileStat {
                path: path.clone(),
                name: path,
                kind: space_core::files::FileKind::File,
                size: 0,
                mode: 0o644,
                uid: 0,
                gid: 0,
                owner: None,
                group: None,
                modified_ms: 0,
                symlink_target: None,
                resolved: None,
                metadata: Default::default(),
            };
            common::respond(respond, 200, &serde_json::to_vec(&stat).unwrap()).await
        })
    });
    let client = guard(GuestClient::connect(&guest.sock, DEADLINE))
        .await
        .unwrap();
    for nasty in [
        "/tmp/a b",
        "/tmp/x&y=z",
        "/tmp/#frag",
        "/tmp/1+1=2",
        "/tmp/100%",
        "/tmp/é日本\u{1F600}",
        "rel/?q",
    ] {
        assert_eq!(
            guard(client.stat(nasty, Some("user"))).await.unwrap().path,
            nasty
        );
    }
    let err = client.stat("/tmp/../etc/shadow", None).await.unwrap_err();
    assert!(
        matches!(&err, GuestError::Local(b) if b.code == ErrorCode::InvalidPath),
        "{err:?}"
    );
}

#[tokio::test]
async fn early_error_answer_to_an_upload_keeps_its_body() {
    let guest = fake_guest(|io| {
        serve_h2(io, |_req, respond| async move {
            // Refuse at once, without reading the upload.
            let body = ErrorBody::new(ErrorCode::PayloadTooLarge, "disk full");
            common::respond(respond, 413, &serde_json::to_vec(&body).unwrap()).await
        })
    });
    let client = guard(GuestClient::connect(&guest.sock, DEADLINE))
        .await
        .unwrap();
    // An endless upload: only the early answer can end it.
    let body = futures::stream::repeat_with(|| Ok(Bytes::from(vec![0u8; 64 * 1024]))).boxed();
    let err = guard(client.write_file("/tmp/big", None, None, &Default::default(), body))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, GuestError::Remote { status: 413, body } if body.message == "disk full"),
        "{err:?}"
    );
}

#[tokio::test]
async fn failing_caller_body_aborts_the_upload() {
    let (seen_tx, seen_rx) = tokio::sync::oneshot::channel();
    let seen_tx = std::sync::Mutex::new(Some(seen_tx));
    let guest = fake_guest(move |io| {
        serve_h2(io, move |mut req, respond| {
            let tx = seen_tx.lock().unwrap().take();
            async move {
                let got = read_all(req.body_mut()).await;
                if let Some(tx) = tx {
                    let _ = tx.send(got.map(|b| b.len()).map_err(|e| e.to_string()));
                }
                common::respond(respond, 204, b"").await
            }
        })
    });
    let client = guard(GuestClient::connect(&guest.sock, DEADLINE))
        .await
        .unwrap();
    let body = futures::stream::iter(vec![
        Ok(Bytes::from_static(b"partial")),
        Err(std::io::Error::other("client went away")),
    ])
    .boxed();
    let err = guard(client.write_stdin(1, body, true)).await.unwrap_err();
    assert!(matches!(&err, GuestError::Local(_)), "{err:?}");
    // The guest saw a reset, not a clean end of a truncated body.
    let seen = guard(seen_rx).await.unwrap();
    assert!(seen.is_err(), "guest read a complete body: {seen:?}");
}

/// A guest streaming endless file content on `n` requests nobody reads, answering health.
async fn unread_streams_then_health(n: usize, opts: ClientOptions) -> Result<(), GuestError> {
    let guest = fake_guest(|io| {
        serve_h2(io, |req, mut respond| async move {
            if req.uri().path() == "/v1/health" {
                return common::respond(
                    respond,
                    200,
                    br#"{"version":"v","boot_id":"b","uptime_ms":1,"processes":0}"#,
                )
                .await;
            }
            let resp = http::Response::builder().status(200).body(()).unwrap();
            let Ok(mut s) = respond.send_response(resp, false) else {
                return;
            };
            let chunk = Bytes::from(vec![b'y'; 64 * 1024]);
            while send_all(&mut s, chunk.clone(), false).await {}
        })
    });
    let opts = ClientOptions {
        json_timeout: Duration::from_secs(3),
        ..opts
    };
    let client = guard(GuestClient::connect_with(&guest.sock, DEADLINE, opts))
        .await
        .unwrap();
    let mut unread = Vec::new();
    for i in 0..n {
        let (_, mut body) = guard(client.read_file(&format!("/f{i}"), None))
            .await
            .unwrap();
        // Take one chunk, so the guest is surely streaming, then stop reading.
        guard(body.next()).await.unwrap().unwrap();
        unread.push(body);
    }
    client.health().await.map(drop)
}

#[tokio::test]
async fn unread_streams_hold_only_their_own_window() {
    // Each unread stream holds up to one stream window of the connection window: with the
    // contract's windows (256 KiB of 1 MiB) three are fine...
    unread_streams_then_health(3, ClientOptions::default())
        .await
        .unwrap();
    // ...and a larger connection window makes room for more (see the crate report: with the
    // contract's 1 MiB, four unread streams starve every other call).
    let wide = ClientOptions {
        connection_window: 16 * 1024 * 1024,
        ..ClientOptions::default()
    };
    unread_streams_then_health(8, wide).await.unwrap();
}

#[tokio::test]
async fn dropping_the_last_handle_closes_the_connection() {
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let guest = fake_guest(|io| async move {
        serve_h2(io, |_req, respond| async move {
            common::respond(
                respond,
                200,
                br#"{"version":"v","boot_id":"b","uptime_ms":1,"processes":0}"#,
            )
            .await
        })
        .await;
        let _ = done_tx.send(());
    });
    let client = guard(GuestClient::connect(&guest.sock, DEADLINE))
        .await
        .unwrap();
    let other = client.clone();
    guard(client.health()).await.unwrap();
    drop(client);
    guard(other.health()).await.unwrap();
    drop(other);
    // The guest sees the connection end: no task or socket is left behind on the node.
    guard(done_rx).await.unwrap();
}
