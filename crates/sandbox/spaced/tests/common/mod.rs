//! Test harness: starts `spaced agent` on a Unix socket in a temp dir, performs the
//! handshake by hand and speaks HTTP/2 to it with hyper's client.

#![allow(dead_code)]

use std::io;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use hyper::body::Frame;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::de::DeserializeOwned;
use serde::Serialize;
use space_core::process::{ExitStatus, OutputEvent, OutputStream, ProcessInfo, ProcessSpec};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

pub type Body = BoxBody<Bytes, io::Error>;

/// A running agent; killed (SIGTERM, then SIGKILL) and its directory removed on drop.
pub struct Agent {
    child: Child,
    pub dir: tempfile::TempDir,
    pub sock: PathBuf,
}

impl Agent {
    pub fn start() -> Agent {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("agent.sock");
        let log = std::fs::File::create(dir.path().join("agent.log")).unwrap();
        let child: Child = Command::new(env!("CARGO_BIN_EXE_spaced"))
            .arg("agent")
            .arg("--channel")
            .arg(format!("unix:{}", sock.display()))
            .env("SPACED_LOG", "debug")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        // Owned from here on, so Drop stops (and waits for) the agent even if we panic.
        let agent = Agent { child, dir, sock };
        for _ in 0..500 {
            if agent.sock.exists() {
                return agent;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("agent did not create its socket");
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Connects, handshakes and returns the raw stream positioned after READY.
    pub async fn raw_handshake(&self, nonce: &str) -> (BufReader<UnixStream>, String) {
        handshake_at(&self.sock, nonce).await
    }

    pub async fn connect(&self) -> Client {
        let (stream, _) = self.raw_handshake("c0ffee").await;
        assert!(stream.buffer().is_empty());
        Client::over(stream.into_inner()).await
    }
}

/// Connects to the agent's socket. The file appears at `bind`, a moment before the agent
/// listens: a refusal in between is retried (for up to 5 s), as the host's dialer does.
pub async fn dial(sock: &std::path::Path) -> UnixStream {
    for _ in 0..500 {
        match UnixStream::connect(sock).await {
            Ok(stream) => return stream,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            Err(e) => panic!("connect to {}: {e}", sock.display()),
        }
    }
    panic!("the agent never accepted on {}", sock.display())
}

/// Connects to `sock` and handshakes, repeating HELLO every 250 ms until READY (as the
/// host does: the guest may still be booting, and a virtio-serial port may hold stale bytes).
pub async fn handshake_at(sock: &std::path::Path, nonce: &str) -> (BufReader<UnixStream>, String) {
    let stream = dial(sock).await;
    let mut stream = BufReader::new(stream);
    for _ in 0..400 {
        stream
            .get_mut()
            .write_all(format!("SPACE-HELLO 1 {nonce}\n").as_bytes())
            .await
            .unwrap();
        if let Ok(ready) =
            tokio::time::timeout(Duration::from_millis(250), read_ready(&mut stream, nonce)).await
        {
            return (stream, ready);
        }
    }
    panic!("no READY from {}", sock.display());
}

/// Reads lines until the READY carrying `nonce`.
pub async fn read_ready(stream: &mut BufReader<UnixStream>, nonce: &str) -> String {
    loop {
        let mut line = String::new();
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read_line(&mut line))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "EOF before READY");
        if let Some(r) = space_guest_proto::handshake::Ready::parse(line.trim_end().as_bytes()) {
            if r.nonce == nonce {
                return line;
            }
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log =
                std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default();
            eprintln!("---- agent log ----\n{log}");
        }
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        for _ in 0..500 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Client {
    send: SendRequest<Body>,
}

pub fn empty() -> Body {
    Empty::new().map_err(|e| match e {}).boxed()
}

pub fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).map_err(|e| match e {}).boxed()
}

/// A body streamed from chunks.
pub fn chunks(chunks: Vec<Bytes>) -> Body {
    let s = futures::stream::iter(
        chunks
            .into_iter()
            .map(|c| Ok::<_, io::Error>(Frame::data(c))),
    );
    BodyExt::boxed(StreamBody::new(s))
}

pub fn url(path_and_query: &str) -> String {
    format!("http://guest{path_and_query}")
}

impl Client {
    pub async fn over(stream: UnixStream) -> Client {
        let (send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Client { send }
    }

    pub async fn request(
        &self,
        method: Method,
        path: &str,
        body: Body,
    ) -> hyper::Response<hyper::body::Incoming> {
        let req = Request::builder()
            .method(method)
            .uri(url(path))
            .header("content-type", "application/json")
            .body(body)
            .unwrap();
        let mut send = self.send.clone();
        send.ready().await.unwrap();
        send.send_request(req).await.unwrap()
    }

    /// Sends a request and collects the whole response.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Body,
    ) -> (StatusCode, HeaderMap, Bytes) {
        let resp = self.request(method, path, body).await;
        let (parts, body) = resp.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes();
        (parts.status, parts.headers, bytes)
    }

