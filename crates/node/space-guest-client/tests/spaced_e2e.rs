//! End to end against the real guest daemon: `spaced agent --channel unix:SOCK` runs on
//! this machine (as root, acting as root) and the client talks to it over the socket, the
//! same byte stream QEMU's virtio-serial chardev gives the node.
//!
//! The daemon binary is `$SPACE_SPACED_BIN` when that file exists (what `scripts/test`
//! builds), else it is built here with `cargo build -p spaced`. If it cannot be built, every
//! test here prints why and passes without running. `SPACED_TEST_LOG=1` shows its log.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use sha2::{Digest, Sha256};
use space_core::files::watch::{FileChange, WatchEvent, WatchRequest};
use space_core::files::{FileKind, MkdirRequest, RenameRequest};
use space_core::process::{ExitStatus, OutputEvent, OutputStream, ProcessSpec, PtySize};
use space_core::ErrorCode;
use space_guest_client::{GuestClient, GuestError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

/// The user everything runs as: the daemon runs on the host here, where only root is sure to exist.
const USER: &str = "root";

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../..")
}

/// The spaced binary, built once per test run; `None` (with the reason printed) if unavailable.
fn spaced_bin() -> Option<&'static Path> {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let bin = BIN.get_or_init(|| {
        // What `scripts/test` builds (static, release), when present.
        if let Some(p) = std::env::var_os("SPACE_SPACED_BIN").map(PathBuf::from) {
            if p.is_file() {
                return Ok(p);
            }
        }
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = std::process::Command::new(cargo)
            .args(["build", "-p", "spaced", "--message-format=short"])
            .current_dir(workspace_root())
            .output()
            .map_err(|e| format!("cannot run cargo: {e}"))?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = stderr.lines().rev().take(15).collect();
            return Err(format!(
                "`cargo build -p spaced` failed:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            ));
        }
        let target = std::env::var("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|_| workspace_root().join("target"));
        Ok(target.join("debug/spaced"))
    });
    match bin {
        Ok(p) => Some(p.as_path()),
        Err(why) => {
            eprintln!("SKIPPED: the spaced binary is not available: {why}");
            None
        }
    }
}

/// A running `spaced agent` on a private socket, killed on drop.
struct Spaced {
    client: GuestClient,
    child: Child,
    sock: PathBuf,
    dir: tempfile::TempDir,
}

