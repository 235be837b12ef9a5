//! `kill -9` of the server in the middle of pause, checkpoint, fork and rollback. After a
//! restart on the same data directory: the sandbox is not lost (it is running or paused,
//! and answers), no half-taken snapshot is listed or left on disk, and every listed
//! snapshot can be rolled back to. The suite's leak check then finds no stray VM or file.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use space_cli::client::SpaceClient;
use space_core::process::ProcessSpec;
use space_core::sandbox::{CreateSandboxRequest, CreateSnapshotRequest, ForkRequest};
use space_core::{SandboxId, SandboxState};
use test_support::{new_data_dir, test_server_config, TestServer, TEST_TEMPLATE};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A server in a child process.
async fn spawn_server(data_dir: &Path) -> (Child, SpaceClient) {
    let log = std::fs::File::create(data_dir.join("child-server.log")).expect("log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_space-test-server"))
        .arg(data_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .kill_on_drop(true)
        .spawn()
        .expect("spawn server");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let (mut url, mut key) = (None, None);
    while url.is_none() || key.is_none() {
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("server starts")
            .expect("read")
            .expect("server printed its address");
        if let Some(u) = line.strip_prefix("URL ") {
            url = Some(u.to_owned());
        } else if let Some(k) = line.strip_prefix("KEY ") {
            key = Some(k.to_owned());
        }
    }
    let client = SpaceClient::new(&url.expect("url"), key).expect("client");
    (child, client)
}

fn snapshot(kind: space_core::SnapshotKind) -> CreateSnapshotRequest {
    CreateSnapshotRequest { kind, label: None }
}

fn pending_snapshot_dirs(data_dir: &Path, id: &SandboxId) -> Vec<PathBuf> {
    let dir = data_dir
        .join("store/sandboxes")
        .join(id.as_str())
        .join("snapshots");
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with('.'))
                })
                .collect()
        })
        .unwrap_or_default()
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Pause,
    Checkpoint,
    Fork,
    Rollback,
}

/// Starts `op` on a fresh sandbox in a child server, kills the server `after` into it, and
/// checks what a restarted server finds.
async fn kill_during(op: Op, after: Duration) {
    let data_dir = new_data_dir();
    let config = test_server_config(&data_dir);
    let (mut child, c) = spawn_server(&data_dir).await;
    let sb = c
        .create_sandbox(&CreateSandboxRequest {
            template: TEST_TEMPLATE.into(),
            ..Default::default()
        })
        .await
        .expect("create");
    let id = sb.id.clone();
    c.run(&id, &ProcessSpec::shell("echo kept > /home/user/kept"))
        .await
        .expect("write");
    let disk = c
        .create_snapshot(&id, &snapshot(space_core::SnapshotKind::Disk))
        .await
        .expect("disk snapshot");
    let op_task = {
        let (c, id, snap) = (c.clone(), id.clone(), disk.snapshot.id.clone());
        tokio::spawn(async move {
            let _ = match op {
                Op::Pause => c.pause_sandbox(&id).await.map(drop),
                Op::Checkpoint => c
                    .create_snapshot(&id, &snapshot(space_core::SnapshotKind::Checkpoint))
                    .await
                    .map(drop),
                Op::Fork => c
                    .fork(
                        &id,
                        &ForkRequest {
                            count: Some(2),
                            ..Default::default()
                        },
                    )
                    .await
                    .map(drop),
                Op::Rollback => c.rollback(&id, &snap).await.map(drop),
            };
        })
    };
    tokio::time::sleep(after).await;
    child.start_kill().expect("kill -9 the server");
    let _ = child.wait().await;
    op_task.abort();

    let ts = TestServer::start_on(data_dir.clone(), config).await;
    let info = ts
        .client
        .sandbox(&id)
        .await
        .expect("sandbox survives the crash");
    assert!(
        matches!(info.state, SandboxState::Running | SandboxState::Paused),
        "{op:?} after {after:?}: sandbox is {:?} ({:?})",
        info.state,
        info.failure_reason
    );
    if info.state == SandboxState::Paused {
        ts.client.resume_sandbox(&id).await.expect("resume");
    }
    let out = ts
        .client
        .run(&id, &ProcessSpec::shell("cat /home/user/kept"))
        .await
        .expect("exec after restart");
    assert_eq!(out.stdout_str().trim(), "kept", "{op:?} after {after:?}");
    assert!(
        pending_snapshot_dirs(&data_dir, &id).is_empty(),
        "{op:?} after {after:?}: half-taken snapshots left: {:?}",
        pending_snapshot_dirs(&data_dir, &id)
    );
    // Every listed snapshot is whole: rolling back to each works.
    let snaps = ts.client.snapshots(&id).await.expect("list");
    for s in &snaps.snapshots {
        let rec =
            ts.client.rollback(&id, &s.id).await.unwrap_or_else(|e| {
                panic!("{op:?} after {after:?}: rollback to {} failed: {e}", s.id)
            });
        assert_eq!(rec.state, SandboxState::Running);
    }
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill9_during_pause() {
    for ms in [5, 60] {
        kill_during(Op::Pause, Duration::from_millis(ms)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill9_during_checkpoint() {
    for ms in [20, 150, 400] {
        kill_during(Op::Checkpoint, Duration::from_millis(ms)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill9_during_fork() {
    for ms in [100, 500] {
        kill_during(Op::Fork, Duration::from_millis(ms)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill9_during_rollback() {
    for ms in [30, 300] {
        kill_during(Op::Rollback, Duration::from_millis(ms)).await;
    }
}
