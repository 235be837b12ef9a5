//! The guest operations behind snapshots, forks and idleness, on real VMs, through the
//! node's own channel to the daemon (`Node::guest`): file-system freeze and thaw (with the
//! auto-thaw and a guest that froze itself), identity after a restore, the workload cgroup
//! and its freezer, and the activity counters.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use space_core::process::{OutputEvent, ProcessId, ProcessSpec, PtySize};
use space_core::sandbox::CreateSandboxRequest;
use space_core::{ErrorCode, SandboxId};
use space_node::{GuestClient, GuestError};
use test_support::{wait_until, TestServer, TEST_TEMPLATE};

/// A running sandbox of the test template and the node's client for its daemon.
async fn sandbox(ts: &TestServer) -> (SandboxId, GuestClient) {
    let sb = ts
        .client
        .create_sandbox(&CreateSandboxRequest {
            template: TEST_TEMPLATE.into(),
            ..Default::default()
        })
        .await
        .expect("create");
    let guest = ts
        .server()
        .local_node()
        .guest(&sb.id)
        .expect("guest client");
    (sb.id, guest)
}

/// Runs a shell line to completion (as root when `root`); returns stdout, asserting success.
async fn sh(ts: &TestServer, id: &SandboxId, line: &str, root: bool) -> String {
    test_support::shell(&ts.client, id, line, root).await
}

/// Starts a background process through the guest client.
async fn background(guest: &GuestClient, line: &str) -> ProcessId {
    guest
        .start_process(&ProcessSpec::shell(line))
        .await
        .expect("start")
        .id
}

async fn finished(guest: &GuestClient, id: ProcessId) -> bool {
    guest.process(id).await.expect("process").exit.is_some()
}