impl Spaced {
    /// Starts the daemon and connects; `None` when the binary is unavailable.
    async fn start() -> Option<Spaced> {
        let bin = spaced_bin()?;
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("agent.sock");
        // The daemon's log goes to this test's stderr only when asked for (SPACED_TEST_LOG=1).
        let log = if std::env::var_os("SPACED_TEST_LOG").is_some() {
            Stdio::inherit()
        } else {
            Stdio::null()
        };
        let child = Command::new(bin)
            .arg("agent")
            .arg("--channel")
            .arg(format!("unix:{}", sock.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("spawn spaced");
        let client = GuestClient::connect(&sock, Duration::from_secs(60))
            .await
            .expect("connect to spaced");
        Some(Spaced {
            client,
            child,
            sock,
            dir,
        })
    }

    /// A path inside this test's private directory.
    fn path(&self, rel: &str) -> String {
        self.dir
            .path()
            .join("files")
            .join(rel)
            .display()
            .to_string()
    }
}

/// A generous guard so a broken test fails instead of hanging; never a timing assertion.
async fn guard<T>(fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(300), fut)
        .await
        .expect("test guard: took far too long")
}

fn spec(argv: &[&str]) -> ProcessSpec {
    ProcessSpec {
        user: Some(USER.into()),
        ..ProcessSpec::argv(argv.iter().copied())
    }
}

#[derive(Debug, Default)]
struct Ran {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    exit: Option<ExitStatus>,
}

/// Collects a process's output until its exit event.
async fn collect(client: &GuestClient, id: u64) -> Ran {
    let mut events = client.output(id, None).await.unwrap();
    let mut ran = Ran::default();
    while let Some(ev) = events.next().await {
        match ev.unwrap() {
            ev @ OutputEvent::Data { .. } => {
                let (stream, bytes) = ev.bytes().unwrap();
                match stream {
                    OutputStream::Stderr => ran.stderr.extend(bytes),
                    _ => ran.stdout.extend(bytes),
                }
            }
            OutputEvent::Exit { status, .. } => ran.exit = Some(status),
            _ => {}
        }
    }
    ran
}

async fn run(client: &GuestClient, spec: &ProcessSpec) -> Ran {
    let info = client.start_process(spec).await.unwrap();
    collect(client, info.id).await
}

#[tokio::test]
async fn health_and_echo() {
    let Some(d) = Spaced::start().await else {
        return;
    };
    guard(async {
        let h = d.client.health().await.unwrap();
        assert_eq!(h.boot_id, d.client.ready().boot_id);
        assert_eq!(h.version, d.client.ready().daemon_version);
        let ran = run(&d.client, &spec(&["echo", "hello", "world"])).await;
        assert_eq!(ran.stdout, b"hello world\n");
        assert_eq!(ran.exit.unwrap().exit_code, Some(0));
        let ran = run(
            &d.client,
            &ProcessSpec {
                user: Some(USER.into()),
                ..ProcessSpec::shell("echo out; echo err >&2; exit 3")
            },
        )
        .await;
        assert_eq!(ran.stdout, b"out\n");
        assert_eq!(ran.stderr, b"err\n");
        assert_eq!(ran.exit.unwrap().exit_code, Some(3));
        // A program that does not exist is the guest's refusal, not a channel fault.
        let err = d
            .client
            .start_process(&spec(&["/nonexistent/program"]))
            .await
            .unwrap_err();
        assert!(!err.is_channel_fault(), "{err:?}");
    })
    .await;
}

#[tokio::test]
async fn stdin_is_streamed() {
    let Some(d) = Spaced::start().await else {
        return;
    };
    guard(async {
        let info = d
            .client
            .start_process(&ProcessSpec {
                stdin: true,
                ..spec(&["cat"])
            })
            .await
            .unwrap();
        let out = tokio::spawn({
            let client = d.client.clone();
            async move { collect(&client, info.id).await }
        });
        let first = futures::stream::iter(vec![
            Ok(Bytes::from_static(b"hello ")),
            Ok(Bytes::from_static(b"there\n")),
        ])
        .boxed();
        d.client.write_stdin(info.id, first, false).await.unwrap();
        let second = futures::stream::iter(vec![Ok(Bytes::from_static(b"bye\n"))]).boxed();
        d.client.write_stdin(info.id, second, true).await.unwrap();
        let ran = out.await.unwrap();
        assert_eq!(ran.stdout, b"hello there\nbye\n");
        assert_eq!(ran.exit.unwrap().exit_code, Some(0));
    })
    .await;
}

/// Deterministic pseudo-random bytes (xorshift), so the file is not trivially compressible.
fn chunk(seed: u64, len: usize) -> Bytes {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    Bytes::from(out)
}

#[tokio::test]
async fn fifty_mib_file_round_trip() {
    let Some(d) = Spaced::start().await else {
        return;
    };
    guard(async {
        const MIB: usize = 1024 * 1024;
        const SIZE: usize = 50 * MIB;
        let mut sent = Sha256::new();
        let chunks: Vec<Bytes> = (0..50).map(|i| chunk(i, MIB)).collect();
        for c in &chunks {
            sent.update(c);
        }
        let sent = hex::encode(sent.finalize());
        let path = d.path("big dir/blob #1.bin");
        let body = futures::stream::iter(chunks.into_iter().map(Ok)).boxed();
        let stat = d
            .client
            .write_file(&path, Some(USER), Some(0o600), &Default::default(), body)
            .await
            .unwrap();
        assert_eq!(stat.size, SIZE as u64);
        assert_eq!(stat.kind, FileKind::File);
        assert_eq!(stat.mode & 0o777, 0o600);

        let (size, mut stream) = d.client.read_file(&path, Some(USER)).await.unwrap();
        assert_eq!(size, Some(SIZE as u64));
        let mut got = Sha256::new();
        let mut total = 0usize;
        while let Some(c) = stream.next().await {
            let c = c.unwrap();
            total += c.len();
            got.update(&c);
        }
        assert_eq!(total, SIZE);
        assert_eq!(hex::encode(got.finalize()), sent);
    })
    .await;
}

#[tokio::test]
async fn file_operations() {
    let Some(d) = Spaced::start().await else {
        return;
    };
    guard(async {
        let c = &d.client;
        let dir = d.path("tree/sub dir/é");
        let st = c
            .mkdir(&MkdirRequest {
                path: dir.clone(),
                mode: None,
                user: Some(USER.into()),
            })
            .await
            .unwrap();
        assert_eq!(st.kind, FileKind::Dir);
        let file = format!("{dir}/a&b.txt");
        let body = futures::stream::iter(vec![Ok(Bytes::from_static(b"content"))]).boxed();
        c.write_file(&file, Some(USER), None, &Default::default(), body)
            .await
            .unwrap();

        let st = c.stat(&file, Some(USER)).await.unwrap();
        assert_eq!(
            (st.kind, st.size, st.name.as_str()),
            (FileKind::File, 7, "a&b.txt")
        );

        let list = c.list(&d.path("tree"), 3, Some(USER)).await.unwrap();
        assert!(!list.truncated);
        let names: Vec<&str> = list.entries.iter().map(|e| e.name.as_str()).collect();
        assert!(
            names.contains(&"sub dir") && names.contains(&"é") && names.contains(&"a&b.txt"),
            "{names:?}"
        );

        let moved = d.path("tree/moved #2.txt");
        c.rename(&RenameRequest {
            from: file.clone(),
            to: moved.clone(),
            user: Some(USER.into()),
        })
        .await
        .unwrap();
        let err = c.stat(&file, Some(USER)).await.unwrap_err();
        assert!(
            matches!(&err, GuestError::Remote { body, .. } if body.code == ErrorCode::NotFound),
            "{err:?}"
        );
        let (_, bytes) = c.read_file(&moved, Some(USER)).await.unwrap();
        let bytes: Vec<Bytes> = bytes.map(|b| b.unwrap()).collect().await;
        assert_eq!(bytes.concat(), b"content");

        // A non-empty directory needs `recursive`.
        let err = c
            .remove(&d.path("tree"), false, Some(USER))
            .await
            .unwrap_err();
        assert!(matches!(err, GuestError::Remote { .. }), "{err:?}");
        c.remove(&d.path("tree"), true, Some(USER)).await.unwrap();
        let err = c.stat(&d.path("tree"), Some(USER)).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::NotFound);

        // Refused before it is sent.
        let err = c
            .stat(&d.path("x/../../etc"), Some(USER))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, GuestError::Local(b) if b.code == ErrorCode::InvalidPath),
            "{err:?}"
        );
        assert!(!c.is_closed());
    })
    .await;
}

