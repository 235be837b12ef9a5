//! Connections to TCP ports inside the guest against a real agent and TCP servers in the
//! test: an echo round trip, the half-close, the server closing first, a large transfer
//! both ways at once, a refused port, servers on loopback only (private), a dual-stack
//! wildcard server, bad ports and the bound.

mod common;

use std::io;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use futures::StreamExt;
use http::{Method, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use sha2::{Digest, Sha256};
use space_guest_proto::limits::MAX_PORT_CONNECTIONS;
use space_guest_proto::routes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// A request body fed from a channel; it ends when the sender is dropped.
fn channel_body() -> (mpsc::Sender<Bytes>, Body) {
    let (tx, rx) = mpsc::channel::<Bytes>(4);
    let stream = receiver_stream(rx).map(|b| Ok::<_, io::Error>(Frame::data(b)));
    (tx, BodyExt::boxed(StreamBody::new(stream)))
}

fn receiver_stream(mut rx: mpsc::Receiver<Bytes>) -> impl futures::Stream<Item = Bytes> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// Everything left in a response body.
async fn read_all(body: &mut Incoming) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(frame) = tokio::time::timeout(Duration::from_secs(30), body.frame())
        .await
        .expect("response body stalled")
    {
        if let Ok(d) = frame.expect("response body failed").into_data() {
            out.extend_from_slice(&d);
        }
    }
    out
}

/// Reads until `want` bytes have arrived.
async fn read_n(body: &mut Incoming, want: usize) -> Vec<u8> {
    let mut out = Vec::new();
    while out.len() < want {
        let frame = tokio::time::timeout(Duration::from_secs(30), body.frame())
            .await
            .expect("response body stalled")
            .expect("response ended early");
        if let Ok(d) = frame.expect("response body failed").into_data() {
            out.extend_from_slice(&d);
        }
    }
    out
}

/// A server on `addr` that echoes each connection; when the client half-closes, it sends
/// `bye` and closes.
async fn echo_server(addr: &str) -> Option<u16> {
    let listener = TcpListener::bind(addr).await.ok()?;
    let port = listener.local_addr().ok()?.port();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if conn.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
                let _ = conn.write_all(b"bye").await;
                let _ = conn.shutdown().await;
            });
        }
    });
    Some(port)
}

fn connect_url(port: u16) -> String {
    routes::port_connect(port)
}

#[tokio::test]
async fn echo_round_trip_and_half_close() {
    let agent = Agent::start();
    let c = agent.connect().await;
    let port = echo_server("0.0.0.0:0").await.unwrap();
    let (tx, body) = channel_body();
    let resp = c.request(Method::POST, &connect_url(port), body).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let mut out = resp.into_body();
    tx.send(Bytes::from_static(b"hello")).await.unwrap();
    assert_eq!(read_n(&mut out, 5).await, b"hello");
    tx.send(Bytes::from_static(b" again")).await.unwrap();
    assert_eq!(read_n(&mut out, 6).await, b" again");
    // The end of the request body half-closes the connection: the server still answers.
    drop(tx);
    assert_eq!(read_all(&mut out).await, b"bye");
}

#[tokio::test]
async fn the_server_closing_ends_the_response() {
    let agent = Agent::start();
    let c = agent.connect().await;
    let listener = TcpListener::bind("0.0.0.0:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        conn.write_all(b"greeting").await.unwrap();
    });
    let (tx, body) = channel_body();
    let resp = c.request(Method::POST, &connect_url(port), body).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let mut out = resp.into_body();
    assert_eq!(read_all(&mut out).await, b"greeting");
    drop(tx);
}

#[tokio::test]
async fn a_large_transfer_flows_both_ways_at_once() {
    let agent = Agent::start();
    let c = agent.connect().await;
    let port = echo_server("0.0.0.0:0").await.unwrap();
    let data: Vec<u8> = (0..24u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 11) as u8)
        .collect();
    let expected = Sha256::digest(&data);
    let (tx, body) = channel_body();
    let resp = c.request(Method::POST, &connect_url(port), body).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let len = data.len();
    // Sending and receiving at once: the echo only keeps up if neither side buffers it all.
    let sender = tokio::spawn(async move {
        for chunk in data.chunks(100 * 1024) {
            tx.send(Bytes::copy_from_slice(chunk)).await.unwrap();
        }
    });
    let mut out = resp.into_body();
    let echoed = read_n(&mut out, len).await;
    sender.await.unwrap();
    assert_eq!(echoed.len(), len);
    assert_eq!(Sha256::digest(&echoed), expected);
    assert_eq!(read_all(&mut out).await, b"bye");
}

#[tokio::test]
async fn a_closed_port_is_port_closed() {
    let agent = Agent::start();
    let c = agent.connect().await;
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    // Nothing listening, and servers bound to loopback only, which are private: the daemon
    // connects to the guest's network address, never to loopback (IPv4 and IPv6 alike).
    let private_v4 = echo_server("127.0.0.1:0").await;
    let private_v6 = echo_server("[::1]:0").await;
    for (port, why) in [
        (Some(port), "port is not open"),
        (private_v4, "loopback only are private"),
        (private_v6, "loopback only are private"),
    ] {
        let Some(port) = port else {
            eprintln!("SKIPPED: no IPv6 loopback here");
            continue;
        };
        let msg = c
            .expect_error(
                Method::POST,
                &connect_url(port),
                empty(),
                502,
                "port_closed",
            )
            .await;
        assert!(msg.contains(why), "{msg}");
    }
    for bad in [
        "/v1/ports/0/connect",
        "/v1/ports/65536/connect",
        "/v1/ports/x/connect",
    ] {
        c.expect_error(Method::POST, bad, empty(), 400, "invalid_request")
            .await;
    }
    c.expect_error(
        Method::GET,
        &connect_url(port),
        empty(),
        400,
        "invalid_request",
    )
    .await;
}

/// A dual-stack server on `[::]` takes the connection to the IPv4 network address.
#[tokio::test]
async fn a_dual_stack_wildcard_server_is_reached() {
    let agent = Agent::start();
    let c = agent.connect().await;
    let Some(port) = echo_server("[::]:0").await else {
        eprintln!("SKIPPED: no IPv6 here");
        return;
    };
    let (tx, body) = channel_body();
    let resp = c.request(Method::POST, &connect_url(port), body).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let mut out = resp.into_body();
    tx.send(Bytes::from_static(b"six")).await.unwrap();
    assert_eq!(read_n(&mut out, 3).await, b"six");
}

#[tokio::test]
async fn connections_are_bounded_and_freed() {
    let agent = Agent::start();
    let c = agent.connect().await;
    let port = echo_server("0.0.0.0:0").await.unwrap();
    let mut open = Vec::new();
    for _ in 0..MAX_PORT_CONNECTIONS {
        let (tx, body) = channel_body();
        let resp = c.request(Method::POST, &connect_url(port), body).await;
        assert_eq!(resp.status(), StatusCode::OK);
        open.push((tx, resp.into_body()));
    }
    c.expect_error(
        Method::POST,
        &connect_url(port),
        empty(),
        429,
        "too_many_requests",
    )
    .await;
    // A finished connection frees its slot.
    let (tx, mut out) = open.pop().unwrap();
    drop(tx);
    assert_eq!(read_all(&mut out).await, b"bye");
    let mut freed = false;
    for _ in 0..100 {
        let (_tx, body) = channel_body();
        let resp = c.request(Method::POST, &connect_url(port), body).await;
        if resp.status() == StatusCode::OK {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(freed, "the finished connection's slot was not freed");
}