    pub async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: &impl Serialize,
    ) -> (StatusCode, T) {
        let (status, _, bytes) = self
            .call(method, path, full(serde_json::to_vec(body).unwrap()))
            .await;
        let value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("{status}: {e}: {}", String::from_utf8_lossy(&bytes)));
        (status, value)
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> (StatusCode, T) {
        let (status, _, bytes) = self.call(Method::GET, path, empty()).await;
        let value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("{status}: {e}: {}", String::from_utf8_lossy(&bytes)));
        (status, value)
    }

    /// Expects an error response with this status and code.
    pub async fn expect_error(
        &self,
        method: Method,
        path: &str,
        body: Body,
        status: u16,
        code: &str,
    ) -> String {
        let (s, _, bytes) = self.call(method, path, body).await;
        let v: serde_json::Value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("{s}: {e}: {}", String::from_utf8_lossy(&bytes)));
        assert_eq!(
            (s.as_u16(), v["code"].as_str().unwrap()),
            (status, code),
            "{v}"
        );
        v["message"].as_str().unwrap().to_owned()
    }

    pub async fn start(&self, spec: &ProcessSpec) -> ProcessInfo {
        let (status, info) = self
            .json::<ProcessInfo>(Method::POST, "/v1/processes", spec)
            .await;
        assert_eq!(status, StatusCode::CREATED);
        info
    }

    /// The whole output stream (it ends after `exit`).
    pub async fn output(&self, id: u64, after: u64) -> Vec<OutputEvent> {
        let (status, headers, bytes) = self
            .call(
                Method::GET,
                &format!("/v1/processes/{id}/output?after={after}"),
                empty(),
            )
            .await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers["content-type"], "application/x-ndjson");
        bytes
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect()
    }

    /// Runs a process to completion: (stdout, stderr, pty, exit).
    pub async fn run(&self, spec: &ProcessSpec) -> Run {
        let info = self.start(spec).await;
        collect(info.id, self.output(info.id, 0).await)
    }
}

#[derive(Debug, Default)]
pub struct Run {
    pub id: u64,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub pty: Vec<u8>,
    pub exit: Option<ExitStatus>,
}

impl Run {
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

pub fn collect(id: u64, events: Vec<OutputEvent>) -> Run {
    let mut run = Run {
        id,
        ..Run::default()
    };
    let mut last_seq = 0;
    for ev in &events {
        assert!(ev.seq() > last_seq, "sequence numbers increase: {events:?}");
        last_seq = ev.seq();
        assert!(run.exit.is_none(), "exit is the last event");
        match ev {
            OutputEvent::Data { .. } => {
                let (stream, bytes) = ev.bytes().unwrap();
                match stream {
                    OutputStream::Stdout => run.stdout.extend(bytes),
                    OutputStream::Stderr => run.stderr.extend(bytes),
                    OutputStream::Pty => run.pty.extend(bytes),
                }
            }
            OutputEvent::Exit { status, .. } => run.exit = Some(*status),
            _ => {}
        }
    }
    run
}

pub fn exited(code: i32) -> Option<ExitStatus> {
    Some(ExitStatus {
        exit_code: Some(code),
        signal: None,
        timed_out: false,
    })
}

pub fn q(s: &str) -> String {
    // Minimal percent-encoding for paths in query strings.
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