#[tokio::test]
async fn fifty_parallel_execs_share_one_connection() {
    let Some(d) = Spaced::start().await else {
        return;
    };
    guard(async {
        let runs = (0..50).map(|i| {
            let client = d.client.clone();
            async move {
                let ran = run(&client, &spec(&["echo", &format!("run {i}")])).await;
                (i, ran)
            }
        });
        for (i, ran) in futures::future::join_all(runs).await {
            assert_eq!(ran.stdout, format!("run {i}\n").into_bytes());
            assert_eq!(ran.exit.unwrap().exit_code, Some(0));
        }
        let all = d.client.list_processes().await.unwrap();
        assert!(all.len() >= 50);
    })
    .await;
}

#[tokio::test]
async fn endless_output_does_not_stall_other_calls() {
    let Some(d) = Spaced::start().await else {
        return;
    };
    guard(async {
        let c = &d.client;
        // One `yes` read continuously, one whose output nobody reads.
        let read_yes = c.start_process(&spec(&["yes"])).await.unwrap();
        let unread_yes = c.start_process(&spec(&["yes", "unread"])).await.unwrap();
        let mut unread = c.output(unread_yes.id, None).await.unwrap();
        // Take one event so the stream is surely open, then leave it unread.
        unread.next().await.unwrap().unwrap();
        let reader = tokio::spawn({
            let client = c.clone();
            async move {
                let mut events = client.output(read_yes.id, None).await.unwrap();
                let mut bytes = 0usize;
                let mut exit = None;
                while let Some(ev) = events.next().await {
                    match ev.unwrap() {
                        ev @ OutputEvent::Data { .. } => bytes += ev.bytes().unwrap().1.len(),
                        OutputEvent::Exit { status, .. } => exit = Some(status),
                        _ => {}
                    }
                }
                (bytes, exit)
            }
        });
        // While both pour out output, short calls still get through.
        for i in 0..5 {
            let ran = run(c, &spec(&["echo", &format!("still here {i}")])).await;
            assert_eq!(ran.stdout, format!("still here {i}\n").into_bytes());
            c.health().await.unwrap();
        }
        c.signal(read_yes.id, 9).await.unwrap();
        let (bytes, exit) = reader.await.unwrap();
        assert!(bytes > 0);
        assert_eq!(exit.unwrap().signal, Some(9));
        c.signal(unread_yes.id, 9).await.unwrap();
        drop(unread);
        // The killed process reports how it ended.
        let info = c.process(read_yes.id).await.unwrap();
        assert_eq!(info.exit.unwrap().signal, Some(9));
    })
    .await;
}

