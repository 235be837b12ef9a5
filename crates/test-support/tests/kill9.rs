//! `kill -9` of the server in the middle of pause, checkpoint, fork and rollback. After a
//! restart on the same data directory: the sandbox is not lost (it is running or paused,
//! and answers), no half-taken snapshot is listed or left on disk, and every listed
//! snapshot can be rolled back to. And in the middle of a delete that moves persistent
//! snapshots out of their sandbox: each is kept whole, exactly once, and the delete
//! finishes. The suite's leak check then finds no stray VM or file.

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

/// A server in a child process. Its log is printed if the test fails while it is held, so a
/// failure in CI (where the data directory is gone afterwards) can be told apart.
struct ChildServer {
    process: Child,
    log: PathBuf,
}

impl ChildServer {
    /// `kill -9`, and waits for it to be gone.
    async fn kill(&mut self) {
        self.process.start_kill().expect("kill -9 the server");
        let _ = self.process.wait().await;
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(200).collect();
            eprintln!(
                "--- last lines of the child server's log ({}):",
                self.log.display()
            );
            for line in tail.iter().rev() {
                eprintln!("{line}");
            }
        }
    }
}

async fn spawn_server(data_dir: &Path) -> (ChildServer, SpaceClient) {
    let log_path = data_dir.join("child-server.log");
    let log = std::fs::File::create(&log_path).expect("log");
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
    let child = ChildServer {
        process: child,
        log: log_path,
    };
    (child, client)
}

fn snapshot(kind: space_core::SnapshotKind) -> CreateSnapshotRequest {
    CreateSnapshotRequest {
        kind,
        ..Default::default()
    }
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
    child.kill().await;
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

/// Entries of a directory (none if it does not exist).
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Persistent snapshots a sandbox's delete moves out of its directory.
const KEPT_SNAPSHOTS: usize = 6;
/// How long the kill waits for the first snapshot to move before it kills anyway.
const MOVE_WAIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill9_while_a_delete_moves_persistent_snapshots() {
    let data_dir = new_data_dir();
    let config = test_server_config(&data_dir);
    let (mut child, c) = spawn_server(&data_dir).await;
    let sb = c
        .create_sandbox(&CreateSandboxRequest {
            template: TEST_TEMPLATE.into(),
            snapshots: Some(space_core::SnapshotSchedule::disabled()),
            ..Default::default()
        })
        .await
        .expect("create");
    let id = sb.id.clone();
    c.run(&id, &ProcessSpec::shell("echo kept > /home/user/kept"))
        .await
        .expect("write");
    let mut kept = Vec::new();
    for _ in 0..KEPT_SNAPSHOTS {
        let req = CreateSnapshotRequest {
            persistent: true,
            ..snapshot(space_core::SnapshotKind::Disk)
        };
        kept.push(
            c.create_snapshot(&id, &req)
                .await
                .expect("snapshot")
                .snapshot
                .id,
        );
    }
    c.create_snapshot(&id, &snapshot(space_core::SnapshotKind::Disk))
        .await
        .expect("a snapshot that goes with the sandbox");
    kept.sort();
    let moved_to = data_dir.join("store/snapshots");
    let moved_from = data_dir
        .join("store/sandboxes")
        .join(id.as_str())
        .join("snapshots");

    let delete = {
        let (c, id) = (c.clone(), id.clone());
        tokio::spawn(async move { c.delete_sandbox(&id).await })
    };
    // Kill as soon as the first snapshot has moved: most likely before the last one has.
    let deadline = std::time::Instant::now() + MOVE_WAIT;
    while entries(&moved_to).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_micros(200));
    }
    child.kill().await;
    delete.abort();
    let (there, left) = (entries(&moved_to).len(), entries(&moved_from).len());
    eprintln!("killed with {there} snapshot(s) moved and {left} entries left in the sandbox");

    let ts = TestServer::start_on(data_dir.clone(), config).await;
    ts.wait_state(&id, SandboxState::Deleted, Duration::from_secs(60))
        .await;
    // Each persistent snapshot once, whole, where persistent snapshots of deleted
    // sandboxes are; nothing half-made anywhere; the sandbox's own files gone.
    let mut listed: Vec<_> = ts
        .client
        .tenant_snapshots(None::<&SandboxId>, None)
        .await
        .expect("list")
        .snapshots
        .into_iter()
        .map(|s| s.id)
        .collect();
    listed.sort();
    assert_eq!(listed, kept);
    let names: Vec<String> = kept.iter().map(|s| s.to_string()).collect();
    assert_eq!(entries(&moved_to), names, "no debris beside them");
    for snap in &kept {
        assert_eq!(
            entries(&moved_to.join(snap.as_str())),
            vec!["disk.raw", "meta.json", "source.json"]
        );
    }
    assert!(!data_dir.join("store/sandboxes").join(id.as_str()).exists());
    // And a sandbox starts from one of them.
    let from = ts
        .client
        .create_sandbox(&CreateSandboxRequest {
            snapshot: Some(kept[0].clone()),
            ..Default::default()
        })
        .await
        .expect("create from a kept snapshot");
    let out = ts
        .client
        .run(&from.id, &ProcessSpec::shell("cat /home/user/kept"))
        .await
        .expect("exec");
    assert_eq!(out.stdout_str().trim(), "kept");
    ts.stop().await;
}
