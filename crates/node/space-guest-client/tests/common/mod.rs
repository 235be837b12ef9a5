//! A hostile fake guest for the client's tests: a Unix socket that speaks the real
//! handshake and then whatever a test wants (garbage, silence, or an h2 server with
//! misbehaving handlers).

#![allow(dead_code)]

use std::future::{poll_fn, Future};
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use http::Request;
use space_guest_client::prefixed::Prefixed;
use space_guest_proto::handshake::{Hello, Ready};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::task::JoinHandle;

/// The guest end after the handshake: the socket with any HTTP/2 bytes already read put back.
pub type GuestIo = Prefixed<UnixStream>;

/// A listening fake guest. Dropping it stops the peer task and removes the socket directory.
pub struct FakeGuest {
    pub sock: PathBuf,
    _dir: tempfile::TempDir,
    task: JoinHandle<()>,
}

impl Drop for FakeGuest {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Listens on a fresh socket; for the first connection, answers the handshake and runs `behave`.
pub fn fake_guest<F, Fut>(behave: F) -> FakeGuest
where
    F: FnOnce(GuestIo) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("guest.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let task = tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        if let Some(io) = guest_handshake(stream).await {
            behave(io).await;
        }
    });
    FakeGuest {
        sock,
        _dir: dir,
        task,
    }
}

/// The guest side of the handshake, as the contract describes it: ignore everything but a
/// well-formed HELLO, answer READY, drop further HELLO lines until the HTTP/2 preface.
pub async fn guest_handshake(mut s: UnixStream) -> Option<GuestIo> {
    let mut buf: Vec<u8> = Vec::new();
    let mut tmp = [0u8; 4096];
    loop {
        if let Some(pos) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            if let Some(h) = Hello::parse(&line[..line.len() - 1]) {
                let ready = Ready {
                    version: 1,
                    nonce: h.nonce,
                    boot_id: "fakeboot".into(),
                    daemon_version: "0.0.0-fake".into(),
                };
                s.write_all(ready.encode().as_bytes()).await.ok()?;
                break;
            }
            continue;
        }
        let n = s.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    }
    loop {
        if buf.len() >= 3 && buf.starts_with(b"PRI") {
            break;
        }
        if buf.starts_with(b"SPACE-HELLO") {
            if let Some(pos) = buf.iter().position(|&b| b == b'\n') {
                buf.drain(..=pos);
                continue;
            }
        }
        let n = s.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    }
    Some(Prefixed::new(Bytes::from(buf), s))
}

/// Runs an h2 server on `io`, calling `handler` for every request in its own task.
pub async fn serve_h2<H, Fut>(io: GuestIo, handler: H)
where
    H: Fn(Request<RecvStream>, SendResponse<Bytes>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let handler = Arc::new(handler);
    let Ok(mut conn) = h2::server::Builder::new()
        .max_concurrent_streams(256)
        .handshake::<_, Bytes>(io)
        .await
    else {
        return;
    };
    while let Some(Ok((req, respond))) = conn.accept().await {
        tokio::spawn(handler(req, respond));
    }
}

/// Sends `data` with flow control; false if the stream went away.
pub async fn send_all(stream: &mut SendStream<Bytes>, mut data: Bytes, end: bool) -> bool {
    while !data.is_empty() {
        stream.reserve_capacity(data.len().min(64 * 1024));
        let cap = loop {
            let cap = stream.capacity();
            if cap > 0 {
                break cap;
            }
            match poll_fn(|cx| stream.poll_capacity(cx)).await {
                Some(Ok(_)) => continue,
                _ => return false,
            }
        };
        if stream
            .send_data(data.split_to(cap.min(data.len())), false)
            .is_err()
        {
            return false;
        }
    }
    if end {
        return stream.send_data(Bytes::new(), true).is_ok();
    }
    true
}

/// Answers with `status` and a complete body.
pub async fn respond(mut respond: SendResponse<Bytes>, status: u16, body: &[u8]) {
    let resp = http::Response::builder().status(status).body(()).unwrap();
    if let Ok(mut s) = respond.send_response(resp, body.is_empty()) {
        if !body.is_empty() {
            send_all(&mut s, Bytes::copy_from_slice(body), true).await;
        }
    }
}

/// Reads a whole request body.
pub async fn read_all(body: &mut RecvStream) -> Result<Vec<u8>, h2::Error> {
    let mut out = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// A generous guard so a broken test fails instead of hanging; never a timing assertion.
pub async fn guard<T>(fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(std::time::Duration::from_secs(120), fut)
        .await
        .expect("test guard: took far too long")
}