#[tokio::test]
async fn signals_listing_and_pty() {
    let Some(d) = Spaced::start().await else {
        return;
    };
    guard(async {
        let c = &d.client;
        let sleeper = c
            .start_process(&ProcessSpec {
                tag: Some("sleeper".into()),
                ..spec(&["sleep", "1000"])
            })
            .await
            .unwrap();
        let listed = c.list_processes().await.unwrap();
        let me = listed.iter().find(|p| p.id == sleeper.id).unwrap();
        assert_eq!(me.tag.as_deref(), Some("sleeper"));
        assert!(me.exit.is_none());
        c.signal(sleeper.id, 15).await.unwrap();
        let ran = collect(c, sleeper.id).await;
        assert_eq!(ran.exit.unwrap().signal, Some(15));

        let pty = c
            .start_process(&ProcessSpec {
                pty: Some(PtySize { rows: 24, cols: 80 }),
                stdin: true,
                ..spec(&["sh"])
            })
            .await
            .unwrap();
        c.resize(
            pty.id,
            PtySize {
                rows: 50,
                cols: 132,
            },
        )
        .await
        .unwrap();
        let input =
            futures::stream::iter(vec![Ok(Bytes::from_static(b"stty size; exit 0\n"))]).boxed();
        c.write_stdin(pty.id, input, false).await.unwrap();
        let ran = collect(c, pty.id).await;
        assert!(
            String::from_utf8_lossy(&ran.stdout).contains("50 132"),
            "{:?}",
            String::from_utf8_lossy(&ran.stdout)
        );

        // Resizing a process without a pty is refused by the guest (409), not a channel fault.
        let plain = c.start_process(&spec(&["sleep", "1000"])).await.unwrap();
        let err = c
            .resize(plain.id, PtySize { rows: 10, cols: 10 })
            .await
            .unwrap_err();
        assert!(
            matches!(err, GuestError::Remote { status: 409, .. }),
            "{err:?}"
        );
        c.signal(plain.id, 9).await.unwrap();
        let err = c.process(u64::MAX).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::NotFound);
    })
    .await;
}

