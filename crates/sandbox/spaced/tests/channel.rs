//! The channel: handshake edge cases and session recovery.

mod common;

use std::time::Duration;

use common::*;
use http::{Method, StatusCode};
use space_guest_proto::Health;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

async fn expect_closed(stream: &mut UnixStream) {
    let mut buf = vec![0u8; 4096];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(30), stream.read(&mut buf))
            .await
            .expect("session was not closed");
        match n {
            Ok(0) | Err(_) => return,
            Ok(_) => {} // e.g. a GOAWAY frame
        }
    }
}

#[tokio::test]
async fn garbage_before_hello_is_ignored() {
    let agent = Agent::start();
    let stream = dial(&agent.sock).await;
    let mut stream = BufReader::new(stream);
    let mut junk: Vec<u8> = (0..10_000u32).map(|i| (i * 7919 % 256) as u8).collect();
    junk.extend_from_slice(
        b"\nSPACE-HELLO 1 zz\nSPACE-HELLO 2\nPRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\n",
    );
    stream.get_mut().write_all(&junk).await.unwrap();
    // Stale bytes before the HELLO on the same line are tolerated too.
    stream
        .get_mut()
        .write_all(b"stale-bytesSPACE-HELLO 1 abc123\nSPACE-HELLO 1 abc123\n")
        .await
        .unwrap();
    let ready = read_ready(&mut stream, "abc123").await;
    let parts: Vec<&str> = ready.trim_end().split(' ').collect();
    assert_eq!(parts[..3], ["SPACE-READY", "1", "abc123"]);
    assert_eq!(parts[4], env!("CARGO_PKG_VERSION"));
    assert!(stream.buffer().is_empty());
    let c = Client::over(stream.into_inner()).await;
    let (s, health) = c.get::<Health>("/v1/health").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(health.boot_id, parts[3]);
}

#[tokio::test]
async fn unsupported_version_is_refused() {
    let agent = Agent::start();
    let mut stream = dial(&agent.sock).await;
    stream.write_all(b"SPACE-HELLO 99 ab\n").await.unwrap();
    let mut buf = vec![0u8; 64];
    let n = stream.read(&mut buf).await.unwrap();
    assert_eq!(&buf[..n], b"SPACE-REFUSED unsupported-version 1\n");
}

#[tokio::test]
async fn garbage_after_handshake_ends_only_that_session() {
    let agent = Agent::start();
    let c = agent.connect().await;
    let (s, first) = c.get::<Health>("/v1/health").await;
    assert_eq!(s, StatusCode::OK);

    // Garbage instead of the HTTP/2 preface.
    let (stream, _) = agent.raw_handshake("01").await;
    let mut stream = stream.into_inner();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    expect_closed(&mut stream).await;

    // Garbage after a valid preface.
    let (stream, _) = agent.raw_handshake("02").await;
    let mut stream = stream.into_inner();
    stream
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    stream.write_all(&[0xff; 4096]).await.unwrap();
    expect_closed(&mut stream).await;

    // A session that just disappears mid-request.
    let (stream, _) = agent.raw_handshake("03").await;
    drop(stream);

    // The daemon keeps serving: old and new sessions both work, same boot.
    let (s, again) = c.get::<Health>("/v1/health").await;
    assert_eq!(s, StatusCode::OK);
    let c2 = agent.connect().await;
    let (s, other) = c2.get::<Health>("/v1/health").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(first.boot_id, again.boot_id);
    assert_eq!(first.boot_id, other.boot_id);
    let run = c2
        .run(&space_core::process::ProcessSpec::argv([
            "echo",
            "still here",
        ]))
        .await;
    assert_eq!(run.stdout(), "still here\n");
    let _ = Method::GET;
}