fn is_remote(e: &GuestError, status: u16, code: ErrorCode) -> bool {
    matches!(e, GuestError::Remote { status: s, body } if *s == status && body.code == code)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fs_freeze_blocks_writes_until_thaw() {
    let ts = TestServer::start().await;
    let (id, guest) = sandbox(&ts).await;

    guest
        .freeze_fs(Duration::from_secs(30))
        .await
        .expect("freeze");
    // Freezing again while frozen re-arms the timer and is fine.
    guest
        .freeze_fs(Duration::from_secs(30))
        .await
        .expect("freeze again");
    let writer = background(&guest, "echo written > /home/user/frozen.txt").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !finished(&guest, writer).await,
        "a write finished on a frozen file system"
    );
    // The daemon itself keeps serving (it never writes to the frozen disk).
    guest.health().await.expect("health while frozen");

    guest.thaw_fs().await.expect("thaw");
    wait_until(
        Duration::from_secs(20),
        "the write to finish after thaw",
        || async { finished(&guest, writer).await.then_some(()) },
    )
    .await;
    let info = guest.process(writer).await.expect("process");
    assert_eq!(info.exit.and_then(|e| e.exit_code), Some(0), "{info:?}");
    assert_eq!(
        sh(&ts, &id, "cat /home/user/frozen.txt", false).await,
        "written\n"
    );
    // Thaw is idempotent.
    guest.thaw_fs().await.expect("thaw again");

    // Out-of-range timeouts never leave the host.
    for bad in [Duration::ZERO, Duration::from_secs(31)] {
        let e = guest.freeze_fs(bad).await.expect_err("bad timeout");
        assert!(matches!(e, GuestError::Local(_)), "{e}");
        assert_eq!(e.code(), ErrorCode::InvalidRequest);
    }
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fs_freeze_thaws_by_itself_after_the_timeout() {
    let ts = TestServer::start().await;
    let (id, guest) = sandbox(&ts).await;

    let timeout = Duration::from_secs(3);
    guest.freeze_fs(timeout).await.expect("freeze");
    let frozen_at = Instant::now();
    let writer = background(&guest, "echo late > /home/user/late.txt").await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let early = finished(&guest, writer).await;
    assert!(
        !early || frozen_at.elapsed() >= timeout,
        "the write finished before the auto-thaw"
    );
    // No thaw from the host: the guest thaws by itself.
    wait_until(Duration::from_secs(20), "the auto-thaw", || async {
        finished(&guest, writer).await.then_some(())
    })
    .await;
    assert!(
        frozen_at.elapsed() >= timeout - Duration::from_millis(200),
        "thawed after {:?}, before the {timeout:?} timeout",
        frozen_at.elapsed()
    );
    assert_eq!(
        sh(&ts, &id, "cat /home/user/late.txt", false).await,
        "late\n"
    );
    guest
        .thaw_fs()
        .await
        .expect("thaw after the auto-thaw is fine");
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fs_frozen_inside_the_guest_is_a_conflict() {
    let ts = TestServer::start().await;
    let (id, guest) = sandbox(&ts).await;

    // The busybox template links every applet of the host's busybox; Debian's has fsfreeze
    // (spelled `fsfreeze --freeze`, not util-linux's `-f`).
    if sh(&ts, &id, "command -v fsfreeze || true", false)
        .await
        .trim()
        .is_empty()
    {
        eprintln!("skipping: the template's busybox has no fsfreeze applet");
        ts.stop().await;
        return;
    }
    sh(&ts, &id, "fsfreeze --freeze /", true).await;
    let e = guest
        .freeze_fs(Duration::from_secs(10))
        .await
        .expect_err("already frozen");
    assert!(is_remote(&e, 409, ErrorCode::Conflict), "{e}");
    assert!(e.to_string().contains("already frozen"), "{e}");
    // Our thaw does not touch a freeze that is not ours.
    guest.thaw_fs().await.expect("thaw (nothing of ours)");
    let writer = background(&guest, "echo x > /home/user/x.txt").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!finished(&guest, writer).await, "still frozen by fsfreeze");

    sh(&ts, &id, "fsfreeze --unfreeze /", true).await;
    wait_until(
        Duration::from_secs(20),
        "the write after fsfreeze --unfreeze",
        || async { finished(&guest, writer).await.then_some(()) },
    )
    .await;
    // And now the daemon can freeze and thaw it itself.
    guest
        .freeze_fs(Duration::from_secs(10))
        .await
        .expect("freeze");
    guest.thaw_fs().await.expect("thaw");
    sh(&ts, &id, "echo ok > /home/user/after.txt", false).await;
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn identity_reseeds_and_renames() {
    let ts = TestServer::start().await;
    let (id, guest) = sandbox(&ts).await;
    assert_eq!(sh(&ts, &id, "hostname", false).await.trim(), id.as_str());

    let later_s = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs()
        + 3600;
    // Hex digits are base64 digits: 128 of them are standard base64 for 96 random bytes.
    let entropy = hex::encode([rand::random::<[u8; 32]>(), rand::random::<[u8; 32]>()].concat());
    let req = serde_json::from_value(serde_json::json!({
        "entropy": entropy,
        "hostname": "sbx-forked-1",
        "time_unix_ms": later_s * 1000,
    }))
    .expect("identity request");
    guest.set_identity(&req).await.expect("identity");

    let out = sh(
        &ts,
        &id,
        "hostname; grep -c sbx-forked-1 /etc/hosts; date +%s; \
         head -c 16 /dev/urandom | od -An -tx1; head -c 16 /dev/urandom | od -An -tx1",
        false,
    )
    .await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "sbx-forked-1", "{out}");
    assert_eq!(lines[1], "1", "{out}");
    let guest_s: u64 = lines[2].parse().expect("date +%s");
    assert!(
        guest_s.abs_diff(later_s) < 300,
        "clock {guest_s}, expected about {later_s}"
    );
    assert_ne!(lines[3], lines[4], "{out}");

    // Bad requests are refused before they reach the guest.
    let short = serde_json::from_value(serde_json::json!({
        "entropy": "AAAA", "hostname": "h", "time_unix_ms": 1,
    }))
    .expect("request");
    let e = guest.set_identity(&short).await.expect_err("short entropy");
    assert!(matches!(e, GuestError::Local(_)), "{e}");
    let bad_host = serde_json::from_value(serde_json::json!({
        "entropy": entropy, "hostname": "-bad host", "time_unix_ms": 1,
    }))
    .expect("request");
    let e = guest
        .set_identity(&bad_host)
        .await
        .expect_err("bad hostname");
    assert_eq!(e.code(), ErrorCode::InvalidRequest);
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn processes_run_in_the_workload_cgroup() {
    let ts = TestServer::start().await;
    let (id, guest) = sandbox(&ts).await;

    // exec, as the default user and as root
    assert_eq!(
        sh(&ts, &id, "cat /proc/self/cgroup", false).await,
        "0::/workload\n"
    );
    assert_eq!(
        sh(&ts, &id, "cat /proc/self/cgroup", true).await,
        "0::/workload\n"
    );
    // pty
    let mut spec = ProcessSpec::shell("cat /proc/self/cgroup");
    spec.pty = Some(PtySize { rows: 24, cols: 80 });
    let p = guest.start_process(&spec).await.expect("pty process");
    let mut events = guest.output(p.id, None).await.expect("output");
    let mut text = Vec::new();
    while let Some(ev) = events.next().await {
        let ev = ev.expect("event");
        if let Some((_, bytes)) = ev.bytes() {
            text.extend_from_slice(&bytes);
        }
        if matches!(ev, OutputEvent::Exit { .. }) {
            break;
        }
    }
    assert_eq!(String::from_utf8_lossy(&text).trim(), "0::/workload");
    // background, and what it starts
    let bg = background(&guest, "sh -c 'cat /proc/self/cgroup > /tmp/bg-cgroup'").await;
    wait_until(
        Duration::from_secs(20),
        "the background process",
        || async { finished(&guest, bg).await.then_some(()) },
    )
    .await;
    assert_eq!(
        sh(&ts, &id, "cat /tmp/bg-cgroup", false).await,
        "0::/workload\n"
    );
    // The daemon itself is not in it.
    let procs = sh(&ts, &id, "cat /sys/fs/cgroup/cgroup.procs", false).await;
    assert!(
        procs.lines().any(|l| l == "1"),
        "init stays in the root: {procs}"
    );
    ts.stop().await;
}

async fn progress(ts: &TestServer, id: &SandboxId) -> u64 {
    let bytes = ts
        .client
        .read_file_bytes(id, "/tmp/progress", None)
        .await
        .unwrap_or_default();
    String::from_utf8_lossy(&bytes).trim().parse().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workload_freeze_stops_and_thaw_resumes() {
    let ts = TestServer::start().await;
    let (id, guest) = sandbox(&ts).await;

    let counter = background(
        &guest,
        "i=0; while true; do i=$((i+1)); echo $i > /tmp/progress; sleep 0.05; done",
    )
    .await;
    wait_until(Duration::from_secs(20), "the counter to start", || async {
        (progress(&ts, &id).await > 0).then_some(())
    })
    .await;

    guest.freeze_workload().await.expect("freeze workload");
    let frozen_at = progress(&ts, &id).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        progress(&ts, &id).await,
        frozen_at,
        "the counter advanced while frozen"
    );
    // The daemon keeps serving; new processes are refused while frozen.
    guest.health().await.expect("health while frozen");
    let e = guest
        .start_process(&ProcessSpec::shell("true"))
        .await
        .expect_err("start while frozen");
    assert!(is_remote(&e, 409, ErrorCode::Conflict), "{e}");
    let a = guest.activity().await.expect("activity");
    assert!(a.workload_processes >= 1, "{a:?}");
    // Freezing again is fine.
    guest.freeze_workload().await.expect("freeze again");

    guest.thaw_workload().await.expect("thaw workload");
    wait_until(Duration::from_secs(20), "the counter to resume", || async {
        (progress(&ts, &id).await > frozen_at).then_some(())
    })
    .await;
    guest.thaw_workload().await.expect("thaw again");
    sh(&ts, &id, "true", false).await;
    guest.signal(counter, 9).await.expect("kill the counter");
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workload_that_cannot_freeze_is_a_bounded_timeout() {
    let ts = TestServer::start().await;
    let (id, guest) = sandbox(&ts).await;

    // A writer blocked on a frozen file system sleeps in the kernel and cannot be frozen.
    guest
        .freeze_fs(Duration::from_secs(20))
        .await
        .expect("freeze fs");
    let writer = background(&guest, "echo x > /home/user/stuck.txt").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    let e = guest.freeze_workload().await.expect_err("cannot freeze");
    let waited = started.elapsed();
    assert!(is_remote(&e, 504, ErrorCode::Timeout), "{e}");
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(10),
        "waited {waited:?}"
    );
    // The failed freeze was undone: the workload runs again once the disk thaws.
    guest.thaw_fs().await.expect("thaw fs");
    wait_until(Duration::from_secs(20), "the writer to finish", || async {
        finished(&guest, writer).await.then_some(())
    })
    .await;
    sh(&ts, &id, "cat /home/user/stuck.txt", false).await;
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn activity_counters_move() {
    let ts = TestServer::start().await;
    let (id, guest) = sandbox(&ts).await;

    let a = guest.activity().await.expect("activity");
    // Housekeeping does not count as activity.
    guest.health().await.expect("health");
    guest
        .freeze_fs(Duration::from_secs(10))
        .await
        .expect("freeze");
    guest.thaw_fs().await.expect("thaw");
    let b = guest.activity().await.expect("activity");
    assert_eq!(b.api_requests, a.api_requests, "{a:?} -> {b:?}");
    eprintln!(
        "disk bytes written by a freeze/thaw of an idle guest: {}",
        b.disk_io_bytes - a.disk_io_bytes
    );

    sh(
        &ts,
        &id,
        "dd if=/dev/urandom of=/home/user/big bs=1024 count=8192 2>/dev/null && sync",
        false,
    )
    .await;
    let c = guest.activity().await.expect("activity");
    assert!(c.api_requests > b.api_requests, "{b:?} -> {c:?}");
    assert!(
        c.disk_io_bytes >= b.disk_io_bytes + 8 * 1024 * 1024,
        "{b:?} -> {c:?}"
    );
    assert!(c.workload_cpu_usec > b.workload_cpu_usec, "{b:?} -> {c:?}");

    // TCP connections inside the guest (loopback), if the template has nc.
    if !sh(&ts, &id, "command -v nc || true", false)
        .await
        .trim()
        .is_empty()
    {
        // Both ends keep stdin open (busybox nc hangs up at end of input).
        let server = background(&guest, "sleep 60 | nc -l -p 5555 > /dev/null").await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let client = background(&guest, "sleep 60 | nc 127.0.0.1 5555").await;
        let d = wait_until(
            Duration::from_secs(20),
            "2 established connections",
            || async {
                guest
                    .activity()
                    .await
                    .ok()
                    .filter(|d| d.tcp_connections >= 2)
            },
        )
        .await;
        assert!(d.workload_processes >= 3, "{d:?}");
        for p in [client, server] {
            let _ = guest.signal(p, 9).await;
        }
    } else {
        eprintln!("no nc in the template: TCP count not checked");
    }
    ts.stop().await;
}