#[tokio::test]
async fn second_session_after_stale_bytes() {
    let Some(d) = Spaced::start().await else {
        return;
    };
    guard(async {
        let info = d
            .client
            .start_process(&spec(&["echo", "from the first session"]))
            .await
            .unwrap();
        // Another session on a stream that starts with stale bytes (what a virtio-serial
        // port can hold from an earlier host connection): the handshake skips them.
        let mut raw = tokio::net::UnixStream::connect(&d.sock).await.unwrap();
        use tokio::io::AsyncWriteExt;
        raw.write_all(b"\x00\x01stale junk\nSPACE-HELLO 1 zz\nPRI * HTTP/2.0 half a preface\n")
            .await
            .unwrap();
        let second = GuestClient::connect_stream(raw, Duration::from_secs(60), Default::default())
            .await
            .unwrap();
        // Same daemon, same boot: the process started in the first session is visible.
        assert_eq!(second.ready().boot_id, d.client.ready().boot_id);
        let ran = collect(&second, info.id).await;
        assert_eq!(ran.stdout, b"from the first session\n");
        // Ending the first session leaves the second working.
        drop(d.client);
        second.health().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn close_ends_open_streams_and_frees_the_channel() {
    let Some(d) = Spaced::start().await else {
        return;
    };
    guard(async {
        let sleeper = d
            .client
            .start_process(&spec(&["sleep", "1000"]))
            .await
            .unwrap();
        // A stream someone still reads, through another handle: it would keep the session
        // (and the daemon's side of it) alive after every handle is dropped.
        let other = d.client.clone();
        let mut output = other.output(sleeper.id, None).await.unwrap();
        output.next().await.unwrap().unwrap();
        d.client.close();
        let why = d.client.closed().await;
        assert!(why.is_channel_fault(), "{why:?}");
        let mut last = None;
        while let Some(ev) = output.next().await {
            last = Some(ev);
        }
        assert!(
            matches!(&last, Some(Err(e)) if e.is_channel_fault()),
            "{last:?}"
        );
        // The daemon is free for the next host at once: the park's bare handshake works,
        // and so does a new session, which still sees the process.
        GuestClient::park(&d.sock, Duration::from_secs(30))
            .await
            .unwrap();
        let next = GuestClient::connect(&d.sock, Duration::from_secs(30))
            .await
            .unwrap();
        let p = next.process(sleeper.id).await.unwrap();
        assert!(p.exit.is_none());
    })
    .await;
}

#[tokio::test]
async fn daemon_death_closes_the_channel() {
    let Some(mut d) = Spaced::start().await else {
        return;
    };
    guard(async {
        let sleeper = d
            .client
            .start_process(&spec(&["sleep", "1000"]))
            .await
            .unwrap();
        let mut output = d.client.output(sleeper.id, None).await.unwrap();
        output.next().await.unwrap().unwrap();
        d.child.kill().await.unwrap();
        let why = d.client.closed().await;
        assert!(why.is_channel_fault(), "{why:?}");
        assert!(d.client.is_closed());
        // The open stream ends with the channel's fault, new calls fail at once.
        let mut last = None;
        while let Some(ev) = output.next().await {
            last = Some(ev);
        }
        assert!(
            matches!(&last, Some(Err(e)) if e.is_channel_fault()),
            "{last:?}"
        );
        let err = d.client.health().await.unwrap_err();
        assert!(err.is_channel_fault(), "{err:?}");
        assert_eq!(err.code(), ErrorCode::SandboxFailed);
    })
    .await;
}

#[tokio::test]
async fn guest_refusals_are_remote_errors() {
    let Some(d) = Spaced::start().await else {
        return;
    };
    guard(async {
        let c = &d.client;
        c.mkdir(&MkdirRequest {
            path: d.path("adir"),
            mode: Some(0o700),
            user: Some(USER.into()),
        })
        .await
        .unwrap();
        // Writing over a directory, reading a missing file, removing a missing path.
        let body = futures::stream::iter(vec![Ok(Bytes::from_static(b"x"))]).boxed();
        let err = c
            .write_file(&d.path("adir"), Some(USER), None, &Default::default(), body)
            .await
            .unwrap_err();
        assert!(matches!(err, GuestError::Remote { .. }), "{err:?}");
        let err = c
            .read_file(&d.path("missing"), Some(USER))
            .await
            .map(|_| ())
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::NotFound, "{err:?}");
        let err = c
            .remove(&d.path("missing"), false, Some(USER))
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::NotFound, "{err:?}");
        // An unknown user is the guest's call.
        let err = c
            .stat(&d.path("adir"), Some("nosuchuser"))
            .await
            .unwrap_err();
        assert!(matches!(err, GuestError::Remote { .. }), "{err:?}");
        assert!(!c.is_closed());
        c.health().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn directory_watch() {
    let Some(d) = Spaced::start().await else {
        return;
    };
    guard(async {
        let c = &d.client;
        c.mkdir(&MkdirRequest {
            path: d.path("watched"),
            mode: None,
            user: Some(USER.into()),
        })
        .await
        .unwrap();
        let req = WatchRequest {
            path: d.path("watched"),
            recursive: true,
            user: Some(USER.into()),
        };
        let mut events = c.watch(&req).await.unwrap();
        assert_eq!(
            events.next().await.unwrap().unwrap(),
            WatchEvent::Started { seq: 1 }
        );
        std::fs::create_dir(d.path("watched/sub")).unwrap();
        let create = events.next().await.unwrap().unwrap();
        assert!(
            matches!(&create, WatchEvent::Change { name, change: FileChange::Create, stat: Some(st), .. }
                if name == "sub" && st.kind == FileKind::Dir),
            "{create:?}"
        );
        // Reported once watched: a write inside is seen.
        std::fs::write(d.path("watched/sub/f"), "x").unwrap();
        let mut seen = Vec::new();
        while let Some(ev) = events.next().await {
            let ev = ev.unwrap();
            let done = matches!(&ev, WatchEvent::Change { name, change: FileChange::Write, .. } if name == "sub/f");
            seen.push(ev);
            if done {
                break;
            }
        }
        // The end of the watched directory ends the stream.
        std::fs::remove_dir_all(d.path("watched")).unwrap();
        let rest: Vec<WatchEvent> = events.map(|e| e.unwrap()).collect().await;
        assert!(
            matches!(rest.last(), Some(WatchEvent::Change { name, change: FileChange::Remove, .. }) if name == "."),
            "{rest:?}"
        );

        // Errors come before any stream; bad paths never leave the host.
        let missing = WatchRequest {
            path: d.path("missing"),
            ..req.clone()
        };
        let err = c.watch(&missing).await.map(|_| ()).unwrap_err();
        assert!(
            matches!(&err, GuestError::Remote { status: 404, .. }),
            "{err:?}"
        );
        let bad = WatchRequest {
            path: "/tmp/../etc".into(),
            ..req
        };
        let err = c.watch(&bad).await.map(|_| ()).unwrap_err();
        assert!(
            matches!(&err, GuestError::Local(b) if b.code == ErrorCode::InvalidPath),
            "{err:?}"
        );
        assert!(!c.is_closed());
    })
    .await;
}

/// A TCP server on the wildcard address that echoes one connection and, at its end, sends
/// `bye`.
async fn echo_once() -> u16 {
    echo_once_on("0.0.0.0:0").await
}

async fn echo_once_on(bind: &str) -> u16 {
    let listener = tokio::net::TcpListener::bind(bind).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let (mut r, mut w) = conn.split();
        tokio::io::copy(&mut r, &mut w).await.unwrap();
        w.write_all(b"bye").await.unwrap();
        w.shutdown().await.unwrap();
    });
    port
}

#[tokio::test]
async fn port_connections() {
    let Some(d) = Spaced::start().await else {
        return;
    };
    guard(async {
        let c = &d.client;
        // A large transfer both ways at once, then the half-close.
        let port = echo_once().await;
        let conn = c.connect_port(port).await.unwrap();
        let (mut r, mut w) = tokio::io::split(conn);
        let data: Vec<u8> = (0..16u32 << 20).map(|i| (i % 251) as u8).collect();
        let expected = Sha256::digest(&data);
        let len = data.len();
        let writer = tokio::spawn(async move {
            w.write_all(&data).await.unwrap();
            w.shutdown().await.unwrap();
        });
        let mut echoed = Vec::new();
        r.read_to_end(&mut echoed).await.unwrap();
        writer.await.unwrap();
        assert_eq!(echoed.len(), len + 3);
        assert_eq!(
            &echoed[len..],
            b"bye",
            "the server answers after the half-close"
        );
        assert_eq!(Sha256::digest(&echoed[..len]), expected);

        // Nothing listening: a remote port_closed.
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let err = c.connect_port(closed).await.unwrap_err();
        assert!(
            matches!(&err, GuestError::Remote { status: 502, body }
                if body.code == ErrorCode::PortClosed && body.message.contains("port is not open")),
            "{err:?}"
        );
        let err = c.connect_port(0).await.unwrap_err();
        assert!(matches!(err, GuestError::Local(_)), "{err:?}");

        // A server on loopback only is private: the daemon never connects there.
        let private = echo_once_on("127.0.0.1:0").await;
        let err = c.connect_port(private).await.unwrap_err();
        assert!(
            matches!(&err, GuestError::Remote { status: 502, body }
                if body.code == ErrorCode::PortClosed && body.message.contains("loopback")),
            "{err:?}"
        );

        // Dropping a connection closes it in the guest.
        let port = echo_once().await;
        let mut conn = c.connect_port(port).await.unwrap();
        conn.write_all(b"x").await.unwrap();
        let mut one = [0u8; 1];
        conn.read_exact(&mut one).await.unwrap();
        drop(conn);
        assert!(!c.is_closed());
        c.health().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn live_output_skips_the_past() {
    let Some(d) = Spaced::start().await else {
        return;
    };
    guard(async {
        let c = &d.client;
        let info = c
            .start_process(&ProcessSpec {
                stdin: true,
                ..spec(&["sh", "-c", "echo before; read l; echo \"after $l\""])
            })
            .await
            .unwrap();
        // Follow the replay until the past is there.
        let mut replay = c.output(info.id, None).await.unwrap();
        while let Some(ev) = replay.next().await {
            if matches!(ev.unwrap(), OutputEvent::Data { .. }) {
                break;
            }
        }
        drop(replay);
        let mut live = c.output_live(info.id).await.unwrap();
        let first = live.next().await.unwrap().unwrap();
        assert_eq!(
            first,
            OutputEvent::Started {
                seq: 1,
                id: info.id,
                pid: info.pid
            }
        );
        let line = futures::stream::iter(vec![Ok(Bytes::from_static(b"now\n"))]).boxed();
        c.write_stdin(info.id, line, true).await.unwrap();
        let mut stdout = Vec::new();
        let mut exit = None;
        while let Some(ev) = live.next().await {
            match ev.unwrap() {
                ev @ OutputEvent::Data { .. } => stdout.extend(ev.bytes().unwrap().1),
                OutputEvent::Exit { status, .. } => exit = Some(status),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(stdout, b"after now\n");
        assert_eq!(exit.unwrap().exit_code, Some(0));
        // Exited: `started`, then `exit`.
        let events: Vec<OutputEvent> = c
            .output_live(info.id)
            .await
            .unwrap()
            .map(|e| e.unwrap())
            .collect()
            .await;
        assert!(
            matches!(
                events[..],
                [OutputEvent::Started { .. }, OutputEvent::Exit { .. }]
            ),
            "{events:?}"
        );
    })
    .await;
}
