//! The node's lifecycle operations on real VMs, driven through `Node` directly (the HTTP
//! surface is tested in lifecycle_api.rs and snapshots_api.rs): checkpoint and rollback,
//! crash restore from the latest checkpoint. Forks need the control plane's records of the
//! children, so they are tested through the API (snapshots_api.rs).

use std::time::{Duration, Instant};

use space_core::process::ProcessSpec;
use space_core::sandbox::CreateSandboxRequest;
use space_core::{SandboxId, SandboxState, SnapshotKind, SnapshotTrigger};
use space_node::{recovery, Node, PauseCause};
use test_support::{shell, wait_until, TestServer, TEST_TEMPLATE};

async fn create(ts: &TestServer) -> SandboxId {
    ts.client
        .create_sandbox(&CreateSandboxRequest {
            template: TEST_TEMPLATE.into(),
            ..Default::default()
        })
        .await
        .expect("create")
        .id
}

fn node(ts: &TestServer) -> Node {
    ts.server().local_node().clone()
}

/// Runs a shell line as root to completion; returns stdout, asserting success.
async fn sh(ts: &TestServer, id: &SandboxId, line: &str) -> String {
    shell(&ts.client, id, line, true).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pause_resume_keeps_processes_and_refuses_double_pause() {
    let ts = TestServer::start().await;
    let id = create(&ts).await;
    let n = node(&ts);
    sh(
        &ts,
        &id,
        "(i=0; while :; do i=$((i+1)); echo $i > /tmp/tick; sleep 0.05; done) >/dev/null 2>&1 &",
    )
    .await;
    let t = Instant::now();
    n.pause_sandbox(&id, PauseCause::User).await.expect("pause");
    eprintln!("pause took {:?}", t.elapsed());
    let err = n
        .pause_sandbox(&id, PauseCause::User)
        .await
        .expect_err("double pause");
    assert_eq!(err.to_string(), "cannot pause a sandbox that is paused");
    assert!(n.guest(&id).is_err(), "a paused sandbox serves no requests");
    let t = Instant::now();
    n.resume_sandbox(&id).await.expect("resume");
    eprintln!("resume took {:?}", t.elapsed());
    let a = sh(&ts, &id, "cat /tmp/tick").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b = sh(&ts, &id, "cat /tmp/tick").await;
    assert_ne!(a, b, "the background loop runs again after resume");
    let events = n.events(&id).expect("events");
    let names: Vec<String> = events.iter().map(|e| e.to.to_string()).collect();
    assert!(
        names
            .windows(4)
            .any(|w| w == ["pausing", "paused", "resuming", "running"]),
        "{names:?}"
    );
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn checkpoint_and_disk_snapshot_rollbacks() {
    let ts = TestServer::start().await;
    let id = create(&ts).await;
    let n = node(&ts);
    sh(&ts, &id, "mkdir -p /data && echo one > /data/file && sync").await;
    let disk = n
        .snapshot_disk(&id, Some("before".into()), SnapshotTrigger::Manual, None)
        .await
        .expect("disk snapshot");
    sh(
        &ts,
        &id,
        "echo marker-process; (sleep 1000 &) ; echo two > /data/file; sync",
    )
    .await;
    let cp = n
        .checkpoint(&id, None, SnapshotTrigger::Manual, None)
        .await
        .expect("checkpoint");
    eprintln!(
        "checkpoint: {:?} guest pause {:?}",
        cp.info.total_bytes, cp.guest_pause
    );
    assert_eq!(cp.info.kind, SnapshotKind::Checkpoint);
    // Undo: remove everything, then roll back to the checkpoint: file and process are back.
    sh(&ts, &id, "rm -rf /data; pkill sleep || true").await;
    let t = Instant::now();
    let rec = n
        .rollback(&id, &cp.info.id)
        .await
        .expect("rollback to checkpoint");
    eprintln!("rollback to checkpoint took {:?}", t.elapsed());
    assert_eq!(rec.state, SandboxState::Running);
    assert_eq!(sh(&ts, &id, "cat /data/file").await.trim(), "two");
    assert!(sh(&ts, &id, "ps").await.contains("sleep 1000"));
    // Roll back to the disk snapshot: the older file, booted fresh.
    let rec = n
        .rollback(&id, &disk.id)
        .await
        .expect("rollback to disk snapshot");
    assert_eq!(rec.state, SandboxState::Running);
    assert_eq!(sh(&ts, &id, "cat /data/file").await.trim(), "one");
    let listed = n.snapshots(&id).await.expect("list");
    assert_eq!(listed.len(), 2);

    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_restores_from_latest_checkpoint() {
    let ts = TestServer::start().await;
    let id = create(&ts).await;
    let n = node(&ts);
    sh(&ts, &id, "echo saved > /tmp/state").await;
    n.checkpoint(&id, None, SnapshotTrigger::Manual, None)
        .await
        .expect("checkpoint");
    let pid = n.sandbox(&id).and_then(|r| r.vmm_pid).expect("pid");
    let killed = Instant::now();
    kill_vmm(pid);
    wait_until(
        Duration::from_secs(30),
        "the crashed sandbox to run again",
        || {
            let rec = n.sandbox(&id);
            async move {
                rec.filter(|r| {
                    r.state == SandboxState::Running && r.vmm_pid.is_some_and(|p| p != pid)
                })
            }
        },
    )
    .await;
    eprintln!("crash to running again: {:?}", killed.elapsed());
    assert_eq!(sh(&ts, &id, "cat /tmp/state").await.trim(), "saved");
    let events = n.events(&id).expect("events");
    assert!(
        events
            .iter()
            .any(|e| e.detail.as_deref().is_some_and(|d| d.contains("were lost"))),
        "{events:?}"
    );
    ts.stop().await;
}

/// The VMM's pid once the sandbox runs on a VMM other than `old`.
async fn restored_vmm(n: &Node, id: &SandboxId, old: u32) -> u32 {
    wait_until(
        Duration::from_secs(60),
        "the sandbox to run on a new VMM",
        || {
            let rec = n.sandbox(id);
            async move {
                rec.filter(|r| r.state == SandboxState::Running)
                    .and_then(|r| r.vmm_pid)
                    .filter(|&p| p != old)
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broken_daemon_channel_is_opened_afresh_and_crash_loops_end() {
    let ts = TestServer::start().await;
    let id = create(&ts).await;
    let n = node(&ts);
    sh(
        &ts,
        &id,
        "sleep 1000 >/dev/null 2>&1 & echo $! > /tmp/sleeper",
    )
    .await;
    let vmm = n.sandbox(&id).and_then(|r| r.vmm_pid).expect("pid");
    // What a host process that stalled past the daemon's keep-alive sees: the session
    // ends under a running VM. A call right after it gets a fresh session, on the same
    // VM, with the same processes.
    for round in 0..recovery::MAX_CRASH_RESTORES {
        n.guest(&id).expect("guest").close();
        let t = Instant::now();
        let alive = sh(&ts, &id, "kill -0 $(cat /tmp/sleeper) && echo alive").await;
        eprintln!(
            "round {round}: a call on a broken channel took {:?}",
            t.elapsed()
        );
        assert_eq!(alive.trim(), "alive");
        let rec = n.sandbox(&id).expect("record");
        assert_eq!((rec.state, rec.vmm_pid), (SandboxState::Running, Some(vmm)));
    }
    // A guest that keeps breaking its sessions is treated as crashed (here noticed by the
    // channel's watcher, with no call waiting): with the default policy it is restored,
    // booted again on its disk (no checkpoint yet).
    n.guest(&id).expect("guest").close();
    let restored = restored_vmm(&n, &id, vmm).await;
    let events = n.events(&id).expect("events");
    assert!(
        events.iter().any(|e| e
            .detail
            .as_deref()
            .is_some_and(|d| d.contains("daemon channel broke") && d.contains("3 times"))),
        "{events:?}"
    );
    assert_eq!(sh(&ts, &id, "echo back").await.trim(), "back");

    // Crash restores are bounded the same way: that was one; two more are allowed, and the
    // crash after them fails the sandbox.
    let mut pid = restored;
    for _ in 1..recovery::MAX_CRASH_RESTORES {
        kill_vmm(pid);
        pid = restored_vmm(&n, &id, pid).await;
    }
    kill_vmm(pid);
    let failed = ts
        .wait_state(&id, SandboxState::Failed, Duration::from_secs(60))
        .await;
    let reason = failed.failure_reason.unwrap_or_default();
    assert!(reason.contains("not restored again"), "{reason}");
    ts.client.delete_sandbox(&id).await.expect("delete");
    ts.stop().await;
}

fn kill_vmm(pid: u32) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill VMM");
}

/// Runs a shell line in a sandbox the control plane does not know (a node-level fork
/// child), through the node's own channel; returns stdout.
async fn guest_sh(n: &Node, id: &SandboxId, line: &str) -> String {
    use futures::StreamExt;
    let guest = n.guest(id).expect("guest");
    let p = guest
        .start_process(&ProcessSpec::shell(line))
        .await
        .expect("start");
    let mut events = guest.output(p.id, None).await.expect("output");
    let mut out = Vec::new();
    while let Some(ev) = events.next().await {
        if let Some((space_core::process::OutputStream::Stdout, bytes)) = ev.expect("event").bytes()
        {
            out.extend(bytes);
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fork_into_four_through_a_memory_image() {
    // The children exist only on the node; keep the reconciler from reaping them.
    let ts = TestServer::start_with(|c| c.run_reconciler = false).await;
    let id = create(&ts).await;
    let n = node(&ts);
    sh(&ts, &id, "echo parent > /home/user/who").await;
    let children: Vec<SandboxId> = (0..4).map(|_| SandboxId::generate()).collect();
    let t = Instant::now();
    let forked = n.fork(&id, &children, None).await.expect("fork");
    eprintln!("fork into 4 took {:?}", t.elapsed());
    assert!(
        forked.iter().all(|r| r.state == SandboxState::Running),
        "{forked:?}"
    );
    let mut seen = Vec::new();
    for c in &children {
        let text = guest_sh(
            &n,
            c,
            "cat /home/user/who; head -c 32 /dev/urandom | od -An -x; hostname",
        )
        .await;
        assert!(text.starts_with("parent"), "{text}");
        assert!(
            text.contains(c.as_str()),
            "hostname is the child's id: {text}"
        );
        seen.push(text);
    }
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 4, "forks produced the same random bytes");
    // The parent runs on, and the image's device state is gone from tmpfs.
    assert_eq!(sh(&ts, &id, "cat /home/user/who").await.trim(), "parent");
    let leftovers: Vec<_> = std::fs::read_dir("/dev/shm")
        .expect("/dev/shm")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("space-fork-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // So is its RAM, an in-memory image held by this process (the node runs its VMMs).
    assert_eq!(
        test_support::leaks::in_memory_images_held(std::process::id()),
        0
    );
    for c in &children {
        n.delete_sandbox(c).await.expect("delete child");
    }
    ts.stop().await;
}
